/* test_etcd_parse.c -- kvp_etcd_parse_url and kvp_etcd_parse: the etcd
 * addresses kvpool accepts, and what an etcd answer may and may not say. */
#include <stdio.h>
#include <string.h>

#include "ha/etcd.h"
#include "harness.h"
#include "kvpool.h"

TEST(etcd_url_forms)
{
    kvp_etcd_target t;
    char err[128];
    CHECK_EQ(kvp_etcd_parse_url("etcd://10.0.0.1:2379/prod", &t, err, sizeof err), 0);
    CHECK_EQ(t.n, 1);
    CHECK(strcmp(t.endpoints[0], "10.0.0.1:2379") == 0 && strcmp(t.cluster, "prod") == 0);
    /* several endpoints, Mooncake's form without a cluster name */
    CHECK_EQ(kvp_etcd_parse_url("etcd://a:1,b.example:2,[::1]:3", &t, err, sizeof err), 0);
    CHECK_EQ(t.n, 3);
    CHECK(strcmp(t.endpoints[2], "[::1]:3") == 0 && strcmp(t.cluster, "default") == 0);
    CHECK_EQ(kvp_etcd_parse_url("etcd://h:2379/", &t, err, sizeof err), 0);
    CHECK(strcmp(t.cluster, "default") == 0);
    /* an endpoint list alone */
    CHECK_EQ(kvp_etcd_parse_url("http://h:1,http://g:2/", &t, err, sizeof err), 0);
    CHECK_EQ(t.n, 2);
    CHECK(strcmp(t.endpoints[1], "g:2") == 0);
    CHECK(!t.https);
    /* https (kvp_etcd_open then needs etcd_cacert) */
    CHECK_EQ(kvp_etcd_parse_url("https://h:1,https://g:2", &t, err, sizeof err), 0);
    CHECK(t.https && t.n == 2 && strcmp(t.endpoints[0], "h:1") == 0);
    /* etcd:// with the process's CA: https, and the credentials carried */
    kvp_etcd_auth a;
    memset(&a, 0, sizeof a);
    strcpy(a.user, "kvpool");
    strcpy(a.password, "pw");
    strcpy(a.cacert, "/etc/ssl/ca.pem");
    kvp_etcd_auth_set(&a);
    CHECK_EQ(kvp_etcd_parse_url("etcd://h:1/c", &t, err, sizeof err), 0);
    kvp_etcd_auth_set(NULL);
    CHECK(t.https && strcmp(t.auth.user, "kvpool") == 0 && strcmp(t.auth.password, "pw") == 0);
    CHECK_EQ(kvp_etcd_parse_url("etcd://h:1/c", &t, err, sizeof err), 0);
    CHECK(!t.https && !t.auth.user[0]);
    CHECK(kvp_etcd_is_url("etcd://x:1") && !kvp_etcd_is_url("127.0.0.1:50051"));
}

TEST(etcd_url_refusals)
{
    static const char *const bad[] = {
        "", "etcd://", "etcd:///c", "etcd://h/c", "etcd://h:/c", "etcd://h:0/c", "etcd://h:65536",
        "etcd://h:12x/c", "etcd://h:1,/c", "etcd://h:1,,g:2", "etcd://h:1/a/b", "etcd://h:1/a b",
        "etcd://ho st:1", "etcd://h:1,h:2,h:3,h:4,h:5,h:6,h:7,h:8,h:9",
        "etcd://h:1/0123456789012345678901234567890123456789012345678901234567890123456789",
        "https://h:1,http://g:2", "http://h:1,https://g:2", "127.0.0.1:2379", "etcd://h:1?x=1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_etcd_target t;
        char err[128] = "";
        if (kvp_etcd_parse_url(bad[i], &t, err, sizeof err) != KVP_EINVALID_PARAMS || !err[0]) {
            th_fail(__FILE__, __LINE__, "accepted or unexplained: '%s'", bad[i]);
            return;
        }
    }
    CHECK_EQ(kvp_etcd_parse_url(NULL, NULL, NULL, 0), KVP_EINVALID_PARAMS);
}

static int parse(const char *s, int kind, kvp_etcd_answer *a, uint8_t *v, size_t cap)
{
    return kvp_etcd_parse(s, strlen(s), kind, a, v, cap);
}

