/*
 * gen_meta_corpus.c -- writes the committed seeds of fuzz_meta from
 * meta_samples.h (one valid encoding per sample). Not built by the
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

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    static const char *names[MS_COUNT] = {"empty", "new_save", "every_kind", "load_preempted"};
    mkdir(argv[1], 0755);
    for (int v = 0; v < MS_COUNT; v++) {
        kvp_meta_step s;
        kvp_buf b;
        kvp_buf_init(&b, 1u << 20);
        if (ms_sample(v, &s) || kvp_meta_encode(&b, &s)) {
            fprintf(stderr, "sample %d does not encode\n", v);
            return 1;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[v]);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(b.data, 1, b.len, f) != b.len || fclose(f) != 0) {
            perror(path);
            return 1;
        }
        kvp_buf_free(&b);
    }
    return 0;
}
