/*
 * bench.c -- `kvpool bench master`: the master's throughput, latency
 * and memory, against a real master process on loopback. `kvpool bench
 * store` (the data plane) lives in bench_store.c, `kvpool bench
 * connector` (the connector's CPU overhead) in bench_connector.c, `kvpool
 * bench sim` (the simulator against the raw store) in bench_sim.c, `kvpool
 * bench gpu` (device memory to the pool and back) in bench_gpu.c, `kvpool
 * bench disk` (the SSD tier's store) in bench_disk.c, `kvpool bench ha` (a
 * cluster of masters: its cost, failovers) in bench_ha.c, `kvpool bench
 * segment` (a fresh serve's ready time, shm attach, prefault) in
 * bench_segment.c. `kvpool bench
 * scrape` (the cost of scraping /metrics) is at the end of this file.
 *
 * It starts `kvpool master` itself (same binary, free port) unless --master
 * is given, mounts a segment large enough for every object (the master never
 * touches segment memory, so the capacity costs nothing), and measures with
 * 100-byte keys:
 *   PUT_START+PUT_END, EXIST, GET+RELEASE, PREFIX: key-ops/s and p50/p99 per
 *   batch, batches of 256 (and 1024 for EXIST) and of 1;
 *   master resident memory per object at --objects and --objects-big;
 *   the segment allocator's usable fraction for vLLM-like value sizes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"
#include "master/segalloc.h"
#include "net/net.h"
#include "net/rpc.h"
#include "proto/proto.h"

#define KEYLEN 100

typedef struct bench {
    kvp_rpc *node, *cl;
    kvp_proto_limits lim;
    kvp_buf body;
    kvp_arena ra;
    char *keybuf;          /* KEYLEN x max batch */
    kvp_bytes *keys;
    uint64_t *u64s;
    double *lat;           /* per-batch latencies, us */
    uint64_t nlat;
    int json;
    FILE *out;             /* table output (stderr with --json) */
    int first_result;
    kvp_blkinfo *blk;      /* puts carry engine blocks (--blocks): 1024 of them */
} bench;

/* Key i's engine block: a hash of i, in chains of 64 (parent = block i-1). */
static void make_blocks(bench *b, uint64_t from, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t k = from + i;
        b->blk[i] = (kvp_blkinfo){(k + 1) * 0x9E3779B97F4A7C15ull, k * 0x9E3779B97F4A7C15ull, 16,
                                  1, 0, k % 64 ? KVP_BLK_F_PARENT : 0};
    }
}

static void make_keys(bench *b, uint64_t from, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        char *k = b->keybuf + (size_t)i * KEYLEN;
        int l = snprintf(k, KEYLEN, "kvpool-bench/model@tp0@pcp0@dcp0@pp0@%020llu@",
                         (unsigned long long)(from + i));
        memset(k + l, 'h', (size_t)(KEYLEN - l));
        b->keys[i].p = (const uint8_t *)k;
        b->keys[i].len = KEYLEN;
    }
}

static int rpc(bench *b, kvp_rpc *r, uint16_t op, const uint8_t **resp, uint32_t *len)
{
    int32_t st = 0;
    if (b->body.err)
        return b->body.err;
    int rc = kvp_rpc_call(r, op, b->body.data, b->body.len, &st, resp, len);
    kvp_buf_reset(&b->body);
    kvp_arena_reset(&b->ra);
    return rc ? rc : st;
}

/* The do_* functions use the keys make_keys left in b->keys: generating
 * keys is the engine's business, not part of the measured operation. */
