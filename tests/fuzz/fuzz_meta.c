/*
 * fuzz_meta.c -- the connector step-metadata decoders (connector/meta.h)
 * against arbitrary bytes.
 *
 * Input: a sequence of messages, each "u16 length (little-endian) | bytes"
 * (a last message shorter than its length takes what is left), all fed in
 * order to the stateless decoder and, through ONE mirror, to the delta
 * decoder (so deltas are applied against what earlier messages built).
 *
 * Invariants checked per message:
 *  - the decoders answer only 0, KVP_EPROTOCOL, KVP_EINVALID_VERSION or
 *    KVP_ENOMEM, and never read past the input;
 *  - stateless success is canonical: re-encoding gives back exactly the
 *    message, and decoding that again gives an equal step;
 *  - a delta decode error leaves the mirror empty;
 *  - a delta success is a well-formed full step: it encodes (statelessly;
 *    unless too large for the bounded buffer) and decodes back equal; a message the stateless decoder accepts (every
 *    base 0, no drops) decodes through the mirror to the same step.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "connector/meta.h"

#define ARENA_CAP (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool rc_ok(int rc)
{
    return rc == 0 || rc == KVP_EPROTOCOL || rc == KVP_EINVALID_VERSION || rc == KVP_ENOMEM;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_meta_mirror *mir = kvp_meta_mirror_new();
    if (!mir)
        return 0;
    kvp_arena a1, a2, a3;
    kvp_arena_init(&a1, ARENA_CAP);
    kvp_arena_init(&a2, ARENA_CAP);
    kvp_arena_init(&a3, ARENA_CAP);
    kvp_buf b;
    kvp_buf_init(&b, 4u << 20);
    size_t off = 0;
    while (off + 2 <= size) {
        size_t n = (size_t)data[off] | (size_t)data[off + 1] << 8;
        off += 2;
        if (n > size - off)
            n = size - off;
        /* a private copy, exactly n bytes long, so ASan sees any over-read */
        uint8_t *msg = malloc(n ? n : 1);
        if (!msg)
            break;
        memcpy(msg, data + off, n);
        off += n;
        kvp_arena_reset(&a1);
        kvp_arena_reset(&a2);
        kvp_arena_reset(&a3);
        kvp_meta_step m1, m2, md;
        int rc = kvp_meta_decode(msg, n, &a1, &m1);
        if (!rc_ok(rc))
            abort();
        if (rc == 0) {
            kvp_buf_reset(&b);
            if (kvp_meta_encode(&b, &m1) != 0 || b.len != n || (n && memcmp(b.data, msg, n)))
                abort();
            if (kvp_meta_decode(b.data, b.len, &a2, &m2) != 0 || !kvp_meta_step_equal(&m1, &m2))
                abort();
        }
        int rd = kvp_meta_decode_delta(mir, msg, n, &a3, &md);
        if (!rc_ok(rd))
            abort();
        if (rd != 0 && kvp_meta_mirror_count(mir) != 0)
            abort();
        if (rd == 0) {
            if (rc == 0 && !kvp_meta_step_equal(&m1, &md))
                abort();
            /* (a request named many times re-encodes its full arrays each
             * time: too large for the buffer / arena is not a finding) */
            kvp_buf_reset(&b);
            kvp_arena_reset(&a2);
            int re = kvp_meta_encode(&b, &md);
            if (re != 0 && re != KVP_ETOO_LARGE)
                abort();
            if (re == 0) {
                int r2 = kvp_meta_decode(b.data, b.len, &a2, &m2);
                if (r2 != 0 && r2 != KVP_ENOMEM)
                    abort();
                if (r2 == 0 && !kvp_meta_step_equal(&md, &m2))
                    abort();
            }
        } else if (rc == 0 && rd != KVP_ENOMEM) {
            abort(); /* accepted statelessly, refused with a mirror */
        }
        free(msg);
    }
    kvp_buf_free(&b);
    kvp_arena_free(&a1);
    kvp_arena_free(&a2);
    kvp_arena_free(&a3);
    kvp_meta_mirror_free(mir);
    return 0;
}
