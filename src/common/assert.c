/* assert.c -- the failure path of KVP_ASSERT/ALWAYS/NEVER; see assert.h. */
#include "common/assert.h"

#ifdef KVP_TESTING
#include <stdio.h>
#include <stdlib.h>

void kvp_assert_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
#else
/* ISO C forbids an empty translation unit. */
typedef int kvp_assert_unused;
#endif
