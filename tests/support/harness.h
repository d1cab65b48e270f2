/*
 * harness.h -- the test harness (one binary per tests/.../test_*.c).
 *
 *   TEST(name) { CHECK(x == 1); CHECK_EQ(a, b); if (!gpu) SKIP("no GPU"); }
 *
 * Every test runs in a forked child with a timeout (KVP_TEST_TIMEOUT seconds,
 * default 300), so a crash, a hang or a leak report (LeakSanitizer makes the
 * child exit non-zero) fails that test alone. `./test_x name...` runs only
 * the named tests, `./test_x -name...` all but those. The last line is "RESULT <passed> <failed> <skipped>",
 * which tests/run.sh adds up.
 */
#ifndef KVP_HARNESS_H
#define KVP_HARNESS_H

#include <stdint.h>
#include <stdio.h>

void th_register(const char *name, void (*fn)(void));
void th_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void th_skip(const char *reason);
int th_failed(void);

#define TEST(name)                                                             \
    static void name(void);                                                    \
    __attribute__((constructor)) static void th_reg_##name(void)               \
    {                                                                          \
        th_register(#name, name);                                              \
    }                                                                          \
    static void name(void)

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            th_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                   \
            return;                                                            \
        }                                                                      \
    } while (0)

#define CHECK_EQ(a, b)                                                         \
    do {                                                                       \
        long long th_a_ = (long long)(a), th_b_ = (long long)(b);              \
        if (th_a_ != th_b_) {                                                  \
            th_fail(__FILE__, __LINE__, "CHECK_EQ(%s, %s): %lld != %lld", #a,  \
                    #b, th_a_, th_b_);                                         \
            return;                                                            \
        }                                                                      \
    } while (0)

/* Like CHECK but usable in helpers returning int (returns -1). */
#define REQUIRE(cond)                                                          \
    do {                                                                       \
        if (!(cond)) {                                                         \
            th_fail(__FILE__, __LINE__, "REQUIRE(%s)", #cond);                 \
            return -1;                                                         \
        }                                                                      \
    } while (0)

#define SKIP(reason)                                                           \
    do {                                                                       \
        th_skip(reason);                                                       \
        return;                                                                \
    } while (0)

#endif
