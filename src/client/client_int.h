/*
 * client_int.h -- the kvp_client handle's insides (client.c only; tests
 * that need to look inside include it too).
 *
 * Locking (the whole story):
 *   mu      guards the master connection: rpc, master_id, max_frame,
 *           lease_ttl_ms, client_ttl_ms. Every master request is one
 *           queue+flush+recv (or queue+flush for ONEWAY RELEASE) under mu;
 *           the answer is copied out before mu is released. The master
 *           answers a batch in microseconds, so one connection serialised
 *           by a mutex is not the bottleneck: the data plane (xfer) runs
 *           outside mu, from any number of threads at once.
 *   reg_mu  guards the registered-buffer table.
 *   hb_mu   with hb_cv: the heartbeat thread's sleep and the stop flag.
 *   xfer    is thread-safe by its own contract; node is not touched after
 *           open except by close.
 * Lock order: mu is never held while taking reg_mu or hb_mu, and neither
 * of those is held while taking mu (except hb_mu -> none).
 */
#ifndef KVP_CLIENT_INT_H
#define KVP_CLIENT_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "client/xfer.h"
#include "common/config.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "node/node.h"

/* One registered caller range [base, base+len): host memory (dev NULL)
 * or device memory of dev, as kvp_gpu_classify found at registration. */
typedef struct kvp_creg {
    uintptr_t base;
    size_t len;
    struct kvp_gpu_dev *dev;
} kvp_creg;

struct kvp_client {
    kvp_config cfg;
    char name[320];           /* "client <local_hostname> <pid>", sent in HELLO */
    kvp_proto_limits lim;     /* decoder limits for the master's answers */

    pthread_mutex_t mu;       /* the master connection, see above */
    kvp_rpc *rpc;             /* NULL while disconnected (reconnected lazily) */
    uint64_t master_id;       /* from the last HELLO: a change = master restart */
    uint32_t max_frame;       /* master's max frame (HELLO), capped at 64 MiB */
    uint32_t lease_ttl_ms;    /* from the last HELLO (GET answers carry their own) */
    uint32_t client_ttl_ms;   /* from the last HELLO */
    /* data-path reports (HEARTBEAT, client.c "heartbeat"), under mu: the
     * master sums each client id's last report, so a report counts from
     * hb_base, what earlier ids of this client already reported to this
     * master (0 for a master it has not reported to) */
    kvp_xfer_counters hb_base;
    kvp_xfer_counters hb_acked; /* the counters of the last report it accepted */
    int hb_plain;             /* it refused a report (an older release): send
                                 empty heartbeats until another master answers */

    kvp_xfer *xfer;           /* data plane */
    kvp_node *node;           /* embedded segment, NULL in standalone-store mode */
    char seg_name[300];       /* embedded segment's name "host:port", "" if none */
    char pref_name[300];      /* segment puts prefer: preferred_segment, else
                                 $MOONCAKE_PREFERRED_SEGMENT, else seg_name; "" = none */

    pthread_mutex_t reg_mu;
    kvp_creg *regs;           /* sorted by base, non-overlapping */
    size_t nregs, cap_regs;
    size_t ndevregs;          /* how many of them are device memory (atomic reads) */

    uint64_t disk_reads;      /* keys read after their node staged them from its SSD
                                 tier (__atomic, relaxed): kvp_client_disk_reads */

    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cv;     /* CLOCK_MONOTONIC */
    int hb_stop;
    int hb_started;
    pthread_t hb_thread;
};

/*
 * kvp_client_open with a configuration already parsed (the kvpool command's
 * flags over its file): copied, validated, secrets resolved from their files
 * or the environment where still empty, then opened the same way. Not part
 * of the public API (kvp_config is not); used by src/cli.
 */
int kvp_client_open_config(const kvp_config *cfg, kvp_client **out, char *err, size_t errlen);

#endif
