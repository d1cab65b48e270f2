/*
 * gen_disk_corpus.c -- seeds for fuzz_disk: a real page written by the
 * disk tier (three records and a tombstone), its index file, and one
 * record header, each prefixed with fuzz_disk's mode byte.
 *   cc -std=gnu11 -D_GNU_SOURCE -Iinclude -Isrc tests/fuzz/gen_disk_corpus.c src/node/disk.c \
 *      src/common/{mem,log,assert}.c -lxxhash -luring -lpthread -o build/gen_disk_corpus
 *   build/gen_disk_corpus tests/fuzz/corpus/fuzz_disk
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvpool.h"
#include "node/disk.h"

static size_t slurp(const char *path, uint8_t **out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n);
    size_t r = fread(*out, 1, (size_t)n, f);
    fclose(f);
    return r;
}

static void seed(const char *dir, const char *name, int mode, const uint8_t *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fputc(mode, f);
    fwrite(p, 1, n, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    mkdir(argv[1], 0755);
    char tmp[] = "/tmp/kvp-gen-disk-XXXXXX";
    if (!mkdtemp(tmp))
        return 1;
    kvp_disk_opts o = {.dir = tmp, .capacity = 4u << 20, .page_size = 1u << 20,
                       .staging_budget = 4u << 20, .direct = -1, .io = KVP_DISK_IO_PWRITE};
    kvp_disk *d;
    char err[256];
    if (kvp_disk_open(&o, &d, err, sizeof err))
        return 1;
    uint8_t v[5000];
    for (size_t i = 0; i < sizeof v; i++)
        v[i] = (uint8_t)(i * 7);
    const char *keys[] = {"a", "key-two", "k3"};
    for (int i = 0; i < 3; i++) {
        struct iovec iv = {v, 100u + 2000u * (unsigned)i};
        kvp_disk_write(d, (const uint8_t *)"default", 7, (const uint8_t *)keys[i],
                       (uint32_t)strlen(keys[i]), 0, &iv, 1, iv.iov_len, NULL);
    }
    kvp_disk_flush(d);
    kvp_disk_remove(d, (const uint8_t *)"default", 7, (const uint8_t *)"a", 1);
    kvp_disk_close(d);
    char path[512];
    uint8_t *p = NULL;
    snprintf(path, sizeof path, "%s/kvpool-page-0000000000000000.log", tmp);
    size_t n = slurp(path, &p);
    if (n < 8192)
        return 1;
    size_t used = 4096 + 32768; /* the records and the tombstone (5 blocks) and some zeros */
    seed(argv[1], "page", 1, p + 4096, used - 4096 < n - 4096 ? used - 4096 : n - 4096);
    seed(argv[1], "header", 0, p + 4096, 4096);
    unlink(path);
    free(p);
    snprintf(path, sizeof path, "%s/kvpool-page-0000000000000000.idx", tmp);
    n = slurp(path, &p);
    if (n > 32)
        seed(argv[1], "index", 2, p + 16, n - 16 - 8); /* count + entries */
    unlink(path);
    free(p);
    rmdir(tmp);
    return 0;
}
