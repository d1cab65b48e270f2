/*
 * tenant_peer.h -- raw wire-protocol peers for the tenant and mount attack
 * tests (test_attack_mount, test_tenant_quota): a session with chosen
 * credentials, mounts of made-up segments, puts without data (PUT_START +
 * PUT_END: the master never sees the bytes), EXIST, DISK_REPORT records and
 * STATS. Header-only; every helper answers a status code, never aborts.
 */
#ifndef TP_TENANT_PEER_H
#define TP_TENANT_PEER_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proto/proto.h"

static inline kvp_bytes tq_bs(const char *s)
{
    return (kvp_bytes){(const uint8_t *)s, s ? (uint32_t)strlen(s) : 0};
}

/* A session presenting these credentials (NULL = none); NULL and *rc on
 * refusal. */
static inline kvp_rpc *tq_hello(const char *addr, const char *node, const char *tenant, int *rc)
{
    char err[256];
    kvp_rpc_opts o = {.name = "tenant-peer", .timeout_ms = 5000, .node_token = node,
                      .tenant_token = tenant};
    kvp_rpc *r = NULL;
    *rc = kvp_rpc_open(addr, &o, &r, err, sizeof err);
    return *rc ? NULL : r;
}

/* One call whose answer is kvp_msg_results with one code: that code, or
 * the transport / whole-request error. */
static inline int tq_one_result(kvp_rpc *r, uint16_t op, const kvp_buf *b)
{
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, op, b->data, b->len, &st, &resp, &rl);
    if (rc || st)
        return rc ? rc : st;
    kvp_arena a;
    kvp_arena_init(&a, 4096);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_results res;
    rc = kvp_dec_results(resp, rl, &lim, &a, &res) == 0 && res.n == 1 ? res.codes[0]
                                                                       : KVP_EPROTOCOL;
    kvp_arena_free(&a);
    return rc;
}

/* MOUNT_SEGMENT of a made-up segment: `name` is also its tcp endpoint. */
static inline int tq_mount(kvp_rpc *r, uint64_t id, const char *name, uint64_t capacity,
                           uint64_t disk_capacity)
{
    kvp_endpoint ep = {tq_bs("tcp"), tq_bs(name)};
    kvp_seg_desc d = {id, tq_bs(name), capacity, 1, &ep, 7, 1, disk_capacity};
    kvp_msg_mount mm = {1, &d};
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_enc_mount(&b, &mm);
    int rc = tq_one_result(r, KVP_OP_MOUNT_SEGMENT, &b);
    kvp_buf_free(&b);
    return rc;
}

/* PUT_START of one key (one replica): its status; *seg gets the replica's
 * segment id when placed (may be NULL). */
static inline int tq_put_start(kvp_rpc *r, const char *tenant, const char *key, uint64_t size,
                               uint64_t *seg)
{
    kvp_bytes k = tq_bs(key);
    kvp_msg_put_start ps = {tq_bs(tenant), 1, 0, 0, {NULL, 0}, 1, &k, &size, NULL};
    kvp_buf b;
    kvp_buf_init(&b, 8192);
    kvp_enc_put_start(&b, &ps);
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_PUT_START, b.data, b.len, &st, &resp, &rl);
    kvp_buf_free(&b);
    if (rc || st)
        return rc ? rc : st;
    kvp_arena a;
    kvp_arena_init(&a, 1 << 16);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_put_start_resp d;
    rc = kvp_dec_put_start_resp(resp, rl, &lim, &a, &d) == 0 && d.n == 1 ? d.results[0].status
                                                                          : KVP_EPROTOCOL;
    if (rc == 0 && seg)
        *seg = d.results[0].n_replicas ? d.results[0].replicas[0].segment_id : 0;
    kvp_arena_free(&a);
    return rc;
}

static inline int tq_put_end(kvp_rpc *r, const char *tenant, const char *key, uint64_t checksum)
{
    kvp_bytes k = tq_bs(key);
    kvp_msg_put_end pe = {tq_bs(tenant), 1, &k, &checksum};
    kvp_buf b;
    kvp_buf_init(&b, 8192);
    kvp_enc_put_end(&b, &pe);
    int rc = tq_one_result(r, KVP_OP_PUT_END, &b);
    kvp_buf_free(&b);
    return rc;
}

/* A published object of `size` bytes (no data written: the master only
 * keeps metadata). 0 or the first failure. */
static inline int tq_publish(kvp_rpc *r, const char *tenant, const char *key, uint64_t size)
{
    int rc = tq_put_start(r, tenant, key, size, NULL);
    return rc ? rc : tq_put_end(r, tenant, key, 0xC0FFEE);
}

/* EXIST of one key: 1, 0, or an error. */
static inline int tq_exist(kvp_rpc *r, const char *tenant, const char *key)
{
    kvp_bytes k = tq_bs(key);
    kvp_msg_keys g = {tq_bs(tenant), 1, &k};
    kvp_buf b;
    kvp_buf_init(&b, 8192);
    kvp_enc_keys(&b, &g);
    int rc = tq_one_result(r, KVP_OP_EXIST, &b);
    kvp_buf_free(&b);
    return rc;
}

/* A DISK_REPORT HAVE record for segment seg, sent as a request so it is
 * answered (its status; the record's fate shows in EXIST). */
static inline int tq_have(kvp_rpc *r, uint64_t seg, const char *tenant, const char *key,
                          uint64_t size, uint64_t checksum)
{
    kvp_disk_ent e = {KVP_DISK_HAVE, 0, tq_bs(tenant), tq_bs(key), size, checksum, 0, 0, 1};
    kvp_msg_disk d = {seg, 1, &e};
    kvp_buf b;
    kvp_buf_init(&b, 8192);
    kvp_enc_disk(&b, &d);
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_DISK_REPORT, b.data, b.len, &st, &resp, &rl);
    kvp_buf_free(&b);
    return rc ? rc : st;
}

/* STATS into *s (allocated from a, which the caller frees). */
static inline int tq_stats(kvp_rpc *r, kvp_arena *a, kvp_msg_stats_resp *s)
{
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_STATS, NULL, 0, &st, &resp, &rl);
    if (rc || st)
        return rc ? rc : st;
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    return kvp_dec_stats_resp(resp, rl, &lim, a, s);
}

/* The row of tenant `name` in a STATS answer, or NULL. */
static inline const kvp_tenant_stat *tq_tenant_row(const kvp_msg_stats_resp *s, const char *name)
{
    for (uint32_t i = 0; i < s->n_tenants; i++)
        if (s->tenants[i].name.len == strlen(name) &&
            !memcmp(s->tenants[i].name.p, name, s->tenants[i].name.len))
            return &s->tenants[i];
    return NULL;
}

/* Writes text to a new mode-0600 file from template tmpl (mkstemp). 0 or -1. */
static inline int tq_write_secret(char *tmpl, const char *text)
{
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && fchmod(fd, 0600) == 0;
    close(fd);
    return ok ? 0 : -1;
}

#endif
