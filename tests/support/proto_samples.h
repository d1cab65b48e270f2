/*
 * proto_samples.h -- one uniform view of every message codec in proto.h,
 * shared by tests/unit/test_proto.c, the fuzz targets and the corpus
 * generator (header-only: each user gets its own static copy).
 *
 *   pc_codecs[kind]      name, encoder and decoder with one signature
 *   pc_sample(k, v, m)   sample v of kind k (0: empty batches / minimal,
 *                        1: typical, 2: maximal keys and strings); -1 if none
 *   pc_equal(k, a, b)    field-by-field equality of two decoded messages
 *   pc_op_kinds[op]      body kind of the request / response of an opcode
 *                        (PC_NONE: the body is empty)
 *
 * Samples point into static storage and are valid for the whole program.
 */
#ifndef KVP_PROTO_SAMPLES_H
#define KVP_PROTO_SAMPLES_H

#include <stdint.h>
#include <string.h>

#include "kvpool.h"
#include "proto/proto.h"

#define PC_UNUSED __attribute__((unused))

/* XX(type suffix, decoder arguments: N = none, L = limits, LA = limits + arena) */
#define PC_KINDS(XX)                                                           \
    XX(hello, L)                                                               \
    XX(hello_resp, N)                                                          \
    XX(mount, LA)                                                              \
    XX(ids, LA)                                                                \
    XX(heartbeat_resp, N)                                                      \
    XX(results, LA)                                                            \
    XX(keys, LA)                                                               \
    XX(put_start, LA)                                                          \
    XX(put_start_resp, LA)                                                     \
    XX(put_end, LA)                                                            \
    XX(get_resp, LA)                                                           \
    XX(prefix_resp, N)                                                         \
    XX(remove, LA)                                                             \
    XX(remove_all, L)                                                          \
    XX(remove_all_resp, N)                                                     \
    XX(stats_resp, LA)                                                         \
    XX(seg_info_resp, LA)                                                      \
    XX(remove_regex, L)                                                        \
    XX(seg_freed, LA)                                                          \
    XX(replica_bad, LA)                                                        \
    XX(disk, LA)                                                               \
    XX(lookup_hashes, LA)                                                      \
    XX(lookup_hashes_resp, LA)                                                 \
    XX(kv_snapshot_resp, LA)                                                   \
    XX(ucx_attach, N)                                                          \
    XX(heartbeat, N)                                                           \
    XX(exist_lease_resp, LA)                                                   \
    XX(configs_resp, LA)                                                       \
    XX(challenge, N)                                                           \
    XX(challenge_resp, N)

enum pc_kind {
#define PC__ENUM(t, sig) PC_##t,
    PC_KINDS(PC__ENUM)
#undef PC__ENUM
    PC__COUNT,
    PC_NONE = -1
};

typedef union pc_msg {
#define PC__FIELD(t, sig) kvp_msg_##t t;
    PC_KINDS(PC__FIELD)
#undef PC__FIELD
} pc_msg;

typedef void (*pc_enc_fn)(kvp_buf *b, const void *m);
typedef int (*pc_dec_fn)(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                         kvp_arena *a, void *m);

#define PC__CALL_N(t) kvp_dec_##t(p, len, m)
#define PC__CALL_L(t) kvp_dec_##t(p, len, l, m)
#define PC__CALL_LA(t) kvp_dec_##t(p, len, l, a, m)
#define PC__WRAP(t, sig)                                                       \
    static PC_UNUSED void pc_enc_##t(kvp_buf *b, const void *m) { kvp_enc_##t(b, m); } \
    static PC_UNUSED int pc_dec_##t(const uint8_t *p, uint32_t len,            \
                                    const kvp_proto_limits *l, kvp_arena *a, void *m) \
    {                                                                          \
        (void)l;                                                               \
        (void)a;                                                               \
        return PC__CALL_##sig(t);                                              \
    }
PC_KINDS(PC__WRAP)
#undef PC__WRAP

static PC_UNUSED const struct pc_codec {
    const char *name;
    pc_enc_fn enc;
    pc_dec_fn dec;
} pc_codecs[PC__COUNT] = {
#define PC__ROW(t, sig) {#t, pc_enc_##t, pc_dec_##t},
    PC_KINDS(PC__ROW)
#undef PC__ROW
};

