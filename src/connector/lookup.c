/*
 * lookup.c -- the scheduler <-> worker-rank-0 lookup / admin channel
 * (see lookup.h for the wire format and the contracts).
 */
#include "connector/lookup.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

#define MOD "lookup"
#define TAG_LOOKUP 'L'
#define TAG_RESET 'R'
#define TAG_ERR 'E'
#define LOOKUP_FIXED 8u /* tag + num_tokens + hash_len + apply_eagle */

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int fill_addr(const char *path, struct sockaddr_un *sa)
{
    if (!path || !*path || strlen(path) >= sizeof sa->sun_path)
        return KVP_EINVALID_PARAMS;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, path, strlen(path) + 1);
    return 0;
}

/* Milliseconds from now until deadline_ns, rounded up; 0 when passed. */
static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = kvp_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > 1000000u ? 1000000 : (int)ms;
}

/* ================================================================ server */

struct conn {
    int fd;           /* -1 = free slot */
    uint8_t *buf;     /* received, not yet processed bytes */
    size_t len, alloc;
    uint64_t partial_since_ms; /* 0 = no partial frame held */
};

struct kvp_lookup_server {
    char *path;
    int lfd;
    int wake[2];
    pthread_t th;
    kvp_lookup_handler h;
    struct conn conns[KVP_LOOKUP_MAX_CONNS];
    _Atomic uint64_t served;
};

