/*
 * fuzz_segserver.c -- libFuzzer target: the bytes a peer sends on one
 * segment server connection, through the very state machine the workers run
 * (server_internal.h: input from memory, answers to a callback), against a
 * real 1 MiB segment and a descriptor table.
 *
 * Input: a mode byte, then the stream. Mode bit 0: a unix connection
 * (SHM_ATTACH allowed); bit 1: re-sign the stream's SEG_WRITE / SEG_READ
 * descriptors (access and tag), as the fuzzer cannot forge a tag, so that any
 * offset and length reach the accepted paths; bits 2-7: 0 = the stream in
 * one piece, else the seed of the piece sizes (1 .. 4096 bytes), so every
 * partial-read path is taken.
 * Checks: the server's own invariants after every step (a write range or an
 * answer outside the segment, a state's count past its buffer, a wedge:
 * input left, none read, nothing answered, all abort); each answer is a
 * well-formed response whose segment bytes are readable; and afterwards a
 * fresh connection doing HELLO + SEG_READ still gets both answered with
 * status 0. Server and descriptor table are made per input (LeakSan sees
 * anything lost); the segment is made once. KVP_FUZZ_TRACE=1 prints each
 * answer's opcode, status and length (to check what a seed does).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "node/grants.h"
#include "node/segment.h"
#include "node/server.h"
#include "node/server_internal.h"
#include "proto/proto.h"
#include "segserver_frames.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvp_segment *seg;
static int trace;
static kvp_buf ucx_body; /* a UCX_ATTACH answer body, as a node registered with UCX has */

typedef struct seen {
    int n;
    int32_t status[2];
    uint64_t dlen[2];
    volatile uint8_t sink;
} seen;

static void on_answer(void *arg, const uint8_t *head, size_t hlen, const uint8_t *data,
                      uint64_t dlen, int pass_fd)
{
    seen *s = arg;
    kvp_frame_hdr h;
    if (hlen < KVP_FRAME_HDR || kvp_frame_hdr_decode(head, UINT32_MAX, &h) != 0 ||
        !(h.flags & KVP_FLAG_RESPONSE) || h.body_len != hlen - KVP_FRAME_HDR + dlen ||
        (dlen && !data) || (pass_fd >= 0 && pass_fd != kvp_segment_fd(seg)))
        abort();
    uint8_t x = 0;
    for (uint64_t i = 0; i < dlen; i += 512)
        x ^= data[i];
    if (dlen)
        x ^= data[dlen - 1];
    s->sink = x;
    if (trace)
        fprintf(stderr, "answer op %u req %llu status %d, %llu bytes%s\n", h.op,
                (unsigned long long)h.req_id, h.status, (unsigned long long)h.body_len,
                pass_fd >= 0 ? " + fd" : "");
    if (s->n < 2) {
        s->status[s->n] = h.status;
        s->dlen[s->n] = dlen;
    }
    s->n++;
}

/* Walks the frames of p[0, n) by their headers and issues every seg_io's
 * descriptor for its frame's operation, as the master would. */
static void resign(uint8_t *p, size_t n)
{
    size_t at = 0;
    kvp_frame_hdr h;
    while (n - at >= KVP_FRAME_HDR && kvp_frame_hdr_decode(p + at, UINT32_MAX, &h) == 0) {
        uint8_t *b = p + at + KVP_FRAME_HDR;
        if ((h.op == KVP_OP_SEG_WRITE || h.op == KVP_OP_SEG_READ) &&
            h.body_len >= KVP_SEG_IO_SIZE && n - at - KVP_FRAME_HDR >= KVP_SEG_IO_SIZE) {
            kvp_replica r;
            kvp_dec_seg_io(b, KVP_SEG_IO_SIZE, &r);
            r.access = h.op == KVP_OP_SEG_WRITE ? KVP_ACCESS_WRITE : KVP_ACCESS_READ;
            r.tag = kvp_replica_tag(FZ_SECRET, &r);
            kvp_buf out = {b, 0, KVP_SEG_IO_SIZE, KVP_SEG_IO_SIZE, 0};
            kvp_enc_seg_io(&out, &r);
        }
        if (h.body_len > n - at - KVP_FRAME_HDR)
            break;
        at += KVP_FRAME_HDR + h.body_len;
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[256];
    kvp_log_set_level(KVP_LOG_ERROR);
    trace = getenv("KVP_FUZZ_TRACE") != NULL;
    if (kvp_segment_create(FZ_SEG_SIZE, "fuzz", &seg, err, sizeof err) != 0)
        abort();
    kvp_buf_init(&ucx_body, 4096);
    kvp_msg_ucx_attach u = {(uint64_t)(uintptr_t)kvp_segment_base(seg), kvp_segment_size(seg),
                            {(const uint8_t *)"worker address", 14}, {(const uint8_t *)"rkey", 4}};
    kvp_enc_ucx_attach(&ucx_body, &u);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    kvp_grants *g;
    kvp_segserver *s;
    if (kvp_grants_create(kvp_segment_size(seg), FZ_SECRET, &g) != 0)
        abort();
    /* no cluster token: a fixed stream cannot prove one (the proof covers
     * the server's random nonce); the handshake's frames are fuzzed all the
     * same (test_segment_server checks the token itself) */
    kvp_segserver_opts o = {"fuzz", NULL, 1, "", FZ_SEG_ID, g, {0, 0}, ucx_body.data,
                            (uint32_t)ucx_body.len};
    if (kvp_segserver_fuzz_new(seg, &o, &s) != 0)
        abort();
    struct conn *c = kvp_segserver_fuzz_conn(s, data[0] & 1);
    if (!c)
        abort();
    uint32_t rng = data[0] >> 2;
    uint8_t *copy = NULL;
    const uint8_t *p = data + 1;
    size_t left = size - 1;
    if ((data[0] & 2) && left) {
        copy = malloc(left);
        if (!copy)
            abort();
        memcpy(copy, p, left);
        resign(copy, left);
        p = copy;
    }
    seen sn = {0};
    while (left) {
        size_t k = left;
        if (rng) {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            k = 1 + rng % 4096;
            k = k < left ? k : left;
        }
        if (!kvp_segserver_fuzz_feed(s, c, p, k, on_answer, &sn))
            break;
        p += k;
        left -= k;
    }
    kvp_segserver_fuzz_conn_free(s, c);
    free(copy);

    /* not wedged: a fresh connection is served (generation 2^62 - 1, the
     * largest the grants take, passes every floor the input may have
     * raised) */
    uint8_t in[512 + KVP_FRAME_HDR + KVP_SEG_IO_SIZE];
    size_t n = fz_hello(in, 1, FZ_TOKEN);
    n += fz_seg_io(in + n, KVP_OP_SEG_READ, 2, 4096, 8192, (1ull << 62) - 1, 0);
    c = kvp_segserver_fuzz_conn(s, 0);
    if (!c)
        abort();
    seen ok = {0};
    if (!kvp_segserver_fuzz_feed(s, c, in, n, on_answer, &ok) || ok.n != 2 || ok.status[0] != 0 ||
        ok.status[1] != 0 || ok.dlen[1] != 8192)
        abort();
    kvp_segserver_fuzz_conn_free(s, c);
    kvp_segserver_stop(s);
    kvp_grants_destroy(g);
    return 0;
}
