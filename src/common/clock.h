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
#endif
