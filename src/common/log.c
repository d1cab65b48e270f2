/* log.c -- leveled logging; one write(2) per line (see log.h for where the
 * level comes from). */
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* The process level; LEVEL_UNRESOLVED until the first log call reads
 * $KVPOOL_LOG_LEVEL (resolve()) or someone sets it. */
#define LEVEL_UNRESOLVED (-1)
static atomic_int log_level = LEVEL_UNRESOLVED;
/* $KVPOOL_LOG_LEVEL as read once by resolve(): a level, or -1 (unset or
 * invalid). Written inside pthread_once, read after it. */
static int env_level = -1;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
/* Where lines go: NULL = stderr. */
static _Atomic(const kvp_log_sink *) log_sink;

int kvp_log_env_level(void)
{
    const char *v = getenv(KVP_LOG_ENV);
    if (!v || !*v)
        return -1;
    int lv = kvp_log_level_parse(v);
    return lv >= 0 ? lv : -2;
}

/* Reads the environment once; an invalid value is reported once. */
static void env_read(void)
{
    int lv = kvp_log_env_level();
    env_level = lv >= 0 ? lv : -1;
    int unresolved = LEVEL_UNRESOLVED;
    atomic_compare_exchange_strong(&log_level, &unresolved, lv >= 0 ? lv : KVP_LOG_INFO);
    if (lv == -2 && atomic_load(&log_level) <= KVP_LOG_WARN) {
        char q[64];
        const char *v = getenv(KVP_LOG_ENV);
        size_t i = 0;
        for (; v && v[i] && i < sizeof q - 1; i++) /* no control bytes in the line */
            q[i] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
        q[i] = 0;
        kvp_log_write(KVP_LOG_WARN, "log",
                      "$%s=\"%s\" is not a log level (allowed: debug, info, warn, error, off); "
                      "ignored",
                      KVP_LOG_ENV, q);
    }
}

void kvp_log_set_level(int level) { atomic_store(&log_level, level); }

int kvp_log_get_level(void)
{
    int lv = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (__builtin_expect(lv != LEVEL_UNRESOLVED, 1))
        return lv;
    pthread_once(&env_once, env_read);
    return atomic_load(&log_level);
}

void kvp_log_set_configured(int level)
{
    pthread_once(&env_once, env_read);
    if (env_level < 0)
        atomic_store(&log_level, level);
}

const char *kvp_log_level_name(int level)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    return level >= KVP_LOG_DEBUG && level <= KVP_LOG_OFF ? names[level] : "?";
}

void kvp_log_set_sink(const kvp_log_sink *s) { atomic_store(&log_sink, s); }

int kvp_log_level_parse(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return KVP_LOG_WARN;
    return -1;
}

/* The last KVP_LOG_RECENT warnings and errors, oldest first from
 * recent_next (a ring under recent_mu). */
static struct {
    kvp_log_recent_line l[KVP_LOG_RECENT];
    uint64_t n; /* lines kept so far; the next goes to l[n % KVP_LOG_RECENT] */
} recent;
static pthread_mutex_t recent_mu = PTHREAD_MUTEX_INITIALIZER;

static void recent_keep(int level, const char *mod, const char *msg, size_t len,
                        const struct timespec *ts)
{
    pthread_mutex_lock(&recent_mu);
    kvp_log_recent_line *r = &recent.l[recent.n++ % KVP_LOG_RECENT];
    r->level = level;
    r->ms = (uint64_t)ts->tv_sec * 1000 + (uint64_t)ts->tv_nsec / 1000000;
    snprintf(r->mod, sizeof r->mod, "%s", mod);
    if (len >= sizeof r->msg)
        len = sizeof r->msg - 1;
    memcpy(r->msg, msg, len);
    r->msg[len] = '\0';
    pthread_mutex_unlock(&recent_mu);
}

size_t kvp_log_recent(kvp_log_recent_line *out, size_t max)
{
    pthread_mutex_lock(&recent_mu);
    uint64_t have = recent.n < KVP_LOG_RECENT ? recent.n : KVP_LOG_RECENT;
    size_t n = have < max ? (size_t)have : max;
    for (size_t i = 0; i < n; i++) /* the newest n, oldest first */
        out[i] = recent.l[(recent.n - n + i) % KVP_LOG_RECENT];
    pthread_mutex_unlock(&recent_mu);
    return n;
}

void kvp_log_write(int level, const char *mod, const char *fmt, ...)
{
    static const char lc[] = "DIWE";
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, lc[level & 3], mod);
    if (n < 0 || (size_t)n >= sizeof line - 2)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    line[len] = '\0';
    if (level >= KVP_LOG_WARN)
        recent_keep(level, mod, line + n, len - 1 - (size_t)n, &ts);
    const kvp_log_sink *sink = atomic_load(&log_sink);
    if (sink) {
        kvp_log_record r = {.level = level, .mod = mod, .msg = line + n,
                            .msg_len = len - 1 - (size_t)n, .line = line, .line_len = len,
                            .time = ts};
        sink->fn(sink->ctx, &r);
        return;
    }
    ssize_t w = write(2, line, len);
    (void)w;
}

int kvp_log_limit_take(kvp_log_limit *l, unsigned *suppressed)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
    int ok;
    pthread_mutex_lock(&mu);
    if (l->window_ms == 0 || now - l->window_ms >= KVP_LOG_WINDOW_MS) {
        l->window_ms = now ? now : 1;
        l->n = 0;
    }
    ok = l->n < KVP_LOG_BURST;
    *suppressed = 0;
    if (ok) {
        l->n++;
        *suppressed = l->suppressed;
        l->suppressed = 0;
    } else {
        l->suppressed++;
    }
    pthread_mutex_unlock(&mu);
    return ok;
}
