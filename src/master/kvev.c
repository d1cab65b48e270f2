/*
 * kvev.c -- vLLM KV-event batches (msgpack-c) and their ZeroMQ publisher
 * (see kvev.h).
 *
 * Threads. kvp_kvpub_submit runs on the caller's thread: it copies the batch
 * into one allocation and appends it to the queue under mu, and writes the
 * eventfd when the queue was empty. Everything else -- encoding, both
 * sockets, the replay ring, the replay in progress -- is the publisher
 * thread's. kvp_kvpub_create makes and binds the sockets before it starts
 * the thread and never touches them again (a ZMQ socket may change threads
 * across a full memory barrier: pthread_create is one); the thread closes
 * them before it ends.
 *
 * The thread's loop: zmq_poll on the eventfd, the ZAP handler's socket,
 * with tenants the XPUB, and, while no replay is in progress, the ROUTER;
 * then
 *   0. answers the ZAP requests (the gate, below) and, with tenants, reads
 *      every (un)subscription waiting on the XPUB, applying its tenant's
 *      topic or nothing (see "subscriptions with tenants");
 *   1. takes the whole queue and, batch by batch, encodes it, sends it on
 *      PUB (which never blocks: at its high-water mark a subscriber's copy is
 *      dropped, as vLLM's is) and appends it to the replay ring;
 *   2. sends at most REPLAY_CHUNK batches (REPLAY_CHUNK_BYTES) of the replay
 *      in progress, so a long replay runs between the queue's batches
 *      instead of holding them up (the queue goes first, as in vLLM);
 *   3. with no replay in progress, reads requests until one is well formed:
 *      one replay at a time, the others wait in the ROUTER's queue.
 * The eventfd is written only by a submit that finds the queue empty, and
 * read before the queue is taken, so no batch is left without a wake-up.
 *
 * Replay answers respect the ROUTER's high-water mark (vLLM's: twice the
 * ring's batches plus one, so a whole replay fits; at most REPLAY_HWM, so a
 * client that does not read pins a bounded number of answers, whose
 * payloads are the ring's own, by reference): ZMQ_ROUTER_MANDATORY
 * makes a send to a full pipe fail with EAGAIN instead of dropping it; the
 * replay then pauses (the loop polls every PAUSE_POLL_MS) and is abandoned
 * when the client has taken nothing for REPLAY_STALL_MS, or at once when it
 * is gone (EHOSTUNREACH). A replay answers the batches in the ring when it
 * was asked for (ring ids [cursor, end)); one evicted before its turn is
 * skipped, a gap the subscriber sees.
 */
#include "master/kvev.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "kvpool.h"

#define MOD "kvpub"

#define DEF_BUFFER_BATCHES 10000u
#define MAX_BUFFER_BATCHES (1u << 24)
#define DEF_BUFFER_BYTES (256ull << 20)
#define DEF_HWM 100000u
#define DEF_QUEUE_BYTES (256ull << 20)
#define ENC_CAP ((size_t)1 << 30)  /* one batch's payload at most (larger: dropped) */
#define ENC_KEEP ((size_t)1 << 20) /* the encoder's buffer is freed above this when idle */
#define LINGER_MS 500              /* unsent messages kept this long at close */
#define DRAIN_MS 1000              /* destroy sends what is queued for at most this long */
#define REPLAY_CHUNK 256           /* replayed batches per turn of the loop ... */
#define REPLAY_CHUNK_BYTES ((size_t)4 << 20) /* ... and bytes */
#define PAUSE_POLL_MS 10           /* a replay paused at the HWM is retried this often */
#define REPLAY_STALL_MS 5000       /* ... and abandoned after this long without progress */
#define REQ_PER_TURN 16            /* replay requests read per turn of the loop at most */
#define MAX_ID 255                 /* a ZMQ routing id's bytes */
#define REQ_FRAMES 5               /* frames of a request kept: one more than the longest form */
#define MAX_FRAME (KVP_KVPUB_MAX_TOPIC + MAX_ID) /* ZMQ_MAXMSGSIZE of the ROUTER */
/* ZMQ_MAXMSGSIZE of the PUB: what a subscriber sends it is (un)subscriptions,
 * a flag byte and a topic prefix (ZMTP 3.0), or a SUBSCRIBE / CANCEL
 * command (3.1: its name's length byte and name, then the topic); a longer
 * one closes the connection before libzmq reads it. Without this bound a
 * peer -- no credential needed -- sent subscriptions of many megabytes,
 * which libzmq keeps in its subscription trie (a node per byte: the
 * master's memory grew by gigabytes, never given back, and tearing the
 * trie down at close held the stop for seconds). */
#define MAX_SUB (KVP_KVPUB_MAX_TOPIC + 16)
/* ZMQ_SNDHWM of the ROUTER, in answers: a client that does not read pins
 * at most this many (their frames; the payloads are the ring's, shared).
 * A reading client loses nothing to it: ZMQ_ROUTER_MANDATORY pauses the
 * replay instead. */
#define REPLAY_HWM 2048u
#define DEF_MAX_SUBSCRIBERS 256u /* connections to the PUB at once (0 in the config) */
#define DEF_MAX_REPLAY_CLIENTS 64u /* ... and to the ROUTER */
#define HANDSHAKE_MS 5000 /* a connection's ZMTP handshake completes within this, or is closed */
#define EP_LEN 256
#define PLAIN_MAX 255  /* a PLAIN username's or password's bytes at most (ZMTP) */
#define SUBS_PER_TURN 4096 /* tenants: (un)subscriptions read per turn of the loop at most */

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer builds: libzmq hands messages between its threads through
 * lock-free pipes whose atomics TSan cannot see (the library is not
 * instrumented), so it reports the malloc, memcpy and free that libzmq
 * calls on either side as races. What libzmq calls is ignored; our code,
 * and what it passes to libzmq, stay checked. (The only definition in
 * kvpool: TSan's runtime reads it at start-up.) */
const char *__tsan_default_suppressions(void);
/* rb_unref: a replayed payload's reference is dropped on libzmq's thread,
 * the first access there to a batch the publisher thread allocated; the
 * refcount's own atomics order everything after, but what orders the
 * allocation before it is libzmq's pipe, which TSan cannot see. */
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\nrace:rb_unref\n";
}
#endif

/* ------------------------------------------------------------ encoding */

static const char *const medium_name[] = {"kvpool-dram", "kvpool-disk"};

