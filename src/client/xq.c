/*
 * xq.c -- the asynchronous transfer queue (contracts: xq.h).
 *
 * Invariants (under q->mu):
 *   - every job is on exactly one of: the queue (queued, FIFO), a thread
 *     (running, counted in `running`), the done list (finished, FIFO);
 *   - pending = queued + running + finished-not-polled;
 *   - `stopping` is set only by destroy, after which submit refuses and the
 *     threads leave once the queue is empty.
 */
#include "client/xq.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define XQ_MAX_THREADS 64

typedef struct job {
    struct job *next;
    uint64_t id;
    int op;
    size_t n;
    char **keys;     /* n copies */
    kvp_iov *iovs;   /* n ranges */
    int64_t *results;
    uint64_t bytes;
    double seconds;
} job;

struct kvp_xq {
    kvp_client *c;
    kvp_xq_hooks hooks;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* a job was queued, or stopping */
    pthread_cond_t idle_cv; /* a job finished */
    job *qhead, *qtail;     /* queued */
    job *dhead, *dtail;     /* finished, not polled */
    size_t queued, running, pending;
    int stopping;
    int nthreads;
    pthread_t th[XQ_MAX_THREADS];
};

static void job_free(job *j)
{
    if (!j)
        return;
    if (j->keys)
        for (size_t i = 0; i < j->n; i++)
            free(j->keys[i]);
    free(j->keys);
    free(j->iovs);
    free(j->results);
    free(j);
}

/* ------------------------------------------------------------ running a job */

/* Every key of j gets code. */
static void job_fail(job *j, int code)
{
    for (size_t i = 0; i < j->n; i++)
        j->results[i] = code;
}

/* Runs j with the client: one batch call; results per key. */
static void job_run(kvp_xq *q, job *j)
{
    uint64_t t0 = kvp_now_ns();
    int rc = q->hooks.enter ? q->hooks.enter(q->hooks.arg) : 0;
    if (rc) {
        job_fail(j, rc < 0 ? rc : KVP_EINTERNAL_ERROR);
    } else {
        const kvp_iov **iovp = malloc(j->n * sizeof *iovp);
        size_t *niov = malloc(j->n * sizeof *niov);
        if (!iovp || !niov) {
            job_fail(j, KVP_ENOMEM);
        } else {
            for (size_t i = 0; i < j->n; i++) {
                iovp[i] = &j->iovs[i];
                niov[i] = 1;
            }
            const char *const *keys = (const char *const *)j->keys;
            rc = j->op == KVP_XQ_PUT
                     ? kvp_client_batch_put_opts(q->c, keys, iovp, niov, j->n, NULL, j->results)
                     : kvp_client_batch_get_into(q->c, keys, iovp, niov, j->n, j->results);
            if (rc)
                job_fail(j, rc);
        }
        free(iovp);
        free(niov);
        if (q->hooks.leave)
            q->hooks.leave(q->hooks.arg);
    }
    for (size_t i = 0; i < j->n; i++)
        if (j->results[i] > 0)
            j->bytes += (uint64_t)j->results[i];
    j->seconds = (double)(kvp_now_ns() - t0) / 1e9;
}

static void *xq_thread(void *arg)
{
    kvp_xq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->qhead && !q->stopping)
            pthread_cond_wait(&q->work_cv, &q->mu);
        job *j = q->qhead;
        if (!j)
            break; /* stopping and nothing queued */
        q->qhead = j->next;
        if (!q->qhead)
            q->qtail = NULL;
        j->next = NULL;
        q->queued--;
        q->running++;
        pthread_mutex_unlock(&q->mu);
        job_run(q, j);
        pthread_mutex_lock(&q->mu);
        q->running--;
        if (q->dtail)
            q->dtail->next = j;
        else
            q->dhead = j;
        q->dtail = j;
        pthread_cond_broadcast(&q->idle_cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ------------------------------------------------------------------ the API */

int kvp_xq_create(kvp_client *c, int threads, const kvp_xq_hooks *hooks, kvp_xq **out)
{
    if (!c || !out || threads < 1 || threads > XQ_MAX_THREADS)
        return KVP_EINVALID_PARAMS;
    kvp_xq *q = calloc(1, sizeof *q);
    if (!q)
        return KVP_ENOMEM;
    q->c = c;
    if (hooks)
        q->hooks = *hooks;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work_cv, NULL);
    pthread_cond_init(&q->idle_cv, NULL);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&q->th[i], NULL, xq_thread, q) != 0)
            break;
        q->nthreads++;
    }
    if (q->nthreads == 0) {
        kvp_xq_destroy(q);
        return KVP_EINTERNAL_ERROR;
    }
    *out = q;
    return 0;
}

