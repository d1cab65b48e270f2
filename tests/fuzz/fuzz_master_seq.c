/*
 * fuzz_master_seq.c -- libFuzzer target: a protocol-aware, stateful fuzzer
 * of the master core (kvp_master_handle driven in-process).
 *
 * The input is a program, read by a deterministic interpreter (prog_*):
 * byte 0 picks the configuration (cluster / node / tenant credentials,
 * max_objects, frame size, object size limit), then each step picks an
 * opcode, a session and structured arguments. Arguments come from small
 * pools and from what earlier answers taught the interpreter, so short
 * programs reach deep states:
 *   sessions  NSESS connections; HELLO with or without each credential,
 *             a client id of its own or another session's (joining it with
 *             the session secret that session was given, or a wrong one)
 *   segments  a fixed table of segment ids (each with its name, capacity,
 *             secret and SSD tier), mounted by whichever session asks
 *   keys      KEYS fixed keys x TENANTS tenants (and fuzzed ones)
 *   learned   replica descriptors (PUT_START, GET), lease ids (GET,
 *             EXIST_LEASE's holds), and
 *             the DISK_CMDs the master pushes to node sessions, which
 *             DISK_REPORT steps answer (SPILLED, LOADED, HAVE, GONE)
 *   clock     every step advances it a little, ADVANCE steps a lot
 *             (leases, put timeouts, disk timeouts, client TTLs fire)
 *   faults    FAIL steps make the master's Nth next allocation fail
 *   blocks    puts that name engine blocks (small pools of hashes, parts,
 *             groups, some invalid), LOOKUP_HASHES and KV_SNAPSHOT steps;
 *             configurations with KV events take every turn's batches
 *             (each encoded in vLLM's format, seqs per topic increasing)
 *
 * After every step: kvp_master_tick, kvp_master_push_freed (the pushed
 * SEG_FREED / DISK_CMD frames are decoded), kvp_master_check must be 0,
 * and the answer must be well formed: exactly one response frame echoing
 * op and req_id (none for a ONEWAY request that succeeded), a body no
 * larger than max_frame that the proto decoder of that answer accepts,
 * one result per key, descriptors inside their segment with a valid tag
 * for the operation. A session bound to a tenant (or one naming a tenant
 * that has a credential, without it) must be refused.
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"
#include "master/kvev.h"
#include "master/master.h"
#include "proto/proto.h"

#define NSESS 6
#define NSEG 5      /* segment ids 1..NSEG */
#define KEYS 12
#define TENANTS 5   /* "", "default", "ta", "tb", "tc" */
#define MAX_STEPS 200
#define NREP 32     /* descriptors remembered */
#define NLEASE 16
#define NCMD 32     /* DISK_CMD entries remembered */
#define KCOPY 64

