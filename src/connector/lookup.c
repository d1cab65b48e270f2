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
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/sys.h"

#define MOD "lookup"
#define TAG_LOOKUP 'L'
#define TAG_RESET 'R'
#define TAG_ERR 'E'
#define LOOKUP_FIXED 8u /* tag + num_tokens + hash_len + apply_eagle */
#define REJECT_LOG_MS 1000u /* at most one "refused" line per second */

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

_Static_assert(sizeof(((struct sockaddr_un *)0)->sun_path) == KVP_LOOKUP_PATH_MAX,
               "KVP_LOOKUP_PATH_MAX must be sizeof sun_path");

/* The one place a path becomes an address: every path (server and client)
 * goes through here, so none that does not fit sun_path is ever used. */
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

/* ============================================================== decoding */

int kvp_lookup_frame_next(const uint8_t *p, size_t n, const uint8_t **body, uint32_t *body_len)
{
    if (n < 4)
        return 0;
    uint32_t flen = get_be32(p);
    if (flen == 0 || flen > KVP_LOOKUP_MAX_FRAME)
        return KVP_EPROTOCOL;
    if (n - 4 < flen)
        return 0;
    *body = p + 4;
    *body_len = flen;
    return 1;
}

int kvp_lookup_decode(const uint8_t *p, size_t n, kvp_lookup_req *r)
{
    memset(r, 0, sizeof *r);
    if (n == 0)
        return KVP_EPROTOCOL;
    r->tag = p[0];
    if (r->tag == TAG_RESET)
        return n == 1 ? 0 : KVP_EPROTOCOL;
    if (r->tag != TAG_LOOKUP)
        return 0; /* unknown: answered 'E', whatever follows */
    if (n < LOOKUP_FIXED)
        return KVP_EPROTOCOL;
    size_t hash_len = (size_t)p[5] << 8 | p[6];
    size_t hbytes = n - LOOKUP_FIXED;
    uint8_t apply = p[n - 1];
    if (apply > 1 || hash_len > KVP_LOOKUP_MAX_HASH_LEN)
        return KVP_EPROTOCOL;
    if (hash_len == 0 ? hbytes != 0 : hbytes % hash_len != 0)
        return KVP_EPROTOCOL;
    r->num_tokens = get_be32(p + 1);
    r->hash_len = hash_len;
    r->nhashes = hash_len ? hbytes / hash_len : 0;
    r->hashes = r->nhashes ? p + 7 : NULL;
    r->apply_eagle = apply;
    return 0;
}

bool kvp_lookup_peer_allowed(uid_t peer_uid, gid_t peer_gid, uid_t self_uid, const gid_t *group)
{
    return peer_uid == self_uid || (group && peer_gid == *group);
}

/* ================================================================ server */

/*
 * A connection slot. States: free (fd -1); idle (len 0: nothing received
 * that is not answered), closed after idle_ms without a byte; partial
 * (len > 0: a frame begun), closed partial_ms after its first byte if the
 * frame is still not whole. The server thread alone touches the slots.
 */
struct conn {
    int fd;                    /* -1 = free slot */
    uint8_t *buf;              /* received, not yet processed bytes */
    size_t len, alloc;
    uint64_t last_ms;          /* accept, or the last byte received */
    uint64_t partial_since_ms; /* 0 = no partial frame held */
};