static int do_put(bench *b, uint64_t from, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        b->u64s[i] = 4096;
    if (b->blk)
        make_blocks(b, from, n);
    kvp_msg_put_start ps = {{NULL, 0}, 1, b->blk ? KVP_PUT_F_BLOCKS : 0, 0, {NULL, 0}, n, b->keys,
                            b->u64s, b->blk};
    kvp_enc_put_start(&b->body, &ps);
    const uint8_t *resp;
    uint32_t len;
    int rc = rpc(b, b->cl, KVP_OP_PUT_START, &resp, &len);
    if (rc)
        return rc;
    kvp_msg_put_start_resp r;
    if ((rc = kvp_dec_put_start_resp(resp, len, &b->lim, &b->ra, &r)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        if (r.results[i].status && r.results[i].status != KVP_EOBJECT_ALREADY_EXISTS)
            return r.results[i].status;
        b->u64s[i] = from + i;
    }
    kvp_msg_put_end pe = {{NULL, 0}, n, b->keys, b->u64s};
    kvp_enc_put_end(&b->body, &pe);
    if ((rc = rpc(b, b->cl, KVP_OP_PUT_END, &resp, &len)) != 0)
        return rc;
    kvp_msg_results res;
    if ((rc = kvp_dec_results(resp, len, &b->lim, &b->ra, &res)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if (res.codes[i])
            return res.codes[i];
    return 0;
}

static int do_exist(bench *b, uint64_t from, uint32_t n, int prefix)
{
    (void)from;
    kvp_msg_keys k = {{NULL, 0}, n, b->keys};
    kvp_enc_keys(&b->body, &k);
    const uint8_t *resp;
    uint32_t len;
    int rc = rpc(b, b->cl, prefix ? KVP_OP_PREFIX : KVP_OP_EXIST, &resp, &len);
    if (rc)
        return rc;
    if (prefix) {
        kvp_msg_prefix_resp p;
        if ((rc = kvp_dec_prefix_resp(resp, len, &p)) != 0)
            return rc;
        return p.count == n ? 0 : KVP_EOBJECT_NOT_FOUND;
    }
    kvp_msg_results res;
    if ((rc = kvp_dec_results(resp, len, &b->lim, &b->ra, &res)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if (res.codes[i] != 1)
            return KVP_EOBJECT_NOT_FOUND;
    return 0;
}

static int do_get(bench *b, uint64_t from, uint32_t n)
{
    (void)from;
    kvp_msg_keys k = {{NULL, 0}, n, b->keys};
    kvp_enc_keys(&b->body, &k);
    const uint8_t *resp;
    uint32_t len;
    int rc = rpc(b, b->cl, KVP_OP_GET, &resp, &len);
    if (rc)
        return rc;
    kvp_msg_get_resp g;
    if ((rc = kvp_dec_get_resp(resp, len, &b->lim, &b->ra, &g)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        if (g.results[i].status)
            return g.results[i].status;
        b->u64s[i] = g.results[i].lease_id;
    }
    kvp_msg_put_end rel = {{NULL, 0}, n, b->keys, b->u64s};
    kvp_enc_put_end(&b->body, &rel);
    if ((rc = rpc(b, b->cl, KVP_OP_RELEASE, &resp, &len)) != 0)
        return rc;
    kvp_msg_results res;
    if ((rc = kvp_dec_results(resp, len, &b->lim, &b->ra, &res)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if (res.codes[i])
            return res.codes[i];
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void emit(bench *b, const char *name, uint32_t batch, uint64_t keys, double secs)
{
    qsort(b->lat, b->nlat, sizeof *b->lat, cmp_d);
    double p50 = b->nlat ? b->lat[b->nlat / 2] : 0;
    double p99 = b->nlat ? b->lat[(uint64_t)((double)(b->nlat - 1) * 0.99)] : 0;
    double kops = (double)keys / secs;
    fprintf(b->out, "  %-20s batch %5u  %12.0f keys/s   p50 %8.1f us   p99 %8.1f us\n", name,
            batch, kops, p50, p99);
    if (b->json) {
        printf("%s    {\"op\": \"%s\", \"batch\": %u, \"keys_per_s\": %.0f, \"p50_us\": %.1f, "
               "\"p99_us\": %.1f}",
               b->first_result ? "" : ",\n", name, batch, kops, p50, p99);
        b->first_result = 0;
    }
}

typedef int (*op_fn)(bench *, uint64_t, uint32_t);
static int op_exist(bench *b, uint64_t f, uint32_t n) { return do_exist(b, f, n, 0); }
static int op_prefix(bench *b, uint64_t f, uint32_t n) { return do_exist(b, f, n, 1); }

/* Runs fn over [base, base+total) in batches; records per-batch latency. */
static int run_phase(bench *b, const char *name, op_fn fn, uint64_t base, uint64_t total,
                     uint32_t batch)
{
    b->nlat = 0;
    uint64_t t0 = kvp_now_ns(), last = t0;
    for (uint64_t done = 0; done < total; done += batch) {
        uint32_t n = total - done < batch ? (uint32_t)(total - done) : batch;
        uint64_t k0 = kvp_now_ns();
        make_keys(b, base + done, n);
        uint64_t s = kvp_now_ns();
        t0 += s - k0; /* key generation is not part of the measurement */
        int rc = fn(b, base + done, n);
        uint64_t e = kvp_now_ns();
        if (rc) {
            fprintf(stderr, "kvpool bench: %s failed: %s\n", name, kvp_strerror(rc));
            return rc;
        }
        b->lat[b->nlat++] = (double)(e - s) / 1e3;
        if (e - last > 1000000000ull) { /* the node's connection is idle: heartbeat it */
            const uint8_t *resp;
            uint32_t len;
            if ((rc = rpc(b, b->node, KVP_OP_HEARTBEAT, &resp, &len)) != 0)
                return rc;
            if (isatty(2))
                fprintf(stderr, "\r  %-20s %llu/%llu keys ", name, (unsigned long long)(done + n),
                        (unsigned long long)total);
            last = kvp_now_ns();
            t0 += last - e; /* not part of the measurement */
        }
    }
    if (isatty(2))
        fprintf(stderr, "\r%60s\r", "");
    emit(b, name, batch, total, (double)(kvp_now_ns() - t0) / 1e9);
    return 0;
}

static uint64_t rss_bytes(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu kB", (unsigned long long *)&kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

/* Usable fraction of a 64 GiB segment filled with `size` values (mix when
 * size == 0: random sizes 512 KiB .. 4 MiB), after 5 churn rounds. */
static double usable_fraction(uint64_t size)
{
    const uint32_t pages = 16u << 20;
    kvp_segalloc *a;
    if (kvp_segalloc_create(pages, &a))
        return 0;
    uint64_t cap = 4096;
    uint32_t *off = kvp_malloc(cap * sizeof *off), *np = kvp_malloc(cap * sizeof *np);
    uint64_t *sz = kvp_malloc(cap * sizeof *sz);
    uint64_t n = 0, stored = 0, rng = 88172645463325252ull;
    double worst = 1.0;
    for (int round = 0; round < 6; round++) {
        int refusals = 0;
        while (refusals < 64) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            uint64_t s = size ? size : (512u << 10) + rng % ((4u << 20) - (512u << 10) + 1);
            uint32_t o, p = (uint32_t)((s + 4095) >> 12);
            if (kvp_segalloc_alloc(a, p, &o) != 0) {
                refusals++;
                if (size)
                    break;
                continue;
            }
            if (n == cap) {
                cap *= 2;
                off = kvp_realloc(off, cap * sizeof *off);
                np = kvp_realloc(np, cap * sizeof *np);
                sz = kvp_realloc(sz, cap * sizeof *sz);
            }
            off[n] = o, np[n] = p, sz[n] = s, n++;
            stored += s;
        }
        double frac = (double)stored / ((double)pages * 4096);
        if (frac < worst)
            worst = frac;
        for (uint64_t i = 0; i < n;) { /* free a random 30 % */
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            if (rng % 10 < 3) {
                kvp_segalloc_free(a, off[i], np[i]);
                stored -= sz[i];
                n--;
                off[i] = off[n], np[i] = np[n], sz[i] = sz[n];
            } else {
                i++;
            }
        }
    }
    kvp_free(off);
    kvp_free(np);
    kvp_free(sz);
    kvp_segalloc_destroy(a);
    return worst;
}

/* The buffers of a run (maxlat latencies); 0 or -1 (out of memory). */
static int bench_init(bench *b, uint64_t maxlat)
{
    kvp_proto_limits_default(&b->lim);
    kvp_buf_init(&b->body, 64u << 20);
    kvp_arena_init(&b->ra, 256u << 20);
    b->keybuf = kvp_malloc((size_t)KEYLEN * 1024);
    b->keys = kvp_malloc(1024 * sizeof *b->keys);
    b->u64s = kvp_malloc(1024 * sizeof *b->u64s);
    b->lat = kvp_malloc(maxlat * sizeof *b->lat);
    return b->keybuf && b->keys && b->u64s && b->lat ? 0 : -1;
}

static void bench_fini(bench *b)
{
    kvp_rpc_close(b->node);
    kvp_rpc_close(b->cl);
    kvp_buf_free(&b->body);
    kvp_arena_free(&b->ra);
    kvp_free(b->keybuf);
    kvp_free(b->keys);
    kvp_free(b->u64s);
    kvp_free(b->lat);
    kvp_free(b->blk);
}

/* The node and client connections to addr, and a segment of seg_bytes
 * mounted by the node (the master never touches segment memory: the
 * capacity costs nothing). 0, or -1 after a message naming `who`. */
static int bench_connect(bench *b, const char *who, const char *addr, const char *token,
                         uint64_t seg_bytes)
{
    char err[256];
    kvp_rpc_opts o = {.name = "bench-node", .timeout_ms = 60000, .token = token};
    if (kvp_rpc_open(addr, &o, &b->node, err, sizeof err)) {
        fprintf(stderr, "kvpool %s: %s\n", who, err);
        return -1;
    }
    o.name = "bench-client";
    if (kvp_rpc_open(addr, &o, &b->cl, err, sizeof err)) {
        fprintf(stderr, "kvpool %s: %s\n", who, err);
        return -1;
    }
    kvp_endpoint ep = {{(const uint8_t *)"tcp", 3}, {(const uint8_t *)"127.0.0.1:1", 11}};
    kvp_seg_desc sd = {0xBE7C4, {(const uint8_t *)"bench-node:1", 12}, seg_bytes, 1, &ep,
                       0x5EC2E7, 1, 0};
    kvp_msg_mount mm = {1, &sd};
    kvp_enc_mount(&b->body, &mm);
    const uint8_t *resp;
    uint32_t len;
    int rc = rpc(b, b->node, KVP_OP_MOUNT_SEGMENT, &resp, &len);
    if (rc != 0) {
        fprintf(stderr, "kvpool %s: mount failed: %s\n", who, kvp_strerror(rc));
        return -1;
    }
    return 0;
}

/* The master it measures; max_master_memory (a flag or the configuration
 * file) goes to it: past it puts are refused, which bounds --objects-big. */
static pid_t spawn_master(const kvp_config *cfg, char *addr, size_t addrlen)
{
    char mem[32];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)cfg->max_master_memory);
    const char *const args[] = {"master", "--log-level", "warn", "--max-master-memory", mem, NULL};
    return kvp_cli_spawn_self(args, 5000, addr, addrlen);
}

static int bench_master(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL},    {"master", KVP_CLI_CONNECT},
                                       {"objects", KVP_CLI_TEXT},  {"objects-big", KVP_CLI_TEXT},
                                       {"ops", KVP_CLI_TEXT},      {"blocks", KVP_CLI_BOOL},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[6] = {NULL};
    int rc = kvp_cli_parse(argc, argv, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool bench master [--json] [--master HOST:PORT] [--objects N]\n"
               "                           [--objects-big N] [--ops N] [--blocks]\n"
               "  --objects N      objects stored for the throughput runs (default 1000000)\n"
               "  --objects-big N  objects for the second memory point (default 10000000; 0 = skip;\n"
               "                   past about 16000000 give --max-master-memory, default 4GiB)\n"
               "  --ops N          key-operations per batch-of-1 run (default 20000)\n"
               "  --blocks         every put names an engine block (as the vLLM connector's do):\n"
               "                   the block index's cost in time and memory\n");
        return 0;
    }
    if (rc < 0)
        return 2;
    bench b = {0};
    b.json = v[0] != NULL;
    b.out = b.json ? stderr : stdout;
    b.first_result = 1;
    uint64_t nobj = 1000000, nbig = 10000000, nops = 20000;
    if ((v[2] && kvp_cli_uint("bench master", "objects", v[2], 1024, 1ull << 32, &nobj) != 0) ||
        (v[3] && kvp_cli_uint("bench master", "objects-big", v[3], 0, 1ull << 32, &nbig) != 0) ||
        (v[4] && kvp_cli_uint("bench master", "ops", v[4], 1, 1ull << 32, &nops) != 0))
        return 2;
    if (nbig && nbig < nobj) {
        fprintf(stderr, "kvpool bench master: --objects-big %llu must be 0 or at least --objects "
                "(%llu)\n", (unsigned long long)nbig, (unsigned long long)nobj);
        return 2;
    }
    char addr[64];
    pid_t pid = 0;
    if (v[1]) {
        snprintf(addr, sizeof addr, "%s", v[1]);
    } else {
        signal(SIGPIPE, SIG_IGN);
        pid = spawn_master(&cfg, addr, sizeof addr);
        if (pid < 0) {
            fprintf(stderr, "kvpool bench master: could not start a master\n");
            return 1;
        }
    }
    int ret = 1;
    const uint8_t *resp;
    uint32_t len;
    /* heartbeats keep the node alive during long phases: it is idle */
    /* twice what is stored: stays below the eviction watermarks */
    uint64_t total = 2 * ((nbig > nobj ? nbig : nobj) + nops + 1024);
    if (v[5] && !(b.blk = kvp_calloc(1024, sizeof *b.blk)))
        goto out;
    if (bench_init(&b, (nbig > nobj ? nbig : nobj) + nops + 16) != 0 ||
        bench_connect(&b, "bench master", addr, cfg.cluster_token[0] ? cfg.cluster_token : NULL,
                      total * 4096) != 0)
        goto out;
    uint64_t rss0 = pid ? rss_bytes(pid) : 0;
    fprintf(b.out, "kvpool bench master: %s, %llu objects, %d-byte keys, 4 KiB values%s\n", addr,
            (unsigned long long)nobj, KEYLEN, b.blk ? ", engine blocks" : "");
    if (b.json)
        printf("{\n  \"bench\": \"master\",\n  \"objects\": %llu,\n  \"key_bytes\": %d,\n"
               "  \"blocks\": %s,\n  \"results\": [\n",
               (unsigned long long)nobj, KEYLEN, b.blk ? "true" : "false");
    if (run_phase(&b, "PUT_START+PUT_END", do_put, 0, nobj, 256) ||
        run_phase(&b, "EXIST", op_exist, 0, nobj, 256) ||
        run_phase(&b, "EXIST", op_exist, 0, nobj, 1024) ||
        run_phase(&b, "GET+RELEASE", do_get, 0, nobj, 256) ||
        run_phase(&b, "PREFIX", op_prefix, 0, nobj, 256) ||
        run_phase(&b, "PUT_START+PUT_END", do_put, nobj, nops, 1) ||
        run_phase(&b, "EXIST", op_exist, 0, nops, 1) ||
        run_phase(&b, "GET+RELEASE", do_get, 0, nops, 1) ||
        run_phase(&b, "PREFIX", op_prefix, 0, nops, 1))
        goto out;
    uint64_t objs = nobj + nops;
    uint64_t rss1 = pid ? rss_bytes(pid) : 0;
    double per1 = objs ? (double)(rss1 - rss0) / (double)objs : 0;
    double per2 = 0;
    uint64_t rss2 = 0;
    if (pid && nbig > objs) {
        b.nlat = 0;
        for (uint64_t done = objs; done < nbig; done += 1024) {
            uint32_t n = nbig - done < 1024 ? (uint32_t)(nbig - done) : 1024;
            make_keys(&b, done, n);
            if ((rc = do_put(&b, done, n)) != 0) {
                fprintf(stderr, "kvpool bench: fill failed at %llu objects: %s%s\n",
                        (unsigned long long)done, kvp_strerror(rc),
                        rc == KVP_ENO_AVAILABLE_HANDLE
                            ? " (the master's max_master_memory bounds the objects it holds: "
                              "give --max-master-memory SIZE)"
                            : "");
                goto out;
            }
            if ((done / 1024) % 512 == 0) { /* keep the idle node connection alive */
                kvp_buf_reset(&b.body);
                if (rpc(&b, b.node, KVP_OP_HEARTBEAT, &resp, &len))
                    goto out;
            }
        }
        rss2 = rss_bytes(pid);
        per2 = (double)(rss2 - rss0) / (double)nbig;
    }
    double uf1 = usable_fraction((2u << 20) + 17), uf2 = usable_fraction(0);
    if (pid) {
        fprintf(b.out, "  master RSS per object: %.0f bytes at %llu objects", per1,
                (unsigned long long)objs);
        if (rss2)
            fprintf(b.out, ", %.0f bytes at %llu objects", per2, (unsigned long long)nbig);
        fprintf(b.out, "\n");
    }
    fprintf(b.out, "  allocator usable fraction: %.4f (2 MiB + 17 B values), %.4f (512 KiB-4 MiB mix)\n",
            uf1, uf2);
    if (b.json)
        printf("\n  ],\n  \"rss_per_object\": [{\"objects\": %llu, \"bytes\": %.0f}%s",
               (unsigned long long)objs, per1, rss2 ? "," : "");
    if (b.json && rss2)
        printf(" {\"objects\": %llu, \"bytes\": %.0f}", (unsigned long long)nbig, per2);
    if (b.json)
        printf("],\n  \"usable_fraction\": {\"2MiB+17\": %.4f, \"mix_512KiB_4MiB\": %.4f}\n}\n",
               uf1, uf2);
    ret = 0;
out:
    bench_fini(&b);
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    return ret;
}

/* ------------------------------------------------ shared by benchmarks */

void kvp_bench_json_escape(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '"' || *s == '\\')
            out[o++] = '\\';
        if ((unsigned char)*s >= 0x20)
            out[o++] = *s;
    }
    out[o] = '\0';
}

int kvp_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int kvp_bench_write_all(int fd, const void *p, size_t n)
{
    const uint8_t *q = p;
    while (n) {
        ssize_t w = write(fd, q, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        q += w, n -= (size_t)w;
    }
    return 0;
}

void kvp_bench_progress(const char *label, int lw, const char *shape, int sw, int r, int rounds)
{
    if (!isatty(2))
        return;
    if (r < 0)
        fprintf(stderr, "\r  %-*s %-*s warm-up      ", lw, label, sw, shape);
    else
        fprintf(stderr, "\r  %-*s %-*s round %d/%d  ", lw, label, sw, shape, r + 1, rounds);
}

void kvp_bench_progress_clear(int width)
{
    if (isatty(2))
        fprintf(stderr, "\r%*s\r", width, "");
}

kvp_client *kvp_bench_client_open_conf(const char *conf, int force_tcp, char *why, size_t wl)
{
    char err[256] = "";
    kvp_client *c = NULL;
    if (force_tcp)
        setenv("KVPOOL_FORCE_TCP", "1", 1);
    else
        unsetenv("KVPOOL_FORCE_TCP");
    int rc = kvp_client_open(conf, &c, err, sizeof err);
    unsetenv("KVPOOL_FORCE_TCP");
    if (rc) {
        snprintf(why, wl, "kvp_client_open: %.160s", err[0] ? err : kvp_strerror(rc));
        return NULL;
    }
    return c;
}

kvp_client *kvp_bench_client_open(const char *master, const char *token, int force_tcp,
                                  char *why, size_t wl)
{
    char m[300], t[300], conf[800];
    kvp_bench_json_escape(m, sizeof m, master);
    kvp_bench_json_escape(t, sizeof t, token ? token : "");
    snprintf(conf, sizeof conf, "{\"master\": \"%s\", \"mode\": \"standalone-store\"%s%s%s}", m,
             *t ? ", \"cluster_token\": \"" : "", t, *t ? "\"" : "");
    return kvp_bench_client_open_conf(conf, force_tcp, why, wl);
}

int kvp_bench_client_probe(kvp_client *c, const char *probe, const void *val, char *transport,
                           char *why, size_t wl)
{
    int rc = 0;
    for (int i = 0; i < 200; i++) { /* up to 10 s */
        if ((rc = kvp_client_put(c, probe, val, 4096)) == 0)
            break;
        usleep(50000);
    }
    if (rc) {
        snprintf(why, wl, "no put succeeded within 10 s: %s", kvp_strerror(rc));
        return -1;
    }
    char desc[512];
    snprintf(transport, 16, "unknown");
    if (kvp_client_describe(c, probe, desc, sizeof desc) > 0) {
        const char *via = strstr(desc, " via ");
        if (via)
            snprintf(transport, 16, "%.*s", (int)strcspn(via + 5, " ;,\n"), via + 5);
    }
    kvp_client_remove(c, probe, 1);
    return 0;
}

/* -------------------------------------------------- bench scrape */

/* `kvpool bench scrape`: does scraping the master's /metrics slow its
 * request loop? One master with --http, 100,000 objects; rounds of timed
 * runs (EXIST batch 1, GET+RELEASE batch 256) under each scrape rate in
 * turn, so that drift hits every rate alike; medians over the rounds. */
typedef struct scraper {
    uint16_t port;
    double hz;                 /* 0 = as fast as one connection can */
    _Atomic int stop;
    uint64_t n, bytes, fails;
    double *lat_ms;            /* per scrape */
    uint64_t cap;
    pthread_t th;
} scraper;

/* One GET /metrics over a fresh connection, read to the end: bytes, or -1. */
static long scrape_once(uint16_t port)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    char err[KVP_NET_ERRLEN];
    int fd = kvp_net_connect(addr, 2000, err, sizeof err);
    if (fd < 0)
        return -1;
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    long total = 0;
    if (kvp_bench_write_all(fd, req, sizeof req - 1) == 0) {
        char buf[65536];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0)
            total += n;
        if (n < 0)
            total = -1;
    } else {
        total = -1;
    }
    close(fd);
    return total;
}

static void *scraper_main(void *arg)
{
    scraper *sc = arg;
    uint64_t next = kvp_now_ns();
    while (!atomic_load(&sc->stop)) {
        uint64_t t0 = kvp_now_ns();
        long got = scrape_once(sc->port);
        uint64_t t1 = kvp_now_ns();
        if (got <= 0) {
            sc->fails++;
        } else {
            sc->bytes += (uint64_t)got;
            if (sc->n < sc->cap)
                sc->lat_ms[sc->n] = (double)(t1 - t0) / 1e6;
            sc->n++;
        }
        if (sc->hz > 0) { /* asleep until the next one (waking every 50 ms to see stop) */
            next += (uint64_t)(1e9 / sc->hz);
            uint64_t now;
            while (!atomic_load(&sc->stop) && (now = kvp_now_ns()) < next) {
                uint64_t d = next - now < 50000000u ? next - now : 50000000u;
                struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
                nanosleep(&ts, NULL);
            }
        }
    }
    return NULL;
}

/* ops a second of fn(batch) for secs seconds; -1 on an error */
static double timed(bench *b, op_fn fn, uint64_t nobj, uint32_t batch, double secs)
{
    uint64_t t0 = kvp_now_ns(), end = t0 + (uint64_t)(secs * 1e9), keys = 0, from = 0;
    uint64_t beat = 0;
    while (kvp_now_ns() < end) {
        if (kvp_now_ns() - beat > 1000000000ull) { /* the idle node must stay alive */
            const uint8_t *resp;
            uint32_t len;
            if (rpc(b, b->node, KVP_OP_HEARTBEAT, &resp, &len) != 0)
                return -1;
            beat = kvp_now_ns();
        }
        if (from + batch > nobj)
            from = 0;
        make_keys(b, from, batch);
        if (fn(b, from, batch) != 0)
            return -1;
        keys += batch;
        from += batch;
    }
    return (double)keys / ((double)(kvp_now_ns() - t0) / 1e9);
}

static int bench_scrape(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL}, {"rounds", KVP_CLI_TEXT},
                                       {"seconds", KVP_CLI_TEXT}, {NULL, KVP_CLI_TEXT}};
    const char *v[3] = {NULL};
    int rc = kvp_cli_parse(argc, argv, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool bench scrape [--json] [--rounds N] [--seconds S]\n"
               "  the master's EXIST (batch 1) and GET+RELEASE (batch 256) key-ops/s while\n"
               "  /metrics is not scraped, scraped once a second, 20 times a second, and as\n"
               "  fast as one connection can; --rounds (default 9) x --seconds per run\n"
               "  (default 1)\n");
        return 0;
    }
    if (rc < 0)
        return 2;
    uint64_t rounds = 9, secs = 1;
    if ((v[1] && kvp_cli_uint("bench scrape", "rounds", v[1], 1, 100, &rounds) != 0) ||
        (v[2] && kvp_cli_uint("bench scrape", "seconds", v[2], 1, 600, &secs) != 0))
        return 2;
    bench b = {0};
    b.json = v[0] != NULL;
    b.out = b.json ? stderr : stdout;
    signal(SIGPIPE, SIG_IGN);
    /* a free port for the endpoint: the master binds it at once */
    uint16_t hport = 0;
    int pfd = kvp_net_listen("127.0.0.1:0", 1, &hport, (char[KVP_NET_ERRLEN]){0}, KVP_NET_ERRLEN);
    if (pfd < 0)
        return 1;
    close(pfd);
    char http[32], addr[64];
    snprintf(http, sizeof http, "127.0.0.1:%u", hport);
    const char *const args[] = {"master", "--log-level", "warn", "--http", http, NULL};
    pid_t pid = kvp_cli_spawn_self(args, 5000, addr, sizeof addr);
    if (pid < 0) {
        fprintf(stderr, "kvpool bench scrape: could not start a master\n");
        return 1;
    }
    const uint64_t nobj = 100000;
    int ret = 1;
    enum { NMODES = 4 };
    static const double hz[NMODES] = {-1, 1, 20, 0}; /* -1: no scraper */
    static const char *const mname[NMODES] = {"none", "1/s", "20/s", "flat-out"};
    double *res[NMODES][2] = {{0}};
    for (int m = 0; m < NMODES; m++)
        for (int k = 0; k < 2; k++)
            res[m][k] = kvp_calloc(rounds, sizeof(double));
    scraper sc = {.port = hport, .cap = 1u << 20};
    sc.lat_ms = kvp_malloc(sc.cap * sizeof *sc.lat_ms);
    uint64_t scrapes = 0, sbytes = 0, sfails = 0, nlat = 0;
    if (bench_init(&b, 16) != 0 || !sc.lat_ms)
        goto out;
    for (int m = 0; m < NMODES; m++)
        for (int k = 0; k < 2; k++)
            if (!res[m][k])
                goto out;
    if (bench_connect(&b, "bench scrape", addr, NULL, 4 * nobj * 4096) != 0)
        goto out;
    for (uint64_t done = 0; done < nobj; done += 1024) {
        make_keys(&b, done, 1024);
        if ((rc = do_put(&b, done, 1024)) != 0) {
            fprintf(stderr, "kvpool bench scrape: fill: %s\n", kvp_strerror(rc));
            goto out;
        }
    }
    fprintf(b.out, "kvpool bench scrape: master %s, /metrics on %s, %llu objects, %llu rounds "
            "x %llu s per run\n", addr, http, (unsigned long long)nobj,
            (unsigned long long)rounds, (unsigned long long)secs);
    for (uint64_t r = 0; r < rounds; r++)
        for (int m = 0; m < NMODES; m++) {
            kvp_bench_progress("scrape", 6, mname[m], 8, (int)r, (int)rounds);
            sc.hz = hz[m];
            sc.n = sc.bytes = sc.fails = 0;
            atomic_store(&sc.stop, 0);
            if (hz[m] >= 0 && pthread_create(&sc.th, NULL, scraper_main, &sc) != 0)
                goto out;
            double e = timed(&b, op_exist, nobj, 1, (double)secs);
            double g = timed(&b, do_get, nobj, 256, (double)secs);
            if (hz[m] >= 0) {
                atomic_store(&sc.stop, 1);
                pthread_join(sc.th, NULL);
                if (m == NMODES - 1) { /* latency and size from the flat-out runs */
                    uint64_t keep = sc.n < sc.cap ? sc.n : sc.cap;
                    nlat = keep;
                    scrapes += sc.n;
                    sbytes += sc.bytes;
                }
                sfails += sc.fails;
            }
            if (e < 0 || g < 0) {
                fprintf(stderr, "kvpool bench scrape: a request failed\n");
                goto out;
            }
            res[m][0][r] = e;
            res[m][1][r] = g;
        }
    kvp_bench_progress_clear(60);
    double med[NMODES][2];
    for (int m = 0; m < NMODES; m++)
        for (int k = 0; k < 2; k++) {
            qsort(res[m][k], rounds, sizeof(double), cmp_d);
            med[m][k] = res[m][k][rounds / 2];
        }
    qsort(sc.lat_ms, nlat, sizeof(double), cmp_d);
    double sp50 = nlat ? sc.lat_ms[nlat / 2] : 0;
    double sp99 = nlat ? sc.lat_ms[(uint64_t)((double)(nlat - 1) * 0.99)] : 0;
    double ssize = scrapes ? (double)sbytes / (double)scrapes : 0;
    fprintf(b.out, "  %-9s %16s %8s %20s %8s   (rounds' range, EXIST / GET)\n", "scrapes",
            "EXIST b1 keys/s", "ratio", "GET+REL b256 keys/s", "ratio");
    for (int m = 0; m < NMODES; m++)
        fprintf(b.out, "  %-9s %16.0f %8.3f %20.0f %8.3f   %.0f..%.0f / %.0f..%.0f\n", mname[m],
                med[m][0], med[m][0] / med[0][0], med[m][1], med[m][1] / med[0][1],
                res[m][0][0], res[m][0][rounds - 1], res[m][1][0], res[m][1][rounds - 1]);
    fprintf(b.out, "  a scrape: %.0f bytes, p50 %.2f ms, p99 %.2f ms (flat-out runs); %llu "
            "failed\n", ssize, sp50, sp99, (unsigned long long)sfails);
    if (b.json) {
        printf("{\n  \"bench\": \"scrape\",\n  \"objects\": %llu,\n  \"rounds\": %llu,\n"
               "  \"seconds\": %llu,\n  \"modes\": [\n", (unsigned long long)nobj,
               (unsigned long long)rounds, (unsigned long long)secs);
        for (int m = 0; m < NMODES; m++)
            printf("    {\"scrapes\": \"%s\", \"exist_b1_keys_per_s\": %.0f, \"exist_ratio\": "
                   "%.3f, \"exist_range\": [%.0f, %.0f], \"get_b256_keys_per_s\": %.0f, "
                   "\"get_ratio\": %.3f, \"get_range\": [%.0f, %.0f]}%s\n",
                   mname[m], med[m][0], med[m][0] / med[0][0], res[m][0][0],
                   res[m][0][rounds - 1], med[m][1], med[m][1] / med[0][1], res[m][1][0],
                   res[m][1][rounds - 1], m + 1 < NMODES ? "," : "");
        printf("  ],\n  \"scrape_bytes\": %.0f,\n  \"scrape_p50_ms\": %.3f,\n"
               "  \"scrape_p99_ms\": %.3f,\n  \"scrape_failures\": %llu\n}\n", ssize, sp50,
               sp99, (unsigned long long)sfails);
    }
    ret = sfails ? 1 : 0;
