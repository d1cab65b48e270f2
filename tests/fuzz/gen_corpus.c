/*
 * gen_corpus.c -- writes the committed seed corpus from proto_samples.h.
 * Not built by the Makefile; regenerate after a protocol change with
 *
 *   cc -std=gnu11 -Iinclude -Isrc -Itests/support tests/fuzz/gen_corpus.c \
 *       src/common/buf.c src/common/mem.c src/proto/proto.c -lxxhash -o build/gen_corpus
 *   rm -rf tests/fuzz/corpus/fuzz_decode tests/fuzz/corpus/fuzz_frame
 *   build/gen_corpus tests/fuzz/corpus
 *
 * fuzz_decode/NAME-V: the selector byte then sample V of message NAME.
 * fuzz_frame/OP-req, OP-resp: one frame per opcode and direction carrying
 * sample 1; error-resp: a response with a status and an error text;
 * stream: every request and response frame back to back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "proto_samples.h"

static void put_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[1536];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* Appends one frame of `op` carrying sample 1 of `kind` (or no body). */
static void frame(kvp_buf *b, int op, uint8_t flags, int kind)
{
    size_t o = kvp_frame_begin(b, (uint16_t)op, flags, (uint64_t)op * 2 + (flags & 1), 0);
    pc_msg m;
    if (kind != PC_NONE && pc_sample(kind, 1, &m) == 0)
        pc_codecs[kind].enc(b, &m);
    kvp_frame_end(b, o);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    char dec[1024], frm[1024], name[256];
    snprintf(dec, sizeof dec, "%s/fuzz_decode", argv[1]);
    snprintf(frm, sizeof frm, "%s/fuzz_frame", argv[1]);
    mkdir(argv[1], 0755);
    mkdir(dec, 0755);
    mkdir(frm, 0755);
    for (int k = 0; k < PC__COUNT; k++) {
        for (int v = 0; v < 3; v++) {
            pc_msg m;
            if (pc_sample(k, v, &m))
                continue;
            kvp_buf b;
            kvp_buf_init(&b, 1u << 20);
            kvp_buf_u8(&b, (uint8_t)k);
            pc_codecs[k].enc(&b, &m);
            snprintf(name, sizeof name, "%s-%d", pc_codecs[k].name, v);
            put_file(dec, name, b.data, b.len);
            kvp_buf_free(&b);
        }
    }
    kvp_buf all;
    kvp_buf_init(&all, 1u << 20);
    for (int op = 1; op < KVP_OP__MAX; op++) {
        for (int resp = 0; resp < 2; resp++) {
            kvp_buf b;
            kvp_buf_init(&b, 1u << 20);
            uint8_t flags = resp ? KVP_FLAG_RESPONSE : op == KVP_OP_RELEASE ? KVP_FLAG_ONEWAY : 0;
            int kind = resp ? pc_op_kinds[op].resp : pc_op_kinds[op].req;
            frame(&b, op, flags, kind);
            frame(&all, op, flags, kind);
            snprintf(name, sizeof name, "%s-%s", kvp_op_name((uint16_t)op), resp ? "resp" : "req");
            put_file(frm, name, b.data, b.len);
            kvp_buf_free(&b);
        }
    }
    put_file(frm, "stream", all.data, all.len);
    kvp_buf_reset(&all);
    size_t o = kvp_frame_begin(&all, KVP_OP_GET, KVP_FLAG_RESPONSE, 9, KVP_ENO_HELLO);
    kvp_buf_put(&all, "HELLO required", 14);
    kvp_frame_end(&all, o);
    put_file(frm, "error-resp", all.data, all.len);
    kvp_buf_free(&all);
    return 0;
}
