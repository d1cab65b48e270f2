/*
 * gen_master_seq_corpus.c -- writes the committed seeds of fuzz_master_seq:
 * programs for its interpreter (the step encodings below mirror
 * fuzz_master_seq.c's st_* readers) that walk the master through its deep
 * states: puts to eviction with SSD-tier spills answered by the node,
 * loads back and leases, tenant credentials and refusals, a second
 * connection joining a client, put/lease/disk/client timeouts, unmounts and
 * a node's name taken over, max_objects, warm-restart HAVE records, and
 * injected allocation failures. Not built by the Makefile; regenerate after
 * changing the interpreter with
 *
 *   cc -std=gnu11 -o build/gen_master_seq_corpus tests/fuzz/gen_master_seq_corpus.c
 *   build/gen_master_seq_corpus tests/fuzz/corpus/fuzz_master_seq
 *
 * (seeds that are crashing inputs found by fuzzing, crash-*, are kept
 * besides these).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* step numbers: fuzz_master_seq.c's enum */
enum {
    S_HELLO, S_MOUNT, S_UNMOUNT, S_HEARTBEAT, S_PUT_START, S_PUT_END, S_PUT_REVOKE, S_GET,
    S_RELEASE, S_EXIST, S_REMOVE, S_REMOVE_ALL, S_REMOVE_REGEX, S_STATS, S_SEG_INFO,
    S_REPLICA_BAD, S_SEG_FAILING, S_DISK_REPORT, S_ADVANCE, S_CLOSE, S_RAW, S_FAIL, S_PUT,
};
/* configuration bits */
enum { C_CLUSTER = 1, C_NODE = 2, C_TENANTS = 4, C_MAXOBJ = 8, C_SMALLFRAME = 16, C_SMALLOBJ = 32,
       C_LOWMARK = 64 };
/* HELLO credential byte: cluster token, node token, tenant A / B */
enum { H_CLUSTER = 0x01, H_NODE = 0x04, H_TA = 0x10, H_TB = 0x20 };
/* tenants: "", "default", "ta", "tb", "tc"; sizes: 1, 4096, 4097, 3, 8, 20, 64 pages, 100 B */
enum { T_DEF = 0, T_A = 2, T_B = 3, T_C = 4 };
enum { Z_1 = 0, Z_4K = 1, Z_4K1 = 2, Z_3P = 3, Z_8P = 4, Z_20P = 5, Z_64P = 6 };

static uint8_t buf[1 << 14];
static size_t len;
static const char *dir;

