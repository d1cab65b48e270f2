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

#endif
