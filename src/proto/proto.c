/*
 * proto.c -- frame header, opcode table and message codecs (see proto.h).
 *
 * Encoders append exactly the fields they are given; they trust the message
 * except where trusting it would read out of bounds (n_replicas), which sets
 * b->err = KVP_EINVALID_PARAMS. The encoding is canonical: for every body a
 * decoder accepts, re-encoding the decoded message yields the same bytes.
 *
 * Decoders read through a kvp_rd (sticky error, zeros after it), so field
 * reads are straight-line and the result is decided once by kvp_rd_finish.
 * Every count goes through kvp_rd_count with the smallest possible encoded
 * size of one element, so an array is only allocated when the bytes left
 * could hold it. On error the contents of *m are unspecified.
 */
#include "proto/proto.h"

#include <xxhash.h>

#include "common/assert.h"
#include "kvpool.h"

/* Smallest encodings of repeated elements (used to bound counts). */
#define MIN_BYTES 4u                            /* empty bytes */
#define MIN_KEY (MIN_BYTES + 1)                 /* keys are 1..max_key bytes */
#define MIN_ENDPOINT (2 * MIN_BYTES)            /* transport, addr */
#define MIN_SEG (8 + MIN_BYTES + 8 + 4)         /* id, name, capacity, n_endpoints */
#define MIN_MOUNT_SEG (MIN_SEG + 20)            /* + secret, epoch, disk capacity */
#define MIN_SEG_STAT (8 + MIN_BYTES + 4 * 8)    /* id, name, capacity, used, objects, free */
#define MIN_TENANT_STAT (MIN_BYTES + 7 * 8 + 4) /* name, 7 counters, share */
#define MIN_CONFIG_STAT (3 * MIN_BYTES + 2 * 8)  /* tenant, name, fp, objects, bytes */
#define MIN_STATUS 4u                           /* a result that is only an error code */
#define MAX_ENDPOINTS 16
#define MAX_COUNTERS 1024

/* ------------------------------------------------------------ opcodes */

const char *kvp_stat_name(unsigned i)
{
    static const char *const names[KVP_STAT__COUNT] = {
        "objects", "bytes",       "capacity",     "used",        "hits",
        "misses",  "evictions",   "evicted_bytes", "leases",     "pending",
        "clients", "segments",    "put_timeouts", "put_revoked", "clients_expired",
        "requests", "bad_frames", "bad_replicas", "disk_capacity", "disk_objects",
        "disk_bytes", "spilling", "spills", "spill_fails", "disk_hits", "loads",
        "load_fails", "disk_dropped", "disk_registered", "spill_pressure", "disk_used",
        "disk_compacted_bytes", "disk_compacted_pages", "disk_dropped_pages", "soft_pinned",
        "repl_followers", "repl_in_sync", "repl_seq", "repl_lag", "repl_bytes", "adopted",
        "parked", "adopt_dropped", "puts", "put_bytes", "hit_bytes", "block_objects",
        "block_conflicts", "kv_events", "kv_batches", "kv_lost", "client_shm_put_bytes",
        "client_shm_get_bytes", "client_shm_put_ops", "client_shm_get_ops",
        "client_tcp_put_bytes", "client_tcp_get_bytes", "client_tcp_put_ops",
        "client_tcp_get_ops", "client_ucx_put_bytes", "client_ucx_get_bytes",
        "client_ucx_put_ops", "client_ucx_get_ops"};
    return i < KVP_STAT__COUNT ? names[i] : "unknown";
}

const char *kvp_op_name(uint16_t op)
{
    switch (op) {
#define KVP__OP_NAME(name, code, doc) \
    case code:                        \
        return #name;
        KVP_OP_MAP(KVP__OP_NAME)
#undef KVP__OP_NAME
    }
    return NULL;
}

void kvp_proto_limits_default(kvp_proto_limits *l)
{
    l->max_key = 4096;
    l->max_str = 1024;
    l->max_batch = 1u << 20;
}

/* ------------------------------------------------------------- frames */

/* Little-endian load / store of an n-byte unsigned integer. */
static uint64_t ld_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    while (n--)
        v = (v << 8) | p[n];
    return v;
}

static void st_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Fills *h from the raw fields before validating them, so a caller can still
 * echo req_id / op in its error response. Checks in order: magic, version,
 * reserved and request status, body size. */
int kvp_frame_hdr_decode(const uint8_t *p, uint32_t max_frame, kvp_frame_hdr *h)
{
    h->version = p[2];
    h->flags = p[3];
    h->op = (uint16_t)ld_le(p + 4, 2);
    h->req_id = ld_le(p + 8, 8);
    h->body_len = (uint32_t)ld_le(p + 16, 4);
    h->status = (int32_t)(uint32_t)ld_le(p + 20, 4);
    if (ld_le(p, 2) != KVP_PROTO_MAGIC)
        return KVP_EPROTOCOL;
    if (h->version != KVP_PROTO_VERSION)
        return KVP_EINVALID_VERSION;
    if (ld_le(p + 6, 2) != 0 || (!(h->flags & KVP_FLAG_RESPONSE) && h->status != 0))
        return KVP_EPROTOCOL;
    if (h->body_len > max_frame)
        return KVP_ETOO_LARGE;
    return 0;
}

/* Writes KVP_FRAME_HDR bytes: magic, the fields of *h, reserved = 0. */
void kvp_frame_hdr_encode(uint8_t *p, const kvp_frame_hdr *h)
{
    st_le(p, KVP_PROTO_MAGIC, 2);
    p[2] = h->version;
    p[3] = h->flags;
    st_le(p + 4, h->op, 2);
    st_le(p + 6, 0, 2);
    st_le(p + 8, h->req_id, 8);
    st_le(p + 16, h->body_len, 4);
    st_le(p + 20, (uint32_t)h->status, 4);
}