static void conn_drop(struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    kvp_free(c->buf);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

/* Sends a whole small reply; a peer that does not read is dropped. */
static int conn_reply(struct conn *c, uint8_t tag, const uint8_t *payload, size_t n)
{
    uint8_t out[16];
    put_be32(out, (uint32_t)(1 + n));
    out[4] = tag;
    memcpy(out + 5, payload, n);
    ssize_t w = send(c->fd, out, 5 + n, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w == (ssize_t)(5 + n) ? 0 : -1;
}

/* Handles one complete frame body; -1 closes the connection. */
static int serve_frame(kvp_lookup_server *s, struct conn *c, const uint8_t *p, uint32_t n)
{
    uint8_t tag = p[0];
    if (tag == TAG_LOOKUP) {
        if (n < LOOKUP_FIXED)
            return -1;
        uint32_t num_tokens = get_be32(p + 1);
        size_t hash_len = (size_t)p[5] << 8 | p[6];
        size_t hbytes = n - LOOKUP_FIXED;
        uint8_t apply = p[n - 1];
        if (apply > 1 || hash_len > KVP_LOOKUP_MAX_HASH_LEN)
            return -1;
        if (hash_len == 0 ? hbytes != 0 : hbytes % hash_len != 0)
            return -1;
        size_t nh = hash_len ? hbytes / hash_len : 0;
        uint32_t hit = 0;
        int rc = s->h.lookup(s->h.arg, num_tokens, p + 7, nh, hash_len, apply, &hit);
        if (rc != 0) {
            KVP_WARN(MOD, "lookup callback failed (%d): answering 0", rc);
            hit = 0;
        }
        uint8_t pl[4];
        put_be32(pl, hit);
        atomic_fetch_add(&s->served, 1);
        return conn_reply(c, TAG_LOOKUP, pl, 4);
    }
    if (tag == TAG_RESET) {
        if (n != 1)
            return -1;
        uint8_t ok = s->h.reset && s->h.reset(s->h.arg) == 0 ? 1 : 0;
        atomic_fetch_add(&s->served, 1);
        return conn_reply(c, TAG_RESET, &ok, 1);
    }
    KVP_DEBUG(MOD, "unknown request tag 0x%02x", tag);
    uint8_t z = 0;
    atomic_fetch_add(&s->served, 1);
    return conn_reply(c, TAG_ERR, &z, 1);
}

/* Reads what is available and serves every complete frame; -1 = drop. */
static int conn_read(kvp_lookup_server *s, struct conn *c)
{
    const size_t max = 4 + (size_t)KVP_LOOKUP_MAX_FRAME;
    for (;;) {
        if (c->len == c->alloc) {
            if (c->alloc >= max)
                return -1; /* cannot happen: a full frame is served below */
            size_t na = c->alloc ? c->alloc * 2 : 4096;
            if (na > max)
                na = max;
            uint8_t *nb = kvp_realloc(c->buf, na);
            if (!nb)
                return -1;
            c->buf = nb;
            c->alloc = na;
        }
        ssize_t r = recv(c->fd, c->buf + c->len, c->alloc - c->len, MSG_DONTWAIT);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        c->len += (size_t)r;
        size_t off = 0;
        while (c->len - off >= 4) {
            uint32_t flen = get_be32(c->buf + off);
            if (flen == 0 || flen > KVP_LOOKUP_MAX_FRAME) {
                KVP_DEBUG(MOD, "bad frame length %u: dropping connection", flen);
                return -1;
            }
            if (c->len - off - 4 < flen)
                break;
            if (serve_frame(s, c, c->buf + off + 4, flen) != 0)
                return -1;
            off += 4 + (size_t)flen;
        }
        if (off) {
            memmove(c->buf, c->buf + off, c->len - off);
            c->len -= off;
        }
    }
    if (c->len == 0)
        c->partial_since_ms = 0;
    else if (c->partial_since_ms == 0)
        c->partial_since_ms = kvp_now_ms();
    return 0;
}

static void *server_main(void *arg)
{
    kvp_lookup_server *s = arg;
    struct pollfd pf[2 + KVP_LOOKUP_MAX_CONNS];
    int idx[2 + KVP_LOOKUP_MAX_CONNS];
    for (;;) {
        int n = 0;
        pf[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
        for (int i = 0; i < KVP_LOOKUP_MAX_CONNS; i++)
            if (s->conns[i].fd >= 0) {
                idx[n] = i;
                pf[n++] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
            }
        int r = poll(pf, (nfds_t)n, 500);
        if (r < 0 && errno != EINTR) {
            KVP_ERROR(MOD, "poll: %s", strerror(errno));
            break;
        }
        if (r > 0 && pf[0].revents)
            break;
        if (r > 0 && (pf[1].revents & POLLIN)) {
            int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                int slot = -1;
                for (int i = 0; i < KVP_LOOKUP_MAX_CONNS && slot < 0; i++)
                    if (s->conns[i].fd < 0)
                        slot = i;
                if (slot < 0) {
                    KVP_WARN(MOD, "too many connections: refusing one");
                    close(fd);
                } else {
                    s->conns[slot].fd = fd;
                }
            }
        }
        for (int k = 2; r > 0 && k < n; k++) {
            struct conn *c = &s->conns[idx[k]];
            if (pf[k].revents && conn_read(s, c) != 0)
                conn_drop(c);
        }
        uint64_t now = kvp_now_ms();
        for (int i = 0; i < KVP_LOOKUP_MAX_CONNS; i++) {
            struct conn *c = &s->conns[i];
            if (c->fd >= 0 && c->partial_since_ms &&
                now - c->partial_since_ms > KVP_LOOKUP_IDLE_MS) {
                KVP_WARN(MOD, "partial frame held too long: dropping connection");
                conn_drop(c);
            }
        }
    }
    return NULL;
}

int kvp_lookup_server_start(const char *path, const kvp_lookup_handler *h,
                            kvp_lookup_server **out)
{
    struct sockaddr_un sa;
    if (!out || !h || !h->lookup || fill_addr(path, &sa) != 0)
        return KVP_EINVALID_PARAMS;
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return KVP_EINVALID_PARAMS;
        unlink(path); /* stale socket of a previous server */
    }
    kvp_lookup_server *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return KVP_ENOMEM;
    s->path = kvp_strdup(path);
    if (!s->path) {
        kvp_free(s);
        return KVP_ENOMEM;
    }
    s->h = *h;
    s->wake[0] = s->wake[1] = -1;
    for (int i = 0; i < KVP_LOOKUP_MAX_CONNS; i++)
        s->conns[i].fd = -1;
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = KVP_EIO;
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) != 0)
        goto fail;
    if (listen(s->lfd, 16) != 0 || pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0)
        goto fail_unlink;
    if (pthread_create(&s->th, NULL, server_main, s) != 0)
        goto fail_unlink;
    *out = s;
    return 0;
fail_unlink:
    unlink(path);
