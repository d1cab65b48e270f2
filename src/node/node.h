/*
 * node.h -- a storage node: a segment, its segment server, and the link to
 * the master (mount, heartbeats every client_ttl/3, and a remount when the
 * master restarts or forgot it: a new master_id in HELLO, or a HEARTBEAT
 * answering fewer segments than mounted).
 *
 * Used by `kvpool store` (standalone-store mode), `kvpool serve` (master +
 * node in one process) and embedded clients.
 *
 * Endpoints advertised at MOUNT_SEGMENT:
 *   ("tcp", "HOST:PORT")               HOST: the listen host, else local_hostname
 *                                      or the address facing the master (node.c)
 *   ("shm", "HOSTID:/path/to/sock")    HOSTID = kvp_node_host_id(); a client
 *                                      with the same host id attaches the memfd
 * Segment id and secret are random per node start.
 *
 * With enable_offload the node has an SSD tier (node/tier.h) in offload_dir:
 * MOUNT_SEGMENT announces its capacity, the link serves the master's
 * DISK_CMDs and sends the tier's reports, and every mount is followed by a
 * HAVE for each record on disk (a restarted node or master gets them back).
 */
#ifndef KVP_NODE_H
#define KVP_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/config.h"

typedef struct kvp_node kvp_node;

typedef struct kvp_node_opts {
    const kvp_config *cfg;     /* master, cluster_token, global_segment_size,
                                  local_hostname, rpc_timeout, client_ttl */
    const char *listen;        /* segment server TCP address; NULL = "HOST:0" */
    const char *unix_dir;      /* directory for the unix socket; NULL = the
                                  private runtime directory (node/unixsock.h:
                                  $XDG_RUNTIME_DIR/kvpool or /tmp/kvpool-UID) */
    int io_threads;            /* 0 = 2 */
    int master_optional;       /* start even when the master is unreachable
                                  (keep retrying in the background) */
    int standalone;            /* a storage node (kvpool store / serve): enable_offload
                                  requires offload_dir; an embedded client's segment has
                                  an SSD tier only when both are set */
} kvp_node_opts;

int kvp_node_start(const kvp_node_opts *o, kvp_node **out, char *err, size_t errlen);
void kvp_node_stop(kvp_node *n);
uint64_t kvp_node_segment_id(const kvp_node *n);
uint16_t kvp_node_port(const kvp_node *n);
/* The segment's name, "HOST:PORT": its advertised TCP endpoint. */
const char *kvp_node_name(const kvp_node *n);
/* 1 while the master holds our mount (for tests and `stat`). */
int kvp_node_mounted(const kvp_node *n);
/* The node's Prometheus metrics (kvpool_node_*: its segment, connections,
 * bytes moved per path, the SSD tier), appended to out. Any thread. */
void kvp_node_write_metrics(kvp_node *n, kvp_buf *out);

/* This machine's identity for the same-host check: the kernel boot id
 * (/proc/sys/kernel/random/boot_id). Static storage. */
const char *kvp_node_host_id(void);
#endif