TEST(etcd_parse_answers)
{
    kvp_etcd_answer a;
    uint8_t v[16];
    /* what etcd 3.4 answers (captured) */
    CHECK_EQ(parse("{\"header\":{\"cluster_id\":\"1\",\"revision\":\"2\",\"raft_term\":\"2\"},"
                   "\"kvs\":[{\"key\":\"a2V5\",\"create_revision\":\"2\",\"mod_revision\":\"3\","
                   "\"version\":\"2\",\"value\":\"aGVsbG8=\",\"lease\":\"4111120409827681287\"}],"
                   "\"count\":\"1\"}",
                   KVP_ETCD_ANS_RANGE, &a, v, sizeof v),
             0);
    CHECK(a.found && a.revision == 2 && a.kv.create_revision == 2 && a.kv.mod_revision == 3);
    CHECK(a.kv.lease == 4111120409827681287ull && a.kv.value_len == 5 && memcmp(v, "hello", 5) == 0);
    CHECK_EQ(parse("{\"header\":{\"revision\":\"3\"}}", KVP_ETCD_ANS_RANGE, &a, v, sizeof v), 0);
    CHECK(!a.found && a.revision == 3);
    /* txn: lost (no "succeeded"), the holder in the first response */
    CHECK_EQ(parse("{\"header\":{\"revision\":\"2\"},\"responses\":[{\"response_range\":{\"header\":"
                   "{\"revision\":\"2\"},\"kvs\":[{\"key\":\"a2V5\",\"create_revision\":\"2\","
                   "\"value\":\"eA==\"}],\"count\":\"1\"}}]}",
                   KVP_ETCD_ANS_TXN, &a, v, sizeof v),
             0);
    CHECK(!a.succeeded && a.found && a.kv.create_revision == 2 && a.kv.value_len == 1);
    CHECK_EQ(parse("{\"header\":{\"revision\":\"7\"},\"succeeded\":true,\"responses\":"
                   "[{\"response_put\":{\"header\":{\"revision\":\"7\"}}}]}",
                   KVP_ETCD_ANS_TXN, &a, NULL, 0),
             0);
    CHECK(a.succeeded && !a.found && a.revision == 7);
    CHECK_EQ(parse("{\"header\":{},\"ID\":\"42\",\"TTL\":\"5\"}", KVP_ETCD_ANS_GRANT, &a, NULL, 0),
             0);
    CHECK(a.lease_id == 42 && a.ttl == 5);
    CHECK_EQ(parse("{\"result\":{\"header\":{},\"ID\":\"42\",\"TTL\":\"4\"}}",
                   KVP_ETCD_ANS_KEEPALIVE, &a, NULL, 0),
             0);
    CHECK(a.lease_id == 42 && a.ttl == 4);
    /* an expired lease's keepalive: no TTL, or -1 */
    CHECK_EQ(parse("{\"result\":{\"header\":{},\"ID\":\"42\"}}", KVP_ETCD_ANS_KEEPALIVE, &a, NULL,
                   0),
             0);
    CHECK(a.ttl <= 0);
    CHECK_EQ(parse("{\"result\":{\"ID\":\"42\",\"TTL\":\"-1\"}}", KVP_ETCD_ANS_KEEPALIVE, &a,
                   NULL, 0),
             0);
    CHECK_EQ(a.ttl, -1);
    /* an error answer */
    CHECK_EQ(parse("{\"error\":\"etcdserver: requested lease not found\",\"code\":5,"
                   "\"message\":\"etcdserver: requested lease not found\"}",
                   KVP_ETCD_ANS_PLAIN, &a, NULL, 0),
             0);
    CHECK(a.etcd_code == 5 && strstr(a.message, "lease not found"));
}

