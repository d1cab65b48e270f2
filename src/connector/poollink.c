/*
 * poollink.c -- see poollink.h for the states and the contract. Internal
 * invariants:
 *   - mu guards state, since_ms, probe_now, stop, last_rc, logged_rc, the
 *     counters' snapshot at the outage's start and the buffer list; the
 *     counters are atomics (bumped lock-free by the worker's threads).
 *   - `client` is written once (open, or the link thread's attach), under
 *     mu, with a release store, after the recorded buffers were registered
 *     with it; `up` (1 exactly in UP) is stored under mu with release and
 *     read lock-free with acquire. So a thread that sees up == 1 sees the
 *     client and its registrations.
 *   - no client call is made while holding mu, except the local
 *     kvp_client_register_buffer (no request).
 */
#include "connector/poollink.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/mem.h"

#define MOD "worker"

enum state { ST_UP, ST_DETACHED, ST_SUSPECT, ST_DOWN };

typedef struct pbuf {
    void *base;
    size_t len;
} pbuf;

struct kvp_plink {
    char *config;       /* kvp_client_open's argument (NULL: the environment's file) */
    char master[256];   /* the configured master, for the log */
    kvp_client *client; /* NULL while DETACHED (see invariants) */
    int up;             /* atomic: the client is handed out (UP, SUSPECT) */

    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC: the link thread's waits */
    pthread_t th;
    int th_started;
    int stop;
    enum state state;
    uint64_t since_ms;  /* when the link left UP */
    int probe_now;      /* a suspicion: probe without waiting */
    int last_rc;        /* the failure that made it leave UP */
    int logged_rc;      /* the last retry failure logged (0 = none) */
    uint64_t snap[3];   /* the counters below when it left UP */
    pbuf *bufs;
    size_t nbufs, capbufs;

    uint64_t epoch;     /* atomic: times the pool became available (kvp_plink_epoch) */
    uint64_t outages;   /* atomic counters */
    uint64_t cnt[3];    /* by enum kvp_plink_skip */
};

static int outage_code(int rc) { return rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT; }

static uint64_t cnt(kvp_plink *p, int i) { return __atomic_load_n(&p->cnt[i], __ATOMIC_RELAXED); }

/* The configured master address, for the log ("?" when the configuration
 * cannot be read here: kvp_client_open then says why). */
static void master_name(kvp_plink *p)
{
    snprintf(p->master, sizeof p->master, "?");
    kvp_config *c = kvp_calloc(1, sizeof *c);
    char e[KVP_CONFIG_ERRLEN];
    if (!c)
        return;
    kvp_config_defaults(c);
    if (kvp_config_load_spec(c, p->config, e, sizeof e) == 0)
        snprintf(p->master, sizeof p->master, "%s", c->master_addr);
    memset(c, 0, sizeof *c); /* it holds the credentials */
    kvp_free(c);
}

/* Caller holds mu: the link leaves UP (st: DETACHED, SUSPECT). A SUSPECT
 * link keeps handing out its client until the probe confirms the outage: one
 * failed call (a timeout, a dead storage node failing every key) must not
 * fail the loads that start meanwhile while the pool is fine. */
static void leave_up_locked(kvp_plink *p, enum state st, int rc)
{
    p->state = st;
    if (st != ST_SUSPECT)
        __atomic_store_n(&p->up, 0, __ATOMIC_RELEASE);
    p->since_ms = kvp_now_ms();
    p->last_rc = rc;
    p->logged_rc = 0;
    for (int i = 0; i < 3; i++)
        p->snap[i] = cnt(p, i);
}

/* Caller holds mu: the pool answered. Logs the end of a confirmed outage. */
static void back_up_locked(kvp_plink *p)
{
    enum state was = p->state;
    double secs = (double)(kvp_now_ms() - p->since_ms) / 1000.0;
    p->state = ST_UP;
    p->probe_now = 0;
    __atomic_store_n(&p->up, 1, __ATOMIC_RELEASE);
    if (was != ST_SUSPECT)
        __atomic_add_fetch(&p->epoch, 1, __ATOMIC_RELEASE);
    if (was == ST_SUSPECT) {
        KVP_DEBUG(MOD, "the pool answers (master %s): the failure (%s) was not an outage",
                  p->master, kvp_err_name(p->last_rc));
        return;
    }
    KVP_INFO(MOD, "pool reachable again (master %s)%s after %.1f s without it: %llu store "
                  "jobs skipped, %llu lookups answered 0, %llu loads failed (recomputed) "
                  "meanwhile",
             p->master, was == ST_DETACHED ? ": attached" : "", secs,
             (unsigned long long)(cnt(p, KVP_PLINK_SKIP_STORE) - p->snap[KVP_PLINK_SKIP_STORE]),
             (unsigned long long)(cnt(p, KVP_PLINK_SKIP_LOOKUP) - p->snap[KVP_PLINK_SKIP_LOOKUP]),
             (unsigned long long)(cnt(p, KVP_PLINK_FAIL_LOAD) - p->snap[KVP_PLINK_FAIL_LOAD]));
}

