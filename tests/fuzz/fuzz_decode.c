/*
 * fuzz_decode.c -- every body decoder against arbitrary bytes.
 *
 * Input: byte 0 selects the decoder (byte0 % PC__COUNT) and, with its high
 * part, tight or default limits; the rest is the body. Invariants checked:
 *  - a decoder answers only 0, KVP_EPROTOCOL or KVP_ENOMEM (bounded arena);
 *  - on success the encoding is canonical: re-encoding the decoded message
 *    gives back exactly the body, and decoding that again gives an equal
 *    message (field by field).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto_samples.h"

#define ARENA_CAP (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size - 1 > UINT32_MAX)
        return 0;
    int kind = data[0] % PC__COUNT;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    if (data[0] / PC__COUNT & 1)
        l = (kvp_proto_limits){.max_key = 16, .max_str = 8, .max_batch = 4};
    const uint8_t *body = data + 1;
    uint32_t len = (uint32_t)(size - 1);

    kvp_arena a1, a2;
    kvp_arena_init(&a1, ARENA_CAP);
    kvp_arena_init(&a2, ARENA_CAP);
    pc_msg m1, m2;
    int rc = pc_codecs[kind].dec(body, len, &l, &a1, &m1);
    if (rc != 0 && rc != KVP_EPROTOCOL && rc != KVP_ENOMEM)
        abort();
    if (rc == 0) {
        kvp_buf b;
        kvp_buf_init(&b, (size_t)len + 1);
        pc_codecs[kind].enc(&b, &m1);
        if (b.err || b.len != len || (len && memcmp(b.data, body, len) != 0))
            abort();
        if (pc_codecs[kind].dec(b.data, (uint32_t)b.len, &l, &a2, &m2) != 0 ||
            !pc_equal(kind, &m1, &m2))
            abort();
        kvp_buf_free(&b);
    }
    kvp_arena_free(&a1);
    kvp_arena_free(&a2);
    return 0;
}