#define FAILIF(c)                                                                  \
    do {                                                                           \
        if (c) {                                                                   \
            fprintf(stderr, "fuzz_master_seq: %s (line %d)\n", #c, __LINE__);      \
            abort();                                                               \
        }                                                                          \
    } while (0)

/* ------------------------------------------------------------ the input */

typedef struct prog {
    const uint8_t *p;
    size_t n, i;
} prog;

static uint8_t u8(prog *g) { return g->i < g->n ? g->p[g->i++] : 0; }
static uint16_t u16(prog *g) { return (uint16_t)(u8(g) | u8(g) << 8); }
static uint32_t u32(prog *g) { return u16(g) | (uint32_t)u16(g) << 16; }
static uint64_t u64(prog *g) { return u32(g) | (uint64_t)u32(g) << 32; }
/* up to max bytes of the input itself (stable for the whole run) */
static kvp_bytes raw(prog *g, uint32_t max)
{
    uint32_t n = u8(g) % (max + 1);
    if (n > g->n - g->i)
        n = (uint32_t)(g->n - g->i);
    kvp_bytes b = {g->p + g->i, n};
    g->i += n;
    return b;
}

/* ------------------------------------------------------------ the pools */

static const char *const tenant_names[TENANTS] = {"", "default", "ta", "tb", "tc"};
static char key_names[KEYS][8];
static char tenant_file[256];

#define CLUSTER_TOKEN "cluster-secret"
#define NODE_TOKEN "node-secret"

static kvp_bytes B(const char *s) { return (kvp_bytes){(const uint8_t *)s, (uint32_t)strlen(s)}; }

static uint64_t seg_secret(uint64_t id) { return id * 0x9E3779B97F4A7C15ull ^ 0x5EC2E7; }
static uint64_t seg_cap(uint64_t id) { return (uint64_t)(8u << (id % 4)) * 4096; }
static uint64_t seg_disk(uint64_t id) { return id % 2 ? 1ull << 30 : 0; }

typedef struct sess {
    kvp_msess s;
    int open;      /* kvp_master_sess_open'ed */
    int hello;     /* a HELLO succeeded */
    uint64_t cid;
    int tcred;     /* tenant credential presented: -1 none, 0 "ta", 1 "tb" */
    kvp_buf push;  /* what push_freed sent this session */
} sess;

typedef struct secret_of {
    uint64_t cid;
    uint8_t s[KVP_SESSION_LEN];
} secret_of;

typedef struct rep_seen {
    uint8_t tenant, key;
    uint64_t seg, offset, gen;
} rep_seen;

typedef struct lease_seen {
    uint8_t tenant, key;
    uint64_t id;
} lease_seen;

typedef struct cmd_seen {
    uint64_t seg;
    kvp_disk_ent e;
    char tenant[KCOPY], key[KCOPY];
} cmd_seen;

typedef struct world {
    kvp_config cfg;
    kvp_master *m;
    uint64_t now, req;
    int tcreds;           /* the tenant credential table is loaded */
    sess ss[NSESS];
    secret_of sec[NSESS * 2];
    unsigned nsec;
    rep_seen reps[NREP];
    unsigned nreps;
    lease_seen leases[NLEASE];
    unsigned nleases;
    cmd_seen cmds[NCMD];
    unsigned ncmds;
    /* the last PUT_START: PUT_END / PUT_REVOKE can name the same keys */
    uint8_t last_t, last_k[4], last_n;
    uint32_t fail;        /* a FAIL step: the next request's nth allocation fails */
    struct {              /* KV event streams seen: topic, last seq */
        char topic[32];
        uint64_t seq;
    } streams[8];
    unsigned nstreams;
} world;

/* Buffers live across runs (allocation once: faster, and fault injection
 * hits the master rather than the harness). */
static kvp_arena arena, ra;
static kvp_buf out, body;
static kvp_proto_limits lim;

/* ------------------------------------------------------- tenant oracle */

/* The tenant t means (empty = "default"). */
static const char *tname(kvp_bytes t, char *buf)
{
    if (t.len == 0)
        return "default";
    uint32_t n = t.len < 255 ? t.len : 255;
    memcpy(buf, t.p, n);
    buf[n] = 0;
    if (n != t.len || memchr(t.p, 0, t.len))
        buf[0] = 1, buf[1] = 0; /* not a credential tenant in any case */
    return buf;
}

/* Must a request of session s naming tenant t be refused (master.c
 * tenant_allowed, docs/SECURITY.md)? */
static int must_refuse(const world *w, const sess *s, kvp_bytes t)
{
    if (!w->tcreds)
        return 0;
    char buf[256];
    const char *n = tname(t, buf);
    if (s->tcred >= 0)
        return strcmp(n, s->tcred == 0 ? "ta" : "tb") != 0;
    return !strcmp(n, "ta") || !strcmp(n, "tb");
}

/* -------------------------------------------------- answer well-formedness */

static int known_status(int32_t st)
{
    switch (st) {
#define KVP__ST_CASE(name, num, msg) case num:
        KVP_ERRNO_MAP(KVP__ST_CASE)
#undef KVP__ST_CASE
        return 1;
    }
    return 0;
}

/* A descriptor handed out for segment r->segment_id must be inside it,
 * tagged with its secret, for the operation asked. */
static void check_replica(const kvp_replica *r, uint32_t access, uint64_t size)
{
    FAILIF(r->access != access);
    FAILIF(r->length != size);
    FAILIF(r->offset % 4096 != 0);
    uint64_t sec = seg_secret(r->segment_id);
    FAILIF(kvp_replica_tag(sec, r) != r->tag && kvp_replica_tag(sec ^ 1, r) != r->tag);
    /* mounts with a smaller capacity variant exist; never a larger one */
    FAILIF(r->offset + r->length > seg_cap(r->segment_id) ||
           r->offset + r->length < r->offset);
}

static void remember_rep(world *w, uint8_t t, uint8_t k, const kvp_replica *r)
{
    rep_seen *x = &w->reps[w->nreps++ % NREP];
    *x = (rep_seen){t, k, r->segment_id, r->offset, r->generation};
}

/* What a request carried, for checking its answer. */
typedef struct call {
    uint16_t op;
    uint8_t flags;
    uint32_t n;             /* keys / ids / segments in the request */
    int refuse;             /* the tenant oracle says: must be refused */
    uint8_t tenant;         /* pool indices of its keys (255 = fuzzed) */
    uint8_t keys[8];
    const uint64_t *sizes;  /* PUT_START */
    uint32_t replicas;
} call;

static void learn_hello(world *w, sess *s, const kvp_msg_hello_resp *r)
{
    FAILIF(r->version != KVP_PROTO_VERSION || r->max_frame != w->cfg.max_frame);
    for (unsigned i = 0; i < w->nsec; i++)
        if (w->sec[i].cid == s->cid) {
            memcpy(w->sec[i].s, r->session, KVP_SESSION_LEN);
            return;
        }
    secret_of *x = &w->sec[w->nsec < NSESS * 2 ? w->nsec++ : s->cid % (NSESS * 2)];
    x->cid = s->cid;
    memcpy(x->s, r->session, KVP_SESSION_LEN);
}

/* The last AUTH_CHALLENGE answer (st_hello proves over it). */
static struct {
    uint8_t nonce[KVP_AUTH_NONCE];
    uint64_t server_id;
    uint8_t pbuf[3][KVP_AUTH_PROOF];
    kvp_bytes proof[3];
} chal;
static int chal_ok;

/* Decodes the answer with the decoder of that answer and checks it. */
static void check_body(world *w, sess *s, const call *c, const uint8_t *b, uint32_t len)
{
    kvp_arena_reset(&ra);
    switch (c->op) {
    case KVP_OP_AUTH_CHALLENGE: {
        kvp_msg_challenge_resp r;
        FAILIF(kvp_dec_challenge_resp(b, len, &r) != 0);
        FAILIF(r.server_id != kvp_master_id(w->m));
        memcpy(chal.nonce, r.nonce.p, KVP_AUTH_NONCE);
        chal.server_id = r.server_id;
        for (int i = 0; i < 3; i++) {
            memcpy(chal.pbuf[i], r.proof[i].p ? r.proof[i].p : chal.pbuf[i], r.proof[i].len);
            chal.proof[i] = (kvp_bytes){chal.pbuf[i], r.proof[i].len};
        }
        chal_ok = 1;
        break;
    }
    case KVP_OP_HELLO: {
        kvp_msg_hello_resp r;
        FAILIF(kvp_dec_hello_resp(b, len, &r) != 0);
        learn_hello(w, s, &r);
        s->hello = 1;
        break;
    }
    case KVP_OP_MOUNT_SEGMENT: case KVP_OP_UNMOUNT_SEGMENT: case KVP_OP_PUT_END:
    case KVP_OP_PUT_REVOKE: case KVP_OP_RELEASE: case KVP_OP_REMOVE: case KVP_OP_EXIST:
    case KVP_OP_TIERS: {
        kvp_msg_results r;
        FAILIF(kvp_dec_results(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n != c->n);
        for (uint32_t i = 0; i < r.n; i++) {
            if (c->op == KVP_OP_EXIST)
                FAILIF(r.codes[i] != 0 && r.codes[i] != 1);
            else if (c->op == KVP_OP_TIERS)
                FAILIF(r.codes[i] & ~(KVP_TIER_DRAM | KVP_TIER_DISK));
            else
                FAILIF(r.codes[i] > 0 || !known_status(r.codes[i]));
        }
        break;
    }
    case KVP_OP_HEARTBEAT: {
        kvp_msg_heartbeat_resp r;
        FAILIF(kvp_dec_heartbeat_resp(b, len, &r) != 0);
        FAILIF(r.master_id != kvp_master_id(w->m) || r.now_ms != w->now);
        break;
    }
    case KVP_OP_PUT_START: {
        kvp_msg_put_start_resp r;
        FAILIF(kvp_dec_put_start_resp(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n != c->n);
        for (uint32_t i = 0; i < r.n; i++) {
            const kvp_put_result *x = &r.results[i];
            FAILIF(x->status > 0 || !known_status(x->status));
            if (x->status != 0) {
                FAILIF(x->n_replicas != 0);
                continue;
            }
            FAILIF(x->n_replicas < 1 || x->n_replicas > c->replicas);
            for (uint32_t j = 0; j < x->n_replicas; j++) {
                check_replica(&x->replicas[j], KVP_ACCESS_WRITE, c->sizes[i]);
                for (uint32_t k = 0; k < j; k++) /* replicas on distinct segments */
                    FAILIF(x->replicas[k].segment_id == x->replicas[j].segment_id);
                if (i < 8)
                    remember_rep(w, c->tenant, c->keys[i], &x->replicas[j]);
            }
        }
        break;
    }
    case KVP_OP_GET: {
        kvp_msg_get_resp r;
        FAILIF(kvp_dec_get_resp(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n != c->n || r.lease_ttl_ms != w->cfg.lease_ttl_ms);
        for (uint32_t i = 0; i < r.n; i++) {
            const kvp_get_result *x = &r.results[i];
            FAILIF(x->status > 0 || !known_status(x->status));
            if (x->status != 0) {
                FAILIF(x->n_replicas != 0);
                continue;
            }
            FAILIF(x->n_replicas < 1 || x->n_replicas > KVP_MAX_REPLICAS || x->size == 0);
            for (uint32_t j = 0; j < x->n_replicas; j++) {
                check_replica(&x->replicas[j], KVP_ACCESS_READ, x->size);
                if (i < 8)
                    remember_rep(w, c->tenant, c->keys[i], &x->replicas[j]);
            }
            if (i < 8)
                w->leases[w->nleases++ % NLEASE] = (lease_seen){c->tenant, c->keys[i], x->lease_id};
        }
        break;
    }
    case KVP_OP_EXIST_LEASE: {
        kvp_msg_exist_lease_resp r;
        FAILIF(kvp_dec_exist_lease_resp(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n != c->n || r.lease_ttl_ms != w->cfg.lease_ttl_ms);
        for (uint32_t i = 0; i < r.n; i++)
            if (r.ents[i].state == KVP_XL_LEASED && i < 8) /* its holds: RELEASE steps */
                w->leases[w->nleases++ % NLEASE] =
                    (lease_seen){c->tenant, c->keys[i], r.ents[i].lease_id};
        break;
    }
    case KVP_OP_PREFIX: {
        kvp_msg_prefix_resp r;
        FAILIF(kvp_dec_prefix_resp(b, len, &r) != 0);
        FAILIF(r.count > c->n);
        break;
    }
    case KVP_OP_REMOVE_ALL: case KVP_OP_REMOVE_REGEX: {
        kvp_msg_remove_all_resp r;
        FAILIF(kvp_dec_remove_all_resp(b, len, &r) != 0);
        break;
    }
    case KVP_OP_STATS: {
        kvp_msg_stats_resp r;
        FAILIF(kvp_dec_stats_resp(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n_counters != KVP_STAT__COUNT || r.n_segs > w->cfg.max_segments);
        break;
    }
    case KVP_OP_SEGMENT_INFO: {
        kvp_msg_seg_info_resp r;
        FAILIF(kvp_dec_seg_info_resp(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n != c->n);
        break;
    }
    case KVP_OP_LOOKUP_HASHES: {
        kvp_msg_lookup_hashes_resp r;
        FAILIF(kvp_dec_lookup_hashes_resp(b, len, &lim, &ra, &r) != 0);
        FAILIF(r.n != c->n);
        for (uint32_t i = 0; i < r.n; i++)
            FAILIF(r.prefix[i].dram > r.prefix[i].any || r.prefix[i].disk > r.prefix[i].any ||
                   r.prefix[i].any > 4);
        break;
    }
    case KVP_OP_KV_SNAPSHOT: {
        kvp_msg_kv_snapshot_resp r;
        FAILIF(kvp_dec_kv_snapshot_resp(b, len, &lim, &ra, &r) != 0);
        for (uint32_t i = 0; i < r.n; i++)
            FAILIF(r.blocks[i].tier != KVP_TIER_DRAM && r.blocks[i].tier != KVP_TIER_DISK);
        break;
    }
    default: /* REPLICA_BAD, SEG_FAILING, DISK_REPORT sent as requests */
        FAILIF(len != 0);
        break;
    }
}

/* kvp_master_jobs's callback: a deferred answer lands in the step's output */
static kvp_buf *job_out(kvp_msess *s, void *ctx)
{
    (void)s;
    return ctx;
}

static int trace;       /* $FUZZ_SEQ_TRACE set */
static int last_status; /* the last answer's status (trace) */

/* Sends body as op on session s, checks the answer. */
static void send(world *w, sess *s, const call *c)
{
    if (body.err || body.len > w->cfg.max_frame)
        return; /* the service would not take such a frame */
    kvp_frame_hdr h = {KVP_PROTO_VERSION, c->flags, c->op, ++w->req, (uint32_t)body.len, 0};
    kvp_arena_reset(&arena);
    kvp_buf_reset(&out);
    kvp_mem_fail_nth(w->fail, 0); /* a FAIL step's fault hits this request only */
    int rc = kvp_master_handle(w->m, &s->s, &h, body.data, &arena, &out, w->now);
    while (rc == 0 && s->s.deferred) /* a whole-index job: its next turns */
        kvp_master_jobs(w->m, w->now, job_out, &out);
    kvp_mem_fail_nth(0, 0);
    w->fail = 0;
    if (rc != 0) { /* the answer did not fit: the service closes */
        FAILIF(rc != KVP_ENOMEM && rc != KVP_ETOO_LARGE);
        s->s.close_after = 1;
        return;
    }
    if (out.len == 0) {
        FAILIF(!(c->flags & KVP_FLAG_ONEWAY));
        return;
    }
    kvp_frame_hdr rh;
    const uint8_t *rb;
    FAILIF(kvp_frame_next(out.data, out.len, 1u << 30, &rh, &rb) != 1);
    FAILIF(KVP_FRAME_HDR + rh.body_len != out.len);
    FAILIF(rh.req_id != h.req_id || rh.op != h.op || !(rh.flags & KVP_FLAG_RESPONSE));
    FAILIF(rh.body_len > w->cfg.max_frame); /* a client would refuse the frame */
    FAILIF(rh.status > 0 || !known_status(rh.status));
    last_status = rh.status;
    if (rh.status != 0)
        return;
    FAILIF(c->refuse);
    if (c->flags & KVP_FLAG_RESPONSE)
        abort(); /* a "response" sent to the master is refused */
    check_body(w, s, c, rb, rh.body_len);
}

/* ----------------------------------------------------- push_freed's sink */

static kvp_buf *sink(kvp_msess *s, void *ctx)
{
    world *w = ctx;
    for (int i = 0; i < NSESS; i++)
        if (&w->ss[i].s == s) {
            FAILIF(!w->ss[i].open);
            return &w->ss[i].push;
        }
    abort(); /* a session the master should not know */
}

static void remember_cmd(world *w, uint64_t seg, const kvp_disk_ent *e)
{
    if (e->tenant.len >= KCOPY || e->key.len >= KCOPY)
        return;
    cmd_seen *x = &w->cmds[w->ncmds++ % NCMD];
    x->seg = seg;
    x->e = *e;
    memcpy(x->tenant, e->tenant.p, e->tenant.len);
    memcpy(x->key, e->key.p, e->key.len);
    x->e.tenant.p = (const uint8_t *)x->tenant;
    x->e.key.p = (const uint8_t *)x->key;
}

/* Every pushed frame is a ONEWAY SEG_FREED or DISK_CMD that decodes. */
static void drain_pushes(world *w)
{
    for (int i = 0; i < NSESS; i++) {
        kvp_buf *p = &w->ss[i].push;
        size_t at = 0;
        while (at < p->len) {
            kvp_frame_hdr h;
            const uint8_t *b;
            FAILIF(kvp_frame_next(p->data + at, p->len - at, 1u << 30, &h, &b) != 1);
            FAILIF(!(h.flags & KVP_FLAG_ONEWAY) || h.body_len > (2u << 20));
            kvp_arena_reset(&ra);
            if (h.op == KVP_OP_SEG_FREED) {
                kvp_msg_seg_freed f;
                FAILIF(kvp_dec_seg_freed(b, h.body_len, &lim, &ra, &f) != 0);
            } else {
                FAILIF(h.op != KVP_OP_DISK_CMD);
                kvp_msg_disk d;
                FAILIF(kvp_dec_disk(b, h.body_len, &lim, &ra, &d) != 0);
                for (uint32_t k = 0; k < d.n; k++) {
                    FAILIF(d.e[k].what < KVP_DISK_SPILL || d.e[k].what > KVP_DISK_FORGET);
                    if (d.e[k].what != KVP_DISK_FORGET)
                        remember_cmd(w, d.segment_id, &d.e[k]);
                }
            }
            at += KVP_FRAME_HDR + h.body_len;
        }
        kvp_buf_reset(p);
    }
}

/* ----------------------------------------------------------- arguments */

static sess *pick_sess(world *w, prog *g) { return &w->ss[u8(g) % NSESS]; }

/* A tenant: pool index (or 255 with *fz set to fuzzed bytes). */
static kvp_bytes pick_tenant(prog *g, uint8_t *idx)
{
    uint8_t v = u8(g);
    if (v < 250) {
        *idx = v % TENANTS;
        return B(tenant_names[*idx]);
    }
    *idx = 255;
    return raw(g, 300);
}

static kvp_bytes pick_key(world *w, prog *g, uint8_t *idx)
{
    (void)w;
    uint8_t v = u8(g);
    if (v < 240) {
        *idx = v % KEYS;
        return B(key_names[*idx]);
    }
    *idx = 255;
    if (v == 255) { /* one byte past max_key */
        static uint8_t big[65537];
        return (kvp_bytes){big, (uint32_t)w->cfg.max_key + 1};
    }
    return raw(g, 40);
}

static uint64_t pick_size(prog *g)
{
    static const uint64_t sizes[] = {1, 4096, 4097, 3 * 4096, 8 * 4096, 20 * 4096, 64 * 4096,
                                     100, 0, 1ull << 40};
    uint8_t v = u8(g);
    return v < 250 ? sizes[v % 8] : sizes[8 + (v & 1)];
}

static uint64_t pick_checksum(prog *g)
{
    uint8_t v = u8(g);
    return v < 250 ? (uint64_t)(v % 3 + 1) : u64(g);
}

static uint32_t pick_n(prog *g, uint32_t max)
{
    uint8_t v = u8(g);
    return v < 250 ? 1 + v % max : (uint32_t)(v - 250); /* 0..5 rarely */
}

/* ---------------------------------------------------------------- steps */

enum {
    S_HELLO, S_MOUNT, S_UNMOUNT, S_HEARTBEAT, S_PUT_START, S_PUT_END, S_PUT_REVOKE, S_GET,
    S_RELEASE, S_EXIST, S_REMOVE, S_REMOVE_ALL, S_REMOVE_REGEX, S_STATS, S_SEG_INFO,
    S_REPLICA_BAD, S_SEG_FAILING, S_DISK_REPORT, S_ADVANCE, S_CLOSE, S_RAW, S_FAIL, S_PUT,
    S_LOOKUP, S_SNAPSHOT, S__COUNT
};

/* LOOKUP_HASHES of one or two chains from the puts' pool of hashes. */
static void st_lookup(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_LOOKUP_HASHES};
    kvp_bytes tenant = pick_tenant(g, &c.tenant);
    uint64_t hs[2][4];
    kvp_hchain ch[2];
    c.n = 1 + u8(g) % 2;
    for (uint32_t i = 0; i < c.n; i++) {
        uint8_t v = u8(g);
        ch[i] = (kvp_hchain){(uint8_t)(v % 3), 1 + (v >> 2) % 4, hs[i]};
        for (uint32_t j = 0; j < ch[i].n; j++)
            hs[i][j] = 1 + u8(g) % 6;
    }
    c.refuse = must_refuse(w, s, tenant);
    kvp_msg_lookup_hashes m = {tenant, c.n, ch};
    kvp_buf_reset(&body);
    kvp_enc_lookup_hashes(&body, &m);
    send(w, s, &c);
}

static void st_snapshot(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_KV_SNAPSHOT};
    kvp_bytes tenant = pick_tenant(g, &c.tenant);
    c.refuse = must_refuse(w, s, tenant);
    kvp_msg_keys m = {tenant, 0, NULL};
    kvp_buf_reset(&body);
    kvp_enc_keys(&body, &m);
    send(w, s, &c);
}

/* kvp_master_take_events's sink: a topic's seqs only grow; every batch
 * encodes in vLLM's format. */
static void ev_sink(void *ctx, const char *topic, size_t len, uint64_t seq, const kvp_kvev *ev,
                    uint32_t n)
{
    world *w = ctx;
    FAILIF(n == 0 || seq == 0 || len >= 32);
    unsigned i;
    for (i = 0; i < w->nstreams; i++)
        if (strlen(w->streams[i].topic) == len && !memcmp(w->streams[i].topic, topic, len))
            break;
    if (i == w->nstreams && i < 8) {
        memcpy(w->streams[i].topic, topic, len);
        w->streams[i].topic[len] = 0;
        w->nstreams++;
    }
    if (i < 8) {
        FAILIF(seq <= w->streams[i].seq);
        w->streams[i].seq = seq;
    }
    kvp_buf e;
    kvp_buf_init(&e, 1u << 20);
    FAILIF(kvp_kvev_encode(&e, 1.5, ev, n) != 0);
    kvp_buf_free(&e);
}

static void st_hello(world *w, sess *s, prog *g)
{
    uint8_t how = u8(g), creds = u8(g);
    if (!s->open) {
        kvp_master_sess_open(w->m, &s->s);
        s->s.peer = (uint64_t)(s - w->ss) + 1;
        s->open = 1;
        s->hello = 0;
    }
    /* how: bit 0 join session how >> 4's client, bit 1 a fuzzed client id
     * (0 when how is 0xFF), bit 2 send a session secret: the one learned
     * for that id, or with bit 3 a wrong one */
    uint64_t cid = (uint64_t)(s - w->ss) + 1;
    if ((how & 1) && w->ss[(how >> 4) % NSESS].cid)
        cid = w->ss[(how >> 4) % NSESS].cid;
    if (how & 2)
        cid = how == 0xFF ? 0 : u64(g);
    kvp_bytes session = {NULL, 0};
    uint8_t wrong[KVP_SESSION_LEN] = {1};
    if (how & 0x04) {
        session = (kvp_bytes){wrong, KVP_SESSION_LEN};
        for (unsigned i = 0; i < w->nsec && !(how & 0x08); i++)
            if (w->sec[i].cid == cid)
                session.p = w->sec[i].s;
    }
    /* creds: bits 0-1 cluster token, 2-3 node credential (1 right, 2
     * wrong), 4-5 tenant credential (1 A, 2 B, 3 unknown); bit 6: no
     * AUTH_CHALLENGE first (the proofs are then over a zero transcript) */
    kvp_auth_creds cr;
    memset(&cr, 0, sizeof cr);
    if ((creds & 3) == 1 || (creds & 3) == 2)
        cr.key[KVP_AUTH_CLUSTER] = (creds & 3) == 1 ? CLUSTER_TOKEN : "wrong";
    if ((creds >> 2 & 3) == 1 || (creds >> 2 & 3) == 2)
        cr.key[KVP_AUTH_NODE] = (creds >> 2 & 3) == 1 ? NODE_TOKEN : "wrong";
    int tc = (creds >> 4) & 3;
    if (tc)
        cr.key[KVP_AUTH_TENANT] = tc == 1 ? "tok-a" : tc == 2 ? "tok-b" : "tok-wrong";
    for (int i = 0; i < 3; i++)
        cr.len[i] = cr.key[i] ? strlen(cr.key[i]) : 0;
    if (session.len) {
        cr.key[KVP_AUTH_SESSION] = session.p;
        cr.len[KVP_AUTH_SESSION] = KVP_SESSION_LEN;
    }
    kvp_auth_tx t;
    memset(&t, 0, sizeof t);
    if (!(creds & 0x40) && creds != 0xFF) {
        kvp_auth_client_begin(&t, &cr);
        kvp_msg_challenge ch = {KVP_PROTO_VERSION, {t.client_nonce, KVP_AUTH_NONCE}, t.has,
                                {t.kid, tc ? KVP_AUTH_KID : 0}};
        kvp_buf_reset(&body);
        kvp_enc_challenge(&body, &ch);
        call cc = {.op = KVP_OP_AUTH_CHALLENGE};
        chal_ok = 0;
        send(w, s, &cc);
        if (s->s.close_after)
            return;
        if (chal_ok)
            kvp_auth_client_verify(&t, &cr, chal.nonce, chal.server_id, chal.proof);
    }
    uint8_t pr[KVP_AUTH__N][KVP_AUTH_PROOF];
    kvp_msg_hello h = {KVP_PROTO_VERSION, cid, B("fuzz"), {{NULL, 0}}};
    kvp_auth_client_proofs(&t, &cr, cid, pr, h.proof);
    if (creds == 0xFF)
        h.version = KVP_PROTO_VERSION + 1; /* a version it does not speak */
    kvp_buf_reset(&body);
    kvp_enc_hello(&body, &h);
    call c = {.op = KVP_OP_HELLO};
    int had = s->hello;
    uint64_t old = s->cid;
    s->cid = cid;
    send(w, s, &c);
    if (had && !s->hello)
        s->cid = old;
    if (s->hello && !had)
        s->tcred = tc == 1 ? 0 : tc == 2 ? 1 : -1;
}

static void st_mount(world *w, sess *s, prog *g)
{
    uint32_t n = pick_n(g, 2);
    kvp_seg_desc d[4];
    kvp_endpoint ep[4][3];
    static const char *const names[NSEG + 1] = {"n0:1", "n1:1", "n2:1", "n3:1", "n4:1", "n5:1"};
    if (n > 4)
        n = 4;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t v = u8(g), var = u8(g);
        uint64_t id = v % (NSEG + 1); /* 0 is invalid */
        d[i] = (kvp_seg_desc){id, B(names[id]), seg_cap(id), 1, ep[i], seg_secret(id),
                              (uint32_t)(v >> 4), seg_disk(id)};
        ep[i][0] = (kvp_endpoint){B("tcp"), B("h:1")};
        if (var & 0x80) { /* a variant */
            if (var & 1)
                d[i].secret ^= 1;
            if (var & 2)
                d[i].capacity = seg_cap(id) / 2;
            if (var & 4)
                d[i].name = B(names[(id + NSEG) % (NSEG + 1)]); /* takes id - 1's name */
            if (var & 8)
                ep[i][0] = (kvp_endpoint){B("shm"), B("h:/run/x.sock")};
            if (var & 16)
                ep[i][0] = (kvp_endpoint){B("udp"), B("h:1")};
            if (var & 32)
                d[i].capacity |= 123;
            if (var & 64) {
                d[i].n_endpoints = 3;
                ep[i][1] = (kvp_endpoint){B("tcp"), B("h:0")};
                ep[i][2] = (kvp_endpoint){B("tcp"), B("h2:2")};
            }
        }
    }
    kvp_msg_mount mm = {n, d};
    kvp_buf_reset(&body);
    kvp_enc_mount(&body, &mm);
    call c = {.op = KVP_OP_MOUNT_SEGMENT, .n = n};
    send(w, s, &c);
}

static void enc_ids(prog *g, uint32_t max, uint32_t *n)
{
    uint64_t ids[8];
    *n = pick_n(g, max);
    if (*n > 8)
        *n = 8;
    for (uint32_t i = 0; i < *n; i++) {
        uint8_t v = u8(g);
        ids[i] = v < 250 ? v % (NSEG + 1) : u64(g);
    }
    kvp_msg_ids m = {*n, ids};
    kvp_buf_reset(&body);
    kvp_enc_ids(&body, &m);
}

static void st_ids(world *w, sess *s, prog *g, uint16_t op)
{
    call c = {.op = op};
    uint8_t f = u8(g);
    enc_ids(g, 3, &c.n);
    if (op == KVP_OP_SEG_FAILING && (f & 1))
        c.flags = KVP_FLAG_ONEWAY;
    send(w, s, &c);
}

static void st_put_start(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_PUT_START};
    kvp_bytes tenant = pick_tenant(g, &c.tenant);
    uint8_t v = u8(g);
    c.replicas = v < 250 ? 1 + v % 3 : v - 250; /* 0 and 4 rarely */
    uint32_t flags = u8(g) % 4 == 0 ? KVP_PUT_PIN : 0;
    if (v == 255)
        flags = 0x10;
    kvp_bytes pref = {NULL, 0};
    uint8_t p = u8(g);
    static const char *const names[] = {"n1:1", "n2:1", "n3:1", "nx:1"};
    if (p & 1)
        pref = B(names[(p >> 1) % 4]);
    c.n = pick_n(g, 4);
    if (c.n > 8)
        c.n = 8;
    kvp_bytes keys[8];
    uint64_t sizes[8];
    kvp_blkinfo blk[8];
    for (uint32_t i = 0; i < c.n; i++) {
        keys[i] = pick_key(w, g, &c.keys[i]);
        sizes[i] = pick_size(g);
    }
    if (p & 0x80) { /* engine blocks: small pools, so parts meet and clash */
        flags |= KVP_PUT_F_BLOCKS;
        for (uint32_t i = 0; i < c.n; i++) {
            uint8_t a = u8(g), b = u8(g);
            blk[i] = (kvp_blkinfo){1 + a % 6, 1 + (a >> 3) % 6, b & 1 ? 16 : 32 * (b >> 7),
                                   (uint16_t)(1 + (b >> 1) % 3), (uint8_t)((b >> 3) % 3),
                                   (uint8_t)((a >> 6) & 3)};
            if (b == 0xFF)
                blk[i].group = KVP_OBJ_MAX_GROUP + 1; /* refused per key */
        }
    }
    c.sizes = sizes;
    c.refuse = must_refuse(w, s, tenant);
    kvp_msg_put_start m = {tenant, c.replicas, flags, 0, pref, c.n, keys, sizes,
                           (flags & KVP_PUT_F_BLOCKS) ? blk : NULL};
    kvp_buf_reset(&body);
    kvp_enc_put_start(&body, &m);
    send(w, s, &c);
    w->last_t = c.tenant;
    w->last_n = (uint8_t)(c.n < 4 ? c.n : 4);
    memcpy(w->last_k, c.keys, 4);
}

/* Keys of a keyed request: the last PUT_START's, or picked. */
static kvp_bytes keyed_args(world *w, prog *g, call *c, kvp_bytes *keys, uint64_t *args,
                            int want_checksum)
{
    uint8_t v = u8(g);
    kvp_bytes tenant;
    if ((v & 3) == 0 && w->last_n && w->last_t != 255) {
        c->tenant = w->last_t;
        tenant = B(tenant_names[c->tenant]);
        c->n = w->last_n;
        for (uint32_t i = 0; i < c->n; i++) {
            c->keys[i] = w->last_k[i];
            keys[i] = c->keys[i] < KEYS ? B(key_names[c->keys[i]]) : B("k?");
        }
    } else {
        tenant = pick_tenant(g, &c->tenant);
        c->n = pick_n(g, 4);
        if (c->n > 8)
            c->n = 8;
        for (uint32_t i = 0; i < c->n; i++)
            keys[i] = pick_key(w, g, &c->keys[i]);
    }
    for (uint32_t i = 0; args && i < c->n; i++)
        args[i] = want_checksum ? pick_checksum(g) : u64(g);
    return tenant;
}

static void st_put_end(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_PUT_END};
    kvp_bytes keys[8];
    uint64_t sums[8];
    kvp_bytes t = keyed_args(w, g, &c, keys, sums, 1);
    c.refuse = must_refuse(w, s, t);
    kvp_msg_put_end m = {t, c.n, keys, sums};
    kvp_buf_reset(&body);
    kvp_enc_put_end(&body, &m);
    send(w, s, &c);
}

static void st_keys(world *w, sess *s, prog *g, uint16_t op)
{
    call c = {.op = op};
    kvp_bytes keys[8];
    kvp_bytes t = keyed_args(w, g, &c, keys, NULL, 0);
    c.refuse = must_refuse(w, s, t);
    kvp_msg_keys m = {t, c.n, keys};
    kvp_buf_reset(&body);
    kvp_enc_keys(&body, &m);
    send(w, s, &c);
}

static void st_exist(world *w, sess *s, prog *g)
{
    static const uint16_t ops[4] = {KVP_OP_EXIST, KVP_OP_PREFIX, KVP_OP_TIERS,
                                    KVP_OP_EXIST_LEASE};
    st_keys(w, s, g, ops[u8(g) % 4]);
}

static void st_release(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_RELEASE};
    uint8_t f = u8(g);
    kvp_bytes keys[8], t;
    uint64_t ids[8];
    if (w->nleases && !(f & 2)) { /* leases GET handed out */
        c.n = 1 + (f >> 2) % 3;
        uint8_t ti = 0;
        for (uint32_t i = 0; i < c.n; i++) {
            const lease_seen *l = &w->leases[(u8(g) + w->nleases) % (w->nleases < NLEASE ? w->nleases : NLEASE)];
            if (i == 0)
                ti = l->tenant;
            c.keys[i] = l->key;
            keys[i] = l->key < KEYS ? B(key_names[l->key]) : B("k?");
            ids[i] = l->id + (u8(g) == 0xFF);
        }
        c.tenant = ti;
        t = ti < TENANTS ? B(tenant_names[ti]) : B("t?");
    } else {
        t = keyed_args(w, g, &c, keys, ids, 0);
    }
    if (f & 1)
        c.flags = KVP_FLAG_ONEWAY;
    c.refuse = must_refuse(w, s, t);
    kvp_msg_put_end m = {t, c.n, keys, ids};
    kvp_buf_reset(&body);
    kvp_enc_put_end(&body, &m);
    send(w, s, &c);
}

static void st_remove(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_REMOVE};
    kvp_bytes keys[8];
    uint8_t force = u8(g) & 1;
    kvp_bytes t = keyed_args(w, g, &c, keys, NULL, 0);
    c.refuse = must_refuse(w, s, t);
    kvp_msg_remove m = {t, force, c.n, keys};
    kvp_buf_reset(&body);
    kvp_enc_remove(&body, &m);
    send(w, s, &c);
}

