/*
 * xfer.c -- the client data plane; see xfer.h.
 *
 * Segment table: a fixed-growth array of entries under `lock` (rwlock).
 * kvp_xfer_run holds it shared for the whole batch, so an entry (and its
 * mapping and connection pool) cannot vanish under a transfer; add / drop
 * take it exclusively and so wait for running batches (which are bounded by
 * their deadline).
 *
 * Transports: an operation table per entry (shm_ops, tcp_ops), chosen when
 * the segment is added. shm maps the memfd lazily on first use (under the
 * entry's `attach_mu`); if the attach fails the entry falls back to tcp.
 * The mapping is not populated at attach (a short-lived client -- one CLI
 * put -- would pay ~0.45 s and the segment's size in RSS for a 4 GiB
 * segment): a transfer populates the page tables of the chunks (2 MiB) it
 * touches the first time it touches them (shm_populate), so a long-lived
 * client's later transfers still run without page faults.
 * Each table names the data path (kvp_xfer_path) its ops are counted under:
 * once a batch's jobs are done, kvp_xfer_run adds each op that ended with
 * status 0 to the path it was planned on (count_ops; kvp_xfer_counts).
 *
 * Threading (decision): a batch is grouped per segment and each group
 * planned as jobs by its transport: shm makes one job (a memcpy loop), tcp
 * deals the ops round-robin over min(ops, conns_per_node) jobs. Every tcp job
 * of the batch, across all segments (and one half of a large shm batch,
 * and device jobs), goes to the client's persistent transfer workers
 * (common/workers.h) while the caller runs the other jobs, then waits (a
 * batch that is a single job runs on the caller's thread). No thread is
 * created or joined per batch (under CPU contention the pool moved 2 MiB shm
 * batches 1.2x faster than threads made per batch). When every worker
 * is busy with other callers' batches, the caller runs its queued jobs
 * itself, in series. A slot is a mutex + fd: a job locks its slot,
 * so one connection carries one job at a time; concurrent batches start at
 * different slots (rotating counter).
 *
 * A job on a connection is a duplex loop (poll): frames go out with sendmsg
 * straight from the caller's iovecs (header + seg_io from a 64-byte stack
 * buffer), answers come in as they arrive, SEG_READ bodies read with readv
 * straight into the caller's iovecs; checksums are computed a window at a
 * time next to the sendmsg / recvmsg that moves it (see tcp_pump). Answers
 * come back in request order
 * (the server serves a connection in order); anything else breaks the
 * connection: the ops still open fail with TRANSFER_FAIL (RPC_TIMEOUT at the
 * deadline) and the fd is closed, to be reconnected by the next job. A
 * pooled connection is polled before each job: one the node has closed
 * meanwhile (its idle timeout, a restart) reads EOF, and is replaced then
 * rather than failing the job's ops.
 */
#include "client/xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/cucx.h"
#include "client/gpu.h"
#include "common/assert.h"
#include "common/clock.h"
#include "common/csum.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/sys.h"
#include "common/workers.h"
#include "kvpool.h"
#include "net/net.h"
#include "node/node.h"

#define MOD "xfer"
#define PREFIX (KVP_FRAME_HDR + KVP_SEG_IO_SIZE)
#define MAX_IOV 64
#define ERR_BODY_MAX 65536

typedef struct slot {
    pthread_mutex_t mu;
    int fd; /* -1 = not connected */
} slot;

typedef struct seg_ent seg_ent;

/* A unit of work of one batch: ops[idx[k * stride]] for k < n, all on
 * segment e. Jobs that want a thread of their own (tcp, device, a split
 * shm batch's first half) run on the transfer workers, the others (a memcpy
 * loop) on the caller's thread. */
typedef struct job {
    kvp_xfer *x;
    seg_ent *e;
    int is_write;
    kvp_xfer_op *ops;
    const size_t *idx;
    size_t n, stride;
    uint64_t deadline_ms;
    void *(*exec)(void *job);
    int own_thread;      /* wants a thread of its own */
    int pooled;          /* handed to the transfer workers */
    int dev;             /* its ops hold device memory (all of one kvp_gpu_dev) */
    kvp_work work;       /* its item for the workers (when pooled) */
} job;
#define JOB_OP(j, k) (&(j)->ops[(j)->idx[(k) * (j)->stride]])

typedef struct xops {
    const char *name;
    /* Plans the ops[idx[0..n)] of one segment as jobs written to out (room
     * for at least conns_per_node); returns how many. */
    size_t (*plan)(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops, const size_t *idx,
                   size_t n, uint64_t deadline_ms, job *out);
    /* The same for ops holding device memory of one device (at most
     * max(conns_per_node, gpu_threads) jobs). */
    size_t (*plan_dev)(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops,
                       const size_t *idx, size_t n, uint64_t deadline_ms, job *out);
    int path;          /* kvp_xfer_path: where its ops' bytes are counted */
} xops;

struct seg_ent {
    uint64_t id;
    const xops *ops;
    char tcp_addr[256];
    char unix_path[108];
    pthread_mutex_t attach_mu;
    uint8_t *map;     /* shm mapping, NULL until attached */
    uint64_t map_size;
    int shm_fd;       /* the unix connection of the attach, kept: its hang-up
                         tells that the node died (under attach_mu) */
    int dead;         /* the node is gone: the mapping is orphaned memory */
    int pinned;       /* the mapping is page-locked for DMA: 1, -1 refused,
                         0 not yet (under attach_mu) */
    uint64_t *populated; /* one bit per 1 << pop_shift bytes of the mapping: its
                            page tables were populated (atomic bits; set at attach) */
    unsigned pop_shift;
    int no_populate;  /* MADV_POPULATE_WRITE refused (EINVAL: before Linux 5.14):
                         transfers fault pages in as they touch them (atomic) */
    slot *slots;      /* conns_per_node */
    unsigned rot;     /* next slot to start at (atomic) */
    int have_ucx;     /* the node offers the ucx transport (set up over tcp_addr) */
    kvp_cucx_peer *ucx; /* its endpoint and rkey, NULL until attached (under
                           attach_mu; kept, replaced in place, until ent_free) */
};

struct kvp_xfer {
    char token[256];
    uint64_t client_id;
    int nconns;
    int force_tcp;
    int use_ucx;      /* segments offering ucx on other hosts go through it */
    int force_ucx;    /* ... and those on this host too */
    int timeout_ms;
    int gpu_threads;
    pthread_rwlock_t lock;
    seg_ent **segs;
    size_t nsegs, cap;
    kvp_workers *workers; /* the batches' threads, started on first use */
    pthread_mutex_t ucx_mu;
    kvp_cucx *ucx;    /* UCX context and worker, made on first use (under ucx_mu) */
    int ucx_broken;   /* UCX could not start: ucx segments use tcp (under ucx_mu) */
    kvp_xfer_counters counts; /* kvp_xfer_counts: relaxed atomic adds only */
    kvp_xfer_shm_stats shm; /* __atomic, relaxed: kvp_xfer_shm_stats_get */
};

static const xops shm_ops, tcp_ops, ucx_ops;
static size_t shm_plan_dev(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops,
                           const size_t *idx, size_t n, uint64_t deadline_ms, job *out);
static size_t tcp_plan_dev(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops,
                           const size_t *idx, size_t n, uint64_t deadline_ms, job *out);

/* --------------------------------------------------------- io helpers */

/* kvp_net_wait with this module's error vocabulary. */
static int wait_fd(int fd, short ev, uint64_t deadline_ms)
{
    int rc = kvp_net_wait(fd, ev, deadline_ms);
    return rc == KVP_EIO ? KVP_ETRANSFER_FAIL : rc;
}

static int send_all(int fd, const void *p, size_t len, uint64_t deadline_ms)
{
    const uint8_t *b = p;
    while (len) {
        ssize_t n = kvp_sys.send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            b += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline_ms);
            if (rc)
                return rc;
            continue;
        }
        return KVP_ETRANSFER_FAIL;
    }
    return 0;
}

/* Receives exactly len bytes; a passed fd (SCM_RIGHTS), if any, goes to
 * *passed (when passed != NULL; extra fds are closed). */
static int recv_all(int fd, void *p, size_t len, uint64_t deadline_ms, int *passed)
{
    uint8_t *b = p;
    while (len) {
        struct iovec iov = {b, len};
        union {
            char buf[CMSG_SPACE(sizeof(int) * 4)];
            struct cmsghdr align;
        } cm;
        struct msghdr mh = {0};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        if (passed) {
            mh.msg_control = cm.buf;
            mh.msg_controllen = sizeof cm.buf;
        }
        ssize_t n = kvp_sys.recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n > 0) {
            if (passed) {
                for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); ch; ch = CMSG_NXTHDR(&mh, ch)) {
                    if (ch->cmsg_level != SOL_SOCKET || ch->cmsg_type != SCM_RIGHTS)
                        continue;
                    size_t k = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                    for (size_t i = 0; i < k; i++) {
                        int f;
                        memcpy(&f, CMSG_DATA(ch) + i * sizeof(int), sizeof f);
                        if (*passed < 0)
                            *passed = f;
                        else
                            close(f);
                    }
                }
            }
            b += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return KVP_ETRANSFER_FAIL;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KVP_ETRANSFER_FAIL;
        int rc = wait_fd(fd, POLLIN, deadline_ms);
        if (rc)
            return rc;
    }
    return 0;
}

/* One request / answer on a fresh connection (HELLO, SHM_ATTACH). The
 * answer body (<= cap bytes) goes to resp. 0 or a negative code (the
 * frame's status when it refused). */
static int simple_call(kvp_xfer *x, int fd, uint16_t op, const uint8_t *body, uint32_t blen,
                       uint8_t *resp, uint32_t cap, uint32_t *rlen, uint64_t deadline_ms,
                       int *passed)
{
    uint8_t h[KVP_FRAME_HDR];
    kvp_frame_hdr fh = {KVP_PROTO_VERSION, 0, op, 1, blen, 0};
    kvp_frame_hdr_encode(h, &fh);
    int rc = send_all(fd, h, sizeof h, deadline_ms);
    if (!rc && blen)
        rc = send_all(fd, body, blen, deadline_ms);
    if (!rc)
        rc = recv_all(fd, h, sizeof h, deadline_ms, passed);
    if (rc)
        return rc;
    if (kvp_frame_hdr_decode(h, cap, &fh) != 0 || !(fh.flags & KVP_FLAG_RESPONSE) ||
        fh.req_id != 1)
        return KVP_ETRANSFER_FAIL;
    if (fh.body_len && (rc = recv_all(fd, resp, fh.body_len, deadline_ms, passed)) != 0)
        return rc;
    *rlen = fh.body_len;
    return fh.status;
}

