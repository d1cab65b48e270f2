/*
 * workers.c -- persistent worker threads (see workers.h).
 *
 * One mutex guards the queue, the counters and every batch's `left`.
 * Invariants, under mu:
 *   - an item is on the queue iff it was submitted and nobody started it;
 *   - b->left = items of b submitted and not yet ended (queued, running on a
 *     worker, or taken back by the waiter and not yet accounted);
 *   - queued = the queue's length; idle = workers blocked on work_cv.
 * An item's memory is the caller's until kvp_workers_wait returns, which
 * is only after the last access to it (the decrement of left, under mu).
 */
#include "common/workers.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "kvpool.h"

struct kvp_workers {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* an item was queued, or quit */
    pthread_cond_t done_cv; /* some batch's left reached 0 */
    kvp_work *head, *tail;
    size_t queued; /* items on the queue */
    int max, nthreads, idle, quit;
    pid_t pid; /* the process the threads run in */
    pthread_t *th;
    char name[16];
};

/* The item ended: one fewer left in its batch (mu held). */
static void ended(kvp_workers *w, kvp_wbatch *b, size_t n)
{
    b->left -= n;
    if (b->left == 0)
        pthread_cond_broadcast(&w->done_cv);
}

static void *worker_main(void *arg)
{
    kvp_workers *w = arg;
    pthread_setname_np(pthread_self(), w->name);
    pthread_mutex_lock(&w->mu);
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
        it->started = 1;
        kvp_wbatch *b = it->batch;
        if (w->head && w->idle == 0 && w->nthreads >= w->max)
            pthread_cond_broadcast(&w->done_cv); /* every worker busy: waiters take theirs */
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
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work_cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    w->max = max_threads;
    w->pid = getpid();
    w->th = th;
    snprintf(w->name, sizeof w->name, "%s", name && *name ? name : "kvp-worker");
    *out = w;
    return 0;
}

void kvp_workers_destroy(kvp_workers *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->work_cv);
    int n = w->pid == getpid() ? w->nthreads : 0; /* a forked child has none */
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < n; i++)
        pthread_join(w->th[i], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->work_cv);
    pthread_cond_destroy(&w->done_cv);
    kvp_free(w->th);
    kvp_free(w);
}

/* Starts one more worker (mu held). Workers take no asynchronous signal:
 * a server's signal thread and Python's main thread keep them all. */
static void start_one(kvp_workers *w)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&w->th[w->nthreads], NULL, worker_main, w) == 0)
        w->nthreads++;
    else
        w->max = w->nthreads; /* no more: the waiters run what is queued */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void kvp_workers_submit(kvp_workers *w, kvp_wbatch *b, kvp_work *items, size_t n)
{
    if (!n)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->pid != getpid()) {
        /* a child forked from the process that started the threads: none of
         * them (nor their callers) is here; what they queued is not ours */
        w->pid = getpid();
        w->nthreads = w->idle = 0;
        w->head = w->tail = NULL;
        w->queued = 0;
    }
    for (size_t i = 0; i < n; i++) {
        items[i].next = NULL;
        items[i].batch = b;
        items[i].started = 0;
        if (w->tail)
            w->tail->next = &items[i];
        else
            w->head = &items[i];
        w->tail = &items[i];
    }
    b->left += n;
    w->queued += n;
    size_t queued = w->queued;
    if (w->idle)
        pthread_cond_broadcast(&w->work_cv);
    while (queued > (size_t)w->idle && w->nthreads < w->max && !w->quit) {
        start_one(w);
        queued--;
    }
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
        it->started = 1;
        it->next = NULL;
        return it;
    }
    return NULL;
}

void kvp_workers_wait(kvp_workers *w, kvp_wbatch *b)
{
    pthread_mutex_lock(&w->mu);
    while (b->left) {
        /* The pool runs b's queued items while a worker is idle (woken by
         * the submit) or can still be started; only when every worker is
         * busy does this thread take one back and run it itself -- taking
         * them early would run in series what the workers run side by side
         * (a batch's tcp jobs each wait on their own connection). */
        kvp_work *it = w->idle == 0 && w->nthreads >= w->max ? take_mine(w, b) : NULL;
        if (!it) {
            pthread_cond_wait(&w->done_cv, &w->mu);
            continue;
        }
        pthread_mutex_unlock(&w->mu);
        it->fn(it->arg);
        pthread_mutex_lock(&w->mu);
        ended(w, b, 1);
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
