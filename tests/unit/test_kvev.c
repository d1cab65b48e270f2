/* test_kvev.c -- KV-cache events in vLLM's wire format (src/master/kvev.c).
 *
 * The encoding, decoded with msgpack-c's unpacker: the exact structure of
 * each vLLM event (keys in order, nil fields, a hash above INT64_MAX as
 * uint64) and the merging rules (a chain of stored blocks merges, a broken
 * chain or another medium, group or block size splits; removed blocks
 * merge; cleared stands alone). The replay request parser. The publisher
 * over real sockets: a SUB receives (topic, seq, payload) for the topics it
 * subscribed to; a DEALER gets the buffered batches from a seq on, in both
 * request forms, then the end marker; the ring's bounds drop the oldest;
 * malformed requests are ignored and the socket keeps serving; a client
 * that does not read pauses its replay at the HWM and loses nothing; the
 * queue bound drops and counts; destroy with batches queued neither leaks
 * nor hangs; replay clients that never read (raw ZMTP peers) share the
 * ring's batches instead of pinning a copy each, and what they hold beyond
 * the ring is counted and bounded. */
#include <arpa/inet.h>
#include <errno.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "harness.h"
#include "kvpool.h"
#include "master/kvev.h"

/* ------------------------------------------------------------ helpers */

static kvp_kvev stored(uint64_t hash, int has_parent, uint64_t parent, uint8_t medium,
                       uint8_t group, uint32_t block_size)
{
    return (kvp_kvev){.hash = hash, .parent = parent, .block_size = block_size,
                      .type = KVP_KVEV_STORED, .medium = medium, .group = group,
                      .has_parent = (uint8_t)has_parent};
}

static kvp_kvev removed(uint64_t hash, uint8_t medium, uint8_t group)
{
    return (kvp_kvev){.hash = hash, .type = KVP_KVEV_REMOVED, .medium = medium, .group = group};
}

static kvp_kvev cleared(void) { return (kvp_kvev){.type = KVP_KVEV_CLEARED}; }

static int str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static int uint_is(const msgpack_object *o, uint64_t v)
{
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == v;
}

/* A decoded batch: its events' objects (valid until unpacked_destroy). */
typedef struct decoded {
    msgpack_unpacked u;
    double ts;
    const msgpack_object *ev;
    uint32_t nev;
} decoded;

/* Unpacks one KVEventBatch filling d; 0, or -1 when the bytes are not
 * exactly [float64, [map...]] (the caller destroys d->u either way). */
static int decode(decoded *d, const void *p, size_t len)
{
    msgpack_unpacked_init(&d->u);
    size_t off = 0;
    REQUIRE(msgpack_unpack_next(&d->u, p, len, &off) == MSGPACK_UNPACK_SUCCESS);
    REQUIRE(off == len);
    const msgpack_object *o = &d->u.data;
    REQUIRE(o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 3);
    REQUIRE(o->via.array.ptr[2].type == MSGPACK_OBJECT_NIL); /* data_parallel_rank */
    REQUIRE(o->via.array.ptr[0].type == MSGPACK_OBJECT_FLOAT64);
    REQUIRE(o->via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY);
    d->ts = o->via.array.ptr[0].via.f64;
    d->ev = o->via.array.ptr[1].via.array.ptr;
    d->nev = o->via.array.ptr[1].via.array.size;
    for (uint32_t i = 0; i < d->nev; i++)
        REQUIRE(d->ev[i].type == MSGPACK_OBJECT_MAP);
    return 0;
}

/* The event e is exactly a BlockStored (every key in order) of the hashes
 * h[0..nh), parent (has_parent or nil), block size, medium and group. */
static int is_stored(const msgpack_object *e, const uint64_t *h, uint32_t nh, int has_parent,
                     uint64_t parent, uint32_t block_size, const char *medium, uint8_t group)
{
    static const char *const keys[] = {"type", "block_hashes", "parent_block_hash", "token_ids",
                                       "block_size", "lora_id", "medium", "lora_name",
                                       "group_idx", "locality"};
    REQUIRE(e->type == MSGPACK_OBJECT_MAP && e->via.map.size == 10);
    const msgpack_object_kv *kv = e->via.map.ptr;
    for (int i = 0; i < 10; i++)
        REQUIRE(str_is(&kv[i].key, keys[i]));
    REQUIRE(str_is(&kv[0].val, "BlockStored"));
    REQUIRE(kv[1].val.type == MSGPACK_OBJECT_ARRAY && kv[1].val.via.array.size == nh);
    for (uint32_t i = 0; i < nh; i++)
        REQUIRE(uint_is(&kv[1].val.via.array.ptr[i], h[i]));
    if (has_parent)
        REQUIRE(uint_is(&kv[2].val, parent));
    else
        REQUIRE(kv[2].val.type == MSGPACK_OBJECT_NIL);
    REQUIRE(kv[3].val.type == MSGPACK_OBJECT_ARRAY && kv[3].val.via.array.size == 0);
    REQUIRE(uint_is(&kv[4].val, block_size));
    REQUIRE(kv[5].val.type == MSGPACK_OBJECT_NIL);
    REQUIRE(str_is(&kv[6].val, medium));
    REQUIRE(kv[7].val.type == MSGPACK_OBJECT_NIL);
    REQUIRE(uint_is(&kv[8].val, group));
    REQUIRE(str_is(&kv[9].val, "REMOTE"));
    return 0;
}

static int is_removed(const msgpack_object *e, const uint64_t *h, uint32_t nh,
                      const char *medium, uint8_t group)
{
    static const char *const keys[] = {"type", "block_hashes", "medium", "group_idx", "locality"};
    REQUIRE(e->type == MSGPACK_OBJECT_MAP && e->via.map.size == 5);
    const msgpack_object_kv *kv = e->via.map.ptr;
    for (int i = 0; i < 5; i++)
        REQUIRE(str_is(&kv[i].key, keys[i]));
    REQUIRE(str_is(&kv[0].val, "BlockRemoved"));
    REQUIRE(kv[1].val.type == MSGPACK_OBJECT_ARRAY && kv[1].val.via.array.size == nh);
    for (uint32_t i = 0; i < nh; i++)
        REQUIRE(uint_is(&kv[1].val.via.array.ptr[i], h[i]));
    REQUIRE(str_is(&kv[2].val, medium));
    REQUIRE(uint_is(&kv[3].val, group));
    REQUIRE(str_is(&kv[4].val, "REMOTE"));
    return 0;
}

static int is_cleared(const msgpack_object *e)
{
    REQUIRE(e->type == MSGPACK_OBJECT_MAP && e->via.map.size == 1);
    REQUIRE(str_is(&e->via.map.ptr[0].key, "type"));
    REQUIRE(str_is(&e->via.map.ptr[0].val, "AllBlocksCleared"));
    return 0;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* One received multipart message, each frame copied (at most MAXF). */
#define MAXF 8
typedef struct msg {
    size_t n;
    size_t len[MAXF];
    uint8_t *f[MAXF];
} msg;

static void msg_free(msg *m)
{
    for (size_t i = 0; i < m->n && i < MAXF; i++)
        free(m->f[i]);
    m->n = 0;
}

/* Receives one message from sock within timeout_ms: 0, or -1 (none). */
static int recv_msg(void *sock, msg *m, int timeout_ms)
{
    m->n = 0;
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) != 1)
        return -1;
    int more = 1;
    while (more) {
        zmq_msg_t z;
        zmq_msg_init(&z);
        if (zmq_msg_recv(&z, sock, 0) < 0) {
            zmq_msg_close(&z);
            return -1;
        }
        more = zmq_msg_more(&z);
        if (m->n < MAXF) {
            m->len[m->n] = zmq_msg_size(&z);
            m->f[m->n] = malloc(m->len[m->n] + 1);
            memcpy(m->f[m->n], zmq_msg_data(&z), m->len[m->n]);
        }
        m->n++;
        zmq_msg_close(&z);
    }
    return 0;
}

