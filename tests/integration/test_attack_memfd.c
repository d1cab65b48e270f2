/*
 * test_attack_memfd.c -- what a same-host peer can do to a segment with the
 * memfd SHM_ATTACH hands it (docs/SECURITY.md, "Shared memory").
 *
 * The test is that peer: it asks a real node for the memfd over the node's
 * unix socket, as the client library does (HELLO, SHM_ATTACH, SCM_RIGHTS),
 * and tries every way of changing the file rather than the bytes:
 *   refused  shrinking or growing it (ftruncate, fallocate past the end:
 *            F_SEAL_SHRINK | F_SEAL_GROW), and adding seals (F_SEAL_SEAL):
 *            a peer cannot seal the memfd against writes and so lock every
 *            later client out of its writable mapping
 *   allowed  a shared writable mapping (same-host puts memcpy into it), and
 *            therefore punching holes (fallocate PUNCH_HOLE, or MADV_REMOVE
 *            on that mapping): on Linux both need only what a writable
 *            mapping needs, and the seals that refuse them (F_SEAL_WRITE,
 *            F_SEAL_FUTURE_WRITE) also refuse every new writable mapping.
 *            A read-only descriptor would not help either: the holder
 *            reopens /proc/self/fd/N read-write (the memfd is mode 0777).
 *            A hole reads as zeros: like any write by a peer, it corrupts
 *            values, which readers detect (the checksum), and the node keeps
 *            serving (shm_hole_punch_is_detected_not_served)
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

typedef struct env {
    tp_master m;
    tp_store st;
    uint64_t seg;       /* the node's segment id */
    char unix_path[256];
} env;

/* The first segment's id and unix socket path, from the master. */
static int seg_lookup(env *e)
{
    kvp_rpc *r;
    char err[256];
    kvp_rpc_opts o = {.name = "test", .timeout_ms = 2000};
    if (kvp_rpc_open(e->m.addr, &o, &r, err, sizeof err) != 0)
        return -1;
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    int ok = 0;
    kvp_msg_stats_resp s;
    if (kvp_rpc_call(r, KVP_OP_STATS, NULL, 0, &st, &resp, &rl) == 0 && st == 0 &&
        kvp_dec_stats_resp(resp, rl, &lim, &a, &s) == 0 && s.n_segs == 1) {
        e->seg = s.segs[0].id;
        uint8_t body[16];
        kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
        kvp_msg_ids ids = {1, &e->seg};
        kvp_enc_ids(&b, &ids);
        kvp_msg_seg_info_resp si;
        if (kvp_rpc_call(r, KVP_OP_SEGMENT_INFO, body, b.len, &st, &resp, &rl) == 0 && st == 0 &&
            kvp_dec_seg_info_resp(resp, rl, &lim, &a, &si) == 0 && si.n == 1 &&
            si.infos[0].status == 0) {
            const kvp_seg_desc *d = &si.infos[0].desc;
            for (uint32_t i = 0; i < d->n_endpoints; i++) {
                const kvp_endpoint *ep = &d->endpoints[i];
                const uint8_t *c = memchr(ep->addr.p, ':', ep->addr.len);
                size_t n = c ? ep->addr.len - (size_t)(c + 1 - ep->addr.p) : 0;
                if (ep->transport.len == 3 && !memcmp(ep->transport.p, "shm", 3) && c &&
                    n < sizeof e->unix_path) {
                    memcpy(e->unix_path, c + 1, n);
                    e->unix_path[n] = 0;
                    ok = 1;
                }
            }
        }
    }
    kvp_arena_free(&a);
    kvp_rpc_close(r);
    return ok ? 0 : -1;
}

static int env_up(env *e)
{
    memset(e, 0, sizeof *e);
    if (tp_master_start(&e->m, NULL) != 0)
        return -1;
    if (tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", "8MiB", NULL}) !=
            0 ||
        seg_lookup(e) != 0) {
        tp_store_kill(&e->st);
        tp_master_kill(&e->m);
        return -1;
    }
    return 0;
}

static void env_down(env *e)
{
    tp_store_kill(&e->st);
    tp_master_kill(&e->m);
}

/* One request frame on the unix socket; its answer's status (and body). */
static int frame_call(int fd, uint16_t op, const uint8_t *body, uint32_t len, int *memfd,
                      uint8_t *resp, uint32_t cap, uint32_t *rlen)
{
    uint8_t hdr[KVP_FRAME_HDR];
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, op, 1, len, 0};
    kvp_frame_hdr_encode(hdr, &h);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)body, len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
    if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)(sizeof hdr + len))
        return -1;
    /* the answer: header and body, the fd (SCM_RIGHTS) on its first bytes */
    uint8_t in[KVP_FRAME_HDR + 256];
    size_t have = 0;
    kvp_frame_hdr rh = {0};
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    while (have < KVP_FRAME_HDR || have < KVP_FRAME_HDR + rh.body_len) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) != 1)
            return -1;
        struct iovec v = {in + have, sizeof in - have};
        struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cm.b,
                           .msg_controllen = sizeof cm.b};
        ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
        if (n <= 0)
            return -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && memfd)
                memcpy(memfd, CMSG_DATA(c), sizeof(int));
        have += (size_t)n;
        if (have >= KVP_FRAME_HDR &&
            (kvp_frame_hdr_decode(in, 1u << 20, &rh) != 0 || rh.req_id != h.req_id ||
             KVP_FRAME_HDR + rh.body_len > sizeof in))
            return -1;
    }
    if (rlen) {
        *rlen = rh.body_len < cap ? rh.body_len : cap;
        memcpy(resp, in + KVP_FRAME_HDR, *rlen);
    }
    return rh.status;
}