/* A job holding copies of keys and iovs, or NULL (out of memory). */
static job *job_new(uint64_t id, int op, const char *const *keys, const kvp_iov *iovs, size_t n)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->id = id;
    j->op = op;
    j->n = n;
    j->keys = calloc(n, sizeof *j->keys);
    j->iovs = malloc(n * sizeof *j->iovs);
    j->results = calloc(n, sizeof *j->results);
    if (!j->keys || !j->iovs || !j->results) {
        job_free(j);
        return NULL;
    }
    memcpy(j->iovs, iovs, n * sizeof *iovs);
    for (size_t i = 0; i < n; i++)
        if (!(j->keys[i] = strdup(keys[i]))) {
            job_free(j);
            return NULL;
        }
    return j;
}

int kvp_xq_submit(kvp_xq *q, uint64_t id, int op, const char *const *keys, const kvp_iov *iovs,
                  size_t n)
{
    if (!q || !keys || !iovs || n == 0 || (op != KVP_XQ_PUT && op != KVP_XQ_GET))
        return KVP_EINVALID_PARAMS;
    for (size_t i = 0; i < n; i++)
        if (!keys[i] || (!iovs[i].base && iovs[i].len))
            return KVP_EINVALID_PARAMS;
    job *j = job_new(id, op, keys, iovs, n);
    if (!j)
        return KVP_ENOMEM;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        job_free(j);
        return KVP_ECLOSED;
    }
    if (q->qtail)
        q->qtail->next = j;
    else
        q->qhead = j;
    q->qtail = j;
    q->queued++;
    q->pending++;
    pthread_cond_signal(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

size_t kvp_xq_poll(kvp_xq *q, kvp_xq_done *out, size_t cap)
{
    size_t m = 0;
    job *taken = NULL, **tail = &taken;
    pthread_mutex_lock(&q->mu);
    while (q->dhead && m < cap) {
        job *j = q->dhead;
        q->dhead = j->next;
        if (!q->dhead)
            q->dtail = NULL;
        j->next = NULL;
        *tail = j;
        tail = &j->next;
        q->pending--;
        m++;
    }
    pthread_mutex_unlock(&q->mu);
    size_t i = 0;
    for (job *j = taken, *nx; j; j = nx, i++) {
        nx = j->next;
        out[i] = (kvp_xq_done){.id = j->id, .op = j->op, .n = j->n, .results = j->results,
                               .bytes = j->bytes, .seconds = j->seconds};
        j->results = NULL; /* now the receiver's */
        job_free(j);
    }
    return m;
}

size_t kvp_xq_pending(kvp_xq *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->pending;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void kvp_xq_drain(kvp_xq *q)
{
    pthread_mutex_lock(&q->mu);
    while (q->queued || q->running)
        pthread_cond_wait(&q->idle_cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

void kvp_xq_destroy(kvp_xq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    pthread_cond_broadcast(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->nthreads; i++)
        pthread_join(q->th[i], NULL); /* each leaves once the queue is empty */
    for (job *j = q->dhead, *nx; j; j = nx) {
        nx = j->next;
        job_free(j);
    }
    for (job *j = q->qhead, *nx; j; j = nx) { /* only when no thread ever started */
        nx = j->next;
        job_free(j);
    }
    pthread_cond_destroy(&q->idle_cv);
    pthread_cond_destroy(&q->work_cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

void kvp_xq_done_free(kvp_xq_done *d)
{
    if (!d)
        return;
    free(d->results);
    d->results = NULL;
}