static void st_remove_all(world *w, sess *s, prog *g, int regex)
{
    call c = {.op = regex ? KVP_OP_REMOVE_REGEX : KVP_OP_REMOVE_ALL};
    uint8_t force = u8(g) & 1;
    kvp_bytes t = pick_tenant(g, &c.tenant);
    c.refuse = must_refuse(w, s, t);
    kvp_buf_reset(&body);
    if (regex) {
        static const char *const pats[] = {"k1", "^k1", "k[0-3]$", ".*", "(", "a{2}", "\\1",
                                           "k(1|2)+", "\\{", ""};
        uint8_t v = u8(g);
        kvp_bytes p = v < 240 ? B(pats[v % 10]) : raw(g, 40);
        kvp_msg_remove_regex m = {t, force, p};
        kvp_enc_remove_regex(&body, &m);
    } else {
        kvp_msg_remove_all m = {t, force};
        kvp_enc_remove_all(&body, &m);
    }
    send(w, s, &c);
}

static void st_replica_bad(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_REPLICA_BAD};
    uint8_t f = u8(g);
    kvp_bad_replica bad[4];
    c.n = 1 + (f >> 2) % 3;
    uint8_t ti = 0;
    for (uint32_t i = 0; i < c.n; i++) {
        if (w->nreps && !(f & 2)) {
            const rep_seen *r = &w->reps[u8(g) % (w->nreps < NREP ? w->nreps : NREP)];
            if (i == 0)
                ti = r->tenant;
            bad[i] = (kvp_bad_replica){r->key < KEYS ? B(key_names[r->key]) : B("k?"), r->seg,
                                       r->gen};
        } else {
            uint8_t k;
            bad[i] = (kvp_bad_replica){pick_key(w, g, &k), u8(g) % (NSEG + 1), u8(g)};
        }
    }
    kvp_bytes t = ti < TENANTS ? B(tenant_names[ti]) : B("t?");
    if (f & 1)
        c.flags = KVP_FLAG_ONEWAY;
    c.refuse = must_refuse(w, s, t);
    kvp_msg_replica_bad m = {t, c.n, bad};
    kvp_buf_reset(&body);
    kvp_enc_replica_bad(&body, &m);
    send(w, s, &c);
}

