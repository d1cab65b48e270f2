/*
 * log.h -- leveled logging to stderr (or to a sink, see kvp_log_set_sink).
 * Lines look like: "2026-11-29T08:57:17.123Z W master: message", or, while
 * the thread serves a connection (kvp_log_set_peer),
 * "2026-11-29T08:57:17.123Z W master peer=10.0.0.1:5555: message".
 * Thread-safe: each line is written with one write(2).
 *
 * With the json format (kvp_log_set_format) each line is one JSON object:
 *   {"ts":"2026-11-29T08:57:17.123Z","level":"warn","component":"master",
 *    "peer":"10.0.0.1:5555","msg":"message"}
 * ("peer" only when known). Every string is escaped byte by byte: '"' and
 * '\' as \" and \\, \n \r \t, other bytes below 0x20 and 0x7f as \u00XX,
 * well-formed UTF-8 as is, and each byte of an ill-formed UTF-8 sequence
 * as \ufffd, so a line is always valid JSON (and valid UTF-8).
 * The format comes from, strongest first: kvp_log_set_format (the CLI's
 * resolved --log-format), $KVPOOL_LOG_FORMAT (text | json, any case; an
 * invalid value is ignored with one WARN line), kvp_log_set_configured_format
 * (a client's configuration "log_format"), the default text -- the same
 * rules as the level's below.
 *
 * The level is process-wide (one per process, shared by every client,
 * node and master in it). Where it comes from, strongest first:
 *   1. kvp_log_set_level: an explicit call (the CLI's resolved level,
 *      Python's kvpool.set_log_level, tests). Sets it unconditionally.
 *   2. $KVPOOL_LOG_LEVEL (debug | info | warn | error | off, any case),
 *      read once, at the first log call. It beats every configuration's
 *      "log_level" (kvp_log_set_configured). An invalid value is ignored
 *      with one WARN line naming it (the CLI refuses it: exit status 2).
 *   3. kvp_log_set_configured: a configuration that gives "log_level"
 *      explicitly (kvp_client_open, the connector's open paths). Several
 *      configurations in one process: the last one applied wins. A
 *      configuration without the key leaves the level alone.
 *   4. The default, info.
 * (The CLI resolves flag > environment > file itself and calls 1.)
 */
#ifndef KVP_LOG_H
#define KVP_LOG_H

#include <stddef.h>
#include <time.h>

enum kvp_log_level { KVP_LOG_DEBUG = 0, KVP_LOG_INFO, KVP_LOG_WARN, KVP_LOG_ERROR, KVP_LOG_OFF };

/* The name of the environment variable (rule 2 above). */
#define KVP_LOG_ENV "KVPOOL_LOG_LEVEL"