static PC_UNUSED const struct { int req, resp; } pc_op_kinds[KVP_OP__MAX] = {
    [0] = {PC_NONE, PC_NONE},
    [KVP_OP_HELLO] = {PC_hello, PC_hello_resp},
    [KVP_OP_MOUNT_SEGMENT] = {PC_mount, PC_results},
    [KVP_OP_UNMOUNT_SEGMENT] = {PC_ids, PC_results},
    [KVP_OP_HEARTBEAT] = {PC_heartbeat, PC_heartbeat_resp}, /* or an empty body: no report */
    [KVP_OP_PUT_START] = {PC_put_start, PC_put_start_resp},
    [KVP_OP_PUT_END] = {PC_put_end, PC_results},
    [KVP_OP_PUT_REVOKE] = {PC_keys, PC_results},
    [KVP_OP_GET] = {PC_keys, PC_get_resp},
    [KVP_OP_RELEASE] = {PC_put_end, PC_results}, /* key + lease id, the PUT_END layout */
    [KVP_OP_EXIST] = {PC_keys, PC_results},
    [KVP_OP_PREFIX] = {PC_keys, PC_prefix_resp},
    [KVP_OP_REMOVE] = {PC_remove, PC_results},
    [KVP_OP_REMOVE_ALL] = {PC_remove_all, PC_remove_all_resp},
    [KVP_OP_STATS] = {PC_NONE, PC_stats_resp},
    [KVP_OP_SEGMENT_INFO] = {PC_ids, PC_seg_info_resp},
    [KVP_OP_REMOVE_REGEX] = {PC_remove_regex, PC_remove_all_resp},
    [KVP_OP_SEG_FREED] = {PC_seg_freed, PC_NONE},     /* ONEWAY */
    [KVP_OP_REPLICA_BAD] = {PC_replica_bad, PC_NONE}, /* ONEWAY */
    [KVP_OP_SEG_FAILING] = {PC_ids, PC_NONE},         /* ONEWAY */
    [KVP_OP_DISK_CMD] = {PC_disk, PC_NONE},           /* ONEWAY */
    [KVP_OP_DISK_REPORT] = {PC_disk, PC_NONE},        /* ONEWAY */
    [KVP_OP_SEG_FREED_ACK] = {PC_ids, PC_NONE},       /* ONEWAY: {segment_id, seq} */
    [KVP_OP_TIERS] = {PC_keys, PC_results},
    [KVP_OP_LOOKUP_HASHES] = {PC_lookup_hashes, PC_lookup_hashes_resp},
    [KVP_OP_KV_SNAPSHOT] = {PC_keys, PC_kv_snapshot_resp},
    [KVP_OP_UCX_ATTACH] = {PC_NONE, PC_ucx_attach}, /* request: u64 segment id */
    [KVP_OP_EXIST_LEASE] = {PC_keys, PC_exist_lease_resp},
    [KVP_OP_CONFIGS] = {PC_NONE, PC_configs_resp},
    [KVP_OP_AUTH_CHALLENGE] = {PC_challenge, PC_challenge_resp},
};

/* ------------------------------------------------------------- samples */

#define PC_B(s) ((kvp_bytes){(const uint8_t *)(s), (uint32_t)(sizeof(s) - 1)})
/* 32 bytes (a nonce or a proof) starting with the one-character c */
#define PC_P32(c) ((kvp_bytes){(const uint8_t *)(c "0123456789abcdef0123456789abcde"), 32})

/* 4096 bytes of a non-trivial pattern: max keys and max strings. */
static PC_UNUSED const uint8_t *pc_big(void)
{
    static uint8_t big[4096];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 131 + 7);
    return big;
}

