/* leader.c -- election, keepalive and resolution of the master's term
 * (contracts in leader.h). */
#include "ha/leader.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"

#define MOD "ha"
#define CALL_MS 1000 /* each etcd call, per endpoint */

void kvp_leader_key(const char *cluster, char *out, size_t outlen)
{
    snprintf(out, outlen, "/kvpool/%s/leader", cluster);
}

int kvp_leader_parse_value(const uint8_t *v, size_t n, kvp_leader_info *info)
{
    memset(info, 0, sizeof *info);
    json_error_t je;
    json_t *j = json_loadb((const char *)v, n, JSON_REJECT_DUPLICATES, &je);
    json_t *a = json_object_get(j, "addr"), *id = json_object_get(j, "id");
    int rc = KVP_EPROTOCOL;
    if (json_is_object(j) && json_is_string(a) && json_string_length(a) >= 3 &&
        json_string_length(a) <= KVP_LEADER_ADDR_MAX && strlen(json_string_value(a)) ==
                                                            json_string_length(a) &&
        strchr(json_string_value(a), ':') && (!id || json_is_string(id))) {
        char *end = NULL;
        errno = 0;
        if (id) {
            const char *s = json_string_value(id);
            info->id = strtoull(s, &end, 16);
        }
        if (!id || (errno == 0 && end && *end == '\0' && end != json_string_value(id))) {
            memcpy(info->addr, json_string_value(a), json_string_length(a));
            rc = 0;
        }
    }
    json_decref(j);
    return rc;
}

/* The record at key through handle e (*lease, may be NULL: its lease). */
static int read_record(kvp_etcd *e, const char *key, kvp_leader_info *info, int *found,
                       uint64_t *lease)
{
    uint8_t v[1024];
    kvp_etcd_kv kv;
    bool f = false;
    int rc = kvp_etcd_get(e, key, v, sizeof v, &kv, &f);
    *found = f;
    if (rc || !f)
        return rc;
    if ((rc = kvp_leader_parse_value(v, kv.value_len, info)) != 0)
        return rc;
    info->epoch = kv.create_revision;
    if (lease)
        *lease = kv.lease;
    return 0;
}

/* A handle on the etcd an etcd:// address names (*t: the parsed address). */
static int open_url(const char *url, kvp_etcd_target *t, kvp_etcd **e, char *err, size_t errlen)
{
    int rc = kvp_etcd_parse_url(url, t, err, errlen);
    if (rc)
        return rc;
    if ((rc = kvp_etcd_open(t, CALL_MS, e)) != 0)
        snprintf(err, errlen, "%s: cannot use etcd (%s)", url, kvp_strerror(rc));
    return rc;
}

int kvp_leader_resolve(const char *addr, char *out, size_t outlen, kvp_leader_info *info,
                       char *err, size_t errlen)
{
    if (!kvp_etcd_is_url(addr)) {
        if (snprintf(out, outlen, "%s", addr) >= (int)outlen) {
            snprintf(err, errlen, "address too long");
            return KVP_EINVALID_PARAMS;
        }
        return 0;
    }
    kvp_etcd_target t;
    kvp_etcd *e;
    int rc = open_url(addr, &t, &e, err, errlen);
    if (rc)
        return rc;
    char key[KVP_ETCD_MAX_CLUSTER + 32];
    kvp_leader_key(t.cluster, key, sizeof key);
    kvp_leader_info li;
    int found = 0;
    rc = read_record(e, key, &li, &found, NULL);
    if (rc)
        snprintf(err, errlen, "%s: %s", addr,
                 rc == KVP_EPROTOCOL ? "the leader record is malformed" : kvp_etcd_last_error(e));
    else if (!found) {
        snprintf(err, errlen, "%s: no leader elected in cluster %s", addr, t.cluster);
        rc = KVP_ERPC_FAIL;
    } else if (snprintf(out, outlen, "%s", li.addr) >= (int)outlen) {
        rc = KVP_EINVALID_PARAMS;
    } else if (info) {
        *info = li;
    }
    kvp_etcd_close(e);
    return rc;
}

