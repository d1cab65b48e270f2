/*
 * fuzz_meta.c -- the connector step-metadata decoder (connector/meta.h)
 * against arbitrary bytes.
 *
 * Invariants checked:
 *  - the decoder answers only 0, KVP_EPROTOCOL, KVP_EINVALID_VERSION or
 *    KVP_ENOMEM (bounded arena), and never reads past the input;
 *  - on success the encoding is canonical: re-encoding the decoded step
 *    gives back exactly the input, and decoding that again gives an equal
 *    step (field by field).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "connector/meta.h"

#define ARENA_CAP (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_arena a1, a2;
    kvp_arena_init(&a1, ARENA_CAP);
    kvp_arena_init(&a2, ARENA_CAP);
    kvp_meta_step m1, m2;
    int rc = kvp_meta_decode(data, size, &a1, &m1);
    if (rc != 0 && rc != KVP_EPROTOCOL && rc != KVP_EINVALID_VERSION && rc != KVP_ENOMEM)
        abort();
    if (rc == 0) {
        kvp_buf b;
        kvp_buf_init(&b, size + 1);
        if (kvp_meta_encode(&b, &m1) != 0 || b.len != size ||
            (size && memcmp(b.data, data, size) != 0))
            abort();
        if (kvp_meta_decode(b.data, b.len, &a2, &m2) != 0 || !kvp_meta_step_equal(&m1, &m2))
            abort();
        kvp_buf_free(&b);
    }
    kvp_arena_free(&a1);
    kvp_arena_free(&a2);
    return 0;
}
