/*
 * sim.c -- `kvpool sim`: an engine simulator driving the connector.
 *
 * The simulator is an ordinary engine: it drives the connector through its
 * public, engine-agnostic API only (include/kvpool_connector.h, kvp_conn_*),
 * exactly as an inference engine would: one kvp_conn_config per instance,
 * kvp_conn_sched_open for the scheduler, kvp_conn_worker_open +
 * kvp_conn_register_kv_caches per rank, the step bytes of
 * kvp_conn_build_meta handed to every rank's kvp_conn_get_finished, block
 * hashes from kvp_conn_hasher. It never reaches into src/connector/.
 *
 * N engine instances (forked processes), each with one scheduler (the
 * main thread: a kvp_conn_sched, whose lookups go over the instance's unix
 * socket) and pp x tp workers (threads, one kvp_conn_worker each, worker
 * pp_rank * tp + tp_rank; worker 0 is opened first and serves the lookup
 * channel). With --pp the layers are split between
 * the stages: each worker registers only its stage's layers and keys carry
 * its pp_rank. Each worker owns a paged KV cache in host memory: per layer
 * a (2, num_blocks, B, D) byte tensor (K/V planes; MLA: one latent plane).
 * Block 0 is the null block (never allocated). The content of a block is a
 * deterministic function of (block hash = the tokens up to its end, or the
 * tokens of a partial tail, layer, plane, key tp rank, KV-cache group), so
 * every block loaded from the pool is checked against what computing it
 * would give (every byte, or with --verify sample the first and last 64
 * bytes of each plane); a mismatch is a failure (exit 1). Blocks a load
 * will fill are poisoned first, so a block the load skipped cannot pass.
 *
 * KV-cache groups: group 0 full attention; with --swa W a group 1 sliding
 * window of W tokens (same block size) with its own block table in the
 * same tensors. A hit of h blocks leaves group 1's chunks before the
 * window (h - ceil((W-1)/B)) as the null block, as vLLM does; the loaded
 * window is verified.
 *
 * Workload: U users, T turns each; a prompt = shared system prompt + the
 * user's history (earlier prompts and replies) + the new turn. Users are
 * dealt among the instances of a phase (u % n == slot). --roles gives each
 * instance a role (kv_both / kv_producer / kv_consumer in the scheduler and
 * the worker); consumers run in a second phase after every other instance
 * finished and replay the same users' prompts (disaggregated prefill).
 *
 * The engine model, per step: admission (one request per idle user),
 * lookup, allocation of every block the request will need (the table the
 * scheduler sees grows as decode needs blocks), async loads, then a
 * prefill chunk per running request (--chunk N tokens, else the whole
 * rest), or with --decode one token per step until the reply is generated
 * (the sampled tokens are the ones the history gets). No local prefix
 * cache. A finished request's blocks are freed once the worker reports it
 * finished sending (delay_free). Loads that failed (kvp_conn_load_errors)
 * are recomputed from the first failed chunk (everything, with SWA, whose
 * window before that chunk was never loaded) and counted.
 * --preempt-every N preempts the oldest running request every Nth step
 * (recompute mode): its blocks are freed at once (--preempt-free now, as
 * vLLM) or only when it ends (deferred); every worker calls
 * kvp_conn_handle_preemptions before the step's actions reuse them
 * (§14; --no-handle-preemptions skips it, and a save still in flight then
 * stores reused bytes, which later loads report). It is resumed later with
 * a lookup, a load and a resumed cached request whose new table replaces
 * the old one.
 *
 * Each instance reports its counters to the parent over a pipe; the parent
 * prints a progress line (stderr, tty only) and the summary (text or
 * --json): hit rate, tokens loaded / computed / decoded, bytes stored and
 * loaded, GB/s, blocks verified, load errors and blocks recomputed,
 * preemptions, the consumers' own figures, mismatches; --json ends with
 * the run's timeline: the parent samples the instances' counters every
 * TL_MS0 ms, at most TL_MAX samples (when full every other one goes and
 * the interval doubles), each with the hit rate and the GB/s stored and
 * loaded over its interval.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "sim/sim.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"
#include "kvpool_connector.h"

#define HL 32            /* sha256_cbor hash length */
#define VOCAB 50000u
#define DRAIN_MS 60000u  /* bound on finishing in-flight requests at the end */

typedef struct simcfg {
    const char *master;
    int instances, tp, users, turns, sys_tokens, turn_tokens, reply_tokens;
    int block_size, layers, kv_heads, num_blocks, max_running;
    uint64_t block_bytes; /* per block, plane and layer */
    double duration;      /* seconds; 0 = one pass over users x turns */
    int corrupt;          /* self-check: flip a byte of every Nth verified block (0 = never) */
    int mla;              /* MLA: one latent plane per layer, identical on every TP rank */
    int sample;           /* --verify sample: check the first and last 64 bytes of a plane */
    int chunk;            /* chunked prefill: at most this many prompt tokens a step (0 = all) */
    int decode;           /* decode steps generate the reply tokens, one a step */
    int preempt_every;    /* every Nth step preempt a running request (0 = never) */
    int preempt_deferred; /* preempted blocks kept out of reuse until the request ends */
    int no_handle_preemptions; /* diagnosis: skip kvp_conn_handle_preemptions */
    int pp;               /* pipeline stages: an instance has pp x tp workers */
    int swa;              /* sliding window (tokens) of group 1; 0 = one full-attention group */
    int mamba;            /* group 1 is a Mamba group in align mode (boundary states) */
    int nroles;           /* 0: every instance is kv_both; else roles[i % nroles] */
    int roles[64];        /* SIM_BOTH / SIM_PRODUCER / SIM_CONSUMER */
    int log_level;
    uint64_t seed;
    int json;
} simcfg;

enum { SIM_BOTH = 0, SIM_PRODUCER = 1, SIM_CONSUMER = 2 };

static int sim_role(const simcfg *c, int i) { return c->nroles ? c->roles[i % c->nroles] : SIM_BOTH; }
static int sim_groups(const simcfg *c) { return c->swa || c->mamba ? 2 : 1; }
static int sim_workers(const simcfg *c) { return c->tp * c->pp; }
/*
 * TP ranks per distinct KV content: ranks whose keys coincide hold the same
 * bytes, so a block's expected content depends on tp_rank / factor (the key
 * tp rank). The connector's rule (kvp_key_tp_factor, src/connector/keys.c),
 * replicated for what the simulator models (no DCP, no Mamba): MLA stores
 * one latent identical on every rank (factor tp); GQA with more ranks than
 * KV heads has tp / heads ranks per head; else every rank its own.
 */
static int sim_tp_factor(const simcfg *c)
{
    if (c->mla)
        return c->tp;
    int f = c->tp / c->kv_heads;
    return f > 1 ? f : 1;
}
/* Group 1 chunks of a hit of hb blocks that are the null block: with SWA
 * those before the window, with Mamba all but the state at the hit point
 * (vLLM's align mode allocates only that one). */
static uint32_t swa_skip(const simcfg *c, uint32_t hb);
static uint32_t g1_skip(const simcfg *c, uint32_t hb)
{
    return c->mamba ? (hb ? hb - 1 : 0) : swa_skip(c, hb);
}
/* SWA chunks a hit of hb blocks keeps (the load mask's window run). */
static uint32_t swa_need(const simcfg *c)
{
    return ((uint32_t)c->swa - 1 + (uint32_t)c->block_size - 1) / (uint32_t)c->block_size;
}
/* First SWA chunk of a hit of hb blocks that is not the null block. */
static uint32_t swa_skip(const simcfg *c, uint32_t hb)
{
    return c->swa && hb > swa_need(c) ? hb - swa_need(c) : 0;
}

/* What an instance reports to the parent (fixed-size pipe record). */
typedef struct simstats {
    uint64_t requests, prompt_tokens, lookup_hit_tokens, loaded_tokens, computed_tokens;
    uint64_t bytes_stored, bytes_loaded, store_ns, load_ns, puts, gets;
    uint64_t load_errors, mismatches, blocks_verified, steps;
    uint64_t blocks_recomputed, load_error_reqs; /* loads cut short by an error, recomputed */
    uint64_t swa_verified;                       /* of blocks_verified: group 1 (SWA / Mamba) */
    uint64_t mamba_puts;                         /* Mamba boundary states handed off */
    uint64_t decode_tokens;                      /* tokens computed by decode steps */
    uint64_t prefill_chunks;                     /* prefill schedulings (> requests: chunked) */
    uint64_t preemptions, resumed;               /* requests preempted; resumed afterwards */
    uint64_t replayed_tokens;                    /* recomputed after a preemption */
    uint64_t replay_loaded_tokens;               /* loaded again after a preemption */
    uint64_t workers, workers_verified;          /* workers; those that verified a block */
    uint64_t hit_requests, hit_blocks;           /* loads started after a lookup hit; their
                                                    blocks (group 0) */
    uint64_t store_keys, store_failed_keys;      /* keys the workers put; refused (-200, ...) */
    uint64_t lookup_size_misses;                 /* keys a lookup found with another size */
    int32_t done, failed, role;
} simstats;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint32_t tok(uint64_t seed, uint64_t a, uint64_t b, uint64_t i)
{
    return (uint32_t)(mix64(seed ^ mix64(a * 0x100000001B3ull ^ mix64(b + 7) ^ (i << 20))) %
                      VOCAB);
}

/* ------------------------------------------------------------ KV content */

static uint64_t hash_seed(const uint8_t *h)
{
    uint64_t s;
    memcpy(&s, h, sizeof s);
    return s;
}

static uint64_t plane_base(uint64_t seed, int layer, int plane, int krank, int group)
{
    uint64_t b = mix64(seed ^ mix64((uint64_t)(layer + 1) * 0x51ull) ^
                       mix64((uint64_t)(plane + 1) * 0x1F3ull + ((uint64_t)(krank + 1) << 32)));
    return group ? mix64(b ^ ((uint64_t)group * 0xD6E8FEB86659FD93ull)) : b;
}

/* Word i of a plane is base ^ (i * GOLDEN): every byte depends on the block
 * seed, neighbouring words differ, and fill and check run at memory speed
 * (two words per SSE2 vector), so verifying every loaded byte stays cheap
 * next to the transfer it checks. */
#define GOLDEN 0x9E3779B97F4A7C15ull
typedef uint64_t v2u64 __attribute__((vector_size(16))); /* SSE2: no spills */

static void plane_fill(uint8_t *dst, uint64_t len, uint64_t base)
{
    uint64_t n = len / 8, i = 0;
    v2u64 acc = {0, GOLDEN}, b = {base, base};
    const v2u64 step = {2 * GOLDEN, 2 * GOLDEN};
    for (; i + 2 <= n; i += 2, acc += step) {
        v2u64 w = b ^ acc;
        memcpy(dst + i * 8, &w, sizeof w);
    }
    for (uint64_t a = i * GOLDEN; i < n; i++, a += GOLDEN) {
        uint64_t w = base ^ a;
        memcpy(dst + i * 8, &w, 8);
    }
}