struct members {
    kvp_leader_info *v;
    int max, n;
};

static int add_member(const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                      const kvp_etcd_kv *kv, void *arg)
{
    struct members *m = arg;
    (void)key;
    (void)klen;
    kvp_leader_info li;
    if (kvp_leader_parse_value(val, vlen, &li) != 0)
        return 0; /* not a member record we can read: skipped */
    li.epoch = kv->create_revision;
    if (m->n < m->max)
        m->v[m->n] = li;
    m->n++;
    return 0;
}

int kvp_leader_cluster(const char *url, kvp_leader_info *leader, int *has_leader,
                       kvp_leader_info *members, int max, int *n, char *err, size_t errlen)
{
    kvp_etcd_target t;
    kvp_etcd *e;
    int rc = open_url(url, &t, &e, err, errlen);
    if (rc)
        return rc;
    char key[KVP_ETCD_MAX_CLUSTER + 32], prefix[KVP_ETCD_MAX_CLUSTER + 32];
    kvp_leader_key(t.cluster, key, sizeof key);
    snprintf(prefix, sizeof prefix, "/kvpool/%s/members/", t.cluster);
    rc = read_record(e, key, leader, has_leader, NULL);
    struct members m = {members, max, 0};
    if (rc == 0)
        rc = kvp_etcd_list(e, prefix, add_member, &m);
    if (rc)
        snprintf(err, errlen, "%s: %s", url, kvp_etcd_last_error(e));
    *n = m.n;
    kvp_etcd_close(e);
    return rc;
}

/* ------------------------------------------------------------ candidate */

struct kvp_leader {
    int (*defer)(void *arg); /* kvp_leader_set_defer */
    void *defer_arg;
    uint64_t defer_ms;
    kvp_etcd_target t;
    kvp_etcd *e;  /* the campaign's and close's */
    kvp_etcd *ka; /* the keepalive thread's */
    char key[KVP_ETCD_MAX_CLUSTER + 32];
    char value[KVP_LEADER_ADDR_MAX + 64];
    int64_t ttl_ask;
    uint64_t id; /* this master's instance id (in its records' values) */
    uint64_t lease, epoch;
    pthread_t th;
    int th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    int lost_term; /* the keepalive gave the term up: close makes no etcd call */
    uint64_t valid_until; /* kvp_now_ms until which the term is surely ours */
    uint64_t last_sent;   /* kvp_now_ms of the last lease grant or renewal sent */
    int member_put;       /* the member record is under the current lease */
    char member_key[KVP_ETCD_MAX_CLUSTER + 48];
    void (*renewed)(void *, uint64_t);
    void (*lost)(void *, const char *);
    void *arg;
};