/* A node's report: answers to DISK_CMDs it was sent, records it holds or
 * lost, its usage. */
static void st_disk_report(world *w, sess *s, prog *g)
{
    call c = {.op = KVP_OP_DISK_REPORT};
    uint8_t f = u8(g);
    kvp_disk_ent e[4];
    uint64_t seg = 1 + (f >> 4) % NSEG;
    uint32_t n = 1 + (f >> 2) % 3;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t v = u8(g);
        uint8_t kind = v % 5;
        if (kind <= 1 && w->ncmds) { /* answer a command */
            const cmd_seen *x = &w->cmds[u8(g) % (w->ncmds < NCMD ? w->ncmds : NCMD)];
            e[i] = x->e;
            seg = x->seg;
            e[i].what = x->e.what == KVP_DISK_SPILL ? KVP_DISK_SPILLED : KVP_DISK_LOADED;
            static const int32_t sts[] = {0, 0, 0, KVP_EIO, KVP_EOBJECT_NOT_FOUND, KVP_ENOMEM,
                                          KVP_ECHECKSUM_MISMATCH, KVP_EAGAIN};
            e[i].status = sts[(v >> 3) % 8];
            /* a durable SPILLED names its record: one of a few ids, so that
             * reports of the same key name the same or another record */
            e[i].rec = e[i].what == KVP_DISK_SPILLED && e[i].status == 0 ? 1u + (v & 3) : 0;
            if (v >= 0xF0) /* a stale or forged answer */
                e[i].generation ^= 1 + (v & 3);
            if (v >= 0xF8)
                e[i].checksum ^= 1;
        } else if (kind == 4 && (v & 0x80)) {
            e[i] = (kvp_disk_ent){KVP_DISK_USAGE, 0, {NULL, 0}, B("usage"), u64(g), u64(g),
                                  u32(g), u64(g), 0};
        } else { /* HAVE or GONE of a record, or a command sent back */
            uint8_t ti, ki;
            kvp_bytes t = pick_tenant(g, &ti), k = pick_key(w, g, &ki);
            uint8_t what = kind == 4 ? 1 + v / 5 % 9 : (v & 0x40) ? KVP_DISK_GONE : KVP_DISK_HAVE;
            /* HAVE, GONE (and FORGET sent back) name a record; anything
             * else sent back with an id is refused by the decoder */
            uint32_t rec = what == KVP_DISK_HAVE || what == KVP_DISK_GONE ||
                                   what == KVP_DISK_FORGET || (v & 0x20)
                               ? 1u + (v >> 6)
                               : 0;
            e[i] = (kvp_disk_ent){what, 0, t, k, pick_size(g), pick_checksum(g), u8(g), 0, rec};
        }
    }
    if (f & 1)
        c.flags = KVP_FLAG_ONEWAY;
    kvp_msg_disk m = {seg, n, e};
    kvp_buf_reset(&body);
    kvp_enc_disk(&body, &m);
    send(w, s, &c);
}