/*
 * AUTH_CHALLENGE and HELLO (proto/auth.h) on a fresh connection to a
 * storage node: with a cluster token, the node must prove it first (one
 * that cannot gets nothing: KVP_EAUTH); the token itself never crosses.
 */
static int say_hello(kvp_xfer *x, int fd, uint64_t deadline_ms)
{
    uint8_t body[1024], resp[256];
    kvp_auth_creds cr = {{NULL}, {0}};
    if (x->token[0]) {
        cr.key[KVP_AUTH_CLUSTER] = x->token;
        cr.len[KVP_AUTH_CLUSTER] = strlen(x->token);
    }
    kvp_auth_tx t;
    if (kvp_auth_client_begin(&t, &cr) != 0)
        return KVP_EINTERNAL_ERROR;
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_msg_challenge ch = {KVP_PROTO_VERSION, {t.client_nonce, KVP_AUTH_NONCE}, t.has, {NULL, 0}};
    kvp_enc_challenge(&b, &ch);
    uint32_t rl = 0;
    int rc = b.err ? KVP_EINVALID_PARAMS
                   : simple_call(x, fd, KVP_OP_AUTH_CHALLENGE, body, (uint32_t)b.len, resp,
                                 sizeof resp, &rl, deadline_ms, NULL);
    if (rc)
        return rc;
    kvp_msg_challenge_resp cresp;
    if (kvp_dec_challenge_resp(resp, rl, &cresp) != 0)
        return KVP_ETRANSFER_FAIL;
    int bad = kvp_auth_client_verify(&t, &cr, cresp.nonce.p, cresp.server_id, cresp.proof);
    if (bad) {
        KVP_WARN_LIMITED(MOD, "storage node (segment %016llx) could not prove the %s: refused",
                         (unsigned long long)cresp.server_id, kvp_auth_cred_name(bad - 1));
        return KVP_EAUTH;
    }
    uint8_t pr[KVP_AUTH__N][KVP_AUTH_PROOF];
    kvp_msg_hello m = {KVP_PROTO_VERSION, x->client_id, {(const uint8_t *)"client", 6},
                       {{NULL, 0}}};
    kvp_auth_client_proofs(&t, &cr, x->client_id, pr, m.proof);
    b = (kvp_buf){body, 0, sizeof body, sizeof body, 0};
    kvp_enc_hello(&b, &m);
    if (b.err)
        return KVP_EINVALID_PARAMS;
    rc = simple_call(x, fd, KVP_OP_HELLO, body, (uint32_t)b.len, resp, sizeof resp, &rl,
                     deadline_ms, NULL);
    if (rc)
        return rc;
    kvp_msg_hello_resp r;
    if (kvp_dec_hello_resp(resp, rl, &r) != 0 || r.version != KVP_PROTO_VERSION ||
        r.master_id != t.server_id)
        return KVP_ETRANSFER_FAIL;
    return 0;
}

static int iov_total(const struct iovec *iov, int n, uint64_t *tot)
{
    uint64_t t = 0;
    if (n < 0 || (n > 0 && !iov))
        return -1;
    for (int i = 0; i < n; i++)
        t += iov[i].iov_len;
    *tot = t;
    return 0;
}

/* ---------------------------------------------------------------- shm */

int kvp_xfer_shm_check(int fd, uint64_t size, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "fstat of the received fd: %s", strerror(errno));
        return KVP_ETRANSFER_FAIL;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "the received fd is not a memfd (mode %o)", (unsigned)st.st_mode);
        return KVP_ETRANSFER_FAIL;
    }
    if (size == 0 || size > (uint64_t)INT64_MAX || (uint64_t)st.st_size < size) {
        snprintf(err, errlen, "the received memfd has %lld bytes, the node announced %llu",
                 (long long)st.st_size, (unsigned long long)size);
        return KVP_ETRANSFER_FAIL;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(err, errlen, "the received memfd is not sealed against shrinking (%s)",
                 seals < 0 ? strerror(errno) : "no F_SEAL_SHRINK");
        return KVP_ETRANSFER_FAIL;
    }
    if ((uint64_t)st.st_size != size)
        KVP_WARN(MOD, "the received memfd has %lld bytes, the node announced %llu: mapping %llu",
                 (long long)st.st_size, (unsigned long long)size, (unsigned long long)size);
    return 0;
}

/* Maps the segment's memfd (once). 0 or a negative code. */
static int shm_attach(kvp_xfer *x, seg_ent *e, uint64_t deadline_ms)
{
    uint64_t t0 = kvp_now_ns();
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t pl = strlen(e->unix_path);
    if (pl >= sizeof sa.sun_path) /* kvp_xfer_add_segment keeps only paths that fit */
        return KVP_ETRANSFER_FAIL;
    memcpy(sa.sun_path, e->unix_path, pl + 1);
    int fd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return KVP_ETRANSFER_FAIL;
    if (kvp_sys.connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return KVP_ETRANSFER_FAIL;
    }
    kvp_net_set_nonblock(fd, 1);
    int rc = say_hello(x, fd, deadline_ms);
    int mfd = -1;
    uint8_t body[8], resp[8];
    uint32_t rl = 0;
    for (int i = 0; i < 8; i++)
        body[i] = (uint8_t)(e->id >> (8 * i));
    if (!rc)
        rc = simple_call(x, fd, KVP_OP_SHM_ATTACH, body, 8, resp, sizeof resp, &rl, deadline_ms,
                         &mfd);
    if (!rc && (rl != 8 || mfd < 0))
        rc = KVP_ETRANSFER_FAIL;
    if (rc) {
        close(fd);
        if (mfd >= 0)
            close(mfd);
        return rc;
    }
    uint64_t size = 0;
    for (int i = 7; i >= 0; i--)
        size = (size << 8) | resp[i];
    /* a memfd smaller than announced, or one its sender can still shrink,
     * would SIGBUS us on a later access */
    char why[256];
    if (kvp_xfer_shm_check(mfd, size, why, sizeof why) != 0) {
        KVP_WARN(MOD, "segment %016llx: refusing the memfd from %s: %s",
                 (unsigned long long)e->id, e->unix_path, why);
        close(mfd);
        close(fd);
        return KVP_ETRANSFER_FAIL;
    }
    /* no MAP_POPULATE: shm_populate fills the page tables per chunk as
     * transfers reach it; a chunk is 2 MiB, more for segments above 8 TiB
     * (the bitmap stays within 512 KiB) */
    unsigned shift = 21;
    while ((size >> shift) > (1ull << 22))
        shift++;
    uint64_t chunks = ((size - 1) >> shift) + 1;
    uint64_t *bits = kvp_calloc((size_t)((chunks + 63) / 64), sizeof *bits);
    void *p = bits ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0) : MAP_FAILED;
    close(mfd);
    if (p == MAP_FAILED) {
        kvp_free(bits);
        close(fd);
        return bits ? KVP_ETRANSFER_FAIL : KVP_ENOMEM;
    }
    e->populated = bits;
    e->pop_shift = shift;
    e->map_size = size;
    e->shm_fd = fd;
    __atomic_store_n(&e->map, (uint8_t *)p, __ATOMIC_RELEASE); /* read unlocked in ent_ops */
    uint64_t dt = kvp_now_ns() - t0;
    __atomic_fetch_add(&x->shm.attaches, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&x->shm.attach_ns, dt, __ATOMIC_RELAXED);
    KVP_DEBUG(MOD, "segment %016llx: attached %llu MiB over %s in %.3f ms",
              (unsigned long long)e->id, (unsigned long long)(size >> 20), e->unix_path,
              (double)dt / 1e6);
    return 0;
}