size_t kvp_frame_begin(kvp_buf *b, uint16_t op, uint8_t flags, uint64_t req_id, int32_t status)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, flags, op, req_id, 0, status};
    uint8_t raw[KVP_FRAME_HDR];
    kvp_frame_hdr_encode(raw, &h);
    size_t off = b->len;
    kvp_buf_put(b, raw, sizeof raw);
    return off;
}

/* A body over 4 GiB cannot be described by the header: KVP_ETOO_LARGE. */
void kvp_frame_end(kvp_buf *b, size_t hdr_off)
{
    /* no error: the header kvp_frame_begin appended at hdr_off is there */
    if (b->err || KVP_NEVER(b->len < hdr_off + KVP_FRAME_HDR))
        return;
    size_t body = b->len - hdr_off - KVP_FRAME_HDR;
    if (body > UINT32_MAX) {
        b->err = KVP_ETOO_LARGE;
        return;
    }
    kvp_buf_patch_u32(b, hdr_off + 16, (uint32_t)body);
}

int kvp_frame_next(const uint8_t *in, size_t len, uint32_t max_frame, kvp_frame_hdr *h,
                   const uint8_t **body)
{
    if (len < KVP_FRAME_HDR)
        return 0;
    int rc = kvp_frame_hdr_decode(in, max_frame, h);
    if (rc)
        return rc;
    if (len - KVP_FRAME_HDR < h->body_len)
        return 0;
    *body = in + KVP_FRAME_HDR;
    return 1;
}

/* ------------------------------------------------------- shared pieces */

/* n elements of `size` bytes from the arena; n == 0 gives NULL without
 * allocating. n comes from kvp_rd_count (n <= body length), so n * size
 * cannot overflow. */
static void *arena_array(kvp_arena *a, uint32_t n, size_t size)
{
    return n ? kvp_arena_alloc(a, (size_t)n * size) : NULL;
}
/* Sets ptr to an array of n elements; false when the arena is exhausted. */
#define ALLOC_ARRAY(a, ptr, n) (((ptr) = arena_array((a), (n), sizeof *(ptr))) != NULL || (n) == 0)

static int rd_fail(kvp_rd *r)
{
    if (!r->err)
        r->err = KVP_EPROTOCOL;
    return r->err;
}

/* A key: 1..max_key bytes. */
static kvp_bytes rd_key(kvp_rd *r, const kvp_proto_limits *l)
{
    kvp_bytes k = kvp_rd_bytes(r, l->max_key);
    if (!r->err && k.len == 0)
        rd_fail(r);
    return k;
}

static void wr_bytes(kvp_buf *b, kvp_bytes v) { kvp_buf_bytes(b, v.p, v.len); }

/* tenant, u32 n, n x key: the common prefix of keys and remove. */
static int rd_key_batch(kvp_rd *r, const kvp_proto_limits *l, kvp_arena *a, uint32_t *n,
                        kvp_bytes **keys)
{
    *n = kvp_rd_count(r, l->max_batch, MIN_KEY);
    if (!ALLOC_ARRAY(a, *keys, *n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < *n && !r->err; i++)
        (*keys)[i] = rd_key(r, l);
    return 0;
}

static void wr_key_batch(kvp_buf *b, uint32_t n, const kvp_bytes *keys)
{
    kvp_buf_u32(b, n);
    for (uint32_t i = 0; i < n; i++)
        wr_bytes(b, keys[i]);
}

/* One descriptor: segment_id, offset, length, generation, expires_ms,
 * u32 access, u32 reserved (0), tag: KVP_SEG_IO_SIZE bytes. */
static void rd_rep(kvp_rd *r, kvp_replica *rep)
{
    rep->segment_id = kvp_rd_u64(r);
    rep->offset = kvp_rd_u64(r);
    rep->length = kvp_rd_u64(r);
    rep->generation = kvp_rd_u64(r);
    rep->expires_ms = kvp_rd_u64(r);
    rep->access = kvp_rd_u32(r);
    if (kvp_rd_u32(r) != 0 ||
        (rep->access != KVP_ACCESS_READ && rep->access != KVP_ACCESS_WRITE))
        rd_fail(r);
    rep->tag = kvp_rd_u64(r);
}

static void wr_rep(kvp_buf *b, const kvp_replica *rep)
{
    kvp_buf_u64(b, rep->segment_id);
    kvp_buf_u64(b, rep->offset);
    kvp_buf_u64(b, rep->length);
    kvp_buf_u64(b, rep->generation);
    kvp_buf_u64(b, rep->expires_ms);
    kvp_buf_u32(b, rep->access);
    kvp_buf_u32(b, 0);
    kvp_buf_u64(b, rep->tag);
}

/* u32 n_replicas (1..KVP_MAX_REPLICAS), then each replica. */
static void rd_replicas(kvp_rd *r, uint32_t *n, kvp_replica *rep)
{
    *n = kvp_rd_u32(r);
    if (!r->err && (*n < 1 || *n > KVP_MAX_REPLICAS))
        rd_fail(r);
    if (r->err)
        *n = 0;
    KVP_ASSERT(*n <= KVP_MAX_REPLICAS); /* rep[] holds KVP_MAX_REPLICAS */
    for (uint32_t i = 0; i < *n; i++)
        rd_rep(r, &rep[i]);
}

static void wr_replicas(kvp_buf *b, uint32_t n, const kvp_replica *rep)
{
    if (n < 1 || n > KVP_MAX_REPLICAS) {
        if (!b->err)
            b->err = KVP_EINVALID_PARAMS;
        return;
    }
    kvp_buf_u32(b, n);
    for (uint32_t i = 0; i < n; i++)
        wr_rep(b, &rep[i]);
}

/* One mount segment: id, name, capacity, n_endpoints (<= 16), endpoints. */
static int rd_seg(kvp_rd *r, const kvp_proto_limits *l, kvp_arena *a, kvp_seg_desc *s)
{
    s->id = kvp_rd_u64(r);
    s->name = kvp_rd_bytes(r, l->max_str);
    s->capacity = kvp_rd_u64(r);
    s->n_endpoints = kvp_rd_count(r, MAX_ENDPOINTS, MIN_ENDPOINT);
    KVP_ASSERT(s->n_endpoints <= MAX_ENDPOINTS);
    if (!ALLOC_ARRAY(a, s->endpoints, s->n_endpoints))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < s->n_endpoints && !r->err; i++) {
        s->endpoints[i].transport = kvp_rd_bytes(r, l->max_str);
        s->endpoints[i].addr = kvp_rd_bytes(r, l->max_str);
    }
    return 0;
}

