/* clock.h -- monotonic time. Core logic takes `now` as a parameter so tests
 * can inject time; only service loops read the clock. */
#ifndef KVP_CLOCK_H
#define KVP_CLOCK_H
#include <stdint.h>
#include <time.h>

static inline uint64_t kvp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static inline uint64_t kvp_now_ms(void) { return kvp_now_ns() / 1000000u; }
static inline uint64_t kvp_now_us(void) { return kvp_now_ns() / 1000u; }
/* The CLOCK_MONOTONIC time ms from now, for pthread_cond_timedwait with a
 * monotonic condition variable. */
static inline struct timespec kvp_deadline_ms(uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}
#endif