fail:
    KVP_ERROR(MOD, "cannot serve %s: %s", path, strerror(errno));
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->wake[0] >= 0) {
        close(s->wake[0]);
        close(s->wake[1]);
    }
    kvp_free(s->path);
    kvp_free(s);
    return rc;
}

void kvp_lookup_server_stop(kvp_lookup_server *s)
{
    if (!s)
        return;
    ssize_t w;
    do
        w = write(s->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(s->th, NULL);
    for (int i = 0; i < KVP_LOOKUP_MAX_CONNS; i++)
        if (s->conns[i].fd >= 0)
            conn_drop(&s->conns[i]);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    unlink(s->path);
    kvp_free(s->path);
    kvp_free(s);
}

uint64_t kvp_lookup_server_served(kvp_lookup_server *s)
{
    return atomic_load(&s->served);
}

/* ================================================================ client */

enum { JOB_QUEUED = 0, JOB_RUNNING, JOB_DONE };
#define NBUCKETS 256u

/*
 * One request: a lookup future (in the map while someone may collect it)
 * or a reset. Reference counted under the client mutex: the map, the queue
 * (then the worker, once popped) and a blocking waiter each hold one.
 */
struct job {
    struct job *qnext, *hnext;
    int refs;
    int state;
    bool cancelled;   /* nobody collects it: the worker skips it if queued */
    uint8_t tag;
    char *id;         /* lookups only */
    uint32_t id_len;
    uint8_t *frame;   /* the whole request, length prefix included */
    size_t frame_len;
    uint64_t deadline_ns;
    int rc;           /* 0 = answered */
    uint32_t hit;
    bool ok;
};

struct kvp_lookup_client {
    struct sockaddr_un sa;
    uint64_t deadline_ns;
    uint64_t reset_deadline_ns; /* resets drain the send queue first */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *qhead, *qtail;
    struct job *tab[NBUCKETS];
    size_t nfut;
    bool stop;
    int wake[2];
    int fd; /* touched by the worker thread only */
    pthread_t th;
};

static uint32_t id_hash(const char *p, uint32_t n)
{
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h % NBUCKETS;
}

static void job_unref(struct job *j)
{
    if (--j->refs > 0)
        return;
    kvp_free(j->id);
    kvp_free(j->frame);
    kvp_free(j);
}

static struct job **fut_slot(kvp_lookup_client *c, const char *id, uint32_t n)
{
    struct job **pp = &c->tab[id_hash(id, n)];
    for (; *pp; pp = &(*pp)->hnext)
        if ((*pp)->id_len == n && memcmp((*pp)->id, id, n) == 0)
            return pp;
    return pp;
}

/* Unlinks j from the map (caller holds mu) and drops the map's reference. */
static void fut_remove(kvp_lookup_client *c, struct job *j)
{
    struct job **pp = fut_slot(c, j->id, j->id_len);
    if (*pp == j) {
        *pp = j->hnext;
        j->hnext = NULL;
        c->nfut--;
        j->cancelled = true;
        job_unref(j);
    }
}

static void enqueue(kvp_lookup_client *c, struct job *j)
{
    j->qnext = NULL;
    if (c->qtail)
        c->qtail->qnext = j;
    else
        c->qhead = j;
    c->qtail = j;
    pthread_cond_broadcast(&c->cv);
}

static void abs_deadline(uint64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

/* Waits (mu held) until j is done or its deadline passed; true if done. */
static bool wait_done(kvp_lookup_client *c, struct job *j)
{
    struct timespec ts;
    abs_deadline(j->deadline_ns, &ts);
    while (j->state != JOB_DONE) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT)
            break;
    }
    return j->state == JOB_DONE;
}