struct kvp_lookup_server {
    char *path;
    int lfd;
    int wake[2];
    pthread_t th;
    kvp_lookup_handler h;
    uid_t uid;           /* the peer uid let in */
    bool use_group;
    gid_t gid;           /* use_group: the peer gid let in too */
    uint32_t max_conns, idle_ms, partial_ms;
    struct conn *conns;  /* max_conns slots */
    struct pollfd *pf;   /* 2 + max_conns */
    int *idx;            /* pf[k] -> its slot */
    uint64_t reject_log_ms;   /* server thread: when "refused" was last logged */
    uint64_t reject_unlogged; /* server thread: refused since that line */
    _Atomic uint64_t served, rejected, evicted, expired;
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
    KVP_ASSERT(n <= sizeof out - 5); /* replies carry at most 4 payload bytes */
    put_be32(out, (uint32_t)(1 + n));
    out[4] = tag;
    memcpy(out + 5, payload, n);
    ssize_t w = kvp_sys.send(c->fd, out, 5 + n, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w == (ssize_t)(5 + n) ? 0 : -1;
}

/* Handles one complete frame body; -1 closes the connection. */
static int serve_frame(kvp_lookup_server *s, struct conn *c, const uint8_t *p, uint32_t n)
{
    kvp_lookup_req r;
    if (kvp_lookup_decode(p, n, &r) != 0) {
        KVP_DEBUG(MOD, "malformed request (tag 0x%02x): dropping connection", p[0]);
        return -1;
    }
    atomic_fetch_add(&s->served, 1);
    if (r.tag == TAG_LOOKUP) {
        uint32_t hit = 0;
        int rc = s->h.lookup(s->h.arg, r.num_tokens, r.hashes, r.nhashes, r.hash_len,
                             r.apply_eagle, &hit);
        if (rc != 0) {
            KVP_WARN(MOD, "lookup callback failed (%d): answering 0", rc);
            hit = 0;
        }
        uint8_t pl[4];
        put_be32(pl, hit);
        return conn_reply(c, TAG_LOOKUP, pl, 4);
    }
    if (r.tag == TAG_RESET) {
        uint8_t ok = s->h.reset && s->h.reset(s->h.arg) == 0 ? 1 : 0;
        return conn_reply(c, TAG_RESET, &ok, 1);
    }
    KVP_DEBUG(MOD, "unknown request tag 0x%02x", r.tag);
    uint8_t z = 0;
    return conn_reply(c, TAG_ERR, &z, 1);
}

/* Serves every whole frame at the front of c->buf and keeps the rest;
 * returns the number of frames served, -1 = drop the connection. */
static int conn_serve_buffered(kvp_lookup_server *s, struct conn *c)
{
    size_t off = 0;
    int served = 0;
    for (;;) {
        const uint8_t *body;
        uint32_t blen;
        int rc = kvp_lookup_frame_next(c->buf + off, c->len - off, &body, &blen);
        if (rc < 0) {
            KVP_DEBUG(MOD, "bad frame length: dropping connection");
            return -1;
        }
        if (rc == 0)
            break;
        if (serve_frame(s, c, body, blen) != 0)
            return -1;
        off += 4 + (size_t)blen;
        served++;
    }
    KVP_ASSERT(off <= c->len); /* frame_next only hands out whole frames */
    if (off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    return served;
}

/* Reads what is available and serves every complete frame; -1 = drop.
 * The partial deadline restarts with each frame served. */
static int conn_read(kvp_lookup_server *s, struct conn *c)
{
    const size_t max = 4 + (size_t)KVP_LOOKUP_MAX_FRAME;
    bool served = false;
    for (;;) {
        if (c->len == c->alloc) {
            if (KVP_NEVER(c->alloc >= max))
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
        ssize_t r = kvp_sys.recv(c->fd, c->buf + c->len, c->alloc - c->len, MSG_DONTWAIT);
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
        int n = conn_serve_buffered(s, c);
        if (n < 0)
            return -1;
        served |= n > 0;
    }
    uint64_t now = kvp_now_ms();
    c->last_ms = now;
    if (c->len == 0)
        c->partial_since_ms = 0;
    else if (served || c->partial_since_ms == 0)
        c->partial_since_ms = now;
    return 0;
}

/* When c must be closed if nothing changes: idle or partial deadline. */
static uint64_t conn_deadline_ms(const kvp_lookup_server *s, const struct conn *c)
{
    return c->partial_since_ms ? c->partial_since_ms + s->partial_ms : c->last_ms + s->idle_ms;
}

/* Counts a refused peer (cr NULL: its credentials could not be read);
 * logs at most one line per REJECT_LOG_MS, with the count since the last. */
static void server_note_reject(kvp_lookup_server *s, const struct ucred *cr)
{
    atomic_fetch_add(&s->rejected, 1);
    s->reject_unlogged++;
    uint64_t now = kvp_now_ms();
    if (s->reject_log_ms && now - s->reject_log_ms < REJECT_LOG_MS)
        return;
    char grp[40] = "";
    if (s->use_group)
        snprintf(grp, sizeof grp, " or gid %ld", (long)s->gid);
    KVP_WARN(MOD, "%s: refused %llu connection(s) since the last report (last: uid %ld gid %ld "
                  "pid %ld; only uid %ld%s may connect)",
             s->path, (unsigned long long)s->reject_unlogged, cr ? (long)cr->uid : -1L,
             cr ? (long)cr->gid : -1L, cr ? (long)cr->pid : -1L, (long)s->uid, grp);
    s->reject_log_ms = now;
    s->reject_unlogged = 0;
}

/* A free slot for a new connection: a free one, else the slot evicted to
 * make room -- the idle connection quiet the longest, else (every one holds
 * a partial frame) the partial frame begun the longest ago. Never fails:
 * a new peer always gets in, so no set of held connections locks out the
 * scheduler. */
static struct conn *server_slot(kvp_lookup_server *s)
{
    struct conn *idle = NULL, *partial = NULL;
    for (uint32_t i = 0; i < s->max_conns; i++) {
        struct conn *c = &s->conns[i];
        if (c->fd < 0)
            return c;
        if (c->partial_since_ms == 0) {
            if (!idle || c->last_ms < idle->last_ms)
                idle = c;
        } else if (!partial || c->partial_since_ms < partial->partial_since_ms) {
            partial = c;
        }
    }
    struct conn *v = idle ? idle : partial;
    KVP_DEBUG(MOD, "connection cap %u reached: evicting the oldest %s connection", s->max_conns,
              idle ? "idle" : "partial");
    atomic_fetch_add(&s->evicted, 1);
    conn_drop(v);
    return v;
}

/* Accepts one pending connection: a peer of another uid is closed at once
 * (counted, logged with a rate limit), before it takes a slot. */
static void server_accept(kvp_lookup_server *s)
{
    int fd = kvp_sys.accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cl != sizeof cr) {
        server_note_reject(s, NULL);
        close(fd);
        return;
    }
    if (!kvp_lookup_peer_allowed(cr.uid, cr.gid, s->uid, s->use_group ? &s->gid : NULL)) {
        server_note_reject(s, &cr);
        close(fd);
        return;
    }
    struct conn *c = server_slot(s);
    c->fd = fd;
    c->last_ms = kvp_now_ms();
}

/* Closes every connection past its idle or partial deadline; returns the
 * poll timeout until the next deadline (at most 500 ms). */
static int server_expire(kvp_lookup_server *s)
{
    uint64_t now = kvp_now_ms(), next = now + 500;
    for (uint32_t i = 0; i < s->max_conns; i++) {
        struct conn *c = &s->conns[i];
        if (c->fd < 0)
            continue;
        uint64_t d = conn_deadline_ms(s, c);
        if (d <= now) {
            KVP_DEBUG(MOD, "%s connection past its deadline: closing",
                      c->partial_since_ms ? "partial" : "idle");
            atomic_fetch_add(&s->expired, 1);
            conn_drop(c);
        } else if (d < next) {
            next = d;
        }
    }
    return (int)(next - now);
}

/* The server thread: poll, serve what arrived, accept, then expire (after
 * the reads, so a request that arrived while a callback ran is served, not
 * taken for idleness). */
static void *server_main(void *arg)
{
    kvp_lookup_server *s = arg;
    struct pollfd *pf = s->pf;
    int timeout = 500;
    for (;;) {
        int n = 0;
        pf[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
        for (uint32_t i = 0; i < s->max_conns; i++)
            if (s->conns[i].fd >= 0) {
                s->idx[n] = (int)i;
                pf[n++] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
            }
        int r = kvp_sys.poll(pf, (nfds_t)n, timeout);
        if (r < 0 && errno != EINTR) {
            KVP_ERROR(MOD, "poll: %s", strerror(errno));
            break;
        }
        if (r > 0 && pf[0].revents)
            break;
        /* connections first: an accept may evict a slot polled here */
        for (int k = 2; r > 0 && k < n; k++) {
            struct conn *c = &s->conns[s->idx[k]];
            if (pf[k].revents && conn_read(s, c) != 0)
                conn_drop(c);
        }
        if (r > 0 && (pf[1].revents & POLLIN))
            server_accept(s);
        timeout = server_expire(s);
    }
    return NULL;
}

/* ----------------------------------------------------- the socket file */

/*
 * Makes `path` free for bind: nothing there, or a socket nobody listens on
 * (a dead server's; unlinked). A file of any other kind, a socket someone
 * listens on, or one we cannot probe is an error and is never removed.
 */
static int path_reclaim(const char *path, const struct sockaddr_un *sa)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        KVP_ERROR(MOD, "cannot serve %s: %s", path, strerror(errno));
        return KVP_EINVALID_PARAMS;
    }
    if (!S_ISSOCK(st.st_mode)) {
        KVP_ERROR(MOD, "cannot serve %s: it exists and is not a socket (not removing it)", path);
        return KVP_EINVALID_PARAMS;
    }
    int fd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return KVP_EIO;
    int rc = kvp_sys.connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0 ? 0 : errno;
    close(fd);
    if (rc == ECONNREFUSED) {
        if (unlink(path) == 0 || errno == ENOENT)
            return 0; /* stale socket of a dead server */
        KVP_ERROR(MOD, "cannot remove the stale socket %s: %s", path, strerror(errno));
        return KVP_EINVALID_PARAMS;
    }
    if (rc == 0 || rc == EAGAIN)
        KVP_ERROR(MOD, "cannot serve %s: another server is listening there", path);
    else
        KVP_ERROR(MOD, "cannot serve %s: cannot tell whether the socket there is in use (%s)",
                  path, strerror(rc));
    return KVP_EINVALID_PARAMS;
}

/*
 * Binds and listens on `path` with mode 0600 (0660, group s->gid, with a
 * group) whatever the umask. bind(2) creates the file with 0777 & ~umask;
 * the owner and mode are set with chown and chmod between bind and listen,
 * a window in which nobody can connect (a socket that is not listening
 * refuses every connect), so no peer ever reaches the socket under the
 * umask's mode. (umask(2) around bind would do it in one step but
 * is process-wide: it races with every other thread creating files.) The
 * peer credential check at accept is the real gate; the mode keeps other
 * users from even connecting.
 */
static int server_listen(kvp_lookup_server *s, const struct sockaddr_un *sa)
{
    s->lfd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->lfd < 0 || bind(s->lfd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        KVP_ERROR(MOD, "cannot serve %s: %s", s->path, strerror(errno));
        return KVP_EIO;
    }
    struct stat st;
    const char *why = NULL;
    bool ours = false; /* the file at path is the socket we bound */
    if (lstat(s->path, &st) != 0)
        why = strerror(errno);
    else if (!S_ISSOCK(st.st_mode) || st.st_uid != s->uid)
        why = "the path was replaced after bind";
    else {
        ours = true;
        if ((s->use_group && chown(s->path, (uid_t)-1, s->gid) != 0) ||
            chmod(s->path, s->use_group ? 0660 : 0600) != 0 || listen(s->lfd, 64) != 0)
            why = strerror(errno);
    }
    if (why) {
        KVP_ERROR(MOD, "cannot serve %s: %s", s->path, why);
        if (ours)
            unlink(s->path);
        return KVP_EIO;
    }
    return 0;
}

static void server_free(kvp_lookup_server *s)
{
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->wake[0] >= 0) {
        close(s->wake[0]);
        close(s->wake[1]);
    }
    if (s->conns)
        for (uint32_t i = 0; i < s->max_conns; i++)
            if (s->conns[i].fd >= 0)
                conn_drop(&s->conns[i]);
    kvp_free(s->conns);
    kvp_free(s->pf);
    kvp_free(s->idx);
    kvp_free(s->path);
    kvp_free(s);
}