/* Connects to the node's unix socket and says HELLO: -1 when nobody answers. */
static int shm_reconnect(kvp_xfer *x, seg_ent *e, uint64_t deadline_ms)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, e->unix_path, strlen(e->unix_path) + 1);
    int fd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (kvp_sys.connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    kvp_net_set_nonblock(fd, 1);
    if (say_hello(x, fd, deadline_ms) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * Is the node behind an attached mapping still there? Its unix connection
 * is silent while it lives; a hang-up (or anything readable) means it
 * closed it: it died, or dropped an idle connection. A fresh connection
 * tells which. Once dead, the mapping is orphaned memory nobody serves,
 * and every later transfer on it fails (TRANSFER_FAIL) instead of
 * "succeeding" into it. Caller holds attach_mu.
 */
static int shm_alive(kvp_xfer *x, seg_ent *e, uint64_t deadline_ms)
{
    if (e->dead)
        return 0;
    struct pollfd p = {e->shm_fd, POLLIN | POLLRDHUP, 0};
    if (e->shm_fd >= 0 && kvp_sys.poll(&p, 1, 0) == 0)
        return 1;
    if (e->shm_fd >= 0)
        close(e->shm_fd);
    uint64_t dl = kvp_now_ms() + 1000;
    e->shm_fd = shm_reconnect(x, e, dl < deadline_ms ? dl : deadline_ms);
    if (e->shm_fd >= 0)
        return 1;
    KVP_WARN_LIMITED(MOD, "segment %016llx: its node closed %s and does not answer: treating "
                          "the shared memory as gone", (unsigned long long)e->id, e->unix_path);
    e->dead = 1;
    return 0;
}

/* XXH3-64 of an op's value (its iovecs), for the tcp paths. */
static uint64_t iov_csum(const struct iovec *v, int n)
{
    if (n == 1)
        return kvp_csum64(v[0].iov_base, v[0].iov_len);
    kvp_csum st;
    kvp_csum_reset(&st);
    for (int i = 0; i < n; i++)
        kvp_csum_update(&st, v[i].iov_base, v[i].iov_len);
    return kvp_csum_digest(&st);
}

/* Feeds bytes [off, off+len) of an iovec list to a checksum state. */
static void hash_range(kvp_csum *st, const struct iovec *v, int n, uint64_t off, uint64_t len)
{
    for (int i = 0; i < n && len; i++) {
        uint64_t l = v[i].iov_len;
        if (off >= l) {
            off -= l;
            continue;
        }
        uint64_t take = l - off < len ? l - off : len;
        kvp_csum_update(st, (const uint8_t *)v[i].iov_base + off, (size_t)take);
        len -= take;
        off = 0;
    }
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * Populates our page tables for the chunks of e's mapping that [off,
 * off+len) touches, the first time any transfer touches each: one
 * MADV_POPULATE_WRITE of a chunk whose pages the node has faulted in
 * costs about what a memcpy of it does; one the node has not (its
 * prefault still running, or off) allocates them, as the memcpy would.
 * Never writes a byte. A failure (out of memory) leaves the copy to fault
 * the pages in itself, as it would anyway. Two threads populating one
 * chunk at once is harmless. The range is within the mapping (checked by
 * the caller).
 */
static void shm_populate(kvp_xfer *x, seg_ent *e, uint64_t off, uint64_t len)
{
    if (!len || __atomic_load_n(&e->no_populate, __ATOMIC_RELAXED))
        return;
    uint64_t csz = 1ull << e->pop_shift, t0 = 0, n = 0;
    for (uint64_t c = off >> e->pop_shift, last = (off + len - 1) >> e->pop_shift; c <= last;
         c++) {
        uint64_t bit = 1ull << (c & 63);
        if (__atomic_load_n(&e->populated[c >> 6], __ATOMIC_RELAXED) & bit)
            continue;
        uint64_t a = c << e->pop_shift;
        uint64_t l = e->map_size - a < csz ? e->map_size - a : csz;
        if (!t0)
            t0 = kvp_now_ns();
        if (madvise(e->map + a, (size_t)l, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
            __atomic_store_n(&e->no_populate, 1, __ATOMIC_RELAXED);
            break;
        }
        __atomic_fetch_or(&e->populated[c >> 6], bit, __ATOMIC_RELAXED);
        n++;
    }
    if (t0) { /* two clock reads per transfer that populates, none otherwise */
        __atomic_fetch_add(&x->shm.populates, n, __ATOMIC_RELAXED);
        __atomic_fetch_add(&x->shm.populate_ns, kvp_now_ns() - t0, __ATOMIC_RELAXED);
    }
}

#define SHM_CHUNK (128u << 10) /* copy, then hash, this much while it is in cache */

static void *shm_exec(void *arg)
{
    job *j = arg;
    seg_ent *e = j->e;
    int is_write = j->is_write;
    kvp_csum st;
    for (size_t k = 0; k < j->n; k++) {
        kvp_xfer_op *op = JOB_OP(j, k);
        const kvp_replica *r = &op->rep;
        if (r->offset > e->map_size || r->length > e->map_size - r->offset) {
            op->status = is_write ? KVP_EINVALID_WRITE : KVP_EINVALID_READ;
            continue;
        }
        shm_populate(j->x, e, r->offset, r->length);
        uint8_t *p = e->map + r->offset;
        if (op->want_csum)
            kvp_csum_reset(&st);
        for (int i = 0; i < op->iovcnt; i++) {
            uint8_t *u = op->iov[i].iov_base;
            for (size_t off = 0, len = op->iov[i].iov_len; off < len; off += SHM_CHUNK) {
                size_t c = len - off < SHM_CHUNK ? len - off : SHM_CHUNK;
                if (is_write)
                    memcpy(p, u + off, c);
                else
                    memcpy(u + off, p, c);
                if (op->want_csum) /* the caller's copy of the chunk is hot */
                    kvp_csum_update(&st, u + off, c);
                p += c;
            }
        }
        if (op->want_csum)
            op->csum = kvp_csum_digest(&st);
        op->status = 0;
    }
    return NULL;
}

/* One job, or two (one on a thread of its own) when the batch is large
 * enough that a second core's memory bandwidth pays for the thread. */
#define SHM_SPLIT_BYTES (4u << 20)
static size_t shm_plan(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops, const size_t *idx,
                       size_t n, uint64_t deadline_ms, job *out)
{
    uint64_t bytes = 0;
    for (size_t k = 0; k < n; k++)
        bytes += ops[idx[k]].rep.length;
    if (n < 2 || bytes < SHM_SPLIT_BYTES || x->nconns < 2) {
        *out = (job){x, e, is_write, ops, idx, n, 1, deadline_ms, shm_exec, 0, 0, 0, {0}};
        return 1;
    }
    out[0] = (job){x, e, is_write, ops, idx, (n + 1) / 2, 2, deadline_ms, shm_exec, 1, 0, 0, {0}};
    out[1] = (job){x, e, is_write, ops, idx + 1, n / 2, 2, deadline_ms, shm_exec, 0, 0, 0, {0}};
    return 2;
}

static const xops shm_ops = {"shm", shm_plan, shm_plan_dev, KVP_XFER_PATH_SHM};

/* ---------------------------------------------------------------- tcp */

/* Locks a slot, waiting no later than the deadline. */
static int slot_lock(slot *s, uint64_t deadline_ms)
{
    for (;;) {
        if (pthread_mutex_trylock(&s->mu) == 0)
            return 0;
        if (kvp_now_ms() >= deadline_ms)
            return KVP_ERPC_TIMEOUT;
        usleep(100);
    }
}

static void fail_from(job *j, size_t from, int code)
{
    for (size_t k = from; k < j->n; k++)
        if (JOB_OP(j, k)->status == 1)
            JOB_OP(j, k)->status = code;
}

/* The frame prefix (header + seg_io) of job op k: request id = the op's
 * index in the batch + 1. */
static void encode_prefix(uint8_t *p, const job *j, size_t k)
{
    const kvp_xfer_op *op = JOB_OP(j, k);
    kvp_frame_hdr fh = {KVP_PROTO_VERSION, 0, j->is_write ? KVP_OP_SEG_WRITE : KVP_OP_SEG_READ,
                        (uint64_t)j->idx[k * j->stride] + 1,
                        (uint32_t)(KVP_SEG_IO_SIZE + (j->is_write ? op->rep.length : 0)), 0};
    kvp_frame_hdr_encode(p, &fh);
    kvp_buf b = {p + KVP_FRAME_HDR, 0, KVP_SEG_IO_SIZE, KVP_SEG_IO_SIZE, 0};
    kvp_enc_seg_io(&b, &op->rep);
}

static int tcp_dev_pump(job *j, int fd);

/*
 * One pass over the bytes: a value's checksum is computed while its bytes
 * move, a window at a time, so that the hash and the copy the kernel makes
 * read the same bytes while they are in this core's cache (L2: 2 MiB on the
 * VM measured), not the whole value -- or, before, a whole sendmsg's worth
 * of values (up to 63) -- first, by which time the first bytes hashed have
 * left it.
 *   write: up to XFER_WCHUNK bytes of the ops' iovecs are hashed, then
 *          handed to one sendmsg (which copies them into the socket); a
 *          sendmsg never carries a value byte not hashed yet (hashed
 *          frontier >= sent frontier), so each checksum covers exactly the
 *          bytes that went out. The window is 1 MiB, not the 32-256 KiB
 *          that would fit L1 as well: on loopback a small sendmsg costs far
 *          more than its copy; with 128 KiB windows the sender spent ~7 us
 *          more CPU per call (0.30 instead of 0.25 s per GB on the 2-vCPU
 *          VM measured) and puts ran 7-12 % slower than hashing whole
 *          values; 1 MiB ones ran as fast (that VM's L3 holds a whole batch,
 *          so whole values were still in cache too; the window bounds the
 *          hashed-ahead bytes to L2 where the L3 is smaller).
 *   read:  one recvmsg lands at most XFER_RCHUNK bytes in the caller's
 *          iovecs and those bytes are hashed right after it, before the
 *          next; recvmsg is repeated while it fills its chunk (the data is
 *          there: no wakeup per call), so small chunks cost little.
 */
#define XFER_WCHUNK (1u << 20)
#define XFER_RCHUNK (128u << 10)

/* Write side of tcp_pump: op hk is the first op whose checksum is not final;
 * [0, hoff) of its value is in st (ops without want_csum pass at once). */
typedef struct whash {
    size_t hk;
    uint64_t hoff;
    kvp_csum st;
} whash;

/* Hashes op k's value up to byte `to` (k == w->hk or k is already done):
 * the checksum is final once `to` reaches the value's end. */
static void whash_to(whash *w, kvp_xfer_op *op, size_t k, uint64_t to)
{
    /* ops are gathered in order, each to its end before the next: none is
     * reached before every op ahead of it was hashed whole */
    KVP_ASSERT(k <= w->hk);
    if (k != w->hk || (op->want_csum && to < op->rep.length && to <= w->hoff))
        return;
    if (!op->want_csum) {
        w->hk++;
        return;
    }
    if (w->hoff == 0 && to == op->rep.length) {
        op->csum = iov_csum(op->iov, op->iovcnt); /* the whole value in one go */
    } else {
        if (w->hoff == 0)
            kvp_csum_reset(&w->st);
        hash_range(&w->st, op->iov, op->iovcnt, w->hoff, to - w->hoff);
        w->hoff = to;
        if (to < op->rep.length)
            return;
        op->csum = kvp_csum_digest(&w->st);
    }
    w->hk++;
    w->hoff = 0;
}

/* The pipelined duplex loop on one connected fd. Returns 0, or the code the
 * remaining ops fail with (the connection is then unusable). */
static int tcp_pump(job *j, int fd)
{
    size_t si = 0, ri = 0;   /* next op to send / to receive */
    whash wh;                /* writes: checksums, hashed ahead of the sends */
    kvp_csum rst;            /* checksum of the answer being received */
    uint64_t soff = 0;       /* bytes of op si's frame already sent */
    uint8_t pre[MAX_IOV][PREFIX]; /* frame prefixes of one sendmsg */
    uint8_t rh[KVP_FRAME_HDR];
    uint32_t rgot = 0;       /* header bytes of the current answer */
    uint64_t rbody = 0, rdone = 0; /* current answer's body length / read */
    int in_body = 0;
    uint8_t sink[4096];
    wh.hk = 0;
    wh.hoff = 0;
    /* every op of a job starts with status 1 (to do); an op's status
     * becomes final only when its answer arrives, after it was sent */
    while (ri < j->n) {
        short ev = POLLIN | (si < j->n ? POLLOUT : 0);
        uint64_t now = kvp_now_ms();
        if (now >= j->deadline_ms)
            return KVP_ERPC_TIMEOUT;
        struct pollfd pf = {fd, ev, 0};
        int pr = kvp_sys.poll(&pf, 1, (int)(j->deadline_ms - now));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return KVP_ETRANSFER_FAIL;
        if (pr == 0)
            return KVP_ERPC_TIMEOUT;
        /* send while the socket takes all that is offered: each sendmsg
         * carries at most XFER_WCHUNK value bytes, hashed just before */
        while ((pf.revents & POLLOUT) && si < j->n) {
            /* gather whole or partial frames while they fit MAX_IOV */
            struct iovec iov[MAX_IOV];
            int n = 0;
            uint64_t off = soff, budget = XFER_WCHUNK, offered = 0;
            for (size_t k = si; k < j->n && n < MAX_IOV - 1 && budget; k++) {
                kvp_xfer_op *op = JOB_OP(j, k);
                uint8_t *p = pre[n];
                encode_prefix(p, j, k);
                if (off < PREFIX) {
                    iov[n].iov_base = p + off;
                    iov[n++].iov_len = PREFIX - off;
                    offered += PREFIX - off;
                    off = 0;
                } else {
                    off -= PREFIX;
                }
                if (!j->is_write)
                    continue;
                /* value bytes [off, end) of op k, hashed before they go */
                uint64_t len = op->rep.length;
                uint64_t end = len - off < budget ? len : off + budget;
                whash_to(&wh, op, k, end);
                budget -= end - off;
                uint64_t ps = 0; /* value offset of piece i */
                for (int i = 0; i < op->iovcnt && ps < end; ps += op->iov[i].iov_len, i++) {
                    uint64_t l = op->iov[i].iov_len;
                    if (ps + l <= off || l == 0)
                        continue;
                    if (n == MAX_IOV) {
                        end = ps; /* the rest waits for a later sendmsg */
                        break;
                    }
                    uint64_t a = off > ps ? off - ps : 0, b = end < ps + l ? end - ps : l;
                    iov[n].iov_base = (uint8_t *)op->iov[i].iov_base + a;
                    iov[n++].iov_len = (size_t)(b - a);
                    offered += b - a;
                }
                if (end < len) /* the op's value goes on in a later sendmsg */
                    break;
                off = 0;
            }
            struct msghdr mh = {0};
            mh.msg_iov = iov;
            mh.msg_iovlen = (size_t)n;
            ssize_t w = n ? kvp_sys.sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return KVP_ETRANSFER_FAIL;
            uint64_t adv = w > 0 ? (uint64_t)w : 0;
            while (adv && si < j->n) {
                kvp_xfer_op *op = JOB_OP(j, si);
                uint64_t flen = PREFIX + (j->is_write ? op->rep.length : 0);
                uint64_t take = flen - soff < adv ? flen - soff : adv;
                soff += take;
                adv -= take;
                if (soff == flen) {
                    si++;
                    soff = 0;
                }
            }
            /* the iovecs held only bytes of frames si.. : all accounted */
            KVP_ASSERT(adv == 0);
            /* a short send: the socket is full (poll again); else go on
             * while the deadline allows */
            if (w <= 0 || (uint64_t)w < offered || kvp_now_ms() >= j->deadline_ms)
                break;
        }
        /* receive while whole reads come back: a short one drained the
         * socket (poll again) */
        for (int more = (pf.revents & (POLLIN | POLLHUP | POLLERR)) != 0; more && ri < j->n;) {
            kvp_xfer_op *op = JOB_OP(j, ri);
            ssize_t r;
            size_t asked;
            if (!in_body) {
                KVP_ASSERT(rgot < KVP_FRAME_HDR);
                asked = KVP_FRAME_HDR - rgot;
                r = kvp_sys.recv(fd, rh + rgot, asked, MSG_DONTWAIT);
                if (r == 0)
                    return KVP_ETRANSFER_FAIL;
                if (r < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                        break;
                    return KVP_ETRANSFER_FAIL;
                }
                more = (size_t)r == asked;
                rgot += (uint32_t)r;
                if (rgot < KVP_FRAME_HDR)
                    continue;
                kvp_frame_hdr fh;
                if (kvp_frame_hdr_decode(rh, UINT32_MAX, &fh) != 0 ||
                    !(fh.flags & KVP_FLAG_RESPONSE) ||
                    fh.req_id != (uint64_t)j->idx[ri * j->stride] + 1)
                    return KVP_ETRANSFER_FAIL;
                rgot = 0;
                if (fh.status != 0) {
                    op->status = fh.status < 0 ? fh.status : KVP_ETRANSFER_FAIL;
                    if (fh.body_len > ERR_BODY_MAX)
                        return KVP_ETRANSFER_FAIL;
                } else if (fh.body_len != (j->is_write ? 0 : op->rep.length)) {
                    return KVP_ETRANSFER_FAIL;
                }
                rbody = fh.body_len;
                rdone = 0;
                in_body = 1;
                if (op->status == 1 && op->want_csum)
                    kvp_csum_reset(&rst);
                if (rbody == 0) {
                    in_body = 0;
                    if (op->status == 1)
                        op->status = 0;
                    ri++;
                }
                continue;
            }
            if (op->status != 1) { /* error text: discard */
                asked = rbody - rdone < sizeof sink ? (size_t)(rbody - rdone) : sizeof sink;
                r = kvp_sys.recv(fd, sink, asked, MSG_DONTWAIT);
            } else {
                /* SEG_READ data: straight into the caller's iovecs, at most
                 * a chunk, hashed below while it is in cache */
                struct iovec iov[MAX_IOV];
                int n = 0;
                uint64_t end = rbody - rdone < XFER_RCHUNK ? rbody : rdone + XFER_RCHUNK;
                uint64_t ps = 0; /* value offset of piece i */
                asked = 0;
                for (int i = 0; i < op->iovcnt && ps < end && n < MAX_IOV;
                     ps += op->iov[i].iov_len, i++) {
                    uint64_t l = op->iov[i].iov_len;
                    if (ps + l <= rdone || l == 0)
                        continue;
                    uint64_t x = rdone > ps ? rdone - ps : 0, y = end < ps + l ? end - ps : l;
                    iov[n].iov_base = (uint8_t *)op->iov[i].iov_base + x;
                    iov[n++].iov_len = (size_t)(y - x);
                    asked += (size_t)(y - x);
                }
                struct msghdr mh = {0};
                mh.msg_iov = iov;
                mh.msg_iovlen = (size_t)n;
                r = kvp_sys.recvmsg(fd, &mh, MSG_DONTWAIT);
            }
            if (r == 0)
                return KVP_ETRANSFER_FAIL;
            if (r < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                    break;
                return KVP_ETRANSFER_FAIL;
            }
            /* a full read: more may be there (read on, within the deadline) */
            more = (size_t)r == asked && kvp_now_ms() < j->deadline_ms;
            if (op->status == 1 && op->want_csum) /* hash what just arrived: hot */
                hash_range(&rst, op->iov, op->iovcnt, rdone, (uint64_t)r);
            rdone += (uint64_t)r;
            /* reads fill iovecs of exactly rep.length == body_len bytes */
            KVP_ASSERT(rdone <= rbody);
            if (rdone == rbody) {
                in_body = 0;
                if (op->status == 1) {
                    if (op->want_csum)
                        op->csum = kvp_csum_digest(&rst);
                    op->status = 0;
                }
                ri++;
            }
        }
    }
    return 0;
}

/* A pooled connection that cannot carry a job: between jobs nothing may
 * arrive, so readable means EOF (the node closed it), a reset, or a stray
 * answer. */
static int pooled_stale(int fd)
{
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    return poll(&p, 1, 0) != 0;
}

/* A locked slot's connection, connected and past HELLO (a pooled one the
 * node closed is replaced). 0, RPC_TIMEOUT or TRANSFER_FAIL. */
static int slot_connect(kvp_xfer *x, seg_ent *e, slot *s, uint64_t deadline_ms)
{
    if (s->fd >= 0 && pooled_stale(s->fd)) {
        close(s->fd);
        s->fd = -1;
    }
    if (s->fd >= 0)
        return 0;
    uint64_t now = kvp_now_ms();
    int ms = deadline_ms > now ? (int)(deadline_ms - now) : 0;
    char err[KVP_NET_ERRLEN];
    int fd = ms > 0 ? kvp_net_connect(e->tcp_addr, ms, err, sizeof err) : KVP_ERPC_TIMEOUT;
    if (fd < 0)
        return fd == KVP_ERPC_TIMEOUT ? KVP_ERPC_TIMEOUT : KVP_ETRANSFER_FAIL;
    kvp_net_set_nonblock(fd, 1);
    int rc = say_hello(x, fd, deadline_ms);
    if (rc) {
        KVP_WARN(MOD, "HELLO to %s: %s", e->tcp_addr, kvp_strerror(rc));
        close(fd);
        return rc == KVP_ERPC_TIMEOUT ? rc : KVP_ETRANSFER_FAIL;
    }
    s->fd = fd;
    return 0;
}

static void *tcp_exec(void *arg)
{
    job *j = arg;
    seg_ent *e = j->e;
    kvp_xfer *x = j->x;
    /* the slot: rotate so concurrent batches spread over the pool */
    unsigned first = __atomic_fetch_add(&e->rot, 1, __ATOMIC_RELAXED);
    slot *s = NULL;
    for (int k = 0; k < x->nconns && !s; k++) {
        slot *c = &e->slots[(first + (unsigned)k) % (unsigned)x->nconns];
        if (pthread_mutex_trylock(&c->mu) == 0)
            s = c;
    }
    if (!s) {
        s = &e->slots[first % (unsigned)x->nconns];
        int rc = slot_lock(s, j->deadline_ms);
        if (rc) {
            fail_from(j, 0, rc);
            return NULL;
        }
    }
    int rc = slot_connect(x, e, s, j->deadline_ms);
    if (!rc)
        rc = j->dev ? tcp_dev_pump(j, s->fd) : tcp_pump(j, s->fd);
    for (size_t k = 0; !rc && k < j->n; k++)
        KVP_ASSERT(JOB_OP(j, k)->status != 1); /* a clean pump answered every op */
    if (rc) {
        fail_from(j, 0, rc);
        if (s->fd >= 0) {
            close(s->fd);
            s->fd = -1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Deals the ops round-robin over min(n, conns_per_node) jobs: job t gets
 * idx[t], idx[t + nj], ... */
static size_t tcp_plan(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops, const size_t *idx,
                       size_t n, uint64_t deadline_ms, job *out)
{
    size_t nj = n < (size_t)x->nconns ? n : (size_t)x->nconns;
    for (size_t t = 0; t < nj; t++)
        out[t] = (job){x, e, is_write, ops, idx + t, (n - t + nj - 1) / nj, nj, deadline_ms,
                       tcp_exec, 1, 0, 0, {0}};
    return nj;
}

static const xops tcp_ops = {"tcp", tcp_plan, tcp_plan_dev, KVP_XFER_PATH_TCP};

/* ---------------------------------------------------------------- ucx */

#define UCX_ATTACH_MAX (2 * KVP_UCX_BLOB_MAX + 64) /* the answer's largest body */

/* The client's UCX context and worker, made on first use; NULL when UCX
 * cannot start here (said once; ucx segments then use tcp). */
static kvp_cucx *ucx_ctx(kvp_xfer *x)
{
    pthread_mutex_lock(&x->ucx_mu);
    if (!x->ucx && !x->ucx_broken) {
        char why[256];
        if (kvp_cucx_create(&x->ucx, why, sizeof why) != 0) {
            x->ucx = NULL;
            x->ucx_broken = 1;
            KVP_WARN(MOD, "protocol ucx: UCX does not start here (%s); using tcp", why);
        }
    }
    kvp_cucx *u = x->ucx;
    pthread_mutex_unlock(&x->ucx_mu);
    return u;
}

/* UCX_ATTACH over one of e's pooled connections, then the endpoint and
 * rkey (e->ucx, made or replaced). Caller holds attach_mu. 0,
 * KVP_ENOT_SUPPORTED (UCX or the node has no ucx transport: use tcp), or
 * why the attach failed (the node is down, ...). */
static int ucx_attach(kvp_xfer *x, seg_ent *e, uint64_t deadline_ms)
{
    kvp_cucx *u = ucx_ctx(x);
    if (!u)
        return KVP_ENOT_SUPPORTED;
    uint8_t *resp = kvp_malloc(UCX_ATTACH_MAX);
    if (!resp)
        return KVP_ENOMEM;
    slot *s = &e->slots[0];
    uint32_t rl = 0;
    int rc = slot_lock(s, deadline_ms);
    if (!rc) {
        rc = slot_connect(x, e, s, deadline_ms);
        uint8_t body[8];
        for (int i = 0; i < 8; i++)
            body[i] = (uint8_t)(e->id >> (8 * i));
        if (!rc)
            rc = simple_call(x, s->fd, KVP_OP_UCX_ATTACH, body, 8, resp, UCX_ATTACH_MAX, &rl,
                             deadline_ms, NULL);
        /* a refusal leaves the connection in step; a failure does not */
        if (rc && rc != KVP_ENOT_SUPPORTED && rc != KVP_ESEGMENT_NOT_FOUND && s->fd >= 0) {
            close(s->fd);
            s->fd = -1;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (!rc)
        rc = kvp_cucx_connect(u, resp, rl, &e->ucx);
    kvp_free(resp);
    return rc;
}

/* The transport of a ucx segment for this batch: attached (again, after
 * its endpoint failed: the node restarted, a deadline cut it), tcp for good
 * when the node or this host has no UCX, NULL when the attach failed. */
static const xops *ucx_ready(kvp_xfer *x, seg_ent *e, uint64_t deadline_ms)
{
    const xops *r = &ucx_ops;
    pthread_mutex_lock(&e->attach_mu);
    if (!e->ucx || kvp_cucx_failed(e->ucx)) {
        int rc = ucx_attach(x, e, deadline_ms);
        if (rc == KVP_ENOT_SUPPORTED) {
            KVP_WARN(MOD, "segment %016llx: no ucx transport at %s; using tcp",
                     (unsigned long long)e->id, e->tcp_addr);
            __atomic_store_n(&e->ops, &tcp_ops, __ATOMIC_RELEASE);
            r = &tcp_ops;
        } else if (rc) {
            KVP_WARN_LIMITED(MOD, "segment %016llx: ucx attach via %s: %s",
                             (unsigned long long)e->id, e->tcp_addr, kvp_strerror(rc));
            r = NULL;
        }
    }
    pthread_mutex_unlock(&e->attach_mu);
    return r;
}

static void *ucx_exec(void *arg)
{
    job *j = arg;
    kvp_xfer_op **v = kvp_malloc(j->n * sizeof *v);
    if (!v) {
        fail_from(j, 0, KVP_ENOMEM);
        return NULL;
    }
    for (size_t k = 0; k < j->n; k++)
        v[k] = JOB_OP(j, k);
    /* e->ucx is set (ent_ops) and never freed while a batch runs */
    kvp_cucx_run(j->x->ucx, j->e->ucx, j->is_write, v, j->n, j->deadline_ms);
    kvp_free(v);
    return NULL;
}

/* One job on the caller's thread: UCX moves the bytes (on RDMA hardware
 * the NIC does), requests of every op in flight at once. */
static size_t ucx_plan(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops, const size_t *idx,
                       size_t n, uint64_t deadline_ms, job *out)
{
    *out = (job){x, e, is_write, ops, idx, n, 1, deadline_ms, ucx_exec, 0, 0, 0, {0}};
    return 1;
}

/* Device memory on a ucx segment goes through the tcp staging path. */
static const xops ucx_ops = {"ucx", ucx_plan, tcp_plan_dev, KVP_XFER_PATH_UCX};

/* ------------------------------------------------------ device memory */

#define DEV_WINDOW 16 /* shm: ops whose copies are in flight per job */
#define REQ_WINDOW 32 /* tcp reads: SEG_READ requests sent ahead of the answer read */

/*
 * Bytes [off, off+len) of op's value against host memory h (the segment at
 * the op's offset + off, or a staging slot): the device pieces become
 * copies in out (d2h: device -> h, else h -> device); host pieces are
 * copied by the CPU right here. Returns the number of copies.
 */
static size_t dev_pieces(const kvp_xfer_op *op, uint64_t off, uint64_t len, uint8_t *h, int d2h,
                         kvp_gpu_piece *out)
{
    size_t n = 0;
    uint64_t ps = 0, end = off + len; /* ps: value offset of piece i */
    for (int i = 0; i < op->iovcnt && ps < end; ps += op->iov[i].iov_len, i++) {
        uint64_t l = op->iov[i].iov_len;
        if (ps + l <= off)
            continue;
        uint64_t a = off > ps ? off - ps : 0, b = end < ps + l ? end - ps : l;
        uint8_t *u = (uint8_t *)op->iov[i].iov_base + a, *hh = h + (ps + a - off);
        if (op->dev[i])
            out[n++] = d2h ? (kvp_gpu_piece){hh, u, (size_t)(b - a)}
                           : (kvp_gpu_piece){u, hh, (size_t)(b - a)};
        else if (d2h)
            memcpy(hh, u, (size_t)(b - a));
        else
            memcpy(u, hh, (size_t)(b - a));
    }
    return n;
}

/* The largest piece count of the job's ops (room for dev_pieces). */
static size_t job_max_pieces(const job *j)
{
    size_t m = 1;
    for (size_t k = 0; k < j->n; k++)
        if ((size_t)JOB_OP(j, k)->iovcnt > m)
            m = (size_t)JOB_OP(j, k)->iovcnt;
    return m;
}

/* A stream of the job's device, current on this thread; NULL: KVP_EDEVICE. */
static kvp_gpu_stream *job_stream(job *j)
{
    kvp_gpu_stream *s = kvp_gpu_stream_get(JOB_OP(j, 0)->gdev);
    if (s && kvp_gpu_stream_bind(s) != 0) {
        kvp_gpu_stream_put(s);
        s = NULL;
    }
    return s;
}

/* Page-locks the segment mapping once, so the GPU copies straight into and
 * out of it; a refusal is logged once and copies still work (the driver
 * then stages them itself, slower). Needs a bound device. */
static void shm_pin(seg_ent *e)
{
    pthread_mutex_lock(&e->attach_mu);
    if (e->pinned == 0) {
        e->pinned = kvp_gpu_host_register(e->map, e->map_size) == 0 ? 1 : -1;
        if (e->pinned < 0)
            KVP_WARN(MOD, "segment %016llx: page-locking its %llu-byte mapping failed; device "
                          "copies go through the driver's staging", (unsigned long long)e->id,
                     (unsigned long long)e->map_size);
    }
    pthread_mutex_unlock(&e->attach_mu);
}

/*
 * shm, device ops: the GPU copies between device memory and the segment
 * mapping; the CPU hashes the segment bytes meanwhile. Writes: copies of up
 * to DEV_WINDOW ops in flight, each op hashed (from the segment: the bytes
 * as they landed) once its copies are done. Reads: each op's value hashed
 * from the segment and checked before its copies are enqueued, so the
 * hash of op k+1 overlaps the DMA of op k and a corrupt value never
 * reaches device memory.
 */
static void *shm_dev_exec(void *arg)
{
    job *j = arg;
    seg_ent *e = j->e;
    int w = j->is_write, err = 0;
    kvp_gpu_piece *pc = kvp_malloc(job_max_pieces(j) * sizeof *pc);
    kvp_gpu_stream *s = pc ? job_stream(j) : NULL;
    if (!pc || !s)
        err = pc ? KVP_EDEVICE : KVP_ENOMEM;
    else
        shm_pin(e);
    uint64_t tk[DEV_WINDOW];
    size_t wk[DEV_WINDOW], head = 0, cnt = 0;
    for (size_t k = 0; k <= j->n; k++) {
        /* retire the oldest op in flight: when the window is full, and all at the end */
        while (cnt && (cnt == DEV_WINDOW || k == j->n)) {
            kvp_xfer_op *op = JOB_OP(j, wk[head]);
            int rc = err ? err : kvp_gpu_wait(s, tk[head], j->deadline_ms);
            if (rc) {
                op->status = err = rc;
            } else {
                if (w && op->want_csum)
                    op->csum = kvp_csum64(e->map + op->rep.offset, op->rep.length);
                op->status = 0;
            }
            head = (head + 1) % DEV_WINDOW;
            cnt--;
        }
        if (k == j->n)
            break;
        kvp_xfer_op *op = JOB_OP(j, k);
        const kvp_replica *r = &op->rep;
        if (err) {
            op->status = err;
            continue;
        }
        if (r->offset > e->map_size || r->length > e->map_size - r->offset) {
            op->status = w ? KVP_EINVALID_WRITE : KVP_EINVALID_READ;
            continue;
        }
        shm_populate(j->x, e, r->offset, r->length);
        uint8_t *p = e->map + r->offset;
        if (!w) {
            op->csum = kvp_csum64(p, r->length);
            if (op->verify && op->csum != op->expect_csum) {
                op->status = KVP_ECHECKSUM_MISMATCH; /* nothing copied */
                continue;
            }
        }
        size_t np = dev_pieces(op, 0, r->length, p, w, pc);
        uint64_t t = kvp_gpu_copy(s, w ? KVP_GPU_D2H : KVP_GPU_H2D, pc, np) == 0 ? kvp_gpu_mark(s) : 0;
        if (!t) {
            op->status = err = KVP_EDEVICE;
            continue;
        }
        tk[(head + cnt) % DEV_WINDOW] = t;
        wk[(head + cnt) % DEV_WINDOW] = k;
        cnt++;
    }
    kvp_gpu_stream_put(s); /* drains: no copy outlives the job */
    kvp_free(pc);
    return NULL;
}

/* Device ops of one segment over shm: min(n, gpu_threads) jobs, each on a
 * thread and a stream of its own (hashing at PCIe speed needs cores). */
static size_t shm_plan_dev(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops,
                           const size_t *idx, size_t n, uint64_t deadline_ms, job *out)
{
    size_t nj = n < (size_t)x->gpu_threads ? n : (size_t)x->gpu_threads;
    for (size_t t = 0; t < nj; t++)
        out[t] = (job){x, e, is_write, ops, idx + t, (n - t + nj - 1) / nj, nj, deadline_ms,
                       shm_dev_exec, 1, 0, 1, {0}};
    return nj;
}

/* tcp, device ops: like tcp_plan, each job's pump is tcp_dev_pump. */
static size_t tcp_plan_dev(kvp_xfer *x, seg_ent *e, int is_write, kvp_xfer_op *ops,
                           const size_t *idx, size_t n, uint64_t deadline_ms, job *out)
{
    size_t nj = tcp_plan(x, e, is_write, ops, idx, n, deadline_ms, out);
    for (size_t t = 0; t < nj; t++)
        out[t].dev = 1;
    return nj;
}

/* Answers of SEG_WRITEs [*ri, upto) of a device job: as many as have
 * arrived (block: all of them, by the deadline). An answer sets its op's
 * status. 0, or the code the remaining ops fail with. */
typedef struct ans_rd {
    uint8_t h[KVP_FRAME_HDR];
    uint32_t got;
    uint64_t skip; /* error text still to discard */
} ans_rd;

static int write_answers(job *j, int fd, size_t *ri, size_t upto, ans_rd *a, int block)
{
    uint8_t sink[4096];
    while (*ri < upto || a->skip) {
        ssize_t r = a->skip ? kvp_sys.recv(fd, sink, a->skip < sizeof sink ? (size_t)a->skip
                                                                           : sizeof sink,
                                           MSG_DONTWAIT)
                            : kvp_sys.recv(fd, a->h + a->got, KVP_FRAME_HDR - a->got, MSG_DONTWAIT);
        if (r == 0)
            return KVP_ETRANSFER_FAIL;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return KVP_ETRANSFER_FAIL;
            if (!block)
                return 0;
            int rc = wait_fd(fd, POLLIN, j->deadline_ms);
            if (rc)
                return rc;
            continue;
        }
        if (a->skip) {
            a->skip -= (uint64_t)r;
            continue;
        }
        if ((a->got += (uint32_t)r) < KVP_FRAME_HDR)
            continue;
        a->got = 0;
        kvp_frame_hdr fh;
        if (*ri >= upto || kvp_frame_hdr_decode(a->h, UINT32_MAX, &fh) != 0 ||
            !(fh.flags & KVP_FLAG_RESPONSE) || fh.req_id != (uint64_t)j->idx[*ri * j->stride] + 1)
            return KVP_ETRANSFER_FAIL;
        kvp_xfer_op *op = JOB_OP(j, *ri);
        if (fh.status == 0 && fh.body_len == 0) {
            op->status = 0;
        } else if (fh.status != 0 && fh.body_len <= ERR_BODY_MAX) {
            op->status = fh.status < 0 ? fh.status : KVP_ETRANSFER_FAIL;
            a->skip = fh.body_len;
        } else {
            return KVP_ETRANSFER_FAIL;
        }
        (*ri)++;
    }
    return 0;
}

/* Staged SEG_WRITEs: the ring's slots are filled device-to-host (chunks of
 * at most one slot, in op order, up to every slot ahead) while the oldest
 * filled slot is hashed and sent. */
static int tcp_dev_write(job *j, int fd, kvp_gpu_stream *s, kvp_gpu_stage *st, kvp_gpu_piece *pc)
{
    size_t ns = kvp_gpu_stage_slots(st), sb = kvp_gpu_stage_slot_bytes(st);
    uint64_t qt[64], ql[64];
    size_t qh = 0, qn = 0, pk = 0, ri = 0;
    uint64_t poff = 0;
    ans_rd ar = {{0}, 0, 0};
    kvp_csum hs;
    KVP_ASSERT(ns <= 64);
    for (size_t ck = 0; ck < j->n; ck++) {
        kvp_xfer_op *op = JOB_OP(j, ck);
        uint8_t pre[PREFIX];
        encode_prefix(pre, j, ck);
        int rc = send_all(fd, pre, PREFIX, j->deadline_ms);
        if (rc)
            return rc;
        if (op->want_csum)
            kvp_csum_reset(&hs);
        for (uint64_t left = op->rep.length; left;) {
            for (; qn < ns && pk < j->n; qn++) { /* fill every free sl */
                kvp_xfer_op *po = JOB_OP(j, pk);
                size_t sl = (qh + qn) % ns;
                uint64_t c = po->rep.length - poff < sb ? po->rep.length - poff : sb;
                size_t np = dev_pieces(po, poff, c, kvp_gpu_stage_slot(st, sl), 1, pc);
                qt[sl] = kvp_gpu_copy(s, KVP_GPU_D2H, pc, np) == 0 ? kvp_gpu_mark(s) : 0;
                ql[sl] = c;
                if (!qt[sl])
                    return KVP_EDEVICE;
                if ((poff += c) == po->rep.length) {
                    pk++;
                    poff = 0;
                }
            }
            if ((rc = kvp_gpu_wait(s, qt[qh], j->deadline_ms)) != 0)
                return rc;
            uint8_t *b = kvp_gpu_stage_slot(st, qh);
            if (op->want_csum)
                kvp_csum_update(&hs, b, (size_t)ql[qh]);
            if ((rc = send_all(fd, b, (size_t)ql[qh], j->deadline_ms)) != 0)
                return rc;
            left -= ql[qh];
            qh = (qh + 1) % ns;
            qn--;
        }
        if (op->want_csum)
            op->csum = kvp_csum_digest(&hs);
        if ((rc = write_answers(j, fd, &ri, ck + 1, &ar, 0)) != 0)
            return rc;
    }
    return write_answers(j, fd, &ri, j->n, &ar, 1);
}

#define LANDING 2 /* a read op whose bytes are verified and on their way to the device */

/* Staged SEG_READs: requests go out REQ_WINDOW ahead; each answer's body
 * is received sl by sl, hashed, and copied host-to-device while the
 * next sl is received. A value that fits one sl is verified before
 * its copy is enqueued; a larger one once it has landed. */
static int tcp_dev_read(job *j, int fd, kvp_gpu_stream *s, kvp_gpu_stage *st, kvp_gpu_piece *pc)
{
    size_t ns = kvp_gpu_stage_slots(st), sb = kvp_gpu_stage_slot_bytes(st), cyc = 0, sent = 0;
    uint64_t slot_t[64] = {0};
    uint8_t sink[4096];
    kvp_csum hs;
    KVP_ASSERT(ns <= 64);
    for (size_t ri = 0; ri < j->n; ri++) {
        uint8_t pre[REQ_WINDOW][PREFIX];
        size_t np0 = 0;
        for (; sent < j->n && sent < ri + REQ_WINDOW; sent++)
            encode_prefix(pre[np0++], j, sent);
        int rc = np0 ? send_all(fd, pre, np0 * PREFIX, j->deadline_ms) : 0;
        uint8_t h[KVP_FRAME_HDR];
        if (rc || (rc = recv_all(fd, h, sizeof h, j->deadline_ms, NULL)) != 0)
            return rc;
        kvp_xfer_op *op = JOB_OP(j, ri);
        kvp_frame_hdr fh;
        if (kvp_frame_hdr_decode(h, UINT32_MAX, &fh) != 0 || !(fh.flags & KVP_FLAG_RESPONSE) ||
            fh.req_id != (uint64_t)j->idx[ri * j->stride] + 1)
            return KVP_ETRANSFER_FAIL;
        if (fh.status != 0) { /* a refusal: its text is discarded */
            if (fh.body_len > ERR_BODY_MAX)
                return KVP_ETRANSFER_FAIL;
            for (uint32_t left = fh.body_len; left;) {
                uint32_t c = left < sizeof sink ? left : (uint32_t)sizeof sink;
                if ((rc = recv_all(fd, sink, c, j->deadline_ms, NULL)) != 0)
                    return rc;
                left -= c;
            }
            op->status = fh.status < 0 ? fh.status : KVP_ETRANSFER_FAIL;
            continue;
        }
        uint64_t len = op->rep.length;
        if (fh.body_len != len)
            return KVP_ETRANSFER_FAIL;
        int whole = len <= sb, bad = 0;
        kvp_csum_reset(&hs);
        for (uint64_t pos = 0; pos < len && !bad;) {
            size_t sl = cyc++ % ns;
            if (slot_t[sl] && (rc = kvp_gpu_wait(s, slot_t[sl], j->deadline_ms)) != 0)
                return rc;
            uint64_t c = len - pos < sb ? len - pos : sb;
            uint8_t *b = kvp_gpu_stage_slot(st, sl);
            if ((rc = recv_all(fd, b, (size_t)c, j->deadline_ms, NULL)) != 0)
                return rc;
            kvp_csum_update(&hs, b, (size_t)c);
            if (whole && op->verify && kvp_csum_digest(&hs) != op->expect_csum) {
                bad = 1; /* nothing of it reaches the device */
                break;
            }
            size_t np = dev_pieces(op, pos, c, b, 0, pc);
            slot_t[sl] = kvp_gpu_copy(s, KVP_GPU_H2D, pc, np) == 0 ? kvp_gpu_mark(s) : 0;
            if (!slot_t[sl])
                return KVP_EDEVICE;
            pos += c;
        }
        op->csum = kvp_csum_digest(&hs);
        op->status = op->verify && op->csum != op->expect_csum ? KVP_ECHECKSUM_MISMATCH : LANDING;
    }
    uint64_t last = 0;
    for (size_t i = 0; i < ns; i++)
        last = slot_t[i] > last ? slot_t[i] : last;
    int rc = last ? kvp_gpu_wait(s, last, j->deadline_ms) : 0;
    for (size_t k = 0; k < j->n; k++)
        if (JOB_OP(j, k)->status == LANDING)
            JOB_OP(j, k)->status = rc;
    return rc;
}

/* A device job on a connected fd: a stream and a staging ring for the
 * job's life; both come back idle (every copy done) whatever happened. */
static int tcp_dev_pump(job *j, int fd)
{
    kvp_gpu_piece *pc = kvp_malloc(job_max_pieces(j) * sizeof *pc);
    kvp_gpu_stream *s = pc ? job_stream(j) : NULL;
    kvp_gpu_stage *st = s ? kvp_gpu_stage_get(JOB_OP(j, 0)->gdev, j->deadline_ms) : NULL;
    int rc;
    if (!st)
        rc = !pc ? KVP_ENOMEM : s && kvp_now_ms() >= j->deadline_ms ? KVP_ERPC_TIMEOUT : KVP_EDEVICE;
    else
        rc = j->is_write ? tcp_dev_write(j, fd, s, st, pc) : tcp_dev_read(j, fd, s, st, pc);
    kvp_gpu_stream_put(s);
    kvp_gpu_stage_put(st);
    kvp_free(pc);
    for (size_t k = 0; rc && k < j->n; k++)
        if (JOB_OP(j, k)->status == LANDING)
            JOB_OP(j, k)->status = rc;
    return rc;
}

/* ----------------------------------------------------------- the table */

/* Device jobs per shm segment: $KVPOOL_GPU_THREADS (1..64), else half the
 * cores, 2 to 8 (each hashes ~10 GB/s from memory; a PCIe 5 link moves
 * ~50 GB/s each way). */
static int default_gpu_threads(void)
{
    const char *e = getenv("KVPOOL_GPU_THREADS");
    char *end;
    long v = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && (*end || v < 1 || v > 64)) {
        KVP_WARN(MOD, "KVPOOL_GPU_THREADS=%s: not a number from 1 to 64; using the default", e);
        v = 0;
    }
    if (v > 0)
        return (int)v;
    long n = sysconf(_SC_NPROCESSORS_ONLN) / 2;
    return n < 2 ? 2 : n > 8 ? 8 : (int)n;
}

int kvp_xfer_create(const kvp_xfer_opts *o, kvp_xfer **out)
{
    kvp_xfer *x = kvp_calloc(1, sizeof *x);
    if (!x)
        return KVP_ENOMEM;
    if (o && o->cluster_token)
        snprintf(x->token, sizeof x->token, "%s", o->cluster_token);
    x->client_id = o ? o->client_id : 0;
    while (x->client_id == 0)
        if (getrandom(&x->client_id, sizeof x->client_id, 0) != sizeof x->client_id)
            x->client_id = (uint64_t)kvp_now_ns() | 1;
    x->nconns = o && o->conns_per_node > 0 ? o->conns_per_node : 4;
    x->force_tcp = o ? o->force_tcp : 0;
    x->use_ucx = o ? o->use_ucx || o->force_ucx : 0;
    x->force_ucx = o ? o->force_ucx : 0;
    x->timeout_ms = o && o->timeout_ms > 0 ? o->timeout_ms : 10000;
    x->gpu_threads = o && o->gpu_threads > 0 ? o->gpu_threads : default_gpu_threads();
    /* enough for the tcp connections of eight nodes (or of concurrent
     * batches) and the device jobs of a segment; threads start only when
     * needed, so a large bound costs nothing unused. Past it, callers run
     * their queued jobs themselves. */
    int nw = 8 * x->nconns > x->gpu_threads ? 8 * x->nconns : x->gpu_threads;
    int rc = kvp_workers_create(nw > 64 ? 64 : nw, "kvp-xfer", &x->workers);
    if (rc) {
        kvp_free(x);
        return rc;
    }
    pthread_rwlock_init(&x->lock, NULL);
    pthread_mutex_init(&x->ucx_mu, NULL);
    *out = x;
    return 0;
}

static void ent_free(kvp_xfer *x, seg_ent *e)
{
    if (e->map && e->pinned == 1)
        kvp_gpu_host_unregister(e->map);
    if (e->map)
        munmap(e->map, e->map_size);
    kvp_free(e->populated);
    if (e->shm_fd >= 0)
        close(e->shm_fd);
    for (int i = 0; e->slots && i < x->nconns; i++) {
        if (e->slots[i].fd >= 0)
            close(e->slots[i].fd);
        pthread_mutex_destroy(&e->slots[i].mu);
    }
    kvp_free(e->slots);
    if (e->ucx)
        kvp_cucx_close(x->ucx, e->ucx);
    pthread_mutex_destroy(&e->attach_mu);
    kvp_free(e);
}

void kvp_xfer_destroy(kvp_xfer *x)
{
    if (!x)
        return;
    for (size_t i = 0; i < x->nsegs; i++)
        ent_free(x, x->segs[i]);
    kvp_free(x->segs);
    kvp_workers_destroy(x->workers);
    kvp_cucx_destroy(x->ucx);
    pthread_mutex_destroy(&x->ucx_mu);
    pthread_rwlock_destroy(&x->lock);
    kvp_free(x);
}

static seg_ent *find(kvp_xfer *x, uint64_t id)
{
    for (size_t i = 0; i < x->nsegs; i++)
        if (x->segs[i]->id == id)
            return x->segs[i];
    return NULL;
}

static int bytes_eq(kvp_bytes b, const char *s)
{
    return b.len == strlen(s) && memcmp(b.p, s, b.len) == 0;
}

/*
 * Caller holds x->lock exclusively (no transfer runs): frees the entries
 * whose shared memory's node is gone (shm_alive). A node that restarts
 * comes back with a new segment id, so nothing would ever touch its old
 * entry again, and its mapping -- up to the whole segment of orphaned
 * memory -- would stay in this process until the client closed. An entry
 * freed while its node lives (it only dropped our idle connection and a
 * fresh one failed) costs a SEGMENT_INFO and a new attach, nothing else.
 */
static void sweep_gone_locked(kvp_xfer *x)
{
    uint64_t dl = kvp_now_ms() + 1000;
    for (size_t i = 0; i < x->nsegs;) {
        seg_ent *e = x->segs[i];
        pthread_mutex_lock(&e->attach_mu);
        int gone = __atomic_load_n(&e->map, __ATOMIC_ACQUIRE) && !shm_alive(x, e, dl);
        pthread_mutex_unlock(&e->attach_mu);
        if (!gone) {
            i++;
            continue;
        }
        KVP_INFO(MOD, "segment %016llx: its node is gone; unmapping its %llu MiB",
                 (unsigned long long)e->id, (unsigned long long)(e->map_size >> 20));
        ent_free(x, e);
        x->segs[i] = x->segs[--x->nsegs];
    }
}

int kvp_xfer_add_segment(kvp_xfer *x, const kvp_seg_desc *d)
{
    if (!d || d->id == 0)
        return KVP_EINVALID_PARAMS;
    pthread_rwlock_wrlock(&x->lock);
    if (find(x, d->id)) {
        pthread_rwlock_unlock(&x->lock);
        return 0;
    }
    sweep_gone_locked(x); /* a new segment: perhaps a restarted node's */
    seg_ent *e = kvp_calloc(1, sizeof *e);
    slot *sl = kvp_calloc((size_t)x->nconns, sizeof *sl);
    if (x->nsegs == x->cap) {
        size_t nc = x->cap ? x->cap * 2 : 8;
        seg_ent **ns = kvp_realloc(x->segs, nc * sizeof *ns);
        if (ns) {
            x->segs = ns;
            x->cap = nc;
        }
    }
    if (!e || !sl || x->nsegs == x->cap) {
        pthread_rwlock_unlock(&x->lock);
        kvp_free(e);
        kvp_free(sl);
        return KVP_ENOMEM;
    }
    e->id = d->id;
    e->slots = sl;
    e->shm_fd = -1;
    pthread_mutex_init(&e->attach_mu, NULL);
    for (int i = 0; i < x->nconns; i++) {
        sl[i].fd = -1;
        pthread_mutex_init(&sl[i].mu, NULL);
    }
    const char *hid = kvp_node_host_id();
    size_t hl = strlen(hid);
    int have_tcp = 0, have_shm = 0;
    for (uint32_t i = 0; i < d->n_endpoints; i++) {
        const kvp_endpoint *ep = &d->endpoints[i];
        if (bytes_eq(ep->transport, "tcp") && ep->addr.len < sizeof e->tcp_addr && !have_tcp) {
            memcpy(e->tcp_addr, ep->addr.p, ep->addr.len);
            have_tcp = 1;
        } else if (bytes_eq(ep->transport, "shm") && ep->addr.len > hl + 1 &&
                   memcmp(ep->addr.p, hid, hl) == 0 && ep->addr.p[hl] == ':' &&
                   ep->addr.len - hl - 1 < sizeof e->unix_path && !have_shm) {
            memcpy(e->unix_path, ep->addr.p + hl + 1, ep->addr.len - hl - 1);
            have_shm = 1;
        } else if (bytes_eq(ep->transport, "ucx")) {
            e->have_ucx = 1; /* set up over the tcp endpoint */
        }
    }
    if (x->force_tcp || !have_tcp)
        e->ops = have_shm && !x->force_tcp ? &shm_ops : &tcp_ops;
    else if (e->have_ucx && x->use_ucx && (!have_shm || x->force_ucx))
        e->ops = &ucx_ops;
    else
        e->ops = have_shm ? &shm_ops : &tcp_ops;
    x->segs[x->nsegs++] = e;
    pthread_rwlock_unlock(&x->lock);
    return 0;
}

int kvp_xfer_has_segment(kvp_xfer *x, uint64_t segment_id)
{
    pthread_rwlock_rdlock(&x->lock);
    int r = find(x, segment_id) != NULL;
    pthread_rwlock_unlock(&x->lock);
    return r;
}

void kvp_xfer_drop_segment(kvp_xfer *x, uint64_t segment_id)
{
    pthread_rwlock_wrlock(&x->lock);
    for (size_t i = 0; i < x->nsegs; i++) {
        if (x->segs[i]->id == segment_id) {
            ent_free(x, x->segs[i]);
            x->segs[i] = x->segs[--x->nsegs];
            break;
        }
    }
    pthread_rwlock_unlock(&x->lock);
}

void kvp_xfer_shm_stats_get(kvp_xfer *x, kvp_xfer_shm_stats *out)
{
    out->attaches = __atomic_load_n(&x->shm.attaches, __ATOMIC_RELAXED);
    out->attach_ns = __atomic_load_n(&x->shm.attach_ns, __ATOMIC_RELAXED);
    out->populates = __atomic_load_n(&x->shm.populates, __ATOMIC_RELAXED);
    out->populate_ns = __atomic_load_n(&x->shm.populate_ns, __ATOMIC_RELAXED);
}

uint8_t *kvp_xfer_shm_map(kvp_xfer *x, uint64_t segment_id, uint64_t *size)
{
    pthread_rwlock_rdlock(&x->lock);
    seg_ent *e = find(x, segment_id);
    uint8_t *m = e ? __atomic_load_n(&e->map, __ATOMIC_ACQUIRE) : NULL;
    *size = m ? e->map_size : 0;
    pthread_rwlock_unlock(&x->lock);
    return m;
}

const char *kvp_xfer_transport(kvp_xfer *x, uint64_t segment_id)
{
    pthread_rwlock_rdlock(&x->lock);
    seg_ent *e = find(x, segment_id);
    const char *r = e ? __atomic_load_n(&e->ops, __ATOMIC_ACQUIRE)->name : NULL;
    pthread_rwlock_unlock(&x->lock);
    return r;
}

/* Resolves the transport of e for this batch: attaches shm on first use,
 * falling back to tcp for good when that fails. */
static const xops *ent_ops(kvp_xfer *x, seg_ent *e, uint64_t deadline_ms)
{
    const xops *o = __atomic_load_n(&e->ops, __ATOMIC_ACQUIRE);
    if (o == &ucx_ops)
        return ucx_ready(x, e, deadline_ms);
    if (o != &shm_ops)
        return o;
    if (__atomic_load_n(&e->map, __ATOMIC_ACQUIRE)) {
        /* attached: a liveness look, skipped while another thread takes one */
        if (pthread_mutex_trylock(&e->attach_mu) != 0)
            return &shm_ops;
        int alive = shm_alive(x, e, deadline_ms);
        pthread_mutex_unlock(&e->attach_mu);
        return alive ? &shm_ops : NULL;
    }
    pthread_mutex_lock(&e->attach_mu);
    if (!e->map) {
        int rc = shm_attach(x, e, deadline_ms);
        if (rc) {
            KVP_WARN(MOD, "segment %016llx: shm attach via %s failed (%s); using tcp",
                     (unsigned long long)e->id, e->unix_path, kvp_strerror(rc));
            if (e->tcp_addr[0])
                __atomic_store_n(&e->ops, &tcp_ops, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&e->attach_mu);
            return e->tcp_addr[0] ? &tcp_ops : NULL;
        }
    }
    pthread_mutex_unlock(&e->attach_mu);
    return &shm_ops;
}

static void job_item(void *arg)
{
    job *j = arg;
    j->exec(j);
}

/* Runs a batch's jobs: those that want a thread of their own go to the
 * persistent workers (unless one job is all there is), the caller runs the
 * rest meanwhile, then waits (kvp_workers_wait runs a queued job here only
 * when every worker is busy). No thread is created or joined here once the
 * workers run. */
static void run_jobs(kvp_xfer *x, job *jobs, size_t nj)
{
    size_t want_threads = 0;
    for (size_t t = 0; t < nj; t++)
        want_threads += jobs[t].own_thread;
    kvp_wbatch b = KVP_WBATCH_INIT;
    for (size_t t = 0; t < nj && (nj > 1 || want_threads > 1); t++)
        if (jobs[t].own_thread) {
            jobs[t].pooled = 1;
            jobs[t].work = (kvp_work){.fn = job_item, .arg = &jobs[t]};
            kvp_workers_submit(x->workers, &b, &jobs[t].work, 1);
        }
    for (size_t t = 0; t < nj; t++)
        if (!jobs[t].pooled)
            jobs[t].exec(&jobs[t]);
    kvp_workers_wait(x->workers, &b);
}

/* kvp_xfer_run's done[i]: 0 while op i is not grouped; 1 once decided
 * without a transport; DONE_PATH + its kvp_xfer_path once planned. */
#define DONE_PATH 2

/* Adds the ops planned on a transport that ended with status 0 to their
 * path's counters: one atomic add per path and field per batch. */
static void count_ops(kvp_xfer *x, int is_write, const kvp_xfer_op *ops, const uint8_t *done,
                      size_t n)
{
    kvp_xfer_counters add = {0};
    for (size_t i = 0; i < n; i++) {
        if (ops[i].status != 0 || done[i] < DONE_PATH ||
            KVP_NEVER(done[i] - DONE_PATH >= KVP_XFER_NPATHS))
            continue;
        kvp_xfer_tally *a = &add.path[done[i] - DONE_PATH];
        if (is_write) {
            a->put_bytes += ops[i].rep.length;
            a->put_ops++;
        } else {
            a->get_bytes += ops[i].rep.length;
            a->get_ops++;
        }
    }
    for (int p = 0; p < KVP_XFER_NPATHS; p++) {
        const kvp_xfer_tally *a = &add.path[p];
        kvp_xfer_tally *c = &x->counts.path[p];
        if (a->put_ops) {
            __atomic_fetch_add(&c->put_bytes, a->put_bytes, __ATOMIC_RELAXED);
            __atomic_fetch_add(&c->put_ops, a->put_ops, __ATOMIC_RELAXED);
        }
        if (a->get_ops) {
            __atomic_fetch_add(&c->get_bytes, a->get_bytes, __ATOMIC_RELAXED);
            __atomic_fetch_add(&c->get_ops, a->get_ops, __ATOMIC_RELAXED);
        }
    }
}

void kvp_xfer_counts(kvp_xfer *x, kvp_xfer_counters *out)
{
    for (int p = 0; p < KVP_XFER_NPATHS; p++) {
        const kvp_xfer_tally *c = &x->counts.path[p];
        out->path[p] = (kvp_xfer_tally){__atomic_load_n(&c->put_bytes, __ATOMIC_RELAXED),
                                        __atomic_load_n(&c->get_bytes, __ATOMIC_RELAXED),
                                        __atomic_load_n(&c->put_ops, __ATOMIC_RELAXED),
                                        __atomic_load_n(&c->get_ops, __ATOMIC_RELAXED)};
    }
}

int kvp_xfer_run(kvp_xfer *x, int is_write, kvp_xfer_op *ops, size_t n, uint64_t deadline_ms)
{
    if (!x || (n && !ops))
        return KVP_EINVALID_PARAMS;
    if (n == 0)
        return 0;
    size_t *idx = kvp_malloc(n * sizeof *idx);
    uint8_t *done = kvp_calloc(n, 1);
    if (!idx || !done) {
        kvp_free(idx);
        kvp_free(done);
        return KVP_ENOMEM;
    }
    /* local checks; status 1 marks "to do" */
    for (size_t i = 0; i < n; i++) {
        uint64_t tot;
        const kvp_replica *r = &ops[i].rep;
        if (iov_total(ops[i].iov, ops[i].iovcnt, &tot) != 0 || tot != r->length ||
            r->length == 0 || r->length > UINT32_MAX - KVP_SEG_IO_SIZE ||
            (ops[i].dev && !ops[i].gdev)) {
            ops[i].status = KVP_EINVALID_PARAMS;
            done[i] = 1;
        } else {
            ops[i].status = 1;
        }
    }
    pthread_rwlock_rdlock(&x->lock);
    /* group by segment (each group a contiguous run of idx), plan jobs */
    job *jobs = kvp_calloc(n, sizeof *jobs);
    size_t nj = 0, used = 0;
    for (size_t i = 0; i < n && jobs; i++) {
        if (done[i])
            continue;
        /* a group: one segment, and host ops or device ops of one device */
        uint64_t sid = ops[i].rep.segment_id;
        struct kvp_gpu_dev *gd = ops[i].dev ? ops[i].gdev : NULL;
        size_t *g = idx + used, m = 0;
        for (size_t k = i; k < n; k++)
            if (!done[k] && ops[k].rep.segment_id == sid &&
                (ops[k].dev ? ops[k].gdev : NULL) == gd) {
                g[m++] = k;
                done[k] = 1;
            }
        used += m;
        seg_ent *e = find(x, sid);
        const xops *o = e ? ent_ops(x, e, deadline_ms) : NULL;
        if (!o) {
            for (size_t k = 0; k < m; k++)
                ops[g[k]].status = e ? KVP_ETRANSFER_FAIL : KVP_ESEGMENT_NOT_FOUND;
            continue;
        }
        /* a plan makes at most one job per op: jobs[] (n) holds them */
        size_t made = gd ? o->plan_dev(x, e, is_write, ops, g, m, deadline_ms, jobs + nj)
                         : o->plan(x, e, is_write, ops, g, m, deadline_ms, jobs + nj);
        KVP_ASSERT(made <= m);
        for (size_t k = 0; k < m; k++)
            done[g[k]] = (uint8_t)(DONE_PATH + o->path);
        nj += made;
    }
    run_jobs(x, jobs, nj);
    count_ops(x, is_write, ops, done, n);
    if (!jobs)
        for (size_t i = 0; i < n; i++)
            if (ops[i].status == 1)
                ops[i].status = KVP_ENOMEM;
    kvp_free(jobs);
    pthread_rwlock_unlock(&x->lock);
    /* every op was decided above or by its job */
    for (size_t i = 0; i < n; i++)
        if (KVP_NEVER(ops[i].status == 1))
            ops[i].status = KVP_ETRANSFER_FAIL;
    kvp_free(idx);
    kvp_free(done);
    return 0;
}
