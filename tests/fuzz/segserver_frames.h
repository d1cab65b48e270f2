/*
 * segserver_frames.h -- the frames a segment server client sends, shared by
 * fuzz_segserver.c and gen_segserver_corpus.c: AUTH_CHALLENGE, HELLO, SEG_WRITE / SEG_READ
 * with descriptors issued under FZ_SECRET that expire far in the future (so
 * committed seeds stay valid), SHM_ATTACH and UCX_ATTACH.
 */
#ifndef KVP_SEGSERVER_FRAMES_H
#define KVP_SEGSERVER_FRAMES_H

#include <stdint.h>
#include <string.h>

#include "common/buf.h"
#include "proto/proto.h"

#define FZ_SEG_ID 0x5e65e65e65e65e6ull
#define FZ_SECRET 0xf022f022f022f022ull
#define FZ_TOKEN "fuzz"
#define FZ_SEG_SIZE (1u << 20)
#define FZ_EXPIRES (1ull << 60)

static inline size_t fz_hdr(uint8_t *p, uint16_t op, uint64_t req_id, uint32_t blen)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, op, req_id, blen, 0};
    kvp_frame_hdr_encode(p, &h);
    return KVP_FRAME_HDR;
}

/* AUTH_CHALLENGE announcing a cluster token; p has room for 512 bytes. */
static inline size_t fz_challenge(uint8_t *p, uint64_t req_id)
{
    static const uint8_t nonce[KVP_AUTH_NONCE] = {0x4e};
    kvp_buf b = {p + KVP_FRAME_HDR, 0, 512 - KVP_FRAME_HDR, 512 - KVP_FRAME_HDR, 0};
    kvp_msg_challenge m = {KVP_PROTO_VERSION, {nonce, KVP_AUTH_NONCE},
                           KVP_AUTH_HAS(KVP_AUTH_CLUSTER), {NULL, 0}};
    kvp_enc_challenge(&b, &m);
    return fz_hdr(p, KVP_OP_AUTH_CHALLENGE, req_id, (uint32_t)b.len) + b.len;
}

/* HELLO; p has room for 512 bytes. A fixed stream cannot prove a token
 * (the proof covers the server's random nonce), so the fuzzed server has
 * none (fuzz_segserver.c); a non-empty `token` sends a made-up proof. */
static inline size_t fz_hello(uint8_t *p, uint64_t req_id, const char *token)
{
    static const uint8_t junk[KVP_AUTH_PROOF] = {0x70};
    kvp_buf b = {p + KVP_FRAME_HDR, 0, 512 - KVP_FRAME_HDR, 512 - KVP_FRAME_HDR, 0};
    kvp_msg_hello m = {KVP_PROTO_VERSION, 42, {(const uint8_t *)"fuzz", 4}, {{NULL, 0}}};
    if (*token)
        m.proof[KVP_AUTH_CLUSTER] = (kvp_bytes){junk, KVP_AUTH_PROOF};
    kvp_enc_hello(&b, &m);
    return fz_hdr(p, KVP_OP_HELLO, req_id, (uint32_t)b.len) + b.len;
}

/* A descriptor of [off, off + len) issued for op's access. */
static inline kvp_replica fz_rep(uint16_t op, uint64_t off, uint64_t len, uint64_t gen)
{
    kvp_replica r = {FZ_SEG_ID, off, len, gen, FZ_EXPIRES,
                     op == KVP_OP_SEG_WRITE ? KVP_ACCESS_WRITE : KVP_ACCESS_READ, 0};
    r.tag = kvp_replica_tag(FZ_SECRET, &r);
    return r;
}

/* SEG_READ, or SEG_WRITE with `len` body bytes of value `fill`. */
static inline size_t fz_seg_io(uint8_t *p, uint16_t op, uint64_t req_id, uint64_t off,
                               uint64_t len, uint64_t gen, uint8_t fill)
{
    kvp_replica r = fz_rep(op, off, len, gen);
    uint64_t body = op == KVP_OP_SEG_WRITE ? len : 0;
    size_t n = fz_hdr(p, op, req_id, (uint32_t)(KVP_SEG_IO_SIZE + body));
    kvp_buf b = {p + n, 0, KVP_SEG_IO_SIZE, KVP_SEG_IO_SIZE, 0};
    kvp_enc_seg_io(&b, &r);
    n += KVP_SEG_IO_SIZE;
    memset(p + n, fill, (size_t)body);
    return n + (size_t)body;
}

/* SHM_ATTACH (op 0) or another attach op of one segment id. */
static inline size_t fz_attach_op(uint8_t *p, uint16_t op, uint64_t req_id, uint64_t seg_id)
{
    size_t n = fz_hdr(p, op ? op : KVP_OP_SHM_ATTACH, req_id, 8);
    for (int i = 0; i < 8; i++)
        p[n + (size_t)i] = (uint8_t)(seg_id >> (8 * i));
    return n + 8;
}

static inline size_t fz_attach(uint8_t *p, uint64_t req_id, uint64_t seg_id)
{
    return fz_attach_op(p, 0, req_id, seg_id);
}

#endif