static void wr_seg(kvp_buf *b, const kvp_seg_desc *s)
{
    kvp_buf_u64(b, s->id);
    wr_bytes(b, s->name);
    kvp_buf_u64(b, s->capacity);
    kvp_buf_u32(b, s->n_endpoints);
    for (uint32_t i = 0; i < s->n_endpoints; i++) {
        wr_bytes(b, s->endpoints[i].transport);
        wr_bytes(b, s->endpoints[i].addr);
    }
}

/* Declares `kvp_rd r` over the body; DEC_END returns its verdict. */
#define DEC_BEGIN kvp_rd r; kvp_rd_init(&r, p, len)
#define DEC_END return kvp_rd_finish(&r)

/* --------------------------------------------------------------- hello */

/* A proof on the wire: empty or exactly KVP_AUTH_PROOF bytes. */
static kvp_bytes rd_proof(kvp_rd *r)
{
    kvp_bytes b = kvp_rd_bytes(r, KVP_AUTH_PROOF);
    if (b.len != 0 && b.len != KVP_AUTH_PROOF)
        rd_fail(r);
    return b;
}

void kvp_enc_challenge(kvp_buf *b, const kvp_msg_challenge *m)
{
    kvp_buf_u32(b, m->version);
    wr_bytes(b, m->nonce);
    kvp_buf_u8(b, m->has);
    wr_bytes(b, m->kid);
}

int kvp_dec_challenge(const uint8_t *p, uint32_t len, kvp_msg_challenge *m)
{
    DEC_BEGIN;
    m->version = kvp_rd_u32(&r);
    m->nonce = kvp_rd_bytes(&r, KVP_AUTH_NONCE);
    m->has = kvp_rd_u8(&r);
    m->kid = kvp_rd_bytes(&r, KVP_AUTH_KID);
    if (m->nonce.len != KVP_AUTH_NONCE || (m->has & ~KVP_AUTH_HAS_ALL) ||
        (m->kid.len != 0 && m->kid.len != KVP_AUTH_KID) ||
        !(m->kid.len == KVP_AUTH_KID) != !(m->has & KVP_AUTH_HAS(KVP_AUTH_TENANT)))
        rd_fail(&r);
    DEC_END;
}

void kvp_enc_challenge_resp(kvp_buf *b, const kvp_msg_challenge_resp *m)
{
    wr_bytes(b, m->nonce);
    kvp_buf_u64(b, m->server_id);
    for (int i = 0; i < 3; i++)
        wr_bytes(b, m->proof[i]);
}

int kvp_dec_challenge_resp(const uint8_t *p, uint32_t len, kvp_msg_challenge_resp *m)
{
    DEC_BEGIN;
    m->nonce = kvp_rd_bytes(&r, KVP_AUTH_NONCE);
    if (m->nonce.len != KVP_AUTH_NONCE)
        rd_fail(&r);
    m->server_id = kvp_rd_u64(&r);
    for (int i = 0; i < 3; i++)
        m->proof[i] = rd_proof(&r);
    DEC_END;
}

void kvp_enc_hello(kvp_buf *b, const kvp_msg_hello *m)
{
    kvp_buf_u32(b, m->version);
    kvp_buf_u64(b, m->client_id);
    wr_bytes(b, m->name);
    for (int i = 0; i < 4; i++)
        wr_bytes(b, m->proof[i]);
}

int kvp_dec_hello(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_msg_hello *m)
{
    DEC_BEGIN;
    m->version = kvp_rd_u32(&r);
    m->client_id = kvp_rd_u64(&r);
    m->name = kvp_rd_bytes(&r, l->max_str);
    for (int i = 0; i < 4; i++)
        m->proof[i] = rd_proof(&r);
    DEC_END;
}

void kvp_enc_hello_resp(kvp_buf *b, const kvp_msg_hello_resp *m)
{
    kvp_buf_u32(b, m->version);
    kvp_buf_u64(b, m->master_id);
    kvp_buf_u32(b, m->max_frame);
    kvp_buf_u32(b, m->lease_ttl_ms);
    kvp_buf_u32(b, m->client_ttl_ms);
    kvp_buf_u64(b, m->now_ms);
    kvp_buf_put(b, m->session, KVP_SESSION_LEN);
    size_t vl = strnlen(m->server_version, KVP_SERVER_VERSION_MAX);
    kvp_buf_bytes(b, m->server_version, (uint32_t)vl);
}

int kvp_dec_hello_resp(const uint8_t *p, uint32_t len, kvp_msg_hello_resp *m)
{
    DEC_BEGIN;
    m->version = kvp_rd_u32(&r);
    m->master_id = kvp_rd_u64(&r);
    m->max_frame = kvp_rd_u32(&r);
    m->lease_ttl_ms = kvp_rd_u32(&r);
    m->client_ttl_ms = kvp_rd_u32(&r);
    m->now_ms = kvp_rd_u64(&r);
    const uint8_t *sess = kvp_rd_raw(&r, KVP_SESSION_LEN);
    if (sess)
        memcpy(m->session, sess, KVP_SESSION_LEN);
    uint32_t vl = kvp_rd_u32(&r);
    const uint8_t *v = vl <= KVP_SERVER_VERSION_MAX ? kvp_rd_raw(&r, vl) : NULL;
    memset(m->server_version, 0, sizeof m->server_version);
    if (!v && vl) {
        rd_fail(&r);
    } else {
        for (uint32_t i = 0; i < vl; i++) {
            if (v[i] < 0x20 || v[i] > 0x7e) /* shown to operators as is */
                rd_fail(&r);
            m->server_version[i] = (char)v[i];
        }
    }
    DEC_END;
}

