/*
 * fuzz_lookup.c -- the lookup channel's server-side parsing
 * (kvp_lookup_frame_next, kvp_lookup_decode) against an arbitrary byte
 * stream, as a peer of the lookup socket could send it.
 *
 * Frames are taken off the front of the input as the server does until one
 * is incomplete or has a bad length; each body goes through the decoder.
 * Invariants checked (abort on violation):
 *  - frame_next answers 1, 0 or KVP_EPROTOCOL only; 1: the body starts right
 *    after the 4-byte length, lies inside the input, its length is in
 *    1..KVP_LOOKUP_MAX_FRAME and is the big-endian prefix; one byte less of
 *    that frame is "need more"; 0: the input really is short of a frame
 *    whose length is valid; KVP_EPROTOCOL: the length is 0 or over the max;
 *  - decode answers 0 or KVP_EPROTOCOL only; a decoded lookup has
 *    8 + nhashes * hash_len == body length, hash_len <= the max, no hashes
 *    when hash_len is 0, apply_eagle 0 or 1, hashes inside the body (every
 *    byte is read, so ASan sees an overrun) and re-encodes, as lookup.h's
 *    wire format says, to exactly the body; a decoded reset is the 1-byte
 *    body 'R'; anything else decoded is an unknown tag;
 *  - a lookup or reset body the decoder refuses is not one of the wire
 *    format (checked by the same re-encoding rule).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "connector/lookup.h"
#include "kvpool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Whether body p[0..n) is a lookup of the wire format (read independently
 * of the decoder). */
static int is_wire_lookup(const uint8_t *p, size_t n)
{
    if (n < 8 || p[0] != 'L')
        return 0;
    size_t hl = (size_t)p[5] << 8 | p[6], hb = n - 8;
    if (hl > KVP_LOOKUP_MAX_HASH_LEN || p[n - 1] > 1)
        return 0;
    return hl == 0 ? hb == 0 : hb % hl == 0;
}

static volatile uint8_t sink;

static void check_body(const uint8_t *p, uint32_t n)
{
    kvp_lookup_req r;
    int rc = kvp_lookup_decode(p, n, &r);
    if (rc != 0 && rc != KVP_EPROTOCOL)
        abort();
    int wire_l = is_wire_lookup(p, n), wire_r = n == 1 && p[0] == 'R';
    int other = p[0] != 'L' && p[0] != 'R';
    if ((rc == 0) != (wire_l || wire_r || other))
        abort();
    if (rc != 0)
        return;
    if (r.tag != p[0])
        abort();
    if (r.tag == 'R' || other)
        return;
    if (r.hash_len > KVP_LOOKUP_MAX_HASH_LEN || r.apply_eagle < 0 || r.apply_eagle > 1)
        abort();
    if (8 + r.nhashes * r.hash_len != n || (r.hash_len == 0 && r.nhashes != 0))
        abort();
    if (r.nhashes ? r.hashes != p + 7 : r.hashes != NULL)
        abort();
    uint8_t x = 0;
    for (size_t i = 0; i < r.nhashes * r.hash_len; i++)
        x ^= r.hashes[i];
    sink = x;
    /* re-encode as the client does: 'L' | u32 | u16 | hashes | u8 */
    uint8_t *e = malloc(n);
    if (!e)
        return;
    e[0] = 'L';
    e[1] = (uint8_t)(r.num_tokens >> 24);
    e[2] = (uint8_t)(r.num_tokens >> 16);
    e[3] = (uint8_t)(r.num_tokens >> 8);
    e[4] = (uint8_t)r.num_tokens;
    e[5] = (uint8_t)(r.hash_len >> 8);
    e[6] = (uint8_t)r.hash_len;
    if (r.nhashes)
        memcpy(e + 7, r.hashes, r.nhashes * r.hash_len);
    e[n - 1] = (uint8_t)r.apply_eagle;
    int same = memcmp(e, p, n) == 0;
    free(e);
    if (!same)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        const uint8_t *in = data + off;
        size_t left = size - off;
        const uint8_t *body = NULL;
        uint32_t blen = 0;
        int rc = kvp_lookup_frame_next(in, left, &body, &blen);
        if (rc == KVP_EPROTOCOL) {
            uint32_t l = be32(in);
            if (left < 4 || (l != 0 && l <= KVP_LOOKUP_MAX_FRAME))
                abort();
            break;
        }
        if (rc == 0) {
            if (left >= 4) {
                uint32_t l = be32(in);
                if (l == 0 || l > KVP_LOOKUP_MAX_FRAME || left - 4 >= l)
                    abort();
            }
            break;
        }
        if (rc != 1 || body != in + 4 || blen == 0 || blen > KVP_LOOKUP_MAX_FRAME ||
            blen != be32(in) || left - 4 < blen)
            abort();
        const uint8_t *b2;
        uint32_t l2;
        if (kvp_lookup_frame_next(in, 4 + (size_t)blen - 1, &b2, &l2) != 0)
            abort();
        check_body(body, blen);
        off += 4 + (size_t)blen;
    }
    return 0;
}