static int frame_is(const msg *m, size_t i, const void *p, size_t len)
{
    return i < m->n && m->len[i] == len && (len == 0 || memcmp(m->f[i], p, len) == 0);
}

/* recv_msg, dropping the messages whose topic (first frame) is skip. */
static int recv_skipping(void *sock, msg *m, const char *skip, int timeout_ms)
{
    for (;;) {
        if (recv_msg(sock, m, timeout_ms) != 0)
            return -1;
        if (!frame_is(m, 0, skip, strlen(skip)))
            return 0;
        msg_free(m);
    }
}

/* Sends frames f[0..n) (NUL-terminated strings unless lens given). */
static void send_frames(void *sock, const void *const *f, const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++)
        zmq_send(sock, f[i], lens ? lens[i] : strlen(f[i]), i + 1 < n ? ZMQ_SNDMORE : 0);
}

/* A replay request (DEALER: the empty delimiter first) for topic (NULL:
 * vLLM's form) from start. */
static void ask_replay(void *dealer, const char *topic, uint64_t start)
{
    uint8_t seq[8];
    put_be64(seq, start);
    if (topic) {
        const void *f[] = {"", topic, seq};
        size_t l[] = {0, strlen(topic), 8};
        send_frames(dealer, f, l, 3);
    } else {
        const void *f[] = {"", seq};
        size_t l[] = {0, 8};
        send_frames(dealer, f, l, 2);
    }
}