/* Checks len bytes at src against words [w0, w0 + len/8) of a plane. */
static int plane_check_at(const uint8_t *src, uint64_t len, uint64_t base, uint64_t w0)
{
    uint64_t n = len / 8, i = 0, a0 = w0 * GOLDEN;
    v2u64 acc0 = {a0, a0 + GOLDEN}, acc1 = {a0 + 2 * GOLDEN, a0 + 3 * GOLDEN};
    v2u64 b = {base, base}, d0 = {0, 0}, d1 = {0, 0};
    const v2u64 step = {4 * GOLDEN, 4 * GOLDEN};
    for (; i + 4 <= n; i += 4, acc0 += step, acc1 += step) {
        v2u64 w0v, w1v;
        memcpy(&w0v, src + i * 8, sizeof w0v);
        memcpy(&w1v, src + i * 8 + 16, sizeof w1v);
        d0 |= w0v ^ b ^ acc0;
        d1 |= w1v ^ b ^ acc1;
    }
    d0 |= d1;
    uint64_t d = d0[0] | d0[1];
    for (uint64_t a = a0 + i * GOLDEN; i < n; i++, a += GOLDEN) {
        uint64_t w;
        memcpy(&w, src + i * 8, 8);
        d |= w ^ base ^ a;
    }
    return d == 0;
}

/* The whole plane, or with --verify sample its first and last 64 bytes:
 * that catches a wrong block, a wrong piece, a block the load skipped
 * (poisoned at its start) and a short piece, not a damaged byte in the
 * middle. */
static int plane_check(const uint8_t *src, uint64_t len, uint64_t base, int sample)
{
    if (!sample || len <= 128)
        return plane_check_at(src, len, base, 0);
    uint64_t tail = len / 8 - 8;
    return plane_check_at(src, 64, base, 0) && plane_check_at(src + tail * 8, 64, base, tail);
}

/* ------------------------------------------------------------ instance */

/* One rank's work item for a step, over chunks [from, to) of one group's
 * block table: verify a load, compute (fill), or poison blocks a load is
 * about to fill (so a block the load skipped cannot pass as loaded). The
 * null block (id 0) is never touched. */
enum { A_VERIFY, A_COMPUTE, A_POISON };
typedef struct action {
    int kind, group;
    const uint32_t *blocks;
    const uint8_t *hashes; /* hash k seeds block k when k < nfull */
    uint32_t nfull;
    uint64_t tail_seed;
    uint32_t from, to;
} action;

struct inst;

typedef struct rank {
    struct inst *in;
    int r, krank, pp;   /* tp rank, key tp rank, pp rank */
    int l0, nl;         /* this stage's layers: [l0, l0 + nl) of the model */
    kvp_conn_worker *w;
    uint8_t **layer; /* per local layer: planes x num_blocks x block_bytes */
    pthread_t th;
    uint64_t seen_gen;
    /* results of the last step */
    kvp_conn_ids ds, dr;
    uint32_t *errs; /* kvp_conn_load_errors: freed with kvp_conn_free */
    size_t nerrs;
    int rc;
    uint64_t mismatches, verified, verified_swa;
} rank;

typedef struct inst {
    const simcfg *c;
    int idx;
    rank *ranks; /* pp x tp workers, worker pp_rank * tp + tp_rank */
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;
    int ndone, quit;
    /* the current step */
    const uint8_t *bytes;
    size_t len;
    const char *const *fin;
    size_t nfin;
    const char *const *pre; /* requests preempted by this step's scheduler */
    size_t npre;
    const action *acts;
    size_t nacts;
} inst;

static uint8_t *blk(const rank *k, int layer, int plane, uint32_t b)
{
    const simcfg *c = k->in->c;
    return k->layer[layer] + ((uint64_t)plane * (uint64_t)c->num_blocks + b) * c->block_bytes;
}

static uint64_t block_seed(const action *a, uint32_t k)
{
    return k < a->nfull ? hash_seed(a->hashes + (size_t)k * HL) : mix64(a->tail_seed);
}

static void run_action(rank *k, const action *a)
{
    const simcfg *c = k->in->c;
    int nplanes = c->mla ? 1 : 2;
    for (uint32_t i = a->from; i < a->to; i++) {
        uint32_t b = a->blocks[i];
        if (b == 0) /* the null block */
            continue;
        if (a->kind == A_POISON) {
            for (int l = 0; l < k->nl; l++)
                for (int p = 0; p < nplanes; p++)
                    memset(blk(k, l, p, b), 0xA5, 8);
            continue;
        }
        uint64_t s = block_seed(a, i);
        int bad = 0, verify = a->kind == A_VERIFY;
        /* a Mamba state is rank-specific (TP factor 1): its own rank's bytes */
        int krank = a->group == 1 && c->mamba ? k->r : k->krank;
        if (verify && c->corrupt && (k->verified + 1) % (uint64_t)c->corrupt == 0)
            blk(k, 0, 0, b)[0] ^= 0x5A; /* --corrupt: the check must see it */
        for (int l = 0; l < k->nl; l++)
            for (int p = 0; p < nplanes; p++) {
                uint64_t base = plane_base(s, k->l0 + l, p, krank, a->group);
                if (verify)
                    bad |= !plane_check(blk(k, l, p, b), c->block_bytes, base, c->sample);
                else
                    plane_fill(blk(k, l, p, b), c->block_bytes, base);
            }
        if (verify) {
            k->verified++;
            k->verified_swa += a->group == 1;
            if (bad && ++k->mismatches <= 5)
                fprintf(stderr, "kvpool sim: MISMATCH instance %d rank %d pp %d group %d block "
                        "%u (chunk %u)%s\n", k->in->idx, k->r, k->pp, a->group, b, i,
                        k->mismatches == 5 ? " (further mismatches of this rank not shown)" : "");
        }
    }
}

static void *rank_main(void *p)
{
    rank *k = p;
    inst *in = k->in;
    for (;;) {
        pthread_mutex_lock(&in->mu);
        while (!in->quit && in->gen == k->seen_gen)
            pthread_cond_wait(&in->cv_go, &in->mu);
        if (in->quit) {
            pthread_mutex_unlock(&in->mu);
            return NULL;
        }
        k->seen_gen = in->gen;
        pthread_mutex_unlock(&in->mu);

        /* §14: no save of a preempted request may read its blocks once the
         * engine reuses them (the actions below) */
        int prc = in->npre && !in->c->no_handle_preemptions
                      ? kvp_conn_handle_preemptions(k->w, in->pre, in->npre)
                      : 0;
        for (int kind = A_VERIFY; kind <= A_POISON; kind++)
            for (size_t i = 0; i < in->nacts; i++)
                if (in->acts[i].kind == kind)
                    run_action(k, &in->acts[i]);
        /* the step's bytes, decoded by this worker's own mirror of the
         * incremental step metadata: every worker sees every step once */
        int rc = kvp_conn_get_finished(k->w, in->bytes, in->len, in->fin, in->nfin, &k->ds,
                                       &k->dr);
        if (rc == 0)
            rc = kvp_conn_load_errors(k->w, &k->errs, &k->nerrs);
        k->rc = rc ? rc : prc;

        pthread_mutex_lock(&in->mu);
        in->ndone++;
        pthread_cond_signal(&in->cv_done);
        pthread_mutex_unlock(&in->mu);
    }
}

/* Runs one step on every rank and waits for all of them. */
static void inst_step(inst *in)
{
    pthread_mutex_lock(&in->mu);
    in->ndone = 0;
    in->gen++;
    pthread_cond_broadcast(&in->cv_go);
    while (in->ndone < sim_workers(in->c))
        pthread_cond_wait(&in->cv_done, &in->mu);
    pthread_mutex_unlock(&in->mu);
}

/* ------------------------------------------------------------ engine */

enum { R_WAIT, R_LOADING, R_READY, R_RUN, R_FINISHING };

typedef struct user {
    int id;
    uint32_t *hist;
    uint32_t nhist, cap;
    int turn;
    uint64_t epoch;
    int busy;
} user;

typedef struct req {
    char id[96];
    user *u;
    uint32_t *toks, n, ntok; /* n prompt tokens; ntok = n + reply tokens sampled so far */
    uint32_t gen;            /* reply tokens sampled (--decode) */
    uint8_t *hashes;         /* nh of hcap block hashes (HL bytes each) */
    uint32_t nh, hcap;
    kvp_conn_hasher *hasher; /* has seen the first nhashed tokens */
    uint32_t nhashed;
    uint64_t tail_seed;
    uint32_t *blocks[2], nblocks; /* per group; SWA chunks outside the window: 0 */
    uint32_t nalloc;              /* of nblocks (reserved at admission): in the table so far */
    int scheduled;                /* scheduled before: later steps are cached requests */
    int resume;                   /* preempted: its next scheduling is a resumed one */
    int replaying;                /* recomputing after a preemption (until computed = ntok) */
    uint32_t *parked[2];          /* --preempt-free deferred: the blocks it held when preempted */
    int state;
    uint64_t hit, computed;
    uint32_t first_bad; /* first chunk whose load failed (nblocks: none) */
    int recv_cnt, send_cnt;
    kvp_conn_request sr;
    struct req *next;
} req;

typedef struct engine {
    const simcfg *c;
    inst *in;
    kvp_conn_sched *s;
    uint32_t *freel;
    uint32_t nfree;
    uint32_t *sys;
    user *users;
    int nusers;
    req *head;
    int nactive;
    simstats st;
} engine;

static void hist_push(user *u, uint32_t t)
{
    if (u->nhist == u->cap) {
        u->cap = u->cap ? u->cap * 2 : 256;
        u->hist = kvp_realloc(u->hist, (size_t)u->cap * sizeof *u->hist);
        if (!u->hist)
            abort();
    }
    u->hist[u->nhist++] = t;
}

static uint32_t turn_len(const simcfg *c, uint64_t seed, int u, int turn, uint64_t epoch, int base)
{
    if (base <= 1)
        return (uint32_t)(base > 0 ? base : 0);
    uint64_t r = mix64(seed ^ mix64((uint64_t)u * 1000003u + (uint64_t)turn) ^ (epoch << 40));
    return (uint32_t)(base / 2 + (int)(r % (uint64_t)base)); /* [base/2, 3*base/2) */
}

/* Reply token i of the user's current turn (decode samples these; the
 * history gets the same ones). */
static uint32_t reply_tok(const simcfg *c, const user *u, uint32_t i)
{
    return tok(c->seed, 1, ((uint64_t)u->id << 32) ^ (uint64_t)u->turn ^ (u->epoch << 20), i);
}

/* Block hashes of the request's ntok tokens (one per full block, from its
 * kvp_conn_hasher: vLLM's sha256_cbor with PYTHONHASHSEED "0", fed each
 * token once as it becomes known) and the seed of its partial tail block;
 * refreshes the scheduler's view. */
