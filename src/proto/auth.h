/*
 * auth.h -- the HELLO handshake's proofs: a party shows it knows a token
 * without sending it (docs/SECURITY.md, "The HELLO handshake").
 *
 *   client -> AUTH_CHALLENGE  client nonce (32 random bytes), the
 *                             credentials it holds (KVP_AUTH_HAS_*), the
 *                             tenant credential's key id (kvp_auth_kid)
 *   server <- answer          server nonce, server id (master id / segment
 *                             id), one server proof per announced
 *                             credential it holds
 *   client                    verifies every proof (constant time); any it
 *                             cannot: it closes, having sent no secret
 *   client -> HELLO           one client proof per credential (and the
 *                             session proof to join as an existing client)
 *
 * Transcript T = "kvpool-auth-v1" || client nonce || server nonce ||
 * u64le server id || u8 announced || kid (8 bytes, zeros without a tenant
 * credential). Proofs (HMAC-SHA256 keyed by the token):
 *   server: HMAC(token, "kvpool-server" || u8 cred || T)
 *   client: HMAC(token, "kvpool-client" || u8 cred || T || u64le client id)
 * Both nonces make every proof good for one connection only; the labels
 * keep a server proof from serving as a client proof; cred keeps one
 * token's proof from standing for another credential.
 */
#ifndef KVP_AUTH_H
#define KVP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

#define KVP_AUTH_NONCE 32
#define KVP_AUTH_KID 8
#define KVP_AUTH_PROOF 32

/* Credentials, as the cred byte of a proof. */
enum kvp_auth_cred {
    KVP_AUTH_CLUSTER = 0, /* cluster token */
    KVP_AUTH_NODE = 1,    /* node credential */
    KVP_AUTH_TENANT = 2,  /* a tenant's credential (named by its kid) */
    KVP_AUTH_SESSION = 3, /* the session secret of an existing client id (client proof only) */
    KVP_AUTH__N
};
#define KVP_AUTH_HAS(cred) (1u << (cred)) /* bit of the challenge's `has` */
#define KVP_AUTH_HAS_ALL 0x0fu

/* One connection's handshake state (both sides keep the same). */
typedef struct kvp_auth_tx {
    uint8_t client_nonce[KVP_AUTH_NONCE];
    uint8_t server_nonce[KVP_AUTH_NONCE];
    uint64_t server_id;
    uint8_t has;                 /* KVP_AUTH_HAS bits the client announced */
    uint8_t kid[KVP_AUTH_KID];   /* zeros without a tenant credential */
} kvp_auth_tx;

/* A token's key id: the first KVP_AUTH_KID bytes of SHA-256("kvpool-kid"
 * || token). Names the token without revealing it. */
void kvp_auth_kid(const void *token, size_t len, uint8_t kid[KVP_AUTH_KID]);

/* KVP_AUTH_NONCE fresh random bytes (getrandom). 0 or -1 (no randomness:
 * the caller must not proceed). */
int kvp_auth_nonce(uint8_t n[KVP_AUTH_NONCE]);

/* The server's proof of `cred` (token: key, klen). */
void kvp_auth_server_proof(const kvp_auth_tx *t, int cred, const void *key, size_t klen,
                           uint8_t out[KVP_AUTH_PROOF]);
/* The client's proof of `cred`, bound to its client id. */
void kvp_auth_client_proof(const kvp_auth_tx *t, int cred, uint64_t client_id, const void *key,
                           size_t klen, uint8_t out[KVP_AUTH_PROOF]);

/* Does `proof` (plen bytes, from the wire) equal `expect`? Constant time
 * for a proof of the right length; 0 for any other length. */
int kvp_auth_proof_ok(const uint8_t *proof, uint32_t plen, const uint8_t expect[KVP_AUTH_PROOF]);

/* ------------------------------------------------------------ client side */

/* What a client holds: key[cred] (len[cred] bytes; NULL or 0 = none). */
typedef struct kvp_auth_creds {
    const void *key[KVP_AUTH__N];
    size_t len[KVP_AUTH__N];
} kvp_auth_creds;

/* "cluster token", "node credential", ... for messages. */
const char *kvp_auth_cred_name(int cred);

/* Starts a handshake: fresh client nonce, `has` and the kid from c. 0 or
 * -1 (no randomness). */
int kvp_auth_client_begin(kvp_auth_tx *t, const kvp_auth_creds *c);

/* Takes the server's answer into t (nonce: KVP_AUTH_NONCE bytes) and
 * checks a proof (proof[0..2]) for every credential of c but the session
 * secret. 0, or 1 + the first credential the server did not prove: the
 * client must then send nothing more. */
int kvp_auth_client_verify(kvp_auth_tx *t, const kvp_auth_creds *c, const uint8_t *nonce,
                           uint64_t server_id, const kvp_bytes proof[3]);

/* The HELLO's proofs: out[cred] filled and proof[cred] pointing at it for
 * each credential of c, empty for the others. */
void kvp_auth_client_proofs(const kvp_auth_tx *t, const kvp_auth_creds *c, uint64_t client_id,
                            uint8_t out[KVP_AUTH__N][KVP_AUTH_PROOF], kvp_bytes proof[KVP_AUTH__N]);

#endif