void kvp_lookup_server_opts_default(kvp_lookup_server_opts *o)
{
    o->max_conns = KVP_LOOKUP_MAX_CONNS;
    o->idle_ms = KVP_LOOKUP_IDLE_MS;
    o->partial_ms = KVP_LOOKUP_PARTIAL_MS;
    o->use_group = false;
    o->gid = 0;
}

/* A new server for `path`, every slot free, nothing open yet. */
static kvp_lookup_server *server_new(const char *path, const kvp_lookup_handler *h,
                                     const kvp_lookup_server_opts *o)
{
    kvp_lookup_server *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->h = *h;
    s->uid = geteuid();
    s->use_group = o->use_group;
    s->gid = o->gid;
    s->max_conns = o->max_conns;
    s->idle_ms = o->idle_ms;
    s->partial_ms = o->partial_ms;
    s->path = kvp_strdup(path);
    s->conns = kvp_calloc(s->max_conns, sizeof *s->conns);
    s->pf = kvp_calloc(2 + (size_t)s->max_conns, sizeof *s->pf);
    s->idx = kvp_calloc(2 + (size_t)s->max_conns, sizeof *s->idx);
    if (!s->path || !s->conns || !s->pf || !s->idx) {
        s->max_conns = 0;
        server_free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < s->max_conns; i++)
        s->conns[i].fd = -1;
    return s;
}