TEST(etcd_parse_refusals)
{
    static const struct {
        const char *s;
        int kind, want;
    } bad[] = {
        {"", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"[]", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"header\":5}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"header\":{\"revision\":\"-1\"}}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"header\":{\"revision\":\"18446744073709551616\"}}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"header\":{\"revision\":\"1x\"}}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"header\":{\"revision\":\"\"}}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"kvs\":{}}", KVP_ETCD_ANS_RANGE, KVP_EPROTOCOL},
        {"{\"kvs\":[5]}", KVP_ETCD_ANS_RANGE, KVP_EPROTOCOL},
        {"{\"kvs\":[{\"value\":\"abc\"}]}", KVP_ETCD_ANS_RANGE, KVP_EPROTOCOL},
        {"{\"kvs\":[{\"value\":\"a=bc\"}]}", KVP_ETCD_ANS_RANGE, KVP_EPROTOCOL},
        {"{\"kvs\":[{\"value\":\"YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo=\"}]}", KVP_ETCD_ANS_RANGE,
         KVP_EBUFFER_OVERFLOW},
        {"{\"kvs\":[{\"value\":7}]}", KVP_ETCD_ANS_RANGE, KVP_EPROTOCOL},
        {"{\"succeeded\":\"yes\"}", KVP_ETCD_ANS_TXN, KVP_EPROTOCOL},
        {"{\"responses\":[7]}", KVP_ETCD_ANS_TXN, KVP_EPROTOCOL},
        {"{\"ID\":\"0\",\"TTL\":\"5\"}", KVP_ETCD_ANS_GRANT, KVP_EPROTOCOL},
        {"{\"ID\":\"4\"}", KVP_ETCD_ANS_GRANT, KVP_EPROTOCOL},
        {"{\"ID\":\"4\",\"TTL\":true}", KVP_ETCD_ANS_GRANT, KVP_EPROTOCOL},
        {"{\"ID\":\"4\",\"TTL\":\"5\"}", KVP_ETCD_ANS_KEEPALIVE, KVP_EPROTOCOL}, /* no result */
        {"{\"code\":\"5\"}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"error\":\"x\"}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"code\":5,\"message\":[]}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
        {"{\"header\":{},\"header\":{}}", KVP_ETCD_ANS_PLAIN, KVP_EPROTOCOL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_etcd_answer a;
        uint8_t v[8];
        int rc = parse(bad[i].s, bad[i].kind, &a, v, sizeof v);
        if (rc != bad[i].want) {
            th_fail(__FILE__, __LINE__, "'%s': %d, wanted %d", bad[i].s, rc, bad[i].want);
            return;
        }
    }
    /* a length that stops inside the text: only that prefix is read */
    kvp_etcd_answer a;
    CHECK_EQ(kvp_etcd_parse("{}}", 2, KVP_ETCD_ANS_PLAIN, &a, NULL, 0), 0);
}

/* The auth answer's token goes into an HTTP header: printable, no space,
 * bounded; anything else is refused, never sent. */
TEST(etcd_parse_auth_token)
{
    kvp_etcd_answer a;
    CHECK_EQ(parse("{\"header\":{\"revision\":\"3\"},\"token\":\"AbC.42\"}", KVP_ETCD_ANS_AUTH,
                   &a, NULL, 0),
             0);
    CHECK(strcmp(a.token, "AbC.42") == 0);
    static const char *const bad[] = {
        "{}", "{\"token\":\"\"}", "{\"token\":42}", "{\"token\":\"a b\"}",
        "{\"token\":\"a\\r\\nX-Evil: 1\"}", "{\"token\":\"a\\u0000b\"}", "{\"token\":\"\u00e9\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (parse(bad[i], KVP_ETCD_ANS_AUTH, &a, NULL, 0) != KVP_EPROTOCOL)
            th_fail(__FILE__, __LINE__, "token accepted: %s", bad[i]);
    char big[KVP_ETCD_MAX_TOKEN + 32];
    int n = snprintf(big, sizeof big, "{\"token\":\"");
    memset(big + n, 'x', KVP_ETCD_MAX_TOKEN + 1);
    strcpy(big + n + KVP_ETCD_MAX_TOKEN + 1, "\"}");
    CHECK_EQ(parse(big, KVP_ETCD_ANS_AUTH, &a, NULL, 0), KVP_EPROTOCOL);
    /* an auth refusal is an error answer like any other */
    CHECK_EQ(parse("{\"error\":\"etcdserver: invalid auth token\",\"code\":16,"
                   "\"message\":\"etcdserver: invalid auth token\"}",
                   KVP_ETCD_ANS_AUTH, &a, NULL, 0),
             0);
    CHECK_EQ(a.etcd_code, 16);
}
