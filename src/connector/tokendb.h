/*
 * tokendb.h -- the ChunkedTokenDatabase of one KV-cache group (spec §6.6)
 * and the KV-region layout it addresses (spec §6.7).
 *
 * kvp_tdb_layout: the list of "segments" built from the registered KV-cache
 *   tensors. A segment is a run of `num_blocks` equally sized block slots
 *   inside one registered region; the bytes of GPU block `bid` in segment i
 *   are [seg[i].base + bid*block_len, + block_len). Layout detection (§6.7):
 *   page = region_len / num_blocks; a tensor dimension whose byte stride is
 *   larger than `page` is an "outer" (plane) dimension:
 *     - no outer dimension: blocks-first (FlashInfer / MLA) or cross-layer
 *       (one tensor holding every layer of a block): ONE segment
 *       (base, page);
 *     - else, with d = the first outer dimension and s = stride(d) bytes:
 *       K/V-first (FlashAttention `(2, num_blocks, ...)`): shape[d]
 *       segments (base + i*s, s / num_blocks).
 *   So a transfer of one block has one piece per layer per plane (K/V-first),
 *   one per layer (blocks-first) or one in all (cross-layer).
 *   Every KV-cache group shares the same layout (vLLM's HMA addresses all
 *   groups' physical tensors by block id).
 *
 * kvp_tdb: per group, B = block_size tokens per block, H = hash_block_size
 *   (granularity of the request's block hashes, B % H == 0). It turns a
 *   token range into chunks (one group block each, the last one possibly
 *   partial but H-aligned, keyed by the LAST sub-hash it covers) and a chunk
 *   into the (address, length) pieces to gather/scatter (kvp_iov).
 *
 * Invariants / contracts:
 *   - every address handed out lies inside the segment's extent, which lies
 *     inside the registered region it came from (checked, overflow-safe);
 *     a request outside it is refused with KVP_EINVALID_PARAMS and nothing
 *     is written to the caller's arrays beyond what was already valid.
 *   - a kvp_tdb borrows its layout: the layout must outlive the db and must
 *     not gain segments while a transfer built from it is in flight.
 *   - outputs go to caller arrays with an explicit capacity; a too small
 *     capacity is KVP_EBUFFER_OVERFLOW with the needed count reported.
 *   - not thread-safe for mutation; const functions may run concurrently.
 */
#ifndef KVP_TOKENDB_H
#define KVP_TOKENDB_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define KVP_TDB_MAX_DIMS 8

/* A registered KV-cache tensor, as the engine describes it. */
typedef struct kvp_tdb_tensor {
    void *base;                        /* untyped_storage().data_ptr() */
    size_t storage_len;                /* untyped_storage().nbytes() */
    size_t elem_size;                  /* element_size() */
    int ndim;                          /* 1..KVP_TDB_MAX_DIMS */
    size_t shape[KVP_TDB_MAX_DIMS];
    size_t stride[KVP_TDB_MAX_DIMS];   /* in elements, as torch reports */
} kvp_tdb_tensor;

enum kvp_tdb_kind {
    KVP_TDB_DUPLICATE = 0,   /* storage already registered: nothing added */
    KVP_TDB_BLOCKS_FIRST = 1, /* one segment (also the cross-layer case) */
    KVP_TDB_KV_FIRST = 2,    /* one segment per plane of the outer dim */
};

/*
 * Where one KV head's bytes lie inside a block of a segment (the
 * TP-independent layout, kvp_tdb_head_slice): head j of the block at
 * offset 0 is the h_npieces runs of h_run bytes at
 *   j * h_step + sum_k idx_k * h_stride[k]     (idx_k < h_shape[k]),
 * the in-block dimensions outside the head dimension enumerated row-major
 * by decreasing stride (for every usual layout: plane, then token).
 */
typedef struct kvp_tdb_heads {
    uint32_t nd;                             /* outer in-block dimensions */
    size_t shape[KVP_TDB_MAX_DIMS];
    size_t stride[KVP_TDB_MAX_DIMS];         /* bytes, decreasing */
    size_t step;                             /* bytes from head j to j + 1 */
    size_t run;                              /* contiguous bytes of a piece */
    size_t npieces;                          /* product of shape[0..nd) */
} kvp_tdb_heads;

typedef struct kvp_tdb_segment {
    uint8_t *base;        /* block 0 of this segment */
    size_t block_len;     /* bytes per block */
    size_t extent;        /* bytes of the segment: blocks live in [base, base+extent) */
    uint8_t *region;      /* registered region holding the segment */
    size_t region_len;
    kvp_tdb_heads hd;     /* with layout.heads > 0 only */
} kvp_tdb_segment;

typedef struct kvp_tdb_layout {
    size_t num_blocks;     /* cache_config.num_gpu_blocks, > 0 */
    kvp_tdb_segment *segs;
    size_t nsegs;
    size_t cap;
    uint32_t heads;        /* 0, or the KV heads every block holds (set before
                              the first tensor): each tensor must then show
                              them as one in-block dimension (below) */
} kvp_tdb_layout;

/* num_blocks == 0 -> KVP_EINVALID_PARAMS. */
int kvp_tdb_layout_init(kvp_tdb_layout *l, size_t num_blocks);
void kvp_tdb_layout_free(kvp_tdb_layout *l);
/*
 * Registers one tensor (dedup by storage base) and applies the layout
 * detection rule. On success *kind (may be NULL) says what was detected.
 * A tensor whose geometry is inconsistent (storage shorter than num_blocks
 * bytes, a plane extending past the storage, ndim out of range, zero
 * element size) is KVP_EINVALID_PARAMS; KVP_ENOMEM on allocation failure.
 * A cross-layer tensor is registered the same way (spec: the cross-layer
 * call is register_kv_caches({"__cross_layer__": t})).
 */