/* What a same-host client does: HELLO, SHM_ATTACH; the memfd and its size. */
static int attach(const env *e, int *memfd, uint64_t *size)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t pl = strlen(e->unix_path);
    if (pl < sizeof sa.sun_path)
        memcpy(sa.sun_path, e->unix_path, pl + 1);
    if (fd < 0 || pl >= sizeof sa.sun_path || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    uint8_t body[256];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_msg_hello h = {KVP_PROTO_VERSION, 0x5eed, {(const uint8_t *)"memfd", 5}, {{NULL, 0}}};
    kvp_enc_hello(&b, &h);
    uint8_t resp[64], id[8];
    uint32_t rl = 0;
    int rc = frame_call(fd, KVP_OP_HELLO, body, (uint32_t)b.len, NULL, resp, sizeof resp, &rl);
    for (int i = 0; i < 8; i++)
        id[i] = (uint8_t)(e->seg >> (8 * i));
    *memfd = -1;
    if (rc == 0)
        rc = frame_call(fd, KVP_OP_SHM_ATTACH, id, 8, memfd, resp, sizeof resp, &rl);
    close(fd);
    if (rc != 0 || rl != 8 || *memfd < 0) {
        if (*memfd >= 0)
            close(*memfd);
        return -1;
    }
    *size = 0;
    for (int i = 7; i >= 0; i--)
        *size = *size << 8 | resp[i];
    return 0;
}

/* fails with errno want (and the call returned -1) */
#define REFUSED(call, want) ((call) == -1 && errno == (want))

TEST(shm_memfd_cannot_be_resized)
{
    env e;
    CHECK(env_up(&e) == 0);
    int fd;
    uint64_t size;
    CHECK_EQ(attach(&e, &fd, &size), 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == size && size >= (8u << 20));
    CHECK(REFUSED(ftruncate(fd, (off_t)size / 2), EPERM));        /* shrink: SIGBUS for all */
    CHECK(REFUSED(ftruncate(fd, 0), EPERM));
    CHECK(REFUSED(ftruncate(fd, (off_t)size * 2), EPERM));        /* grow */
    CHECK(REFUSED(fallocate(fd, 0, (off_t)size, 4096), EPERM));   /* grow by allocating */
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == size);
    close(fd);
    env_down(&e);
}

TEST(shm_memfd_cannot_be_sealed_by_a_peer)
{
    env e;
    CHECK(env_up(&e) == 0);
    int fd;
    uint64_t size;
    CHECK_EQ(attach(&e, &fd, &size), 0);
    int seals = fcntl(fd, F_GET_SEALS);
    CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) && (seals & F_SEAL_SEAL));
    /* sealing writes would lock every later client out of its mapping */
    CHECK(REFUSED(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), EPERM));
    CHECK(REFUSED(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), EPERM));
    CHECK_EQ(fcntl(fd, F_GET_SEALS), seals);
    close(fd);
    /* the next peer still maps it writable */
    CHECK_EQ(attach(&e, &fd, &size), 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    if (p != MAP_FAILED)
        munmap(p, size);
    close(fd);
    env_down(&e);
}

/* A hole punched under a stored value: the reader gets CHECKSUM_MISMATCH,
 * never the zeros; the bad replica is dropped, the key can be put again,
 * and the node keeps serving. */
TEST(shm_hole_punch_is_detected_not_served)
{
    env e;
    CHECK(env_up(&e) == 0);
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", e.m.addr);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(cfg, &c, err, sizeof err), 0);
    CHECK(c);
    size_t n = 64 * 1024;
    uint8_t *v = malloc(n), *got = malloc(n);
    CHECK(v && got);
    tp_fill(v, n, 11);
    CHECK_EQ(kvp_client_put(c, "victim", v, n), 0);
    char js[2048];
    CHECK(kvp_client_describe_json(c, "victim", js, sizeof js) > 0);
    const char *o = strstr(js, "\"offset\": ");
    CHECK(o);
    uint64_t off = strtoull(o + 10, NULL, 10);
    int fd;
    uint64_t size;
    CHECK_EQ(attach(&e, &fd, &size), 0);
    CHECK(off + n <= size);
    /* the attack: not refused (see the file comment) */
    CHECK_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)n), 0);
    CHECK_EQ(kvp_client_get(c, "victim", got, n), KVP_ECHECKSUM_MISMATCH);
    /* the corrupt replica was dropped: the key is free for a new put */
    int64_t r = -1;
    for (int i = 0; i < 50 && (r = kvp_client_put(c, "victim", v, n)) != 0; i++)
        tp_sleep_ms(20);
    CHECK_EQ(r, 0);
    CHECK_EQ(kvp_client_get(c, "victim", got, n), (int64_t)n);
    CHECK(memcmp(got, v, n) == 0);
    /* the same through a writable mapping (MADV_REMOVE) */
    CHECK(kvp_client_describe_json(c, "victim", js, sizeof js) > 0);
    CHECK((o = strstr(js, "\"offset\": ")));
    off = strtoull(o + 10, NULL, 10);
    uint8_t *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(map != MAP_FAILED);
    if (map != MAP_FAILED) {
        CHECK_EQ(madvise(map + off, n, MADV_REMOVE), 0);
        CHECK_EQ(kvp_client_get(c, "victim", got, n), KVP_ECHECKSUM_MISMATCH);
        munmap(map, size);
    }
    close(fd);
    /* the node serves on */
    CHECK_EQ(kvp_client_put(c, "after", v, n), 0);
    CHECK_EQ(kvp_client_get(c, "after", got, n), (int64_t)n);
    CHECK(memcmp(got, v, n) == 0);
    free(v);
    free(got);
    kvp_client_close(c);
    env_down(&e);
}