out:
    bench_fini(&b);
    kvp_free(sc.lat_ms);
    for (int m = 0; m < NMODES; m++)
        for (int k = 0; k < 2; k++)
            kvp_free(res[m][k]);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return ret;
}

/* ------------------------------------------------------ bench kvev */

/*
 * `kvpool bench kvev`: what KV events cost the master. Two masters side by
 * side, one publishing KV events (a subscriber in this process takes every
 * batch, as a router would), one not; both get the same churn: each round
 * puts keys that name engine blocks (batch 256) and removes the previous
 * round's (batch 256): a BlockStored and a BlockRemoved per key. Rounds
 * alternate between the two masters. (Eviction would churn as well, but the
 * stand-in node never acknowledges frees, so evicted space never comes
 * back: see bench master.) Then LOOKUP_HASHES of one 1024-block chain
 * against EXIST of the same 1024 keys.
 */
typedef struct ksub {
    void *ctx, *sock;
    atomic_int stop;
    uint64_t batches, bytes, gaps, last; /* gaps: seqs skipped in a topic */
    pthread_t th;
    int started;
} ksub;

static void *ksub_main(void *arg)
{
    ksub *k = arg;
    while (!atomic_load(&k->stop)) {
        zmq_pollitem_t it = {k->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        zmq_msg_t fr[3];
        int nf = 0, more = 1;
        while (more && nf < 3) {
            zmq_msg_init(&fr[nf]);
            if (zmq_msg_recv(&fr[nf], k->sock, 0) < 0)
                break;
            more = zmq_msg_more(&fr[nf++]);
        }
        if (nf == 3 && zmq_msg_size(&fr[1]) == 8) {
            const uint8_t *p = zmq_msg_data(&fr[1]);
            uint64_t seq = 0;
            for (int i = 0; i < 8; i++)
                seq = seq << 8 | p[i];
            if (k->last && seq != k->last + 1)
                k->gaps++;
            k->last = seq;
            k->batches++;
            k->bytes += zmq_msg_size(&fr[2]);
        }
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&fr[i]);
    }
    return NULL;
}

