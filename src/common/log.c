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


/* ------------------------------------------------------------- format */

#define FORMAT_UNRESOLVED (-1)
static atomic_int log_format = FORMAT_UNRESOLVED;
static int env_format = -1; /* like env_level */
static pthread_once_t env_format_once = PTHREAD_ONCE_INIT;
static _Thread_local const char *log_peer;

int kvp_log_format_parse(const char *s)
{
    if (strcasecmp(s, "text") == 0)
        return KVP_LOG_TEXT;
    if (strcasecmp(s, "json") == 0)
        return KVP_LOG_JSON;
    return -1;
}

const char *kvp_log_format_name(int format)
{
    return format == KVP_LOG_TEXT ? "text" : format == KVP_LOG_JSON ? "json" : "?";
}

int kvp_log_env_format(void)
{
    const char *v = getenv(KVP_LOG_FORMAT_ENV);
    if (!v || !*v)
        return -1;
    int f = kvp_log_format_parse(v);
    return f >= 0 ? f : -2;
}

static void env_format_read(void)
{
    int f = kvp_log_env_format();
    env_format = f >= 0 ? f : -1;
    int unresolved = FORMAT_UNRESOLVED;
    atomic_compare_exchange_strong(&log_format, &unresolved, f >= 0 ? f : KVP_LOG_TEXT);
    if (f == -2 && kvp_log_get_level() <= KVP_LOG_WARN) {
        char q[64];
        const char *v = getenv(KVP_LOG_FORMAT_ENV);
        size_t i = 0;
        for (; v && v[i] && i < sizeof q - 1; i++)
            q[i] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
        q[i] = 0;
        kvp_log_write(KVP_LOG_WARN, "log",
                      "$%s=\"%s\" is not a log format (allowed: text, json); ignored",
                      KVP_LOG_FORMAT_ENV, q);
    }
}

void kvp_log_set_format(int format) { atomic_store(&log_format, format); }

int kvp_log_get_format(void)
{
    int f = atomic_load_explicit(&log_format, memory_order_relaxed);
    if (__builtin_expect(f != FORMAT_UNRESOLVED, 1))
        return f;
    pthread_once(&env_format_once, env_format_read);
    return atomic_load(&log_format);
}

void kvp_log_set_configured_format(int format)
{
    pthread_once(&env_format_once, env_format_read);
    if (env_format < 0)
        atomic_store(&log_format, format);
}

void kvp_log_set_peer(const char *peer) { log_peer = peer; }
const char *kvp_log_get_peer(void) { return log_peer; }

/* ------------------------------------------------------------- render */

/* Length of the well-formed UTF-8 sequence at p[0..n) (n >= 1), 0 if the
 * bytes there are not one (stray continuation, overlong, surrogate, above
 * U+10FFFF, cut short). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* bounds of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return 0;
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return len;
}

/* Appends s[0..n) as a JSON string body (no quotes) to out[*len..cap),
 * stopping before the first unit that does not fit. */
static void json_escape(char *out, size_t cap, size_t *len, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *u = esc;
        size_t ul, adv = 1;
        unsigned c = p[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, ul = 2;
        } else if (c == '\n') {
            u = "\\n", ul = 2;
        } else if (c == '\r') {
            u = "\\r", ul = 2;
        } else if (c == '\t') {
            u = "\\t", ul = 2;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4], esc[5] = hex[c & 15], ul = 6;
        } else if (c < 0x80) {
            esc[0] = (char)c, ul = 1;
        } else if ((adv = utf8_len(p + i, n - i)) != 0) {
            u = s + i, ul = adv;
        } else {
            u = "\\ufffd", ul = 6, adv = 1;
        }
        if (*len + ul >= cap)
            return;
        memcpy(out + *len, u, ul);
        *len += ul;
        i += adv;
    }
}

static void put_str(char *out, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (*len + n >= cap)
        n = *len + 1 >= cap ? 0 : cap - 1 - *len;
    memcpy(out + *len, s, n);
    *len += n;
}

size_t kvp_log_render(char *out, size_t cap, int format, const struct timespec *ts, int level,
                      const char *mod, const char *peer, const char *msg, size_t msg_len)
{
    static const char lc[] = "DIWE";
    if (cap < 2)
        return 0;
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    char t[96];
    snprintf(t, sizeof t, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (ts->tv_nsec / 1000000) % 1000);
    size_t len = 0, room = cap - 1; /* the newline's byte is kept */
    if (format == KVP_LOG_JSON) {
        room = cap > 3 ? cap - 2 : 1; /* and the closing brace */
        put_str(out, room, &len, "{\"ts\":\"");
        put_str(out, room, &len, t);
        put_str(out, room, &len, "\",\"level\":\"");
        put_str(out, room, &len, kvp_log_level_name(level));
        put_str(out, room, &len, "\",\"component\":\"");
        json_escape(out, room, &len, mod, strlen(mod));
        if (peer) {
            put_str(out, room, &len, "\",\"peer\":\"");
            json_escape(out, room, &len, peer, strlen(peer));
        }
        put_str(out, room, &len, "\",\"msg\":\"");
        /* the closing quote must fit: escape into room - 1 */
        json_escape(out, room - 1 > len ? room - 1 : len + 1, &len, msg, msg_len);
        out[len++] = '"';
        out[len++] = '}';
    } else {
        char c[2] = {lc[level & 3], 0};
        put_str(out, room, &len, t);
        put_str(out, room, &len, " ");
        put_str(out, room, &len, c);
        put_str(out, room, &len, " ");
        put_str(out, room, &len, mod);
        if (peer) {
            put_str(out, room, &len, " peer=");
            put_str(out, room, &len, peer);
        }
        put_str(out, room, &len, ": ");
        size_t n = msg_len;
        if (len + n >= room)
            n = room - 1 > len ? room - 1 - len : 0;
        memcpy(out + len, msg, n);
        len += n;
    }
    out[len++] = '\n';
    out[len] = '\0';
    return len;
}

void kvp_log_write(int level, const char *mod, const char *fmt, ...)
{
    char msg[1024];
    char line[8192]; /* a json line: each message byte at most 6 */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t mlen = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
    const char *peer = log_peer;
    int format = kvp_log_get_format();
    size_t len = kvp_log_render(line, sizeof line, format, &ts, level, mod, peer, msg, mlen);
    if (level >= KVP_LOG_WARN)
        recent_keep(level, mod, msg, mlen, &ts);
    const kvp_log_sink *sink = atomic_load(&log_sink);
    if (sink) {
        kvp_log_record r = {.level = level, .mod = mod, .msg = msg, .msg_len = mlen,
                            .line = line, .line_len = len, .time = ts, .peer = peer};
        /* text: the message is the line's tail, as it always was */
        const char *tail = format == KVP_LOG_TEXT ? strstr(line, ": ") : NULL;
        if (tail && tail + 2 <= line + len - 1) {
            r.msg = tail + 2;
            r.msg_len = (size_t)(line + len - 1 - r.msg);
        }
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