void kvp_enc_hello_backoff(kvp_buf *b, const kvp_msg_hello_backoff *m)
{
    kvp_buf_u32(b, m->retry_ms);
    wr_bytes(b, m->addr);
}

int kvp_dec_hello_backoff(const uint8_t *p, uint32_t len, kvp_msg_hello_backoff *m)
{
    DEC_BEGIN;
    m->retry_ms = kvp_rd_u32(&r);
    m->addr = kvp_rd_bytes(&r, KVP_BACKOFF_ADDR_MAX);
    for (uint32_t i = 0; i < m->addr.len; i++)
        if (m->addr.p[i] < 0x21 || m->addr.p[i] > 0x7e) /* printed in messages */
            rd_fail(&r);
    DEC_END;
}

/* --------------------------------------------------------------- mount */

/* Per segment: the seg_desc encoding, then u64 secret. */
void kvp_enc_mount(kvp_buf *b, const kvp_msg_mount *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        wr_seg(b, &m->segs[i]);
        kvp_buf_u64(b, m->segs[i].secret);
        kvp_buf_u32(b, m->segs[i].epoch);
        kvp_buf_u64(b, m->segs[i].disk_capacity);
    }
}

int kvp_dec_mount(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                  kvp_msg_mount *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, MIN_MOUNT_SEG);
    if (!ALLOC_ARRAY(a, m->segs, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        if (rd_seg(&r, l, a, &m->segs[i]))
            return KVP_ENOMEM;
        m->segs[i].secret = kvp_rd_u64(&r);
        m->segs[i].epoch = kvp_rd_u32(&r);
        m->segs[i].disk_capacity = kvp_rd_u64(&r);
    }
    DEC_END;
}

/* ----------------------------------------------------------------- ids */

void kvp_enc_ids(kvp_buf *b, const kvp_msg_ids *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvp_buf_u64(b, m->ids[i]);
}

int kvp_dec_ids(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                kvp_msg_ids *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, 8);
    if (!ALLOC_ARRAY(a, m->ids, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n; i++)
        m->ids[i] = kvp_rd_u64(&r);
    DEC_END;
}

/* ----------------------------------------------------------- heartbeat */

void kvp_enc_heartbeat(kvp_buf *b, const kvp_msg_heartbeat *m)
{
    if (m->version != KVP_HB_REPORT_V1 || m->npaths < 1 || m->npaths > KVP_HB_MAX_PATHS) {
        if (!b->err)
            b->err = KVP_EINVALID_PARAMS;
        return;
    }
    kvp_buf_u8(b, m->version);
    kvp_buf_u8(b, m->npaths);
    for (unsigned i = 0; i < m->npaths; i++) {
        kvp_buf_u64(b, m->paths[i].put_bytes);
        kvp_buf_u64(b, m->paths[i].get_bytes);
        kvp_buf_u64(b, m->paths[i].put_ops);
        kvp_buf_u64(b, m->paths[i].get_ops);
    }
}

/* Paths the report does not carry read 0. */
int kvp_dec_heartbeat(const uint8_t *p, uint32_t len, kvp_msg_heartbeat *m)
{
    DEC_BEGIN;
    memset(m, 0, sizeof *m);
    m->version = kvp_rd_u8(&r);
    m->npaths = kvp_rd_u8(&r);
    if (m->version != KVP_HB_REPORT_V1 || m->npaths < 1 || m->npaths > KVP_HB_MAX_PATHS ||
        kvp_rd_left(&r) != (size_t)m->npaths * KVP_HB_PATH_SIZE)
        return rd_fail(&r);
    for (unsigned i = 0; i < m->npaths; i++) {
        m->paths[i].put_bytes = kvp_rd_u64(&r);
        m->paths[i].get_bytes = kvp_rd_u64(&r);
        m->paths[i].put_ops = kvp_rd_u64(&r);
        m->paths[i].get_ops = kvp_rd_u64(&r);
    }
    DEC_END;
}

void kvp_enc_heartbeat_resp(kvp_buf *b, const kvp_msg_heartbeat_resp *m)
{
    kvp_buf_u64(b, m->master_id);
    kvp_buf_u32(b, m->n_segments);
    kvp_buf_u64(b, m->now_ms);
}

int kvp_dec_heartbeat_resp(const uint8_t *p, uint32_t len, kvp_msg_heartbeat_resp *m)
{
    DEC_BEGIN;
    m->master_id = kvp_rd_u64(&r);
    m->n_segments = kvp_rd_u32(&r);
    m->now_ms = kvp_rd_u64(&r);
    DEC_END;
}

/* ------------------------------------------------------------- results */

void kvp_enc_results(kvp_buf *b, const kvp_msg_results *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvp_buf_i32(b, m->codes[i]);
}

int kvp_dec_results(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                    kvp_msg_results *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, 4);
    if (!ALLOC_ARRAY(a, m->codes, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n; i++)
        m->codes[i] = kvp_rd_i32(&r);
    DEC_END;
}

/* ---------------------------------------------------------------- keys */

void kvp_enc_keys(kvp_buf *b, const kvp_msg_keys *m)
{
    wr_bytes(b, m->tenant);
    wr_key_batch(b, m->n, m->keys);
}

int kvp_dec_keys(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                 kvp_msg_keys *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    if (rd_key_batch(&r, l, a, &m->n, &m->keys))
        return KVP_ENOMEM;
    DEC_END;
}

/* ----------------------------------------------------------- put_start */