static int do_remove(bench *b, uint64_t from, uint32_t n)
{
    make_keys(b, from, n);
    kvp_msg_remove m = {{NULL, 0}, 0, n, b->keys};
    kvp_enc_remove(&b->body, &m);
    const uint8_t *resp;
    uint32_t len;
    int rc = rpc(b, b->cl, KVP_OP_REMOVE, &resp, &len);
    kvp_msg_results res;
    if (rc == 0 && (rc = kvp_dec_results(resp, len, &b->lim, &b->ra, &res)) == 0)
        for (uint32_t i = 0; i < n && rc == 0; i++)
            rc = res.codes[i];
    return rc;
}

/* The stand-in node heartbeats once a second (else the master drops its
 * segment, and every object, after client_ttl). 0 or the error. */
static int node_alive(bench *b, uint64_t *beat)
{
    if (kvp_now_ns() - *beat < 1000000000ull)
        return 0;
    const uint8_t *resp;
    uint32_t len;
    *beat = kvp_now_ns();
    return rpc(b, b->node, KVP_OP_HEARTBEAT, &resp, &len);
}

static uint64_t master_counter(bench *b, int which)
{
    const uint8_t *resp;
    uint32_t len;
    kvp_msg_stats_resp st;
    if (rpc(b, b->cl, KVP_OP_STATS, &resp, &len) != 0 ||
        kvp_dec_stats_resp(resp, len, &b->lim, &b->ra, &st) != 0 || (uint32_t)which >= st.n_counters)
        return 0;
    return st.counters[which];
}

