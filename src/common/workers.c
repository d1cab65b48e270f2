/*
 * workers.c -- persistent worker threads (see workers.h).
 *
 * One mutex per pool guards its queue, its counters and every batch's
 * `left`. Invariants, under mu:
 *   - an item is on the queue iff it was submitted and nobody started it;
 *   - b->left = items of b submitted and not yet ended (queued, running on a
 *     worker, or taken back by the waiter and not yet accounted);
 *   - queued = the queue's length; idle = workers blocked on work_cv;
 *     starting = threads created that have not yet taken mu (each will
 *     look at the queue before it idles, so it counts as available);
 *   - with items queued and no worker idle or starting, a waiter whose
 *     items are queued starts a thread if it may (busy() false), else runs
 *     one of its items itself; a worker that leaves the queue in that state
 *     wakes the waiters. So a queued item always has someone to run it.
 * An item's memory is the caller's until kvp_workers_wait returns, which
 * is only after the last access to it (the decrement of left, under mu).
 *
 * fork: every pool is on a list; pthread_atfork's prepare handler takes the
 * list's lock and every pool's mu, so none is held mid-change across the
 * fork; the parent releases them, the child makes them anew and forgets
 * its parent's threads and queue (those threads do not exist there).
 */
#include "common/workers.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "kvpool.h"

#define RETRY_MS 1000 /* after a failed pthread_create, no new thread for this long */

struct kvp_workers {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* an item was queued, or quit */
    pthread_cond_t done_cv; /* a batch's left reached 0, or the pool is busy */
    kvp_work *head, *tail;
    size_t queued;
    int max, nthreads, idle, starting, quit;
    uint64_t no_start_until; /* ms: a pthread_create failed; none until then */
    pthread_t *th;
    char name[16];
    struct kvp_workers *prev_pool, *next_pool; /* the fork list */
};

/* ------------------------------------------------------------- fork */

static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static kvp_workers *pools;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
    pthread_mutex_lock(&pools_mu);
    for (kvp_workers *w = pools; w; w = w->next_pool)
        pthread_mutex_lock(&w->mu);
}

static void fork_parent(void)
{
    for (kvp_workers *w = pools; w; w = w->next_pool)
        pthread_mutex_unlock(&w->mu);
    pthread_mutex_unlock(&pools_mu);
}

/* The child: one thread, the forking one. Each pool's lock and conditions
 * are made anew (the parent's workers may be counted as waiters in them);
 * its threads and queued items stayed in the parent. */
static void fork_child(void)
{
    for (kvp_workers *w = pools; w; w = w->next_pool) {
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->work_cv, NULL);
        pthread_cond_init(&w->done_cv, NULL);
        w->head = w->tail = NULL;
        w->queued = 0;
        w->nthreads = w->idle = w->starting = 0;
    }
    pthread_mutex_init(&pools_mu, NULL);
}

static void atfork_register(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ------------------------------------------------------------- pool */

/* The item ended: n fewer left in its batch (mu held). */
static void ended(kvp_workers *w, kvp_wbatch *b, size_t n)
{
    b->left -= n;
    if (b->left == 0)
        pthread_cond_broadcast(&w->done_cv);
}

/* No thread may be started now (mu held). */
static int busy(const kvp_workers *w)
{
    return w->nthreads >= w->max || w->quit ||
           (w->no_start_until && kvp_now_ms() < w->no_start_until);
}

static void *worker_main(void *arg)
{
    kvp_workers *w = arg;
    pthread_setname_np(pthread_self(), w->name);
    pthread_mutex_lock(&w->mu);
    w->starting--;
    for (;;) {
        while (!w->head && !w->quit) {
            w->idle++;
            pthread_cond_wait(&w->work_cv, &w->mu);
            w->idle--;
        }
        if (!w->head) /* quit, and nothing queued */
            break;
        kvp_work *it = w->head;
        w->head = it->next;
        if (!w->head)
            w->tail = NULL;
        w->queued--;
        kvp_wbatch *b = it->batch;
        if (w->head && w->idle == 0 && w->starting == 0)
            pthread_cond_broadcast(&w->done_cv); /* waiters start a thread or run theirs */
        pthread_mutex_unlock(&w->mu);
        it->fn(it->arg);
        pthread_mutex_lock(&w->mu);
        ended(w, b, 1);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int kvp_workers_create(int max_threads, const char *name, kvp_workers **out)
{
    if (!out || max_threads < 1 || max_threads > 256)
        return KVP_EINVALID_PARAMS;
    kvp_workers *w = kvp_calloc(1, sizeof *w);
    pthread_t *th = kvp_calloc((size_t)max_threads, sizeof *th);
    if (!w || !th) {
        kvp_free(w);
        kvp_free(th);
        return KVP_ENOMEM;
    }
    pthread_once(&atfork_once, atfork_register);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work_cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    w->max = max_threads;
    w->th = th;
    snprintf(w->name, sizeof w->name, "%s", name && *name ? name : "kvp-worker");
    pthread_mutex_lock(&pools_mu);
    w->next_pool = pools;
    if (pools)
        pools->prev_pool = w;
    pools = w;
    pthread_mutex_unlock(&pools_mu);
    *out = w;
    return 0;
}

void kvp_workers_destroy(kvp_workers *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&pools_mu);
    if (w->prev_pool)
        w->prev_pool->next_pool = w->next_pool;
    else
        pools = w->next_pool;
    if (w->next_pool)
        w->next_pool->prev_pool = w->prev_pool;
    pthread_mutex_unlock(&pools_mu);
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->work_cv);
    int n = w->nthreads;
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < n; i++)
        pthread_join(w->th[i], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->work_cv);
    pthread_cond_destroy(&w->done_cv);
    kvp_free(w->th);
    kvp_free(w);
}