/* Caller holds mu: a retry failed with rc (err: its message, may be ""). */
static void retry_failed_locked(kvp_plink *p, int rc, const char *err)
{
    if (p->state == ST_SUSPECT) {
        p->state = ST_DOWN;
        __atomic_store_n(&p->up, 0, __ATOMIC_RELEASE);
        __atomic_add_fetch(&p->outages, 1, __ATOMIC_RELAXED);
        p->logged_rc = rc;
        KVP_WARN(MOD, "pool unreachable (master %s: %s): the engine carries on without it -- "
                      "lookups answer 0, stores are skipped, loads fail and are recomputed -- "
                      "and reconnects once the master answers (retried every %u ms, backing "
                      "off to %u s)",
                 p->master, kvp_strerror(p->last_rc), KVP_PLINK_BACKOFF_MIN_MS,
                 KVP_PLINK_BACKOFF_MAX_MS / 1000);
        return;
    }
    if (rc == p->logged_rc ||
        (outage_code(rc) && (p->logged_rc == 0 || outage_code(p->logged_rc))))
        return; /* the outage goes on: said once */
    p->logged_rc = rc;
    KVP_WARN(MOD, "pool still unavailable (master %s): %s%s%s", p->master, kvp_strerror(rc),
             err && *err ? ": " : "", err ? err : "");
}

/* SUSPECT / DOWN: one EXIST of one key (one request; the client connects
 * first when it has no connection). 0 when the master answered. */
static int probe(kvp_plink *p)
{
    static const char *const key[1] = {"kvpool-link-probe"};
    int r = 0;
    int rc = kvp_client_exist(p->client, key, 1, &r);
    return rc < 0 ? rc : r < 0 ? r : 0;
}

