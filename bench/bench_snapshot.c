/*
 * bench_snapshot.c -- what one loop turn of a follower's snapshot costs at
 * N objects (master/master.h kvp_master_snap_*), against the whole
 * snapshot built in one call as before. Standalone (not part of `make
 * bench`); after `make build/libkvpool.a`:
 *   cc -std=gnu11 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_snapshot.c build/libkvpool.a \
 *      -ljansson -lxxhash -luring -lmicrohttpd -lzmq -lmsgpackc -lpthread -lm \
 *      -o build/bench_snapshot
 *   build/bench_snapshot 1000000 20     # objects, key bytes
 * The master core is driven in-process (a cluster's master with a node
 * token, one segment, N published objects); a follower's REPL_FOLLOW
 * carries the first budget, then kvp_master_push_snaps runs once per
 * "turn" with the follower's window always open. Printed: the whole
 * snapshot's time and size, the steps, the longest and mean step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/config.h"
#include "common/log.h"
#include "kvpool.h"
#include "master/master.h"

#define MiB (1024ull * 1024)
#define TOKEN "node-secret-0123456789"

static kvp_master *m;
static kvp_arena arena;
static kvp_buf out, body;
static uint64_t req_id;

static double ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* body as a request of op on s; the answer's status. */
static int32_t call(kvp_msess *s, uint16_t op)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, op, ++req_id, (uint32_t)body.len, 0};
    kvp_buf_reset(&out);
    kvp_arena_reset(&arena);
    if (kvp_master_handle(m, s, &h, body.data, &arena, &out, 1000000) != 0) {
        fprintf(stderr, "bench_snapshot: op %u failed\n", op);
        exit(1);
    }
    kvp_buf_reset(&body);
    kvp_frame_hdr rh;
    const uint8_t *b;
    return out.len && kvp_frame_next(out.data, out.len, 1u << 30, &rh, &b) == 1 ? rh.status : 0;
}

static void hello(kvp_msess *s, uint64_t id)
{
    memset(s, 0, sizeof *s);
    kvp_master_sess_open(m, s);
    kvp_msg_hello h = {KVP_PROTO_VERSION, id, {NULL, 0}, {(const uint8_t *)"b", 1},
                       {(const uint8_t *)TOKEN, sizeof TOKEN - 1}, {NULL, 0}, {NULL, 0}};
    kvp_enc_hello(&body, &h);
    if (call(s, KVP_OP_HELLO) != 0)
        exit(1);
}

/* Puts n objects with keys of klen bytes (at least the counter's). */
static void load(kvp_msess *s, long n, int klen)
{
    enum { B = 256 };
    static kvp_bytes keys[B];
    static uint64_t sizes[B], cs[B];
    size_t stride = (size_t)klen + 32;
    char *store = malloc(B * stride);
    for (long i = 0; i < n; i += B) {
        int k = (int)(n - i < B ? n - i : B);
        for (int j = 0; j < k; j++) {
            char *p = store + (size_t)j * stride;
            int l = snprintf(p, stride, "key-%09ld-", i + j);
            if (klen > l)
                memset(p + l, 'k', (size_t)(klen - l));
            keys[j] = (kvp_bytes){(const uint8_t *)p, (uint32_t)(klen > l ? klen : l)};
            sizes[j] = 4096;
            cs[j] = (uint64_t)(i + j + 1);
        }
        kvp_msg_put_start ps = {{NULL, 0}, 1, 0, 0, {NULL, 0}, (uint32_t)k, keys, sizes, NULL};
        kvp_enc_put_start(&body, &ps);
        if (call(s, KVP_OP_PUT_START) != 0)
            exit(1);
        kvp_msg_put_end pe = {{NULL, 0}, (uint32_t)k, keys, cs};
        kvp_enc_put_end(&body, &pe);
        call(s, KVP_OP_PUT_END);
    }
    free(store);
}

static kvp_buf *window(kvp_msess *s, void *ctx)
{
    (void)s;
    kvp_buf *b = ctx;
    kvp_buf_reset(b); /* the socket drained it */
    return b;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int klen = argc > 2 ? atoi(argv[2]) : 20;
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    kvp_log_set_level(KVP_LOG_ERROR);
    cfg.log_level = KVP_LOG_ERROR;
    snprintf(cfg.etcd, sizeof cfg.etcd, "http://127.0.0.1:1"); /* never dialed by the core */
    snprintf(cfg.node_token, sizeof cfg.node_token, "%s", TOKEN);
    cfg.max_master_memory = 64ull << 30;
    kvp_arena_init(&arena, 256 * MiB);
    kvp_buf_init(&out, 1024 * MiB);
    kvp_buf_init(&body, 256 * MiB);
    if (kvp_master_create(&cfg, 1000000, &m) != 0)
        return 1;
    kvp_msess node, fol;
    hello(&node, 7);
    static const char name[] = "127.0.0.1:7000";
    kvp_endpoint ep = {{(const uint8_t *)"tcp", 3}, {(const uint8_t *)name, sizeof name - 1}};
    kvp_seg_desc d = {77, {(const uint8_t *)name, sizeof name - 1}, (uint64_t)n * 8192, 1, &ep,
                      0, 1, 0};
    kvp_msg_mount mm = {1, &d};
    kvp_enc_mount(&body, &mm);
    call(&node, KVP_OP_MOUNT_SEGMENT);
    load(&node, n, klen);

    kvp_buf whole;
    kvp_buf_init(&whole, (size_t)64 << 30);
    double t0 = ms();
    uint64_t objs = kvp_master_snapshot(m, &whole);
    printf("%ld objects, %d-byte keys\nwhole snapshot in one call: %llu objects, %.1f MiB, "
           "%.1f ms\n",
           n, klen, (unsigned long long)objs, (double)whole.len / MiB, ms() - t0);
    kvp_buf_free(&whole);

    hello(&fol, 8);
    t0 = ms();
    if (call(&fol, KVP_OP_REPL_FOLLOW) != 0)
        return 1;
    double first = ms() - t0, longest = first, sum = first;
    long steps = 1;
    kvp_buf w;
    kvp_buf_init(&w, 1024 * MiB);
    size_t most = out.len;
    for (int more = 1; more;) {
        t0 = ms();
        more = kvp_master_push_snaps(m, window, &w);
        double dt = ms() - t0;
        if (!w.len)
            break;
        steps++;
        sum += dt;
        longest = dt > longest ? dt : longest;
        most = w.len > most ? w.len : most;
    }
    printf("over turns: %ld steps, longest %.3f ms (the first, in REPL_FOLLOW: %.3f ms), mean "
           "%.3f ms, largest step %.2f MiB\n",
           steps, longest, first, sum / (double)steps, (double)most / MiB);
    kvp_buf_free(&w);
    kvp_master_sess_close(m, &fol, 1000000);
    kvp_master_sess_close(m, &node, 1000000);
    kvp_master_destroy(m);
    return 0;
}
