/* log.c -- leveled logging; one write(2) per line. */
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = KVP_LOG_INFO;

void kvp_log_set_level(int level) { atomic_store(&log_level, level); }
int kvp_log_get_level(void) { return atomic_load(&log_level); }

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
    if (n < 0)
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
