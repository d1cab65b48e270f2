/* test_hmac.c -- common/hmac (RFC 4231 vectors) and proto/auth (the HELLO
 * handshake's proofs and messages). */
#include <stdio.h>
#include <string.h>

#include "common/hmac.h"
#include "harness.h"
#include "kvpool.h"
#include "proto/auth.h"
#include "proto/proto.h"

static void hex(const char *h, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

TEST(hmac_sha256_rfc4231)
{
    uint8_t key[131], want[32], got[32];
    /* test case 1 */
    memset(key, 0x0b, 20);
    hex("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", want, 32);
    kvp_hmac_sha256(got, key, 20, "Hi There", 8);
    CHECK(memcmp(got, want, 32) == 0);
    CHECK(kvp_hmac_equal(got, want));
    /* test case 2: a key shorter than the block */
    hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", want, 32);
    kvp_hmac_sha256(got, "Jefe", 4, "what do ya want for nothing?", 28);
    CHECK(memcmp(got, want, 32) == 0);
    /* test case 6: a key longer than the block */
    memset(key, 0xaa, 131);
    static const char m6[] = "Test Using Larger Than Block-Size Key - Hash Key First";
    hex("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", want, 32);
    kvp_hmac_sha256(got, key, 131, m6, sizeof m6 - 1);
    CHECK(memcmp(got, want, 32) == 0);
    got[31] ^= 1;
    CHECK(!kvp_hmac_equal(got, want));
    /* SHA-256("abc") over two parts */
    const void *p[2] = {"a", "bc"};
    size_t l[2] = {1, 2};
    hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", want, 32);
    kvp_hmac_sha256_digest(got, 2, p, l);
    CHECK(memcmp(got, want, 32) == 0);
}

TEST(auth_proofs_differ_by_role_credential_and_connection)
{
    kvp_auth_tx t;
    memset(&t, 0, sizeof t);
    CHECK_EQ(kvp_auth_nonce(t.client_nonce), 0);
    CHECK_EQ(kvp_auth_nonce(t.server_nonce), 0);
    t.server_id = 7;
    t.has = KVP_AUTH_HAS(KVP_AUTH_CLUSTER);
    uint8_t s0[32], s1[32], c0[32], c0b[32], c0id[32];
    kvp_auth_server_proof(&t, KVP_AUTH_CLUSTER, "tok", 3, s0);
    kvp_auth_server_proof(&t, KVP_AUTH_NODE, "tok", 3, s1);
    kvp_auth_client_proof(&t, KVP_AUTH_CLUSTER, 1, "tok", 3, c0);
    kvp_auth_client_proof(&t, KVP_AUTH_CLUSTER, 2, "tok", 3, c0id);
    CHECK(memcmp(s0, s1, 32) != 0);  /* another credential */
    CHECK(memcmp(s0, c0, 32) != 0);  /* another role */
    CHECK(memcmp(c0, c0id, 32) != 0); /* another client id */
    kvp_auth_tx t2 = t;
    t2.server_nonce[0] ^= 1;          /* another connection */
    kvp_auth_client_proof(&t2, KVP_AUTH_CLUSTER, 1, "tok", 3, c0b);
    CHECK(memcmp(c0, c0b, 32) != 0);
    t2 = t;
    t2.server_id = 8;                 /* another server */
    kvp_auth_client_proof(&t2, KVP_AUTH_CLUSTER, 1, "tok", 3, c0b);
    CHECK(memcmp(c0, c0b, 32) != 0);
    CHECK(kvp_auth_proof_ok(c0, 32, c0));
    CHECK(!kvp_auth_proof_ok(c0, 31, c0));
    CHECK(!kvp_auth_proof_ok(NULL, 0, c0));
    /* the key id: stable, per token, not the token */
    uint8_t k1[8], k2[8], k3[8];
    kvp_auth_kid("alice-token", 11, k1);
    kvp_auth_kid("alice-token", 11, k2);
    kvp_auth_kid("bob-token", 9, k3);
    CHECK(memcmp(k1, k2, 8) == 0 && memcmp(k1, k3, 8) != 0);
}

TEST(auth_client_verifies_every_credential)
{
    kvp_auth_creds c;
    memset(&c, 0, sizeof c);
    c.key[KVP_AUTH_CLUSTER] = "ct";
    c.len[KVP_AUTH_CLUSTER] = 2;
    c.key[KVP_AUTH_TENANT] = "tt";
    c.len[KVP_AUTH_TENANT] = 2;
    kvp_auth_tx t;
    CHECK_EQ(kvp_auth_client_begin(&t, &c), 0);
    CHECK_EQ(t.has, KVP_AUTH_HAS(KVP_AUTH_CLUSTER) | KVP_AUTH_HAS(KVP_AUTH_TENANT));
    uint8_t kid[8];
    kvp_auth_kid("tt", 2, kid);
    CHECK(memcmp(t.kid, kid, 8) == 0);
    /* the server's side of the same transcript */
    kvp_auth_tx s = t;
    CHECK_EQ(kvp_auth_nonce(s.server_nonce), 0);
    s.server_id = 99;
    uint8_t pc[32], pt[32];
    kvp_auth_server_proof(&s, KVP_AUTH_CLUSTER, "ct", 2, pc);
    kvp_auth_server_proof(&s, KVP_AUTH_TENANT, "tt", 2, pt);
    kvp_bytes all[3] = {{pc, 32}, {NULL, 0}, {pt, 32}};
    kvp_auth_tx v = t;
    CHECK_EQ(kvp_auth_client_verify(&v, &c, s.server_nonce, 99, all), 0);
    /* a server without the tenant's token: named */
    kvp_bytes no_tenant[3] = {{pc, 32}, {NULL, 0}, {NULL, 0}};
    v = t;
    CHECK_EQ(kvp_auth_client_verify(&v, &c, s.server_nonce, 99, no_tenant), 1 + KVP_AUTH_TENANT);
    /* a proof for another server id (a replayed answer) */
    v = t;
    CHECK_EQ(kvp_auth_client_verify(&v, &c, s.server_nonce, 98, all), 1 + KVP_AUTH_CLUSTER);
    /* the client's proofs: one per credential held */
    uint8_t out[KVP_AUTH__N][KVP_AUTH_PROOF];
    kvp_bytes pr[KVP_AUTH__N];
    v = t;
    CHECK_EQ(kvp_auth_client_verify(&v, &c, s.server_nonce, 99, all), 0);
    kvp_auth_client_proofs(&v, &c, 5, out, pr);
    CHECK(pr[KVP_AUTH_CLUSTER].len == 32 && pr[KVP_AUTH_NODE].len == 0 &&
          pr[KVP_AUTH_TENANT].len == 32 && pr[KVP_AUTH_SESSION].len == 0);
    uint8_t want[32];
    kvp_auth_client_proof(&s, KVP_AUTH_TENANT, 5, "tt", 2, want);
    CHECK(kvp_auth_proof_ok(pr[KVP_AUTH_TENANT].p, 32, want));
}

TEST(challenge_decoding_is_strict)
{
    uint8_t n[32] = {1};
    uint8_t kid[8] = {2};
    kvp_buf b;
    kvp_msg_challenge m;
    kvp_buf_init(&b, 256);
    /* a tenant announced without a kid, a kid without a tenant, short
     * nonce, unknown bits: refused */
    kvp_msg_challenge bad[] = {
        {KVP_PROTO_VERSION, {n, 32}, KVP_AUTH_HAS(KVP_AUTH_TENANT), {NULL, 0}},
        {KVP_PROTO_VERSION, {n, 32}, 0, {kid, 8}},
        {KVP_PROTO_VERSION, {n, 31}, 0, {NULL, 0}},
        {KVP_PROTO_VERSION, {n, 32}, 0x10, {NULL, 0}},
        {KVP_PROTO_VERSION, {n, 32}, KVP_AUTH_HAS(KVP_AUTH_TENANT), {kid, 7}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_buf_reset(&b);
        kvp_enc_challenge(&b, &bad[i]);
        CHECK_EQ(kvp_dec_challenge(b.data, (uint32_t)b.len, &m), KVP_EPROTOCOL);
    }
    kvp_buf_reset(&b);
    kvp_msg_challenge ok = {KVP_PROTO_VERSION, {n, 32}, KVP_AUTH_HAS_ALL, {kid, 8}};
    kvp_enc_challenge(&b, &ok);
    CHECK_EQ(kvp_dec_challenge(b.data, (uint32_t)b.len, &m), 0);
    /* a proof of another length in an answer or a HELLO */
    kvp_buf_reset(&b);
    kvp_msg_challenge_resp r = {{n, 32}, 1, {{n, 31}, {NULL, 0}, {NULL, 0}}};
    kvp_enc_challenge_resp(&b, &r);
    kvp_msg_challenge_resp rd;
    CHECK_EQ(kvp_dec_challenge_resp(b.data, (uint32_t)b.len, &rd), KVP_EPROTOCOL);
    kvp_buf_reset(&b);
    kvp_msg_hello h = {KVP_PROTO_VERSION, 1, {NULL, 0}, {{NULL, 0}, {n, 16}, {NULL, 0}, {NULL, 0}}};
    kvp_enc_hello(&b, &h);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_hello hd;
    CHECK_EQ(kvp_dec_hello(b.data, (uint32_t)b.len, &l, &hd), KVP_EPROTOCOL);
    kvp_buf_free(&b);
}