/* p50 in us of `reps` requests of op over the 1024 keys (EXIST) or their
 * hashes in one chain (LOOKUP_HASHES) from key `from`. */
static double kvev_p50(bench *b, uint64_t from, int lookup, int reps, double *lat)
{
    uint64_t hs[1024];
    for (int i = 0; i < 1024; i++)
        hs[i] = (from + (uint64_t)i + 1) * 0x9E3779B97F4A7C15ull; /* make_blocks' */
    for (int r = 0; r < reps; r++) {
        make_keys(b, from, 1024);
        uint64_t t0 = kvp_now_ns();
        int rc;
        if (lookup) {
            kvp_hchain ch = {0, 1024, hs};
            kvp_msg_lookup_hashes m = {{NULL, 0}, 1, &ch};
            kvp_enc_lookup_hashes(&b->body, &m);
            const uint8_t *resp;
            uint32_t len;
            kvp_msg_lookup_hashes_resp lr;
            rc = rpc(b, b->cl, KVP_OP_LOOKUP_HASHES, &resp, &len);
            if (rc == 0 && (rc = kvp_dec_lookup_hashes_resp(resp, len, &b->lim, &b->ra, &lr)) == 0)
                rc = lr.n == 1 && lr.prefix[0].dram == 1024 ? 0 : KVP_EOBJECT_NOT_FOUND;
        } else {
            rc = do_exist(b, from, 1024, 0);
        }
        if (rc)
            return -1;
        lat[r] = (double)(kvp_now_ns() - t0) / 1e3;
    }
    qsort(lat, (size_t)reps, sizeof *lat, cmp_d);
    return lat[reps / 2];
}