static void req_rehash(engine *e, req *r)
{
    const simcfg *c = e->c;
    uint32_t B = (uint32_t)c->block_size;
    if (r->nhashed < r->ntok) {
        size_t nout = 0;
        if (kvp_conn_hasher_append(r->hasher, r->toks + r->nhashed, r->ntok - r->nhashed,
                                   r->hashes + (size_t)r->nh * HL, r->hcap - r->nh,
                                   &nout) != 0 || r->nh + nout != r->ntok / B)
            abort();
        r->nh += (uint32_t)nout;
        r->nhashed = r->ntok;
    }
    uint64_t ts = r->ntok;
    for (uint32_t i = r->nh * B; i < r->ntok; i++)
        ts = mix64(ts ^ r->toks[i]);
    r->tail_seed = ts ^ (r->nh ? hash_seed(r->hashes + (size_t)(r->nh - 1) * HL) : 0);
    r->sr = (kvp_conn_request){
        .id = {r->id, (uint32_t)strlen(r->id)}, .tokens = r->toks, .num_tokens = r->ntok,
        .prompt_tokens = r->toks, .num_prompt_tokens = r->n,
        .num_computed_tokens = r->sr.num_computed_tokens, .block_hashes = r->hashes,
        .nhashes = r->nh, .hash_len = HL,
    };
}

static req *req_new(engine *e, user *u)
{
    const simcfg *c = e->c;
    uint32_t B = (uint32_t)c->block_size;
    uint32_t nt = turn_len(c, e->c->seed, u->id, u->turn, u->epoch, c->turn_tokens);
    req *r = kvp_calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->u = u;
    snprintf(r->id, sizeof r->id, "i%d-u%d-e%" PRIu64 "-t%d", e->in->idx, u->id, u->epoch,
             u->turn);
    r->n = r->ntok = (uint32_t)c->sys_tokens + u->nhist + nt;
    /* room for the reply tokens decode appends */
    uint32_t cap = r->n + (c->decode ? (uint32_t)c->reply_tokens : 0);
    r->toks = kvp_malloc((size_t)cap * sizeof *r->toks);
    r->hcap = cap / B + 1;
    r->hashes = kvp_malloc((size_t)r->hcap * HL);
    r->nblocks = (cap + B - 1) / B;
    r->nalloc = (r->n + B - 1) / B;
    for (int g = 0; g < sim_groups(c); g++)
        if (!(r->blocks[g] = kvp_calloc((size_t)r->nblocks, sizeof *r->blocks[g])))
            abort();
    if (!r->toks || !r->hashes ||
        kvp_conn_hasher_new("sha256_cbor", "0", B, &r->hasher) != 0 ||
        kvp_conn_hasher_hash_len(r->hasher) != HL)
        abort();
    uint32_t o = 0;
    if (c->sys_tokens)
        memcpy(r->toks, e->sys, (size_t)c->sys_tokens * sizeof *r->toks);
    o += (uint32_t)c->sys_tokens;
    if (u->nhist)
        memcpy(r->toks + o, u->hist, (size_t)u->nhist * sizeof *r->toks);
    o += u->nhist;
    for (uint32_t i = 0; i < nt; i++)
        r->toks[o + i] = tok(c->seed, 2 + (uint64_t)u->id * 4096 + (uint64_t)u->turn,
                             u->epoch, i);
    req_rehash(e, r);
    r->first_bad = r->nblocks;
    return r;
}

static void req_free(req *r)
{
    if (!r)
        return;
    kvp_free(r->toks);
    kvp_free(r->hashes);
    kvp_conn_hasher_free(r->hasher);
    kvp_free(r->blocks[0]);
    kvp_free(r->blocks[1]);
    kvp_free(r->parked[0]);
    kvp_free(r->parked[1]);
    kvp_free(r);
}

static req *req_find(engine *e, const char *id)
{
    for (req *r = e->head; r; r = r->next)
        if (!strcmp(r->id, id))
            return r;
    return NULL;
}