static const uint8_t END_SEQ[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

/* Receives a replay answer from a DEALER: the batches of topic, their seqs
 * into seqs[] (count in *n, at most max), each payload passed to check
 * when given, up to the end marker. 0, or -1 for anything else. */
static int recv_replay(void *dealer, const char *topic, uint64_t *seqs, size_t max, size_t *n,
                       int (*check)(uint64_t seq, const uint8_t *p, size_t len))
{
    *n = 0;
    for (;;) {
        msg m;
        REQUIRE(recv_msg(dealer, &m, 5000) == 0);
        int ok = m.n == 4 && frame_is(&m, 0, "", 0);
        if (ok && frame_is(&m, 1, "", 0) && frame_is(&m, 2, END_SEQ, 8) && frame_is(&m, 3, "", 0)) {
            msg_free(&m);
            return 0;
        }
        ok = ok && frame_is(&m, 1, topic, strlen(topic)) && m.len[2] == 8 && *n < max;
        if (ok) {
            uint64_t s = get_be64(m.f[2]);
            seqs[(*n)++] = s;
            ok = !check || check(s, m.f[3], m.len[3]) == 0;
        }
        msg_free(&m);
        REQUIRE(ok);
    }
}

static void *zctx;

static void *socket_to(int type, const char *ep)
{
    if (!zctx)
        zctx = zmq_ctx_new();
    void *s = zmq_socket(zctx, type);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(s, ep);
    return s;
}

static void close_all(void **socks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (socks[i])
            zmq_close(socks[i]);
    if (zctx)
        zmq_ctx_term(zctx);
    zctx = NULL;
}

static kvp_kvpub *make_pub(uint32_t buffer_batches, uint64_t buffer_bytes, uint64_t queue_bytes)
{
    kvp_kvpub_cfg cfg = {.pub = "tcp://127.0.0.1:0", .replay = "tcp://127.0.0.1:0",
                         .buffer_batches = buffer_batches, .buffer_bytes = buffer_bytes,
                         .queue_bytes = queue_bytes};
    kvp_kvpub *p = NULL;
    char err[256];
    if (kvp_kvpub_create(&cfg, &p, err, sizeof err) != 0) {
        fprintf(stderr, "kvp_kvpub_create: %s\n", err);
        return NULL;
    }
    return p;
}

/* Waits (5 s at most) until the publisher has sent `batches` batches. */
static int wait_sent(kvp_kvpub *p, uint64_t batches)
{
    uint64_t until = kvp_now_ms() + 5000;
    kvp_kvpub_stats st;
    do {
        kvp_kvpub_stats_get(p, &st);
        if (st.batches >= batches)
            return 0;
        usleep(1000);
    } while (kvp_now_ms() < until);
    return -1;
}

/* The events of a test batch: one stored block whose hash is the seq, on
 * a group named by the topic's first byte (so payloads differ per topic). */
static kvp_kvev batch_event(const char *topic, uint64_t seq)
{
    return stored(0x8000000000000000ull | seq, 0, 0, KVP_KVEV_DRAM, (uint8_t)topic[0], 16);
}

static double batch_ts(uint64_t seq) { return 1700000000.0 + (double)seq; }

static int submit_batch(kvp_kvpub *p, const char *topic, uint64_t seq)
{
    kvp_kvev e = batch_event(topic, seq);
    return kvp_kvpub_submit(p, topic, strlen(topic), seq, batch_ts(seq), &e, 1);
}

/* The payload of submit_batch(topic, seq) is exactly kvp_kvev_encode's. */
static const char *check_topic;
static int check_payload(uint64_t seq, const uint8_t *p, size_t len)
{
    kvp_kvev e = batch_event(check_topic, seq);
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    int ok = kvp_kvev_encode(&b, batch_ts(seq), &e, 1) == 0 && b.len == len &&
             memcmp(b.data, p, len) == 0;
    kvp_buf_free(&b);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------ encoding */

TEST(encode_one_stored_block_exactly)
{
    kvp_kvev e = stored(UINT64_MAX, 0, 0, KVP_KVEV_DRAM, 0, 16);
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    CHECK_EQ(kvp_kvev_encode(&b, 1700000000.25, &e, 1), 0);
    /* [ts as float64, [...], nil]: fixarray 3, 0xcb */
    CHECK(b.len > 10 && b.data[0] == 0x93 && b.data[1] == 0xcb && b.data[b.len - 1] == 0xc0);
    /* the hash above INT64_MAX is a msgpack uint64 (0xcf) */
    static const uint8_t u64max[9] = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    CHECK(memmem(b.data, b.len, u64max, sizeof u64max) != NULL);
    decoded d;
    int rc = decode(&d, b.data, b.len);
    if (rc == 0) {
        CHECK(d.ts == 1700000000.25);
        CHECK_EQ(d.nev, 1);
        uint64_t h = UINT64_MAX;
        CHECK_EQ(is_stored(&d.ev[0], &h, 1, 0, 0, 16, "kvpool-dram", 0), 0);
    }
    msgpack_unpacked_destroy(&d.u);
    kvp_buf_free(&b);
    CHECK_EQ(rc, 0);
}

TEST(encode_merges_as_vllm_does)
{
    const uint64_t H = 0x9000000000000000ull; /* above INT64_MAX */
    kvp_kvev ev[] = {
        /* 0-2: a chain: one BlockStored [H+1, H+2, H+3], parent nil */
        stored(H + 1, 0, 0, KVP_KVEV_DRAM, 0, 16),
        stored(H + 2, 1, H + 1, KVP_KVEV_DRAM, 0, 16),
        stored(H + 3, 1, H + 2, KVP_KVEV_DRAM, 0, 16),
        /* 3: parent is not the previous hash: a new one, parent 77 */
        stored(H + 4, 1, 77, KVP_KVEV_DRAM, 0, 16),
        /* 4: chained but on disk: a new one */
        stored(H + 5, 1, H + 4, KVP_KVEV_DISK, 0, 16),
        /* 5: chained, disk, but another group: a new one */
        stored(H + 6, 1, H + 5, KVP_KVEV_DISK, 1, 16),
        /* 6-7: chained, same medium and group, another block size: new;
         * then 7 chains onto 6 */
        stored(H + 7, 1, H + 6, KVP_KVEV_DISK, 1, 32),
        stored(H + 8, 1, H + 7, KVP_KVEV_DISK, 1, 32),
        /* 8: the right parent value but has_parent = 0: a new one, nil */
        stored(H + 9, 0, H + 8, KVP_KVEV_DISK, 1, 32),
        /* 9-10: removed, same medium and group: one BlockRemoved */
        removed(5, KVP_KVEV_DRAM, 0),
        removed(H + 1, KVP_KVEV_DRAM, 0),
        /* 11: another medium: a new one */
        removed(6, KVP_KVEV_DISK, 0),
        /* 12: another group: a new one */
        removed(7, KVP_KVEV_DISK, 3),
        /* 13, 14: cleared, each alone */
        cleared(),
        cleared(),
        /* 15: removed after cleared: new; 16: stored after removed: new */
        removed(8, KVP_KVEV_DISK, 3),
        stored(9, 1, 8, KVP_KVEV_DISK, 3, 16),
    };
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    CHECK_EQ(kvp_kvev_encode(&b, 2.5, ev, sizeof ev / sizeof ev[0]), 0);
    decoded d;
    int rc = decode(&d, b.data, b.len);
    if (rc == 0) {
        const msgpack_object *e = d.ev;
        rc = -1;
        CHECK_EQ(d.nev, 13);
        CHECK_EQ(is_stored(&e[0], (uint64_t[]){H + 1, H + 2, H + 3}, 3, 0, 0, 16, "kvpool-dram", 0), 0);
        CHECK_EQ(is_stored(&e[1], (uint64_t[]){H + 4}, 1, 1, 77, 16, "kvpool-dram", 0), 0);
        CHECK_EQ(is_stored(&e[2], (uint64_t[]){H + 5}, 1, 1, H + 4, 16, "kvpool-disk", 0), 0);
        CHECK_EQ(is_stored(&e[3], (uint64_t[]){H + 6}, 1, 1, H + 5, 16, "kvpool-disk", 1), 0);
        CHECK_EQ(is_stored(&e[4], (uint64_t[]){H + 7, H + 8}, 2, 1, H + 6, 32, "kvpool-disk", 1), 0);
        CHECK_EQ(is_stored(&e[5], (uint64_t[]){H + 9}, 1, 0, 0, 32, "kvpool-disk", 1), 0);
        CHECK_EQ(is_removed(&e[6], (uint64_t[]){5, H + 1}, 2, "kvpool-dram", 0), 0);
        CHECK_EQ(is_removed(&e[7], (uint64_t[]){6}, 1, "kvpool-disk", 0), 0);
        CHECK_EQ(is_removed(&e[8], (uint64_t[]){7}, 1, "kvpool-disk", 3), 0);
        CHECK_EQ(is_cleared(&e[9]), 0);
        CHECK_EQ(is_cleared(&e[10]), 0);
        CHECK_EQ(is_removed(&e[11], (uint64_t[]){8}, 1, "kvpool-disk", 3), 0);
        CHECK_EQ(is_stored(&e[12], (uint64_t[]){9}, 1, 1, 8, 16, "kvpool-disk", 3), 0);
        rc = 0;
    }
    msgpack_unpacked_destroy(&d.u);
    kvp_buf_free(&b);
    CHECK_EQ(rc, 0);
}

TEST(encode_refuses_bad_events_and_keeps_the_buffer)
{
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_buf_put(&b, "xy", 2);
    kvp_kvev ok = stored(1, 0, 0, KVP_KVEV_DISK, 0, 16);
    kvp_kvev bad_type = ok, bad_medium = ok, zero_type = ok;
    bad_type.type = 4;
    zero_type.type = 0;
    bad_medium.medium = 2;
    kvp_kvev pair[2] = {ok, bad_medium};
    CHECK_EQ(kvp_kvev_encode(&b, 1, &bad_type, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvev_encode(&b, 1, &zero_type, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvev_encode(&b, 1, pair, 2), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvev_encode(&b, 1, NULL, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(b.len, 2);
    CHECK_EQ(b.err, 0);
    /* CLEARED ignores its medium */
    kvp_kvev c = cleared();
    c.medium = 9;
    CHECK_EQ(kvp_kvev_encode(&b, 1, &c, 1), 0);
    /* no events: [ts, [], nil] */
    size_t at = b.len;
    CHECK_EQ(kvp_kvev_encode(&b, 3.0, NULL, 0), 0);
    decoded d;
    int rc = decode(&d, b.data + at, b.len - at);
    CHECK(rc == 0 && d.nev == 0 && d.ts == 3.0);
    msgpack_unpacked_destroy(&d.u);
    kvp_buf_free(&b);

    /* too large for the buffer: its error, and the length back */
    kvp_buf small;
    kvp_buf_init(&small, 40);
    kvp_buf_put(&small, "ab", 2);
    CHECK_EQ(kvp_kvev_encode(&small, 1, &ok, 1), KVP_ETOO_LARGE);
    CHECK_EQ(small.len, 2);
    CHECK_EQ(small.err, KVP_ETOO_LARGE);
    kvp_buf_free(&small);
}

/* ------------------------------------------------------------ replay parser */

TEST(parse_replay_requests)
{
    uint8_t seq[8] = {0, 0, 0, 0, 0, 0, 1, 2};
    uint8_t big[KVP_KVPUB_MAX_TOPIC + 1];
    memset(big, 'a', sizeof big);
    uint8_t id[256];
    memset(id, 'i', sizeof id);
    kvp_bytes t;
    uint64_t s = 0;
    /* vLLM's form: topic "default" */
    kvp_bytes f3[] = {{id, 5}, {NULL, 0}, {seq, 8}};
    CHECK_EQ(kvp_kvpub_parse_replay(f3, 3, &t, &s), 0);
    CHECK(t.len == 7 && memcmp(t.p, "default", 7) == 0);
    CHECK_EQ(s, 0x102);
    /* with a topic; an empty one; the longest */
    kvp_bytes f4[] = {{id, 255}, {NULL, 0}, {(const uint8_t *)"tenant", 6}, {END_SEQ, 8}};
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 4, &t, &s), 0);
    CHECK(t.len == 6 && t.p == f4[2].p);
    CHECK(s == UINT64_MAX);
    f4[2] = (kvp_bytes){NULL, 0};
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 4, &t, &s), 0);
    CHECK_EQ(t.len, 0);
    f4[2] = (kvp_bytes){big, KVP_KVPUB_MAX_TOPIC};
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 4, &t, &s), 0);
    /* malformed */
    f4[2] = (kvp_bytes){big, KVP_KVPUB_MAX_TOPIC + 1};
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 4, &t, &s), KVP_EPROTOCOL); /* topic too long */
    f4[2] = (kvp_bytes){big, 3};
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 2, &t, &s), KVP_EPROTOCOL); /* too few frames */
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 1, &t, &s), KVP_EPROTOCOL);
    CHECK_EQ(kvp_kvpub_parse_replay(f4, 0, &t, &s), KVP_EPROTOCOL);
    CHECK_EQ(kvp_kvpub_parse_replay(NULL, 3, &t, &s), KVP_EPROTOCOL);
    kvp_bytes f5[] = {{id, 5}, {NULL, 0}, {big, 1}, {big, 1}, {seq, 8}};
    CHECK_EQ(kvp_kvpub_parse_replay(f5, 5, &t, &s), KVP_EPROTOCOL); /* too many */
    kvp_bytes g[] = {{id, 5}, {NULL, 0}, {seq, 7}};
    CHECK_EQ(kvp_kvpub_parse_replay(g, 3, &t, &s), KVP_EPROTOCOL); /* seq of 7 bytes */
    g[2] = (kvp_bytes){big, 9};
    CHECK_EQ(kvp_kvpub_parse_replay(g, 3, &t, &s), KVP_EPROTOCOL); /* of 9 */
    g[2] = (kvp_bytes){seq, 8};
    g[1] = (kvp_bytes){big, 1};
    CHECK_EQ(kvp_kvpub_parse_replay(g, 3, &t, &s), KVP_EPROTOCOL); /* delimiter not empty */
    g[1] = (kvp_bytes){NULL, 0};
    g[0] = (kvp_bytes){id, 0};
    CHECK_EQ(kvp_kvpub_parse_replay(g, 3, &t, &s), KVP_EPROTOCOL); /* no routing id */
    g[0] = (kvp_bytes){id, 256};
    CHECK_EQ(kvp_kvpub_parse_replay(g, 3, &t, &s), KVP_EPROTOCOL); /* not a routing id */
}

