/*
 * gen_segserver_corpus.c -- writes the committed seeds of fuzz_segserver:
 * a mode byte (see fuzz_segserver.c) then what a client sends: AUTH_CHALLENGE, HELLO, valid
 * and refused SEG_WRITE / SEG_READ (descriptors from segserver_frames.h,
 * expiring in 2^60 ms), SHM_ATTACH over unix and tcp, UCX_ATTACH, a pipeline longer than
 * the answer ring, broken streams, and descriptors left for the target to
 * re-sign (mode bit 1) at the segment's end. Not built by the Makefile;
 * regenerate after a protocol change with
 *
 *   cc -std=gnu11 -D_GNU_SOURCE -Iinclude -Isrc -Itests/support \
 *       tests/fuzz/gen_segserver_corpus.c src/proto/proto.c src/common/buf.c \
 *       src/common/mem.c -lxxhash -o build/gen_segserver_corpus
 *   rm -rf tests/fuzz/corpus/fuzz_segserver &&
 *       build/gen_segserver_corpus tests/fuzz/corpus/fuzz_segserver
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "segserver_frames.h"

static uint8_t buf[1 << 16];
static size_t len;
static const char *dir;

static void start(uint8_t mode)
{
    buf[0] = mode;
    len = 1;
}

static void put(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void hello(void) { len += fz_hello(buf + len, 1, FZ_TOKEN); }

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    mkdir(dir, 0755);

    start(0);
    hello();
    put("hello");

    for (int chunked = 0; chunked < 2; chunked++) {
        start(chunked ? 0x54 : 0);
        hello();
        len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 2, 0, 4096, 1, 0xab);
        len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 3, 8192, 12288, 1, 0xcd);
        len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 4, 0, 4096, 1, 0);
        len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 5, 8192, 12288, 1, 0);
        put(chunked ? "write-read-chunked" : "write-read");
    }

    start(1);
    hello();
    len += fz_attach(buf + len, 2, FZ_SEG_ID);
    len += fz_attach(buf + len, 3, FZ_SEG_ID + 1);
    put("unix-attach");

    start(0);
    hello();
    len += fz_attach(buf + len, 2, FZ_SEG_ID);
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 3, 0, 4096, 1, 0);
    put("tcp-attach");

    /* UCX_ATTACH: the node's answer body; another segment's id refused */
    start(0);
    hello();
    len += fz_attach_op(buf + len, KVP_OP_UCX_ATTACH, 2, FZ_SEG_ID);
    len += fz_attach_op(buf + len, KVP_OP_UCX_ATTACH, 3, FZ_SEG_ID + 1);
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 4, 0, 4096, 1, 0);
    put("tcp-ucx-attach");

    /* a forged tag: the body is skipped, the next frame served */
    start(0);
    hello();
    size_t at = len;
    len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 2, 4096, 4096, 1, 0x11);
    buf[at + KVP_FRAME_HDR + KVP_SEG_IO_SIZE - 1] ^= 1;
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 3, 4096, 4096, 1, 0);
    put("forged-write");

    /* a newer allocation's write, then a stale one over the same pages */
    start(0);
    hello();
    len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 2, 16384, 8192, 5, 0x22);
    len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 3, 16384, 4096, 3, 0x33);
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 4, 16384, 8192, 5, 0);
    put("stale-write");

    /* body_len != 56 + length: answered, then closed */
    start(0);
    hello();
    at = len;
    len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 2, 0, 4096, 1, 0x44);
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, KVP_OP_SEG_WRITE, 2, KVP_SEG_IO_SIZE + 4000, 0};
    kvp_frame_hdr_encode(buf + at, &h);
    put("undelimited-write");

    /* more answers than the ring holds */
    start(0);
    hello();
    for (int i = 0; i < 80; i++)
        len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 10 + (uint64_t)i, 4096 * (uint64_t)(i % 16),
                         4096, 1, 0);
    put("pipeline");

    start(0);
    hello();
    len += fz_hdr(buf + len, 999, 2, 10);
    memset(buf + len, 0x55, 10);
    len += 10;
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 3, 0, 4096, 1, 0);
    put("unknown-op");

    start(0);
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 1, 0, 4096, 1, 0);
    put("no-hello");

    start(0);
    len += fz_hello(buf + len, 1, "nope");
    put("wrong-token");

    start(0);
    len += fz_challenge(buf + len, 1);
    len += fz_challenge(buf + len, 2); /* a second one: refused, closed */
    put("challenge-twice");

    start(0);
    len += fz_challenge(buf + len, 1);
    hello();
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 3, 0, 4096, 1, 0);
    put("challenge-hello");

    start(0xfc);
    uint32_t x = 2463534242u;
    for (int i = 0; i < 300; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[len++] = (uint8_t)x;
    }
    put("garbage");

    /* re-signed by the target (mode bit 1): the descriptors' tags are zero;
     * one write ends at the segment's last byte, one would reach past it */
    start(2);
    hello();
    at = len;
    len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 2, FZ_SEG_SIZE - 4096, 4096, 1, 0x66);
    memset(buf + at + KVP_FRAME_HDR + KVP_SEG_IO_SIZE - 8, 0, 8);
    at = len;
    len += fz_seg_io(buf + len, KVP_OP_SEG_WRITE, 3, FZ_SEG_SIZE - 4096, 8192, 1, 0x77);
    memset(buf + at + KVP_FRAME_HDR + KVP_SEG_IO_SIZE - 8, 0, 8);
    len += fz_seg_io(buf + len, KVP_OP_SEG_READ, 4, FZ_SEG_SIZE - 4096, 4096, 1, 0);
    put("resigned-edge");
    return 0;
}
