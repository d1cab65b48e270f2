/* test_workers.c -- kvp_workers: persistent threads running a caller's
 * batch beside it. Every item runs exactly once; a batch ends even while
 * every worker is held by another caller's item (the waiter runs its own
 * queued items); threads are started once and reused; many callers at once
 * (the TSan build checks the locking); the caller leaves its queued items to
 * free workers; a forked child starts threads of its own. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/workers.h"
#include "harness.h"
#include "kvpool.h"

typedef struct counted {
    atomic_int runs;
    pthread_t on; /* the thread it ran on */
} counted;

static void count_item(void *arg)
{
    counted *c = arg;
    c->on = pthread_self();
    atomic_fetch_add(&c->runs, 1);
}

TEST(workers_every_item_runs_once)
{
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(4, "t-workers", &w), 0);
    CHECK_EQ(kvp_workers_threads(w), 0); /* none before the first batch */
    enum { N = 64 };
    static counted c[N];
    static kvp_work it[N];
    for (int round = 0; round < 50; round++) {
        memset(c, 0, sizeof c);
        for (int i = 0; i < N; i++)
            it[i] = (kvp_work){.fn = count_item, .arg = &c[i]};
        kvp_wbatch b = KVP_WBATCH_INIT;
        kvp_workers_submit(w, &b, it, N / 2);
        kvp_workers_submit(w, &b, it + N / 2, N - N / 2);
        kvp_workers_wait(w, &b);
        CHECK_EQ(b.left, 0);
        for (int i = 0; i < N; i++)
            CHECK_EQ(atomic_load(&c[i].runs), 1);
    }
    /* started on demand (the first batch queued more than 4), never more
     * than the maximum, and reused: another 50 batches start none */
    CHECK_EQ(kvp_workers_threads(w), 4);
    for (int round = 0; round < 50; round++) {
        kvp_wbatch b = KVP_WBATCH_INIT;
        for (int i = 0; i < 4; i++)
            it[i] = (kvp_work){.fn = count_item, .arg = &c[i]};
        kvp_workers_submit(w, &b, it, 4);
        kvp_workers_wait(w, &b);
    }
    CHECK_EQ(kvp_workers_threads(w), 4);
    kvp_workers_destroy(w);
}

/* An item that records where it ran and takes a while (so that the caller,
 * were it to take items back early, would find them queued). */
static void slow_item(void *arg)
{
    counted *c = arg;
    c->on = pthread_self();
    usleep(20000);
    atomic_fetch_add(&c->runs, 1);
}

TEST(workers_caller_leaves_queued_items_to_free_workers)
{
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(4, "t-free", &w), 0);
    for (int round = 0; round < 3; round++) { /* fresh threads, then idle ones */
        counted c[4];
        kvp_work it[4];
        memset(c, 0, sizeof c);
        for (int i = 0; i < 4; i++)
            it[i] = (kvp_work){.fn = slow_item, .arg = &c[i]};
        kvp_wbatch b = KVP_WBATCH_INIT;
        kvp_workers_submit(w, &b, it, 4);
        kvp_workers_wait(w, &b);
        for (int i = 0; i < 4; i++) {
            CHECK_EQ(atomic_load(&c[i].runs), 1);
            CHECK(!pthread_equal(c[i].on, pthread_self())); /* side by side, not here */
        }
    }
    CHECK_EQ(kvp_workers_threads(w), 4);
    kvp_workers_destroy(w);
}

TEST(workers_empty_batch_and_bad_arguments)
{
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(0, "x", &w), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_workers_create(257, "x", &w), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_workers_create(1, NULL, NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_workers_create(1, NULL, &w), 0);
    kvp_wbatch b = KVP_WBATCH_INIT;
    kvp_workers_submit(w, &b, NULL, 0);
    kvp_workers_wait(w, &b); /* nothing submitted: returns at once */
    CHECK_EQ(kvp_workers_threads(w), 0);
    kvp_workers_destroy(w);
    kvp_workers_destroy(NULL);
}

/* An item that holds its worker until released. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
} gate;

static void gate_item(void *arg)
{
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

typedef struct holder {
    kvp_workers *w;
    gate *g;
} holder;

static void *hold_main(void *arg)
{
    holder *h = arg;
    kvp_work it = {.fn = gate_item, .arg = h->g};
    kvp_wbatch b = KVP_WBATCH_INIT;
    kvp_workers_submit(h->w, &b, &it, 1);
    /* let the worker take it: wait() would run it here otherwise */
    pthread_mutex_lock(&h->g->mu);
    while (!h->g->entered)
        pthread_cond_wait(&h->g->cv, &h->g->mu);
    pthread_mutex_unlock(&h->g->mu);
    kvp_workers_wait(h->w, &b);
    return NULL;
}

