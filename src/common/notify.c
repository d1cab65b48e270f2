/*
 * notify.c -- the sd_notify datagram; see notify.h.
 */
#include "common/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvpool.h"

int kvp_notify(const char *state)
{
    if (!state || !*state)
        return KVP_EINVALID_PARAMS;
    const char *e = getenv("NOTIFY_SOCKET");
    if (!e || !*e)
        return 0;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(e);
    /* sun_path holds 108 bytes: a path needs its NUL, an abstract name
     * starts with a NUL in place of the '@' and has none at its end */
    if ((e[0] != '/' && e[0] != '@') || n >= sizeof a.sun_path || (e[0] == '@' && n < 2))
        return KVP_ECONFIG;
    memcpy(a.sun_path, e, n);
    if (e[0] == '@')
        a.sun_path[0] = 0;
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (e[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return KVP_EIO;
    ssize_t sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT,
                          (const struct sockaddr *)&a, alen);
    int err = errno;
    close(fd);
    errno = err;
    return sent == (ssize_t)strlen(state) ? 0 : KVP_EIO;
}
