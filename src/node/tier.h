/*
 * tier.h -- a storage node's SSD tier as the master sees it: the glue
 * between the master's DISK_CMDs (proto.h) and the disk store (disk.h).
 *
 *   SPILL   the replica's bytes are checked against the object's checksum
 *           (a corrupt DRAM copy is never made durable) and queued for the
 *           disk writer; SPILLED is reported once durable, or failed
 *           (-200 when the writer's staging is full or the disk is full)
 *   LOAD    a loader thread reads the record into the master's staging
 *           allocation in the segment (verified end to end) and reports
 *           LOADED; reads run on their own threads, never on the segment
 *           server's, so disk reads never hold up DRAM reads
 *   FORGET  the record it names (rec, size, checksum) is removed (a
 *           tombstone); one naming another record than the key's live one
 *           is ignored (forget_stale), one finding none too (forget_missing)
 * Records the disk store drops (for room, or found corrupt) are reported
 * GONE; after every mount kvp_tier_register queues a HAVE per live record,
 * so a restarted node or master gets the disk's objects back.
 *
 * Reports queue here until the link thread takes them (kvp_tier_take);
 * kvp_tier_wake_fd becomes readable when some wait.
 *
 * Threads: kvp_tier_command and kvp_tier_register on the link thread;
 * kvp_tier_take on the link thread; the rest anywhere. Two loader threads
 * also run compaction (bounded work every 100 ms).
 */
#ifndef KVP_TIER_H
#define KVP_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "node/disk.h"
#include "node/segment.h"

typedef struct kvp_tier kvp_tier;

/* Opens cfg's tier (offload_dir, offload_capacity, ...) for segment seg,
 * whose id reports carry. 0, or KVP_ECONFIG / KVP_EIO with err. */
int kvp_tier_open(const kvp_config *cfg, kvp_segment *seg, uint64_t seg_id, kvp_tier **out,
                  char *err, size_t errlen);
/* Waits for queued writes and loads, then frees. */
void kvp_tier_close(kvp_tier *t);
uint64_t kvp_tier_capacity(const kvp_tier *t);

/* A DISK_CMD body from the master. */
void kvp_tier_command(kvp_tier *t, const uint8_t *body, uint32_t len);
/* Queues a HAVE report for every live record. Returns how many. */
uint64_t kvp_tier_register(kvp_tier *t);

/* Readable while reports wait (an eventfd). */
int kvp_tier_wake_fd(const kvp_tier *t);
/* Hands every waiting report to send as DISK_REPORT bodies (at most about
 * 1 MiB each), in order. A body send refuses (< 0) is kept, with the ones
 * after it, for the next call. Returns 0 or send's error. */
int kvp_tier_take(kvp_tier *t, int (*send)(void *ctx, const uint8_t *body, size_t len),
                  void *ctx);

typedef struct kvp_tier_stats {
    uint64_t spills, spill_fails, spill_corrupt, loads, load_fails, forgets, gone;
    uint64_t forget_stale, forget_missing;
    uint64_t registered;
} kvp_tier_stats;
void kvp_tier_get_stats(kvp_tier *t, kvp_tier_stats *out);
/* The disk store's own figures (disk.h). Thread-safe. */
void kvp_tier_disk_stats(kvp_tier *t, kvp_disk_stats *out);
#endif
