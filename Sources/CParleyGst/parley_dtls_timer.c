// DTLS retransmission timing for webrtcbin's handshake.
//
// GStreamer's dtls elements leave OpenSSL's DTLS timer at its default: a lost handshake flight is
// sent again after 1 s, then 2, 4, 8 s. Under 20 % loss a call's media then started 14 s after ICE
// connected, where Chromium (libwebrtc sets its own, shorter timer) started at once. The elements
// give no way to reach their SSL objects, so Parley wraps OpenSSL's SSL_new, as an LD_PRELOAD
// library would: the process exports this SSL_new (the package links it with
// --export-dynamic-symbol=SSL_new), so libgstdtls, loaded later as a plugin, binds to it; it makes
// the object with OpenSSL's own SSL_new and, for DTLS objects only, sets a timer that starts at
// PARLEY_DTLS_FIRST_US and doubles up to PARLEY_DTLS_LONGEST_US (RFC 6347 §4.2.4.1 allows a
// shorter first timer than its suggested 1 s; libwebrtc starts at 50 ms). Everything else in the
// process that uses OpenSSL gets what it got before.

#define _GNU_SOURCE
#include "parley_gst.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;
typedef unsigned int (*dtls_timer_cb)(SSL *ssl, unsigned int timer_us);

enum { PARLEY_DTLS_FIRST_US = 150000, PARLEY_DTLS_LONGEST_US = 2400000 };

static SSL *(*real_ssl_new)(SSL_CTX *ctx);
static int (*ssl_is_dtls)(const SSL *ssl);
static void (*dtls_set_timer_cb)(SSL *ssl, dtls_timer_cb cb);
static pthread_once_t resolved = PTHREAD_ONCE_INIT;
static atomic_ulong timers_set;

static void resolve(void) {
    // libssl is loaded by whoever calls SSL_new (libgstdtls, as a plugin, with its own scope), so
    // ask it by name; RTLD_NEXT serves where the process itself links it.
    void *libssl = dlopen("libssl.so.3", RTLD_NOW | RTLD_NOLOAD);
    void *scope = libssl ? libssl : RTLD_NEXT;
    real_ssl_new = (SSL *(*)(SSL_CTX *))dlsym(scope, "SSL_new");
    ssl_is_dtls = (int (*)(const SSL *))dlsym(scope, "SSL_is_dtls");
    dtls_set_timer_cb = (void (*)(SSL *, dtls_timer_cb))dlsym(scope, "DTLS_set_timer_cb");
    if (!real_ssl_new) fprintf(stderr, "parley: OpenSSL's SSL_new was not found: %s\n", dlerror());
}

static unsigned int next_timer(SSL *ssl, unsigned int timer_us) {
    (void)ssl;
    if (timer_us == 0) return PARLEY_DTLS_FIRST_US;
    return timer_us >= PARLEY_DTLS_LONGEST_US / 2 ? PARLEY_DTLS_LONGEST_US : timer_us * 2;
}

SSL *SSL_new(SSL_CTX *ctx) {
    pthread_once(&resolved, resolve);
    if (!real_ssl_new) return NULL;
    SSL *ssl = real_ssl_new(ctx);
    if (ssl && ssl_is_dtls && dtls_set_timer_cb && ssl_is_dtls(ssl)) {
        dtls_set_timer_cb(ssl, next_timer);
        atomic_fetch_add(&timers_set, 1);
    }
    return ssl;
}

unsigned long parley_dtls_timers_set(void) { return atomic_load(&timers_set); }

unsigned int parley_dtls_next_timer_us(unsigned int timer_us) { return next_timer(NULL, timer_us); }
