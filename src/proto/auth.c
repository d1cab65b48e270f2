/*
 * auth.c -- HELLO handshake proofs (auth.h).
 */
#include "proto/auth.h"

#include <string.h>
#include <sys/random.h>

#include "common/hmac.h"

#define TX_LABEL "kvpool-auth-v1"
#define TX_MAX (sizeof(TX_LABEL) - 1 + 2 * KVP_AUTH_NONCE + 8 + 1 + KVP_AUTH_KID)
#define MSG_MAX (16 + 1 + TX_MAX + 8)

static size_t put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return 8;
}

/* label || cred || T into msg; returns its length. */
static size_t tx_msg(uint8_t *msg, const char *label, int cred, const kvp_auth_tx *t)
{
    size_t n = strlen(label);
    memcpy(msg, label, n);
    msg[n++] = (uint8_t)cred;
    memcpy(msg + n, TX_LABEL, sizeof(TX_LABEL) - 1);
    n += sizeof(TX_LABEL) - 1;
    memcpy(msg + n, t->client_nonce, KVP_AUTH_NONCE);
    n += KVP_AUTH_NONCE;
    memcpy(msg + n, t->server_nonce, KVP_AUTH_NONCE);
    n += KVP_AUTH_NONCE;
    n += put_u64(msg + n, t->server_id);
    msg[n++] = t->has;
    memcpy(msg + n, t->kid, KVP_AUTH_KID);
    return n + KVP_AUTH_KID;
}

void kvp_auth_kid(const void *token, size_t len, uint8_t kid[KVP_AUTH_KID])
{
    static const char label[] = "kvpool-kid";
    const void *p[2] = {label, token};
    size_t l[2] = {sizeof label - 1, len};
    uint8_t d[KVP_SHA256_LEN];
    kvp_hmac_sha256_digest(d, 2, p, l);
    memcpy(kid, d, KVP_AUTH_KID);
}

int kvp_auth_nonce(uint8_t n[KVP_AUTH_NONCE])
{
    return getrandom(n, KVP_AUTH_NONCE, 0) == KVP_AUTH_NONCE ? 0 : -1;
}

void kvp_auth_server_proof(const kvp_auth_tx *t, int cred, const void *key, size_t klen,
                           uint8_t out[KVP_AUTH_PROOF])
{
    uint8_t msg[MSG_MAX];
    size_t n = tx_msg(msg, "kvpool-server", cred, t);
    kvp_hmac_sha256(out, key, klen, msg, n);
}

void kvp_auth_client_proof(const kvp_auth_tx *t, int cred, uint64_t client_id, const void *key,
                           size_t klen, uint8_t out[KVP_AUTH_PROOF])
{
    uint8_t msg[MSG_MAX];
    size_t n = tx_msg(msg, "kvpool-client", cred, t);
    n += put_u64(msg + n, client_id);
    kvp_hmac_sha256(out, key, klen, msg, n);
}

int kvp_auth_proof_ok(const uint8_t *proof, uint32_t plen, const uint8_t expect[KVP_AUTH_PROOF])
{
    return plen == KVP_AUTH_PROOF && proof && kvp_hmac_equal(proof, expect);
}

const char *kvp_auth_cred_name(int cred)
{
    static const char *const n[KVP_AUTH__N] = {"cluster token", "node credential",
                                               "tenant credential", "session secret"};
    return cred >= 0 && cred < KVP_AUTH__N ? n[cred] : "credential";
}

static int holds(const kvp_auth_creds *c, int cred)
{
    return c->key[cred] && c->len[cred];
}

int kvp_auth_client_begin(kvp_auth_tx *t, const kvp_auth_creds *c)
{
    memset(t, 0, sizeof *t);
    if (kvp_auth_nonce(t->client_nonce) != 0)
        return -1;
    for (int i = 0; i < KVP_AUTH__N; i++)
        if (holds(c, i))
            t->has |= (uint8_t)KVP_AUTH_HAS(i);
    if (holds(c, KVP_AUTH_TENANT))
        kvp_auth_kid(c->key[KVP_AUTH_TENANT], c->len[KVP_AUTH_TENANT], t->kid);
    return 0;
}

int kvp_auth_client_verify(kvp_auth_tx *t, const kvp_auth_creds *c, const uint8_t *nonce,
                           uint64_t server_id, const kvp_bytes proof[3])
{
    memcpy(t->server_nonce, nonce, KVP_AUTH_NONCE);
    t->server_id = server_id;
    int bad = 0;
    for (int i = 0; i < 3; i++) { /* all checked: no early exit */
        if (!holds(c, i))
            continue;
        uint8_t want[KVP_AUTH_PROOF];
        kvp_auth_server_proof(t, i, c->key[i], c->len[i], want);
        if (!kvp_auth_proof_ok(proof[i].p, proof[i].len, want) && !bad)
            bad = 1 + i;
    }
    return bad;
}

void kvp_auth_client_proofs(const kvp_auth_tx *t, const kvp_auth_creds *c, uint64_t client_id,
                            uint8_t out[KVP_AUTH__N][KVP_AUTH_PROOF], kvp_bytes proof[KVP_AUTH__N])
{
    for (int i = 0; i < KVP_AUTH__N; i++) {
        proof[i] = (kvp_bytes){NULL, 0};
        if (!holds(c, i))
            continue;
        kvp_auth_client_proof(t, i, client_id, c->key[i], c->len[i], out[i]);
        proof[i] = (kvp_bytes){out[i], KVP_AUTH_PROOF};
    }
}
