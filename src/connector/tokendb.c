/*
 * tokendb.c -- chunking and KV address preparation (see tokendb.h).
 */
#include "connector/tokendb.h"

#include <string.h>

#include "common/mem.h"

int kvp_tdb_layout_init(kvp_tdb_layout *l, size_t num_blocks)
{
    memset(l, 0, sizeof *l);
    if (num_blocks == 0)
        return KVP_EINVALID_PARAMS;
    l->num_blocks = num_blocks;
    return 0;
}

void kvp_tdb_layout_free(kvp_tdb_layout *l)
{
    kvp_free(l->segs);
    memset(l, 0, sizeof *l);
}

static int layout_reserve(kvp_tdb_layout *l, size_t more)
{
    if (more > SIZE_MAX / sizeof(kvp_tdb_segment) - l->nsegs)
        return KVP_EINVALID_PARAMS;
    if (l->nsegs + more <= l->cap)
        return 0;
    size_t cap = l->cap ? l->cap : 8;
    while (cap < l->nsegs + more)
        cap = cap > SIZE_MAX / 2 / sizeof(kvp_tdb_segment) ? l->nsegs + more : cap * 2;
    kvp_tdb_segment *s = kvp_realloc(l->segs, cap * sizeof *s);
    if (!s)
        return KVP_ENOMEM;
    l->segs = s;
    l->cap = cap;
    return 0;
}

/* The head geometry of tensor t whose blocks are bl bytes (tokendb.h). */
static int heads_geometry(const kvp_tdb_tensor *t, size_t bl, uint32_t heads, kvp_tdb_heads *hd)
{
    memset(hd, 0, sizeof *hd);
    size_t e = t->elem_size;
    if (heads == 1) { /* the whole block is the head */
        hd->run = bl;
        hd->npieces = 1;
        return 0;
    }
    int dh = -1;
    for (int d = 0; d < t->ndim; d++) {
        /* stride 1: the head size's own dimension, never the heads */
        if (t->stride[d] > bl / e || t->stride[d] * e >= bl || t->shape[d] != heads ||
            t->stride[d] == 1)
            continue;
        if (dh >= 0)
            return KVP_EINVALID_PARAMS; /* two dimensions could be the heads */
        dh = d;
    }
    if (dh < 0)
        return KVP_EINVALID_PARAMS;
    size_t inner = 1;
    int outer[KVP_TDB_MAX_DIMS], no = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (d == dh || t->stride[d] > bl / e || t->stride[d] * e >= bl)
            continue; /* the heads, or not inside a block */
        if (t->stride[d] < t->stride[dh]) {
            if (t->shape[d] && inner > SIZE_MAX / t->shape[d])
                return KVP_EINVALID_PARAMS;
            inner *= t->shape[d];
        } else if (t->shape[d] > 1) {
            outer[no++] = d;
        }
    }
    if (inner != t->stride[dh])
        return KVP_EINVALID_PARAMS; /* a head's innermost bytes are not dense */
    /* outer dimensions by decreasing stride (insertion sort, <= 8) */
    for (int i = 1; i < no; i++)
        for (int k = i; k > 0 && t->stride[outer[k]] > t->stride[outer[k - 1]]; k--) {
            int x = outer[k];
            outer[k] = outer[k - 1];
            outer[k - 1] = x;
        }
    hd->run = t->stride[dh] * e;
    hd->step = hd->run;
    hd->npieces = 1;
    size_t last = (heads - 1) * hd->step + hd->run; /* one past head n-1's last piece */
    for (int i = 0; i < no; i++) {
        hd->shape[i] = t->shape[outer[i]];
        hd->stride[i] = t->stride[outer[i]] * e;
        if (hd->npieces > SIZE_MAX / hd->shape[i])
            return KVP_EINVALID_PARAMS;
        hd->npieces *= hd->shape[i];
        last += (hd->shape[i] - 1) * hd->stride[i];
    }
    hd->nd = (uint32_t)no;
    if (last > bl || hd->npieces > bl / hd->run / heads)
        return KVP_EINVALID_PARAMS; /* n heads do not fit in a block */
    return 0;
}

size_t kvp_tdb_head_npieces(const kvp_tdb_layout *l)
{
    size_t n = 0;
    for (size_t i = 0; i < l->nsegs; i++)
        n += l->segs[i].hd.npieces;
    return n;
}

uint64_t kvp_tdb_head_bytes(const kvp_tdb_layout *l)
{
    uint64_t n = 0;
    for (size_t i = 0; i < l->nsegs; i++)
        n += (uint64_t)l->segs[i].hd.npieces * l->segs[i].hd.run;
    return n;
}