/* 0 when every event has a known type and, where it has one, medium. */
static int check_events(const kvp_kvev *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ev[i].type < KVP_KVEV_STORED || ev[i].type > KVP_KVEV_CLEARED)
            return KVP_EINVALID_PARAMS;
        if (ev[i].type != KVP_KVEV_CLEARED && ev[i].medium > KVP_KVEV_DISK)
            return KVP_EINVALID_PARAMS;
    }
    return 0;
}

/* How many of ev[0..n) (n >= 1) make the one vLLM event starting at ev[0]
 * (the merging rules of kvev.h). */
static size_t run_len(const kvp_kvev *ev, size_t n)
{
    size_t k = 1;
    const kvp_kvev *e0 = &ev[0];
    if (e0->type == KVP_KVEV_STORED)
        while (k < n && ev[k].type == KVP_KVEV_STORED && ev[k].medium == e0->medium &&
               ev[k].group == e0->group && ev[k].block_size == e0->block_size &&
               ev[k].has_parent && ev[k].parent == ev[k - 1].hash)
            k++;
    else if (e0->type == KVP_KVEV_REMOVED)
        while (k < n && ev[k].type == KVP_KVEV_REMOVED && ev[k].medium == e0->medium &&
               ev[k].group == e0->group)
            k++;
    return k;
}

/* msgpack-c's write callback: appends to the kvp_buf (its error is sticky,
 * so the packer's later writes are no-ops and the caller checks once). */
static int pk_write(void *data, const char *buf, size_t len)
{
    kvp_buf *b = data;
    kvp_buf_put(b, buf, len);
    return b->err ? -1 : 0;
}

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pk_hashes(msgpack_packer *pk, const kvp_kvev *ev, size_t k)
{
    pk_str(pk, "block_hashes");
    msgpack_pack_array(pk, k);
    for (size_t i = 0; i < k; i++)
        msgpack_pack_uint64(pk, ev[i].hash);
}

/* One vLLM event from ev[0..k), a run of run_len; keys in the order of the
 * msgspec classes' fields, the tag first. */
static void pk_event(msgpack_packer *pk, const kvp_kvev *ev, size_t k)
{
    switch (ev[0].type) {
    case KVP_KVEV_STORED:
        msgpack_pack_map(pk, 10);
        pk_str(pk, "type");
        pk_str(pk, "BlockStored");
        pk_hashes(pk, ev, k);
        pk_str(pk, "parent_block_hash");
        if (ev[0].has_parent)
            msgpack_pack_uint64(pk, ev[0].parent);
        else
            msgpack_pack_nil(pk);
        pk_str(pk, "token_ids");
        msgpack_pack_array(pk, 0);
        pk_str(pk, "block_size");
        msgpack_pack_uint32(pk, ev[0].block_size);
        pk_str(pk, "lora_id");
        msgpack_pack_nil(pk);
        pk_str(pk, "medium");
        pk_str(pk, medium_name[ev[0].medium]);
        pk_str(pk, "lora_name");
        msgpack_pack_nil(pk);
        pk_str(pk, "group_idx");
        msgpack_pack_uint8(pk, ev[0].group);
        pk_str(pk, "locality");
        pk_str(pk, "REMOTE");
        break;
    case KVP_KVEV_REMOVED:
        msgpack_pack_map(pk, 5);
        pk_str(pk, "type");
        pk_str(pk, "BlockRemoved");
        pk_hashes(pk, ev, k);
        pk_str(pk, "medium");
        pk_str(pk, medium_name[ev[0].medium]);
        pk_str(pk, "group_idx");
        msgpack_pack_uint8(pk, ev[0].group);
        pk_str(pk, "locality");
        pk_str(pk, "REMOTE");
        break;
    default: /* KVP_KVEV_CLEARED (check_events ran) */
        msgpack_pack_map(pk, 1);
        pk_str(pk, "type");
        pk_str(pk, "AllBlocksCleared");
        break;
    }
}

int kvp_kvev_encode(kvp_buf *out, double ts, const kvp_kvev *ev, size_t n)
{
    if (!out || (n && !ev) || n > UINT32_MAX || check_events(ev, n))
        return KVP_EINVALID_PARAMS;
    if (out->err)
        return out->err;
    size_t start = out->len, nv = 0;
    for (size_t i = 0; i < n; i += run_len(ev + i, n - i))
        nv++;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, pk_write);
    /* data_parallel_rank nil (None): vLLM always sends the third element
     * (its publisher sets the rank), and consumers that decode a fixed
     * tuple (Rust, Go) expect it */
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, ts);
    msgpack_pack_array(&pk, nv);
    for (size_t i = 0; i < n;) {
        size_t k = run_len(ev + i, n - i);
        pk_event(&pk, ev + i, k);
        i += k;
    }
    msgpack_pack_nil(&pk);
    if (out->err) {
        out->len = start;
        return out->err;
    }
    return 0;
}

/* ------------------------------------------------------------ publisher */

/* A submitted batch, one allocation: the events, then the topic's bytes. */
typedef struct qitem {
    struct qitem *next;
    uint64_t seq;
    double ts;
    size_t n;       /* events */
    size_t size;    /* the allocation's bytes, counted in queued_bytes */
    uint32_t topic_len;
    kvp_kvev ev[];
} qitem;

static const uint8_t *qitem_topic(const qitem *q) { return (const uint8_t *)(q->ev + q->n); }

/* A batch kept for replay, shared by reference: the ring holds one
 * reference, and every replay answer in a ROUTER pipe holds one on its
 * payload frame (zmq_msg_init_data, released by libzmq on whatever thread
 * drops the message). So clients that do not read share the ring's bytes
 * instead of pinning a copy of it each; what they pin beyond the ring --
 * batches evicted from it while still in their pipes -- is counted in
 * pinned and bounded (at most the ring's own bound, buffer_bytes). data holds the topic then the payload. */
typedef struct rbuf {
    _Atomic uint32_t refs;
    uint32_t topic_len;
    uint64_t bytes;      /* counted in pinned once the ring let go */
    struct kvp_kvpub *p;
    uint8_t data[];
} rbuf;

typedef struct rent {
    rbuf *rb;
    size_t len;     /* payload bytes */
    uint64_t seq;
    uint32_t topic_len;
} rent;