/* The request is over: blocks back, history grows, the user is idle. */
static void req_done(engine *e, req *r)
{
    const simcfg *c = e->c;
    for (int g = 0; g < sim_groups(c); g++)
        for (uint32_t i = 0; i < r->nblocks; i++)
            for (int k = 0; k < 2; k++) {
                uint32_t b = k ? (r->parked[g] ? r->parked[g][i] : 0) : r->blocks[g][i];
                if (b) /* allocated, not the null block */
                    e->freel[e->nfree++] = b;
            }
    user *u = r->u;
    uint32_t nt = r->n - (uint32_t)c->sys_tokens - u->nhist;
    for (uint32_t i = 0; i < nt; i++)
        hist_push(u, r->toks[(uint32_t)c->sys_tokens + u->nhist]);
    uint32_t nr = (uint32_t)c->reply_tokens;
    for (uint32_t i = 0; i < nr; i++)
        hist_push(u, reply_tok(c, u, i));
    u->turn++;
    if (c->duration > 0 && u->turn >= c->turns) { /* a new conversation */
        u->turn = 0;
        u->nhist = 0;
        u->epoch++;
    }
    u->busy = 0;
    for (req **pp = &e->head; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    e->nactive--;
    req_free(r);
}

static void collect_stats(engine *e)
{
    for (int i = 0; i < sim_workers(e->c); i++) {
        kvp_conn_stats ws;
        if (!e->in->ranks[i].w)
            continue;
        kvp_conn_take_stats(e->in->ranks[i].w, &ws);
        e->st.bytes_stored += ws.op[KVP_CONN_OP_STORE].bytes;
        e->st.store_ns += ws.op[KVP_CONN_OP_STORE].total_ns;
        e->st.puts += ws.op[KVP_CONN_OP_STORE].count;
        e->st.bytes_loaded += ws.op[KVP_CONN_OP_LOAD].bytes;
        e->st.load_ns += ws.op[KVP_CONN_OP_LOAD].total_ns;
        e->st.gets += ws.op[KVP_CONN_OP_LOAD].count;
        e->st.store_keys += ws.op[KVP_CONN_OP_STORE].keys;
        e->st.store_failed_keys += ws.op[KVP_CONN_OP_STORE].failed_keys;
        e->st.lookup_size_misses += ws.op[KVP_CONN_OP_LOOKUP].existing_keys;
    }
    uint64_t mm = 0, ver = 0, swa = 0, wv = 0;
    for (int i = 0; i < sim_workers(e->c); i++) {
        mm += e->in->ranks[i].mismatches;
        ver += e->in->ranks[i].verified;
        swa += e->in->ranks[i].verified_swa;
        wv += e->in->ranks[i].verified > 0;
    }
    e->st.swa_verified = swa;
    e->st.workers = (uint64_t)sim_workers(e->c);
    e->st.workers_verified = wv;
    e->st.mismatches = mm;
    e->st.blocks_verified = ver;
}

static void report(int fd, const simstats *st)
{
    ssize_t w = write(fd, st, sizeof *st);
    (void)w; /* the parent may be gone: nothing to do */
}

/* The scheduler loop of one instance. Returns 0, or -1 on an engine error. */
/*
 * --mamba: what vLLM's core does in align mode for a step computing tokens
 * [computed, computed + k) of r. The state after the step's last full block
 * and, when the step reaches it, after the prompt's checkpoint position
 * (get_mamba_prefill_checkpoint_position: (n - 1) / B * B) is written into
 * the group-1 block at that boundary (contents: a function of the prefix
 * hash there, the layer, the rank) and handed off as the step's
 * boundary_state_offloads (group 1, that block, boundary). Returns the
 * actions added; appends the hand-offs to tails / treq.
 */
static size_t mamba_states(engine *e, req *r, uint64_t k, action *acts, kvp_conn_tail *tails,
                           size_t *ntails, kvp_conn_tail_req *treq, size_t *ntreq)
{
    uint64_t B = (uint64_t)e->c->block_size, end = r->computed + k;
    uint64_t last = end / B * B, ckpt = r->n ? (uint64_t)(r->n - 1) / B * B : 0, bd[2];
    int nbd = 0;
    if (ckpt > r->computed && ckpt < last)
        bd[nbd++] = ckpt;
    if (last > r->computed)
        bd[nbd++] = last;
    kvp_conn_tail *tl = tails + *ntails;
    uint32_t nt = 0;
    size_t na = 0;
    for (int i = 0; i < nbd; i++) {
        uint32_t idx = (uint32_t)(bd[i] / B - 1), b = r->blocks[1][idx];
        if (!b)
            continue; /* the null block: nothing of this request lives there */
        acts[na++] = (action){.kind = A_COMPUTE, .group = 1, .blocks = r->blocks[1],
                              .hashes = r->hashes, .nfull = r->nh, .tail_seed = r->tail_seed,
                              .from = idx, .to = idx + 1};
        tl[nt++] = (kvp_conn_tail){.group = 1, .cow_block_id = b, .boundary_tokens = bd[i]};
    }
    if (nt) {
        treq[(*ntreq)++] = (kvp_conn_tail_req){.id = {r->id, (uint32_t)strlen(r->id)},
                                               .tails = tl, .ntails = nt};
        *ntails += nt;
        e->st.mamba_puts += nt;
    }
    return na;
}

static int engine_run(engine *e, int fd)
{
    const simcfg *c = e->c;
    uint64_t t0 = now_ns(), last_report = 0;
    uint64_t dur_ns = (uint64_t)(c->duration * 1e9);
    uint64_t drain_deadline = 0;
    size_t cap = (size_t)c->max_running + 8;
    int ng = sim_groups(c), nw = sim_workers(c);
    uint32_t B = (uint32_t)c->block_size;
    kvp_conn_new_req *nr = kvp_calloc(cap, sizeof *nr);
    kvp_conn_cached_req *cr = kvp_calloc(cap, sizeof *cr);
    kvp_conn_blocks *nids = kvp_calloc(cap * 2, sizeof *nids);
    kvp_conn_blocks *cids = kvp_calloc(cap * 2, sizeof *cids);
    uint64_t *sched_k = kvp_calloc(cap, sizeof *sched_k);
    action *acts = kvp_calloc(cap * 8, sizeof *acts);
    kvp_conn_tail *tails = kvp_calloc(cap * 2, sizeof *tails); /* --mamba hand-offs */
    kvp_conn_tail_req *treq = kvp_calloc(cap, sizeof *treq);
    req **ran = kvp_calloc(cap, sizeof *ran);
    kvp_conn_str *fin = kvp_calloc(cap, sizeof *fin);
    const char **finp = kvp_calloc(cap, sizeof *finp);
    size_t nfin = 0;
    int ret = 0;
    if (!nr || !cr || !nids || !cids || !sched_k || !acts || !ran || !fin || !finp || !tails ||
        !treq)
        abort();
    for (;;) {
        uint64_t now = now_ns();
        bool admitting = c->duration > 0 ? now - t0 < dur_ns : true;
        /* admission: one request per idle user with a turn left */
        for (int i = 0; admitting && i < e->nusers && e->nactive < c->max_running; i++) {
            user *u = &e->users[i];
            if (u->busy || (c->duration <= 0 && u->turn >= c->turns))
                continue;
            req *r = req_new(e, u);
            if (!r)
                abort();
            u->busy = 1;
            r->state = R_WAIT;
            req **pp = &e->head;
            while (*pp)
                pp = &(*pp)->next;
            *pp = r;
            e->nactive++;
        }
        if (!e->nactive && nfin == 0)
            break;
        if (!admitting && !drain_deadline)
            drain_deadline = now + (uint64_t)DRAIN_MS * 1000000ull;
        if (drain_deadline && now > drain_deadline) {
            fprintf(stderr, "kvpool sim: instance %d: %d requests did not finish in time\n",
                    e->in->idx, e->nactive);
            ret = -1;
            break;
        }
        /* preemption (recompute mode): every --preempt-every steps the
         * oldest running request loses its blocks at once (no delay, as in
         * vLLM) and waits to be resumed */
        kvp_conn_str pre = {NULL, 0};
        if (c->preempt_every && (e->st.steps + 1) % (uint64_t)c->preempt_every == 0)
            for (req *r = e->head; r; r = r->next) {
                /* deferred: once per request (one parked set at most) */
                if (r->state != R_RUN || (c->preempt_deferred && r->parked[0]))
                    continue;
                for (int g = 0; c->preempt_deferred && g < ng; g++) {
                    r->parked[g] = r->blocks[g];
                    if (!(r->blocks[g] = kvp_calloc(r->nblocks, sizeof *r->blocks[g])))
                        abort();
                }
                for (int g = 0; !c->preempt_deferred && g < ng; g++)
                    for (uint32_t i = 0; i < r->nblocks; i++) {
                        if (r->blocks[g][i])
                            e->freel[e->nfree++] = r->blocks[g][i];
                        r->blocks[g][i] = 0;
                    }
                r->state = R_WAIT;
                r->resume = 1;
                r->computed = r->hit = 0;
                r->recv_cnt = 0;
                r->first_bad = r->nblocks;
                r->sr.num_computed_tokens = 0;
                r->nalloc = (r->ntok + B - 1) / B;
                pre = (kvp_conn_str){r->id, (uint32_t)strlen(r->id)};
                e->st.preemptions++;
                break;
            }
        /* schedule */
        size_t nnew = 0, ncached = 0, nran = 0, nacts = 0, ntails = 0, ntreq = 0;
        for (req *r = e->head; r; r = r->next) {
            if (r->state == R_WAIT) {
                if (e->nfree < r->nblocks * (uint32_t)ng || pre.p == r->id)
                    continue; /* no room, or preempted in this very step */
                uint64_t num_new = 0;
                bool async = false;
                int lrc = kvp_conn_get_num_new_matched_tokens(e->s, &r->sr, 0, &num_new, &async);
                if (lrc == KVP_CONN_PENDING)
                    continue;
                if (lrc != 0)
                    num_new = 0;
                /* every block the request will need is reserved now; the
                 * table grows as decode needs them (nalloc). SWA: chunks
                 * before the window of the hit stay the null block. */
                uint32_t skip = g1_skip(c, (uint32_t)(num_new / B));
                for (int g = 0; g < ng; g++)
                    for (uint32_t i = 0; i < r->nblocks; i++)
                        r->blocks[g][i] = g == 1 && i < skip ? 0 : e->freel[--e->nfree];
                kvp_conn_blocks ids[2] = {{r->blocks[0], r->nalloc}, {r->blocks[1], r->nalloc}};
                e->st.lookup_hit_tokens += num_new;
                if (kvp_conn_update_state_after_alloc(e->s, &r->sr, ids, (uint32_t)ng,
                                                      num_new) != 0) {
                    fprintf(stderr, "kvpool sim: update_state_after_alloc failed\n");
                    ret = -1;
                    goto out;
                }
                r->hit = num_new;
                if (num_new > 0 && async) {
                    e->st.hit_requests++;
                    e->st.hit_blocks += num_new / B;
                    /* the load fills these blocks; poison them first */
                    for (int g = 0; g < ng; g++)
                        acts[nacts++] = (action){.kind = A_POISON, .group = g,
                                                 .blocks = r->blocks[g], .from = 0,
                                                 .to = (uint32_t)(num_new / B)};
                    r->state = R_LOADING;
                    continue;
                }
                r->computed = 0;
            } else if (r->state == R_READY) {
                uint64_t ok = r->hit;
                if (r->first_bad < r->nblocks) {
                    /* recompute from the first failed chunk; with SWA the window
                     * before it was never loaded: recompute everything */
                    uint64_t fb = c->swa || c->mamba ? 0 : (uint64_t)r->first_bad * B;
                    if (fb < ok) {
                        e->st.blocks_recomputed += (ok - fb) / B;
                        e->st.load_error_reqs++;
                        ok = fb;
                    }
                }
                r->computed = ok;
                if (r->resume)
                    e->st.replay_loaded_tokens += ok;
                else
                    e->st.loaded_tokens += ok;
                uint32_t okb = (uint32_t)(ok / B);
                for (int g = 0; ok && g < ng; g++)
                    acts[nacts++] = (action){.kind = A_VERIFY, .group = g,
                                             .blocks = r->blocks[g], .hashes = r->hashes,
                                             .nfull = r->nh, .tail_seed = r->tail_seed,
                                             .from = g ? g1_skip(c, okb) : 0, .to = okb};
            } else if (r->state != R_RUN) {
                continue;
            }
            /* this step: a prefill chunk (--chunk, else the whole rest of the
             * prompt; after a preemption, of every token so far) or one
             * decode token (the last one sampled) */
            uint64_t k = r->ntok - r->computed;
            if (c->chunk && k > (uint64_t)c->chunk)
                k = (uint64_t)c->chunk;
            uint32_t newb = 0; /* decode: the table grows by a block */
            while ((r->computed + k + B - 1) / B > r->nalloc && r->nalloc < r->nblocks) {
                r->nalloc++;
                newb++;
            }
            r->sr.num_computed_tokens = r->computed;
            for (int g = 0; g < (c->mamba ? 1 : ng); g++)
                acts[nacts++] = (action){.kind = A_COMPUTE, .group = g, .blocks = r->blocks[g],
                                         .hashes = r->hashes, .nfull = r->nh,
                                         .tail_seed = r->tail_seed,
                                         .from = (uint32_t)(r->computed / B),
                                         .to = (uint32_t)((r->computed + k + B - 1) / B)};
            if (c->mamba)
                nacts += mamba_states(e, r, k, acts + nacts, tails, &ntails, treq, &ntreq);
            if (!r->scheduled) { /* scheduled_new_reqs: the whole table */
                for (int g = 0; g < ng; g++)
                    nids[nnew * 2 + (size_t)g] = (kvp_conn_blocks){r->blocks[g], r->nalloc};
                nr[nnew] = (kvp_conn_new_req){.req = &r->sr, .num_scheduled_tokens = k,
                                              .blocks = &nids[nnew * 2], .ngroups = (uint32_t)ng};
                nnew++;
                r->scheduled = 1;
                r->state = R_RUN;
                e->st.requests++;
                e->st.prompt_tokens += r->n;
            } else if (r->resume) { /* scheduled_cached_reqs, resumed: the full table */
                for (int g = 0; g < ng; g++)
                    cids[ncached * 2 + (size_t)g] = (kvp_conn_blocks){r->blocks[g], r->nalloc};
                cr[ncached] = (kvp_conn_cached_req){
                    .req = &r->sr, .resumed = true, .num_scheduled_tokens = k,
                    .blocks = &cids[ncached * 2], .ngroups = (uint32_t)ng};
                ncached++;
                r->resume = 0;
                r->replaying = 1;
                r->state = R_RUN;
                e->st.resumed++;
            } else { /* scheduled_cached_reqs, running: this step's new blocks */
                for (int g = 0; g < ng; g++)
                    cids[ncached * 2 + (size_t)g] =
                        (kvp_conn_blocks){r->blocks[g] + r->nalloc - newb, newb};
                cr[ncached] = (kvp_conn_cached_req){
                    .req = &r->sr, .num_scheduled_tokens = k,
                    .blocks = newb ? &cids[ncached * 2] : NULL,
                    .ngroups = newb ? (uint32_t)ng : 0};
                ncached++;
            }
            if (r->replaying) {
                e->st.replayed_tokens += k;
            } else if (r->computed < r->n) {
                e->st.computed_tokens += k;
                e->st.prefill_chunks++;
            } else {
                e->st.decode_tokens += k;
            }
            sched_k[nran] = k;
            ran[nran++] = r;
        }
        kvp_conn_step step = {.new_reqs = nr, .n_new = (uint32_t)nnew, .cached = cr,
                              .n_cached = (uint32_t)ncached, .preempted = pre.p ? &pre : NULL,
                              .n_preempted = pre.p ? 1 : 0, .finished = fin,
                              .n_finished = (uint32_t)nfin, .tails = treq,
                              .n_tails = (uint32_t)ntreq};
        const uint8_t *bytes; /* valid until the next call on e->s: the ranks are done
                                 with them when inst_step returns */
        size_t len;
        int rc = kvp_conn_build_meta(e->s, &step, &bytes, &len);
        if (rc != 0) {
            fprintf(stderr, "kvpool sim: build_meta: %s\n", kvp_err_name(rc));
            ret = -1;
            goto out;
        }
        for (size_t i = 0; i < nfin; i++)
            finp[i] = fin[i].p;
        inst *in = e->in;
        in->bytes = bytes;
        in->len = len;
        in->fin = finp;
        in->nfin = nfin;
        const char *pre_ids[1] = {pre.p};
        in->pre = pre_ids;
        in->npre = pre.p ? 1 : 0;
        in->acts = acts;
        in->nacts = nacts;
        inst_step(in);
        e->st.steps++;
        for (size_t i = 0; i < nfin; i++)
            kvp_free((void *)fin[i].p);
        nfin = 0;
        /* aggregate the ranks' answers: errors first, then finished sets */
        for (int k = 0; k < nw; k++) {
            rank *rk = &in->ranks[k];
            if (rk->rc != 0) {
                fprintf(stderr, "kvpool sim: rank %d: get_finished: %s\n", k,
                        kvp_err_name(rk->rc));
                ret = -1;
            }
            for (size_t j = 0; j < rk->nerrs; j++) {
                e->st.load_errors++;
                for (req *r = e->head; r; r = r->next)
                    if (r->state == R_LOADING || r->state == R_READY)
                        for (int g = 0; g < ng; g++)
                            for (uint32_t b = 0; b < r->nblocks; b++)
                                if (rk->errs[j] && r->blocks[g][b] == rk->errs[j] &&
                                    b < r->first_bad)
                                    r->first_bad = b;
            }
            kvp_conn_free(rk->errs);
            rk->errs = NULL;
            rk->nerrs = 0;
        }
        for (int k = 0; k < nw; k++) {
            rank *rk = &in->ranks[k];
            for (size_t j = 0; j < rk->dr.n; j++) {
                req *r = req_find(e, rk->dr.ids[j]);
                if (r && r->state == R_LOADING && ++r->recv_cnt == nw)
                    r->state = R_READY;
            }
            for (size_t j = 0; j < rk->ds.n; j++) {
                req *r = req_find(e, rk->ds.ids[j]);
                if (r && r->state == R_FINISHING && ++r->send_cnt == nw)
                    req_done(e, r);
            }
            kvp_conn_ids_free(&rk->ds);
            kvp_conn_ids_free(&rk->dr);
        }
        if (ret)
            goto out;
        /* advance the requests run in this step: sample a reply token
         * (--decode) or finish once the prompt is done */
        for (size_t i = 0; i < nran; i++) {
            req *r = ran[i];
            r->computed += sched_k[i];
            if (r->computed < r->ntok)
                continue; /* chunked prefill (or the replay) goes on */
            r->replaying = 0;
            if (c->decode && r->gen < (uint32_t)c->reply_tokens) {
                r->toks[r->ntok++] = reply_tok(c, r->u, r->gen++);
                req_rehash(e, r);
                continue;
            }
            kvp_conn_blocks ids[2] = {{r->blocks[0], r->nalloc}, {r->blocks[1], r->nalloc}};
            bool delay = false;
            if (kvp_conn_request_finished(e->s, r->sr.id, ids, (uint32_t)ng, &delay) != 0) {
                fprintf(stderr, "kvpool sim: request_finished failed\n");
                ret = -1;
                goto out;
            }
            fin[nfin].p = kvp_strdup(r->id);
            fin[nfin].len = (uint32_t)strlen(r->id);
            nfin++;
            if (delay)
                r->state = R_FINISHING;
            else
                req_done(e, r);
        }
        if (nran == 0 && nfin == 0)
            usleep(500);
        if (now - last_report > 50000000ull) { /* 50 ms: the parent's timeline */
            collect_stats(e);
            report(fd, &e->st);
            last_report = now;
        }
    }
out:
    for (size_t i = 0; i < nfin; i++)
        kvp_free((void *)fin[i].p);
    kvp_free(nr);
    kvp_free(cr);
    kvp_free(nids);
    kvp_free(cids);
    kvp_free(sched_k);
    kvp_free(acts);
    kvp_free(tails);
    kvp_free(treq);
    kvp_free(ran);
    kvp_free(fin);
    kvp_free(finp);
    return ret;
}

/* One engine instance (a forked child). Writes simstats records to fd. */
static int instance_main(const simcfg *c, int idx, int slot, int nslots, int fd)
{
    inst in;
    memset(&in, 0, sizeof in);
    in.c = c;
    in.idx = idx;
    pthread_mutex_init(&in.mu, NULL);
    pthread_cond_init(&in.cv_go, NULL);
    pthread_cond_init(&in.cv_done, NULL);
    engine e;
    memset(&e, 0, sizeof e);
    e.c = c;
    e.in = &in;
    int ret = 1, nstarted = 0;
    char sock[108];
    snprintf(sock, sizeof sock, "/tmp/kvpool-sim-%d-%d.sock", (int)getpid(), idx);
    /* the model name carries the cache geometry: runs with another layout
     * never read each other's blocks */
    char model[128];
    char extra[64] = "";
    if (c->pp > 1 || c->swa || c->mamba)
        snprintf(extra, sizeof extra, "-pp%d-swa%d%s", c->pp, c->swa, c->mamba ? "-mamba" : "");
    snprintf(model, sizeof model, "org/kvpool-sim-%s-l%d-b%d-s%" PRIu64 "%s",
             c->mla ? "mla" : "gqa", c->layers, c->block_size, c->block_bytes, extra);
    int role = sim_role(c, idx), nw = sim_workers(c);
    e.st.role = role;
    char store_cfg[512];
    snprintf(store_cfg, sizeof store_cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\"}",
             c->master);

    in.ranks = kvp_calloc((size_t)nw, sizeof *in.ranks);
    e.freel = kvp_malloc((size_t)c->num_blocks * sizeof *e.freel);
    e.sys = kvp_malloc((size_t)(c->sys_tokens ? c->sys_tokens : 1) * sizeof *e.sys);
    if (!in.ranks || !e.freel || !e.sys)
        goto done;
    for (int i = 0; i < c->num_blocks - 1; i++) /* block 0 is the null block */
        e.freel[e.nfree++] = (uint32_t)(c->num_blocks - 1 - i);
    for (int i = 0; i < c->sys_tokens; i++)
        e.sys[i] = tok(c->seed, 0, 0, (uint64_t)i);

    int factor = sim_tp_factor(c);
    /* group 0: full attention; --swa: group 1, sliding window, same block
     * size (so the scheduler and hash block sizes are B too). Both address
     * the same tensors by block id. */
    kvp_conn_group g[2] = {
        {.kind = KVP_CONN_FULL_ATTENTION, .block_size = (uint32_t)c->block_size,
         .mla = c->mla != 0, .num_kv_heads = (uint32_t)c->kv_heads},
        {.kind = KVP_CONN_SLIDING_WINDOW, .block_size = (uint32_t)c->block_size,
         .sliding_window = (uint32_t)c->swa, .mla = c->mla != 0,
         .num_kv_heads = (uint32_t)c->kv_heads},
    };
    if (c->mamba) /* --mamba: group 1 a Mamba group in align mode, same block size */
        g[1] = (kvp_conn_group){.kind = KVP_CONN_MAMBA, .block_size = (uint32_t)c->block_size};
    /* one configuration for the scheduler and every rank (the ranks differ
     * in tp_rank / pp_rank only) */
    kvp_conn_config cc;
    kvp_conn_config_default(&cc);
    cc.model = model;
    cc.role = role == SIM_CONSUMER   ? KVP_CONN_CONSUMER
              : role == SIM_PRODUCER ? KVP_CONN_PRODUCER
                                     : KVP_CONN_BOTH;
    cc.groups = g;
    cc.ngroups = (size_t)sim_groups(c);
    cc.lookup_socket = sock;
    cc.store_config = store_cfg;
    cc.tp_size = c->tp;
    cc.pp_size = c->pp;
    cc.num_blocks = (size_t)c->num_blocks;
    cc.recv_threads = 2;
    size_t nplanes = c->mla ? 1 : 2;
    uint64_t plane = (uint64_t)c->num_blocks * c->block_bytes;
    for (int wi = 0; wi < nw; wi++) {
        rank *k = &in.ranks[wi];
        int r = wi % c->tp, pp = wi / c->tp;
        k->in = &in;
        k->r = r;
        k->pp = pp;
        k->krank = r / factor;
        /* PP: stage pp holds layers [l0, l0 + nl) */
        k->l0 = c->layers * pp / c->pp;
        k->nl = c->layers * (pp + 1) / c->pp - k->l0;
        k->layer = kvp_calloc((size_t)k->nl, sizeof *k->layer);
        if (!k->layer)
            goto done;
        kvp_conn_tensor t[64];
        for (int l = 0; l < k->nl; l++) {
            k->layer[l] = kvp_calloc(1, nplanes * plane);
            if (!k->layer[l])
                goto done;
            size_t d = (size_t)(c->block_bytes / (uint64_t)c->block_size);
            t[l] = (kvp_conn_tensor){
                .base = k->layer[l], .storage_len = nplanes * plane, .elem_size = 1, .ndim = 4,
                .shape = {2, (size_t)c->num_blocks, (size_t)c->block_size, d},
                .stride = {plane, c->block_bytes, d, 1},
            };
            if (c->mla) /* blocks-first (num_blocks, B, latent) */
                t[l] = (kvp_conn_tensor){
                    .base = k->layer[l], .storage_len = plane, .elem_size = 1, .ndim = 3,
                    .shape = {(size_t)c->num_blocks, (size_t)c->block_size, d},
                    .stride = {c->block_bytes, d, 1},
                };
        }
        /* worker 0 (tp_rank 0, pp_rank 0) is opened first: it serves the
         * lookup channel the scheduler opened below connects to */
        cc.tp_rank = r;
        cc.pp_rank = pp;
        char err[256] = "";
        int rc = kvp_conn_worker_open(&cc, &k->w, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "kvpool sim: instance %d rank %d pp %d: %s (%s)\n", idx, r, pp, err,
                    kvp_err_name(rc));
            goto done;
        }
        if ((rc = kvp_conn_register_kv_caches(k->w, t, (size_t)k->nl)) != 0) {
            fprintf(stderr, "kvpool sim: register_kv_caches: %s\n", kvp_err_name(rc));
            goto done;
        }
    }
    {
        char err[256] = "";
        int rc = kvp_conn_sched_open(&cc, &e.s, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "kvpool sim: instance %d: scheduler: %s (%s)\n", idx, err,
                    kvp_err_name(rc));
            goto done;
        }
    }
    for (int r = 0; r < nw; r++) {
        if (pthread_create(&in.ranks[r].th, NULL, rank_main, &in.ranks[r]) != 0)
            goto done;
        nstarted++;
    }
    /* this instance's users: u % nslots == slot (slot: its index among the
     * instances of its phase, see kvp_sim_main) */
    e.users = kvp_calloc((size_t)c->users, sizeof *e.users);
    if (!e.users)
        goto done;
    for (int u = slot; u < c->users; u += nslots)
        e.users[e.nusers++].id = u;
    ret = engine_run(&e, fd) == 0 ? 0 : 1;