int kvp_tdb_head_slice(const kvp_tdb_layout *l, const kvp_iov *blk, uint32_t j, kvp_iov *out,
                       size_t cap)
{
    if (!l->heads || j >= l->heads || cap < kvp_tdb_head_npieces(l))
        return KVP_EINVALID_PARAMS;
    size_t k = 0;
    for (size_t i = 0; i < l->nsegs; i++) {
        const kvp_tdb_heads *hd = &l->segs[i].hd;
        if (blk[i].len < l->segs[i].block_len)
            return KVP_EINVALID_PARAMS;
        size_t idx[KVP_TDB_MAX_DIMS] = {0};
        for (size_t p = 0; p < hd->npieces; p++) {
            size_t off = (size_t)j * hd->step;
            for (uint32_t d = 0; d < hd->nd; d++)
                off += idx[d] * hd->stride[d];
            /* inside the block: heads_geometry checked the last piece */
            out[k++] = (kvp_iov){(uint8_t *)blk[i].base + off, hd->run};
            for (uint32_t d = hd->nd; d-- > 0;) { /* row-major increment */
                if (++idx[d] < hd->shape[d])
                    break;
                idx[d] = 0;
            }
        }
    }
    return 0;
}

int kvp_tdb_layout_add_tensor(kvp_tdb_layout *l, const kvp_tdb_tensor *t, int *kind)
{
    if (!t->base || t->ndim < 1 || t->ndim > KVP_TDB_MAX_DIMS || t->elem_size == 0 ||
        t->storage_len < l->num_blocks || (uintptr_t)t->base > UINTPTR_MAX - t->storage_len)
        return KVP_EINVALID_PARAMS;
    for (size_t i = 0; i < l->nsegs; i++) {
        if (l->segs[i].region == (uint8_t *)t->base) {
            if (kind)
                *kind = KVP_TDB_DUPLICATE;
            return 0;
        }
    }
    uint8_t *base = t->base;
    size_t page = t->storage_len / l->num_blocks;
    int outer = -1;
    for (int d = 0; d < t->ndim; d++) {
        /* stride*elem > page  <=>  stride > floor(page/elem): no overflow */
        if (t->stride[d] > page / t->elem_size) {
            outer = d;
            break;
        }
    }
    if (outer < 0) {
        kvp_tdb_heads hd = {0};
        int rc = l->heads ? heads_geometry(t, page, l->heads, &hd) : 0;
        if (rc == 0)
            rc = layout_reserve(l, 1);
        if (rc)
            return rc;
        l->segs[l->nsegs++] = (kvp_tdb_segment){base, page, page * l->num_blocks, base,
                                                 t->storage_len, hd};
        if (kind)
            *kind = KVP_TDB_BLOCKS_FIRST;
        return 0;
    }
    size_t planes = t->shape[outer];
    if (t->stride[outer] > SIZE_MAX / t->elem_size || planes == 0)
        return KVP_EINVALID_PARAMS;
    size_t seg = t->stride[outer] * t->elem_size;
    /* every plane [i*seg, (i+1)*seg) must lie inside the storage */
    if (planes > t->storage_len / seg)
        return KVP_EINVALID_PARAMS;
    kvp_tdb_heads hd = {0};
    int rc = l->heads ? heads_geometry(t, seg / l->num_blocks, l->heads, &hd) : 0;
    if (rc == 0)
        rc = layout_reserve(l, planes);
    if (rc)
        return rc;
    for (size_t i = 0; i < planes; i++)
        l->segs[l->nsegs++] = (kvp_tdb_segment){base + i * seg, seg / l->num_blocks, seg, base,
                                                 t->storage_len, hd};
    if (kind)
        *kind = KVP_TDB_KV_FIRST;
    return 0;
}