TEST(workers_batch_ends_while_every_worker_is_held)
{
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(1, "t-held", &w), 0);
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    holder h = {w, &g};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, hold_main, &h), 0);
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    /* the only worker is held: this batch runs on this thread */
    enum { N = 8 };
    counted c[N];
    kvp_work it[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++)
        it[i] = (kvp_work){.fn = count_item, .arg = &c[i]};
    kvp_wbatch b = KVP_WBATCH_INIT;
    kvp_workers_submit(w, &b, it, N);
    kvp_workers_wait(w, &b);
    int here = 1;
    for (int i = 0; i < N; i++) {
        here &= pthread_equal(c[i].on, pthread_self()) != 0;
        CHECK_EQ(atomic_load(&c[i].runs), 1);
    }
    CHECK(here);
    CHECK_EQ(kvp_workers_threads(w), 1);
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(th, NULL);
    kvp_workers_destroy(w);
}

typedef struct caller {
    kvp_workers *w;
    atomic_long *total;
    int ok;
} caller;

static void add_item(void *arg)
{
    atomic_fetch_add((atomic_long *)arg, 1);
}

static void *caller_main(void *arg)
{
    caller *c = arg;
    atomic_long mine = 0;
    kvp_work it[5];
    c->ok = 1;
    for (int r = 0; r < 300; r++) {
        long before = atomic_load(&mine);
        for (int i = 0; i < 5; i++)
            it[i] = (kvp_work){.fn = add_item, .arg = &mine};
        kvp_wbatch b = KVP_WBATCH_INIT;
        kvp_workers_submit(c->w, &b, it, 5);
        add_item(&mine); /* the caller's own share */
        kvp_workers_wait(c->w, &b);
        if (atomic_load(&mine) != before + 6)
            c->ok = 0;
    }
    atomic_fetch_add(c->total, atomic_load(&mine));
    return NULL;
}

TEST(workers_many_callers_at_once)
{
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(3, "t-many", &w), 0);
    atomic_long total = 0;
    enum { C = 6 };
    caller cs[C];
    pthread_t th[C];
    for (int i = 0; i < C; i++) {
        cs[i] = (caller){w, &total, 0};
        CHECK_EQ(pthread_create(&th[i], NULL, caller_main, &cs[i]), 0);
    }
    for (int i = 0; i < C; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < C; i++)
        CHECK(cs[i].ok);
    CHECK_EQ(atomic_load(&total), (long)C * 300 * 6);
    CHECK(kvp_workers_threads(w) <= 3);
    kvp_workers_destroy(w);
}

typedef struct probe {
    int blocked;  /* SIGTERM and SIGINT blocked where it ran */
    pthread_t on; /* where it ran */
} probe;

static void mask_item(void *arg)
{
    probe *p = arg;
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    p->blocked = sigismember(&cur, SIGTERM) && sigismember(&cur, SIGINT);
    p->on = pthread_self();
}

TEST(workers_take_no_signals)
{
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL); /* the caller takes every signal */
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(1, "t-sig", &w), 0);
    probe p = {-1, pthread_self()};
    /* until a worker (not this thread) ran the probe */
    for (int tries = 0; tries < 500 && pthread_equal(p.on, pthread_self()); tries++) {
        kvp_work it = {.fn = mask_item, .arg = &p};
        kvp_wbatch b = KVP_WBATCH_INIT;
        kvp_workers_submit(w, &b, &it, 1);
        usleep(1000);
        kvp_workers_wait(w, &b);
    }
    CHECK(!pthread_equal(p.on, pthread_self()));
    CHECK_EQ(p.blocked, 1);
    kvp_workers_destroy(w);
}

/* One batch of n counted items; 1 when each ran once. */
static int one_batch(kvp_workers *w, int n)
{
    counted c[16];
    kvp_work it[16];
    memset(c, 0, sizeof c);
    for (int i = 0; i < n; i++)
        it[i] = (kvp_work){.fn = count_item, .arg = &c[i]};
    kvp_wbatch b = KVP_WBATCH_INIT;
    kvp_workers_submit(w, &b, it, (size_t)n);
    kvp_workers_wait(w, &b);
    for (int i = 0; i < n; i++)
        if (atomic_load(&c[i].runs) != 1)
            return 0;
    return 1;
}

TEST(workers_in_a_forked_child)
{
#ifdef __SANITIZE_THREAD__
    SKIP("ThreadSanitizer does not start threads in a child forked from a threaded process");
#endif
    kvp_workers *w = NULL;
    CHECK_EQ(kvp_workers_create(2, "t-fork", &w), 0);
    CHECK(one_batch(w, 8));
    CHECK(kvp_workers_threads(w) >= 1);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) { /* the parent's threads are not here: the child starts its own */
        alarm(20);  /* a hang fails the test, not the run */
        int fresh = kvp_workers_threads(w) == 0;
        counted c = {0};
        kvp_work it = {.fn = count_item, .arg = &c};
        kvp_wbatch b = KVP_WBATCH_INIT;
        kvp_workers_submit(w, &b, &it, 1);
        kvp_workers_wait(w, &b);
        int ok = fresh && atomic_load(&c.runs) == 1 && !pthread_equal(c.on, pthread_self()) &&
                 kvp_workers_threads(w) == 1 && one_batch(w, 8) && kvp_workers_threads(w) <= 2;
        kvp_workers_destroy(w);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    CHECK_EQ(waitpid(p, &st, 0), p);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(one_batch(w, 8)); /* the parent's pool is untouched */
    kvp_workers_destroy(w);
}