/* ------------------------------------------------------------ the publisher */

TEST(create_refuses_bad_endpoints)
{
    kvp_kvpub *p = NULL, *q = NULL;
    char err[256];
    kvp_kvpub_cfg cfg = {.pub = NULL};
    CHECK_EQ(kvp_kvpub_create(&cfg, &p, err, sizeof err), KVP_EINVALID_PARAMS);
    const char *bad[] = {"", "udp://127.0.0.1:5", "tcp://127.0.0.1", "tcp://:5", "tcp://127.0.0.1:",
                         "tcp://127.0.0.1:notaport", "tcp://256.1.2.3:5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg.pub = bad[i];
        err[0] = 0;
        int rc = kvp_kvpub_create(&cfg, &p, err, sizeof err);
        if (rc != KVP_EINVALID_PARAMS)
            fprintf(stderr, "    %s: %d (%s)\n", bad[i], rc, err);
        CHECK_EQ(rc, KVP_EINVALID_PARAMS);
        CHECK(p == NULL && err[0]);
    }
    cfg = (kvp_kvpub_cfg){.pub = "tcp://127.0.0.1:0", .replay = "ipc:///tmp/x"};
    CHECK_EQ(kvp_kvpub_create(&cfg, &p, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "replay") != NULL);
    cfg = (kvp_kvpub_cfg){.pub = "tcp://127.0.0.1:0", .buffer_batches = (1u << 24) + 1};
    CHECK_EQ(kvp_kvpub_create(&cfg, &p, err, sizeof err), KVP_EINVALID_PARAMS);

    /* a port in use: KVP_EIO naming the socket and the endpoint */
    cfg = (kvp_kvpub_cfg){.pub = "tcp://127.0.0.1:0", .replay = "tcp://127.0.0.1:0"};
    CHECK_EQ(kvp_kvpub_create(&cfg, &p, err, sizeof err), 0);
    CHECK(strncmp(kvp_kvpub_pub_endpoint(p), "tcp://127.0.0.1:", 16) == 0);
    CHECK(strcmp(kvp_kvpub_pub_endpoint(p), "tcp://127.0.0.1:0") != 0);
    CHECK(strncmp(kvp_kvpub_replay_endpoint(p), "tcp://127.0.0.1:", 16) == 0);
    kvp_kvpub_cfg dup = {.pub = kvp_kvpub_pub_endpoint(p)};
    CHECK_EQ(kvp_kvpub_create(&dup, &q, err, sizeof err), KVP_EIO);
    CHECK(strstr(err, "pub") != NULL && strstr(err, kvp_kvpub_pub_endpoint(p)) != NULL);
    dup = (kvp_kvpub_cfg){.pub = "tcp://127.0.0.1:0", .replay = kvp_kvpub_replay_endpoint(p)};
    CHECK_EQ(kvp_kvpub_create(&dup, &q, NULL, 0), KVP_EIO); /* err may be NULL */
    CHECK(q == NULL);
    /* no replay socket: "" */
    dup = (kvp_kvpub_cfg){.pub = "tcp://127.0.0.1:*", .replay = ""};
    CHECK_EQ(kvp_kvpub_create(&dup, &q, err, sizeof err), 0);
    CHECK_EQ(strlen(kvp_kvpub_replay_endpoint(q)), 0);
    kvp_kvpub_destroy(q);
    kvp_kvpub_destroy(p);
    kvp_kvpub_destroy(NULL);
}

TEST(submit_refuses_bad_batches)
{
    kvp_kvpub *p = make_pub(0, 0, 0);
    CHECK(p != NULL);
    kvp_kvev e = stored(1, 0, 0, KVP_KVEV_DRAM, 0, 16), bad = e;
    bad.type = 0;
    char big[KVP_KVPUB_MAX_TOPIC + 1];
    memset(big, 't', sizeof big);
    CHECK_EQ(kvp_kvpub_submit(p, "t", 1, 1, 1, &e, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvpub_submit(p, "t", 1, 1, 1, NULL, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvpub_submit(p, "t", 1, 1, 1, &bad, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvpub_submit(p, big, sizeof big, 1, 1, &e, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_kvpub_submit(p, big, KVP_KVPUB_MAX_TOPIC, 1, 1, &e, 1), 0);
    CHECK_EQ(kvp_kvpub_submit(p, NULL, 0, 1, 1, &e, 1), 0); /* the empty topic */
    CHECK_EQ(wait_sent(p, 2), 0);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.dropped, 0);
    kvp_kvpub_destroy(p);
}

/* A SUB of the prefix "tenant-" gets the batches of tenant-a and tenant-b,
 * each (topic, seq 8 bytes big-endian, payload), and none of "other". */
TEST(publish_to_a_subscriber)
{
    kvp_kvpub *p = make_pub(0, 0, 0);
    CHECK(p != NULL);
    void *sub = socket_to(ZMQ_SUB, kvp_kvpub_pub_endpoint(p));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "tenant-", 7);
    /* the slow joiner: warm-up batches until the subscription is in place */
    uint64_t warm = 0, until = kvp_now_ms() + 10000;
    int joined = 0;
    msg m;
    while (!joined && kvp_now_ms() < until) {
        CHECK_EQ(submit_batch(p, "tenant-warm", ++warm), 0);
        if (recv_msg(sub, &m, 20) == 0) {
            joined = 1;
            msg_free(&m);
        }
    }
    CHECK(joined);
    const struct { const char *topic; uint64_t seq; } sent[] = {
        {"tenant-a", 1}, {"other", 1}, {"tenant-b", 1}, {"tenant-a", 2}, {"tenant-b", 7},
        {"other", 2}, {"tenant-a", 3}};
    for (size_t i = 0; i < sizeof sent / sizeof sent[0]; i++)
        CHECK_EQ(submit_batch(p, sent[i].topic, sent[i].seq), 0);
    int fails = 0;
    for (size_t i = 0; i < sizeof sent / sizeof sent[0]; i++) {
        if (strcmp(sent[i].topic, "other") == 0)
            continue;
        CHECK_EQ(recv_skipping(sub, &m, "tenant-warm", 5000), 0);
        uint8_t seq[8];
        put_be64(seq, sent[i].seq);
        check_topic = sent[i].topic;
        fails += !(m.n == 3 && frame_is(&m, 0, sent[i].topic, strlen(sent[i].topic)) &&
                   frame_is(&m, 1, seq, 8) && check_payload(sent[i].seq, m.f[2], m.len[2]) == 0);
        /* and it decodes as what was submitted */
        decoded d;
        kvp_kvev want = batch_event(sent[i].topic, sent[i].seq);
        fails += m.n != 3 || decode(&d, m.f[2], m.len[2]) != 0 || d.nev != 1 ||
                 d.ts != batch_ts(sent[i].seq) ||
                 is_stored(&d.ev[0], &want.hash, 1, 0, 0, 16, "kvpool-dram", want.group) != 0;
        if (m.n == 3)
            msgpack_unpacked_destroy(&d.u);
        msg_free(&m);
    }
    CHECK_EQ(fails, 0);
    CHECK(recv_skipping(sub, &m, "tenant-warm", 300) != 0); /* nothing of "other" */
    kvp_kvpub_stats st;
    CHECK_EQ(wait_sent(p, warm + 7), 0);
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.batches, warm + 7);
    CHECK_EQ(st.events, warm + 7);
    CHECK(st.bytes > 20 * st.batches);
    CHECK_EQ(st.dropped, 0);
    CHECK_EQ(st.queued_bytes, 0);
    close_all(&sub, 1);
    kvp_kvpub_destroy(p);
}

TEST(replay_from_a_seq_in_both_forms)
{
    kvp_kvpub *p = make_pub(100, 0, 0);
    CHECK(p != NULL);
    /* interleaved: a 1..10, b 1..5, default 1..3 */
    for (uint64_t s = 1; s <= 10; s++) {
        CHECK_EQ(submit_batch(p, "a", s), 0);
        if (s <= 5)
            CHECK_EQ(submit_batch(p, "b", s), 0);
        if (s <= 3)
            CHECK_EQ(submit_batch(p, "default", s), 0);
    }
    CHECK_EQ(wait_sent(p, 18), 0);
    void *d = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    uint64_t seqs[32];
    size_t n;
    ask_replay(d, "a", 4);
    check_topic = "a";
    CHECK_EQ(recv_replay(d, "a", seqs, 32, &n, check_payload), 0);
    CHECK_EQ(n, 7);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(seqs[i], 4 + i);
    /* vLLM's form: topic "default" */
    ask_replay(d, NULL, 2);
    check_topic = "default";
    CHECK_EQ(recv_replay(d, "default", seqs, 32, &n, check_payload), 0);
    CHECK(n == 2 && seqs[0] == 2 && seqs[1] == 3);
    /* from 0: everything of b */
    ask_replay(d, "b", 0);
    check_topic = "b";
    CHECK_EQ(recv_replay(d, "b", seqs, 32, &n, check_payload), 0);
    CHECK(n == 5 && seqs[0] == 1 && seqs[4] == 5);
    /* past the end, or a topic never seen: the end marker alone */
    ask_replay(d, "a", 11);
    CHECK_EQ(recv_replay(d, "a", seqs, 32, &n, NULL), 0);
    CHECK_EQ(n, 0);
    ask_replay(d, "nobody", 0);
    CHECK_EQ(recv_replay(d, "nobody", seqs, 32, &n, NULL), 0);
    CHECK_EQ(n, 0);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.replays, 5);
    CHECK_EQ(st.replayed_batches, 14);
    close_all(&d, 1);
    kvp_kvpub_destroy(p);
}

