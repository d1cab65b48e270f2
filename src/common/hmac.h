/*
 * hmac.h -- SHA-256 and HMAC-SHA256 (RFC 2104, FIPS 180-4), the only
 * cryptographic primitives kvpool uses (the HELLO handshake, proto/auth.h).
 * Backed by OpenSSL's libcrypto; nothing else includes OpenSSL.
 *
 * Contract: inputs may be empty (NULL with length 0); outputs are always
 * KVP_SHA256_LEN bytes. The functions cannot fail for inputs in memory (a
 * libcrypto failure aborts: a process that cannot hash must not guess).
 */
#ifndef KVP_HMAC_H
#define KVP_HMAC_H

#include <stddef.h>
#include <stdint.h>

#define KVP_SHA256_LEN 32

/* SHA-256 of the concatenation of n parts (p[i], len[i]). */
void kvp_hmac_sha256_digest(uint8_t out[KVP_SHA256_LEN], int n, const void *const *p,
                            const size_t *len);

/* HMAC-SHA256 of `msg` under `key`. */
void kvp_hmac_sha256(uint8_t out[KVP_SHA256_LEN], const void *key, size_t klen, const void *msg,
                     size_t mlen);

/* Constant-time equality of two KVP_SHA256_LEN-byte values: 1 when equal. */
int kvp_hmac_equal(const uint8_t a[KVP_SHA256_LEN], const uint8_t b[KVP_SHA256_LEN]);

#endif
