/*
 * gen_lookup_corpus.c -- writes the committed seeds of fuzz_lookup: byte
 * streams as a peer of the lookup socket sends them (lookup.h's wire
 * format). Not built by the Makefile; regenerate after a format change with
 *
 *   cc -std=gnu11 tests/fuzz/gen_lookup_corpus.c -o build/gen_lookup_corpus
 *   rm -rf tests/fuzz/corpus/fuzz_lookup && build/gen_lookup_corpus tests/fuzz/corpus/fuzz_lookup
 *
 * lookup-*: one lookup frame (no hashes; 3 x 32 bytes with apply_eagle 1;
 * one hash of the maximum 256 bytes); reset, unknown: one frame each;
 * stream: all of them back to back; partial: a lookup cut mid-hash;
 * bad-*: a zero length, a length over the maximum, a lookup with a hash
 * length that does not divide its bytes, apply_eagle 2, a reset with a
 * payload.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *dir;
static uint8_t stream[8192];
static size_t stream_len;

static void put_file(const char *name, const uint8_t *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static size_t put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return 4;
}

/* One frame "u32 len | body" into out; returns its length. */
static size_t frame(uint8_t *out, const uint8_t *body, size_t n)
{
    put_be32(out, (uint32_t)n);
    memcpy(out + 4, body, n);
    return 4 + n;
}

/* A lookup body: 'L' | u32 num_tokens | u16 hash_len | hashes | u8 eagle. */
static size_t lookup_body(uint8_t *b, uint32_t num_tokens, uint16_t hl, size_t nh, uint8_t eagle)
{
    b[0] = 'L';
    put_be32(b + 1, num_tokens);
    b[5] = (uint8_t)(hl >> 8);
    b[6] = (uint8_t)hl;
    for (size_t i = 0; i < nh * hl; i++)
        b[7 + i] = (uint8_t)(1 + i * 37 % 251);
    b[7 + nh * hl] = eagle;
    return 8 + nh * hl;
}

/* Writes one seed and, if `in_stream`, appends it to the stream seed. */
static void seed(const char *name, const uint8_t *body, size_t n, int in_stream)
{
    uint8_t f[4096];
    size_t fl = frame(f, body, n);
    put_file(name, f, fl);
    if (in_stream) {
        memcpy(stream + stream_len, f, fl);
        stream_len += fl;
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    mkdir(dir, 0755);
    uint8_t b[2048];
    seed("lookup-nohash", b, lookup_body(b, 64, 0, 0, 0), 1);
    seed("lookup-3x32", b, lookup_body(b, 128, 32, 3, 1), 1);
    seed("lookup-1x256", b, lookup_body(b, 4096, 256, 1, 0), 1);
    seed("reset", (const uint8_t *)"R", 1, 1);
    seed("unknown", (const uint8_t *)"Z\1\2", 3, 1);
    put_file("stream", stream, stream_len);
    uint8_t f[4096];
    size_t fl = frame(f, b, lookup_body(b, 128, 32, 3, 1));
    put_file("partial", f, fl / 2);
    uint8_t zero[4] = {0, 0, 0, 0}, huge[4] = {0x01, 0x00, 0x00, 0x01};
    put_file("bad-zero-length", zero, 4);
    put_file("bad-huge-length", huge, 4);
    size_t n = lookup_body(b, 48, 3, 1, 1);
    b[n - 1] = 0x11; /* a 4th hash byte for hash_len 3, then apply_eagle */
    b[n] = 1;
    seed("bad-hash-len", b, n + 1, 0);
    n = lookup_body(b, 48, 2, 2, 2);
    seed("bad-eagle", b, n, 0);
    seed("bad-reset", (const uint8_t *)"RR", 2, 0);
    return 0;
}