TEST(replay_ring_drops_the_oldest)
{
    /* by batches: 4 kept of 10 */
    kvp_kvpub *p = make_pub(4, 0, 0);
    CHECK(p != NULL);
    for (uint64_t s = 1; s <= 10; s++)
        CHECK_EQ(submit_batch(p, "t", s), 0);
    CHECK_EQ(wait_sent(p, 10), 0);
    void *d = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    uint64_t seqs[32];
    size_t n;
    ask_replay(d, "t", 0);
    CHECK_EQ(recv_replay(d, "t", seqs, 32, &n, NULL), 0);
    CHECK(n == 4 && seqs[0] == 7 && seqs[3] == 10);
    zmq_close(d);
    kvp_kvpub_destroy(p);

    /* by bytes: room for three and a half batches keeps three */
    kvp_kvev e = batch_event("t", 1);
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    CHECK_EQ(kvp_kvev_encode(&b, batch_ts(1), &e, 1), 0);
    uint64_t one = b.len + 1; /* payload and topic */
    kvp_buf_free(&b);
    p = make_pub(100, 3 * one + one / 2, 0);
    CHECK(p != NULL);
    for (uint64_t s = 1; s <= 10; s++)
        CHECK_EQ(submit_batch(p, "t", s), 0);
    CHECK_EQ(wait_sent(p, 10), 0);
    d = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    ask_replay(d, "t", 0);
    CHECK_EQ(recv_replay(d, "t", seqs, 32, &n, NULL), 0);
    CHECK(n == 3 && seqs[0] == 8 && seqs[2] == 10);
    close_all(&d, 1);
    kvp_kvpub_destroy(p);
}

TEST(replay_ignores_malformed_requests)
{
    kvp_kvpub *p = make_pub(100, 0, 0);
    CHECK(p != NULL);
    for (uint64_t s = 1; s <= 3; s++)
        CHECK_EQ(submit_batch(p, "t", s), 0);
    CHECK_EQ(wait_sent(p, 3), 0);
    void *socks[3] = {NULL, NULL, NULL};
    void *d = socks[0] = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    char big[KVP_KVPUB_MAX_TOPIC + 1];
    memset(big, 'x', sizeof big);
    uint8_t seq[8] = {0};
    {
        const void *f[] = {""}; /* no seq */
        send_frames(d, f, (size_t[]){0}, 1);
    }
    {
        const void *f[] = {"", seq}; /* seq of 7 bytes */
        send_frames(d, f, (size_t[]){0, 7}, 2);
    }
    {
        const void *f[] = {"", big, seq}; /* topic too long */
        send_frames(d, f, (size_t[]){0, sizeof big, 8}, 3);
    }
    {
        const void *f[] = {"", "t", "u", "v", seq}; /* too many frames */
        send_frames(d, f, (size_t[]){0, 1, 1, 1, 8}, 5);
    }
    {
        const void *f[] = {"x", seq}; /* no empty delimiter */
        send_frames(d, f, (size_t[]){1, 8}, 2);
    }
    {
        const void *f[] = {seq}; /* a bare seq */
        send_frames(d, f, (size_t[]){8}, 1);
    }
    /* a frame above the socket's message size limit: ZMQ drops that peer */
    void *huge = socks[1] = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    static char blob[1 << 16];
    {
        const void *f[] = {"", blob, seq};
        send_frames(huge, f, (size_t[]){0, sizeof blob, 8}, 3);
    }
    /* ... and still serves the well-formed ones, from this client and another */
    uint64_t seqs[8];
    size_t n;
    ask_replay(d, "t", 2);
    CHECK_EQ(recv_replay(d, "t", seqs, 8, &n, NULL), 0);
    CHECK(n == 2 && seqs[0] == 2 && seqs[1] == 3);
    msg m;
    CHECK(recv_msg(d, &m, 300) != 0); /* nothing answered the malformed ones */
    void *d2 = socks[2] = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    ask_replay(d2, "t", 3);
    CHECK_EQ(recv_replay(d2, "t", seqs, 8, &n, NULL), 0);
    CHECK(n == 1 && seqs[0] == 3);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.replays, 2);
    close_all(socks, 3);
    kvp_kvpub_destroy(p);
}

/* A client that asks for many large replays and reads nothing for a while:
 * the ROUTER's pipe reaches its HWM (twice the ring's batches plus one),
 * the replay pauses instead of dropping, and once the client reads, every
 * answer arrives whole and in order. */
TEST(replay_pauses_at_the_hwm_and_loses_nothing)
{
    enum { EVENTS = 6000, ASKS = 8 };
    kvp_kvpub *p = make_pub(2, 0, 0); /* ROUTER SNDHWM 6 */
    CHECK(p != NULL);
    kvp_kvev *ev = calloc(EVENTS, sizeof *ev);
    for (uint64_t s = 1; s <= 2; s++) {
        for (int i = 0; i < EVENTS; i++) /* no chain: one BlockStored each, ~1 MB */
            ev[i] = stored(s << 32 | (uint64_t)i, 0, 0, KVP_KVEV_DRAM, 0, 16);
        CHECK_EQ(kvp_kvpub_submit(p, "t", 1, s, 1, ev, EVENTS), 0);
    }
    free(ev);
    CHECK_EQ(wait_sent(p, 2), 0);
    void *d = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    int one = 1, small = 4096;
    zmq_setsockopt(d, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(d, ZMQ_RCVBUF, &small, sizeof small);
    for (int i = 0; i < ASKS; i++)
        ask_replay(d, "t", 0);
    usleep(500 * 1000);
    for (int i = 0; i < ASKS; i++) {
        uint64_t seqs[4];
        size_t n;
        CHECK_EQ(recv_replay(d, "t", seqs, 4, &n, NULL), 0);
        CHECK(n == 2 && seqs[0] == 1 && seqs[1] == 2);
    }
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.replays, ASKS);
    CHECK_EQ(st.replayed_batches, 2 * ASKS);
    close_all(&d, 1);
    kvp_kvpub_destroy(p);
}