void kvp_log_set_level(int level);
int kvp_log_get_level(void);
/* Rule 3: sets the level unless $KVPOOL_LOG_LEVEL holds a valid level. */
void kvp_log_set_configured(int level);
/* $KVPOOL_LOG_LEVEL now: its level, -1 when unset or empty, -2 when invalid. */
int kvp_log_env_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns -1 if unknown. */
int kvp_log_level_parse(const char *s);
/* "debug", "info", "warn", "error", "off" ("?" for anything else). */
const char *kvp_log_level_name(int level);
void kvp_log_write(int level, const char *mod, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Line formats (see above). */
enum kvp_log_format { KVP_LOG_TEXT = 0, KVP_LOG_JSON };
#define KVP_LOG_FORMAT_ENV "KVPOOL_LOG_FORMAT"
void kvp_log_set_format(int format);
int kvp_log_get_format(void);
/* Sets the format unless $KVPOOL_LOG_FORMAT holds a valid format. */
void kvp_log_set_configured_format(int format);
/* $KVPOOL_LOG_FORMAT now: its format, -1 when unset or empty, -2 when invalid. */
int kvp_log_env_format(void);
/* Parses "text", "json" (any case); -1 if unknown. */
int kvp_log_format_parse(const char *s);
/* "text", "json" ("?" for anything else). */
const char *kvp_log_format_name(int format);

/*
 * The peer this thread is serving ("HOST:PORT", or NULL for none): every
 * line the thread logs while it is set carries it. Servers set it around
 * the work of one connection and clear it after. `peer` is not copied: it
 * must stay valid (and unchanged) until cleared or replaced.
 */
void kvp_log_set_peer(const char *peer);
const char *kvp_log_get_peer(void);

/*
 * Renders one line (with its newline) into out[cap] in `format`; returns
 * its length (< cap: cut to fit, never in the middle of an escape, the
 * newline kept). peer may be NULL. kvp_log_write uses it; exposed for tests.
 */
size_t kvp_log_render(char *out, size_t cap, int format, const struct timespec *ts, int level,
                      const char *mod, const char *peer, const char *msg, size_t msg_len);

/*
 * Sink: where lines go instead of stderr (the Python extension turns them
 * into `logging` records). One record per line, passed to fn(ctx, r) on
 * the thread that logs, which may hold any of the library's mutexes: fn
 * must not block, must not log, and must not take a lock a logging thread
 * may be waiting for (no GIL, no Python). r and its strings are valid
 * during the call only. `s` must stay valid while any thread may log (in
 * practice: static); NULL restores stderr. The level filter applies before
 * the sink.
 */
typedef struct kvp_log_record {
    int level;            /* KVP_LOG_DEBUG .. KVP_LOG_ERROR */
    const char *mod;      /* "client", "node", ... (NUL-terminated) */
    const char *msg;      /* the message, no prefix, no newline (text format: the
                             line's tail, just before its newline) */
    size_t msg_len;
    const char *line;     /* the whole stderr line, with its newline (in the format) */
    size_t line_len;
    struct timespec time; /* CLOCK_REALTIME when it was logged */
    const char *peer;     /* the thread's peer (kvp_log_set_peer), or NULL */
} kvp_log_record;
typedef struct kvp_log_sink {
    void (*fn)(void *ctx, const kvp_log_record *r);
    void *ctx;
} kvp_log_sink;
void kvp_log_set_sink(const kvp_log_sink *s);

#define kvp_log(level, mod, ...)                                               \
    do {                                                                       \
        if ((level) >= kvp_log_get_level())                                    \
            kvp_log_write((level), (mod), __VA_ARGS__);                        \
    } while (0)
#define KVP_DEBUG(mod, ...) kvp_log(KVP_LOG_DEBUG, mod, __VA_ARGS__)
#define KVP_INFO(mod, ...) kvp_log(KVP_LOG_INFO, mod, __VA_ARGS__)
#define KVP_WARN(mod, ...) kvp_log(KVP_LOG_WARN, mod, __VA_ARGS__)
#define KVP_ERROR(mod, ...) kvp_log(KVP_LOG_ERROR, mod, __VA_ARGS__)

/*
 * The last KVP_LOG_RECENT warnings and errors written (sink or not, the
 * level filter applied), for the status page: kvp_log_recent copies the
 * newest max of them, oldest first, and returns how many. Thread-safe.
 */
#define KVP_LOG_RECENT 32
typedef struct kvp_log_recent_line {
    int level;
    unsigned long long ms; /* CLOCK_REALTIME, ms */
    char mod[16];
    char msg[240];
} kvp_log_recent_line;
size_t kvp_log_recent(kvp_log_recent_line *out, size_t max);

/*
 * Rate-limited lines, for anything a peer can trigger at will (a bad frame,
 * a refused connection, EMFILE): at most KVP_LOG_BURST lines per call site
 * per KVP_LOG_WINDOW_MS; the first line after a quiet window says how many
 * were suppressed. Thread-safe (the state is per call site, under a lock).
 */
#define KVP_LOG_BURST 5
#define KVP_LOG_WINDOW_MS 10000
typedef struct kvp_log_limit {
    unsigned long long window_ms; /* start of the current window */
    unsigned n, suppressed;
} kvp_log_limit;
/* 1 when a line may be written now; *suppressed = lines dropped before it. */
int kvp_log_limit_take(kvp_log_limit *l, unsigned *suppressed);

#define kvp_log_limited(level, mod, fmt, ...)                                  \
    do {                                                                       \
        static kvp_log_limit kvp__ll;                                          \
        unsigned kvp__sup;                                                     \
        if ((level) >= kvp_log_get_level() && kvp_log_limit_take(&kvp__ll, &kvp__sup)) { \
            if (kvp__sup)                                                      \
                kvp_log_write((level), (mod), fmt " (%u similar lines suppressed)", \
                              ##__VA_ARGS__, kvp__sup);                        \
            else                                                               \
                kvp_log_write((level), (mod), fmt, ##__VA_ARGS__);             \
        }                                                                      \
    } while (0)
#define KVP_WARN_LIMITED(mod, fmt, ...) kvp_log_limited(KVP_LOG_WARN, mod, fmt, ##__VA_ARGS__)
#define KVP_ERROR_LIMITED(mod, fmt, ...) kvp_log_limited(KVP_LOG_ERROR, mod, fmt, ##__VA_ARGS__)

#endif