int kvp_leader_open(const kvp_etcd_target *t, int64_t ttl_s, const char *addr, uint64_t id,
                    kvp_leader **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!t || ttl_s < 1 || ttl_s > 3600 || !addr || strlen(addr) > KVP_LEADER_ADDR_MAX) {
        snprintf(err, errlen, "invalid leader parameters");
        return KVP_EINVALID_PARAMS;
    }
    kvp_leader *l = kvp_calloc(1, sizeof *l);
    if (!l)
        return KVP_ENOMEM;
    l->t = *t;
    l->ttl_ask = ttl_s;
    l->id = id;
    kvp_leader_key(t->cluster, l->key, sizeof l->key);
    snprintf(l->member_key, sizeof l->member_key, "/kvpool/%s/members/%016" PRIx64, t->cluster,
             id);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, id);
    json_t *v = json_pack("{s:s, s:s}", "addr", addr, "id", hex);
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s || strlen(s) >= sizeof l->value) {
        free(s);
        kvp_free(l);
        return KVP_ENOMEM;
    }
    strcpy(l->value, s);
    free(s);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int rc = kvp_etcd_open(t, CALL_MS, &l->e);
    if (rc) {
        snprintf(err, errlen, "etcd: %s", kvp_strerror(rc));
        kvp_leader_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

uint64_t kvp_leader_epoch(const kvp_leader *l) { return l->epoch; }

/* The candidate's lease, held for its whole life (its member record, then
 * its term): granted when missing or expired, renewed every TTL/3 while it
 * stands by; the member record is put under it. */
static int hold_lease(kvp_leader *l)
{
    uint64_t now = kvp_now_ms(), ttl_ms = (uint64_t)l->ttl_ask * 1000;
    int rc;
    if (l->lease && now - l->last_sent >= ttl_ms / 3) {
        int64_t ttl;
        rc = kvp_etcd_lease_keepalive(l->e, l->lease, &ttl);
        if (rc == KVP_ELEASE_EXPIRED)
            l->lease = 0, l->member_put = 0;
        else if (rc)
            return rc;
        else
            l->last_sent = now;
    }
    if (!l->lease) {
        uint64_t id;
        if ((rc = kvp_etcd_lease_grant(l->e, l->ttl_ask, &id)) != 0)
            return rc;
        l->lease = id;
        l->last_sent = now;
    }
    if (!l->member_put) {
        rc = kvp_etcd_put(l->e, l->member_key, l->value, strlen(l->value), l->lease, NULL);
        if (rc == KVP_ELEASE_EXPIRED)
            l->lease = 0;
        if (rc)
            return rc;
        l->member_put = 1;
    }
    return 0;
}

/* The campaign won the term of epoch. The lease was last renewed before the
 * campaign's calls (grant, member record, transaction: each an fsync in etcd,
 * slow on a loaded machine), so that much of the TTL may be gone already --
 * past 3/4 of it the keepalive would give the term up before trying. It is
 * renewed once more here, so the term starts with the whole window; when
 * that renewal fails, the window stays what it was (the keepalive decides). */
static void won_term(kvp_leader *l, uint64_t epoch)
{
    l->epoch = epoch;
    uint64_t ttl_ms = (uint64_t)l->ttl_ask * 1000, now = kvp_now_ms();
    int64_t left = 0;
    if (kvp_etcd_lease_keepalive(l->e, l->lease, &left) == 0 && left > 0)
        l->last_sent = now; /* sent at now or later */
    /* the lease cannot expire before its last renewal + TTL */
    l->valid_until = l->last_sent + ttl_ms - ttl_ms / 4;
    KVP_INFO(MOD, "leader of cluster %s at epoch %" PRIu64 " (lease TTL %" PRId64 " s)",
             l->t.cluster, l->epoch, l->ttl_ask);
}

void kvp_leader_set_defer(kvp_leader *l, int (*defer)(void *arg), void *arg, uint64_t max_ms)
{
    l->defer = defer;
    l->defer_arg = arg;
    l->defer_ms = max_ms;
}

int kvp_leader_campaign(kvp_leader *l, int (*stop)(void *arg), void *arg)
{
    uint64_t seen_epoch = 0, last_warn = 0, gone_ms = 0;
    int deferred = 0;
    for (;;) {
        if (stop && stop(arg))
            return KVP_ECLOSED;
        kvp_leader_info cur;
        int found = 0;
        int rc = hold_lease(l);
        uint64_t cur_lease = 0;
        if (rc == 0)
            rc = read_record(l->e, l->key, &cur, &found, &cur_lease);
        /* our own record (a campaign whose answer was lost, applied all the
         * same, then retried elsewhere): the term is ours */
        int ours = rc == 0 && found && cur.id == l->id && cur_lease == l->lease;
        if (ours) {
            won_term(l, cur.epoch);
            return 0;
        }
        if (rc == 0 && found) { /* a standby: wait for the record to go */
            if (cur.epoch != seen_epoch)
                KVP_INFO(MOD, "standby: the leader of cluster %s is %s (epoch %" PRIu64 ")",
                         l->t.cluster, cur.addr, cur.epoch);
            seen_epoch = cur.epoch;
            gone_ms = 0;
            usleep(KVP_LEADER_POLL_MS * 1000);
            continue;
        }
        /* the leader is gone: a candidate not ready to lead (a standby that
         * has not got the index yet) lets a ready one go first, for a while */
        if (rc == 0 && seen_epoch && l->defer && l->defer(l->defer_arg)) {
            uint64_t now = kvp_now_ms();
            if (!gone_ms)
                gone_ms = now;
            if (now - gone_ms < l->defer_ms) {
                if (!deferred++)
                    KVP_INFO(MOD, "cluster %s: the leader is gone; not campaigning for up to "
                                  "%" PRIu64 " ms (this standby has not got the index)",
                             l->t.cluster, l->defer_ms);
                usleep(KVP_LEADER_POLL_MS * 1000);
                continue;
            }
        }
        bool won = false;
        kvp_etcd_kv h;
        uint8_t hv[1024];
        if (rc == 0 || rc == KVP_EPROTOCOL) /* no record, or one nobody can use */
            rc = kvp_etcd_campaign(l->e, l->key, l->value, strlen(l->value), l->lease, &won, &h,
                                   hv, sizeof hv);
        if (rc == 0 && (won || h.lease == l->lease)) { /* h.lease: ours, see above */
            won_term(l, h.create_revision);
            return 0;
        }
        if (rc == KVP_ELEASE_EXPIRED)
            l->lease = 0, l->member_put = 0;
        if (rc == KVP_EAUTH) { /* a wrong password does not get better by retrying */
            KVP_ERROR(MOD, "cluster %s: %s", l->t.cluster, kvp_etcd_last_error(l->e));
            return KVP_EAUTH;
        }
        if (rc) {
            uint64_t now = kvp_now_ms();
            if (now - last_warn > 5000) {
                KVP_WARN(MOD, "cluster %s: %s (retrying)", l->t.cluster, kvp_etcd_last_error(l->e));
                last_warn = now;
            }
            usleep(KVP_LEADER_POLL_MS * 5 * 1000);
        }
    }
}

/* After a renewal: the leader record must still be this term's (our id,
 * our epoch). etcd is the root of trust: a record deleted or overwritten
 * (by an operator, or by whoever holds etcd's write access) lets a standby
 * win a new epoch while our lease is still valid, so the term is given up
 * here rather than at the lease's end: no two leaders past one renewal
 * period. NULL while it is ours, or when etcd could not say (the lease
 * logic decides then); else the reason, in buf. */
static const char *check_record(kvp_leader *l, char *buf, size_t len)
{
    kvp_leader_info cur;
    int found = 0;
    uint64_t lease = 0;
    int rc = read_record(l->ka, l->key, &cur, &found, &lease);
    if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT) {
        KVP_WARN(MOD, "leader record check: %s (retrying at the next renewal)",
                 kvp_etcd_last_error(l->ka));
        return NULL;
    }
    if (rc == 0 && found && cur.id == l->id && cur.epoch == l->epoch && lease == l->lease)
        return NULL;
    if (rc)
        snprintf(buf, len, "the leader record is unreadable (%s)", kvp_strerror(rc));
    else if (!found)
        snprintf(buf, len, "the leader record was deleted");
    else
        snprintf(buf, len, "the leader record names another term (id %016" PRIx64
                           ", epoch %" PRIu64 ")", cur.id, cur.epoch);
    return buf;
}