done:
    pthread_mutex_lock(&in.mu);
    in.quit = 1;
    pthread_cond_broadcast(&in.cv_go);
    pthread_mutex_unlock(&in.mu);
    for (int r = 0; r < nstarted; r++)
        pthread_join(in.ranks[r].th, NULL);
    while (e.head)
        req_done(&e, e.head);
    kvp_conn_sched_close(e.s); /* no lookup reaches worker 0 any more */
    for (int r = 0; in.ranks && r < nw; r++)
        if (in.ranks[r].w)
            kvp_conn_worker_drain(in.ranks[r].w);
    if (in.ranks)
        collect_stats(&e);
    for (int r = 0; in.ranks && r < nw; r++) {
        rank *k = &in.ranks[r];
        kvp_conn_worker_close(k->w); /* worker 0: stops serving the lookup channel */
        kvp_conn_ids_free(&k->ds);
        kvp_conn_ids_free(&k->dr);
        kvp_conn_free(k->errs);
        for (int l = 0; k->layer && l < k->nl; l++)
            kvp_free(k->layer[l]);
        kvp_free(k->layer);
    }
    for (int i = 0; i < e.nusers; i++)
        kvp_free(e.users[i].hist);
    kvp_free(e.users);
    kvp_free(in.ranks);
    kvp_free(e.freel);
    kvp_free(e.sys);
    e.st.done = 1;
    e.st.failed = ret != 0 || e.st.mismatches != 0;
    report(fd, &e.st);
    return ret;
}

/* ------------------------------------------------------------ parent */