static void st_raw(world *w, sess *s, prog *g)
{
    uint8_t v = u8(g);
    call c = {.op = (uint16_t)(v % 28), .flags = (uint8_t)(u8(g) & 3)};
    if (c.op == KVP_OP_HELLO) /* HELLO's credentials feed the tenant oracle: st_hello only */
        c.op = 0;
    kvp_bytes b = raw(g, 255);
    kvp_buf_reset(&body);
    kvp_buf_put(&body, b.p, b.len);
    /* the answer of a raw body is checked for framing only */
    if (body.len > w->cfg.max_frame)
        return;
    kvp_frame_hdr h = {KVP_PROTO_VERSION, c.flags, c.op, ++w->req, (uint32_t)body.len, 0};
    kvp_arena_reset(&arena);
    kvp_buf_reset(&out);
    int rc = kvp_master_handle(w->m, &s->s, &h, body.data, &arena, &out, w->now);
    if (rc) {
        s->s.close_after = 1;
        return;
    }
    if (out.len) {
        kvp_frame_hdr rh;
        const uint8_t *rb;
        FAILIF(kvp_frame_next(out.data, out.len, 1u << 30, &rh, &rb) != 1);
        FAILIF(KVP_FRAME_HDR + rh.body_len != out.len || rh.req_id != h.req_id);
        FAILIF(rh.status > 0 || !known_status(rh.status));
    } else {
        FAILIF(!(c.flags & KVP_FLAG_ONEWAY));
    }
}

