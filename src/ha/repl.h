/*
 * repl.h -- the index stream a cluster's leader sends its standbys: what a
 * new leader needs to keep every published object readable (kvp_repl_*).
 *
 * A standby asks with REPL_FOLLOW; the leader answers the request, then
 * pushes REPL_DATA frames (ONEWAY, req_id 0) for as long as the connection
 * lives: first a snapshot (RESET, one PUB per readable object, SYNCED),
 * then every change as it happens. The standby acknowledges each frame
 * once applied (REPL_ACK, ONEWAY, body u64 seq).
 *
 * Records are states, not operations: PUB says "this key now has this
 * value in these allocations", DEL "this key has no DRAM copy". Applying a
 * record twice, or a record older than the snapshot after it, converges to
 * the same picture, which is why the snapshot may be cut at any moment
 * while changes keep flowing.
 *
 * REPL_DATA body:  u64 seq (of its last record) | u32 n | n records
 * record:          u8 type | fields by type
 *   RESET, SYNCED: nothing
 *   PUB:  bytes tenant | bytes key (1..65535) | u64 size (1..2^40-1) | u64 checksum | u8 flags |
 *         u8 nrep (1..KVP_MAX_REPLICAS) | nrep x (u64 segment id | u32 page | u32 gen)
 *         [ with KVP_REPL_F_BLOCK: u64 block hash | u8 group (0..31) | u16 parts (>= 1) |
 *           u32 block_size (>= 1): the engine block the object is a part of (kvblk.h) ]
 *   DEL:  bytes tenant | bytes key
 * `gen` is the low half of the allocation's generation (the master keeps
 * the high half per segment mount). Every field is validated by
 * kvp_repl_next; a malformed frame is refused whole.
 */
#ifndef KVP_REPL_H
#define KVP_REPL_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "proto/proto.h"

enum { KVP_REPL_RESET = 1, KVP_REPL_PUB = 2, KVP_REPL_DEL = 3, KVP_REPL_SYNCED = 4 };
enum { KVP_REPL_F_PINNED = 0x1, KVP_REPL_F_BLOCK = 0x2 };
#define KVP_REPL_FRAME (256u << 10) /* a frame is closed past this many body bytes */
#define KVP_REPL_MAX_KEY 65535u
#define KVP_REPL_MAX_TENANT 255u
#define KVP_REPL_MAX_SIZE ((1ull << 40) - 1) /* bytes of one value */

typedef struct kvp_repl_rep {
    uint64_t seg_id;
    uint32_t page, gen;
} kvp_repl_rep;

typedef struct kvp_repl_rec {
    uint8_t type;
    kvp_bytes tenant, key; /* PUB, DEL */
    uint64_t size, checksum;
    uint8_t flags;         /* KVP_REPL_F_* */
    uint8_t nrep;
    kvp_repl_rep rep[KVP_MAX_REPLICAS];
    /* KVP_REPL_F_BLOCK */
    uint64_t blk_hash;
    uint32_t block_size;
    uint16_t parts;
    uint8_t group;
} kvp_repl_rec;

/* Appends records to `out` as REPL_DATA frames: one is opened on demand and
 * closed past KVP_REPL_FRAME or by kvp_repl_wr_close. Zero-initialise,
 * then set out. */
typedef struct kvp_repl_wr {
    kvp_buf *out;
    size_t frame;     /* offset of the open frame's header */
    uint32_t n;       /* records in it; 0 = none open */
    uint64_t seq;     /* its last record's seq */
} kvp_repl_wr;

void kvp_repl_wr_add(kvp_repl_wr *w, const kvp_repl_rec *r, uint64_t seq);
void kvp_repl_wr_close(kvp_repl_wr *w);

/* Reading one REPL_DATA body. */
typedef struct kvp_repl_rd {
    kvp_rd rd;
    uint32_t left;
} kvp_repl_rd;

/* 0 and *seq, or KVP_EPROTOCOL. */
int kvp_repl_open(kvp_repl_rd *it, const uint8_t *body, size_t len, uint64_t *seq);
/* 1 and *r (pointing into the body), 0 at the end (the body is then wholly
 * consumed), or KVP_EPROTOCOL. */
int kvp_repl_next(kvp_repl_rd *it, kvp_repl_rec *r);
/* Checks a whole body first (so nothing of a bad frame is applied). */
int kvp_repl_check(const uint8_t *body, size_t len);

#endif
