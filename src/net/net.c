/* net.c -- socket helpers; see net.h. */
#include "net/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/sys.h"
#include "kvpool.h"

int kvp_net_split(const char *addr, char *host, size_t hostlen, uint16_t *port)
{
    const char *colon;
    const char *h = addr;
    size_t hl;
    if (!addr || !*addr)
        return KVP_EINVALID_PARAMS;
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (!rb || rb[1] != ':')
            return KVP_EINVALID_PARAMS;
        h = addr + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon)
            return KVP_EINVALID_PARAMS;
        hl = (size_t)(colon - addr);
    }
    if (hl == 0 || hl >= hostlen)
        return KVP_EINVALID_PARAMS;
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || p < 0 || p > 65535)
        return KVP_EINVALID_PARAMS;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (uint16_t)p;
    return 0;
}

static int resolve(const char *addr, int passive, struct addrinfo **res, char *err, size_t errlen)
{
    char host[256], ps[8];
    uint16_t port;
    if (kvp_net_split(addr, host, sizeof host, &port)) {
        snprintf(err, errlen, "bad address \"%s\" (expected host:port)", addr);
        return KVP_EINVALID_PARAMS;
    }
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int rc = getaddrinfo(host, ps, &hints, res);
    if (rc) {
        snprintf(err, errlen, "cannot resolve \"%s\": %s", host, gai_strerror(rc));
        return KVP_EINVALID_PARAMS;
    }
    return 0;
}

int kvp_net_set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void kvp_net_set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int kvp_net_listen(const char *addr, int backlog, uint16_t *port_out, char *err, size_t errlen)
{
    struct addrinfo *res;
    int rc = resolve(addr, 1, &res, err, errlen);
    if (rc)
        return rc;
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = kvp_sys.socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return KVP_EIO;
    kvp_net_set_nonblock(fd, 1);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (port_out && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int kvp_net_connect(const char *addr, int timeout_ms, char *err, size_t errlen)
{
    struct addrinfo *res;
    int rc = resolve(addr, 0, &res, err, errlen);
    if (rc)
        return rc;
    int fd = -1;
    rc = KVP_ERPC_FAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = kvp_sys.socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        int c = kvp_sys.connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (c < 0 && errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int pr = kvp_sys.poll(&p, 1, timeout_ms);
            if (pr == 0) {
                snprintf(err, errlen, "connect to %s timed out after %d ms", addr, timeout_ms);
                rc = KVP_ERPC_TIMEOUT;
                close(fd);
                fd = -1;
                continue;
            }
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            c = soerr ? -1 : 0;
            errno = soerr;
        }
        if (c == 0)
            break;
        snprintf(err, errlen, "cannot connect to %s: %s", addr, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc;
    kvp_net_set_nonblock(fd, 0);
    kvp_net_set_nodelay(fd);
    return fd;
}

int kvp_net_wait(int fd, short ev, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = kvp_now_ms();
        if (now >= deadline_ms)
            return KVP_ERPC_TIMEOUT;
        struct pollfd p = {fd, ev, 0};
        int n = kvp_sys.poll(&p, 1, (int)(deadline_ms - now));
        if (n > 0)
            return 0;
        if (n == 0)
            return KVP_ERPC_TIMEOUT;
        if (errno != EINTR)
            return KVP_EIO;
    }
}

int kvp_net_is_loopback(const char *host)
{
    if (!strcmp(host, "localhost"))
        return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) ||
               (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return 0;
}

int kvp_net_source_for(const char *addr, char *host, size_t hostlen, char *err, size_t errlen)
{
    struct addrinfo *res;
    int rc = resolve(addr, 0, &res, err, errlen);
    if (rc)
        return rc;
    rc = KVP_EIO;
    snprintf(err, errlen, "no address of %s", addr);
    for (struct addrinfo *ai = res; ai && rc; ai = ai->ai_next) {
        int fd = kvp_sys.socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(err, errlen, "cannot find a route to %s: %s", addr, strerror(errno));
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
            snprintf(err, errlen, "no route to %s: %s", addr, strerror(errno));
        } else {
            const void *a = ss.ss_family == AF_INET6
                                ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
            if (inet_ntop(ss.ss_family, a, host, (socklen_t)hostlen))
                rc = 0;
            else
                snprintf(err, errlen, "local address toward %s: %s", addr, strerror(errno));
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

void kvp_net_peer_text(const struct sockaddr_storage *ss, char *out, size_t outlen)
{
    char h[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        if (inet_ntop(AF_INET, &a->sin_addr, h, sizeof h)) {
            snprintf(out, outlen, "%s:%u", h, (unsigned)ntohs(a->sin_port));
            return;
        }
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        if (inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof h)) {
            snprintf(out, outlen, "[%s]:%u", h, (unsigned)ntohs(a->sin6_port));
            return;
        }
    }
    snprintf(out, outlen, "?");
}