TEST(queue_bound_drops_and_counts)
{
    /* smaller than any batch: every submit is refused */
    kvp_kvpub *p = make_pub(0, 0, 1);
    CHECK(p != NULL);
    for (uint64_t s = 1; s <= 10; s++)
        CHECK_EQ(submit_batch(p, "t", s), KVP_ELIMIT);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.dropped, 10);
    CHECK_EQ(st.batches, 0);
    CHECK_EQ(st.queued_bytes, 0);
    kvp_kvpub_destroy(p);

    /* room for about two large batches, submitted flat out: each is sent
     * or refused and counted, never both */
    enum { EVENTS = 2000, BATCHES = 300 };
    p = make_pub(0, 0, 2 * (EVENTS * sizeof(kvp_kvev) + 128));
    CHECK(p != NULL);
    kvp_kvev *ev = calloc(EVENTS, sizeof *ev);
    for (int i = 0; i < EVENTS; i++)
        ev[i] = stored((uint64_t)i, 0, 0, KVP_KVEV_DISK, 0, 16);
    uint64_t refused = 0;
    for (uint64_t s = 1; s <= BATCHES; s++) {
        int rc = kvp_kvpub_submit(p, "t", 1, s, 1, ev, EVENTS);
        CHECK(rc == 0 || rc == KVP_ELIMIT);
        refused += rc == KVP_ELIMIT;
    }
    free(ev);
    CHECK_EQ(wait_sent(p, BATCHES - refused), 0);
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.dropped, refused);
    CHECK_EQ(st.batches, BATCHES - refused);
    CHECK_EQ(st.events, (BATCHES - refused) * EVENTS);
    CHECK_EQ(st.queued_bytes, 0);
    kvp_kvpub_destroy(p);
}

/* The loop thread submits while another reads the stats (TSan: the lock). */
static void *read_stats(void *arg)
{
    kvp_kvpub *p = arg;
    kvp_kvpub_stats st;
    for (int i = 0; i < 2000; i++)
        kvp_kvpub_stats_get(p, &st);
    return NULL;
}

TEST(destroy_with_batches_queued)
{
    kvp_kvpub *p = make_pub(0, 0, 0);
    CHECK(p != NULL);
    void *sub = socket_to(ZMQ_SUB, kvp_kvpub_pub_endpoint(p)); /* never reads */
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    void *d = socket_to(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p));
    pthread_t th;
    pthread_create(&th, NULL, read_stats, p);
    kvp_kvev ev[100];
    for (int i = 0; i < 100; i++)
        ev[i] = stored((uint64_t)i + 1, i > 0, (uint64_t)i, KVP_KVEV_DRAM, 0, 16);
    for (uint64_t s = 1; s <= 5000; s++) {
        CHECK_EQ(kvp_kvpub_submit(p, "t", 1, s, 1, ev, 100), 0);
        if (s == 2500)
            ask_replay(d, "t", 0); /* a replay in progress at the end, maybe */
    }
    pthread_join(th, NULL);
    uint64_t t0 = kvp_now_ms();
    kvp_kvpub_destroy(p);
    CHECK(kvp_now_ms() - t0 < 4000);
    void *socks[2] = {sub, d};
    close_all(socks, 2);
}

/* ------------------------------------------------ hostile replay clients */

/* A raw ZMTP 3.0 peer (NULL mechanism) of type `type` on ep, its greeting
 * and READY sent; -1 when the connection failed. */