static void usage(void)
{
    printf("usage: kvpool sim [--master HOST:PORT] [--instances N] [--tp N] [--users N]\n"
           "                  [--turns N] [--system-prompt-tokens N] [--turn-tokens N]\n"
           "                  [--reply-tokens N] [--duration SECONDS] [--seed N] [--json]\n"
           "                  [--block-size N] [--layers N] [--block-bytes N] [--num-blocks N]\n"
           "                  [--kv-heads N] [--mla] [--max-running N] [--log-level L]\n"
           "                  [--corrupt N] [--pp N] [--swa WINDOW] [--roles LIST]\n"
           "                  [--verify full|sample] [--chunk N] [--decode]\n"
           "                  [--preempt-every N] [--preempt-free now|deferred]\n"
           "                  [--no-handle-preemptions] [--mamba]\n\n"
           "Simulates engine instances (processes) with TP ranks (threads) driving the\n"
           "connector against a running pool, checking every loaded block.\n\n"
           "  --master HOST:PORT          the pool's master (default $KVPOOL_MASTER, else\n"
           "                              127.0.0.1:50051)\n"
           "  --instances N               engine instances (default 2)\n"
           "  --tp N                      TP ranks per instance (default 2)\n"
           "  --users N                   users, user u served by instance u %% N (default 8)\n"
           "  --turns N                   turns per conversation (default 4)\n"
           "  --system-prompt-tokens N    shared system prompt (default 512)\n"
           "  --turn-tokens N             mean new tokens per turn (default 128)\n"
           "  --reply-tokens N            reply tokens added to the history (default 64)\n"
           "  --duration SECONDS          keep starting conversations this long; 0 = one\n"
           "                              pass of users x turns (default 10)\n"
           "  --seed N                    workload seed (default 1)\n"
           "  --json                      summary as JSON on stdout (ending with a timeline:\n"
           "                              hit rate and GB/s per interval)\n"
           "  --block-size N              tokens per KV block (default 16)\n"
           "  --layers N                  layers (default 2)\n"
           "  --block-bytes N             bytes per block, plane and layer (default 4096)\n"
           "  --num-blocks N              KV blocks per rank (default 512)\n"
           "  --kv-heads N                KV heads (TP factor, default 8)\n"
           "  --mla                       MLA: one latent plane per layer, the same on every\n"
           "                              TP rank (stored once, loaded by every rank)\n"
           "  --max-running N             concurrent requests per instance (default 8)\n"
           "  --log-level LEVEL           debug|info|warn|error (default error)\n"
           "  --corrupt N                 self-check: damage every Nth loaded block before\n"
           "                              it is verified (expects mismatches, exit 1)\n"
           "  --pp N                      pipeline stages: N x TP workers per instance, the\n"
           "                              layers split between the stages (default 1)\n"
           "  --swa WINDOW                hybrid model: group 0 full attention, group 1 a\n"
           "                              sliding window of WINDOW tokens (default 0: none)\n"
           "  --mamba                     hybrid model: group 0 full attention, group 1 Mamba\n"
           "                              in align mode: the engine writes the state at each\n"
           "                              step's last block boundary and the prompt checkpoint\n"
           "                              and hands that block off (boundary_state_offloads);\n"
           "                              a hit loads the state at the hit point, checked\n"
           "  --roles LIST                one role per instance (sets --instances):\n"
           "                              both|producer|consumer, comma-separated; consumers\n"
           "                              run after the others, on the same users, and\n"
           "                              never store (disaggregated prefill)\n"
           "  --verify full|sample        check every loaded byte (default), or the first\n"
           "                              and last 64 bytes of every block, plane and layer\n"
           "                              (a wrong, skipped or short block; benchmarks)\n"
           "  --chunk N                   chunked prefill: at most N prompt tokens per request\n"
           "                              and step, saved as they complete (default 0: all)\n"
           "  --decode                    decode steps: the reply tokens are generated one per\n"
           "                              step (KV computed, new blocks as needed) before the\n"
           "                              request finishes; else they only join the history\n"
           "  --preempt-every N           every Nth step preempt the oldest running request\n"
           "                              (blocks freed at once; resumed later: lookup, load,\n"
           "                              recompute of the rest) (default 0: never)\n"
           "  --preempt-free now|deferred now (default, as vLLM): a preempted request's\n"
           "                              blocks are reused at once; deferred: only after\n"
           "                              the request ends (each request preempted once)\n"
           "  --no-handle-preemptions     diagnosis: do not call kvp_conn_handle_preemptions\n"
           "                              before reusing a preempted request's blocks (a save\n"
           "                              still reading them then stores wrong bytes, which\n"
           "                              later loads report as mismatches)\n");
}

/* The workload when no flag is given. */
static void sim_defaults(simcfg *c)
{
    const char *env_master = getenv("KVPOOL_MASTER");
    *c = (simcfg){.master = env_master && *env_master ? env_master : "127.0.0.1:50051",
                  .instances = 2, .tp = 2, .users = 8, .turns = 4,
                  .sys_tokens = 512, .turn_tokens = 128, .reply_tokens = 64, .block_size = 16,
                  .layers = 2, .kv_heads = 8, .num_blocks = 512, .max_running = 8,
                  .block_bytes = 4096, .duration = 10, .seed = 1, .log_level = KVP_LOG_ERROR,
                  .pp = 1};
}

/*
 * Phase 1 of parse_args: every flag (the shared parser), each value
 * converted and checked on its own. *inst_set: --instances was given.
 * 0, 1 for --help, or -1 after the message.
 */
static int sim_read_flags(int argc, char **argv, simcfg *c, int *inst_set)
{
    int bb = (int)c->block_bytes;
    /* the flags: these first (by index), then one per row of ints[] */
    enum { F_JSON, F_MLA, F_DECODE, F_NO_HANDLE, F_MAMBA, F_ROLES, F_MASTER, F_VERIFY, F_PREEMPT_FREE,
           F_LOG_LEVEL, F_DURATION, F_SEED, F_INTS };
    static const kvp_cli_flag named[F_INTS] = {
        {"json", KVP_CLI_BOOL},      {"mla", KVP_CLI_BOOL},       {"decode", KVP_CLI_BOOL},
        {"no-handle-preemptions", KVP_CLI_BOOL},                   {"mamba", KVP_CLI_BOOL},
        {"roles", KVP_CLI_TEXT},
        {"master", KVP_CLI_CONNECT}, {"verify", KVP_CLI_TEXT},    {"preempt-free", KVP_CLI_TEXT},
        {"log-level", KVP_CLI_TEXT}, {"duration", KVP_CLI_TEXT},  {"seed", KVP_CLI_TEXT},
    };
    const struct {
        const char *n;
        int *p;
        long lo, hi;
    } ints[] = {
        {"instances", &c->instances, 1, 64}, {"tp", &c->tp, 1, 64},
        {"users", &c->users, 1, 100000}, {"turns", &c->turns, 1, 100000},
        {"system-prompt-tokens", &c->sys_tokens, 0, 1 << 20},
        {"turn-tokens", &c->turn_tokens, 1, 1 << 20},
        {"reply-tokens", &c->reply_tokens, 0, 1 << 20},
        {"block-size", &c->block_size, 1, 4096}, {"layers", &c->layers, 1, 64},
        {"block-bytes", &bb, 8, 1 << 24}, {"num-blocks", &c->num_blocks, 1, 1 << 24},
        {"kv-heads", &c->kv_heads, 1, 4096}, {"max-running", &c->max_running, 1, 4096},
        {"corrupt", &c->corrupt, 0, 1 << 30}, {"pp", &c->pp, 1, 8},
        {"swa", &c->swa, 0, 1 << 20}, {"chunk", &c->chunk, 0, 1 << 20},
        {"preempt-every", &c->preempt_every, 0, 1 << 30},
    };
    enum { NINTS = sizeof ints / sizeof ints[0] };
    kvp_cli_flag flags[F_INTS + NINTS + 1];
    memcpy(flags, named, sizeof named);
    for (int k = 0; k < NINTS; k++)
        flags[F_INTS + k] = (kvp_cli_flag){ints[k].n, KVP_CLI_TEXT};
    flags[F_INTS + NINTS] = (kvp_cli_flag){NULL, KVP_CLI_TEXT};
    const char *v[F_INTS + NINTS] = {NULL};
    int rc = kvp_cli_scan(argc, argv, flags, v, NULL);
    if (rc != 0)
        return rc;

    /* each value, converted and checked */
    c->json = v[F_JSON] != NULL;
    c->mla = v[F_MLA] != NULL;
    c->decode = v[F_DECODE] != NULL;
    c->no_handle_preemptions = v[F_NO_HANDLE] != NULL;
    c->mamba = v[F_MAMBA] != NULL;
    for (int k = 0; k < NINTS; k++) {
        uint64_t x;
        if (v[F_INTS + k] && kvp_cli_uint("sim", ints[k].n, v[F_INTS + k], (uint64_t)ints[k].lo,
                                          (uint64_t)ints[k].hi, &x) != 0)
            return -1;
        if (v[F_INTS + k])
            *ints[k].p = (int)x;
    }
    *inst_set = v[F_INTS] != NULL; /* ints[0] is "instances" */
    if (v[F_ROLES]) {
        c->nroles = 0;
        for (const char *q = v[F_ROLES];;) {
            size_t l = strcspn(q, ",");
            int role = l == 4 && !strncmp(q, "both", 4)       ? SIM_BOTH
                       : l == 8 && !strncmp(q, "producer", 8) ? SIM_PRODUCER
                       : l == 8 && !strncmp(q, "consumer", 8) ? SIM_CONSUMER
                                                              : -1;
            if (role < 0 || c->nroles >= 64) {
                char qv[96];
                fprintf(stderr, "kvpool sim: flag --roles: value %s is not a list of roles "
                        "(allowed: up to 64 of both|producer|consumer, comma-separated)\n",
                        kvp_cli_quote(v[F_ROLES], qv, sizeof qv));
                return -1;
            }
            c->roles[c->nroles++] = role;
            if (!q[l])
                break;
            q += l + 1;
        }
    }
    if (v[F_MASTER])
        c->master = v[F_MASTER];
    static const struct {
        int flag;
        const char *a, *b; /* the two allowed words; the second sets *p */
    } words[] = {{F_VERIFY, "full", "sample"}, {F_PREEMPT_FREE, "now", "deferred"}};
    int *word_p[] = {&c->sample, &c->preempt_deferred};
    for (int k = 0; k < 2; k++) {
        const char *w = v[words[k].flag];
        if (!w)
            continue;
        if (strcmp(w, words[k].a) && strcmp(w, words[k].b)) {
            char qv[96];
            fprintf(stderr, "kvpool sim: flag --%s: value %s is not allowed (allowed: %s or %s)\n",
                    flags[words[k].flag].name, kvp_cli_quote(w, qv, sizeof qv), words[k].a,
                    words[k].b);
            return -1;
        }
        *word_p[k] = !strcmp(w, words[k].b);
    }
    if (kvp_cli_env_log_level("sim", &c->log_level) < 0) /* a flag beats it */
        return -1;
    if (v[F_LOG_LEVEL]) {
        int lv = kvp_log_level_parse(v[F_LOG_LEVEL]);
        if (lv < 0) {
            char qv[96];
            fprintf(stderr, "kvpool sim: flag --log-level: value %s is not a log level (allowed: "
                    "debug, info, warn or error)\n", kvp_cli_quote(v[F_LOG_LEVEL], qv, sizeof qv));
            return -1;
        }
        c->log_level = lv;
    }
    uint64_t seed;
    if ((v[F_DURATION] &&
         kvp_cli_seconds("sim", "duration", v[F_DURATION], 0, 0, 86400, &c->duration) != 0) ||
        (v[F_SEED] && kvp_cli_uint("sim", "seed", v[F_SEED], 0, UINT64_MAX, &seed) != 0))
        return -1;
    if (v[F_SEED])
        c->seed = seed;
    c->block_bytes = (uint64_t)bb;
    return 0;
}

