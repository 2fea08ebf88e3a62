// GStreamer's placeholder DTLS key, made small.
//
// Every dtlsdec of GStreamer 1.22 starts on a process-wide default agent whose certificate it makes
// on first use, an RSA 2048 key: 0.19–0.41 s of prime search on this project's machines (a
// gst-launch of one dtlsdec, against 0.01 s without it), which the first call of a process waits
// for when it comes sooner (`parley call` answered at once heard its callee some 400 ms later than
// with a ring to hide it). Parley never handshakes with that key: each transport's dtlsdec is given
// Parley's ECDSA certificate before its handshake (parley_dtls_certificate.c), and descriptions
// carry that certificate's fingerprint. So when libgstdtls asks OpenSSL for an RSA key and Parley's
// certificate exists, this RSA_generate_key_ex (the process exports it, as it exports SSL_new)
// makes a 1024-bit one, some 20 ms; every other caller in the process, and libgstdtls when Parley
// has no certificate of its own (webrtcbin then handshakes with GStreamer's), gets OpenSSL's
// function unchanged.

#define _GNU_SOURCE
#include "parley_gst.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

typedef struct rsa_st RSA;
typedef struct bignum_st BIGNUM;
typedef struct bn_gencb_st BN_GENCB;

enum { PLACEHOLDER_BITS = 1024 };

static int (*real_generate)(RSA *rsa, int bits, BIGNUM *e, BN_GENCB *cb);
static pthread_once_t resolved = PTHREAD_ONCE_INIT;
static atomic_ulong placeholders;

static void resolve(void) {
    void *libcrypto = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_NOLOAD);
    real_generate = (int (*)(RSA *, int, BIGNUM *, BN_GENCB *))dlsym(libcrypto ? libcrypto : RTLD_NEXT, "RSA_generate_key_ex");
    if (!real_generate) fprintf(stderr, "parley: OpenSSL's RSA_generate_key_ex was not found: %s\n", dlerror());
}

/// Whether the code at `address` is GStreamer's dtls plugin.
static int in_gstreamer_dtls(const void *address) {
    Dl_info info;
    return dladdr(address, &info) && info.dli_fname && strstr(info.dli_fname, "libgstdtls") != NULL;
}

int RSA_generate_key_ex(RSA *rsa, int bits, BIGNUM *e, BN_GENCB *cb) {
    pthread_once(&resolved, resolve);
    if (!real_generate) return 0;
    if (bits > PLACEHOLDER_BITS && in_gstreamer_dtls(__builtin_return_address(0)) && parley_dtls_certificate_pem()) {
        atomic_fetch_add(&placeholders, 1);
        bits = PLACEHOLDER_BITS;
    }
    return real_generate(rsa, bits, e, cb);
}

unsigned long parley_dtls_placeholder_keys(void) { return atomic_load(&placeholders); }