/* The replay in progress. */
typedef struct replay {
    int on;
    uint8_t id[MAX_ID];
    size_t id_len;
    uint8_t topic[KVP_KVPUB_MAX_TOPIC];
    size_t topic_len;
    uint64_t start_seq;
    uint64_t cursor, end; /* ring ids still to answer from: [cursor, end) */
    uint64_t paused_ms;   /* kvp_now_ms of the first refused send of this pause; 0 = none */
} replay;

/* A protected tenant (kvp_kvpub_cfg.tenants), copied at create. */
typedef struct ptenant {
    char name[PLAIN_MAX + 1], token[PLAIN_MAX + 1]; /* NUL-terminated */
    size_t name_len, token_len;
} ptenant;

struct kvp_kvpub {
    /* fixed from create on */
    void *zctx, *pub, *router; /* router NULL: no replay socket; pub an XPUB with tenants */
    ptenant *ten;              /* nten > 0: PLAIN on both sockets (kvev.h) */
    size_t nten;
    int efd;
    pthread_t th;
    uint32_t ring_cap;
    uint64_t ring_max_bytes, queue_max;
    char pub_ep[EP_LEN], replay_ep[EP_LEN];
    _Atomic uint64_t pinned; /* bytes of batches out of the ring still in pipes */
    /* the gate (the thread's after create): the ZAP handler and a monitor
     * of each socket; gate k: 0 the PUB, 1 the ROUTER */
    void *zap, *mon[2];
    uint32_t cap[2];
    int64_t live[2];       /* connections accepted and not yet ended */

    pthread_mutex_t mu;    /* guards what follows down to the thread's part */
    qitem *head, *tail;
    int quit;
    kvp_kvpub_stats st;

    /* the publisher thread's */
    rent *ring;            /* ring_cap entries; id k at ring[k % ring_cap] */
    uint64_t first, next;  /* ids held: [first, next) */
    uint64_t ring_bytes;
    replay rp;
    kvp_buf enc;
};