void kvp_enc_put_start(kvp_buf *b, const kvp_msg_put_start *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u32(b, m->replicas);
    kvp_buf_u32(b, m->flags);
    kvp_buf_u64(b, m->soft_ttl_ms);
    wr_bytes(b, m->preferred);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        wr_bytes(b, m->keys[i]);
        kvp_buf_u64(b, m->sizes[i]);
        if (m->flags & KVP_PUT_F_BLOCKS) {
            const kvp_blkinfo *k = &m->blocks[i];
            kvp_buf_u64(b, k->hash);
            kvp_buf_u64(b, k->parent);
            kvp_buf_u32(b, k->block_size);
            kvp_buf_u16(b, k->parts);
            kvp_buf_u8(b, k->group);
            kvp_buf_u8(b, k->flags);
        }
    }
}

int kvp_dec_put_start(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                      kvp_msg_put_start *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->replicas = kvp_rd_u32(&r);
    m->flags = kvp_rd_u32(&r);
    m->soft_ttl_ms = kvp_rd_u64(&r);
    m->preferred = kvp_rd_bytes(&r, l->max_str);
    int blocks = (m->flags & KVP_PUT_F_BLOCKS) != 0;
    m->n = kvp_rd_count(&r, l->max_batch, MIN_KEY + 8 + (blocks ? KVP_BLK_SIZE : 0));
    m->blocks = NULL;
    if (!ALLOC_ARRAY(a, m->keys, m->n) || !ALLOC_ARRAY(a, m->sizes, m->n) ||
        (blocks && !ALLOC_ARRAY(a, m->blocks, m->n)))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        m->keys[i] = rd_key(&r, l);
        m->sizes[i] = kvp_rd_u64(&r);
        if (blocks) {
            kvp_blkinfo *k = &m->blocks[i];
            k->hash = kvp_rd_u64(&r);
            k->parent = kvp_rd_u64(&r);
            k->block_size = kvp_rd_u32(&r);
            k->parts = kvp_rd_u16(&r);
            k->group = kvp_rd_u8(&r);
            k->flags = kvp_rd_u8(&r);
            if (k->flags & ~(KVP_BLK_F_PARENT | KVP_BLK_F_NONE))
                return rd_fail(&r);
        }
    }
    DEC_END;
}

/* ------------------------------------------------------- lookup_hashes */

void kvp_enc_lookup_hashes(kvp_buf *b, const kvp_msg_lookup_hashes *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_buf_u8(b, m->chains[i].group);
        kvp_buf_u32(b, m->chains[i].n);
        for (uint32_t j = 0; j < m->chains[i].n; j++)
            kvp_buf_u64(b, m->chains[i].hashes[j]);
    }
}

int kvp_dec_lookup_hashes(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                          kvp_arena *a, kvp_msg_lookup_hashes *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->n = kvp_rd_count(&r, l->max_batch, 1 + 4);
    if (!ALLOC_ARRAY(a, m->chains, m->n))
        return KVP_ENOMEM;
    uint64_t total = 0;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_hchain *c = &m->chains[i];
        c->group = kvp_rd_u8(&r);
        c->n = kvp_rd_count(&r, l->max_batch, 8);
        total += c->n;
        if (total > l->max_batch)
            return rd_fail(&r);
        if (!ALLOC_ARRAY(a, c->hashes, c->n))
            return KVP_ENOMEM;
        for (uint32_t j = 0; j < c->n && !r.err; j++)
            c->hashes[j] = kvp_rd_u64(&r);
    }
    DEC_END;
}

void kvp_enc_lookup_hashes_resp(kvp_buf *b, const kvp_msg_lookup_hashes_resp *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_buf_u32(b, m->prefix[i].dram);
        kvp_buf_u32(b, m->prefix[i].disk);
        kvp_buf_u32(b, m->prefix[i].any);
    }
}

int kvp_dec_lookup_hashes_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                               kvp_arena *a, kvp_msg_lookup_hashes_resp *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, 12);
    if (!ALLOC_ARRAY(a, m->prefix, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        m->prefix[i].dram = kvp_rd_u32(&r);
        m->prefix[i].disk = kvp_rd_u32(&r);
        m->prefix[i].any = kvp_rd_u32(&r);
    }
    DEC_END;
}

/* --------------------------------------------------------- kv_snapshot */

void kvp_enc_kv_snapshot_resp(kvp_buf *b, const kvp_msg_kv_snapshot_resp *m)
{
    kvp_buf_u64(b, m->seq);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_buf_u64(b, m->blocks[i].hash);
        kvp_buf_u8(b, m->blocks[i].group);
        kvp_buf_u8(b, m->blocks[i].tier);
    }
}

int kvp_dec_kv_snapshot_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                             kvp_arena *a, kvp_msg_kv_snapshot_resp *m)
{
    (void)l; /* bounded by the frame: a snapshot is not a request batch */
    DEC_BEGIN;
    m->seq = kvp_rd_u64(&r);
    m->n = kvp_rd_count(&r, UINT32_MAX, KVP_SNAP_BLK_SIZE);
    if (!ALLOC_ARRAY(a, m->blocks, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        m->blocks[i].hash = kvp_rd_u64(&r);
        m->blocks[i].group = kvp_rd_u8(&r);
        m->blocks[i].tier = kvp_rd_u8(&r);
    }
    DEC_END;
}

/* --------------------------------------------------------- exist_lease */

void kvp_enc_exist_lease_resp(kvp_buf *b, const kvp_msg_exist_lease_resp *m)
{
    kvp_buf_u32(b, m->lease_ttl_ms);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_buf_u8(b, m->ents[i].state);
        kvp_buf_u64(b, m->ents[i].size);
        kvp_buf_u64(b, m->ents[i].lease_id);
    }
}