/* Phase 2 of parse_args: the flags together. 0, or -1 after the message. */
static int sim_check_flags(simcfg *c, int inst_set)
{
    if (c->nroles) {
        if (inst_set && c->instances != c->nroles) {
            fprintf(stderr, "kvpool sim: --roles names %d instances, --instances %d\n",
                    c->nroles, c->instances);
            return -1;
        }
        c->instances = c->nroles;
    }
    if (c->pp > c->layers) {
        fprintf(stderr, "kvpool sim: --pp %d: needs at least as many --layers (%d)\n", c->pp,
                c->layers);
        return -1;
    }
    if (c->swa && c->mamba) {
        fprintf(stderr, "kvpool sim: --swa and --mamba: one hybrid group at a time\n");
        return -1;
    }
    if (c->swa == 1) {
        fprintf(stderr, "kvpool sim: --swa 1: a sliding window needs at least 2 tokens\n");
        return -1;
    }
    if (c->block_bytes % 8 || c->block_bytes % (uint64_t)c->block_size) {
        fprintf(stderr, "kvpool sim: --block-bytes %" PRIu64 ": must be a multiple of 8 and of "
                "--block-size %d\n", c->block_bytes, c->block_size);
        return -1;
    }
    /* the longest prompt (last turn) must fit the KV cache */
    uint64_t longest = (uint64_t)c->sys_tokens +
                       (uint64_t)c->turns * ((uint64_t)c->turn_tokens * 3 / 2 + 1 +
                                             (uint64_t)c->reply_tokens);
    uint64_t need = (longest + (uint64_t)c->block_size - 1) / (uint64_t)c->block_size;
    need = need * (uint64_t)sim_groups(c) + 1; /* every group's table + the null block */
    if (need > (uint64_t)c->num_blocks) {
        fprintf(stderr, "kvpool sim: --num-blocks %d: the longest prompt (%" PRIu64
                " tokens) needs %" PRIu64 " blocks\n", c->num_blocks, longest, need);
        return -1;
    }
    return 0;
}

/* The command line into *c: 0, 1 for --help, or -1 after the message. */
static int parse_args(int argc, char **argv, simcfg *c)
{
    int inst_set = 0;
    sim_defaults(c);
    const char *env = getenv("KVPOOL_MASTER");
    int rc = sim_read_flags(argc, argv, c, &inst_set);
    if (rc != 0)
        return rc;
    /* $KVPOOL_MASTER, unless --master replaced it, is checked as the flag is */
    if (env && c->master == env && kvp_cli_addr("sim", "$KVPOOL_MASTER", env, 0) != 0)
        return -1;
    return sim_check_flags(c, inst_set);
}

static void sum(simstats *t, const simstats *s)
{
    t->requests += s->requests;
    t->prompt_tokens += s->prompt_tokens;
    t->lookup_hit_tokens += s->lookup_hit_tokens;
    t->loaded_tokens += s->loaded_tokens;
    t->computed_tokens += s->computed_tokens;
    t->bytes_stored += s->bytes_stored;
    t->bytes_loaded += s->bytes_loaded;
    t->store_ns += s->store_ns;
    t->load_ns += s->load_ns;
    t->puts += s->puts;
    t->gets += s->gets;
    t->load_errors += s->load_errors;
    t->mismatches += s->mismatches;
    t->blocks_verified += s->blocks_verified;
    t->steps += s->steps;
    t->blocks_recomputed += s->blocks_recomputed;
    t->load_error_reqs += s->load_error_reqs;
    t->swa_verified += s->swa_verified;
    t->mamba_puts += s->mamba_puts;
    t->decode_tokens += s->decode_tokens;
    t->prefill_chunks += s->prefill_chunks;
    t->preemptions += s->preemptions;
    t->resumed += s->resumed;
    t->replayed_tokens += s->replayed_tokens;
    t->replay_loaded_tokens += s->replay_loaded_tokens;
    t->workers += s->workers;
    t->workers_verified += s->workers_verified;
    t->hit_requests += s->hit_requests;
    t->hit_blocks += s->hit_blocks;
    t->store_keys += s->store_keys;
    t->store_failed_keys += s->store_failed_keys;
    t->lookup_size_misses += s->lookup_size_misses;
}

static void progress(const simstats *last, int n, uint64_t t0)
{
    simstats t = {0};
    for (int i = 0; i < n; i++)
        sum(&t, &last[i]);
    double el = (double)(now_ns() - t0) / 1e9;
    fprintf(stderr, "\r[%5.1fs] requests %" PRIu64 "  hit %5.1f%%  stored %.1f MiB"
            "  loaded %.1f MiB  load errors %" PRIu64 "  mismatches %" PRIu64 "   ",
            el, t.requests,
            t.prompt_tokens ? 100.0 * (double)t.loaded_tokens / (double)t.prompt_tokens : 0.0,
            (double)t.bytes_stored / 1048576.0, (double)t.bytes_loaded / 1048576.0,
            t.load_errors, t.mismatches);
}

/*
 * The timeline (--json): the summed counters of the instances' latest
 * reports (every 50 ms) taken every `every` ns from the start; when TL_MAX
 * samples are held every other one is dropped and the interval doubles, so
 * the samples stay bounded for a run of any length. A sample is taken when
 * the parent wakes (a report arrives) at or after its time; the last one is
 * the run's end. Rates are over each sample's own interval.
 */
#define TL_MAX 64
#define TL_MS0 500
typedef struct tlsample {
    uint64_t t_ns, requests, prompt_tokens, loaded_tokens, bytes_stored, bytes_loaded;
} tlsample;
typedef struct timeline {
    tlsample s[TL_MAX + 1]; /* + the final sample */
    int n;
    uint64_t every, next; /* ns since the start */
} timeline;

static void tl_add(timeline *tl, const simstats *t, uint64_t at)
{
    if (tl->n == TL_MAX + 1)
        return;
    tl->s[tl->n++] = (tlsample){at, t->requests, t->prompt_tokens, t->loaded_tokens,
                                t->bytes_stored, t->bytes_loaded};
}

static void tl_take(timeline *tl, const simstats *last, int n, uint64_t since)
{
    if (since < tl->next)
        return;
    if (tl->n == TL_MAX) { /* keep the 2nd, 4th, ...: an interval twice as long */
        for (int i = 0; i < TL_MAX / 2; i++)
            tl->s[i] = tl->s[2 * i + 1];
        tl->n = TL_MAX / 2;
        tl->every *= 2;
        tl->next = tl->every * (uint64_t)(tl->n + 1);
        if (since < tl->next)
            return;
    }
    simstats t = {0};
    for (int i = 0; i < n; i++)
        sum(&t, &last[i]);
    tl_add(tl, &t, since);
    tl->next = (since / tl->every + 1) * tl->every; /* a late wake-up skips, never bunches */
}

/* ", \"timeline\": {...}" into stdout: per sample t (s), requests so far,
 * hit rate over the interval (null without prompt tokens in it) and so far,
 * GB/s stored and loaded over the interval. */
static void tl_print(const timeline *tl)
{
    printf(", \"timeline\": {\"interval_s\": %.3f, \"columns\": [\"t_s\", \"requests\", "
           "\"interval_hit_rate\", \"hit_rate_so_far\", \"stored_gbps\", \"loaded_gbps\"], "
           "\"samples\": [", (double)tl->every / 1e9);
    tlsample z = {0};
    for (int i = 0; i < tl->n; i++) {
        const tlsample *a = i ? &tl->s[i - 1] : &z, *b = &tl->s[i];
        double dt = (double)(b->t_ns - a->t_ns) / 1e9;
        uint64_t dp = b->prompt_tokens - a->prompt_tokens;
        uint64_t dl = b->loaded_tokens - a->loaded_tokens;
        char hr[16] = "null";
        if (dp)
            snprintf(hr, sizeof hr, "%.4f", (double)dl / (double)dp);
        printf("%s[%.2f, %" PRIu64 ", %s, %.4f, %.3f, %.3f]", i ? ", " : "",
               (double)b->t_ns / 1e9, b->requests, hr,
               b->prompt_tokens ? (double)b->loaded_tokens / (double)b->prompt_tokens : 0.0,
               dt > 0 ? (double)(b->bytes_stored - a->bytes_stored) / dt / 1e9 : 0.0,
               dt > 0 ? (double)(b->bytes_loaded - a->bytes_loaded) / dt / 1e9 : 0.0);
    }
    printf("]}");
}

/*
 * Phase of instance i: with --roles naming both consumers and others, the
 * consumers run in phase 1, after every other instance finished (they
 * replay the same users' prompts: disaggregated prefill); else everything
 * is phase 0. Users are dealt among the instances of a phase.
 */
static int phase_of(const simcfg *c, int i)
{
    int cons = 0, other = 0;
    for (int k = 0; k < c->instances; k++)
        sim_role(c, k) == SIM_CONSUMER ? cons++ : other++;
    return cons && other && sim_role(c, i) == SIM_CONSUMER;
}

