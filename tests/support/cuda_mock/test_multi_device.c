/*
 * test_multi_device.c -- the CUDA backend with two devices in one process,
 * on the stand-in driver only (tests/cuda_mock.sh runs it with
 * KVP_CUDA_MOCK_DEVICES=2 in each copy mode; test_gpu has device 0 alone).
 *
 * Each device's memory is classified as that device's, copied to and from
 * page-locked memory on a stream of that device (current on the thread),
 * and stored and loaded through a client over shm and tcp; the copy mode
 * the process started with must survive it (a copy refused on device 1
 * would lower it for good).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gpu.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define MiB (1024u * 1024u)
#define NP 64
#define PIECE (16u * 1024u + 5u) /* odd: neither tiles nor pieces aligned */

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31u + seed * 7u + (i >> 9));
}

static int up(void)
{
    void *probe = kvp_gpu_dev_alloc(1, 4096);
    if (!probe)
        return -1;
    kvp_gpu_dev_free(probe);
    return 0;
}

#define NEED_TWO()                                                                             \
    do {                                                                                       \
        if (up() != 0) {                                                                       \
            static char why_[400];                                                             \
            snprintf(why_, sizeof why_, "no device 1: %s", kvp_gpu_status());                  \
            SKIP(why_);                                                                        \
        }                                                                                      \
    } while (0)

TEST(streams_and_copies_per_device)
{
    NEED_TWO();
    char mode[16];
    snprintf(mode, sizeof mode, "%s", kvp_gpu_copy_mode());
    kvp_gpu_dev *devs[2] = {NULL, NULL};
    for (int ord = 0; ord < 2; ord++) {
        size_t n = NP * (PIECE + 3);
        uint8_t *d = kvp_gpu_dev_alloc(ord, n), *h = kvp_gpu_host_alloc(n), *w = malloc(n);
        CHECK(d && h && w);
        CHECK_EQ(kvp_gpu_classify(d + 1, n - 1, &devs[ord]), 1);
        CHECK(devs[ord] && (ord == 0 || devs[1] != devs[0]));
        fill(w, n, (unsigned)ord);
        CHECK_EQ(kvp_gpu_memcpy(d, w, n), 0);
        kvp_gpu_stream *s = kvp_gpu_stream_get(devs[ord]);
        CHECK(s);
        CHECK_EQ(kvp_gpu_stream_bind(s), 0);
        kvp_gpu_piece p[NP];
        for (int i = 0; i < NP; i++) /* device -> page-locked host, shuffled */
            p[i] = (kvp_gpu_piece){h + (size_t)i * PIECE, d + (size_t)((i * 7) % NP) * (PIECE + 3),
                                   PIECE};
        memset(h, 0, n);
        CHECK_EQ(kvp_gpu_copy(s, KVP_GPU_D2H, p, NP), 0);
        uint64_t t = kvp_gpu_mark(s);
        CHECK(t);
        CHECK_EQ(kvp_gpu_wait(s, t, 0), 0);
        for (int i = 0; i < NP; i++)
            CHECK(memcmp(h + (size_t)i * PIECE, w + (size_t)((i * 7) % NP) * (PIECE + 3), PIECE) ==
                  0);
        for (int i = 0; i < NP; i++) /* and back, elsewhere */
            p[i] = (kvp_gpu_piece){d + (size_t)i * (PIECE + 3), h + (size_t)i * PIECE, PIECE};
        CHECK_EQ(kvp_gpu_copy(s, KVP_GPU_H2D, p, NP), 0);
        CHECK((t = kvp_gpu_mark(s)) != 0);
        CHECK_EQ(kvp_gpu_wait(s, t, 0), 0);
        kvp_gpu_stream_put(s);
        uint8_t *back = malloc(n);
        CHECK(back);
        CHECK_EQ(kvp_gpu_memcpy(back, d, n), 0);
        for (int i = 0; i < NP; i++)
            CHECK(memcmp(back + (size_t)i * (PIECE + 3), h + (size_t)i * PIECE, PIECE) == 0);
        free(back);
        free(w);
        kvp_gpu_host_free(h);
        kvp_gpu_dev_free(d);
        CHECK(strcmp(kvp_gpu_copy_mode(), mode) == 0); /* not lowered by device 1 */
    }
}

static void round_trip(int tcp)
{
    tp_master m;
    tp_store st;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    const char *const seg[] = {"--segment-size", "64MiB", NULL};
    CHECK_EQ(tp_store_start(&st, m.addr, seg), 0);
    char cfg[256], err[256];
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", m.addr);
    if (tcp)
        setenv("KVPOOL_FORCE_TCP", "1", 1);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(cfg, &c, err, sizeof err), 0);
    unsetenv("KVPOOL_FORCE_TCP");
    char mode[16];
    snprintf(mode, sizeof mode, "%s", kvp_gpu_copy_mode());
    size_t n = NP * (PIECE + 3);
    uint8_t *d[2], *w = malloc(n), *got = malloc(n);
    CHECK(w && got);
    for (int ord = 0; ord < 2; ord++) {
        CHECK((d[ord] = kvp_gpu_dev_alloc(ord, 2 * n)) != NULL);
        CHECK_EQ(kvp_client_register_buffer(c, d[ord], 2 * n), 0);
    }
    for (int ord = 1; ord >= 0; ord--) { /* device 1 first: it must not need device 0 */
        fill(w, n, 10u + (unsigned)ord);
        CHECK_EQ(kvp_gpu_memcpy(d[ord], w, n), 0);
        kvp_iov pv[NP], gv[NP];
        for (int i = 0; i < NP; i++) {
            pv[i] = (kvp_iov){d[ord] + (size_t)i * (PIECE + 3), PIECE};
            gv[i] = (kvp_iov){d[ord] + n + (size_t)(NP - 1 - i) * (PIECE + 3), PIECE};
        }
        char key[32];
        snprintf(key, sizeof key, "dev%d-%d", ord, tcp);
        const char *keys[1] = {key};
        const kvp_iov *pp[1] = {pv}, *gp[1] = {gv};
        size_t np[1] = {NP};
        int64_t res[1];
        CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, keys, pp, np, 1, res), 0);
        CHECK_EQ(res[0], (int64_t)NP * PIECE);
        CHECK_EQ(kvp_client_batch_get_into_multi_buffers(c, keys, gp, np, 1, res), 0);
        CHECK_EQ(res[0], (int64_t)NP * PIECE);
        for (int i = 0; i < NP; i++) {
            CHECK_EQ(kvp_gpu_memcpy(got, gv[i].base, PIECE), 0);
            CHECK(memcmp(got, w + (size_t)i * (PIECE + 3), PIECE) == 0);
        }
    }
    CHECK(strcmp(kvp_gpu_copy_mode(), mode) == 0);
    kvp_client_close(c);
    tp_store_kill(&st);
    tp_master_kill(&m);
    for (int ord = 0; ord < 2; ord++)
        kvp_gpu_dev_free(d[ord]);
    free(w);
    free(got);
}

TEST(client_round_trips_per_device_shm)
{
    NEED_TWO();
    round_trip(0);
}

TEST(client_round_trips_per_device_tcp)
{
    NEED_TWO();
    round_trip(1);
}