static int raw_peer(const char *ep, const char *type)
{
    const char *colon = strrchr(ep, ':');
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    a.sin_addr.s_addr = htonl(0x7f000001u);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    uint8_t m[256] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    /* the greeting alone first: libzmq 4.3 drops a peer whose greeting and
     * first frames come in one segment */
    if (send(fd, m, 64, MSG_NOSIGNAL) != 64) {
        close(fd);
        return -1;
    }
    usleep(50 * 1000);
    size_t n = 0;
    size_t tl = strlen(type);
    m[n++] = 0x04;
    m[n++] = (uint8_t)(1 + 5 + 1 + 11 + 4 + tl);
    memcpy(m + n, "\x05READY\x0bSocket-Type\0\0\0", 21);
    n += 21;
    m[n++] = (uint8_t)tl;
    memcpy(m + n, type, tl);
    n += tl;
    if (send(fd, m, n, MSG_NOSIGNAL) != (ssize_t)n) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A raw DEALER on ep that asks for a replay of topic "t" from seq 0 and
 * then reads nothing: its answers stay in the publisher's pipe (and the
 * kernel's buffers), as a hostile client's do. */
static int raw_replay_client(const char *ep)
{
    int fd = raw_peer(ep, "DEALER");
    if (fd < 0)
        return -1;
    size_t n = 0;
    uint8_t m[32];
    static const uint8_t req[] = {1, 0, 1, 1, 't', 0, 8, 0, 0, 0, 0, 0, 0, 0, 0};
    memcpy(m + n, req, sizeof req);
    n += sizeof req;
    if (send(fd, m, n, MSG_NOSIGNAL) != (ssize_t)n) {
        close(fd);
        return -1;
    }
    return fd;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* Six replay clients that never read, each answered the whole ring (about
 * 16 MiB): they share the ring's batches instead of pinning a copy each
 * (the publisher's memory grows by far less than one ring; it grew by six);
 * once the ring moves on, what they still hold is counted and bounded by
 * buffer_bytes; gone, it is freed. */
TEST(replay_clients_that_do_not_read_share_the_ring)
{
    enum { NB = 24, NEV = 4000, NCL = 6 };
    kvp_kvpub *p = make_pub(64, 24u << 20, 0);
    CHECK(p != NULL);
    kvp_kvev *ev = calloc(NEV, sizeof *ev);
    CHECK(ev != NULL);
    for (uint64_t b = 1; b <= NB; b++) {
        for (size_t i = 0; i < NEV; i++) /* not a chain: an event each, ~170 bytes */
            ev[i] = stored((b << 32) | i, 0, 0, KVP_KVEV_DRAM, 0, 16);
        CHECK_EQ(kvp_kvpub_submit(p, "t", 1, b, batch_ts(b), ev, NEV), 0);
    }
    CHECK_EQ(wait_sent(p, NB), 0);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    uint64_t ring = st.bytes;
    CHECK(ring > (8u << 20));
    long before = rss_kib();
    int fds[NCL];
    for (int i = 0; i < NCL; i++) {
        fds[i] = raw_replay_client(kvp_kvpub_replay_endpoint(p));
        CHECK(fds[i] >= 0);
        /* one replay at a time: each is answered in full (the ring is
         * below the HWM) before the next client's is taken */
        uint64_t until = kvp_now_ms() + 10000;
        do {
            usleep(5000);
            kvp_kvpub_stats_get(p, &st);
        } while (st.replayed_batches < (uint64_t)(i + 1) * NB && kvp_now_ms() < until);
        CHECK_EQ(st.replayed_batches, (uint64_t)(i + 1) * NB);
    }
    long grown = rss_kib() - before;
#if !defined(__SANITIZE_THREAD__) /* its shadow memory grows with what libzmq touches */
    CHECK(grown >= 0 && (uint64_t)grown * 1024 < ring / 2);
#else
    (void)grown;
#endif
    CHECK_EQ(st.pinned_bytes, 0);
    /* the ring moves on: the clients' batches are out of it, still held */
    for (uint64_t b = NB + 1; b <= 2 * NB; b++) {
        for (size_t i = 0; i < NEV; i++)
            ev[i] = stored((b << 32) | i, 0, 0, KVP_KVEV_DRAM, 0, 16);
        CHECK_EQ(kvp_kvpub_submit(p, "t", 1, b, batch_ts(b), ev, NEV), 0);
    }
    CHECK_EQ(wait_sent(p, 2 * NB), 0);
    kvp_kvpub_stats_get(p, &st);
    CHECK(st.pinned_bytes > 0 && st.pinned_bytes <= (24u << 20));
    for (int i = 0; i < NCL; i++)
        close(fds[i]);
    uint64_t until = kvp_now_ms() + 10000;
    do {
        usleep(10000);
        kvp_kvpub_stats_get(p, &st);
    } while (st.pinned_bytes && kvp_now_ms() < until);
    CHECK_EQ(st.pinned_bytes, 0);
    free(ev);
    kvp_kvpub_destroy(p);
}

/* 1 once the other end closed fd (end of stream or reset) within ms. */
static int closed_within(int fd, int ms)
{
    uint64_t until = kvp_now_ms() + (uint64_t)ms;
    char b[4096];
    do {
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return 1;
        if (r < 0)
            usleep(10 * 1000);
    } while (kvp_now_ms() < until);
    return 0;
}

/* Past max_subscribers (max_replay_clients) connections at once, one more
 * is refused in its handshake; once one ends, a new one is taken again.
 * Real subscribers are not affected (publish_to_a_subscriber passes the
 * same gate). */
TEST(connections_past_the_caps_are_refused)
{
    kvp_kvpub_cfg cfg = {.pub = "tcp://127.0.0.1:0", .replay = "tcp://127.0.0.1:0",
                         .max_subscribers = 2, .max_replay_clients = 1};
    kvp_kvpub *p = NULL;
    CHECK_EQ(kvp_kvpub_create(&cfg, &p, NULL, 0), 0);
    const char *pub = kvp_kvpub_pub_endpoint(p), *rep = kvp_kvpub_replay_endpoint(p);
    int a = raw_peer(pub, "SUB"), b = raw_peer(pub, "SUB");
    CHECK(a >= 0 && b >= 0);
    CHECK(!closed_within(a, 300) && !closed_within(b, 10));
    int c = raw_peer(pub, "SUB");
    CHECK(c >= 0);
    CHECK(closed_within(c, 3000));
    CHECK(!closed_within(a, 10) && !closed_within(b, 10));
    close(c);
    close(a);
    usleep(200 * 1000); /* its end is reported */
    int d = raw_peer(pub, "SUB");
    CHECK(d >= 0);
    CHECK(!closed_within(d, 500));
    int r1 = raw_peer(rep, "DEALER");
    CHECK(r1 >= 0 && !closed_within(r1, 300));
    int r2 = raw_peer(rep, "DEALER");
    CHECK(r2 >= 0 && closed_within(r2, 3000));
    close(r2);
    close(r1);
    close(b);
    close(d);
    kvp_kvpub_destroy(p);
}

/* ------------------------------------------------------------ tenants */

static const kvp_kvpub_tenant TENANTS[] = {{"alpha", "token-of-alpha"},
                                           {"beta", "token-of-beta"}};

static kvp_kvpub *make_tenant_pub(void)
{
    kvp_kvpub_cfg cfg = {.pub = "tcp://127.0.0.1:0", .replay = "tcp://127.0.0.1:0",
                         .buffer_batches = 1000, .tenants = TENANTS, .ntenants = 2};
    kvp_kvpub *p = NULL;
    char err[256];
    if (kvp_kvpub_create(&cfg, &p, err, sizeof err) != 0) {
        fprintf(stderr, "kvp_kvpub_create: %s\n", err);
        return NULL;
    }
    return p;
}

/* A socket with PLAIN credentials (what a consumer sets: kvev.h). */
static void *socket_plain(int type, const char *ep, const char *user, const char *pass)
{
    if (!zctx)
        zctx = zmq_ctx_new();
    void *s = zmq_socket(zctx, type);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, user, strlen(user));
    zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, pass, strlen(pass));
    zmq_connect(s, ep);
    return s;
}

/* Publishes batches of topic (seqs from *seq on) until sub has received
 * one of them: the subscription is in place. Every message sub receives
 * meanwhile must be of topic; *foreign counts the bytes of any other. */
static int join_tenant(kvp_kvpub *p, void *sub, const char *topic, uint64_t *seq,
                       uint64_t *foreign)
{
    uint64_t until = kvp_now_ms() + 10000;
    msg m;
    while (kvp_now_ms() < until) {
        if (submit_batch(p, topic, ++*seq) != 0)
            return -1;
        if (recv_msg(sub, &m, 20) == 0) {
            int mine = frame_is(&m, 0, topic, strlen(topic));
            for (size_t i = 0; !mine && i < m.n && i < MAXF; i++)
                *foreign += m.len[i];
            msg_free(&m);
            if (mine)
                return 0;
        }
    }
    return -1;
}

/* Receives from sub until the batch (topic, seq) arrives; the bytes of
 * messages of any other topic meanwhile are added to *foreign. */
static int recv_until(void *sub, const char *topic, uint64_t seq, uint64_t *foreign)
{
    msg m;
    for (;;) {
        if (recv_msg(sub, &m, 5000) != 0)
            return -1;
        int mine = frame_is(&m, 0, topic, strlen(topic));
        for (size_t i = 0; !mine && i < m.n && i < MAXF; i++)
            *foreign += m.len[i];
        int done = mine && m.n == 3 && m.len[1] == 8 && get_be64(m.f[1]) == seq;
        msg_free(&m);
        if (done)
            return 0;
    }
}

/* Tenants protected: a subscriber reads its own tenant's batches and not
 * one byte of another's, whatever it subscribes to. On a PUB without
 * credentials (the code before) "" received both tenants and "beta" from
 * alpha's connection received beta's. */
TEST(tenants_read_only_their_own_events)
{
    kvp_kvpub *p = make_tenant_pub();
    CHECK(p != NULL);
    if (!p)
        return;
    const char *ep = kvp_kvpub_pub_endpoint(p);
    void *a = socket_plain(ZMQ_SUB, ep, "alpha", "token-of-alpha");
    void *b = socket_plain(ZMQ_SUB, ep, "beta", "token-of-beta");
    void *a2 = socket_plain(ZMQ_SUB, ep, "alpha", "token-of-alpha");
    zmq_setsockopt(a, ZMQ_SUBSCRIBE, "", 0);      /* everything: alpha's stream */
    zmq_setsockopt(b, ZMQ_SUBSCRIBE, "beta", 4);
    zmq_setsockopt(a2, ZMQ_SUBSCRIBE, "beta", 4); /* another tenant's: refused */
    zmq_setsockopt(a2, ZMQ_SUBSCRIBE, "b", 1);
    zmq_setsockopt(a2, ZMQ_SUBSCRIBE, "alphabet", 8);
    zmq_setsockopt(a2, ZMQ_SUBSCRIBE, "al", 2);   /* a prefix of its own: alpha */
    uint64_t sa = 0, sb = 0, foreign = 0;
    CHECK_EQ(join_tenant(p, a, "alpha", &sa, &foreign), 0);
    CHECK_EQ(join_tenant(p, b, "beta", &sb, &foreign), 0);
    CHECK_EQ(join_tenant(p, a2, "alpha", &sa, &foreign), 0);
    /* every subscription of a2 was read before its "al" (one connection's
     * are taken in order): had "beta" been applied, the beta batches below
     * would reach a2 before alpha's last */
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(submit_batch(p, "beta", ++sb), 0);
        CHECK_EQ(submit_batch(p, "alpha", ++sa), 0);
    }
    CHECK_EQ(recv_until(a, "alpha", sa, &foreign), 0);
    CHECK_EQ(recv_until(a2, "alpha", sa, &foreign), 0);
    CHECK_EQ(recv_until(b, "beta", sb, &foreign), 0);
    fprintf(stderr, "    bytes of other tenants' events received: %llu\n",
            (unsigned long long)foreign);
    CHECK_EQ(foreign, 0);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.subs_refused, 3); /* beta, b, alphabet */
    CHECK_EQ(st.subs_admitted, 3); /* "", beta, al */
    CHECK_EQ(st.auth_refused, 0);
    void *socks[] = {a, b, a2};
    close_all(socks, 3);
    kvp_kvpub_destroy(p);
}