static PC_UNUSED int pc_sample(int kind, int v, pc_msg *m)
{
    static kvp_endpoint ep2[2], ep16[16];
    static kvp_seg_desc segs[2], seg_max;
    static uint64_t ids[] = {1, 0x8000000000000000ull, UINT64_MAX};
    static int32_t codes[] = {0, KVP_EOBJECT_NOT_FOUND, 1, INT32_MIN, INT32_MAX};
    static kvp_bytes keys3[3], keys_max[2];
    static uint64_t u64s[3] = {1, 4096, UINT64_MAX};
    static kvp_blkinfo blk2[2] = {{UINT64_MAX, UINT64_MAX, UINT32_MAX, UINT16_MAX, 255, 3},
                                  {0, 0, 0, 0, 0, 0}};
    static uint64_t hs[3] = {0, 0x8000000000000000ull, UINT64_MAX};
    static kvp_hchain chains[3] = {{0, 3, hs}, {31, 0, NULL}, {255, 1, hs + 2}};
    static kvp_hprefix hpre[2] = {{3, 0, 3}, {UINT32_MAX, UINT32_MAX, UINT32_MAX}};
    static kvp_snap_blk sblk[3] = {{0, 0, 1}, {UINT64_MAX, 31, 2}, {42, 255, 255}};
    static kvp_xl_ent xl[4] = {{KVP_XL_LEASED, 4096, 77}, {KVP_XL_ABSENT, 0, 0},
                               {KVP_XL_DISK, 2u << 20, 0}, {KVP_XL_LEASED, UINT64_MAX, UINT64_MAX}};
    static kvp_put_result pres[3];
    static kvp_get_result gres[4];
    static uint64_t counters[1024];
    static kvp_seg_stat sstats[2];
    static kvp_tenant_stat tstats[2];
    static kvp_config_stat cstats[3], cstat_max;
    static kvp_seg_info infos[3], info_max;
    static kvp_freed freed[3] = {{0, 1, 1, 0}, {7, 512, 0x100000002ull, KVP_FREED_PUBLISHED}, {UINT32_MAX, UINT32_MAX, UINT64_MAX, UINT32_MAX}};
    static kvp_bad_replica bad[2];
    static kvp_disk_ent dents[4];
    static kvp_msg_heartbeat hb_max;
    const uint8_t *big = pc_big();
    kvp_bytes str_max = {big, 1024}, key_max = {big, 4096};
    kvp_replica reps[3] = {{7, 0, 4096, 1, 5000, KVP_ACCESS_WRITE, 11}, {8, 1ull << 40, 123456789, 2, 0, KVP_ACCESS_READ, 0}, {UINT64_MAX, 4096, 1, UINT64_MAX, UINT64_MAX, KVP_ACCESS_READ, UINT64_MAX}};

    for (int i = 0; i < 2; i++)
        ep2[i] = (kvp_endpoint){i ? PC_B("shm") : PC_B("tcp"), i ? PC_B("/kvpool-7") : PC_B("10.0.0.1:7000")};
    for (int i = 0; i < 16; i++)
        ep16[i] = (kvp_endpoint){i == 15 ? str_max : PC_B("tcp"), i == 0 ? str_max : PC_B("")};
    segs[0] = (kvp_seg_desc){42, PC_B("host-a:7000"), 1ull << 30, 0, NULL, 0, 1, 0};
    segs[1] = (kvp_seg_desc){UINT64_MAX, PC_B(""), 4096, 2, ep2, 0, UINT32_MAX, 1ull << 40};
    seg_max = (kvp_seg_desc){9, str_max, UINT64_MAX, 16, ep16, 0, 7, UINT64_MAX};
    keys3[0] = PC_B("k");
    keys3[1] = PC_B("model/layer.7/\0bin\xff");
    keys3[2] = PC_B("another-key");
    keys_max[0] = key_max;
    keys_max[1] = PC_B("x");
    pres[0] = (kvp_put_result){0, 1, {reps[0]}};
    pres[1] = (kvp_put_result){KVP_EOBJECT_ALREADY_EXISTS, 0, {{0, 0, 0, 0, 0, 0, 0}}};
    pres[2] = (kvp_put_result){0, 3, {reps[0], reps[1], reps[2]}};
    gres[0] = (kvp_get_result){0, 4096, 0xdeadbeefcafef00dull, 77, 2, {reps[1], reps[2]}};
    gres[1] = (kvp_get_result){KVP_EOBJECT_NOT_FOUND, 0, 0, 0, 0, {{0, 0, 0, 0, 0, 0, 0}}};
    gres[2] = (kvp_get_result){0, 1, 0, UINT64_MAX, 3, {reps[0], reps[1], reps[2]}};
    gres[3] = (kvp_get_result){KVP_EOBJECT_LOADING, 2u << 20, 0xABCDull, 0, 0, {{0, 0, 0, 0, 0, 0, 0}}};
    for (int i = 0; i < 1024; i++)
        counters[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    sstats[0] = (kvp_seg_stat){42, PC_B("host-a:7000"), 1ull << 30, 8192, 2, 1ull << 29};
    sstats[1] = (kvp_seg_stat){UINT64_MAX, PC_B(""), 0, 0, 0, 0};
    tstats[0] = (kvp_tenant_stat){PC_B("alice"), 8, 8u << 20, 8u << 20, 4ull << 30, 100, 3, 1, 2};
    tstats[1] = (kvp_tenant_stat){str_max, UINT64_MAX, UINT64_MAX, 0, 0, 0, 0, UINT64_MAX, UINT32_MAX};
    cstats[0] = (kvp_config_stat){PC_B("default"), PC_B("Qwen3-0.6B"), PC_B("0123456789abcdef"), 1000,
                                  64u << 20};
    cstats[1] = (kvp_config_stat){PC_B("alice"), PC_B("p@m"), PC_B("0123456789abcdef0123456789abcdef"),
                                  UINT64_MAX, UINT64_MAX};
    cstats[2] = (kvp_config_stat){PC_B("alice"), PC_B(""), PC_B(""), 3, 3}; /* alice's other */
    cstat_max = (kvp_config_stat){str_max, str_max, PC_B("ffffffffffff"), 1, 0};
    infos[0] = (kvp_seg_info){0, segs[1]};
    infos[1] = (kvp_seg_info){KVP_ESEGMENT_NOT_FOUND, {0, {NULL, 0}, 0, 0, NULL, 0, 0, 0}};
    infos[2] = (kvp_seg_info){0, segs[0]};
    info_max = (kvp_seg_info){0, seg_max};
    bad[0] = (kvp_bad_replica){PC_B("k"), 42, 0x100000001ull};
    bad[1] = (kvp_bad_replica){key_max, UINT64_MAX, UINT64_MAX};
    dents[0] = (kvp_disk_ent){KVP_DISK_SPILL, 0, PC_B(""), PC_B("k"), 4096, 0xC0DE, 7, 0x100000001ull,
                              0};
    dents[1] = (kvp_disk_ent){KVP_DISK_LOADED, KVP_ECHECKSUM_MISMATCH, PC_B("tenant-1"), key_max,
                              UINT64_MAX, UINT64_MAX, UINT32_MAX, UINT64_MAX, 0};
    dents[2] = (kvp_disk_ent){KVP_DISK_GONE, INT32_MIN, str_max, PC_B("x"), 1, 2, 3, 4, UINT32_MAX};
    dents[3] = (kvp_disk_ent){KVP_DISK_FORGET, 0, PC_B("t"), PC_B("k"), 4096, 0xC0DE, 0, 0, 0x5EC0};
    hb_max.version = KVP_HB_REPORT_V1;
    hb_max.npaths = KVP_HB_MAX_PATHS;
    for (int i = 0; i < KVP_HB_MAX_PATHS; i++)
        hb_max.paths[i] = (kvp_path_tally){UINT64_MAX, UINT64_MAX - (uint64_t)i, (uint64_t)i,
                                           0x8000000000000000ull};

    memset(m, 0, sizeof *m);
    switch (kind * 4 + v) {
#define S(k, var) case PC_##k * 4 + (var):
    S(hello, 0) m->hello = (kvp_msg_hello){KVP_PROTO_VERSION, 1, PC_B(""), {PC_B(""), PC_B(""), PC_B(""), PC_B("")}}; return 0;
    S(hello, 1) m->hello = (kvp_msg_hello){KVP_PROTO_VERSION, 0x0123456789abcdefull, PC_B("node 10.0.0.1:7000"), {PC_P32("c"), PC_B(""), PC_P32("t"), PC_P32("s")}}; return 0;
    S(hello, 2) m->hello = (kvp_msg_hello){UINT32_MAX, UINT64_MAX, str_max, {PC_P32("1"), PC_P32("2"), PC_P32("3"), PC_P32("4")}}; return 0;
    S(challenge, 0) m->challenge = (kvp_msg_challenge){KVP_PROTO_VERSION, PC_P32("n"), 0, PC_B("")}; return 0;
    S(challenge, 1) m->challenge = (kvp_msg_challenge){UINT32_MAX, PC_P32("m"), KVP_AUTH_HAS_ALL, PC_B("kid-8byt")}; return 0;
    S(challenge_resp, 0) m->challenge_resp = (kvp_msg_challenge_resp){PC_P32("s"), 0, {PC_B(""), PC_B(""), PC_B("")}}; return 0;
    S(challenge_resp, 1) m->challenge_resp = (kvp_msg_challenge_resp){PC_P32("r"), UINT64_MAX, {PC_P32("a"), PC_P32("b"), PC_P32("c")}}; return 0;
    S(hello_resp, 0) return 0;
    S(hello_resp, 1) m->hello_resp = (kvp_msg_hello_resp){1, UINT64_MAX - 1, 64u << 20, 5000, UINT32_MAX, 123456789, "0123456789abcde", "9.12.0-rc1 (test build)"}; return 0;
    S(mount, 0) return 0;
    S(mount, 1) m->mount = (kvp_msg_mount){2, segs}; return 0;
    S(mount, 2) m->mount = (kvp_msg_mount){1, &seg_max}; return 0;
    S(ids, 0) return 0;
    S(ids, 1) m->ids = (kvp_msg_ids){3, ids}; return 0;
    S(heartbeat, 0) m->heartbeat = (kvp_msg_heartbeat){KVP_HB_REPORT_V1, 1, {{0, 0, 0, 0}}}; return 0;
    S(heartbeat, 1) m->heartbeat = (kvp_msg_heartbeat){KVP_HB_REPORT_V1, 3, {{4096, 1u << 20, 1, 256}, {123456789, 987654321, 7, 9}, {0, 0, 0, 0}}}; return 0;
    S(heartbeat, 2) m->heartbeat = hb_max; return 0;
    S(heartbeat_resp, 0) return 0;
    S(heartbeat_resp, 1) m->heartbeat_resp = (kvp_msg_heartbeat_resp){0xfeedfacecafebeefull, 3, UINT64_MAX}; return 0;
    S(results, 0) return 0;
    S(results, 1) m->results = (kvp_msg_results){5, codes}; return 0;
    S(keys, 0) return 0;
    S(keys, 1) m->keys = (kvp_msg_keys){PC_B("tenant-1"), 3, keys3}; return 0;
    S(keys, 2) m->keys = (kvp_msg_keys){str_max, 2, keys_max}; return 0;
    S(put_start, 0) return 0;
    S(put_start, 1) m->put_start = (kvp_msg_put_start){PC_B("t"), 2, KVP_PUT_PIN | KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1800000, PC_B("host-a:7000"), 3, keys3, u64s, NULL}; return 0;
    S(put_start, 2) m->put_start = (kvp_msg_put_start){str_max, UINT32_MAX, UINT32_MAX, UINT64_MAX, str_max, 2, keys_max, u64s, blk2}; return 0;
    S(lookup_hashes, 0) return 0;
    S(lookup_hashes, 1) m->lookup_hashes = (kvp_msg_lookup_hashes){PC_B("t"), 3, chains}; return 0;
    S(lookup_hashes, 2) m->lookup_hashes = (kvp_msg_lookup_hashes){str_max, 1, chains}; return 0;
    S(lookup_hashes_resp, 0) return 0;
    S(lookup_hashes_resp, 1) m->lookup_hashes_resp = (kvp_msg_lookup_hashes_resp){2, hpre}; return 0;
    S(ucx_attach, 0) m->ucx_attach = (kvp_msg_ucx_attach){4096, 1, PC_B("a"), PC_B("k")}; return 0;
    S(ucx_attach, 1) m->ucx_attach = (kvp_msg_ucx_attach){0x7f0000000000ull, 64ull << 30, PC_B("\x01\x02ucp worker address"), PC_B("\x00\xffpacked rkey")}; return 0;
    S(ucx_attach, 2) m->ucx_attach = (kvp_msg_ucx_attach){UINT64_MAX - 4096, 4096, str_max, str_max}; return 0;
    S(exist_lease_resp, 0) m->exist_lease_resp.lease_ttl_ms = 5000; return 0;
    S(exist_lease_resp, 1) m->exist_lease_resp = (kvp_msg_exist_lease_resp){5000, 4, xl}; return 0;
    S(exist_lease_resp, 2) m->exist_lease_resp = (kvp_msg_exist_lease_resp){UINT32_MAX, 1, xl + 3}; return 0;
    S(kv_snapshot_resp, 0) return 0;
    S(kv_snapshot_resp, 1) m->kv_snapshot_resp = (kvp_msg_kv_snapshot_resp){1733356800000000ull, 3, sblk}; return 0;
    S(kv_snapshot_resp, 2) m->kv_snapshot_resp = (kvp_msg_kv_snapshot_resp){UINT64_MAX, 1, sblk + 1}; return 0;
    S(put_start_resp, 0) return 0;
    S(put_start_resp, 1) m->put_start_resp = (kvp_msg_put_start_resp){3, pres}; return 0;
    S(put_end, 0) return 0;
    S(put_end, 1) m->put_end = (kvp_msg_put_end){PC_B("t"), 3, keys3, u64s}; return 0;
    S(put_end, 2) m->put_end = (kvp_msg_put_end){str_max, 2, keys_max, u64s}; return 0;
    S(get_resp, 0) m->get_resp.lease_ttl_ms = 5000; return 0;
    S(get_resp, 1) m->get_resp = (kvp_msg_get_resp){UINT32_MAX, 4, gres}; return 0;
    S(prefix_resp, 0) return 0;
    S(prefix_resp, 1) m->prefix_resp.count = 7; return 0;
    S(remove, 0) return 0;
    S(remove, 1) m->remove = (kvp_msg_remove){PC_B("tenant-1"), 1, 3, keys3}; return 0;
    S(remove, 2) m->remove = (kvp_msg_remove){str_max, 0, 2, keys_max}; return 0;
    S(remove_all, 0) return 0;
    S(remove_all, 1) m->remove_all = (kvp_msg_remove_all){PC_B("tenant-1"), 1}; return 0;
    S(remove_all, 2) m->remove_all = (kvp_msg_remove_all){str_max, 0}; return 0;
    S(remove_regex, 0) return 0;
    S(remove_regex, 1) m->remove_regex = (kvp_msg_remove_regex){PC_B("tenant-1"), 1, PC_B("^a/[0-9]+$")}; return 0;
    S(remove_regex, 2) m->remove_regex = (kvp_msg_remove_regex){str_max, 0, {pc_big(), KVP_REGEX_MAX}}; return 0;
    S(remove_all_resp, 0) return 0;
    S(remove_all_resp, 1) m->remove_all_resp.removed = UINT64_MAX; return 0;
    S(stats_resp, 0) return 0;
    S(stats_resp, 1) m->stats_resp = (kvp_msg_stats_resp){KVP_STAT__COUNT, counters, 2, sstats, 2, tstats}; return 0;
    S(stats_resp, 2) m->stats_resp = (kvp_msg_stats_resp){1024, counters, 0, NULL, 0, NULL}; return 0;
    S(configs_resp, 0) return 0;
    S(configs_resp, 1) m->configs_resp = (kvp_msg_configs_resp){3, cstats}; return 0;
    S(configs_resp, 2) m->configs_resp = (kvp_msg_configs_resp){1, &cstat_max}; return 0;
    S(seg_info_resp, 0) return 0;
    S(seg_info_resp, 1) m->seg_info_resp = (kvp_msg_seg_info_resp){3, infos}; return 0;
    S(seg_info_resp, 2) m->seg_info_resp = (kvp_msg_seg_info_resp){1, &info_max}; return 0;
    S(seg_freed, 0) return 0;
    S(seg_freed, 1) m->seg_freed = (kvp_msg_seg_freed){42, UINT64_MAX - 1, 3, freed}; return 0;
    S(replica_bad, 0) return 0;
    S(replica_bad, 1) m->replica_bad = (kvp_msg_replica_bad){PC_B("tenant-1"), 2, bad}; return 0;
    S(disk, 0) return 0;
    S(disk, 1) m->disk = (kvp_msg_disk){0xD15C, 4, dents}; return 0;
#undef S
    }
    return -1;
}

/* ------------------------------------------------------------ equality */

static PC_UNUSED int pc_beq(kvp_bytes a, kvp_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static PC_UNUSED int pc_keys_eq(uint32_t n, const kvp_bytes *a, const kvp_bytes *b)
{
    for (uint32_t i = 0; i < n; i++)
        if (!pc_beq(a[i], b[i]))
            return 0;
    return 1;
}

static PC_UNUSED int pc_u64_eq(uint32_t n, const uint64_t *a, const uint64_t *b)
{
    return n == 0 || memcmp(a, b, n * sizeof *a) == 0;
}

/* Replicas count only when the status is 0 (field by field: padding). */
static PC_UNUSED int pc_reps_eq(int32_t status, uint32_t na, const kvp_replica *a, uint32_t nb,
                                const kvp_replica *b)
{
    if (status != 0)
        return 1;
    if (na != nb || na > KVP_MAX_REPLICAS)
        return 0;
    for (uint32_t i = 0; i < na; i++)
        if (a[i].segment_id != b[i].segment_id || a[i].offset != b[i].offset ||
            a[i].length != b[i].length || a[i].generation != b[i].generation ||
            a[i].expires_ms != b[i].expires_ms || a[i].access != b[i].access ||
            a[i].tag != b[i].tag)
            return 0;
    return 1;
}

static PC_UNUSED int pc_seg_eq(const kvp_seg_desc *a, const kvp_seg_desc *b)
{
    if (a->id != b->id || !pc_beq(a->name, b->name) || a->capacity != b->capacity ||
        a->n_endpoints != b->n_endpoints)
        return 0;
    for (uint32_t i = 0; i < a->n_endpoints; i++)
        if (!pc_beq(a->endpoints[i].transport, b->endpoints[i].transport) ||
            !pc_beq(a->endpoints[i].addr, b->endpoints[i].addr))
            return 0;
    return 1;
}

static PC_UNUSED int pc_equal(int kind, const pc_msg *x, const pc_msg *y)
{
    switch (kind) {
    case PC_hello:
        return x->hello.version == y->hello.version && x->hello.client_id == y->hello.client_id &&
               pc_beq(x->hello.name, y->hello.name) &&
               pc_beq(x->hello.proof[0], y->hello.proof[0]) &&
               pc_beq(x->hello.proof[1], y->hello.proof[1]) &&
               pc_beq(x->hello.proof[2], y->hello.proof[2]) &&
               pc_beq(x->hello.proof[3], y->hello.proof[3]);
    case PC_challenge:
        return x->challenge.version == y->challenge.version &&
               pc_beq(x->challenge.nonce, y->challenge.nonce) &&
               x->challenge.has == y->challenge.has && pc_beq(x->challenge.kid, y->challenge.kid);
    case PC_challenge_resp:
        return pc_beq(x->challenge_resp.nonce, y->challenge_resp.nonce) &&
               x->challenge_resp.server_id == y->challenge_resp.server_id &&
               pc_beq(x->challenge_resp.proof[0], y->challenge_resp.proof[0]) &&
               pc_beq(x->challenge_resp.proof[1], y->challenge_resp.proof[1]) &&
               pc_beq(x->challenge_resp.proof[2], y->challenge_resp.proof[2]);
    case PC_hello_resp:
        return x->hello_resp.version == y->hello_resp.version &&
               x->hello_resp.master_id == y->hello_resp.master_id &&
               x->hello_resp.max_frame == y->hello_resp.max_frame &&
               x->hello_resp.lease_ttl_ms == y->hello_resp.lease_ttl_ms &&
               x->hello_resp.client_ttl_ms == y->hello_resp.client_ttl_ms &&
               x->hello_resp.now_ms == y->hello_resp.now_ms &&
               !memcmp(x->hello_resp.session, y->hello_resp.session, KVP_SESSION_LEN);
    case PC_mount:
        if (x->mount.n != y->mount.n)
            return 0;
        for (uint32_t i = 0; i < x->mount.n; i++)
            if (!pc_seg_eq(&x->mount.segs[i], &y->mount.segs[i]) ||
                x->mount.segs[i].secret != y->mount.segs[i].secret ||
                x->mount.segs[i].epoch != y->mount.segs[i].epoch ||
                x->mount.segs[i].disk_capacity != y->mount.segs[i].disk_capacity)
                return 0;
        return 1;
    case PC_ids:
        return x->ids.n == y->ids.n && pc_u64_eq(x->ids.n, x->ids.ids, y->ids.ids);
    case PC_heartbeat:
        return x->heartbeat.version == y->heartbeat.version &&
               x->heartbeat.npaths == y->heartbeat.npaths && x->heartbeat.npaths <= KVP_HB_MAX_PATHS &&
               (x->heartbeat.npaths == 0 ||
                memcmp(x->heartbeat.paths, y->heartbeat.paths,
                       x->heartbeat.npaths * sizeof(kvp_path_tally)) == 0);
    case PC_heartbeat_resp:
        return x->heartbeat_resp.master_id == y->heartbeat_resp.master_id &&
               x->heartbeat_resp.n_segments == y->heartbeat_resp.n_segments &&
               x->heartbeat_resp.now_ms == y->heartbeat_resp.now_ms;
    case PC_results:
        return x->results.n == y->results.n &&
               (x->results.n == 0 ||
                memcmp(x->results.codes, y->results.codes, x->results.n * sizeof(int32_t)) == 0);
    case PC_keys:
        return pc_beq(x->keys.tenant, y->keys.tenant) && x->keys.n == y->keys.n &&
               pc_keys_eq(x->keys.n, x->keys.keys, y->keys.keys);
    case PC_put_start: {
        const kvp_msg_put_start *a = &x->put_start, *b = &y->put_start;
        return pc_beq(a->tenant, b->tenant) && a->replicas == b->replicas && a->flags == b->flags &&
               a->soft_ttl_ms == b->soft_ttl_ms &&
               pc_beq(a->preferred, b->preferred) && a->n == b->n &&
               pc_keys_eq(a->n, a->keys, b->keys) && pc_u64_eq(a->n, a->sizes, b->sizes) &&
               !a->blocks == !b->blocks &&
               (!a->blocks || memcmp(a->blocks, b->blocks, a->n * sizeof *a->blocks) == 0);
    }
    case PC_lookup_hashes:
        if (!pc_beq(x->lookup_hashes.tenant, y->lookup_hashes.tenant) ||
            x->lookup_hashes.n != y->lookup_hashes.n)
            return 0;
        for (uint32_t i = 0; i < x->lookup_hashes.n; i++) {
            const kvp_hchain *a = &x->lookup_hashes.chains[i], *b = &y->lookup_hashes.chains[i];
            if (a->group != b->group || a->n != b->n || !pc_u64_eq(a->n, a->hashes, b->hashes))
                return 0;
        }
        return 1;
    case PC_lookup_hashes_resp:
        return x->lookup_hashes_resp.n == y->lookup_hashes_resp.n &&
               (x->lookup_hashes_resp.n == 0 ||
                memcmp(x->lookup_hashes_resp.prefix, y->lookup_hashes_resp.prefix,
                       x->lookup_hashes_resp.n * sizeof(kvp_hprefix)) == 0);
    case PC_ucx_attach:
        return x->ucx_attach.base == y->ucx_attach.base &&
               x->ucx_attach.size == y->ucx_attach.size &&
               pc_beq(x->ucx_attach.addr, y->ucx_attach.addr) &&
               pc_beq(x->ucx_attach.rkey, y->ucx_attach.rkey);
    case PC_kv_snapshot_resp:
        if (x->kv_snapshot_resp.seq != y->kv_snapshot_resp.seq ||
            x->kv_snapshot_resp.n != y->kv_snapshot_resp.n)
            return 0;
        for (uint32_t i = 0; i < x->kv_snapshot_resp.n; i++) {
            const kvp_snap_blk *a = &x->kv_snapshot_resp.blocks[i];
            const kvp_snap_blk *b = &y->kv_snapshot_resp.blocks[i];
            if (a->hash != b->hash || a->group != b->group || a->tier != b->tier)
                return 0;
        }
        return 1;
    case PC_put_start_resp:
        if (x->put_start_resp.n != y->put_start_resp.n)
            return 0;
        for (uint32_t i = 0; i < x->put_start_resp.n; i++) {
            const kvp_put_result *a = &x->put_start_resp.results[i], *b = &y->put_start_resp.results[i];
            if (a->status != b->status ||
                !pc_reps_eq(a->status, a->n_replicas, a->replicas, b->n_replicas, b->replicas))
                return 0;
        }
        return 1;
    case PC_put_end: {
        const kvp_msg_put_end *a = &x->put_end, *b = &y->put_end;
        return pc_beq(a->tenant, b->tenant) && a->n == b->n && pc_keys_eq(a->n, a->keys, b->keys) &&
               pc_u64_eq(a->n, a->checksums, b->checksums);
    }
    case PC_get_resp:
        if (x->get_resp.lease_ttl_ms != y->get_resp.lease_ttl_ms || x->get_resp.n != y->get_resp.n)
            return 0;
        for (uint32_t i = 0; i < x->get_resp.n; i++) {
            const kvp_get_result *a = &x->get_resp.results[i], *b = &y->get_resp.results[i];
            if (a->status != b->status ||
                (a->status == 0 && (a->size != b->size || a->checksum != b->checksum ||
                                    a->lease_id != b->lease_id)) ||
                (a->status == KVP_EOBJECT_LOADING &&
                 (a->size != b->size || a->checksum != b->checksum)) ||
                !pc_reps_eq(a->status, a->n_replicas, a->replicas, b->n_replicas, b->replicas))
                return 0;
        }
        return 1;
    case PC_prefix_resp:
        return x->prefix_resp.count == y->prefix_resp.count;
    case PC_exist_lease_resp:
        if (x->exist_lease_resp.lease_ttl_ms != y->exist_lease_resp.lease_ttl_ms ||
            x->exist_lease_resp.n != y->exist_lease_resp.n)
            return 0;
        for (uint32_t i = 0; i < x->exist_lease_resp.n; i++) {
            const kvp_xl_ent *a = &x->exist_lease_resp.ents[i], *b = &y->exist_lease_resp.ents[i];
            if (a->state != b->state || a->size != b->size || a->lease_id != b->lease_id)
                return 0;
        }
        return 1;
    case PC_remove:
        return pc_beq(x->remove.tenant, y->remove.tenant) && x->remove.force == y->remove.force &&
               x->remove.n == y->remove.n && pc_keys_eq(x->remove.n, x->remove.keys, y->remove.keys);
    case PC_remove_all:
        return pc_beq(x->remove_all.tenant, y->remove_all.tenant) &&
               x->remove_all.force == y->remove_all.force;
    case PC_remove_all_resp:
        return x->remove_all_resp.removed == y->remove_all_resp.removed;
    case PC_seg_freed: {
        const kvp_msg_seg_freed *a = &x->seg_freed, *b = &y->seg_freed;
        if (a->segment_id != b->segment_id || a->seq != b->seq || a->n != b->n)
            return 0;
        for (uint32_t i = 0; i < a->n; i++)
            if (a->freed[i].page != b->freed[i].page || a->freed[i].pages != b->freed[i].pages ||
                a->freed[i].generation != b->freed[i].generation ||
                a->freed[i].flags != b->freed[i].flags)
                return 0;
        return 1;
    }
    case PC_replica_bad: {
        const kvp_msg_replica_bad *a = &x->replica_bad, *b = &y->replica_bad;
        if (!pc_beq(a->tenant, b->tenant) || a->n != b->n)
            return 0;
        for (uint32_t i = 0; i < a->n; i++)
            if (!pc_beq(a->bad[i].key, b->bad[i].key) ||
                a->bad[i].segment_id != b->bad[i].segment_id ||
                a->bad[i].generation != b->bad[i].generation)
                return 0;
        return 1;
    }
    case PC_disk: {
        const kvp_msg_disk *a = &x->disk, *b = &y->disk;
        if (a->segment_id != b->segment_id || a->n != b->n)
            return 0;
        for (uint32_t i = 0; i < a->n; i++) {
            const kvp_disk_ent *e = &a->e[i], *f = &b->e[i];
            if (e->what != f->what || e->status != f->status || !pc_beq(e->tenant, f->tenant) ||
                !pc_beq(e->key, f->key) || e->size != f->size || e->checksum != f->checksum ||
                e->page != f->page || e->generation != f->generation || e->rec != f->rec)
                return 0;
        }
        return 1;
    }
    case PC_remove_regex:
        return pc_beq(x->remove_regex.tenant, y->remove_regex.tenant) &&
               x->remove_regex.force == y->remove_regex.force &&
               pc_beq(x->remove_regex.pattern, y->remove_regex.pattern);
    case PC_stats_resp: {
        const kvp_msg_stats_resp *a = &x->stats_resp, *b = &y->stats_resp;
        if (a->n_counters != b->n_counters || !pc_u64_eq(a->n_counters, a->counters, b->counters) ||
            a->n_segs != b->n_segs)
            return 0;
        for (uint32_t i = 0; i < a->n_segs; i++) {
            const kvp_seg_stat *s = &a->segs[i], *t = &b->segs[i];
            if (s->id != t->id || !pc_beq(s->name, t->name) || s->capacity != t->capacity ||
                s->used != t->used || s->objects != t->objects || s->largest_free != t->largest_free)
                return 0;
        }
        if (a->n_tenants != b->n_tenants)
            return 0;
        for (uint32_t i = 0; i < a->n_tenants; i++) {
            const kvp_tenant_stat *s = &a->tenants[i], *t = &b->tenants[i];
            if (!pc_beq(s->name, t->name) || s->objects != t->objects || s->bytes != t->bytes ||
                s->pool_bytes != t->pool_bytes || s->max_bytes != t->max_bytes ||
                s->max_objects != t->max_objects || s->evictions != t->evictions ||
                s->refused != t->refused || s->share != t->share)
                return 0;
        }
        return 1;
    }
    case PC_configs_resp:
        if (x->configs_resp.n != y->configs_resp.n)
            return 0;
        for (uint32_t i = 0; i < x->configs_resp.n; i++) {
            const kvp_config_stat *a = &x->configs_resp.rows[i], *b = &y->configs_resp.rows[i];
            if (!pc_beq(a->tenant, b->tenant) || !pc_beq(a->name, b->name) || !pc_beq(a->fp, b->fp) ||
                a->objects != b->objects || a->bytes != b->bytes)
                return 0;
        }
        return 1;
    case PC_seg_info_resp:
        if (x->seg_info_resp.n != y->seg_info_resp.n)
            return 0;
        for (uint32_t i = 0; i < x->seg_info_resp.n; i++) {
            const kvp_seg_info *a = &x->seg_info_resp.infos[i], *b = &y->seg_info_resp.infos[i];
            if (a->status != b->status || (a->status == 0 && !pc_seg_eq(&a->desc, &b->desc)))
                return 0;
        }
        return 1;
    }
    return 0;
}

#endif