static void sess_close(world *w, sess *s)
{
    if (!s->open)
        return;
    kvp_master_sess_close(w->m, &s->s, w->now);
    s->open = 0;
    s->hello = 0;
}

static void step(world *w, prog *g)
{
    uint8_t op = u8(g);
    w->now += op >> 6; /* a little time passes between requests */
    sess *s = pick_sess(w, g);
    unsigned k = op % S__COUNT;
    if (k != S_HELLO && k != S_ADVANCE && k != S_CLOSE && k != S_FAIL && !s->open)
        k = S_HELLO; /* a connection starts with HELLO */
    switch (k) {
    case S_HELLO: st_hello(w, s, g); break;
    case S_MOUNT: st_mount(w, s, g); break;
    case S_UNMOUNT: st_ids(w, s, g, KVP_OP_UNMOUNT_SEGMENT); break;
    case S_HEARTBEAT: {
        kvp_buf_reset(&body);
        call c = {.op = KVP_OP_HEARTBEAT};
        send(w, s, &c);
        break;
    }
    case S_PUT_START: st_put_start(w, s, g); break;
    case S_PUT_END: st_put_end(w, s, g); break;
    case S_PUT_REVOKE: st_keys(w, s, g, KVP_OP_PUT_REVOKE); break;
    case S_GET: st_keys(w, s, g, KVP_OP_GET); break;
    case S_RELEASE: st_release(w, s, g); break;
    case S_EXIST: st_exist(w, s, g); break;
    case S_REMOVE: st_remove(w, s, g); break;
    case S_REMOVE_ALL: st_remove_all(w, s, g, 0); break;
    case S_REMOVE_REGEX: st_remove_all(w, s, g, 1); break;
    case S_STATS: {
        kvp_buf_reset(&body);
        call c = {.op = KVP_OP_STATS};
        send(w, s, &c);
        break;
    }
    case S_SEG_INFO: st_ids(w, s, g, KVP_OP_SEGMENT_INFO); break;
    case S_REPLICA_BAD: st_replica_bad(w, s, g); break;
    case S_SEG_FAILING: st_ids(w, s, g, KVP_OP_SEG_FAILING); break;
    case S_DISK_REPORT: st_disk_report(w, s, g); break;
    case S_ADVANCE: {
        static const uint32_t jumps[] = {10, 60, 120, 400, 1100, 5000};
        uint8_t v = u8(g);
        w->now += jumps[v % 6] + (v >> 3);
        break;
    }
    case S_CLOSE: sess_close(w, s); break;
    case S_RAW: st_raw(w, s, g); break;
    case S_LOOKUP: st_lookup(w, s, g); break;
    case S_SNAPSHOT: st_snapshot(w, s, g); break;
    case S_FAIL: /* the next request's nth allocation fails (once) */
        w->fail = 1 + u8(g) % 8;
        break;
    case S_PUT: { /* PUT_START and PUT_END of the same keys */
        st_put_start(w, s, g);
        if (!s->s.close_after && !kvp_master_sess_dead(&s->s)) {
            call c = {.op = KVP_OP_PUT_END, .n = w->last_n};
            kvp_bytes keys[4];
            uint64_t sums[4];
            for (uint32_t i = 0; i < c.n; i++) {
                keys[i] = w->last_k[i] < KEYS ? B(key_names[w->last_k[i]]) : B("k?");
                sums[i] = 1 + (w->last_k[i] % 3);
            }
            kvp_bytes t = w->last_t < TENANTS ? B(tenant_names[w->last_t]) : B("t?");
            c.refuse = must_refuse(w, s, t);
            kvp_msg_put_end m = {t, c.n, keys, sums};
            kvp_buf_reset(&body);
            kvp_enc_put_end(&body, &m);
            if (c.n)
                send(w, s, &c);
        }
        break;
    }
    }
    kvp_master_tick(w->m, w->now);
    kvp_master_push_freed(w->m, sink, w);
    drain_pushes(w);
    kvp_master_take_events(w->m, ev_sink, w);
    int rc = kvp_master_check(w->m);
    if (trace) /* $FUZZ_SEQ_TRACE: one line per step, to read a crashing program */
        fprintf(stderr, "step %u session %d now %llu: answer %d, check %d\n", k,
                (int)(s - w->ss), (unsigned long long)w->now, last_status, rc);
    if (rc != 0) {
        fprintf(stderr, "fuzz_master_seq: kvp_master_check = %d\n", rc);
        abort();
    }
    for (int i = 0; i < NSESS; i++)
        if (w->ss[i].open && (w->ss[i].s.close_after || kvp_master_sess_dead(&w->ss[i].s)))
            sess_close(w, &w->ss[i]);
}