int kvp_dec_exist_lease_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                             kvp_arena *a, kvp_msg_exist_lease_resp *m)
{
    DEC_BEGIN;
    m->lease_ttl_ms = kvp_rd_u32(&r);
    m->n = kvp_rd_count(&r, l->max_batch, KVP_XL_ENT_SIZE);
    if (!ALLOC_ARRAY(a, m->ents, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_xl_ent *e = &m->ents[i];
        e->state = kvp_rd_u8(&r);
        e->size = kvp_rd_u64(&r);
        e->lease_id = kvp_rd_u64(&r);
        if (r.err)
            break;
        if (e->state > KVP_XL_DISK || (e->state == KVP_XL_ABSENT) != (e->size == 0) ||
            (e->state != KVP_XL_LEASED && e->lease_id != 0))
            return rd_fail(&r);
    }
    DEC_END;
}

/* status; when 0, the replicas. */
void kvp_enc_put_result(kvp_buf *b, const kvp_put_result *res)
{
    kvp_buf_i32(b, res->status);
    if (res->status == 0)
        wr_replicas(b, res->n_replicas, res->replicas);
}

void kvp_enc_put_start_resp(kvp_buf *b, const kvp_msg_put_start_resp *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvp_enc_put_result(b, &m->results[i]);
}

/* A failed result has n_replicas 0 and zeroed replicas. */
int kvp_dec_put_start_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                           kvp_arena *a, kvp_msg_put_start_resp *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, MIN_STATUS);
    if (!ALLOC_ARRAY(a, m->results, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_put_result *res = &m->results[i];
        memset(res, 0, sizeof *res);
        res->status = kvp_rd_i32(&r);
        if (res->status == 0)
            rd_replicas(&r, &res->n_replicas, res->replicas);
    }
    DEC_END;
}

/* ------------------------------------------------------------- put_end */

void kvp_enc_put_end(kvp_buf *b, const kvp_msg_put_end *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        wr_bytes(b, m->keys[i]);
        kvp_buf_u64(b, m->checksums[i]);
    }
}

int kvp_dec_put_end(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                    kvp_msg_put_end *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->n = kvp_rd_count(&r, l->max_batch, MIN_KEY + 8);
    if (!ALLOC_ARRAY(a, m->keys, m->n) || !ALLOC_ARRAY(a, m->checksums, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        m->keys[i] = rd_key(&r, l);
        m->checksums[i] = kvp_rd_u64(&r);
    }
    DEC_END;
}

/* ----------------------------------------------------------------- get */

/* status; when 0: size, checksum, lease_id, replicas. */
void kvp_enc_get_result(kvp_buf *b, const kvp_get_result *res)
{
    kvp_buf_i32(b, res->status);
    if (res->status == KVP_EOBJECT_LOADING) { /* what is known of a value on disk */
        kvp_buf_u64(b, res->size);
        kvp_buf_u64(b, res->checksum);
        return;
    }
    if (res->status != 0)
        return;
    kvp_buf_u64(b, res->size);
    kvp_buf_u64(b, res->checksum);
    kvp_buf_u64(b, res->lease_id);
    wr_replicas(b, res->n_replicas, res->replicas);
}

void kvp_enc_get_resp(kvp_buf *b, const kvp_msg_get_resp *m)
{
    kvp_buf_u32(b, m->lease_ttl_ms);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvp_enc_get_result(b, &m->results[i]);
}

/* A failed result has every other field zero. */
int kvp_dec_get_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                     kvp_msg_get_resp *m)
{
    DEC_BEGIN;
    m->lease_ttl_ms = kvp_rd_u32(&r);
    m->n = kvp_rd_count(&r, l->max_batch, MIN_STATUS);
    if (!ALLOC_ARRAY(a, m->results, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_get_result *res = &m->results[i];
        memset(res, 0, sizeof *res);
        res->status = kvp_rd_i32(&r);
        if (res->status == KVP_EOBJECT_LOADING) {
            res->size = kvp_rd_u64(&r);
            res->checksum = kvp_rd_u64(&r);
            continue;
        }
        if (res->status != 0)
            continue;
        res->size = kvp_rd_u64(&r);
        res->checksum = kvp_rd_u64(&r);
        res->lease_id = kvp_rd_u64(&r);
        rd_replicas(&r, &res->n_replicas, res->replicas);
    }
    DEC_END;
}

/* -------------------------------------------------------------- prefix */

void kvp_enc_prefix_resp(kvp_buf *b, const kvp_msg_prefix_resp *m) { kvp_buf_u32(b, m->count); }

int kvp_dec_prefix_resp(const uint8_t *p, uint32_t len, kvp_msg_prefix_resp *m)
{
    DEC_BEGIN;
    m->count = kvp_rd_u32(&r);
    DEC_END;
}

/* -------------------------------------------------------------- remove */

/* force is a boolean on the wire: any non-zero value is sent as 1. */
void kvp_enc_remove(kvp_buf *b, const kvp_msg_remove *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u8(b, m->force != 0);
    wr_key_batch(b, m->n, m->keys);
}

/* force must be 0 or 1. */
static uint8_t rd_force(kvp_rd *r)
{
    uint8_t f = kvp_rd_u8(r);
    if (f > 1)
        rd_fail(r);
    return f;
}

int kvp_dec_remove(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                   kvp_msg_remove *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->force = rd_force(&r);
    if (rd_key_batch(&r, l, a, &m->n, &m->keys))
        return KVP_ENOMEM;
    DEC_END;
}

void kvp_enc_remove_all(kvp_buf *b, const kvp_msg_remove_all *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u8(b, m->force != 0);
}

int kvp_dec_remove_all(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                       kvp_msg_remove_all *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->force = rd_force(&r);
    DEC_END;
}

void kvp_enc_remove_regex(kvp_buf *b, const kvp_msg_remove_regex *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u8(b, m->force != 0);
    wr_bytes(b, m->pattern);
}

int kvp_dec_remove_regex(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                         kvp_msg_remove_regex *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->force = rd_force(&r);
    m->pattern = kvp_rd_bytes(&r, KVP_REGEX_MAX);
    DEC_END;
}

void kvp_enc_remove_all_resp(kvp_buf *b, const kvp_msg_remove_all_resp *m)
{
    kvp_buf_u64(b, m->removed);
}

int kvp_dec_remove_all_resp(const uint8_t *p, uint32_t len, kvp_msg_remove_all_resp *m)
{
    DEC_BEGIN;
    m->removed = kvp_rd_u64(&r);
    DEC_END;
}

/* --------------------------------------------------------------- stats */

void kvp_enc_stats_resp(kvp_buf *b, const kvp_msg_stats_resp *m)
{
    kvp_buf_u32(b, m->n_counters);
    for (uint32_t i = 0; i < m->n_counters; i++)
        kvp_buf_u64(b, m->counters[i]);
    kvp_buf_u32(b, m->n_segs);
    for (uint32_t i = 0; i < m->n_segs; i++) {
        const kvp_seg_stat *s = &m->segs[i];
        kvp_buf_u64(b, s->id);
        wr_bytes(b, s->name);
        kvp_buf_u64(b, s->capacity);
        kvp_buf_u64(b, s->used);
        kvp_buf_u64(b, s->objects);
        kvp_buf_u64(b, s->largest_free);
    }
    kvp_buf_u32(b, m->n_tenants);
    for (uint32_t i = 0; i < m->n_tenants; i++) {
        const kvp_tenant_stat *t = &m->tenants[i];
        wr_bytes(b, t->name);
        kvp_buf_u64(b, t->objects);
        kvp_buf_u64(b, t->bytes);
        kvp_buf_u64(b, t->pool_bytes);
        kvp_buf_u64(b, t->max_bytes);
        kvp_buf_u64(b, t->max_objects);
        kvp_buf_u64(b, t->evictions);
        kvp_buf_u64(b, t->refused);
        kvp_buf_u32(b, t->share);
    }
}

int kvp_dec_stats_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                       kvp_msg_stats_resp *m)
{
    DEC_BEGIN;
    m->n_counters = kvp_rd_count(&r, MAX_COUNTERS, 8);
    if (!ALLOC_ARRAY(a, m->counters, m->n_counters))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n_counters; i++)
        m->counters[i] = kvp_rd_u64(&r);
    m->n_segs = kvp_rd_count(&r, l->max_batch, MIN_SEG_STAT);
    if (!ALLOC_ARRAY(a, m->segs, m->n_segs))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n_segs && !r.err; i++) {
        kvp_seg_stat *s = &m->segs[i];
        s->id = kvp_rd_u64(&r);
        s->name = kvp_rd_bytes(&r, l->max_str);
        s->capacity = kvp_rd_u64(&r);
        s->used = kvp_rd_u64(&r);
        s->objects = kvp_rd_u64(&r);
        s->largest_free = kvp_rd_u64(&r);
    }
    m->n_tenants = kvp_rd_count(&r, l->max_batch, MIN_TENANT_STAT);
    if (!ALLOC_ARRAY(a, m->tenants, m->n_tenants))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n_tenants && !r.err; i++) {
        kvp_tenant_stat *t = &m->tenants[i];
        t->name = kvp_rd_bytes(&r, l->max_str);
        t->objects = kvp_rd_u64(&r);
        t->bytes = kvp_rd_u64(&r);
        t->pool_bytes = kvp_rd_u64(&r);
        t->max_bytes = kvp_rd_u64(&r);
        t->max_objects = kvp_rd_u64(&r);
        t->evictions = kvp_rd_u64(&r);
        t->refused = kvp_rd_u64(&r);
        t->share = kvp_rd_u32(&r);
    }
    DEC_END;
}

