/* sys.c -- the system-call table and its fault injection; see sys.h. */
#include "common/sys.h"

#include <unistd.h>

#ifndef KVP_TESTING

kvp_sys_table kvp_sys = {socket, connect, accept4, send, sendmsg, recv, recvmsg,
                         read, write, readv, writev, poll, epoll_wait};

#else /* KVP_TESTING: counting wrappers that can fail on purpose */

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

static atomic_uint_fast64_t sys_calls;
static atomic_uint_fast64_t fail_at; /* call number that fails, 0 = none */
static atomic_int fail_sticky;
static atomic_int fail_err;
static atomic_uint_fast64_t sys_failed;

/* The injected failure for this call: 0 none, KVP_SYS_SHORT, or an errno. */
static int inject(void)
{
    uint64_t n = atomic_fetch_add(&sys_calls, 1) + 1;
    uint64_t at = atomic_load(&fail_at);
    if (at == 0 || n < at || (n > at && !atomic_load(&fail_sticky)))
        return 0;
    return atomic_load(&fail_err);
}

/* -1 with errno e (counted). */
static int fail(int e)
{
    atomic_fetch_add(&sys_failed, 1);
    errno = e;
    return -1;
}

/* A call with no byte count to shorten: only errors apply. */
#define PLAIN(call)                                                            \
    do {                                                                       \
        int e_ = inject();                                                     \
        if (e_ > 0)                                                            \
            return fail(e_);                                                   \
        return call;                                                           \
    } while (0)

static int t_socket(int d, int t, int p) { PLAIN(socket(d, t, p)); }
static int t_connect(int fd, const struct sockaddr *sa, socklen_t l) { PLAIN(connect(fd, sa, l)); }
static int t_accept4(int fd, struct sockaddr *sa, socklen_t *l, int f) { PLAIN(accept4(fd, sa, l, f)); }

static int t_poll(struct pollfd *p, nfds_t n, int ms)
{
    if (inject() > 0)
        return fail(EINTR);
    return poll(p, n, ms);
}

static int t_epoll_wait(int ep, struct epoll_event *ev, int max, int ms)
{
    if (inject() > 0)
        return fail(EINTR);
    return epoll_wait(ep, ev, max, ms);
}

/* Byte-moving calls: an errno, or at most one byte when short. */
#define MOVE(call, shortcall)                                                  \
    do {                                                                       \
        int e_ = inject();                                                     \
        if (e_ > 0)                                                            \
            return fail(e_);                                                   \
        if (e_ == KVP_SYS_SHORT && n > 1) {                                    \
            atomic_fetch_add(&sys_failed, 1);                                  \
            n = 1;                                                             \
            return shortcall;                                                  \
        }                                                                      \
        return call;                                                           \
    } while (0)

static ssize_t t_send(int fd, const void *p, size_t n, int f) { MOVE(send(fd, p, n, f), send(fd, p, n, f)); }
static ssize_t t_recv(int fd, void *p, size_t n, int f) { MOVE(recv(fd, p, n, f), recv(fd, p, n, f)); }
static ssize_t t_read(int fd, void *p, size_t n) { MOVE(read(fd, p, n), read(fd, p, n)); }
static ssize_t t_write(int fd, const void *p, size_t n) { MOVE(write(fd, p, n), write(fd, p, n)); }

/* The first byte of v[0..cnt) as a one-element vector; 0 when empty. */
static int first_byte(const struct iovec *v, size_t cnt, struct iovec *one)
{
    for (size_t i = 0; i < cnt; i++) {
        if (v[i].iov_len) {
            one->iov_base = v[i].iov_base;
            one->iov_len = 1;
            return 1;
        }
    }
    return 0;
}

static size_t iov_total(const struct iovec *v, size_t cnt)
{
    size_t t = 0;
    for (size_t i = 0; i < cnt; i++)
        t += v[i].iov_len;
    return t;
}

static ssize_t t_readv(int fd, const struct iovec *v, int cnt)
{
    size_t n = cnt > 0 ? iov_total(v, (size_t)cnt) : 0;
    struct iovec one;
    MOVE(readv(fd, v, cnt), (first_byte(v, (size_t)cnt, &one), readv(fd, &one, 1)));
}

static ssize_t t_writev(int fd, const struct iovec *v, int cnt)
{
    size_t n = cnt > 0 ? iov_total(v, (size_t)cnt) : 0;
    struct iovec one;
    MOVE(writev(fd, v, cnt), (first_byte(v, (size_t)cnt, &one), writev(fd, &one, 1)));
}

static ssize_t t_sendmsg(int fd, const struct msghdr *m, int f)
{
    size_t n = iov_total(m->msg_iov, m->msg_iovlen);
    struct msghdr s = *m;
    struct iovec one;
    s.msg_iov = &one;
    s.msg_iovlen = 1;
    MOVE(sendmsg(fd, m, f), (first_byte(m->msg_iov, m->msg_iovlen, &one), sendmsg(fd, &s, f)));
}

/* recvmsg cut to one byte; what the kernel writes back into the header
 * (name and control lengths, flags) is copied to the caller's. */
static ssize_t recvmsg_one(int fd, struct msghdr *m, int f)
{
    struct msghdr s = *m;
    struct iovec one;
    first_byte(m->msg_iov, m->msg_iovlen, &one);
    s.msg_iov = &one;
    s.msg_iovlen = 1;
    ssize_t r = recvmsg(fd, &s, f);
    m->msg_namelen = s.msg_namelen;
    m->msg_controllen = s.msg_controllen;
    m->msg_flags = s.msg_flags;
    return r;
}

static ssize_t t_recvmsg(int fd, struct msghdr *m, int f)
{
    size_t n = iov_total(m->msg_iov, m->msg_iovlen);
    MOVE(recvmsg(fd, m, f), recvmsg_one(fd, m, f));
}

static const kvp_sys_table defaults = {t_socket, t_connect, t_accept4, t_send, t_sendmsg,
                                       t_recv, t_recvmsg, t_read, t_write, t_readv,
                                       t_writev, t_poll, t_epoll_wait};

kvp_sys_table kvp_sys = {t_socket, t_connect, t_accept4, t_send, t_sendmsg, t_recv,
                         t_recvmsg, t_read, t_write, t_readv, t_writev, t_poll,
                         t_epoll_wait};

void kvp_sys_reset(void) { memcpy(&kvp_sys, &defaults, sizeof kvp_sys); }

uint64_t kvp_sys_calls(void) { return atomic_load(&sys_calls); }
uint64_t kvp_sys_failed(void) { return atomic_load(&sys_failed); }

void kvp_sys_fail_nth(uint64_t n, int sticky, int err)
{
    atomic_store(&fail_at, 0);
    atomic_store(&sys_failed, 0);
    atomic_store(&fail_sticky, sticky);
    atomic_store(&fail_err, err);
    if (n)
        atomic_store(&fail_at, atomic_load(&sys_calls) + n);
}

#endif