static void client_disconnect(kvp_lookup_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* poll for `ev` on the connection or a stop wake-up; 0 = ready. */
static int wait_io(kvp_lookup_client *c, short ev, uint64_t deadline_ns)
{
    for (;;) {
        int ms = ms_left(deadline_ns);
        if (ms == 0)
            return KVP_ERPC_TIMEOUT;
        struct pollfd pf[2] = {{.fd = c->fd, .events = ev}, {.fd = c->wake[0], .events = POLLIN}};
        int r = poll(pf, 2, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || pf[1].revents)
            return KVP_ERPC_FAIL;
        if (r > 0)
            return 0;
    }
}

/* One request/answer exchange; the worker thread only. */
static int client_exchange(kvp_lookup_client *c, struct job *j)
{
    if (kvp_now_ns() >= j->deadline_ns)
        return KVP_ERPC_TIMEOUT;
    if (c->fd < 0) {
        c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (c->fd < 0)
            return KVP_ERPC_FAIL;
        if (connect(c->fd, (struct sockaddr *)&c->sa, sizeof c->sa) != 0) {
            client_disconnect(c); /* no server (yet): answered as a miss */
            return KVP_ERPC_FAIL;
        }
    }
    size_t off = 0;
    while (off < j->frame_len) {
        ssize_t w = send(c->fd, j->frame + off, j->frame_len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_io(c, POLLOUT, j->deadline_ns);
            if (rc)
                return rc;
            continue;
        }
        return KVP_ERPC_FAIL;
    }
    uint8_t in[4 + 5];
    size_t need = 4, got = 0;
    while (got < need) {
        ssize_t r = recv(c->fd, in + got, need - got, 0);
        if (r > 0) {
            got += (size_t)r;
            if (got == 4 && need == 4) {
                uint32_t flen = get_be32(in);
                if (flen != (j->tag == TAG_LOOKUP ? 5u : 2u))
                    return KVP_ERPC_FAIL;
                need = 4 + flen;
            }
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_io(c, POLLIN, j->deadline_ns);
            if (rc)
                return rc;
            continue;
        }
        return KVP_ERPC_FAIL; /* closed or error */
    }
    if (in[4] != j->tag)
        return KVP_ERPC_FAIL;
    if (j->tag == TAG_LOOKUP) {
        j->hit = get_be32(in + 5);
    } else {
        if (in[5] > 1)
            return KVP_ERPC_FAIL;
        j->ok = in[5] == 1;
    }
    return 0;
}

static void *client_main(void *arg)
{
    kvp_lookup_client *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && !c->qhead)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop)
            break;
        struct job *j = c->qhead;
        c->qhead = j->qnext;
        if (!c->qhead)
            c->qtail = NULL;
        if (j->cancelled) {
            job_unref(j);
            continue;
        }
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&c->mu);
        int rc = client_exchange(c, j);
        if (rc != 0) {
            client_disconnect(c); /* a late answer must never be read as the next one */
            if (j->tag == TAG_LOOKUP)
                KVP_DEBUG(MOD, "lookup failed (%d): hit 0", rc);
        }
        pthread_mutex_lock(&c->mu);
        j->rc = rc;
        if (rc)
            j->hit = 0;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&c->cv);
        job_unref(j);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int kvp_lookup_client_open(const char *path, uint32_t deadline_ms, kvp_lookup_client **out)
{
    kvp_lookup_client *c;
    if (!out)
        return KVP_EINVALID_PARAMS;
    c = kvp_calloc(1, sizeof *c);
    if (!c)
        return KVP_ENOMEM;
    if (fill_addr(path, &c->sa) != 0) {
        kvp_free(c);
        return KVP_EINVALID_PARAMS;
    }
    c->deadline_ns = (uint64_t)(deadline_ms ? deadline_ms : KVP_LOOKUP_DEFAULT_DEADLINE_MS) * 1000000u;
    c->reset_deadline_ns = (uint64_t)KVP_LOOKUP_RESET_DEADLINE_MS * 1000000u;
    c->fd = -1;
    if (pipe2(c->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        kvp_free(c);
        return KVP_EIO;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&c->mu, NULL);
    if (pthread_create(&c->th, NULL, client_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        close(c->wake[0]);
        close(c->wake[1]);
        kvp_free(c);
        return KVP_EIO;
    }
    *out = c;
    return 0;
}

static struct job *job_new(uint8_t tag, size_t body_len, uint64_t deadline_ns)
{
    struct job *j = kvp_calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->frame_len = 4 + body_len;
    j->frame = kvp_malloc(j->frame_len);
    if (!j->frame) {
        kvp_free(j);
        return NULL;
    }
    put_be32(j->frame, (uint32_t)body_len);
    j->frame[4] = tag;
    j->tag = tag;
    j->deadline_ns = deadline_ns;
    return j;
}

int kvp_lookup_client_lookup(kvp_lookup_client *c, const char *req_id, uint32_t id_len,
                             uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                             size_t hash_len, bool non_block, bool apply_eagle, uint32_t *hit)
{
    if (!c || !req_id || !hit || id_len == 0 || id_len > KVP_LOOKUP_MAX_ID)
        return KVP_EINVALID_PARAMS;
    if (nhashes == 0)
        hash_len = 0;
    if (hash_len > KVP_LOOKUP_MAX_HASH_LEN || (nhashes && (!hashes || hash_len == 0)) ||
        (nhashes && nhashes > (KVP_LOOKUP_MAX_FRAME - LOOKUP_FIXED) / hash_len))
        return KVP_EINVALID_PARAMS;
    pthread_mutex_lock(&c->mu);
    struct job *j = *fut_slot(c, req_id, id_len);
    if (!j) {
        size_t hb = nhashes * hash_len;
        j = job_new(TAG_LOOKUP, LOOKUP_FIXED + hb, kvp_now_ns() + c->deadline_ns);
        char *id = j ? kvp_malloc(id_len) : NULL;
        if (!id) {
            if (j)
                job_unref(j);
            pthread_mutex_unlock(&c->mu);
            return KVP_ENOMEM;
        }
        memcpy(id, req_id, id_len);
        j->id = id;
        j->id_len = id_len;
        uint8_t *p = j->frame + 5;
        put_be32(p, num_tokens);
        p[4] = (uint8_t)(hash_len >> 8);
        p[5] = (uint8_t)hash_len;
        if (hb)
            memcpy(p + 6, hashes, hb);
        p[6 + hb] = apply_eagle ? 1 : 0;
        j->refs = 2; /* map + queue */
        struct job **slot = fut_slot(c, req_id, id_len);
        *slot = j;
        c->nfut++;
        enqueue(c, j);
    }
    if (non_block && j->state != JOB_DONE) {
        pthread_mutex_unlock(&c->mu);
        return KVP_LOOKUP_PENDING;
    }
    bool done = wait_done(c, j);
    *hit = done && j->rc == 0 ? j->hit : 0;
    fut_remove(c, j); /* the future is consumed, answered or not */
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void kvp_lookup_client_discard(kvp_lookup_client *c, const char *req_id, uint32_t id_len)
{
    if (!c || !req_id || id_len == 0)
        return;
    pthread_mutex_lock(&c->mu);
    struct job *j = *fut_slot(c, req_id, id_len);
    if (j)
        fut_remove(c, j);
    pthread_mutex_unlock(&c->mu);
}

int kvp_lookup_client_reset(kvp_lookup_client *c, bool *ok)
{
    if (!c || !ok)
        return KVP_EINVALID_PARAMS;
    struct job *j = job_new(TAG_RESET, 1, kvp_now_ns() + c->reset_deadline_ns);
    if (!j)
        return KVP_ENOMEM;
    pthread_mutex_lock(&c->mu);
    j->refs = 2; /* waiter + queue */
    enqueue(c, j);
    bool done = wait_done(c, j);
    int rc = done ? j->rc : KVP_ERPC_TIMEOUT;
    if (rc == 0)
        *ok = j->ok;
    j->cancelled = true;
    job_unref(j);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void kvp_lookup_client_set_reset_deadline(kvp_lookup_client *c, uint32_t ms)
{
    c->reset_deadline_ns = (uint64_t)(ms ? ms : KVP_LOOKUP_RESET_DEADLINE_MS) * 1000000ull;
}

size_t kvp_lookup_client_pending(kvp_lookup_client *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->nfut;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void kvp_lookup_client_close(kvp_lookup_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    ssize_t w;
    do
        w = write(c->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(c->th, NULL);
    while (c->qhead) {
        struct job *j = c->qhead;
        c->qhead = j->qnext;
        job_unref(j);
    }
    for (size_t b = 0; b < NBUCKETS; b++)
        while (c->tab[b])
            fut_remove(c, c->tab[b]);
    client_disconnect(c);
    close(c->wake[0]);
    close(c->wake[1]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    kvp_free(c);
}
