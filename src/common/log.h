/*
 * log.h -- leveled logging to stderr.
 * Lines look like: "2026-11-29T08:57:17.123Z W master: message".
 * Thread-safe: each line is written with one write(2).
 */
#ifndef KVP_LOG_H
#define KVP_LOG_H

enum kvp_log_level { KVP_LOG_DEBUG = 0, KVP_LOG_INFO, KVP_LOG_WARN, KVP_LOG_ERROR, KVP_LOG_OFF };

void kvp_log_set_level(int level);
int kvp_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns -1 if unknown. */
int kvp_log_level_parse(const char *s);
void kvp_log_write(int level, const char *mod, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

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