static void b(uint8_t v) { buf[len++] = v; }
static void start(uint8_t cfg) { len = 0; b(cfg); }
static void save(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* a session's own client id */
static void hello(uint8_t s, uint8_t creds) { b(S_HELLO), b(s), b(0), b(creds); }
/* join session `other`'s client with the session secret it was given */
static void join(uint8_t s, uint8_t other, uint8_t creds)
{
    b(S_HELLO), b(s), b((uint8_t)(1 | 4 | other << 4)), b(creds);
}
/* mount segment ids (1..5; odd ones have an SSD tier), var = 0: plain */
static void mount(uint8_t s, uint8_t id, uint8_t var) { b(S_MOUNT), b(s), b(0), b(id), b(var); }
static void mount2(uint8_t s, uint8_t id1, uint8_t id2)
{
    b(S_MOUNT), b(s), b(1), b(id1), b(0), b(id2), b(0);
}
/* PUT_START (or with S_PUT, PUT_START + PUT_END) of keys k..k+n-1 */
static void put(uint8_t step, uint8_t s, uint8_t t, uint8_t reps, int pin, uint8_t k, uint8_t n,
                uint8_t size)
{
    b(step), b(s), b(t), b((uint8_t)(reps - 1)), b(pin ? 0 : 1), b(0), b((uint8_t)(n - 1));
    for (uint8_t i = 0; i < n; i++)
        b((uint8_t)(k + i)), b(size);
}
/* keyed request: GET, EXIST, PUT_END, PUT_REVOKE, REMOVE (force first) */
static void keys(uint8_t step, uint8_t s, uint8_t t, uint8_t k, uint8_t n)
{
    b(step), b(s), b(1), b(t), b((uint8_t)(n - 1));
    for (uint8_t i = 0; i < n; i++)
        b((uint8_t)(k + i));
}
static void put_end(uint8_t s, uint8_t t, uint8_t k, uint8_t n)
{
    keys(S_PUT_END, s, t, k, n);
    for (uint8_t i = 0; i < n; i++)
        b((uint8_t)((k + i) % 3)); /* checksum 1 + k % 3, as S_PUT */
}
static void exist(uint8_t s, uint8_t mode, uint8_t t, uint8_t k, uint8_t n)
{
    b(S_EXIST), b(s), b(mode);
    b(1), b(t), b((uint8_t)(n - 1));
    for (uint8_t i = 0; i < n; i++)
        b((uint8_t)(k + i));
}
static void remove_(uint8_t s, int force, uint8_t t, uint8_t k, uint8_t n)
{
    b(S_REMOVE), b(s), b((uint8_t)force);
    b(1), b(t), b((uint8_t)(n - 1));
    for (uint8_t i = 0; i < n; i++)
        b((uint8_t)(k + i));
}
/* RELEASE of the leases GET handed out (idx into the ring) */
static void release(uint8_t s, uint8_t idx) { b(S_RELEASE), b(s), b(0), b(idx), b(0); }
/* DISK_REPORT answering remembered DISK_CMD idx with status index st (0..2: success) */
static void answer(uint8_t s, uint8_t idx, uint8_t st)
{
    uint8_t v = (uint8_t)(st << 3);
    while (v % 5 > 1) /* kind 0 or 1: an answer; status sts[(v >> 3) % 8] */
        v++;
    b(S_DISK_REPORT), b(s), b(1), b(v), b(idx);
}
/* DISK_REPORT of segment id: HAVE (or GONE) of tenant/key with size, checksum index */
static void have(uint8_t s, uint8_t id, int gone, uint8_t t, uint8_t k, uint8_t size, uint8_t sum)
{
    b(S_DISK_REPORT), b(s), b((uint8_t)(1 | (id - 1) << 4));
    b(gone ? 0x43 : 0x02), b(t), b(k), b(size), b(sum), b(0); /* kind 2, bit 6: GONE */
}
static void advance(uint8_t v) { b(S_ADVANCE), b(0), b(v); } /* v%6: 10 60 120 400 1100 5000 */
static void heartbeat(uint8_t s) { b(S_HEARTBEAT), b(s); }
static void stats(uint8_t s) { b(S_STATS), b(s); }

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    mkdir(dir, 0755);

    /* the plain lifecycle: put, get, release, remove */
    start(0);
    hello(0, 0), mount2(0, 2, 4), hello(1, 0);
    put(S_PUT, 1, T_DEF, 2, 0, 0, 3, Z_4K);
    keys(S_GET, 1, T_DEF, 0, 3), release(1, 0), release(1, 1);
    exist(1, 0, T_DEF, 0, 4), exist(1, 1, T_DEF, 0, 4), exist(1, 2, T_DEF, 0, 4);
    remove_(1, 0, T_DEF, 0, 2), stats(1), heartbeat(0);
    b(S_SEG_INFO), b(1), b(0), b(1), b(2), b(4);
    save("lifecycle");

    /* lookup holds (EXIST_LEASE): held keys through eviction pressure, a
     * GET taking a hold over, RELEASEs of GET and hold leases, expiry */
    start(0);
    hello(0, 0), mount(0, 2, 0), hello(1, 0), hello(2, 0);
    put(S_PUT, 1, T_DEF, 1, 0, 0, 4, Z_8P);
    exist(1, 3, T_DEF, 0, 2), exist(2, 3, T_DEF, 1, 2);
    put(S_PUT, 1, T_DEF, 1, 0, 4, 6, Z_20P);
    keys(S_GET, 2, T_DEF, 1, 1), release(2, 0), release(1, 1);
    exist(1, 3, T_DEF, 0, 4), remove_(1, 0, T_DEF, 0, 1), advance(5);
    put(S_PUT, 1, T_DEF, 1, 0, 8, 4, Z_20P), exist(2, 3, T_DEF, 4, 8), stats(1);
    save("lookup_lease");

    /* puts until eviction, spills to the SSD tier answered, loads back */
    start(0);
    hello(0, 0), mount(0, 1, 0), hello(1, 0);
    for (uint8_t k = 0; k < 4; k++)
        put(S_PUT, 1, T_DEF, 1, 0, k, 1, Z_3P);
    for (uint8_t i = 0; i < 3; i++)
        answer(0, i, 0);
    keys(S_GET, 1, T_DEF, 0, 2);
    answer(0, 3, 0), answer(0, 4, 0);
    keys(S_GET, 1, T_DEF, 0, 2), release(1, 0);
    put(S_PUT, 1, T_DEF, 1, 0, 6, 2, Z_4K);
    answer(0, 5, 3), answer(0, 6, 4);
    advance(2), keys(S_GET, 1, T_DEF, 0, 4), advance(2);
    remove_(1, 1, T_DEF, 0, 8);
    save("spill_load");

    /* the same with background eviction (low watermarks) and failing loads */
    start(C_LOWMARK);
    hello(0, 0), mount2(0, 1, 3), hello(1, 0);
    put(S_PUT, 1, T_DEF, 2, 0, 0, 4, Z_8P);
    put(S_PUT, 1, T_DEF, 1, 0, 4, 4, Z_4K1);
    for (uint8_t i = 0; i < 6; i++)
        answer(0, i, (uint8_t)(i % 2 ? 0 : 3));
    keys(S_GET, 1, T_DEF, 0, 4), answer(0, 6, 4), answer(0, 7, 0);
    keys(S_GET, 1, T_DEF, 0, 4), advance(1), b(S_UNMOUNT), b(0), b(0), b(0), b(1);
    save("spill_background");

    /* tenants with credentials: a bound session, a refused one, a node */
    start(C_CLUSTER | C_NODE | C_TENANTS);
    hello(0, H_CLUSTER | H_NODE), mount2(0, 2, 3);
    hello(1, H_CLUSTER | H_TA), hello(2, H_CLUSTER | H_TB), hello(3, H_CLUSTER);
    put(S_PUT, 1, T_A, 1, 0, 0, 2, Z_4K), put(S_PUT, 2, T_B, 1, 0, 0, 2, Z_4K);
    keys(S_GET, 2, T_A, 0, 2), keys(S_GET, 3, T_A, 0, 1), keys(S_GET, 3, T_C, 0, 1);
    put(S_PUT, 3, T_C, 1, 0, 3, 1, Z_1), remove_(2, 1, T_A, 0, 2);
    b(S_REMOVE_ALL), b(2), b(1), b(T_A), b(S_REMOVE_ALL), b(1), b(1), b(T_A);
    mount(1, 5, 0), hello(4, H_CLUSTER | H_TB | H_NODE), hello(5, 0x02);
    hello(5, 0x40 | H_CLUSTER); /* without AUTH_CHALLENGE: no proof holds */
    save("tenants");

    /* a second connection joins a client with its session secret; one
     * without it, or with other credentials, is refused */
    start(C_NODE);
    hello(0, H_NODE), mount(0, 3, 0), hello(1, 0);
    join(2, 1, 0), join(3, 1, H_NODE), join(4, 0, H_NODE);
    b(S_HELLO), b(5), b(1 | 4 | 8 | 1 << 4), b(0); /* a wrong secret */
    put(S_PUT_START, 1, T_DEF, 1, 0, 0, 2, Z_4K);
    put_end(2, T_DEF, 0, 2);
    b(S_CLOSE), b(1), b(S_CLOSE), b(2);
    keys(S_GET, 3, T_DEF, 0, 2), b(S_CLOSE), b(0), hello(0, H_NODE), mount(0, 3, 0);
    save("join");

    /* timeouts: puts, leases, disk commands, clients */
    start(0);
    hello(0, 0), mount2(0, 1, 2), hello(1, 0);
    put(S_PUT_START, 1, T_DEF, 2, 0, 0, 2, Z_4K), advance(2);
    put_end(1, T_DEF, 0, 2);
    put(S_PUT, 1, T_DEF, 1, 0, 2, 2, Z_4K), keys(S_GET, 1, T_DEF, 2, 2), advance(1);
    release(1, 0), keys(S_GET, 1, T_DEF, 2, 1), remove_(1, 0, T_DEF, 2, 1);
    put(S_PUT, 1, T_DEF, 1, 1, 4, 4, Z_8P), put(S_PUT, 1, T_DEF, 1, 0, 8, 3, Z_8P), advance(2);
    heartbeat(1), advance(4), heartbeat(0), advance(4), advance(5);
    save("timeouts");

    /* a node restarts: its name is taken over, the segment remounted */
    start(0);
    hello(0, 0), mount(0, 1, 0), hello(1, 0);
    put(S_PUT, 1, T_DEF, 1, 0, 0, 3, Z_4K);
    hello(2, 0), mount(2, 2, 0x84); /* id 2 under id 1's name: a restart */
    mount(2, 0, 0x84);               /* id 0, refused */
    keys(S_GET, 1, T_DEF, 0, 3), b(S_SEG_FAILING), b(1), b(1), b(0), b(2);
    put(S_PUT, 1, T_DEF, 3, 0, 4, 2, Z_4K), heartbeat(2), b(S_CLOSE), b(2), advance(4);
    mount(0, 1, 0x81), mount(0, 1, 0x82), mount(0, 1, 0xC8);
    save("takeover");

    /* the replicas a reader found corrupt */
    start(0);
    hello(0, 0), mount2(0, 2, 4), hello(1, 0);
    put(S_PUT, 1, T_DEF, 2, 0, 0, 2, Z_4K), keys(S_GET, 1, T_DEF, 0, 2);
    b(S_REPLICA_BAD), b(1), b(0), b(0), b(S_REPLICA_BAD), b(1), b(1 | 1 << 2), b(1), b(2);
    keys(S_GET, 1, T_DEF, 0, 2), put(S_PUT, 1, T_DEF, 2, 0, 0, 2, Z_4K);
    save("replica_bad");

    /* max_objects: puts evict the oldest */
    start(C_MAXOBJ | C_SMALLOBJ);
    hello(0, 0), mount2(0, 3, 1), hello(1, 0);
    for (uint8_t k = 0; k < 10; k++)
        put(S_PUT, 1, T_DEF, 1, k % 3 == 0, k, 1, Z_4K);
    put(S_PUT, 1, T_DEF, 1, 0, 10, 2, Z_20P), stats(1);
    b(S_REMOVE_REGEX), b(1), b(1), b(T_DEF), b(2), b(S_REMOVE_REGEX), b(1), b(0), b(T_DEF), b(4);
    save("max_objects");

    /* a restarted node reports the records its disk tier holds */
    start(0);
    hello(0, 0), mount(0, 1, 0x10), hello(1, 0);
    have(0, 1, 0, T_DEF, 0, Z_4K, 0), have(0, 1, 0, T_C, 1, Z_3P, 1), have(0, 1, 0, T_DEF, 2, Z_1, 2);
    exist(1, 2, T_DEF, 0, 3), keys(S_GET, 1, T_DEF, 0, 3);
    answer(0, 0, 0), answer(0, 1, 4), keys(S_GET, 1, T_DEF, 0, 3);
    have(0, 1, 1, T_DEF, 0, Z_4K, 0), have(0, 1, 1, T_DEF, 2, Z_1, 2);
    put(S_PUT, 1, T_DEF, 1, 0, 0, 1, Z_1), have(0, 1, 0, T_DEF, 0, Z_1, 0);
    save("disk_have");

    /* injected allocation failures in the middle of it all */
    start(0);
    hello(0, 0), mount2(0, 1, 2), hello(1, 0);
    for (uint8_t n = 0; n < 8; n++) {
        b(S_FAIL), b(0), b(n);
        put(S_PUT, 1, T_DEF, 2, 0, (uint8_t)(n % 6), 2, Z_8P);
        b(S_FAIL), b(0), b((uint8_t)(7 - n));
        keys(S_GET, 1, T_DEF, (uint8_t)(n % 6), 2);
        answer(0, n, 0);
    }
    save("alloc_failures");

    /* small frames: answers that must still fit */
    start(C_SMALLFRAME);
    hello(0, 0), mount2(0, 1, 2), mount(0, 3, 0xC0), hello(1, 0);
    put(S_PUT, 1, T_DEF, 3, 0, 0, 4, Z_4K), keys(S_GET, 1, T_DEF, 0, 4), stats(1);
    b(S_SEG_INFO), b(1), b(0), b(2), b(1), b(2), b(3);
    save("small_frames");
    return 0;
}
