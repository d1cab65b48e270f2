/*
 * gen_meta_corpus.c -- writes the committed seeds of fuzz_meta: each
 * sample of meta_samples.h as a one-message input, and message sequences
 * of the delta encoding (a full send, deltas appending to it, a request
 * twice in one step, a drop, a resend after the drop). An input is a
 * sequence of "u16 length | message" (see fuzz_meta.c). Not built by the
 * Makefile; regenerate after an encoding change with
 *
 *   cc -std=gnu11 -D_GNU_SOURCE -Iinclude -Isrc -Itests/support \
 *       tests/fuzz/gen_meta_corpus.c src/connector/meta.c src/common/buf.c \
 *       src/common/mem.c -o build/gen_meta_corpus
 *   rm -rf tests/fuzz/corpus/fuzz_meta && build/gen_meta_corpus tests/fuzz/corpus/fuzz_meta
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "meta_samples.h"

static kvp_buf seq;

static void frame(const kvp_buf *m)
{
    if (m->err || m->len > 0xFFFF) {
        fprintf(stderr, "a message does not encode\n");
        exit(1);
    }
    kvp_buf_u16(&seq, (uint16_t)m->len);
    kvp_buf_put(&seq, m->data, m->len);
}

static void emit(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(seq.data, 1, seq.len, f) != seq.len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    kvp_buf_reset(&seq);
}

/* A delta sequence on sample 1's request (2 groups, 8 hashes, 5 tokens). */
static void delta_seq(const char *dir)
{
    kvp_meta_step s;
    ms_sample(1, &s);
    kvp_meta_req r[2];
    r[0] = s.reqs[0];
    uint32_t ids[16];
    for (uint32_t i = 0; i < 16; i++)
        ids[i] = 100 + i;
    kvp_meta_ids g[2] = {{ids, 3, 0}, {ids + 8, 2, 0}};
    r[0].block_ids = g;
    r[0].nhashes = 4;
    r[0].n_token_ids = 3;
    s.reqs = r;
    kvp_buf m;
    kvp_buf_init(&m, 1u << 20);
    /* 1: full send */
    kvp_meta_encode_delta(&m, &s, NULL, NULL, 0);
    frame(&m);
    /* 2: delta: 2 blocks, 2 hashes, 2 tokens appended */
    uint32_t gb[2] = {3, 2};
    kvp_meta_base b[2] = {{gb, 4, 3}, {NULL, 0, 0}};
    g[0].n = 5;
    r[0].nhashes = 6;
    r[0].n_token_ids = 5;
    kvp_buf_reset(&m);
    kvp_meta_encode_delta(&m, &s, b, NULL, 0);
    frame(&m);
    /* 3: the request twice: an append, then a tail meta with nothing new */
    kvp_meta_ids g2[2] = {{ids, 7, 0}, {ids + 8, 2, 0}};
    r[0].block_ids = g2;
    r[0].nhashes = 8;
    r[1] = r[0];
    r[1].kind = KVP_META_TAIL;
    r[1].tails = ms_tails;
    r[1].ntails = 2;
    uint32_t gb2[2] = {5, 2}, gb3[2] = {7, 2};
    kvp_meta_base b2[2] = {{gb2, 6, 5}, {gb3, 8, 5}};
    s.nreqs = 2;
    kvp_buf_reset(&m);
    kvp_meta_encode_delta(&m, &s, b2, NULL, 0);
    frame(&m);
    emit(dir, "delta_appends");
    /* the same first two messages, then a drop, then a full resend */
    s.nreqs = 1;
    r[0] = ms_new_req();
    r[0].block_ids = g;
    g[0].n = 3;
    r[0].nhashes = 4;
    r[0].n_token_ids = 3;
    kvp_buf_reset(&m);
    kvp_meta_encode_delta(&m, &s, NULL, NULL, 0);
    frame(&m);
    kvp_meta_str drop = r[0].req_id;
    kvp_meta_step none = {0};
    kvp_buf_reset(&m);
    kvp_meta_encode_delta(&m, &none, NULL, &drop, 1);
    frame(&m);
    kvp_buf_reset(&m);
    kvp_meta_encode_delta(&m, &s, NULL, NULL, 0);
    frame(&m);
    emit(dir, "delta_drop_resend");
    kvp_buf_free(&m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    static const char *names[MS_COUNT] = {"empty", "new_save", "every_kind", "load_preempted"};
    mkdir(argv[1], 0755);
    kvp_buf_init(&seq, 1u << 20);
    for (int v = 0; v < MS_COUNT; v++) {
        kvp_meta_step s;
        kvp_buf b;
        kvp_buf_init(&b, 1u << 20);
        if (ms_sample(v, &s) || kvp_meta_encode(&b, &s)) {
            fprintf(stderr, "sample %d does not encode\n", v);
            return 1;
        }
        frame(&b);
        emit(argv[1], names[v]);
        kvp_buf_free(&b);
    }
    delta_seq(argv[1]);
    kvp_buf_free(&seq);
    return 0;
}
