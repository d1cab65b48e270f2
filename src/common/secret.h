/*
 * secret.h -- credentials: where they come from, how they are compared,
 * and when a listener may do without them.
 *
 * Three credentials (docs/SECURITY.md):
 *   cluster_token  every participant (clients, nodes; masters and nodes
 *                  check it at HELLO)
 *   node_token     storage nodes: MOUNT_SEGMENT / UNMOUNT_SEGMENT need it
 *                  when the master has one
 *   tenant_token   a client's tenant credential; the master's
 *                  tenant_tokens_file maps tenants to tokens
 * Each is taken from its config key, else from its *_file key (a file
 * other users cannot read; one line), else from the environment
 * ($KVPOOL_CLUSTER_TOKEN, $KVPOOL_NODE_TOKEN, $KVPOOL_TENANT_TOKEN): never
 * from a command-line flag, which every user sees in ps. etcd's password
 * (etcd_password_file, ha/etcd.h) is read by the same file rule.
 */
#ifndef KVP_SECRET_H
#define KVP_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

/* Constant-time equality of two byte strings (time depends only on the
 * lengths). 1 when equal. */
int kvp_secret_equal(const void *a, size_t alen, const void *b, size_t blen);

/* Fills the three credentials from their files or the environment where
 * the config left them empty. 0 or KVP_ECONFIG with a message. */
int kvp_secret_resolve(kvp_config *c, char *err, size_t errlen);

/* Reads a secret file: a regular file not readable by other users, one
 * line (the trailing newline is dropped), 1 .. cap-1 bytes. 0 or
 * KVP_ECONFIG with a message naming the file. */
int kvp_secret_read_file(const char *path, char *out, size_t cap, char *err, size_t errlen);

/* One entry of the master's tenant credential table, with the tenant's
 * limits in the pool (0 = unlimited) and its weight in fair eviction. */
typedef struct kvp_tenant_cred {
    char tenant[256];
    char token[256];
    uint64_t max_bytes;   /* pool (DRAM) bytes its objects may hold, replicas counted */
    uint64_t max_objects; /* objects it may hold (pending ones count) */
    uint32_t share;       /* weight of its fair share of the pool, 1 .. KVP_TENANT_SHARE_MAX */
    uint8_t kid[8];       /* the token's key id (proto/auth.h kvp_auth_kid), set by the
                             master: the HELLO handshake names the token by it */
} kvp_tenant_cred;

#define KVP_TENANT_SHARE_MAX 1000000u

/* Loads "TENANT TOKEN [max_bytes=SIZE] [max_objects=N] [share=W]" lines
 * ('#' comments, blank lines skipped; options in any order, each at most
 * once; SIZE through kvp_size_parse, default share 1) from a file with the
 * same checks as kvp_secret_read_file. A tenant or a token listed twice is
 * an error. *out is kvp_malloc'ed (kvp_free it). */
int kvp_secret_tenants_load(const char *path, kvp_tenant_cred **out, size_t *n, char *err,
                            size_t errlen);

/*
 * A listener on a non-loopback address needs a credential (have_cred)
 * unless `insecure` is set. `what` names the listener in the message
 * ("master", "storage node"). 0 or KVP_ECONFIG.
 */
int kvp_secret_listen_check(const char *listen, int have_cred, int insecure, const char *what,
                            char *err, size_t errlen);

#endif
