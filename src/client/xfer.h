/*
 * xfer.h -- the client side of the data plane: moves one replica's bytes
 * between caller memory (an iovec list) and a segment, choosing the
 * transport by where the segment is.
 *
 * Transports sit behind one private operation table (shm, tcp, ucx); the choice
 * is made per segment when it is added, never with #ifdef in the request
 * path:
 *   shm  the segment's "shm" endpoint names this host (kvp_node_host_id()):
 *        the memfd is fetched once over the unix socket (SHM_ATTACH),
 *        checked (kvp_xfer_shm_check) and mapped; a transfer is a memcpy
 *        (gather/scatter) into the mapping.
 *   tcp  a pool of connections to the node's "tcp" endpoint (HELLO once per
 *        connection); SEG_WRITE/SEG_READ frames, with writev from / readv
 *        into the caller's iovecs (no staging copy), pipelined; a batch is
 *        spread over the pool's connections, one job per connection, run by
 *        the client's persistent transfer workers (common/workers.h) beside
 *        the caller.
 *   ucx  protocol "ucx" (or "rdma") and a node offering it, on another host
 *        (force_ucx: any host): one-sided UCX puts / gets into the segment
 *        (client/cucx.h), set up by UCX_ATTACH over a pooled tcp connection;
 *        a node or host without UCX falls back to tcp for good, device
 *        memory goes through tcp's staging path.
 *
 * Thread-safe: any number of threads may call kvp_xfer_run at once.
 */
#ifndef KVP_XFER_H
#define KVP_XFER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "proto/proto.h"

typedef struct kvp_xfer kvp_xfer;

typedef struct kvp_xfer_opts {
    const char *cluster_token; /* NULL = none */
    uint64_t client_id;
    int conns_per_node;        /* tcp pool size per node (0 = 4) */
    int force_tcp;             /* never use shm nor ucx (tests, benchmarks) */
    int timeout_ms;            /* connect/io deadline per call (0 = 10 s) */
    int gpu_threads;           /* shm jobs (each a thread and a stream) per segment
                                  for device ops (0 = $KVPOOL_GPU_THREADS, else
                                  half the cores, 2..8): checksums of PCIe-speed
                                  copies need several cores */
    int use_ucx;               /* protocol ucx: segments on other hosts whose node
                                  offers "ucx" go through UCX (client/cucx.h) */
    int force_ucx;             /* use_ucx for segments on this host too, instead of
                                  shm (tests, benchmarks) */
} kvp_xfer_opts;

int kvp_xfer_create(const kvp_xfer_opts *o, kvp_xfer **out);
void kvp_xfer_destroy(kvp_xfer *x);

/* Makes a segment known (from SEGMENT_INFO); idempotent. Does not connect.
 * A new one first frees the known segments whose shared memory's node is
 * gone (a restarted node's old segment: its mapping is orphaned memory). */
int kvp_xfer_add_segment(kvp_xfer *x, const kvp_seg_desc *d);
/* 1 if known. */
int kvp_xfer_has_segment(kvp_xfer *x, uint64_t segment_id);
/* Forgets a segment (unmounted / node dead): unmaps, closes connections. */
void kvp_xfer_drop_segment(kvp_xfer *x, uint64_t segment_id);
/* "shm", "tcp" or "ucx" (what kvp_xfer_run would use), NULL if unknown. */
const char *kvp_xfer_transport(kvp_xfer *x, uint64_t segment_id);

/* The data paths bytes are counted under: each transport's op table names
 * its own (a transport added later takes its slot; one never used reads 0).
 * The order is the wire's (the HEARTBEAT report, proto.h) and the public
 * API's (KVP_PATH_* in kvpool.h): only ever appended to. */
typedef enum {
    KVP_XFER_PATH_SHM,
    KVP_XFER_PATH_TCP,
    KVP_XFER_PATH_UCX,
    KVP_XFER_NPATHS
} kvp_xfer_path;

/* What one path moved since kvp_xfer_create: ops that ended with status 0
 * and their bytes (rep.length), writes (put) and reads (get) apart. Every
 * replica transfer counts (a put of 2 replicas counts 2 ops); a read whose
 * bytes then fail the caller's checksum still counts (the bytes moved). */