/* A wrong password, or a tenant's name with another's token, is refused in
 * the handshake: nothing is read on such a connection. */
TEST(tenants_wrong_credentials_are_refused)
{
    kvp_kvpub *p = make_tenant_pub();
    CHECK(p != NULL);
    if (!p)
        return;
    const char *ep = kvp_kvpub_pub_endpoint(p);
    void *bad = socket_plain(ZMQ_SUB, ep, "alpha", "token-of-alphA");
    void *mixed = socket_plain(ZMQ_SUB, ep, "alpha", "token-of-beta");
    void *nobody = socket_plain(ZMQ_SUB, ep, "gamma", "token-of-alpha");
    void *rep = socket_plain(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p), "beta", "");
    int sndtimeo = 100; /* a DEALER with no peer would block its send */
    zmq_setsockopt(rep, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    zmq_setsockopt(bad, ZMQ_SUBSCRIBE, "", 0);
    zmq_setsockopt(mixed, ZMQ_SUBSCRIBE, "", 0);
    zmq_setsockopt(nobody, ZMQ_SUBSCRIBE, "", 0);
    kvp_kvpub_stats st;
    uint64_t until = kvp_now_ms() + 10000;
    do {
        usleep(10 * 1000);
        kvp_kvpub_stats_get(p, &st);
    } while (st.auth_refused < 3 && kvp_now_ms() < until);
    CHECK(st.auth_refused >= 3); /* libzmq retries: each try is refused */
    void *good = socket_plain(ZMQ_SUB, ep, "alpha", "token-of-alpha");
    zmq_setsockopt(good, ZMQ_SUBSCRIBE, "", 0);
    uint64_t sa = 0, foreign = 0;
    CHECK_EQ(join_tenant(p, good, "alpha", &sa, &foreign), 0);
    msg m;
    CHECK(recv_msg(bad, &m, 300) != 0);
    CHECK(recv_msg(mixed, &m, 10) != 0);
    CHECK(recv_msg(nobody, &m, 10) != 0);
    ask_replay(rep, "beta", 0);
    CHECK(recv_msg(rep, &m, 300) != 0);
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.subs_admitted, 1);
    CHECK_EQ(st.replays, 0);
    void *socks[] = {bad, mixed, nobody, rep, good};
    close_all(socks, 5);
    kvp_kvpub_destroy(p);
}

/* The replay answers the requester's tenant only: vLLM's form replays its
 * own topic, a request for another's gets the end marker alone. */
TEST(tenants_replay_only_their_own_batches)
{
    kvp_kvpub *p = make_tenant_pub();
    CHECK(p != NULL);
    if (!p)
        return;
    for (uint64_t s = 1; s <= 6; s++) {
        CHECK_EQ(submit_batch(p, "alpha", s), 0);
        if (s <= 4)
            CHECK_EQ(submit_batch(p, "beta", s), 0);
    }
    CHECK_EQ(wait_sent(p, 10), 0);
    void *d = socket_plain(ZMQ_DEALER, kvp_kvpub_replay_endpoint(p), "alpha", "token-of-alpha");
    uint64_t seqs[32];
    size_t n;
    ask_replay(d, NULL, 2); /* vLLM's form: alpha's own topic */
    check_topic = "alpha";
    CHECK_EQ(recv_replay(d, "alpha", seqs, 32, &n, check_payload), 0);
    CHECK(n == 5 && seqs[0] == 2 && seqs[4] == 6);
    ask_replay(d, "beta", 0);
    CHECK_EQ(recv_replay(d, "beta", seqs, 32, &n, NULL), 0);
    CHECK_EQ(n, 0);
    ask_replay(d, "default", 0);
    CHECK_EQ(recv_replay(d, "default", seqs, 32, &n, NULL), 0);
    CHECK_EQ(n, 0);
    ask_replay(d, "alpha", 5);
    CHECK_EQ(recv_replay(d, "alpha", seqs, 32, &n, check_payload), 0);
    CHECK(n == 2 && seqs[0] == 5 && seqs[1] == 6);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.replays, 4);
    CHECK_EQ(st.replays_refused, 2);
    CHECK_EQ(st.replayed_batches, 7);
    close_all(&d, 1);
    kvp_kvpub_destroy(p);
}

/* One connection's subscriptions: however many it sends, none but its
 * tenant's topic is applied (its cap is that one). */
TEST(tenants_subscriptions_per_connection_are_capped)
{
    kvp_kvpub *p = make_tenant_pub();
    CHECK(p != NULL);
    if (!p)
        return;
    void *a = socket_plain(ZMQ_SUB, kvp_kvpub_pub_endpoint(p), "alpha", "token-of-alpha");
    char t[64];
    for (int i = 0; i < 500; i++) { /* within the SUB's own high-water mark */
        int n = snprintf(t, sizeof t, "%s-%d", i % 2 ? "beta" : "alpha", i);
        zmq_setsockopt(a, ZMQ_SUBSCRIBE, t, (size_t)n);
    }
    zmq_setsockopt(a, ZMQ_SUBSCRIBE, "alpha", 5);
    uint64_t sa = 0, sb = 0, foreign = 0;
    CHECK_EQ(join_tenant(p, a, "alpha", &sa, &foreign), 0);
    for (int i = 0; i < 5; i++) {
        CHECK_EQ(submit_batch(p, "beta", ++sb), 0);
        CHECK_EQ(submit_batch(p, "alpha", ++sa), 0);
    }
    CHECK_EQ(recv_until(a, "alpha", sa, &foreign), 0);
    CHECK_EQ(foreign, 0);
    kvp_kvpub_stats st;
    kvp_kvpub_stats_get(p, &st);
    CHECK_EQ(st.subs_refused, 500);
    CHECK_EQ(st.subs_admitted, 1);
    close_all(&a, 1);
    kvp_kvpub_destroy(p);
}

/* Tenant names one of which is a prefix of another (or of "default") would
 * share a ZeroMQ topic prefix: refused at create. */
TEST(tenants_whose_names_share_a_prefix_are_refused)
{
    const kvp_kvpub_tenant pre[] = {{"ab", "x"}, {"abc", "y"}};
    const kvp_kvpub_tenant def[] = {{"def", "x"}};
    const kvp_kvpub_tenant defx[] = {{"default2", "x"}};
    const kvp_kvpub_tenant empty[] = {{"a", ""}};
    const kvp_kvpub_tenant ok[] = {{"default", "x"}, {"abc", "y"}, {"abd", "z"}};
    const struct { const kvp_kvpub_tenant *t; size_t n; int rc; } cases[] = {
        {pre, 2, KVP_EINVALID_PARAMS}, {def, 1, KVP_EINVALID_PARAMS},
        {defx, 1, KVP_EINVALID_PARAMS}, {empty, 1, KVP_EINVALID_PARAMS}, {ok, 3, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_kvpub_cfg cfg = {.pub = "tcp://127.0.0.1:0", .tenants = cases[i].t,
                             .ntenants = cases[i].n};
        kvp_kvpub *p = NULL;
        char err[512] = "";
        CHECK_EQ(kvp_kvpub_create(&cfg, &p, err, sizeof err), cases[i].rc);
        if (cases[i].rc && !strstr(err, cases[i].t == empty ? "1..255 bytes" : "prefix"))
            th_fail(__FILE__, __LINE__, "said: %s", err);
        kvp_kvpub_destroy(p);
    }
}