int kvp_lookup_server_start_opts(const char *path, const kvp_lookup_handler *h,
                                 const kvp_lookup_server_opts *opts, kvp_lookup_server **out)
{
    struct sockaddr_un sa;
    if (!out || !h || !h->lookup)
        return KVP_EINVALID_PARAMS;
    if (fill_addr(path, &sa) != 0) {
        if (path && *path)
            KVP_ERROR(MOD, "cannot serve %s: the path is longer than %zu bytes", path,
                      sizeof sa.sun_path - 1);
        return KVP_EINVALID_PARAMS;
    }
    kvp_lookup_server_opts o;
    kvp_lookup_server_opts_default(&o);
    if (opts) {
        if (opts->max_conns)
            o.max_conns = opts->max_conns;
        if (opts->idle_ms)
            o.idle_ms = opts->idle_ms;
        if (opts->partial_ms)
            o.partial_ms = opts->partial_ms;
    }
    if (opts && opts->use_group) {
        o.use_group = true;
        o.gid = opts->gid;
    }
    if (o.max_conns > KVP_LOOKUP_MAX_CONNS_LIMIT || (o.use_group && o.gid == (gid_t)-1))
        return KVP_EINVALID_PARAMS;
    int rc = path_reclaim(path, &sa);
    if (rc != 0)
        return rc;
    kvp_lookup_server *s = server_new(path, h, &o);
    if (!s)
        return KVP_ENOMEM;
    rc = server_listen(s, &sa);
    if (rc != 0) {
        server_free(s);
        return rc;
    }
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0 ||
        pthread_create(&s->th, NULL, server_main, s) != 0) {
        KVP_ERROR(MOD, "cannot serve %s: %s", path, strerror(errno));
        unlink(path);
        server_free(s);
        return KVP_EIO;
    }
    *out = s;
    return 0;
}