/* Renews every TTL/3 (after a failure: again in 100 ms), and after each
 * renewal checks the leader record (check_record). The term is given
 * up as soon as a renewal could no longer end within 3/4 of the TTL from the
 * last good one: the lease may then lapse before this master stops, and a
 * standby serve beside it. Each renewal is bounded by TTL/4 (the handle's
 * timeout), so that decision falls before the lease can expire. */
static void *keepalive_main(void *arg)
{
    kvp_leader *l = arg;
    uint64_t ttl_ms = (uint64_t)l->ttl_ask * 1000, limit = ttl_ms - ttl_ms / 4;
    uint64_t every = ttl_ms / 3 > 200 ? ttl_ms / 3 : 200, call_ms = ttl_ms / 4;
    uint64_t last_ok = l->last_sent, now0 = kvp_now_ms();
    uint64_t wait = last_ok + every > now0 ? last_ok + every - now0 : 0;
    const char *why = NULL;
    char buf[300];
    pthread_mutex_lock(&l->mu);
    while (!l->quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (wait % 1000) * 1000000ull;
        ts.tv_sec += (time_t)(wait / 1000 + ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        if (l->quit)
            break;
        pthread_mutex_unlock(&l->mu);
        uint64_t now = kvp_now_ms();
        if (now - last_ok + call_ms > limit) {
            snprintf(buf, sizeof buf, "no lease renewal for %" PRIu64 " ms (%s)", now - last_ok,
                     kvp_etcd_last_error(l->ka));
            why = buf;
        } else {
            int64_t ttl = 0;
            int rc = kvp_etcd_lease_keepalive(l->ka, l->lease, &ttl);
            if (rc == 0) {
                last_ok = now; /* the renewal was sent at now or later */
                why = check_record(l, buf, sizeof buf);
                if (!why) { /* the term's deadline moves only while the record is ours */
                    __atomic_store_n(&l->valid_until, now + limit, __ATOMIC_RELEASE);
                    if (l->renewed)
                        l->renewed(l->arg, now + limit);
                }
                /* the next renewal counts from this one, not from the check */
                uint64_t spent = kvp_now_ms() - now;
                wait = spent < every ? every - spent : 0;
            } else if (rc == KVP_ELEASE_EXPIRED) {
                why = "the lease expired";
            } else {
                KVP_WARN(MOD, "lease renewal: %s (retrying)", kvp_etcd_last_error(l->ka));
                wait = 100;
            }
        }
        pthread_mutex_lock(&l->mu);
        if (why)
            break;
    }
    pthread_mutex_unlock(&l->mu);
    if (why) {
        KVP_ERROR(MOD, "lost the leadership of cluster %s (epoch %" PRIu64 "): %s", l->t.cluster,
                  l->epoch, why);
        __atomic_store_n(&l->lost_term, 1, __ATOMIC_RELEASE);
        l->lost(l->arg, why);
    }
    return NULL;
}

uint64_t kvp_leader_valid_until(const kvp_leader *l)
{
    return __atomic_load_n(&l->valid_until, __ATOMIC_ACQUIRE);
}

int kvp_leader_start_keepalive(kvp_leader *l, void (*lost)(void *arg, const char *why),
                               void (*renewed)(void *arg, uint64_t valid_until_ms), void *arg)
{
    if (!l || !l->lease || !lost || l->th_started)
        return KVP_EINVALID_PARAMS;
    l->lost = lost;
    l->renewed = renewed;
    l->arg = arg;
    int rc = kvp_etcd_open(&l->t, (int)(l->ttl_ask * 1000 / 4), &l->ka);
    if (rc)
        return rc;
    if (pthread_create(&l->th, NULL, keepalive_main, l) != 0)
        return KVP_ENOMEM;
    l->th_started = 1;
    return 0;
}

void kvp_leader_close(kvp_leader *l)
{
    if (!l)
        return;
    if (l->th_started) {
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->th, NULL);
    }
    int lost = __atomic_load_n(&l->lost_term, __ATOMIC_ACQUIRE);
    if (l->e && l->epoch && !lost) {
        bool deleted = false;
        if (kvp_etcd_resign(l->e, l->key, l->epoch, &deleted) == 0 && deleted)
            KVP_INFO(MOD, "resigned the leadership of cluster %s (epoch %" PRIu64 ")",
                     l->t.cluster, l->epoch);
    }
    if (l->e && l->lease && !lost) /* the member record goes with it */
        (void)kvp_etcd_lease_revoke(l->e, l->lease);
    kvp_etcd_close(l->e);
    kvp_etcd_close(l->ka);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    kvp_free(l);
}
