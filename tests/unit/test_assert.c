/*
 * test_assert.c -- common/assert.h in a test build (KVP_TESTING): ALWAYS
 * and NEVER pass the condition through when it holds, and a violated
 * KVP_ASSERT / ALWAYS / NEVER aborts (in a forked child) after naming the
 * expression.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/assert.h"
#include "harness.h"

static int aborts(int which)
{
    pid_t pid = fork();
    if (pid == 0) {
        int zero = getpid() == 0; /* 0, unknown to the compiler */
        if (which == 0)
            KVP_ASSERT(zero);
        else if (which == 1)
            (void)KVP_ALWAYS(zero);
        else
            (void)KVP_NEVER(!zero);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

TEST(conditions_pass_through)
{
    int one = getpid() != 0, n = 0;
    KVP_ASSERT(one);
    if (KVP_ALWAYS(one))
        n++;
    if (KVP_NEVER(!one))
        n += 10;
    CHECK_EQ(n, 1);
    CHECK_EQ(KVP_ALWAYS(5), 1);
    CHECK_EQ(KVP_NEVER(0), 0);
}

TEST(violations_abort)
{
    CHECK(aborts(0));
    CHECK(aborts(1));
    CHECK(aborts(2));
}