static int bench_kvev(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL}, {"objects", KVP_CLI_TEXT},
                                       {"rounds", KVP_CLI_TEXT}, {"no-subscriber", KVP_CLI_BOOL},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[4] = {NULL};
    int rc = kvp_cli_parse(argc, argv, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool bench kvev [--json] [--objects N] [--rounds N] [--no-subscriber]\n"
               "  a master publishing KV events (and a subscriber taking them) against one that\n"
               "  does not, under the same churn: --objects puts of engine blocks each (default\n"
               "  1000000, half of them evicting), in --rounds alternating rounds (default 6);\n"
               "  then LOOKUP_HASHES of a 1024-block chain against EXIST of its 1024 keys;\n"
               "  --no-subscriber: nobody subscribes (the master's own cost, without a\n"
               "  subscriber's CPU on the same machine)\n");
        return 0;
    }
    if (rc < 0)
        return 2;
    uint64_t nobj = 1000000, rounds = 6;
    if ((v[1] && kvp_cli_uint("bench kvev", "objects", v[1], 16384, 1ull << 30, &nobj) != 0) ||
        (v[2] && kvp_cli_uint("bench kvev", "rounds", v[2], 2, 100, &rounds) != 0))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    bench b[2] = {{0}, {0}}; /* 0: events off, 1: on */
    ksub sub = {0};
    pid_t pid[2] = {-1, -1};
    double *kps[2] = {kvp_calloc(rounds, sizeof(double)), kvp_calloc(rounds, sizeof(double))};
    double lat[201];
    int ret = 1;
    b[0].json = b[1].json = v[0] != NULL;
    FILE *out = v[0] ? stderr : stdout;
    uint16_t pport = 0;
    int pfd = kvp_net_listen("127.0.0.1:0", 1, &pport, (char[KVP_NET_ERRLEN]){0}, KVP_NET_ERRLEN);
    if (pfd < 0 || !kps[0] || !kps[1])
        goto out;
    close(pfd);
    char pub[48], addr[2][64];
    snprintf(pub, sizeof pub, "tcp://127.0.0.1:%u", pport);
    const char *const off_args[] = {"master", "--log-level", "warn", NULL};
    const char *const on_args[] = {"master", "--log-level", "warn", "--kv-events", pub, NULL};
    pid[0] = kvp_cli_spawn_self(off_args, 5000, addr[0], sizeof addr[0]);
    pid[1] = kvp_cli_spawn_self(on_args, 5000, addr[1], sizeof addr[1]);
    if (pid[0] < 0 || pid[1] < 0) {
        fprintf(stderr, "kvpool bench kvev: could not start the masters\n");
        goto out;
    }
    for (int m = 0; m < 2; m++) {
        b[m].out = out;
        if (bench_init(&b[m], 16) != 0 || !(b[m].blk = kvp_calloc(1024, sizeof *b[m].blk)) ||
            bench_connect(&b[m], "bench kvev", addr[m], NULL, (2 * nobj + 4096) * 4096) != 0)
            goto out;
    }
    int nosub = v[3] != NULL;
    sub.ctx = nosub ? NULL : zmq_ctx_new();
    sub.sock = sub.ctx ? zmq_socket(sub.ctx, ZMQ_SUB) : NULL;
    int hwm = 0; /* take everything: a gap here would be the subscriber's, not the master's */
    if (!nosub &&
        (!sub.sock || zmq_setsockopt(sub.sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
         zmq_setsockopt(sub.sock, ZMQ_SUBSCRIBE, "", 0) != 0 || zmq_connect(sub.sock, pub) != 0 ||
         !(sub.started = pthread_create(&sub.th, NULL, ksub_main, &sub) == 0))) {
        fprintf(stderr, "kvpool bench kvev: no subscriber: %s\n", zmq_strerror(zmq_errno()));
        goto out;
    }
    usleep(300000); /* the SUB's connection (ZeroMQ's slow joiner) */
    fprintf(out, "kvpool bench kvev: masters %s (events off) and %s (events on, %s), %llu puts "
            "of engine blocks and as many removes each, in %llu rounds\n", addr[0], addr[1],
            pub, (unsigned long long)nobj, (unsigned long long)rounds);
    uint64_t per = nobj / rounds, ev0 = master_counter(&b[1], KVP_STAT_KV_EVENTS);
    uint64_t bt0 = master_counter(&b[1], KVP_STAT_KV_BATCHES), beat[2] = {0, 0};
    double on_secs = 0;
    for (uint64_t r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            int m = (int)((r + (uint64_t)k) & 1); /* alternate which goes first */
            kvp_bench_progress("kvev", 4, m ? "on" : "off", 3, (int)r, (int)rounds);
            b[m].nlat = 0;
            uint64_t t0 = kvp_now_ns();
            for (uint64_t done = 0; done < per; done += 256) {
                uint32_t n = per - done < 256 ? (uint32_t)(per - done) : 256;
                make_keys(&b[m], r * per + done, n);
                if ((rc = do_put(&b[m], r * per + done, n)) != 0) {
                    fprintf(stderr, "kvpool bench kvev: put: %s\n", kvp_strerror(rc));
                    goto out;
                }
                if (r > 0 && (rc = do_remove(&b[m], (r - 1) * per + done, n)) != 0) {
                    fprintf(stderr, "kvpool bench kvev: remove: %s\n", kvp_strerror(rc));
                    goto out;
                }
                if (node_alive(&b[m], &beat[m]) != 0)
                    goto out;
            }
            double secs = (double)(kvp_now_ns() - t0) / 1e9;
            kps[m][r] = (double)(r > 0 ? 2 * per : per) / secs;
            if (m)
                on_secs += secs;
        }
    kvp_bench_progress_clear(60);
    uint64_t events = master_counter(&b[1], KVP_STAT_KV_EVENTS) - ev0;
    uint64_t batches = master_counter(&b[1], KVP_STAT_KV_BATCHES) - bt0;
    for (int i = 0; i < 50 && !nosub && sub.batches < batches; i++)
        usleep(100000); /* the last turns' batches on their way */
    beat[1] = 0;
    if (node_alive(&b[1], &beat[1]) != 0)
        goto out;
    double lk = kvev_p50(&b[1], nobj - 1024 * 2, 1, 201, lat);
    double ex = kvev_p50(&b[1], nobj - 1024 * 2, 0, 201, lat);
    double med[2];
    for (int m = 0; m < 2; m++) {
        qsort(kps[m], rounds, sizeof(double), cmp_d);
        med[m] = kps[m][rounds / 2];
    }
    double eps = on_secs > 0 ? (double)events / on_secs : 0;
    fprintf(out, "  puts + removes (batch 256, key-ops/s, median of rounds): events off %.0f "
            "(%.0f..%.0f), on "
            "%.0f (%.0f..%.0f): ratio %.3f\n", med[0], kps[0][0], kps[0][rounds - 1], med[1],
            kps[1][0], kps[1][rounds - 1], med[1] / med[0]);
    fprintf(out, "  events: %llu recorded in %.1f s of puts (%.0f/s); %llu batches closed, %llu "
            "received by the subscriber (%.1f MB), %llu gaps\n", (unsigned long long)events,
            on_secs, eps, (unsigned long long)batches, (unsigned long long)sub.batches,
            (double)sub.bytes / 1e6, (unsigned long long)sub.gaps);
    fprintf(out, "  1024 blocks: LOOKUP_HASHES p50 %.1f us, EXIST of their keys p50 %.1f us "
            "(ratio %.2f)\n", lk, ex, ex > 0 ? lk / ex : 0);
    if (v[0])
        printf("{\n  \"bench\": \"kvev\",\n  \"objects\": %llu,\n  \"rounds\": %llu,\n"
               "  \"key_ops_per_s_off\": %.0f,\n  \"key_ops_per_s_on\": %.0f,\n"
               "  \"ratio\": %.3f,\n  \"off_range\": [%.0f, %.0f],\n  \"on_range\": [%.0f, %.0f],\n"
               "  \"events\": %llu,\n  \"events_per_s\": %.0f,\n  \"batches\": %llu,\n"
               "  \"received_batches\": %llu,\n  \"received_bytes\": %llu,\n  \"gaps\": %llu,\n"
               "  \"lookup_hashes_1024_p50_us\": %.1f,\n  \"exist_1024_p50_us\": %.1f,\n"
               "  \"subscriber\": %s\n}\n",
               (unsigned long long)nobj, (unsigned long long)rounds, med[0], med[1],
               med[1] / med[0], kps[0][0], kps[0][rounds - 1], kps[1][0], kps[1][rounds - 1],
               (unsigned long long)events, eps, (unsigned long long)batches,
               (unsigned long long)sub.batches, (unsigned long long)sub.bytes,
               (unsigned long long)sub.gaps, lk, ex, nosub ? "false" : "true");
    ret = lk < 0 || ex < 0 || sub.gaps ? 1 : 0;
    if (nosub)
        fprintf(out, "  (no subscriber: the batches went nowhere)\n");
out:
    if (sub.started) {
        atomic_store(&sub.stop, 1);
        pthread_join(sub.th, NULL);
    }
    if (sub.sock)
        zmq_close(sub.sock);
    if (sub.ctx)
        zmq_ctx_term(sub.ctx);
    for (int m = 0; m < 2; m++) {
        bench_fini(&b[m]);
        kvp_free(kps[m]);
        if (pid[m] > 0) {
            kill(pid[m], SIGTERM);
            waitpid(pid[m], NULL, 0);
        }
    }
    return ret;
}