int kvp_tdb_init(kvp_tdb *db, uint32_t block_size, uint32_t hash_block_size,
                 const kvp_tdb_layout *layout)
{
    memset(db, 0, sizeof *db);
    if (hash_block_size == 0)
        hash_block_size = block_size;
    if (block_size == 0 || !layout || block_size % hash_block_size != 0)
        return KVP_EINVALID_PARAMS;
    db->block_size = block_size;
    db->hash_block_size = hash_block_size;
    db->layout = layout;
    return 0;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

int kvp_tdb_process_tokens(const kvp_tdb *db, uint64_t T, size_t n_hashes, uint64_t mask_num,
                           const uint8_t *chunk_mask, size_t mask_len, uint32_t put_step,
                           uint32_t put_step_rank, kvp_tdb_chunk *out, size_t cap, size_t *n)
{
    *n = 0;
    if (put_step == 0)
        return KVP_EINVALID_PARAMS;
    if (n_hashes == 0)
        return 0;
    const uint64_t B = db->block_size, H = db->hash_block_size;
    if (T % H != 0 || T / H > n_hashes || T > UINT64_MAX - B)
        return KVP_EINVALID_PARAMS;
    uint64_t start_chunk = ceil_div(mask_num, B);
    uint64_t max_chunks = ceil_div(T, B);
    /* max_chunks = min(max_chunks, start_chunk + mask_len), overflow-safe */
    if (chunk_mask && start_chunk < max_chunks && mask_len < max_chunks - start_chunk)
        max_chunks = start_chunk + mask_len;
    size_t cnt = 0;
    for (uint64_t c = start_chunk; c < max_chunks; c++) {
        if (chunk_mask && !chunk_mask[c - start_chunk])
            continue;
        if (c % put_step != put_step_rank)
            continue;
        uint64_t s = c * B, e = s + B < T ? s + B : T;
        if (cnt < cap)
            out[cnt] = (kvp_tdb_chunk){s, e, c, e / H - 1};
        cnt++;
    }
    *n = cnt;
    return cnt > cap ? KVP_EBUFFER_OVERFLOW : 0;
}

/* Piece of `nblk` blocks from `bid` in segment `s`, bounds-checked. */
static int seg_piece(const kvp_tdb_segment *s, uint64_t bid, uint64_t nblk, kvp_iov *out)
{
    if (s->block_len == 0 || nblk == 0)
        return KVP_EINVALID_PARAMS;
    uint64_t slots = s->extent / s->block_len;
    if (bid >= slots || nblk > slots - bid)
        return KVP_EINVALID_PARAMS;
    size_t off = (size_t)bid * s->block_len, len = (size_t)nblk * s->block_len;
    /* extent within region is an invariant of add_tensor; re-checked here */
    size_t seg_off = (size_t)(s->base - s->region);
    if (s->base < s->region || seg_off > s->region_len || off > s->region_len - seg_off ||
        len > s->region_len - seg_off - off)
        return KVP_EINVALID_PARAMS;
    out->base = s->base + off;
    out->len = len;
    return 0;
}

int kvp_tdb_prepare_value(const kvp_tdb *db, uint64_t start, uint64_t end,
                          const uint32_t *block_ids, size_t n_block_ids, kvp_iov *out,
                          size_t cap, uint32_t *block_id)
{
    const kvp_tdb_layout *l = db->layout;
    const uint64_t B = db->block_size, H = db->hash_block_size;
    if (end <= start || start % B != 0 || (end - start) % H != 0 || start / B >= n_block_ids)
        return KVP_EINVALID_PARAMS;
    if (cap < l->nsegs)
        return KVP_EBUFFER_OVERFLOW;
    uint32_t bid = block_ids[start / B];
    uint64_t nblk = ceil_div(end - start, B);
    for (size_t i = 0; i < l->nsegs; i++) {
        int rc = seg_piece(&l->segs[i], bid, nblk, &out[i]);
        if (rc)
            return rc;
    }
    if (block_id)
        *block_id = bid;
    return 0;
}

int kvp_tdb_prepare_values(const kvp_tdb *db, const kvp_tdb_chunk *chunks, size_t nchunks,
                           const uint32_t *block_ids, size_t n_block_ids, kvp_iov *out,
                           size_t cap, uint32_t *chunk_block_ids)
{
    size_t ns = db->layout->nsegs;
    if (ns && nchunks > cap / ns)
        return KVP_EBUFFER_OVERFLOW;
    for (size_t k = 0; k < nchunks; k++) {
        uint32_t bid;
        int rc = kvp_tdb_prepare_value(db, chunks[k].start, chunks[k].end, block_ids,
                                       n_block_ids, out + k * ns, ns, &bid);
        if (rc)
            return rc;
        if (chunk_block_ids)
            chunk_block_ids[k] = bid;
    }
    return 0;
}

int kvp_tdb_prepare_block(const kvp_tdb *db, uint32_t block_id, kvp_iov *out, size_t cap)
{
    const kvp_tdb_layout *l = db->layout;
    if (cap < l->nsegs)
        return KVP_EBUFFER_OVERFLOW;
    for (size_t i = 0; i < l->nsegs; i++) {
        int rc = seg_piece(&l->segs[i], block_id, 1, &out[i]);
        if (rc)
            return rc;
    }
    return 0;
}