static void *link_main(void *arg)
{
    kvp_plink *p = arg;
    uint32_t backoff = KVP_PLINK_BACKOFF_MIN_MS;
    char err[KVP_CONFIG_ERRLEN];
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->state == ST_UP) {
            backoff = KVP_PLINK_BACKOFF_MIN_MS;
            pthread_cond_wait(&p->cv, &p->mu);
        }
        if (p->stop)
            break;
        if (!p->probe_now) {
            struct timespec ts = kvp_deadline_ms(backoff);
            while (!p->stop && !p->probe_now &&
                   pthread_cond_timedwait(&p->cv, &p->mu, &ts) != ETIMEDOUT)
                ;
            if (p->stop)
                break;
        }
        p->probe_now = 0;
        int detached = p->state == ST_DETACHED;
        pthread_mutex_unlock(&p->mu);
        kvp_client *c = NULL;
        err[0] = 0;
        /* DETACHED: one kvp_client_open (bounded by rpc_timeout) */
        int rc = detached ? kvp_client_open(p->config, &c, err, sizeof err) : probe(p);
        pthread_mutex_lock(&p->mu);
        if (rc == 0 && c) {
            for (size_t i = 0; i < p->nbufs; i++) {
                int r = kvp_client_register_buffer(c, p->bufs[i].base, p->bufs[i].len);
                if (r != 0)
                    KVP_ERROR(MOD, "register_buffer(%p, %zu): %s", p->bufs[i].base,
                              p->bufs[i].len, kvp_err_name(r));
            }
            __atomic_store_n(&p->client, c, __ATOMIC_RELEASE);
        }
        if (rc == 0) {
            back_up_locked(p);
        } else {
            retry_failed_locked(p, rc, err);
            backoff = backoff >= KVP_PLINK_BACKOFF_MAX_MS / 2 ? KVP_PLINK_BACKOFF_MAX_MS
                                                              : backoff * 2;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kvp_plink_open(const char *store_config, kvp_plink **out, char *err, size_t errlen)
{
    char ebuf[KVP_CONFIG_ERRLEN];
    if (!err || !errlen) {
        err = ebuf;
        errlen = sizeof ebuf;
    }
    err[0] = 0;
    *out = NULL;
    kvp_plink *p = kvp_calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->state = ST_UP;
    if (store_config && !(p->config = kvp_strdup(store_config))) {
        kvp_plink_close(p);
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    kvp_client *c = NULL;
    int rc = kvp_client_open(p->config, &c, err, errlen);
    if (rc != 0 && !outage_code(rc)) {
        kvp_plink_close(p); /* a configuration error: said at once */
        return rc;
    }
    master_name(p);
    if (rc == 0) {
        p->client = c;
        p->up = 1;
        p->epoch = 1;
    } else {
        leave_up_locked(p, ST_DETACHED, rc); /* no other thread yet */
        p->outages = 1;
        KVP_WARN(MOD, "pool unreachable at start (master %s: %s): the engine runs without the "
                      "pool -- lookups answer 0, stores are skipped -- and attaches in the "
                      "background once the master answers (retried every %u ms, backing off "
                      "to %u s)",
                 p->master, err, KVP_PLINK_BACKOFF_MIN_MS, KVP_PLINK_BACKOFF_MAX_MS / 1000);
        err[0] = 0;
    }
    if (pthread_create(&p->th, NULL, link_main, p) != 0) {
        snprintf(err, errlen, "cannot start the pool link thread: %s", strerror(errno));
        kvp_plink_close(p);
        return KVP_EINTERNAL_ERROR;
    }
    p->th_started = 1;
    *out = p;
    return 0;
}

void kvp_plink_close(kvp_plink *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->th_started)
        pthread_join(p->th, NULL);
    if (p->client)
        kvp_client_close(p->client);
    kvp_free(p->bufs);
    if (p->config)
        explicit_bzero(p->config, strlen(p->config)); /* it may hold tokens */
    kvp_free(p->config);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    kvp_free(p);
}

kvp_client *kvp_plink_client(kvp_plink *p)
{
    if (!__atomic_load_n(&p->up, __ATOMIC_ACQUIRE))
        return NULL;
    return __atomic_load_n(&p->client, __ATOMIC_ACQUIRE);
}

uint64_t kvp_plink_epoch(kvp_plink *p) { return __atomic_load_n(&p->epoch, __ATOMIC_ACQUIRE); }

kvp_client *kvp_plink_any_client(kvp_plink *p)
{
    return __atomic_load_n(&p->client, __ATOMIC_ACQUIRE);
}

int kvp_plink_check(kvp_plink *p, int rc, const int64_t *res64, const int *res32, size_t n)
{
    int code = rc;
    if (rc >= 0) {
        if (n == 0)
            return 0;
        code = res64 ? (int)res64[0] : res32[0];
        for (size_t i = 0; i < n; i++)
            if (!outage_code(res64 ? (int)res64[i] : res32[i]))
                return 0;
    }
    if (!outage_code(code))
        return 0;
    pthread_mutex_lock(&p->mu);
    if (p->state == ST_UP) {
        leave_up_locked(p, ST_SUSPECT, code);
        p->probe_now = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return 1;
}

void kvp_plink_skipped(kvp_plink *p, enum kvp_plink_skip what)
{
    __atomic_add_fetch(&p->cnt[what], 1, __ATOMIC_RELAXED);
}

int kvp_plink_register_buffer(kvp_plink *p, void *base, size_t len)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (p->client) {
        rc = kvp_client_register_buffer(p->client, base, len);
    } else {
        if (p->nbufs == p->capbufs) {
            size_t nc = p->capbufs ? p->capbufs * 2 : 8;
            pbuf *nb = kvp_realloc(p->bufs, nc * sizeof *nb);
            if (nb) {
                p->bufs = nb;
                p->capbufs = nc;
            }
        }
        if (p->nbufs < p->capbufs)
            p->bufs[p->nbufs++] = (pbuf){base, len};
        else
            rc = KVP_ENOMEM;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void kvp_plink_status_get(kvp_plink *p, kvp_plink_status *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    out->available = p->state == ST_UP;
    out->attached = p->client != NULL;
    out->unavailable_ms = p->state == ST_UP ? 0 : kvp_now_ms() - p->since_ms;
    pthread_mutex_unlock(&p->mu);
    out->outages = __atomic_load_n(&p->outages, __ATOMIC_RELAXED);
    out->skipped_stores = cnt(p, KVP_PLINK_SKIP_STORE);
    out->skipped_lookups = cnt(p, KVP_PLINK_SKIP_LOOKUP);
    out->failed_loads = cnt(p, KVP_PLINK_FAIL_LOAD);
}
