/*
 * unixsock.h -- where a node's same-host unix socket lives, and who may
 * connect to it.
 *
 * Trust model (docs/ARCHITECTURE.md, "Shared memory trust model"): a peer
 * that completes SHM_ATTACH holds the segment's memfd and can read and write
 * every tenant's bytes in it. So the socket is reachable by this user (and,
 * when a group is configured, that group's members) only, three times over:
 *   - the runtime directory is ours, not a symlink, and nobody else can
 *     write to it (0700; 0710 with the group when one is configured);
 *   - the socket file is 0600 (0660 and chowned to the group), set
 *     explicitly, whatever the umask;
 *   - every accepted connection's SO_PEERCRED is checked
 *     (kvp_unixsock_peer_check).
 *
 * Paths are never truncated: one that does not fit sun_path is refused.
 * Nothing but a socket is ever unlinked (lstat S_ISSOCK), and a socket only
 * when nobody listens on it (connect fails ECONNREFUSED).
 */
#ifndef KVP_UNIXSOCK_H
#define KVP_UNIXSOCK_H

#include <stddef.h>
#include <sys/types.h>

/* Longest socket path: sizeof sun_path (108 on Linux) less the NUL. */
#define KVP_UNIXSOCK_PATH_MAX 107

/* Socket files the sweep may remove: PREFIX<16 hex digits>.sock. */
#define KVP_UNIXSOCK_PREFIX "kvpool-seg-"

/* Who besides our own uid may connect: nobody (has_group 0) or the members
 * of `gid` (primary or supplementary group of the peer). */
typedef struct kvp_unixsock_access {
    int has_group;
    gid_t gid;
} kvp_unixsock_access;

/* Parses "" (no group), a group name, or a numeric gid into *a. 0, or
 * KVP_ECONFIG with a message naming the value. */
int kvp_unixsock_group_parse(const char *s, kvp_unixsock_access *a, char *err, size_t errlen);

/*
 * The runtime directory for a socket named sock_name, into out (outlen
 * bytes):
 *   dir != NULL/""          dir (--unix-dir), created 0700 when missing;
 *   else $XDG_RUNTIME_DIR/kvpool when XDG_RUNTIME_DIR is set, absolute, a
 *     directory of ours, and no group is configured (the XDG directory is
 *     private to the user, group members could not reach into it);
 *   else /tmp/kvpool-<uid>.
 * A directory that exists must be a directory (lstat: not a symlink) owned
 * by our euid and not writable by others (nor by its group, unless that is
 * the configured group); so /tmp itself is refused. Directories we create
 * are 0700 (0710, group set, with a group). A directory too long for
 * DIR/sock_name to fit sun_path is refused before anything is created.
 * 0, or KVP_ECONFIG / KVP_EINVALID_PARAMS with a message naming the path.
 */
int kvp_unixsock_rundir(const char *dir, const kvp_unixsock_access *a, const char *sock_name,
                        char *out, size_t outlen, char *err, size_t errlen);

/* Removes the KVP_UNIXSOCK_PREFIX sockets in dir that nobody listens on
 * (crashed nodes); returns how many. Never touches anything else. */
int kvp_unixsock_sweep(const char *dir);

/* 0 when path fits sun_path, else KVP_EINVALID_PARAMS with a message naming
 * the path, its length and the limit. */
int kvp_unixsock_path_check(const char *path, char *err, size_t errlen);

/*
 * Listens (non-blocking, close-on-exec) on path: refused when the path does
 * not fit sun_path, when something other than a socket is there, or when
 * another process listens there; a stale socket is replaced. The file gets
 * mode 0600 (0660 and the group with a group). The fd, or KVP_EINVALID_PARAMS
 * / KVP_EIO with a message.
 */
int kvp_unixsock_listen(const char *path, const kvp_unixsock_access *a, char *err,
                        size_t errlen);

/* The access decision: 1 when a peer (uid, gid, supplementary groups) may
 * connect to a socket of `self`, else 0. */
int kvp_unixsock_peer_allowed(uid_t self, const kvp_unixsock_access *a, uid_t uid, gid_t gid,
                              const gid_t *groups, size_t ngroups);

/* SO_PEERCRED (+ SO_PEERGROUPS where the kernel has it) of a connected unix
 * socket, decided by kvp_unixsock_peer_allowed against our euid. 1 allowed,
 * 0 refused (*peer_uid set when known, else -1). */
int kvp_unixsock_peer_check(int fd, const kvp_unixsock_access *a, long *peer_uid);
#endif
