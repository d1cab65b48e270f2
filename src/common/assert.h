/*
 * assert.h -- runtime checks of the invariants the comments state
 * (SQLite's assert() + ALWAYS()/NEVER(), memcached's refcount asserts).
 *
 *   KVP_ASSERT(c)  c must hold. Checked under KVP_TESTING (the ASan, TSan
 *                  and fuzz builds); in release it compiles to nothing but
 *                  is still type-checked. Never evaluate side effects in c.
 *   KVP_ALWAYS(c)  c "cannot" be false, but release code handles it anyway:
 *   KVP_NEVER(c)   c "cannot" be true:
 *                    if (KVP_NEVER(p == NULL)) return KVP_EINTERNAL_ERROR;
 *                  Release: the value of c (so the graceful branch stays).
 *                  Test builds: abort when c is violated, so the
 *                  "impossible" branch is found by the tests, not hidden.
 *
 * Only for what the code itself guarantees. Data from a peer, the network,
 * a file or the caller is validated and answered with an error code, never
 * asserted.
 */
#ifndef KVP_ASSERT_H
#define KVP_ASSERT_H

#ifdef KVP_TESTING
void kvp_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));
#define KVP_ASSERT(c) ((c) ? (void)0 : kvp_assert_fail(__FILE__, __LINE__, #c))
#define KVP_ALWAYS(c) ((c) ? 1 : (kvp_assert_fail(__FILE__, __LINE__, "ALWAYS(" #c ")"), 0))
#define KVP_NEVER(c) ((c) ? (kvp_assert_fail(__FILE__, __LINE__, "NEVER(" #c ")"), 1) : 0)
#else
#define KVP_ASSERT(c) ((void)sizeof(!(c)))
#define KVP_ALWAYS(c) (!!(c))
#define KVP_NEVER(c) (!!(c))
#endif

#endif