int kvp_lookup_server_start(const char *path, const kvp_lookup_handler *h,
                            kvp_lookup_server **out)
{
    return kvp_lookup_server_start_opts(path, h, NULL, out);
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
    unlink(s->path);
    server_free(s);
}

uint64_t kvp_lookup_server_served(kvp_lookup_server *s)
{
    return atomic_load(&s->served);
}

void kvp_lookup_server_get_stats(kvp_lookup_server *s, kvp_lookup_server_stats *st)
{
    st->served = atomic_load(&s->served);
    st->rejected = atomic_load(&s->rejected);
    st->evicted = atomic_load(&s->evicted);
    st->expired = atomic_load(&s->expired);
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
    bool warned_peer; /* worker thread: the wrong-server warning was logged */
    _Atomic int64_t group; /* -1, or the server gid also talked to */
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
        int r = kvp_sys.poll(pf, 2, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || pf[1].revents)
            return KVP_ERPC_FAIL;
        if (r > 0)
            return 0;
    }
}

/*
 * Makes c->fd a connection to a server of our uid: keeps the open one
 * unless the server closed it while it sat unused (end of stream or an
 * error pending on it), else connects. *reused: the connection was
 * already open. The worker thread only.
 */
static int client_connect(kvp_lookup_client *c, bool *reused)
{
    *reused = false;
    if (c->fd >= 0) {
        uint8_t b;
        ssize_t r = kvp_sys.recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
            *reused = true;
            return 0;
        }
        client_disconnect(c); /* closed for idleness or evicted: reopen */
    }
    c->fd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0)
        return KVP_ERPC_FAIL;
    if (kvp_sys.connect(c->fd, (struct sockaddr *)&c->sa, sizeof c->sa) != 0) {
        client_disconnect(c); /* no server (yet): answered as a miss */
        return KVP_ERPC_FAIL;
    }
    struct ucred cr;
    socklen_t cl = sizeof cr;
    int64_t g = atomic_load(&c->group);
    gid_t gid = (gid_t)g;
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cl != sizeof cr ||
        !kvp_lookup_peer_allowed(cr.uid, cr.gid, geteuid(), g >= 0 ? &gid : NULL)) {
        if (!c->warned_peer) /* once: every request would say it again */
            KVP_WARN(MOD, "%s is served by uid %ld gid %ld, not ours: not talking to it "
                          "(every lookup answers 0)",
                     c->sa.sun_path, (long)cr.uid, (long)cr.gid);
        c->warned_peer = true;
        client_disconnect(c);
        return KVP_ERPC_FAIL;
    }
    return 0;
}

