/*
 * unixsock.c -- runtime directory, socket file and peer checks; see
 * unixsock.h.
 */
#include "node/unixsock.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sys.h"
#include "kvpool.h"

#define MOD "unixsock"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

_Static_assert(sizeof(((struct sockaddr_un *)0)->sun_path) == KVP_UNIXSOCK_PATH_MAX + 1,
               "KVP_UNIXSOCK_PATH_MAX must be sizeof sun_path - 1");

/* ------------------------------------------------------------- group */

int kvp_unixsock_group_parse(const char *s, kvp_unixsock_access *a, char *err, size_t errlen)
{
    a->has_group = 0;
    a->gid = 0;
    if (!s || !*s)
        return 0;
    if (strspn(s, "0123456789") == strlen(s)) {
        errno = 0;
        unsigned long long v = strtoull(s, NULL, 10);
        if (errno || v >= (gid_t)-1) {
            snprintf(err, errlen, "shm_group \"%s\": not a valid gid", s);
            return KVP_ECONFIG;
        }
        a->gid = (gid_t)v;
        a->has_group = 1;
        return 0;
    }
    struct group gr, *res = NULL;
    char buf[4096];
    int rc = getgrnam_r(s, &gr, buf, sizeof buf, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "shm_group \"%s\": %s", s,
                 rc ? strerror(rc) : "no such group (give a group name or a numeric gid)");
        return KVP_ECONFIG;
    }
    a->gid = res->gr_gid;
    a->has_group = 1;
    return 0;
}

/* 0 when [dir "/"] name fits sun_path, else KVP_EINVALID_PARAMS naming the
 * path, its length and the limit. */
static int path_fits(const char *dir, const char *name, char *err, size_t errlen)
{
    size_t len = (dir ? strlen(dir) + 1 : 0) + strlen(name);
    if (len <= KVP_UNIXSOCK_PATH_MAX)
        return 0;
    snprintf(err, errlen,
             "unix socket path %s%s%s is %zu bytes, longer than the %d bytes a unix socket path "
             "can have (sun_path is %d with the NUL); choose a shorter --unix-dir",
             dir ? dir : "", dir ? "/" : "", name, len, KVP_UNIXSOCK_PATH_MAX,
             KVP_UNIXSOCK_PATH_MAX + 1);
    return KVP_EINVALID_PARAMS;
}

/* ----------------------------------------------------------- directory */

/* An existing directory we may put a socket in (see unixsock.h). */
static int check_dir(const char *path, const kvp_unixsock_access *a, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        snprintf(err, errlen, "unix socket directory %s: %s", path, strerror(errno));
        return KVP_ECONFIG;
    }
    const char *why = NULL;
    if (S_ISLNK(st.st_mode))
        why = "is a symbolic link";
    else if (!S_ISDIR(st.st_mode))
        why = "is not a directory";
    else if (st.st_uid != geteuid())
        why = "is owned by another user";
    else if ((st.st_mode & S_IWOTH) ||
             ((st.st_mode & S_IWGRP) && !(a->has_group && st.st_gid == a->gid)))
        why = "is writable by other users";
    if (why) {
        snprintf(err, errlen,
                 "unix socket directory %s %s (mode %03o, uid %u): it must be a private "
                 "directory owned by uid %u that nobody else can write to; choose another "
                 "--unix-dir",
                 path, why, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return KVP_ECONFIG;
    }
    if (a->has_group && (st.st_gid != a->gid || !(st.st_mode & S_IXGRP)))
        KVP_WARN(MOD, "unix socket directory %s (mode %03o, gid %u): members of group %u "
                      "cannot reach the socket",
                 path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid, (unsigned)a->gid);
    return 0;
}

/* Creates path (mode set explicitly, not from the umask) unless it exists,
 * then checks it. */
static int make_dir(const char *path, const kvp_unixsock_access *a, char *err, size_t errlen)
{
    if (mkdir(path, 0700) == 0) {
        mode_t mode = a->has_group ? 0710 : 0700;
        if ((a->has_group && chown(path, (uid_t)-1, a->gid) != 0) || chmod(path, mode) != 0) {
            snprintf(err, errlen, "unix socket directory %s: cannot set %s: %s", path,
                     a->has_group ? "its group and mode" : "its mode", strerror(errno));
            rmdir(path);
            return KVP_ECONFIG;
        }
    } else if (errno != EEXIST) {
        snprintf(err, errlen, "cannot create unix socket directory %s: %s", path,
                 strerror(errno));
        return KVP_ECONFIG;
    }
    return check_dir(path, a, err, errlen);
}

/* $XDG_RUNTIME_DIR when it is usable for us: absolute, a real directory,
 * ours. NULL otherwise. */