/* ------------------------------------------------------------ configs */

void kvp_enc_configs_resp(kvp_buf *b, const kvp_msg_configs_resp *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        const kvp_config_stat *c = &m->rows[i];
        wr_bytes(b, c->tenant);
        wr_bytes(b, c->name);
        wr_bytes(b, c->fp);
        kvp_buf_u64(b, c->objects);
        kvp_buf_u64(b, c->bytes);
    }
}

/* empty, or 12..32 lower-case hex digits (src/connector/keys.h) */
static int fp_ok(kvp_bytes fp)
{
    if (fp.len == 0)
        return 1;
    if (fp.len < 12 || fp.len > 32)
        return 0;
    for (uint32_t i = 0; i < fp.len; i++)
        if (!((fp.p[i] >= '0' && fp.p[i] <= '9') || (fp.p[i] >= 'a' && fp.p[i] <= 'f')))
            return 0;
    return 1;
}

int kvp_dec_configs_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                         kvp_msg_configs_resp *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, MIN_CONFIG_STAT);
    if (!ALLOC_ARRAY(a, m->rows, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_config_stat *c = &m->rows[i];
        c->tenant = kvp_rd_bytes(&r, l->max_str);
        c->name = kvp_rd_bytes(&r, l->max_str);
        c->fp = kvp_rd_bytes(&r, 32);
        c->objects = kvp_rd_u64(&r);
        c->bytes = kvp_rd_u64(&r);
        if (!r.err && (!fp_ok(c->fp) || (c->fp.len == 0 && c->name.len != 0)))
            r.err = KVP_EPROTOCOL;
    }
    DEC_END;
}

/* ------------------------------------------------------------ seg_info */

void kvp_enc_seg_info_resp(kvp_buf *b, const kvp_msg_seg_info_resp *m)
{
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_buf_i32(b, m->infos[i].status);
        if (m->infos[i].status == 0)
            wr_seg(b, &m->infos[i].desc);
    }
}

