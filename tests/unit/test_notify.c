/* test_notify.c -- kvp_notify: the sd_notify datagram to $NOTIFY_SOCKET, by
 * path and abstract name; unset is a no-op; bad values are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/notify.h"
#include "harness.h"
#include "kvpool.h"

/* A bound datagram socket: by path when path[0] != '@', else abstract.
 * Returns the fd or -1. */
static int bind_dgram(const char *name)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(a.sun_path, name, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    if (name[0] == '@')
        a.sun_path[0] = 0;
    else
        len++;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Receives one datagram into buf (NUL-terminated); its length or -1. */
static ssize_t recv_one(int fd, char *buf, size_t cap)
{
    ssize_t n = recv(fd, buf, cap - 1, 0);
    if (n >= 0)
        buf[n] = 0;
    return n;
}

TEST(unset_or_empty_is_a_noop)
{
    unsetenv("NOTIFY_SOCKET");
    CHECK_EQ(kvp_notify("READY=1"), 0);
    setenv("NOTIFY_SOCKET", "", 1);
    CHECK_EQ(kvp_notify("READY=1"), 0);
    CHECK_EQ(kvp_notify(NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_notify(""), KVP_EINVALID_PARAMS);
}

TEST(path_socket_receives_each_state)
{
    char dir[] = "/tmp/kvp_notify_XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/notify", dir);
    int fd = bind_dgram(path);
    CHECK(fd >= 0);
    setenv("NOTIFY_SOCKET", path, 1);
    char buf[256];
    CHECK_EQ(kvp_notify("READY=1"), 0);
    CHECK_EQ(recv_one(fd, buf, sizeof buf), 7);
    CHECK(strcmp(buf, "READY=1") == 0);
    CHECK_EQ(kvp_notify("STATUS=serving on 127.0.0.1:50051\nREADY=1"), 0);
    CHECK(recv_one(fd, buf, sizeof buf) > 0);
    CHECK(strcmp(buf, "STATUS=serving on 127.0.0.1:50051\nREADY=1") == 0);
    CHECK_EQ(kvp_notify("STOPPING=1"), 0);
    CHECK(recv_one(fd, buf, sizeof buf) > 0);
    CHECK(strcmp(buf, "STOPPING=1") == 0);
    close(fd);
    unlink(path);
    /* nobody listens there any more: the send fails, with its code */
    CHECK_EQ(kvp_notify("READY=1"), KVP_EIO);
    rmdir(dir);
    unsetenv("NOTIFY_SOCKET");
}

TEST(abstract_socket_receives)
{
    char name[64];
    snprintf(name, sizeof name, "@kvp_notify_test_%d", (int)getpid());
    int fd = bind_dgram(name);
    CHECK(fd >= 0);
    setenv("NOTIFY_SOCKET", name, 1);
    char buf[64];
    CHECK_EQ(kvp_notify("READY=1"), 0);
    CHECK_EQ(recv_one(fd, buf, sizeof buf), 7);
    CHECK(strcmp(buf, "READY=1") == 0);
    close(fd);
    unsetenv("NOTIFY_SOCKET");
}

TEST(bad_values_refused)
{
    char longp[200];
    memset(longp, 'a', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = 0;
    const char *bad[] = {"relative/path", "notify", "@", "~/x", longp};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("NOTIFY_SOCKET", bad[i], 1);
        CHECK_EQ(kvp_notify("READY=1"), KVP_ECONFIG);
    }
    /* the longest that fits: 107 bytes and its NUL (a path, nothing bound) */
    longp[107] = 0;
    setenv("NOTIFY_SOCKET", longp, 1);
    CHECK_EQ(kvp_notify("READY=1"), KVP_EIO);
    longp[107] = 'a';
    longp[108] = 0;
    setenv("NOTIFY_SOCKET", longp, 1);
    CHECK_EQ(kvp_notify("READY=1"), KVP_ECONFIG);
    unsetenv("NOTIFY_SOCKET");
}