int kvp_tdb_layout_add_tensor(kvp_tdb_layout *l, const kvp_tdb_tensor *t, int *kind);

/*
 * With l->heads = n > 0, kvp_tdb_layout_add_tensor also finds where each
 * head lies in a block: the in-block dimensions are those whose byte
 * stride is below the segment's block_len; exactly one of them, other
 * than one of stride 1 (a head's own elements), must have n entries (n == 1: the whole block is the head, e.g. an MLA latent), the
 * dimensions inside it must be dense (their extents multiply to its
 * stride), and n heads must fit in the block (padding after them is never
 * moved). Otherwise the tensor is KVP_EINVALID_PARAMS (an ambiguous one,
 * e.g. block_size == heads in both dimensions, included).
 */
/* Pieces of one head over every segment (sum of hd.npieces). */
size_t kvp_tdb_head_npieces(const kvp_tdb_layout *l);
/* Bytes of one head over every segment (one object of the head layout). */
uint64_t kvp_tdb_head_bytes(const kvp_tdb_layout *l);
/*
 * Head j's pieces of the block whose whole-block pieces (one per segment,
 * as kvp_tdb_prepare_block / prepare_value give them) are blk[0..nsegs):
 * written to out (cap >= kvp_tdb_head_npieces), segment by segment, in
 * the order above. KVP_EINVALID_PARAMS for j >= heads, no head layout, or
 * a piece not inside its block.
 */
int kvp_tdb_head_slice(const kvp_tdb_layout *l, const kvp_iov *blk, uint32_t j, kvp_iov *out,
                       size_t cap);

typedef struct kvp_tdb {
    uint32_t block_size;      /* B, tokens per block of this group */
    uint32_t hash_block_size; /* H, B % H == 0 */
    const kvp_tdb_layout *layout; /* borrowed */
} kvp_tdb;

/* hash_block_size 0 means H = B. B == 0 or B % H != 0 -> KVP_EINVALID_PARAMS. */
int kvp_tdb_init(kvp_tdb *db, uint32_t block_size, uint32_t hash_block_size,
                 const kvp_tdb_layout *layout);

/* One chunk: tokens [start, end), keyed by block_hashes[hash_idx]. */
typedef struct kvp_tdb_chunk {
    uint64_t start;
    uint64_t end;
    uint64_t index;    /* absolute chunk index = start / B */
    uint64_t hash_idx; /* end / H - 1 */
} kvp_tdb_chunk;

/*
 * process_tokens (§6.6): chunks c in [ceil(mask_num/B), ceil(T/B)) with,
 * when chunk_mask != NULL, c < start_chunk + mask_len and
 * chunk_mask[c - start_chunk] != 0 (the mask is RELATIVE to start_chunk),
 * and c % put_step == put_step_rank. Writes at most `cap` chunks to `out`
 * and the number of selected chunks to *n (even when > cap, then the
 * result is KVP_EBUFFER_OVERFLOW).
 * n_hashes == 0 selects nothing (the spec returns before its asserts).
 * Otherwise T % H != 0, T / H > n_hashes or put_step == 0 are
 * KVP_EINVALID_PARAMS. Hashes are never read here: the caller maps
 * hash_idx to its own hash array.
 */
int kvp_tdb_process_tokens(const kvp_tdb *db, uint64_t T, size_t n_hashes, uint64_t mask_num,
                           const uint8_t *chunk_mask, size_t mask_len, uint32_t put_step,
                           uint32_t put_step_rank, kvp_tdb_chunk *out, size_t cap, size_t *n);

/* Pieces per chunk: the number of segments. */
static inline size_t kvp_tdb_pieces(const kvp_tdb *db) { return db->layout->nsegs; }

/*
 * prepare_value (§6.6) for one chunk [start, end): start must be a block
 * boundary (start % B == 0), (end - start) % H == 0, end > start;
 * bid = block_ids[start / B] (start / B < n_block_ids); for each segment i:
 * piece i = (seg_i.base + bid*block_len_i, block_len_i * ceil((end-start)/B))
 * (a partial chunk still moves its whole block). Needs cap >= nsegs;
 * *block_id receives bid (may be NULL). Bounds failure -> KVP_EINVALID_PARAMS.
 */
int kvp_tdb_prepare_value(const kvp_tdb *db, uint64_t start, uint64_t end,
                          const uint32_t *block_ids, size_t n_block_ids, kvp_iov *out,
                          size_t cap, uint32_t *block_id);

/*
 * prepare_values (§6.6): chunk k's pieces go to out[k*nsegs .. k*nsegs+nsegs)
 * and its block id to chunk_block_ids[k] (may be NULL). Needs
 * cap >= nchunks * nsegs. All-or-nothing: on error the outputs are
 * unspecified and must not be used.
 */
int kvp_tdb_prepare_values(const kvp_tdb *db, const kvp_tdb_chunk *chunks, size_t nchunks,
                           const uint32_t *block_ids, size_t n_block_ids, kvp_iov *out,
                           size_t cap, uint32_t *chunk_block_ids);

/* prepare_value_for_block (§6.6): one physical slot, piece i = (base_i +
 * bid*block_len_i, block_len_i). Needs cap >= nsegs. */
int kvp_tdb_prepare_block(const kvp_tdb *db, uint32_t block_id, kvp_iov *out, size_t cap);

#endif