int kvp_bench_main(int argc, char **argv)
{
    static const struct {
        const char *name, *label; /* label: argv[0] of the benchmark, for messages */
        int (*fn)(int, char **);
    } benches[] = {{"master", "bench master", bench_master},
                   {"store", "bench store", kvp_bench_store},
                   {"connector", "bench connector", kvp_bench_connector},
                   {"sim", "bench sim", kvp_bench_sim},
                   {"gpu", "bench gpu", kvp_bench_gpu},
                   {"disk", "bench disk", kvp_bench_disk},
                   {"ha", "bench ha", kvp_bench_ha},
                   {"scrape", "bench scrape", bench_scrape},
                   {"kvev", "bench kvev", bench_kvev},
                   {"segment", "bench segment", kvp_bench_segment}};
    for (size_t i = 0; argc >= 2 && i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) {
            argv[1] = (char *)benches[i].label;
            return benches[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "usage: kvpool bench master|store|connector|sim|gpu|disk|ha|scrape|kvev|segment"
                    " [--json]\n"
                    "       (kvpool bench NAME --help for each)\n"
                    "  master  the master's throughput, latency and memory\n"
                    "  store   batch put/get GB/s: shm and tcp vs memcpy, raw TCP, redis, "
                    "memcached\n"
                    "  connector  the connector's CPU overhead per step / per 1,000 blocks "
                    "(in-process)\n"
                    "  sim     the engine simulator's GB/s as a fraction of the raw store's\n"
                    "          batch bandwidth (same run, same pool)\n"
                    "  gpu     batch put/get GB/s from / into CUDA device memory (shm, tcp) vs\n"
                    "          the PCIe limit measured in the same run, per copy strategy\n"
                    "  disk    the SSD tier's store: write / read GB/s vs fio on the same\n"
                    "          directory, and warm-restart times\n"
                    "  ha      a leader + standby (etcd) against one master: put/get ratio,\n"
                    "          kill -9 failovers (time to put/get again, objects lost),\n"
                    "          replication bytes per put\n"
                    "  scrape  the master's key-ops/s while its /metrics is scraped (none, 1/s,\n"
                    "          20/s, flat out)\n"
                    "  kvev    a master publishing KV events against one that does not\n"
                    "  segment a fresh `kvpool serve`: time until ready, a fresh client's shm\n"
                    "          attach, 1 MiB puts while its segment is faulted in and after\n");
    return argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) ? 0 : 2;
}