/* A failed item has a zeroed desc. */
int kvp_dec_seg_info_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                          kvp_arena *a, kvp_msg_seg_info_resp *m)
{
    DEC_BEGIN;
    m->n = kvp_rd_count(&r, l->max_batch, MIN_STATUS);
    if (!ALLOC_ARRAY(a, m->infos, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_seg_info *s = &m->infos[i];
        memset(s, 0, sizeof *s);
        s->status = kvp_rd_i32(&r);
        if (s->status == 0 && rd_seg(&r, l, a, &s->desc))
            return KVP_ENOMEM;
    }
    DEC_END;
}

/* ------------------------------------------------------- storage node io */

uint64_t kvp_replica_tag(uint64_t secret, const kvp_replica *r)
{
    uint8_t b[48];
    st_le(b, r->segment_id, 8);
    st_le(b + 8, r->offset, 8);
    st_le(b + 16, r->length, 8);
    st_le(b + 24, r->generation, 8);
    st_le(b + 32, r->expires_ms, 8);
    st_le(b + 40, r->access, 8);
    return XXH3_64bits_withSeed(b, sizeof b, secret);
}

void kvp_enc_seg_io(kvp_buf *b, const kvp_replica *r) { wr_rep(b, r); }

int kvp_dec_seg_io(const uint8_t *p, uint32_t len, kvp_replica *out)
{
    if (len < KVP_SEG_IO_SIZE)
        return KVP_EPROTOCOL;
    kvp_rd r;
    kvp_rd_init(&r, p, KVP_SEG_IO_SIZE);
    rd_rep(&r, out);
    return kvp_rd_finish(&r);
}

/* ------------------------------------------------- freed, bad replicas */

void kvp_enc_seg_freed(kvp_buf *b, const kvp_msg_seg_freed *m)
{
    kvp_buf_u64(b, m->segment_id);
    kvp_buf_u64(b, m->seq);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_buf_u32(b, m->freed[i].page);
        kvp_buf_u32(b, m->freed[i].pages);
        kvp_buf_u64(b, m->freed[i].generation);
        kvp_buf_u32(b, m->freed[i].flags);
    }
}

int kvp_dec_seg_freed(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                      kvp_msg_seg_freed *m)
{
    DEC_BEGIN;
    m->segment_id = kvp_rd_u64(&r);
    m->seq = kvp_rd_u64(&r);
    m->n = kvp_rd_count(&r, l->max_batch, KVP_FREED_SIZE);
    if (!ALLOC_ARRAY(a, m->freed, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n; i++) {
        m->freed[i].page = kvp_rd_u32(&r);
        m->freed[i].pages = kvp_rd_u32(&r);
        m->freed[i].generation = kvp_rd_u64(&r);
        m->freed[i].flags = kvp_rd_u32(&r);
    }
    DEC_END;
}

void kvp_enc_disk_ent(kvp_buf *b, const kvp_disk_ent *e)
{
    kvp_buf_u8(b, e->what);
    kvp_buf_u32(b, (uint32_t)e->status);
    wr_bytes(b, e->tenant);
    wr_bytes(b, e->key);
    kvp_buf_u64(b, e->size);
    kvp_buf_u64(b, e->checksum);
    kvp_buf_u32(b, e->page);
    kvp_buf_u64(b, e->generation);
    kvp_buf_u32(b, e->rec);
}

void kvp_enc_disk(kvp_buf *b, const kvp_msg_disk *m)
{
    kvp_buf_u64(b, m->segment_id);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvp_enc_disk_ent(b, &m->e[i]);
}

int kvp_dec_disk(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                 kvp_msg_disk *m)
{
    DEC_BEGIN;
    m->segment_id = kvp_rd_u64(&r);
    m->n = kvp_rd_count(&r, l->max_batch, KVP_DISK_ENT_FIXED + 1);
    if (!ALLOC_ARRAY(a, m->e, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        kvp_disk_ent *e = &m->e[i];
        e->what = kvp_rd_u8(&r);
        e->status = (int32_t)kvp_rd_u32(&r);
        e->tenant = kvp_rd_bytes(&r, l->max_str);
        e->key = rd_key(&r, l);
        e->size = kvp_rd_u64(&r);
        e->checksum = kvp_rd_u64(&r);
        e->page = kvp_rd_u32(&r);
        e->generation = kvp_rd_u64(&r);
        e->rec = kvp_rd_u32(&r);
        if (e->what < KVP_DISK_SPILL || e->what > KVP_DISK_USAGE)
            rd_fail(&r);
        /* only FORGET, a durable SPILLED, HAVE and GONE name a record */
        int names = e->what == KVP_DISK_FORGET || e->what == KVP_DISK_HAVE ||
                    e->what == KVP_DISK_GONE || (e->what == KVP_DISK_SPILLED && e->status == 0);
        if (e->rec && !names)
            rd_fail(&r);
    }
    DEC_END;
}

void kvp_enc_replica_bad(kvp_buf *b, const kvp_msg_replica_bad *m)
{
    wr_bytes(b, m->tenant);
    kvp_buf_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        wr_bytes(b, m->bad[i].key);
        kvp_buf_u64(b, m->bad[i].segment_id);
        kvp_buf_u64(b, m->bad[i].generation);
    }
}

int kvp_dec_replica_bad(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                        kvp_msg_replica_bad *m)
{
    DEC_BEGIN;
    m->tenant = kvp_rd_bytes(&r, l->max_str);
    m->n = kvp_rd_count(&r, l->max_batch, MIN_BYTES + 16);
    if (!ALLOC_ARRAY(a, m->bad, m->n))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        m->bad[i].key = kvp_rd_bytes(&r, l->max_key);
        m->bad[i].segment_id = kvp_rd_u64(&r);
        m->bad[i].generation = kvp_rd_u64(&r);
    }
    DEC_END;
}

/* ----------------------------------------------------------- ucx attach */

void kvp_enc_ucx_attach(kvp_buf *b, const kvp_msg_ucx_attach *m)
{
    kvp_buf_u64(b, m->base);
    kvp_buf_u64(b, m->size);
    wr_bytes(b, m->addr);
    wr_bytes(b, m->rkey);
}

int kvp_dec_ucx_attach(const uint8_t *p, uint32_t len, kvp_msg_ucx_attach *m)
{
    DEC_BEGIN;
    m->base = kvp_rd_u64(&r);
    m->size = kvp_rd_u64(&r);
    m->addr = kvp_rd_bytes(&r, KVP_UCX_BLOB_MAX);
    m->rkey = kvp_rd_bytes(&r, KVP_UCX_BLOB_MAX);
    if (!r.err && (m->size == 0 || m->base + m->size < m->base || m->addr.len == 0 ||
                   m->rkey.len == 0))
        rd_fail(&r);
    DEC_END;
}
