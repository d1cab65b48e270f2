/*
 * fuzz_frame.c -- kvp_frame_next over an arbitrary byte stream.
 *
 * Takes frames off the front of the input until it needs more bytes or
 * meets a bad header, and checks: a frame lies inside the input with its
 * body right after the header; the header re-encodes to the same 24 bytes;
 * one byte less of the frame means "need more"; 0 is only answered when the
 * frame really is incomplete; errors are the documented ones. Each body of a
 * frame with status 0 then goes through the decoder of its opcode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto_samples.h"

#define MAX_FRAME (1u << 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void decode_body(const kvp_frame_hdr *h, const uint8_t *body)
{
    if (h->op < 1 || h->op >= KVP_OP__MAX || h->status != 0)
        return;
    int kind = h->flags & KVP_FLAG_RESPONSE ? pc_op_kinds[h->op].resp : pc_op_kinds[h->op].req;
    if (kind == PC_NONE)
        return;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_arena a;
    kvp_arena_init(&a, 1u << 20);
    pc_msg m;
    int rc = pc_codecs[kind].dec(body, h->body_len, &l, &a, &m);
    if (rc != 0 && rc != KVP_EPROTOCOL && rc != KVP_ENOMEM)
        abort();
    kvp_arena_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        const uint8_t *in = data + off;
        size_t left = size - off;
        kvp_frame_hdr h;
        const uint8_t *body = NULL;
        int rc = kvp_frame_next(in, left, MAX_FRAME, &h, &body);
        if (rc == 0) {
            if (left >= KVP_FRAME_HDR &&
                (kvp_frame_hdr_decode(in, MAX_FRAME, &h) != 0 || left - KVP_FRAME_HDR >= h.body_len))
                abort();
            break;
        }
        if (rc < 0) {
            if (rc != KVP_EPROTOCOL && rc != KVP_EINVALID_VERSION && rc != KVP_ETOO_LARGE)
                abort();
            break;
        }
        size_t flen = KVP_FRAME_HDR + (size_t)h.body_len;
        if (rc != 1 || body != in + KVP_FRAME_HDR || flen > left || h.body_len > MAX_FRAME)
            abort();
        uint8_t raw[KVP_FRAME_HDR];
        kvp_frame_hdr_encode(raw, &h);
        if (memcmp(raw, in, KVP_FRAME_HDR) != 0)
            abort();
        kvp_frame_hdr h2;
        const uint8_t *b2;
        if (kvp_frame_next(in, flen - 1, MAX_FRAME, &h2, &b2) != 0)
            abort();
        decode_body(&h, body);
        off += flen;
    }
    return 0;
}