static const char *xdg_dir(void)
{
    const char *x = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (!x || x[0] != '/' || lstat(x, &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid())
        return NULL;
    return x;
}

int kvp_unixsock_rundir(const char *dir, const kvp_unixsock_access *a, const char *sock_name,
                        char *out, size_t outlen, char *err, size_t errlen)
{
    int n;
    const char *x;
    if (dir && *dir)
        n = snprintf(out, outlen, "%s", dir);
    else if (!a->has_group && (x = xdg_dir()) != NULL)
        n = snprintf(out, outlen, "%s/kvpool", x);
    else
        n = snprintf(out, outlen, "/tmp/kvpool-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= outlen) {
        snprintf(err, errlen, "unix socket directory path is too long (%d bytes)", n);
        return KVP_ECONFIG;
    }
    /* "dir/" and "dir" are the same directory; lstat of "link/" would
     * follow the link */
    while (n > 1 && out[n - 1] == '/')
        out[--n] = 0;
    int rc = path_fits(out, sock_name, err, errlen);
    return rc ? rc : make_dir(out, a, err, errlen);
}

/* ------------------------------------------------------------ sockets */

enum probe { P_LIVE, P_STALE, P_UNKNOWN };

/* Is anyone listening on the socket at path? A full backlog (EAGAIN) is
 * someone. */
static enum probe probe(const char *path, int *eno)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) > KVP_UNIXSOCK_PATH_MAX) {
        *eno = ENAMETOOLONG;
        return P_UNKNOWN;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *eno = errno;
        return P_UNKNOWN;
    }
    int rc = kvp_sys.connect(fd, (struct sockaddr *)&sa, sizeof sa);
    *eno = rc ? errno : 0;
    close(fd);
    if (rc == 0 || *eno == EAGAIN || *eno == EINPROGRESS)
        return P_LIVE;
    return *eno == ECONNREFUSED ? P_STALE : P_UNKNOWN;
}

/* KVP_UNIXSOCK_PREFIX + 16 hex digits + ".sock" */
static int our_name(const char *nm)
{
    size_t pl = strlen(KVP_UNIXSOCK_PREFIX);
    if (strncmp(nm, KVP_UNIXSOCK_PREFIX, pl) != 0 || strlen(nm) != pl + 16 + 5)
        return 0;
    return strspn(nm + pl, "0123456789abcdef") == 16 && strcmp(nm + pl + 16, ".sock") == 0;
}

int kvp_unixsock_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!our_name(de->d_name))
            continue;
        char p[KVP_UNIXSOCK_PATH_MAX + 1];
        int n = snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        int eno;
        if (n < 0 || (size_t)n >= sizeof p || lstat(p, &st) != 0 || !S_ISSOCK(st.st_mode) ||
            probe(p, &eno) != P_STALE)
            continue;
        if (unlink(p) == 0) {
            removed++;
            KVP_INFO(MOD, "removed stale socket %s (nobody listens on it)", p);
        }
    }
    closedir(d);
    return removed;
}

int kvp_unixsock_path_check(const char *path, char *err, size_t errlen)
{
    return path_fits(NULL, path, err, errlen);
}

/* Makes room for a socket at path: nothing there, or a stale socket that
 * is removed. Anything else is left alone and refused. */
static int clear_path(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "unix socket %s: %s", path, strerror(errno));
        return KVP_EIO;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket; not touching it", path);
        return KVP_EIO;
    }
    int eno = 0;
    switch (probe(path, &eno)) {
    case P_LIVE:
        snprintf(err, errlen, "another process listens on unix socket %s", path);
        return KVP_EIO;
    case P_UNKNOWN:
        snprintf(err, errlen, "unix socket %s exists and cannot be probed: %s", path,
                 strerror(eno));
        return KVP_EIO;
    case P_STALE:
        break;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "cannot remove stale unix socket %s: %s", path, strerror(errno));
        return KVP_EIO;
    }
    KVP_INFO(MOD, "replaced stale socket %s", path);
    return 0;
}

int kvp_unixsock_listen(const char *path, const kvp_unixsock_access *a, char *err,
                        size_t errlen)
{
    int rc = kvp_unixsock_path_check(path, err, errlen);
    if (rc)
        return rc;
    size_t len = strlen(path);
    rc = clear_path(path, err, errlen);
    if (rc)
        return rc;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, len + 1);
    int fd = kvp_sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, errlen, "unix socket: %s", strerror(errno));
        return KVP_EIO;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(err, errlen, "cannot bind unix socket %s: %s", path, strerror(errno));
        close(fd);
        return KVP_EIO;
    }
    /* listen first: a sweep by another node starting in the same directory
     * removes sockets nobody listens on. Until the chmod the file has the
     * umask's mode; the private directory keeps others out meanwhile, and
     * SO_PEERCRED is checked on every connection anyway. */
    const char *what = NULL;
    if (listen(fd, 256) != 0)
        what = "listen";
    else if (a->has_group && chown(path, (uid_t)-1, a->gid) != 0)
        what = "chown to the shm group";
    else if (chmod(path, a->has_group ? 0660 : 0600) != 0)
        what = "chmod";
    if (what) {
        snprintf(err, errlen, "unix socket %s: %s: %s", path, what, strerror(errno));
        close(fd);
        unlink(path);
        return KVP_EIO;
    }
    return fd;
}

/* ---------------------------------------------------------------- peers */

int kvp_unixsock_peer_allowed(uid_t self, const kvp_unixsock_access *a, uid_t uid, gid_t gid,
                              const gid_t *groups, size_t ngroups)
{
    if (uid == self)
        return 1;
    if (!a || !a->has_group)
        return 0;
    if (gid == a->gid)
        return 1;
    for (size_t i = 0; i < ngroups; i++)
        if (groups[i] == a->gid)
            return 1;
    return 0;
}

int kvp_unixsock_peer_check(int fd, const kvp_unixsock_access *a, long *peer_uid)
{
    struct ucred uc;
    socklen_t l = sizeof uc;
    *peer_uid = -1;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &l) != 0 || l != sizeof uc)
        return 0;
    *peer_uid = (long)uc.uid;
    gid_t groups[256];
    size_t ng = 0;
    if (a && a->has_group && uc.uid != geteuid() && uc.gid != a->gid) {
        socklen_t gl = sizeof groups;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &gl) == 0)
            ng = gl / sizeof groups[0];
    }
    return kvp_unixsock_peer_allowed(geteuid(), a, uc.uid, uc.gid, groups, ng);
}