/* Sends j and reads its answer on c->fd. KVP_ECLOSED: the connection was
 * closed before any byte of the answer (the request did not run). */
static int client_send_recv(kvp_lookup_client *c, struct job *j)
{
    size_t off = 0;
    while (off < j->frame_len) {
        ssize_t w = kvp_sys.send(c->fd, j->frame + off, j->frame_len - off, MSG_NOSIGNAL);
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
        return w < 0 && (errno == EPIPE || errno == ECONNRESET) ? KVP_ECLOSED : KVP_ERPC_FAIL;
    }
    uint8_t in[4 + 5];
    size_t need = 4, got = 0;
    while (got < need) {
        ssize_t r = kvp_sys.recv(c->fd, in + got, need - got, 0);
        if (r > 0) {
            got += (size_t)r;
            if (got == 4 && need == 4) {
                uint32_t flen = get_be32(in);
                if (flen != (j->tag == TAG_LOOKUP ? 5u : 2u))
                    return KVP_ERPC_FAIL;
                need = 4 + flen;
                KVP_ASSERT(need <= sizeof in);
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
        if (got == 0 && (r == 0 || errno == ECONNRESET))
            return KVP_ECLOSED;
        return KVP_ERPC_FAIL; /* closed mid-answer, or error */
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

/*
 * One request/answer exchange; the worker thread only. A reused connection
 * found closed before the answer (the server's idle timeout or eviction
 * racing with this request) is replaced once, transparently.
 */
static int client_exchange(kvp_lookup_client *c, struct job *j)
{
    if (kvp_now_ns() >= j->deadline_ns)
        return KVP_ERPC_TIMEOUT;
    bool reused;
    int rc = client_connect(c, &reused);
    if (rc == 0)
        rc = client_send_recv(c, j);
    if (rc == KVP_ECLOSED && reused) {
        client_disconnect(c);
        rc = client_connect(c, &reused);
        if (rc == 0)
            rc = client_send_recv(c, j);
    }
    return rc == KVP_ECLOSED ? KVP_ERPC_FAIL : rc;
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
    atomic_init(&c->group, -1);
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

void kvp_lookup_client_set_group(kvp_lookup_client *c, gid_t gid)
{
    atomic_store(&c->group, (int64_t)gid);
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