/* ---------------------------------------------------------------- setup */

/* libFuzzer calls this before it parses its flags: "-entropic=0" goes in
 * first, so flags given on the command line still win. Entropic scheduling
 * updates a frequency per feature per run, and a run of this target hits
 * thousands (the master, the codecs, the self-check): it spent more than
 * half of the time there, and without it runs are about twice as fast. */
static void default_flags(int *argc, char ***argv)
{
    static char flag[] = "-entropic=0";
    static char *args[256];
    if (*argc < 1 || *argc > 254)
        return;
    args[0] = (*argv)[0];
    args[1] = flag;
    for (int i = 1; i < *argc; i++)
        args[i + 1] = (*argv)[i];
    args[*argc + 1] = NULL;
    *argv = args;
    (*argc)++;
}

static void remove_tenant_file(void) { unlink(tenant_file); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    default_flags(argc, argv);
    trace = getenv("FUZZ_SEQ_TRACE") != NULL;
    kvp_log_set_level(KVP_LOG_OFF);
    for (int i = 0; i < KEYS; i++)
        snprintf(key_names[i], sizeof key_names[i], "k%d", i);
    const char *tmp = getenv("TMPDIR");
    snprintf(tenant_file, sizeof tenant_file, "%s/kvp-fuzz-tenants.XXXXXX",
             tmp && *tmp && strlen(tmp) < 200 ? tmp : "/tmp");
    int fd = mkstemp(tenant_file);
    if (fd < 0 || fchmod(fd, 0600) != 0)
        abort();
    static const char t[] = "ta tok-a\ntb tok-b\n";
    if (write(fd, t, sizeof t - 1) != (ssize_t)(sizeof t - 1))
        abort();
    close(fd);
    atexit(remove_tenant_file);
    kvp_proto_limits_default(&lim);
    kvp_arena_init(&arena, 16u << 20);
    kvp_arena_init(&ra, 16u << 20);
    kvp_buf_init(&out, (64u << 20) + 65536);
    kvp_buf_init(&body, 1u << 20);
    /* pre-grow the harness's buffers: injected failures hit the master */
    kvp_buf_reserve(&out, 1u << 20);
    kvp_buf_reserve(&body, 1u << 20);
    kvp_arena_alloc(&arena, 1u << 20);
    kvp_arena_alloc(&ra, 1u << 20);
    kvp_arena_reset(&arena);
    kvp_arena_reset(&ra);
    return 0;
}

