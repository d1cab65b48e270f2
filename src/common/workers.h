/*
 * workers.h -- persistent worker threads that run a caller's batch of work
 * items beside it, so that the hot path never creates or joins a thread.
 *
 * A caller hands items to the pool (kvp_workers_submit), does its own share
 * of the batch on its own thread, then waits (kvp_workers_wait). Queued
 * items are the workers' while one is idle or starting; when none is, the
 * waiter starts another if the pool may grow, else takes one of its own
 * items back and runs it itself. So a batch always finishes even when every
 * worker is busy with other callers' batches (or no thread can be made):
 * the pool only ever adds parallelism, never a dependency.
 *
 * Threads are started on demand, when an item is queued and no worker is
 * idle, up to the pool's maximum (after a failed pthread_create, none for
 * a second); they live until kvp_workers_destroy. Thread-safe: any number
 * of callers may submit and wait at once. fork-safe: a forked child's
 * pools have no threads and nothing queued (pthread_atfork), and start
 * their own at the child's first submit.
 */
#ifndef KVP_WORKERS_H
#define KVP_WORKERS_H

#include <stddef.h>

typedef struct kvp_workers kvp_workers;
typedef struct kvp_wbatch kvp_wbatch;

/* One work item: fn(arg) runs once, on a worker or on the waiting caller.
 * The caller owns the memory; it must stay put until kvp_workers_wait
 * returns. The fields after arg belong to the pool. */
typedef struct kvp_work {
    void (*fn)(void *arg);
    void *arg;
    struct kvp_work *next;
    kvp_wbatch *batch;
} kvp_work;

/* A batch in flight: the items submitted under it that have not ended.
 * Zero it (or use KVP_WBATCH_INIT) before the first submit. */
struct kvp_wbatch {
    size_t left;
};
#define KVP_WBATCH_INIT {0}

/* A pool of at most max_threads (1..256) threads, none started yet. name
 * (at most 15 bytes shown) names the threads for ps and debuggers.
 * 0, KVP_EINVALID_PARAMS or KVP_ENOMEM. */
int kvp_workers_create(int max_threads, const char *name, kvp_workers **out);
/* Ends the threads (each after its current item) and frees the pool. No
 * batch may be in flight. NULL is a no-op. */
void kvp_workers_destroy(kvp_workers *w);

/* Queues items[0..n) under b (in order; workers take them first in, first
 * out) and wakes or starts workers for them. Never fails: an item no
 * worker takes is run by kvp_workers_wait. */
void kvp_workers_submit(kvp_workers *w, kvp_wbatch *b, kvp_work *items, size_t n);
/* Runs, on the calling thread, every item of b still queued, then returns
 * once every item of b has ended. */
void kvp_workers_wait(kvp_workers *w, kvp_wbatch *b);

/* Threads started so far (for tests and stats). */
int kvp_workers_threads(kvp_workers *w);

#endif