int kvp_sim_main(int argc, char **argv)
{
    simcfg c;
    int rc = parse_args(argc, argv, &c);
    if (rc == 1) {
        usage();
        return 0;
    }
    if (rc < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    kvp_log_set_level(c.log_level);
    fflush(stdout);
    fflush(stderr);
    int n = c.instances;
    pid_t *pids = kvp_calloc((size_t)n, sizeof *pids);
    int *fds = kvp_calloc((size_t)n, sizeof *fds);
    simstats *last = kvp_calloc((size_t)n, sizeof *last);
    if (!pids || !fds || !last) {
        fprintf(stderr, "kvpool sim: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++)
        fds[i] = -1;
    uint64_t t0 = now_ns();
    int fail = 0, exit_bad = 0, tty = isatty(2);
    timeline *tl = kvp_calloc(1, sizeof *tl);
    if (!tl) {
        fprintf(stderr, "kvpool sim: out of memory\n");
        return 1;
    }
    tl->every = tl->next = (uint64_t)TL_MS0 * 1000000ull;
    for (int phase = 0; phase < 2 && !fail; phase++) {
        int nslots = 0, open_fds = 0;
        for (int i = 0; i < n; i++)
            nslots += phase_of(&c, i) == phase;
        for (int i = 0, slot = 0; i < n; i++) {
            if (phase_of(&c, i) != phase)
                continue;
            int p[2];
            if (pipe(p) != 0) {
                fail = 1;
                break;
            }
            pid_t pid = fork();
            if (pid < 0) {
                close(p[0]);
                close(p[1]);
                fail = 1;
                break;
            }
            if (pid == 0) {
                close(p[0]);
                for (int j = 0; j < n; j++)
                    if (fds[j] >= 0)
                        close(fds[j]);
                int r = instance_main(&c, i, slot, nslots, p[1]);
                close(p[1]);
                kvp_free(tl);
                kvp_free(pids);
                kvp_free(fds);
                kvp_free(last);
                fflush(stderr);
                exit(r);
            }
            close(p[1]);
            pids[i] = pid;
            fds[i] = p[0];
            slot++;
            open_fds++;
        }
        while (open_fds > 0) {
            struct pollfd pf[64];
            for (int i = 0; i < n; i++)
                pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
            if (poll(pf, (nfds_t)n, 500) < 0 && errno != EINTR)
                break;
            for (int i = 0; i < n; i++) {
                if (fds[i] < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
                simstats s;
                ssize_t r = read(fds[i], &s, sizeof s);
                if (r == (ssize_t)sizeof s) {
                    last[i] = s;
                    continue;
                }
                close(fds[i]);
                fds[i] = -1;
                open_fds--;
            }
            if (tty)
                progress(last, n, t0);
            tl_take(tl, last, n, now_ns() - t0);
        }
        for (int i = 0; i < n; i++) {
            if (!pids[i] || phase_of(&c, i) != phase)
                continue;
            int st = 0;
            if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
                !last[i].done) {
                fprintf(stderr, "kvpool sim: instance %d failed\n", i);
                exit_bad = 1;
            }
            if (fds[i] >= 0)
                close(fds[i]);
            fds[i] = -1;
            pids[i] = 0;
        }
    }
    if (tty)
        fprintf(stderr, "\n");
    uint64_t el_ns = now_ns() - t0;
    double el = (double)el_ns / 1e9;
    simstats t = {0}, tc = {0};
    for (int i = 0; i < n; i++) {
        sum(&t, &last[i]);
        if (sim_role(&c, i) == SIM_CONSUMER)
            sum(&tc, &last[i]);
    }
    if (tl->n && el_ns - tl->s[tl->n - 1].t_ns < tl->every / 2)
        tl->n--; /* the end replaces a sample just before it: no sliver of an interval */
    tl_add(tl, &t, el_ns);
    double hit = t.prompt_tokens ? (double)t.loaded_tokens / (double)t.prompt_tokens : 0.0;
    double chit = tc.prompt_tokens ? (double)tc.loaded_tokens / (double)tc.prompt_tokens : 0.0;
    double gbs = el > 0 ? (double)(t.bytes_stored + t.bytes_loaded) / el / 1e9 : 0.0;
    double load_gbs = t.load_ns ? (double)t.bytes_loaded / (double)t.load_ns : 0.0;
    /* load failures per 1,000 hits: requests whose load failed (cut short
     * by an error) per 1,000 loads started after a lookup hit, and the
     * blocks recomputed for it per 1,000 blocks those lookups counted */
    double fail_k = t.hit_requests ? 1000.0 * (double)t.load_error_reqs / (double)t.hit_requests
                                   : 0.0;
    double fail_kb = t.hit_blocks ? 1000.0 * (double)t.blocks_recomputed / (double)t.hit_blocks
                                  : 0.0;
    double store_gbs = t.store_ns ? (double)t.bytes_stored / (double)t.store_ns : 0.0;
    int bad = exit_bad || fail || t.mismatches;
    char roles[64 * 9 + 1] = "";
    static const char *const rname[] = {"both", "producer", "consumer"};
    for (int i = 0; i < n; i++)
        snprintf(roles + strlen(roles), sizeof roles - strlen(roles), "%s%s", i ? "," : "",
                 rname[sim_role(&c, i)]);
    if (c.json) {
        printf("{\"instances\": %d, \"tp\": %d, \"pp\": %d, \"mla\": %s, \"swa_window\": %d"
               ", \"roles\": \"%s\", \"verify\": \"%s\", \"seconds\": %.3f"
               ", \"requests\": %" PRIu64 ", \"prompt_tokens\": %" PRIu64 ", \"hits\": %" PRIu64
               ", \"lookup_hit_tokens\": %" PRIu64 ", \"tokens_not_recomputed\": %" PRIu64
               ", \"computed_tokens\": %" PRIu64 ", \"decode_tokens\": %" PRIu64
               ", \"prefill_chunks\": %" PRIu64 ", \"steps\": %" PRIu64 ", \"puts\": %" PRIu64
               ", \"chunk\": %d, \"decode\": %s, \"preemptions\": %" PRIu64
               ", \"resumed\": %" PRIu64 ", \"replayed_tokens\": %" PRIu64
               ", \"replay_loaded_tokens\": %" PRIu64
               ", \"hit_rate\": %.4f, \"bytes_stored\": %" PRIu64
               ", \"bytes_loaded\": %" PRIu64 ", \"gb_per_s\": %.3f, \"store_gb_per_s\": %.3f"
               ", \"load_gb_per_s\": %.3f, \"blocks_verified\": %" PRIu64
               ", \"swa_blocks_verified\": %" PRIu64 ", \"mamba\": %s"
               ", \"mamba_states_verified\": %" PRIu64 ", \"mamba_states_handed_off\": %" PRIu64
               ", \"workers\": %" PRIu64
               ", \"workers_verified\": %" PRIu64
               ", \"load_errors\": %" PRIu64 ", \"load_error_requests\": %" PRIu64
               ", \"blocks_recomputed\": %" PRIu64 ", \"hit_requests\": %" PRIu64
               ", \"hit_blocks\": %" PRIu64 ", \"load_failures_per_1k_hits\": %.3f"
               ", \"blocks_recomputed_per_1k_hit_blocks\": %.3f, \"store_keys\": %" PRIu64
               ", \"store_failed_keys\": %" PRIu64 ", \"lookup_size_misses\": %" PRIu64
               ", \"mismatches\": %" PRIu64
               ", \"consumer\": {\"requests\": %" PRIu64 ", \"prompt_tokens\": %" PRIu64
               ", \"tokens_loaded\": %" PRIu64 ", \"hit_rate\": %.4f, \"bytes_stored\": %" PRIu64
               ", \"bytes_loaded\": %" PRIu64 "}, \"ok\": %s",
               n, c.tp, c.pp, c.mla ? "true" : "false", c.swa, roles,
               c.sample ? "sample" : "full", el, t.requests,
               t.prompt_tokens, t.loaded_tokens, t.lookup_hit_tokens, t.loaded_tokens,
               t.computed_tokens, t.decode_tokens, t.prefill_chunks, t.steps, t.puts, c.chunk,
               c.decode ? "true" : "false", t.preemptions, t.resumed, t.replayed_tokens,
               t.replay_loaded_tokens, hit, t.bytes_stored, t.bytes_loaded, gbs, store_gbs,
               load_gbs,
               t.blocks_verified, c.mamba ? 0 : t.swa_verified, c.mamba ? "true" : "false",
               c.mamba ? t.swa_verified : 0, t.mamba_puts, t.workers, t.workers_verified,
               t.load_errors,
               t.load_error_reqs, t.blocks_recomputed, t.hit_requests, t.hit_blocks, fail_k,
               fail_kb, t.store_keys, t.store_failed_keys, t.lookup_size_misses,
               t.mismatches, tc.requests, tc.prompt_tokens, tc.loaded_tokens, chit,
               tc.bytes_stored, tc.bytes_loaded, bad ? "false" : "true");
        tl_print(tl); /* last: readers that scan for the first "key": find the summary's */
        printf("}\n");
    } else {
        printf("kvpool sim: %d instances (%s) x TP %d x PP %d%s, %.1f s\n", n, roles, c.tp,
               c.pp, c.swa     ? " (hybrid: full + sliding window)"
                     : c.mamba ? " (hybrid: full + Mamba, align mode)"
                               : "", el);
        printf("  requests              %" PRIu64 "\n", t.requests);
        printf("  prompt tokens         %" PRIu64 "\n", t.prompt_tokens);
        printf("  hit rate              %.1f%% (tokens loaded / prompt tokens)\n", hit * 100);
        printf("  tokens not recomputed %" PRIu64 " (lookup hits %" PRIu64 ")\n",
               t.loaded_tokens, t.lookup_hit_tokens);
        printf("  tokens computed       %" PRIu64 " prefill in %" PRIu64 " chunks, %" PRIu64
               " decode; %" PRIu64 " steps\n", t.computed_tokens, t.prefill_chunks,
               t.decode_tokens, t.steps);
        if (t.preemptions)
            printf("  preemptions           %" PRIu64 " (%" PRIu64 " resumed; %" PRIu64
                   " tokens loaded again, %" PRIu64 " recomputed)\n", t.preemptions, t.resumed,
                   t.replay_loaded_tokens, t.replayed_tokens);
        printf("  bytes stored          %.1f MiB (%.2f GB/s per put)\n",
               (double)t.bytes_stored / 1048576.0, store_gbs);
        printf("  bytes loaded          %.1f MiB (%.2f GB/s per get)\n",
               (double)t.bytes_loaded / 1048576.0, load_gbs);
        printf("  throughput            %.3f GB/s (stored + loaded over wall time)\n", gbs);
        printf("  blocks verified       %" PRIu64 " (%s: %" PRIu64 "; by %" PRIu64 " of %" PRIu64
               " workers)\n", t.blocks_verified,
               c.mamba ? "Mamba states" : "sliding window group", t.swa_verified,
               t.workers_verified, t.workers);
        if (c.mamba)
            printf("  Mamba states          %" PRIu64 " handed off at boundaries (stored unless "
                   "past the prefill)\n", t.mamba_puts);
        printf("  load errors           %" PRIu64 " (blocks, summed over ranks) in %" PRIu64
               " requests\n", t.load_errors, t.load_error_reqs);
        printf("  blocks recomputed     %" PRIu64 " (loads cut short by an error)\n",
               t.blocks_recomputed);
        printf("  load failures         %.2f per 1,000 hits (%" PRIu64 " of %" PRIu64
               " loads after a lookup hit); %.2f blocks recomputed per 1,000 hit blocks (of %"
               PRIu64 ")\n", fail_k, t.load_error_reqs, t.hit_requests, fail_kb, t.hit_blocks);
        printf("  store refusals        %" PRIu64 " of %" PRIu64 " keys put%s\n",
               t.store_failed_keys, t.store_keys, t.store_failed_keys ? " (a full pool)" : "");
        if (t.lookup_size_misses)
            printf("  lookup size misses    %" PRIu64 " keys held a value of another size\n",
                   t.lookup_size_misses);
        if (tc.requests)
            printf("  consumers             %" PRIu64 " requests, hit rate %.1f%%, stored %"
                   PRIu64 " B, loaded %.1f MiB\n", tc.requests, chit * 100, tc.bytes_stored,
                   (double)tc.bytes_loaded / 1048576.0);
        printf("  mismatches            %" PRIu64 "\n", t.mismatches);
        printf("  result                %s\n", bad ? "FAIL" : "ok");
    }
    fflush(stdout);
    kvp_free(tl);
    kvp_free(pids);
    kvp_free(fds);
    kvp_free(last);
    return bad ? 1 : 0;
}