typedef struct kvp_xfer_tally {
    uint64_t put_bytes, get_bytes, put_ops, get_ops;
} kvp_xfer_tally;
typedef struct kvp_xfer_counters {
    kvp_xfer_tally path[KVP_XFER_NPATHS]; /* by kvp_xfer_path */
} kvp_xfer_counters;

/* A copy of the counters (each field read atomically; the four of a path
 * are not one snapshot while transfers run). Thread-safe, never blocks. */
void kvp_xfer_counts(kvp_xfer *x, kvp_xfer_counters *out);

/* One replica transfer. iov describes exactly rep.length bytes. */
typedef struct kvp_xfer_op {
    kvp_replica rep;
    const struct iovec *iov;
    int iovcnt;
    int status; /* out: 0, KVP_ETRANSFER_FAIL, KVP_ERPC_TIMEOUT, KVP_ESEGMENT_NOT_FOUND,
                   the node's refusal (INVALID_WRITE / INVALID_READ), and for
                   device ops KVP_EDEVICE or KVP_ECHECKSUM_MISMATCH (verify) */
    int want_csum;     /* compute csum while the bytes move: XXH3-64 of the
                          value, hashed a chunk at a time while the chunk is in
                          cache: right after copying it (shm), just before the
                          sendmsg that sends it (tcp write), right after the
                          recvmsg that lands it (tcp read); no separate pass */
    uint64_t csum;     /* out, when want_csum and status is 0 */
    /* Device memory (gpu.h): dev NULL = every piece is host memory; else
     * dev[i] != 0 marks iov[i] as device memory of gdev (one device per
     * op). Such ops move by DMA: over shm straight between device memory
     * and the page-locked segment mapping, over tcp through a ring of
     * page-locked staging buffers (device-to-host overlapped with sending,
     * receiving with host-to-device). Their checksum is always computed,
     * over the bytes in host memory (the segment, the staging buffer). */
    const uint8_t *dev;
    struct kvp_gpu_dev *gdev;
    int verify;           /* reads: the checksum must equal expect_csum before
                             bytes go to device memory (else CHECKSUM_MISMATCH,
                             nothing copied; a value larger than one staging
                             buffer over tcp is verified once it has landed) */
    uint64_t expect_csum;
} kvp_xfer_op;

/*
 * Runs n writes (is_write) or reads, in parallel where they target
 * different connections, all bounded by deadline_ms (kvp_now_ms clock).
 * Returns 0 when every op ran (check each status), or a negative code when
 * the batch could not start.
 */
int kvp_xfer_run(kvp_xfer *x, int is_write, kvp_xfer_op *ops, size_t n, uint64_t deadline_ms);

/*
 * What the shared-memory path has cost this xfer so far (counters since
 * create, summed over its segments; read without a lock, each field
 * consistent on its own): attaches that succeeded and their time (unix
 * connect, HELLO, SHM_ATTACH with the memfd over SCM_RIGHTS, the fd's
 * checks and the mmap: what a fresh client pays once per segment before
 * its first shm transfer), and the 2 MiB chunks transfers populated on
 * first touch (shm_populate) with the time they spent doing it (on the
 * transfers' own threads: page-table work for pages the node has faulted
 * in, allocating and zeroing them for pages it has not).
 */
typedef struct kvp_xfer_shm_stats {
    uint64_t attaches, attach_ns;
    uint64_t populates, populate_ns;
} kvp_xfer_shm_stats;
void kvp_xfer_shm_stats_get(kvp_xfer *x, kvp_xfer_shm_stats *out);

/* The shm mapping of a segment this client attached (its size in *size),
 * or NULL. For tests that must reach a node's bytes behind its back. */
uint8_t *kvp_xfer_shm_map(kvp_xfer *x, uint64_t segment_id, uint64_t *size);

/* The check an shm attach makes before mapping a received fd of `size`
 * announced bytes: a regular file (memfd) of at least `size` bytes (more is
 * logged; exactly `size` is mapped) sealed F_SEAL_SHRINK, so it cannot
 * shrink under the mapping. 0, or KVP_ETRANSFER_FAIL with the reason in err
 * (the attach then fails and the segment is used over tcp). */
int kvp_xfer_shm_check(int fd, uint64_t size, char *err, size_t errlen);
#endif
