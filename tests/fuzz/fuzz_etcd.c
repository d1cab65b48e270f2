/*
 * fuzz_etcd.c -- the etcd client's parsers against arbitrary input: answer
 * bodies (kvp_etcd_parse, every kind) as a hostile or broken etcd member
 * could send them, and etcd addresses (kvp_etcd_parse_url) as a
 * configuration could hold them.
 *
 * kvp_etcd_parse_list walks the same body (every kv handed over must fit
 * the documented key and value bounds). The first byte picks the kind (mod 5) and, with bit 7, a value buffer of
 * 8 bytes instead of 4096; the rest is the body. Invariants checked (abort
 * on violation): parse answers only 0, KVP_EPROTOCOL, KVP_EBUFFER_OVERFLOW
 * or KVP_ENOMEM; on 0, a found value fits its buffer, an error answer has a
 * positive code and a terminated message, a GRANT has a lease and a TTL > 0;
 * parse_url answers 0 or KVP_EINVALID_PARAMS with a message; on 0 there are
 * 1..8 endpoints, each "HOST:PORT" with a port in 1..65535, and a cluster
 * name of [A-Za-z0-9._-]; nothing leaks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ha/etcd.h"
#include "kvpool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_url(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return;
    memcpy(s, data, size);
    s[size] = '\0';
    kvp_etcd_target t;
    char err[128];
    err[0] = '\0';
    int rc = kvp_etcd_parse_url(s, &t, err, sizeof err);
    if (rc != 0 && (rc != KVP_EINVALID_PARAMS || !err[0] || !memchr(err, '\0', sizeof err)))
        abort();
    if (rc == 0) {
        if (t.n < 1 || t.n > KVP_ETCD_MAX_ENDPOINTS || !t.cluster[0])
            abort();
        for (int i = 0; i < t.n; i++) {
            const char *c = strrchr(t.endpoints[i], ':');
            if (!c || c == t.endpoints[i] || atol(c + 1) < 1 || atol(c + 1) > 65535)
                abort();
        }
        for (const char *p = t.cluster; *p; p++)
            if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-", *p))
                abort();
    }
    free(s);
}

static int on_kv(const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                 const kvp_etcd_kv *kv, void *arg)
{
    (void)kv;
    (void)arg;
    if (klen == 0 || klen > KVP_ETCD_MAX_KEY || vlen > KVP_ETCD_MAX_VALUE)
        abort();
    volatile uint8_t x = 0;
    for (size_t i = 0; i < klen; i++)
        x ^= key[i];
    for (size_t i = 0; i < vlen; i++)
        x ^= val[i];
    (void)x;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    check_url(data + 1, size - 1);
    int kind = data[0] % 6;
    size_t cap = data[0] & 0x80 ? 8 : 4096;
    uint8_t *val = malloc(cap);
    char *body = malloc(size - 1 ? size - 1 : 1);
    if (!val || !body) {
        free(val);
        free(body);
        return 0;
    }
    memcpy(body, data + 1, size - 1); /* exactly size - 1 bytes: ASan sees an overread */
    kvp_etcd_answer a;
    int rc = kvp_etcd_parse(body, size - 1, kind, &a, val, cap);
    if (rc != 0 && rc != KVP_EPROTOCOL && rc != KVP_EBUFFER_OVERFLOW && rc != KVP_ENOMEM)
        abort();
    if (rc == 0) {
        if (a.found && a.kv.value_len > cap)
            abort();
        if (a.etcd_code < 0 || !memchr(a.message, '\0', sizeof a.message))
            abort();
        if (!a.etcd_code && kind == KVP_ETCD_ANS_GRANT && (a.lease_id == 0 || a.ttl <= 0))
            abort();
        if (a.found)
            for (size_t i = 0; i < a.kv.value_len; i++)
                (void)*(volatile uint8_t *)&val[i];
    }
    rc = kvp_etcd_parse_list(body, size - 1, on_kv, NULL);
    if (rc != 0 && rc != KVP_EPROTOCOL && rc != KVP_ENOMEM)
        abort();
    free(val);
    free(body);
    return 0;
}