static void configure(world *w, uint8_t c)
{
    kvp_config_defaults(&w->cfg);
    w->cfg.max_segments = 4;
    w->cfg.max_connections = NSESS;
    w->cfg.max_tenants = 4;
    w->cfg.lease_ttl_ms = 50;
    w->cfg.put_timeout_ms = 100;
    w->cfg.client_ttl_ms = 1000;
    if (c & 1)
        snprintf(w->cfg.cluster_token, sizeof w->cfg.cluster_token, "%s", CLUSTER_TOKEN);
    /* tenants need the node credential (the master refuses to start without it) */
    if (c & 6)
        snprintf(w->cfg.node_token, sizeof w->cfg.node_token, "%s", NODE_TOKEN);
    if (c & 4) {
        snprintf(w->cfg.tenant_tokens_file, sizeof w->cfg.tenant_tokens_file, "%s", tenant_file);
        w->tcreds = 1;
    }
    if (c & 8)
        w->cfg.max_objects = 6;
    if (c & 16)
        w->cfg.max_frame = 4096;
    if (c & 32)
        w->cfg.max_object_size = 16 * 4096;
    if (c & 64) {
        w->cfg.evict_high = 0.5;
        w->cfg.evict_low = 0.25;
    }
    if (c & 128) /* the core records KV events (no socket: the service publishes) */
        snprintf(w->cfg.kv_events, sizeof w->cfg.kv_events, "tcp://127.0.0.1:1");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static world w;
    prog g = {data, size, 0};
    memset(&w, 0, sizeof w);
    configure(&w, u8(&g));
    w.now = 1000;
    if (kvp_master_create(&w.cfg, w.now, &w.m) != 0)
        abort();
    for (int i = 0; i < NSESS; i++) {
        w.ss[i].tcred = -1;
        kvp_buf_init(&w.ss[i].push, w.cfg.max_frame + (9u << 20)); /* as service.c */
    }
    for (int n = 0; n < MAX_STEPS && g.i < g.n; n++)
        step(&w, &g);
    for (int i = 0; i < NSESS; i++)
        sess_close(&w, &w.ss[i]);
    FAILIF(kvp_master_check(w.m) != 0);
    kvp_master_destroy(w.m);
    for (int i = 0; i < NSESS; i++)
        kvp_buf_free(&w.ss[i].push);
    return 0;
}