/* Starts one more worker (mu held); 0, or -1 when none could be (then none
 * is tried for RETRY_MS: the waiters run what is queued). Workers take no
 * asynchronous signal: a server's signal thread and Python's main thread
 * keep them all. */
static int start_one(kvp_workers *w)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w->th[w->nthreads], NULL, worker_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        w->no_start_until = kvp_now_ms() + RETRY_MS;
        pthread_cond_broadcast(&w->done_cv); /* waiters run their own now */
        return -1;
    }
    w->nthreads++;
    w->starting++;
    return 0;
}

void kvp_workers_submit(kvp_workers *w, kvp_wbatch *b, kvp_work *items, size_t n)
{
    if (!n)
        return;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < n; i++) {
        items[i].next = NULL;
        items[i].batch = b;
        if (w->tail)
            w->tail->next = &items[i];
        else
            w->head = &items[i];
        w->tail = &items[i];
    }
    b->left += n;
    w->queued += n;
    if (w->idle)
        pthread_cond_broadcast(&w->work_cv);
    /* a thread for each queued item no idle or starting worker will take */
    while (w->queued > (size_t)(w->idle + w->starting) && !busy(w))
        if (start_one(w) != 0)
            break;
    pthread_mutex_unlock(&w->mu);
}

/* Unlinks and returns the first queued item of b, or NULL (mu held). */
static kvp_work *take_mine(kvp_workers *w, kvp_wbatch *b)
{
    kvp_work *prev = NULL;
    for (kvp_work *it = w->head; it; prev = it, it = it->next) {
        if (it->batch != b)
            continue;
        if (prev)
            prev->next = it->next;
        else
            w->head = it->next;
        if (w->tail == it)
            w->tail = prev;
        w->queued--;
        it->next = NULL;
        return it;
    }
    return NULL;
}

/* 1 if an item of b is queued (mu held). */
static int has_mine(const kvp_workers *w, const kvp_wbatch *b)
{
    for (const kvp_work *it = w->head; it; it = it->next)
        if (it->batch == b)
            return 1;
    return 0;
}

void kvp_workers_wait(kvp_workers *w, kvp_wbatch *b)
{
    pthread_mutex_lock(&w->mu);
    while (b->left) {
        /* b's queued items are the pool's while a worker is idle (woken by
         * the submit) or starting. With none, this thread starts one when
         * it may, else takes an item back and runs it itself -- never
         * earlier: that would run in series what the workers run side by
         * side (a batch's tcp jobs each wait on their own connection). */
        if (w->idle == 0 && w->starting == 0 && has_mine(w, b)) {
            if (!busy(w) && start_one(w) == 0)
                continue;
            kvp_work *it = take_mine(w, b);
            pthread_mutex_unlock(&w->mu);
            it->fn(it->arg);
            pthread_mutex_lock(&w->mu);
            ended(w, b, 1);
            continue;
        }
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

int kvp_workers_threads(kvp_workers *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->nthreads;
    pthread_mutex_unlock(&w->mu);
    return n;
}
