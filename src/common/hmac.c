/*
 * hmac.c -- SHA-256 / HMAC-SHA256 over libcrypto (hmac.h).
 */
#include "common/hmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>

static const uint8_t empty_key[1];

/* libcrypto failed on memory inputs: nothing sane is left to do. */
static void hmac_die(const char *what)
{
    fprintf(stderr, "kvpool: libcrypto %s failed\n", what);
    abort();
}

void kvp_hmac_sha256_digest(uint8_t out[KVP_SHA256_LEN], int n, const void *const *p,
                            const size_t *len)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1)
        hmac_die("SHA-256 init");
    for (int i = 0; i < n; i++)
        if (len[i] && EVP_DigestUpdate(c, p[i], len[i]) != 1)
            hmac_die("SHA-256 update");
    unsigned int ol = 0;
    if (EVP_DigestFinal_ex(c, out, &ol) != 1 || ol != KVP_SHA256_LEN)
        hmac_die("SHA-256 final");
    EVP_MD_CTX_free(c);
}

void kvp_hmac_sha256(uint8_t out[KVP_SHA256_LEN], const void *key, size_t klen, const void *msg,
                     size_t mlen)
{
    unsigned int ol = 0;
    if (!key || !klen) /* HMAC() takes a NULL key to mean "reuse the last one" */
        key = empty_key, klen = 0;
    if (!msg)
        msg = empty_key, mlen = 0;
    if (klen > (size_t)0x7fffffff ||
        !HMAC(EVP_sha256(), key, (int)klen, msg, mlen, out, &ol) || ol != KVP_SHA256_LEN)
        hmac_die("HMAC-SHA256");
}

int kvp_hmac_equal(const uint8_t a[KVP_SHA256_LEN], const uint8_t b[KVP_SHA256_LEN])
{
    return CRYPTO_memcmp(a, b, KVP_SHA256_LEN) == 0;
}