/* The protected tenant named name[0..len), or NULL. */
static const ptenant *tenant_named(const kvp_kvpub *p, const void *name, size_t len)
{
    for (size_t i = 0; i < p->nten; i++)
        if (p->ten[i].name_len == len && memcmp(p->ten[i].name, name, len) == 0)
            return &p->ten[i];
    return NULL;
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

int kvp_kvpub_parse_replay(const kvp_bytes *frames, size_t nframes, kvp_bytes *topic,
                           uint64_t *start_seq)
{
    if (!frames || (nframes != 3 && nframes != 4))
        return KVP_EPROTOCOL;
    const kvp_bytes *seq = &frames[nframes - 1];
    if (frames[0].len < 1 || frames[0].len > MAX_ID || frames[1].len != 0 || seq->len != 8)
        return KVP_EPROTOCOL;
    kvp_bytes t = {(const uint8_t *)KVP_KVPUB_DEFAULT_TOPIC, sizeof KVP_KVPUB_DEFAULT_TOPIC - 1};
    if (nframes == 4) {
        if (frames[2].len > KVP_KVPUB_MAX_TOPIC)
            return KVP_EPROTOCOL;
        t = frames[2];
    }
    *topic = t;
    *start_seq = get_be64(seq->p);
    return 0;
}

/* --- the ring (the thread's) */

/* Drops a reference; the last frees (any thread). */
static void rb_unref(rbuf *b)
{
    if (atomic_fetch_sub(&b->refs, 1) == 1) {
        atomic_fetch_sub(&b->p->pinned, b->bytes);
        kvp_free(b);
    }
}

/* libzmq's free function of a replayed payload frame. */
static void rb_release(void *data, void *hint)
{
    (void)data;
    rb_unref(hint);
}

static void ring_pop(kvp_kvpub *p)
{
    rent *e = &p->ring[p->first % p->ring_cap];
    p->ring_bytes -= e->rb->bytes;
    /* counted as pinned before the ring's reference goes: the last unref,
     * here or in a pipe, takes it back */
    atomic_fetch_add(&p->pinned, e->rb->bytes);
    rb_unref(e->rb);
    e->rb = NULL;
    p->first++;
}

/* Keeps one batch for replay, dropping the oldest beyond the bounds. A
 * batch larger than buffer_bytes, or one without memory, is not kept. */
static void ring_put(kvp_kvpub *p, const uint8_t *topic, uint32_t topic_len, uint64_t seq,
                     const uint8_t *payload, size_t len)
{
    uint64_t need = (uint64_t)topic_len + len;
    if (need > p->ring_max_bytes) {
        KVP_WARN_LIMITED(MOD, "a batch of %zu bytes is larger than the replay buffer: not kept",
                         len);
        return;
    }
    while (p->next - p->first == p->ring_cap || p->ring_bytes + need > p->ring_max_bytes)
        ring_pop(p);
    rbuf *rb = kvp_malloc(sizeof *rb + need);
    if (!rb) {
        KVP_WARN_LIMITED(MOD, "out of memory: a batch is not kept for replay");
        return;
    }
    atomic_init(&rb->refs, 1);
    rb->topic_len = topic_len;
    rb->bytes = need;
    rb->p = p;
    memcpy(rb->data, topic, topic_len);
    memcpy(rb->data + topic_len, payload, len);
    p->ring[p->next % p->ring_cap] = (rent){rb, len, seq, topic_len};
    p->next++;
    p->ring_bytes += need;
}

/* --- publishing (the thread's) */

/* Encodes q, sends it on PUB and keeps it for replay; frees it. */
static void publish_one(kvp_kvpub *p, qitem *q)
{
    const uint8_t *topic = qitem_topic(q);
    kvp_buf_reset(&p->enc);
    int rc = kvp_kvev_encode(&p->enc, q->ts, q->ev, q->n);
    int sent = 0;
    if (rc) {
        KVP_WARN_LIMITED(MOD, "a batch of %zu events does not encode (%s): dropped", q->n,
                         kvp_strerror(rc));
    } else {
        uint8_t seq[8];
        put_be64(seq, q->seq);
        sent = zmq_send(p->pub, topic, q->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
               zmq_send(p->pub, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
               zmq_send(p->pub, p->enc.data, p->enc.len, ZMQ_DONTWAIT) >= 0;
        if (!sent)
            KVP_WARN_LIMITED(MOD, "PUB send: %s", zmq_strerror(zmq_errno()));
        ring_put(p, topic, q->topic_len, q->seq, p->enc.data, p->enc.len);
    }
    pthread_mutex_lock(&p->mu);
    p->st.queued_bytes -= q->size;
    if (sent) {
        p->st.batches++;
        p->st.events += q->n;
        p->st.bytes += p->enc.len;
    } else if (rc) {
        p->st.dropped++;
    }
    pthread_mutex_unlock(&p->mu);
    kvp_free(q);
    kvp_buf_reset(&p->enc);
    kvp_buf_shrink(&p->enc, ENC_KEEP);
}

/* Publishes the list q in order. Past deadline_ms (0: none) the rest is
 * dropped and counted. */
static void publish_list(kvp_kvpub *p, qitem *q, uint64_t deadline_ms)
{
    while (q) {
        qitem *nx = q->next;
        if (deadline_ms && kvp_now_ms() > deadline_ms) {
            uint64_t n = 0, bytes = 0;
            for (; q; q = nx) {
                nx = q->next;
                n++;
                bytes += q->size;
                kvp_free(q);
            }
            pthread_mutex_lock(&p->mu);
            p->st.queued_bytes -= bytes;
            p->st.dropped += n;
            pthread_mutex_unlock(&p->mu);
            KVP_WARN(MOD, "closing: %llu batches not sent in %d ms: dropped",
                     (unsigned long long)n, DRAIN_MS);
            return;
        }
        publish_one(p, q);
        q = nx;
    }
}

/* --- replay (the thread's) */

/* Sends one answer message to the replay's client: (id, "", topic, seq,
 * payload), the payload x's by reference (NULL x: the end marker, topic
 * and payload empty). 0, or the errno of the refused first frame (EAGAIN:
 * its pipe is at the HWM; EHOSTUNREACH: the client is gone; ENOMEM). Once
 * the first frame is taken the rest of the message is too. */
static int send_answer(kvp_kvpub *p, const rent *x, const uint8_t *seq)
{
    const replay *r = &p->rp;
    zmq_msg_t pl;
    if (x) {
        atomic_fetch_add(&x->rb->refs, 1);
        if (zmq_msg_init_data(&pl, x->rb->data + x->topic_len, x->len, rb_release, x->rb) != 0) {
            rb_unref(x->rb);
            return ENOMEM;
        }
    }
    if (zmq_send(p->router, r->id, r->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        if (x)
            zmq_msg_close(&pl); /* drops the reference */
        return e;
    }
    zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->router, x ? x->rb->data : NULL, x ? x->topic_len : 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->router, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (!x)
        zmq_send(p->router, "", 0, ZMQ_DONTWAIT);
    else if (zmq_msg_send(&pl, p->router, ZMQ_DONTWAIT) < 0)
        zmq_msg_close(&pl);
    return 0;
}

/* A send of the replay was refused with errno e: pause it, or abandon it. */
static void replay_refused(kvp_kvpub *p, int e)
{
    replay *r = &p->rp;
    uint64_t now = kvp_now_ms();
    if (e == EAGAIN && !r->paused_ms) {
        r->paused_ms = now;
        return;
    }
    if (e == EAGAIN && now - r->paused_ms < REPLAY_STALL_MS)
        return;
    if (e == EAGAIN)
        KVP_WARN_LIMITED(MOD, "replay: the client took nothing for %d ms: abandoned",
                         REPLAY_STALL_MS);
    else
        KVP_DEBUG(MOD, "replay: abandoned (%s)", zmq_strerror(e));
    r->on = 0;
}

/* Sends the next chunk of the replay in progress; its end marker when done. */
static void replay_step(kvp_kvpub *p)
{
    replay *r = &p->rp;
    size_t nsent = 0, bytes = 0;
    int e = 0;
    /* clients that do not read hold batches the ring has let go: past
     * buffer_bytes the replay waits (and is abandoned if nothing is freed) */
    if (r->cursor < r->end && atomic_load(&p->pinned) > p->ring_max_bytes) {
        replay_refused(p, EAGAIN);
        return;
    }
    while (r->cursor < r->end && nsent < REPLAY_CHUNK && bytes < REPLAY_CHUNK_BYTES) {
        if (r->cursor < p->first) { /* evicted since the request: a gap */
            r->cursor = p->first;
            continue;
        }
        const rent *x = &p->ring[r->cursor % p->ring_cap];
        if (x->topic_len == r->topic_len && memcmp(x->rb->data, r->topic, r->topic_len) == 0 &&
            x->seq >= r->start_seq) {
            uint8_t seq[8];
            put_be64(seq, x->seq);
            if ((e = send_answer(p, x, seq)))
                break;
            nsent++;
            bytes += x->len;
        }
        r->cursor++;
    }
    if (nsent) {
        r->paused_ms = 0;
        pthread_mutex_lock(&p->mu);
        p->st.replayed_batches += nsent;
        pthread_mutex_unlock(&p->mu);
    }
    if (!e && r->cursor >= r->end) {
        static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        if (!(e = send_answer(p, NULL, end_seq))) {
            r->on = 0;
            return;
        }
    }
    if (e)
        replay_refused(p, e);
}

/* Reads one multipart message from the ROUTER: its first REQ_FRAMES frames
 * into m[0..*kept) (the caller closes them), the rest read and dropped.
 * Returns its frame count; 0 when none was waiting. */
static size_t recv_request(void *sock, zmq_msg_t *m, size_t *kept)
{
    size_t total = 0;
    *kept = 0;
    for (int more = 1; more;) {
        zmq_msg_t scratch;
        zmq_msg_t *dst = *kept < REQ_FRAMES ? &m[*kept] : &scratch;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(dst);
            break;
        }
        more = zmq_msg_more(dst);
        total++;
        if (dst == &scratch)
            zmq_msg_close(dst);
        else
            (*kept)++;
    }
    return total;
}

/* Reads requests (REQ_PER_TURN at most) until a well-formed one starts a
 * replay; logs and drops the others. */
static void take_requests(kvp_kvpub *p)
{
    for (int i = 0; i < REQ_PER_TURN && !p->rp.on; i++) {
        zmq_msg_t m[REQ_FRAMES];
        size_t kept;
        size_t total = recv_request(p->router, m, &kept);
        if (!total)
            return;
        kvp_bytes f[REQ_FRAMES];
        kvp_bytes topic;
        uint64_t start = 0;
        int ok = 1;
        for (size_t j = 0; j < kept; j++) {
            size_t sz = zmq_msg_size(&m[j]);
            if (sz > MAX_FRAME) /* ZMQ_MAXMSGSIZE keeps them out; kvp_bytes has 32 bits */
                ok = 0;
            f[j] = (kvp_bytes){zmq_msg_data(&m[j]), (uint32_t)sz};
        }
        if (ok && kvp_kvpub_parse_replay(f, kept, &topic, &start) == 0) {
            replay *r = &p->rp;
            int refused = 0;
            if (p->nten) { /* the requester's own tenant only (kvev.h) */
                const char *user = zmq_msg_gets(&m[kept - 1], "User-Id");
                const ptenant *t = user ? tenant_named(p, user, strlen(user)) : NULL;
                if (t && kept == 3) /* vLLM's form: the tenant's own topic */
                    topic = (kvp_bytes){(const uint8_t *)t->name, (uint32_t)t->name_len};
                else if (!t || topic.len != t->name_len || memcmp(topic.p, t->name, t->name_len))
                    refused = 1;
            }
            r->id_len = f[0].len;
            memcpy(r->id, f[0].p, r->id_len);
            r->topic_len = topic.len;
            if (topic.len)
                memcpy(r->topic, topic.p, topic.len);
            r->start_seq = start;
            r->cursor = refused ? p->next : p->first; /* refused: the end marker alone */
            r->end = p->next;
            r->paused_ms = 0;
            r->on = 1;
            if (refused)
                KVP_WARN_LIMITED(MOD, "replay: a request for another tenant's topic answered "
                                      "with the end marker alone");
            pthread_mutex_lock(&p->mu);
            p->st.replays++;
            p->st.replays_refused += (uint64_t)refused;
            pthread_mutex_unlock(&p->mu);
        } else {
            KVP_WARN_LIMITED(MOD, "malformed replay request (%zu frames): ignored", total);
        }
        for (size_t j = 0; j < kept; j++)
            zmq_msg_close(&m[j]);
    }
}

/* --- subscriptions with tenants (the thread's)
 *
 * The XPUB (ZMQ_XPUB_MANUAL) applies no subscription itself: each one, or
 * cancel, is read here with its connection's User-Id (the tenant its
 * credentials proved), and zmq_setsockopt(ZMQ_SUBSCRIBE / UNSUBSCRIBE)
 * right after the read applies it to that connection alone (libzmq's "last
 * pipe"). Only the tenant's topic is ever applied: one subscription per
 * connection at most, whatever it sends. Messages without a User-Id are the
 * cancels libzmq makes for a connection that ended (nothing to do) or were
 * not subscriptions: dropped. */

/* The subscription applied for one asking for prefix s[0..len) on tenant t's
 * connection: t's topic when s is a prefix of it ("" included), else none. */
static int sub_admitted(const ptenant *t, const uint8_t *s, size_t len)
{
    return t && len <= t->name_len && memcmp(t->name, s, len) == 0;
}

static void take_subscriptions(kvp_kvpub *p)
{
    uint64_t admitted = 0, refused = 0;
    for (int i = 0; i < SUBS_PER_TURN; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        const uint8_t *d = zmq_msg_data(&m);
        size_t n = zmq_msg_size(&m);
        const char *user = zmq_msg_gets(&m, "User-Id");
        if (user && n >= 1 && (d[0] == 0 || d[0] == 1)) {
            const ptenant *t = tenant_named(p, user, strlen(user));
            if (sub_admitted(t, d + 1, n - 1)) {
                /* at once: nothing between the read and this call may
                 * process libzmq's commands (the last pipe is the reader's) */
                zmq_setsockopt(p->pub, d[0] ? ZMQ_SUBSCRIBE : ZMQ_UNSUBSCRIBE, t->name,
                               t->name_len);
                admitted++;
            } else if (d[0] == 1) {
                refused++;
            }
        }
        zmq_msg_close(&m);
    }
    if (refused)
        KVP_WARN_LIMITED(MOD, "pub: %llu subscriptions outside their tenant's topic refused",
                         (unsigned long long)refused);
    if (admitted || refused) {
        pthread_mutex_lock(&p->mu);
        p->st.subs_admitted += admitted;
        p->st.subs_refused += refused;
        pthread_mutex_unlock(&p->mu);
    }
}

/* --- the gate (the thread's): connection caps
 *
 * ZeroMQ has no connection limit. Each socket has a ZAP domain, so libzmq
 * asks the ZAP handler (p->zap, REP on inproc://zeromq.zap.01) before a
 * connection's handshake completes (ZMTP 1.0/2.0 peers, which cannot be
 * asked, are refused), and a monitor reports every accepted connection and
 * every end of one. The I/O thread reports the accept before it starts the
 * connection's handshake, so once monitors are drained, live[k] counts the
 * connection being asked about: past cap[k] it is refused (status 400,
 * closed by libzmq). A connection refused, failed or closed reports its
 * end, so live[k] comes back down. */

static void gate_drain_monitors(kvp_kvpub *p)
{
    for (int k = 0; k < 2; k++) {
        if (!p->mon[k])
            continue;
        for (;;) {
            zmq_msg_t ev, addr;
            zmq_msg_init(&ev);
            if (zmq_msg_recv(&ev, p->mon[k], ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&ev);
                break;
            }
            uint16_t id = 0;
            if (zmq_msg_size(&ev) >= 6)
                memcpy(&id, zmq_msg_data(&ev), sizeof id);
            int more = zmq_msg_more(&ev);
            zmq_msg_close(&ev);
            while (more) { /* the endpoint frame */
                zmq_msg_init(&addr);
                if (zmq_msg_recv(&addr, p->mon[k], 0) < 0) {
                    zmq_msg_close(&addr);
                    break;
                }
                more = zmq_msg_more(&addr);
                zmq_msg_close(&addr);
            }
            if (id == ZMQ_EVENT_ACCEPTED)
                p->live[k]++;
            else if (id == ZMQ_EVENT_DISCONNECTED && p->live[k] > 0)
                p->live[k]--;
        }
    }
}

/* The tenant a PLAIN ZAP request's credentials prove (frames f[0..n): version,
 * request id, domain, address, identity, mechanism, username, password), or
 * NULL. The password is compared in constant time, against a dummy when the
 * username names no tenant. */
static const ptenant *gate_credential(const kvp_kvpub *p, zmq_msg_t *f, size_t n)
{
    if (n != 8 || zmq_msg_size(&f[5]) != 5 || memcmp(zmq_msg_data(&f[5]), "PLAIN", 5) != 0)
        return NULL;
    const ptenant *t = tenant_named(p, zmq_msg_data(&f[6]), zmq_msg_size(&f[6]));
    static const char dummy[PLAIN_MAX + 1] = {0};
    int eq = kvp_secret_equal(zmq_msg_data(&f[7]), zmq_msg_size(&f[7]), t ? t->token : dummy,
                              t ? t->token_len : sizeof dummy);
    return t && eq ? t : NULL;
}

/* Answers the ZAP requests waiting: 200 within the cap (and, with tenants,
 * for a tenant's credentials, the User-Id then the tenant), 400 else. */
static void gate_answer(kvp_kvpub *p)
{
    for (;;) {
        zmq_msg_t f[8];
        size_t n = 0;
        int more = 1;
        while (more) {
            zmq_msg_t *dst = &f[n < 8 ? n : 7];
            if (n >= 8)
                zmq_msg_close(dst);
            zmq_msg_init(dst);
            if (zmq_msg_recv(dst, p->zap, n ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(dst);
                break;
            }
            more = zmq_msg_more(dst);
            if (n < 8)
                n++;
        }
        if (!n)
            return;
        gate_drain_monitors(p);
        int k = n >= 3 && zmq_msg_size(&f[2]) == 13 &&
                memcmp(zmq_msg_data(&f[2]), "kvpool-replay", 13) == 0;
        const char *why = NULL;
        const ptenant *t = NULL;
        if (n < 2) {
            why = "malformed request";
        } else if (p->live[k] > (int64_t)p->cap[k]) {
            why = "too many connections";
            KVP_WARN_LIMITED(MOD, "%s: %u connections at once: one more refused",
                             k ? "replay" : "pub", p->cap[k]);
        } else if (p->nten && !(t = gate_credential(p, f, n))) {
            why = "bad credentials";
            KVP_WARN_LIMITED(MOD, "%s: a connection without a tenant's credentials refused",
                             k ? "replay" : "pub");
            pthread_mutex_lock(&p->mu);
            p->st.auth_refused++;
            pthread_mutex_unlock(&p->mu);
        }
        /* version, request id (echoed), status, text, user id, metadata */
        zmq_send(p->zap, "1.0", 3, ZMQ_SNDMORE);
        if (n >= 2)
            zmq_msg_send(&f[1], p->zap, ZMQ_SNDMORE);
        else
            zmq_send(p->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(p->zap, why ? "400" : "200", 3, ZMQ_SNDMORE);
        zmq_send(p->zap, why ? why : "OK", strlen(why ? why : "OK"), ZMQ_SNDMORE);
        zmq_send(p->zap, t ? t->name : "", t ? t->name_len : 0, ZMQ_SNDMORE);
        zmq_send(p->zap, "", 0, 0);
        for (size_t i = 0; i < n; i++) /* f[1], once sent, is empty */
            zmq_msg_close(&f[i]);
    }
}

/* --- the thread */

static void *pub_main(void *arg)
{
    kvp_kvpub *p = arg;
    pthread_setname_np(pthread_self(), "kvp-kvpub");
    for (;;) {
        zmq_pollitem_t it[4] = {{.fd = p->efd, .events = ZMQ_POLLIN},
                                {.socket = p->zap, .events = ZMQ_POLLIN}};
        int nit = 2;
        if (p->nten)
            it[nit++] = (zmq_pollitem_t){.socket = p->pub, .events = ZMQ_POLLIN};
        if (p->router && !p->rp.on)
            it[nit++] = (zmq_pollitem_t){.socket = p->router, .events = ZMQ_POLLIN};
        long timeout = !p->rp.on ? -1 : p->rp.paused_ms ? PAUSE_POLL_MS : 0;
        if (zmq_poll(it, nit, timeout) > 0 && (it[0].revents & ZMQ_POLLIN)) {
            uint64_t v; /* reset before the queue is taken */
            ssize_t rd = read(p->efd, &v, sizeof v);
            (void)rd;
        }
        if (it[1].revents & ZMQ_POLLIN)
            gate_answer(p);
        else
            gate_drain_monitors(p);
        if (p->nten) /* before the PUB is used for anything else (see above) */
            take_subscriptions(p);
        pthread_mutex_lock(&p->mu);
        qitem *q = p->head;
        p->head = p->tail = NULL;
        int quit = p->quit;
        pthread_mutex_unlock(&p->mu);
        /* quit: no submit runs or follows, so q is everything left */
        publish_list(p, q, quit ? kvp_now_ms() + DRAIN_MS : 0);
        if (quit)
            break;
        if (p->rp.on)
            replay_step(p);
        else if (p->router)
            take_requests(p);
    }
    if (p->rp.on)
        KVP_DEBUG(MOD, "closing: a replay in progress is abandoned");
    zmq_close(p->pub);
    if (p->router)
        zmq_close(p->router);
    for (int k = 0; k < 2; k++)
        if (p->mon[k])
            zmq_close(p->mon[k]);
    zmq_close(p->zap);
    return NULL;
}

/* --- life */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* "tcp://HOST:PORT" text, short enough to bind and report. */
static int endpoint_ok(const char *ep)
{
    if (!ep || strncmp(ep, "tcp://", 6) != 0 || strlen(ep) >= EP_LEN)
        return 0;
    const char *colon = strrchr(ep + 6, ':');
    return colon && colon > ep + 6 && colon[1];
}

/* Binds sock to ep and stores the bound endpoint in bound[EP_LEN]. */
static int bind_one(void *sock, const char *what, const char *ep, char *bound, char *err,
                    size_t errlen)
{
    if (zmq_bind(sock, ep) != 0) {
        int e = zmq_errno();
        seterr(err, errlen, "%s: cannot bind %s: %s", what, ep, zmq_strerror(e));
        return e == EINVAL || e == EPROTONOSUPPORT || e == ENODEV ? KVP_EINVALID_PARAMS
                                                                  : KVP_EIO;
    }
    size_t len = EP_LEN;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0)
        snprintf(bound, EP_LEN, "%s", ep);
    return 0;
}

static int sockopt_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

/* Frees what create made; the thread is not running. */
static void release(kvp_kvpub *p)
{
    if (p->pub)
        zmq_close(p->pub);
    if (p->router)
        zmq_close(p->router);
    for (int k = 0; k < 2; k++)
        if (p->mon[k])
            zmq_close(p->mon[k]);
    if (p->zap)
        zmq_close(p->zap);
    if (p->zctx)
        while (zmq_ctx_term(p->zctx) != 0 && zmq_errno() == EINTR)
            ;
    if (p->efd >= 0)
        close(p->efd);
    while (p->head) {
        qitem *q = p->head;
        p->head = q->next;
        kvp_free(q);
    }
    if (p->ring)
        while (p->first < p->next)
            ring_pop(p);
    kvp_free(p->ring);
    if (p->ten)
        explicit_bzero(p->ten, p->nten * sizeof *p->ten); /* the tokens */
    kvp_free(p->ten);
    kvp_buf_free(&p->enc);
    pthread_mutex_destroy(&p->mu);
    kvp_free(p);
}

/* Puts sock behind the gate as gate k: its ZAP domain, its monitor. */
static int gate_socket(kvp_kvpub *p, int k, void *sock, const char *domain)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://kvpool-kvpub-mon-%d", k);
    if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0 ||
        zmq_socket_monitor(sock, ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        !(p->mon[k] = zmq_socket(p->zctx, ZMQ_PAIR)))
        return -1;
    /* no high-water mark: an event dropped would leave live[k] wrong for
     * good (a lost end: a slot never given back); the thread drains them
     * every turn */
    sockopt_int(p->mon[k], ZMQ_RCVHWM, 0);
    sockopt_int(p->mon[k], ZMQ_SNDHWM, 0);
    return zmq_connect(p->mon[k], ep);
}

/* Makes the context and the sockets, and binds them (create's part; every
 * thread libzmq starts here inherits the caller's signal mask). */
static int open_sockets(kvp_kvpub *p, const kvp_kvpub_cfg *cfg, int has_replay, char *err,
                        size_t errlen)
{
    p->zctx = zmq_ctx_new();
    if (!p->zctx || !(p->zap = zmq_socket(p->zctx, ZMQ_REP)) ||
        zmq_bind(p->zap, "inproc://zeromq.zap.01") != 0 ||
        !(p->pub = zmq_socket(p->zctx, p->nten ? ZMQ_XPUB : ZMQ_PUB)) ||
        gate_socket(p, 0, p->pub, "kvpool-pub") != 0 ||
        (p->nten && (sockopt_int(p->pub, ZMQ_XPUB_MANUAL, 1) != 0 ||
                     sockopt_int(p->pub, ZMQ_PLAIN_SERVER, 1) != 0))) {
        seterr(err, errlen, "zmq: %s", zmq_strerror(zmq_errno()));
        return KVP_EIO;
    }
    sockopt_int(p->pub, ZMQ_SNDHWM, (int)(cfg->hwm ? cfg->hwm : DEF_HWM));
    sockopt_int(p->pub, ZMQ_LINGER, LINGER_MS);
    sockopt_int(p->pub, ZMQ_HANDSHAKE_IVL, HANDSHAKE_MS);
    int64_t maxsub = MAX_SUB;
    if (zmq_setsockopt(p->pub, ZMQ_MAXMSGSIZE, &maxsub, sizeof maxsub) != 0) {
        seterr(err, errlen, "zmq: ZMQ_MAXMSGSIZE: %s", zmq_strerror(zmq_errno()));
        return KVP_EIO;
    }
    int rc = bind_one(p->pub, "pub", cfg->pub, p->pub_ep, err, errlen);
    if (rc || !has_replay)
        return rc;
    if (!(p->router = zmq_socket(p->zctx, ZMQ_ROUTER)) ||
        gate_socket(p, 1, p->router, "kvpool-replay") != 0 ||
        (p->nten && sockopt_int(p->router, ZMQ_PLAIN_SERVER, 1) != 0)) {
        seterr(err, errlen, "zmq: %s", zmq_strerror(zmq_errno()));
        return KVP_EIO;
    }
    int64_t maxmsg = MAX_FRAME;
    if (zmq_setsockopt(p->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        seterr(err, errlen, "zmq: ZMQ_MAXMSGSIZE: %s", zmq_strerror(zmq_errno()));
        return KVP_EIO;
    }
    sockopt_int(p->router, ZMQ_HANDSHAKE_IVL, HANDSHAKE_MS);
    sockopt_int(p->router, ZMQ_SNDHWM,
                (int)(2 * (p->ring_cap + 1) < REPLAY_HWM ? 2 * (p->ring_cap + 1) : REPLAY_HWM));
    sockopt_int(p->router, ZMQ_ROUTER_MANDATORY, 1);
    sockopt_int(p->router, ZMQ_LINGER, LINGER_MS);
    return bind_one(p->router, "replay", cfg->replay, p->replay_ep, err, errlen);
}

/* 1 when a is a prefix of b or b of a. */
static int prefix_either(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    return memcmp(a, b, la < lb ? la : lb) == 0;
}

/* The tenants of cfg: names and tokens 1..PLAIN_MAX bytes, and no name a
 * prefix of another's or of "default" (or the other way round; "default"
 * itself may be one): ZeroMQ matches topics by prefix. */
static int tenants_check(const kvp_kvpub_cfg *cfg, char *err, size_t errlen)
{
    if (cfg->ntenants && !cfg->tenants)
        return KVP_EINVALID_PARAMS;
    for (size_t i = 0; i < cfg->ntenants; i++) {
        const kvp_kvpub_tenant *t = &cfg->tenants[i];
        if (!t->name || !t->token || !t->name[0] || !t->token[0] ||
            strlen(t->name) > PLAIN_MAX || strlen(t->token) > PLAIN_MAX) {
            seterr(err, errlen, "KV events: tenant %zu: a name and a token of 1..%d bytes "
                                "(ZeroMQ's PLAIN credentials) are needed", i + 1, PLAIN_MAX);
            return KVP_EINVALID_PARAMS;
        }
        if (strcmp(t->name, KVP_KVPUB_DEFAULT_TOPIC) != 0 &&
            prefix_either(t->name, KVP_KVPUB_DEFAULT_TOPIC)) {
            seterr(err, errlen, "KV events: tenant \"%.64s\" and \"%s\": one name is a prefix of "
                                "the other, and ZeroMQ matches topics by prefix (one tenant's "
                                "subscriber would receive the other's events): rename it",
                   t->name, KVP_KVPUB_DEFAULT_TOPIC);
            return KVP_EINVALID_PARAMS;
        }
        for (size_t j = 0; j < i; j++)
            if (prefix_either(t->name, cfg->tenants[j].name)) {
                seterr(err, errlen, "KV events: tenants \"%.64s\" and \"%.64s\": one name is a "
                                    "prefix of the other, and ZeroMQ matches topics by prefix "
                                    "(one tenant's subscriber would receive the other's events): "
                                    "rename one", cfg->tenants[j].name, t->name);
                return KVP_EINVALID_PARAMS;
            }
    }
    return 0;
}

int kvp_kvpub_create(const kvp_kvpub_cfg *cfg, kvp_kvpub **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!cfg || !out)
        return KVP_EINVALID_PARAMS;
    *out = NULL;
    int has_replay = cfg->replay && cfg->replay[0];
    if (!endpoint_ok(cfg->pub) || (has_replay && !endpoint_ok(cfg->replay))) {
        seterr(err, errlen, "%s endpoint \"%s\" is not tcp://HOST:PORT",
               endpoint_ok(cfg->pub) ? "replay" : "pub",
               endpoint_ok(cfg->pub) ? cfg->replay : cfg->pub ? cfg->pub : "");
        return KVP_EINVALID_PARAMS;
    }
    if (cfg->buffer_batches > MAX_BUFFER_BATCHES || cfg->hwm > INT32_MAX) {
        seterr(err, errlen, "%s out of range", cfg->hwm > INT32_MAX ? "hwm" : "buffer_batches");
        return KVP_EINVALID_PARAMS;
    }
    int trc = tenants_check(cfg, err, errlen);
    if (trc)
        return trc;
    kvp_kvpub *p = kvp_calloc(1, sizeof *p);
    if (!p)
        return KVP_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    if (cfg->ntenants) {
        if (!(p->ten = kvp_calloc(cfg->ntenants, sizeof *p->ten))) {
            release(p);
            return KVP_ENOMEM;
        }
        p->nten = cfg->ntenants;
        for (size_t i = 0; i < p->nten; i++) {
            ptenant *t = &p->ten[i];
            t->name_len = strlen(cfg->tenants[i].name);
            t->token_len = strlen(cfg->tenants[i].token);
            memcpy(t->name, cfg->tenants[i].name, t->name_len);
            memcpy(t->token, cfg->tenants[i].token, t->token_len);
        }
    }
    p->efd = -1;
    p->ring_cap = cfg->buffer_batches ? cfg->buffer_batches : DEF_BUFFER_BATCHES;
    p->ring_max_bytes = cfg->buffer_bytes ? cfg->buffer_bytes : DEF_BUFFER_BYTES;
    p->queue_max = cfg->queue_bytes ? cfg->queue_bytes : DEF_QUEUE_BYTES;
    p->cap[0] = cfg->max_subscribers ? cfg->max_subscribers : DEF_MAX_SUBSCRIBERS;
    p->cap[1] = cfg->max_replay_clients ? cfg->max_replay_clients : DEF_MAX_REPLAY_CLIENTS;
    kvp_buf_init(&p->enc, ENC_CAP);
    p->ring = kvp_calloc(p->ring_cap, sizeof *p->ring);
    if (!p->ring) {
        release(p);
        return KVP_ENOMEM;
    }
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        seterr(err, errlen, "eventfd: %s", strerror(errno));
        release(p);
        return KVP_EIO;
    }
    /* Neither the publisher thread nor libzmq's (started by the first
     * socket) takes an asynchronous signal: the server's signal thread (or
     * Python's main thread) keeps them all. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = open_sockets(p, cfg, has_replay, err, errlen);
    int prc = rc ? 0 : pthread_create(&p->th, NULL, pub_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        seterr(err, errlen, "cannot start the publisher thread: %s", strerror(prc));
        rc = KVP_EIO;
    }
    if (rc) {
        release(p);
        return rc;
    }
    int maj, min, pat;
    zmq_version(&maj, &min, &pat);
    if (p->nten && maj * 10000 + min * 100 + pat < 40305)
        KVP_WARN(MOD, "libzmq %d.%d.%d: before 4.3.5 its XPUB may touch a connection that ended "
                      "while one of its subscriptions waited to be read (upstream 2df7ab6): "
                      "with tenants, use libzmq 4.3.5 or later",
                 maj, min, pat);
    *out = p;
    return 0;
}

int kvp_kvpub_submit(kvp_kvpub *p, const char *topic, size_t topic_len, uint64_t seq, double ts,
                     const kvp_kvev *ev, size_t n)
{
    if (!p || !ev || n == 0 || n > UINT32_MAX || topic_len > KVP_KVPUB_MAX_TOPIC ||
        (topic_len && !topic) || check_events(ev, n))
        return KVP_EINVALID_PARAMS;
    size_t size = sizeof(qitem) + n * sizeof *ev + topic_len;
    qitem *q = kvp_malloc(size);
    if (q) {
        *q = (qitem){.seq = seq, .ts = ts, .n = n, .size = size, .topic_len = (uint32_t)topic_len};
        memcpy(q->ev, ev, n * sizeof *ev);
        if (topic_len)
            memcpy(q->ev + n, topic, topic_len);
    }
    pthread_mutex_lock(&p->mu);
    int rc = !q ? KVP_ENOMEM : size > p->queue_max - p->st.queued_bytes ? KVP_ELIMIT : 0;
    int wake = 0;
    if (rc) {
        p->st.dropped++;
    } else {
        wake = !p->head;
        if (p->tail)
            p->tail->next = q;
        else
            p->head = q;
        p->tail = q;
        p->st.queued_bytes += size;
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        kvp_free(q);
        return rc;
    }
    if (wake) {
        uint64_t one = 1;
        ssize_t wr = write(p->efd, &one, sizeof one);
        (void)wr;
    }
    return 0;
}

void kvp_kvpub_stats_get(kvp_kvpub *p, kvp_kvpub_stats *st)
{
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    pthread_mutex_unlock(&p->mu);
    st->pinned_bytes = atomic_load(&p->pinned);
}

const char *kvp_kvpub_pub_endpoint(const kvp_kvpub *p) { return p->pub_ep; }
const char *kvp_kvpub_replay_endpoint(const kvp_kvpub *p) { return p->replay_ep; }

void kvp_kvpub_destroy(kvp_kvpub *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_mutex_unlock(&p->mu);
    uint64_t one = 1;
    ssize_t wr = write(p->efd, &one, sizeof one);
    (void)wr;
    pthread_join(p->th, NULL);
    p->pub = p->router = p->zap = p->mon[0] = p->mon[1] = NULL; /* closed by the thread */
    release(p);
}
