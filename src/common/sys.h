/*
 * sys.h -- the one table of the system calls kvpool's network code makes
 * (SQLite's aSyscall[] in os_unix.c): the net, rpc, client data plane,
 * master service and connector lookup code call kvp_sys.send(...) and so
 * on instead of libc, so tests can make them fail.
 *
 * Release builds: every entry is the libc function itself.
 * Test builds (KVP_TESTING: the ASan, TSan and fuzz builds): every entry is
 * a wrapper that counts the call and, when armed with kvp_sys_fail_nth,
 * makes the nth call from now fail -- the network twin of kvp_mem_fail_nth
 * (common/mem.h). A test may also replace an entry outright and restore it.
 *
 * close(2), bind/listen/setsockopt and descriptors that are not sockets
 * (eventfd, signalfd, pipes used as wake-ups) stay on libc: failing them
 * tests nothing a peer could cause.
 */
#ifndef KVP_SYS_H
#define KVP_SYS_H

#include <poll.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct kvp_sys_table {
    int (*socket)(int domain, int type, int protocol);
    int (*connect)(int fd, const struct sockaddr *sa, socklen_t len);
    int (*accept4)(int fd, struct sockaddr *sa, socklen_t *len, int flags);
    ssize_t (*send)(int fd, const void *p, size_t n, int flags);
    ssize_t (*sendmsg)(int fd, const struct msghdr *m, int flags);
    ssize_t (*recv)(int fd, void *p, size_t n, int flags);
    ssize_t (*recvmsg)(int fd, struct msghdr *m, int flags);
    ssize_t (*read)(int fd, void *p, size_t n);
    ssize_t (*write)(int fd, const void *p, size_t n);
    ssize_t (*readv)(int fd, const struct iovec *v, int n);
    ssize_t (*writev)(int fd, const struct iovec *v, int n);
    int (*poll)(struct pollfd *p, nfds_t n, int timeout_ms);
    int (*epoll_wait)(int ep, struct epoll_event *ev, int max, int timeout_ms);
} kvp_sys_table;

extern kvp_sys_table kvp_sys;

#ifdef KVP_TESTING
/* A failure that is not an errno: the call moves at most 1 byte (send,
 * sendmsg, recv, recvmsg, read, write, readv, writev; others run as usual). */
#define KVP_SYS_SHORT (-1)

/*
 * The nth system call through the table from now (1 = the next one) fails
 * with errno `err` (EINTR, EAGAIN, ECONNRESET...; poll and epoll_wait fail
 * only with EINTR, the one error a correct caller sees from them), or is
 * short when err == KVP_SYS_SHORT; if `sticky`, every call after it too.
 * n == 0 disables injection. Per process, all threads (atomics).
 */
void kvp_sys_fail_nth(uint64_t n, int sticky, int err);
/* Calls made through the table so far (failed on purpose or not). */
uint64_t kvp_sys_calls(void);
/* Calls failed (or shortened) on purpose since the last kvp_sys_fail_nth. */
uint64_t kvp_sys_failed(void);
/* Puts back the default entries (after a test replaced some). */
void kvp_sys_reset(void);
#endif

#endif
