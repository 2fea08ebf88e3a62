// The DTLS certificate of every peer connection in the process: ECDSA on P-256, as browsers and
// libwebrtc make theirs.
//
// GStreamer 1.22's dtls elements generate an RSA 2048 certificate when given none, and a DTLS
// client that offers only the ECDSA cipher suites (RFC 8827 makes ECDHE-ECDSA with P-256 the one
// every WebRTC endpoint must support; aiortc's client offers nothing else) finds no suite in
// common with it: the handshake fails. One key and certificate are made on first use and kept for
// the life of the process, as GStreamer keeps its own; dtlsdec takes them as its "pem" (the
// certificate, then the key), and caches one DTLS agent per PEM.

#include "parley_gst.h"

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t made = PTHREAD_ONCE_INIT;
static char *certificate_pem;
// "sha-256 AB:CD:…": 32 bytes as hex pairs joined by colons, after the name.
static char fingerprint[8 + 32 * 3];

static char *bio_text(BIO *bio) {
    char *data = NULL;
    long length = BIO_get_mem_data(bio, &data);
    if (length <= 0) return NULL;
    char *text = malloc((size_t)length + 1);
    if (!text) return NULL;
    memcpy(text, data, (size_t)length);
    text[length] = '\0';
    return text;
}

static int set_random_serial(X509 *x509) {
    unsigned char bytes[8];
    if (RAND_bytes(bytes, sizeof bytes) != 1) return 0;
    bytes[0] &= 0x7f;  // positive, as RFC 5280 requires
    BIGNUM *serial = BN_bin2bn(bytes, sizeof bytes, NULL);
    int done = serial && BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x509)) != NULL;
    BN_free(serial);
    return done;
}

static void make(void) {
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x509 = X509_new();
    BIO *bio = BIO_new(BIO_s_mem());
    X509_NAME *name = x509 ? X509_get_subject_name(x509) : NULL;
    unsigned char digest[32];
    unsigned int digest_length = 0;
    // Valid from a day back (clocks disagree) for a year, as GStreamer's own; WebRTC peers check
    // the certificate against the fingerprint in the description, not its dates or its name.
    int done = key && x509 && bio && name
        && X509_set_version(x509, 2)
        && set_random_serial(x509)
        && X509_gmtime_adj(X509_getm_notBefore(x509), -24L * 3600)
        && X509_gmtime_adj(X509_getm_notAfter(x509), 365L * 24 * 3600)
        && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"parley", -1, -1, 0)
        && X509_set_issuer_name(x509, name)
        && X509_set_pubkey(x509, key)
        && X509_sign(x509, key, EVP_sha256()) > 0
        && PEM_write_bio_X509(bio, x509)
        && PEM_write_bio_PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL)
        && X509_digest(x509, EVP_sha256(), digest, &digest_length)
        && digest_length == sizeof digest;
    if (done) certificate_pem = bio_text(bio);
    if (certificate_pem) {
        char *end = fingerprint + sprintf(fingerprint, "sha-256 ");
        for (unsigned int i = 0; i < digest_length; i++) end += sprintf(end, i ? ":%02X" : "%02X", digest[i]);
    }
    BIO_free(bio);
    X509_free(x509);
    EVP_PKEY_free(key);
}

const char *parley_dtls_certificate_pem(void) {
    pthread_once(&made, make);
    return certificate_pem;
}

const char *parley_dtls_certificate_fingerprint(void) {
    pthread_once(&made, make);
    return certificate_pem ? fingerprint : NULL;
}
