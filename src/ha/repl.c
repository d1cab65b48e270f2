/* repl.c -- the leader -> standby index stream's records (see repl.h). */
#include "ha/repl.h"

#include <string.h>

#include "kvpool.h"

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void kvp_repl_wr_close(kvp_repl_wr *w)
{
    if (!w->n)
        return;
    if (!w->out->err) {
        uint8_t *body = w->out->data + w->frame + KVP_FRAME_HDR;
        put_le64(body, w->seq);
        kvp_buf_patch_u32(w->out, w->frame + KVP_FRAME_HDR + 8, w->n);
        kvp_frame_end(w->out, w->frame);
    }
    w->n = 0;
}

void kvp_repl_wr_add(kvp_repl_wr *w, const kvp_repl_rec *r, uint64_t seq)
{
    kvp_buf *b = w->out;
    if (!w->n) {
        w->frame = kvp_frame_begin(b, KVP_OP_REPL_DATA, KVP_FLAG_ONEWAY, 0, 0);
        kvp_buf_u64(b, 0); /* seq and n: patched at close */
        kvp_buf_u32(b, 0);
    }
    kvp_buf_u8(b, r->type);
    if (r->type == KVP_REPL_PUB || r->type == KVP_REPL_DEL) {
        kvp_buf_bytes(b, r->tenant.p, r->tenant.len);
        kvp_buf_bytes(b, r->key.p, r->key.len);
    }
    if (r->type == KVP_REPL_PUB) {
        kvp_buf_u64(b, r->size);
        kvp_buf_u64(b, r->checksum);
        kvp_buf_u8(b, r->flags);
        kvp_buf_u8(b, r->nrep);
        for (unsigned i = 0; i < r->nrep; i++) {
            kvp_buf_u64(b, r->rep[i].seg_id);
            kvp_buf_u32(b, r->rep[i].page);
            kvp_buf_u32(b, r->rep[i].gen);
        }
        if (r->flags & KVP_REPL_F_BLOCK) {
            kvp_buf_u64(b, r->blk_hash);
            kvp_buf_u8(b, r->group);
            kvp_buf_u16(b, r->parts);
            kvp_buf_u32(b, r->block_size);
        }
    }
    w->n++;
    w->seq = seq;
    if (b->len - w->frame - KVP_FRAME_HDR >= KVP_REPL_FRAME)
        kvp_repl_wr_close(w);
}

int kvp_repl_open(kvp_repl_rd *it, const uint8_t *body, size_t len, uint64_t *seq)
{
    kvp_rd_init(&it->rd, body, len);
    *seq = kvp_rd_u64(&it->rd);
    it->left = kvp_rd_count(&it->rd, UINT32_MAX, 1);
    return it->rd.err ? KVP_EPROTOCOL : 0;
}

int kvp_repl_next(kvp_repl_rd *it, kvp_repl_rec *r)
{
    if (it->left == 0)
        return kvp_rd_finish(&it->rd) == 0 ? 0 : KVP_EPROTOCOL;
    it->left--;
    memset(r, 0, sizeof *r);
    r->type = kvp_rd_u8(&it->rd);
    switch (r->type) {
    case KVP_REPL_RESET:
    case KVP_REPL_SYNCED:
        break;
    case KVP_REPL_PUB:
    case KVP_REPL_DEL:
        r->tenant = kvp_rd_bytes(&it->rd, KVP_REPL_MAX_TENANT);
        r->key = kvp_rd_bytes(&it->rd, KVP_REPL_MAX_KEY);
        if (!it->rd.err && (r->key.len == 0 || (r->tenant.len && memchr(r->tenant.p, 0, r->tenant.len))))
            return KVP_EPROTOCOL;
        if (r->type == KVP_REPL_DEL)
            break;
        r->size = kvp_rd_u64(&it->rd);
        r->checksum = kvp_rd_u64(&it->rd);
        r->flags = kvp_rd_u8(&it->rd);
        r->nrep = kvp_rd_u8(&it->rd);
        if (r->nrep == 0 || r->nrep > KVP_MAX_REPLICAS || r->size == 0 ||
            r->size > KVP_REPL_MAX_SIZE || (r->flags & ~(KVP_REPL_F_PINNED | KVP_REPL_F_BLOCK)))
            return KVP_EPROTOCOL;
        for (unsigned i = 0; i < r->nrep; i++) {
            r->rep[i].seg_id = kvp_rd_u64(&it->rd);
            r->rep[i].page = kvp_rd_u32(&it->rd);
            r->rep[i].gen = kvp_rd_u32(&it->rd);
            if (r->rep[i].seg_id == 0)
                return KVP_EPROTOCOL;
        }
        if (r->flags & KVP_REPL_F_BLOCK) {
            r->blk_hash = kvp_rd_u64(&it->rd);
            r->group = kvp_rd_u8(&it->rd);
            r->parts = kvp_rd_u16(&it->rd);
            r->block_size = kvp_rd_u32(&it->rd);
            if (!it->rd.err && (r->group > 31 || r->parts == 0 || r->block_size == 0))
                return KVP_EPROTOCOL;
        }
        break;
    default:
        return KVP_EPROTOCOL;
    }
    return it->rd.err ? KVP_EPROTOCOL : 1;
}

int kvp_repl_check(const uint8_t *body, size_t len)
{
    kvp_repl_rd it;
    uint64_t seq;
    if (kvp_repl_open(&it, body, len, &seq) != 0)
        return KVP_EPROTOCOL;
    kvp_repl_rec r;
    int rc;
    while ((rc = kvp_repl_next(&it, &r)) == 1)
        ;
    return rc;
}
