/*
 * csum.c -- XXH3-64 with the widest vector unit available; see csum.h.
 *
 * xxhash.h is compiled into this file (XXH_INLINE_ALL: every function
 * static, nothing clashes with libxxhash). On x86-64, XXH_X86DISPATCH plus
 * XXH_DISPATCH_AVX2 make the header also define its AVX2 kernels
 * (XXH3_accumulate_512_avx2, XXH3_scrambleAcc_avx2) under
 * __attribute__((target("avx2"))); the two functions below that use them
 * carry the same attribute, so the file needs no -mavx2 and runs on any
 * x86-64: they are called only once the CPU said it has AVX2. Everything
 * else (short inputs, reset, digest, the SSE2 path) is the header's default
 * code for baseline x86-64.
 */
#include "common/csum.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h> /* declares the AVX2 intrinsics whatever -m flags say */
#define KVP_CSUM_X86 1
#define XXH_X86DISPATCH
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#else
#define KVP_CSUM_X86 0
#endif
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((kvp_csum *)0)->opaque),
               "kvp_csum too small for XXH3_state_t");
_Static_assert(_Alignof(XXH3_state_t) <= _Alignof(kvp_csum), "kvp_csum under-aligned");

/* The state inside a kvp_csum: only this file sees it as XXH3_state_t. */
#define ST(c) ((XXH3_state_t *)(void *)(c)->opaque)

enum { IMPL_UNSET = 0, IMPL_GENERIC, IMPL_SSE2, IMPL_AVX2 };
static int impl; /* atomic: IMPL_*, chosen at first use */

static int impl_get(void)
{
    int v = __atomic_load_n(&impl, __ATOMIC_RELAXED);
    if (v != IMPL_UNSET)
        return v;
#if KVP_CSUM_X86
    __builtin_cpu_init();
    /* libgcc / compiler-rt report AVX2 only when the kernel saves the YMM
     * registers (XCR0), not merely when the CPU has it */
    v = __builtin_cpu_supports("avx2") ? IMPL_AVX2 : IMPL_SSE2;
#else
    v = IMPL_GENERIC;
#endif
    __atomic_store_n(&impl, v, __ATOMIC_RELAXED); /* every thread picks the same */
    return v;
}

#if KVP_CSUM_X86
/* XXH3_64bits of an input longer than XXH3_MIDSIZE_MAX: the default
 * secret's long loop, AVX2 kernels. */
XXH_NO_INLINE XXH_TARGET_AVX2 XXH64_hash_t long_avx2(const void *p, size_t len)
{
    return XXH3_hashLong_64b_internal(p, len, XXH3_kSecret, sizeof(XXH3_kSecret),
                                      XXH3_accumulate_512_avx2, XXH3_scrambleAcc_avx2);
}

/* XXH3_64bits_update with AVX2 kernels. */
XXH_NO_INLINE XXH_TARGET_AVX2 void update_avx2(XXH3_state_t *st, const void *p, size_t len)
{
    (void)XXH3_update(st, (const xxh_u8 *)p, len, XXH3_accumulate_512_avx2,
                      XXH3_scrambleAcc_avx2);
}
#endif

uint64_t kvp_csum64(const void *p, size_t len)
{
#if KVP_CSUM_X86
    if (len > XXH3_MIDSIZE_MAX && impl_get() == IMPL_AVX2)
        return long_avx2(p, len);
#endif
    return XXH3_64bits(p, len);
}

void kvp_csum_reset(kvp_csum *st) { (void)XXH3_64bits_reset(ST(st)); }

void kvp_csum_update(kvp_csum *st, const void *p, size_t len)
{
#if KVP_CSUM_X86
    if (impl_get() == IMPL_AVX2) {
        update_avx2(ST(st), p, len);
        return;
    }
#endif
    (void)XXH3_64bits_update(ST(st), p, len);
}

uint64_t kvp_csum_digest(const kvp_csum *st)
{
    return XXH3_64bits_digest((const XXH3_state_t *)(const void *)st->opaque);
}

const char *kvp_csum_impl(void)
{
    switch (impl_get()) {
    case IMPL_AVX2:
        return "avx2";
    case IMPL_SSE2:
        return "sse2";
    default:
        return "generic";
    }
}

#ifdef KVP_TESTING
int kvp_csum_force(const char *name)
{
    if (!strcmp(name, "auto")) {
        __atomic_store_n(&impl, IMPL_UNSET, __ATOMIC_RELAXED);
        return 0;
    }
    int want = !strcmp(name, "avx2") ? IMPL_AVX2
             : !strcmp(name, "sse2") ? IMPL_SSE2
             : !strcmp(name, "generic") ? IMPL_GENERIC : IMPL_UNSET;
#if KVP_CSUM_X86
    if (want == IMPL_GENERIC || (want == IMPL_AVX2 && !__builtin_cpu_supports("avx2")))
        return -1;
#else
    if (want != IMPL_GENERIC)
        return -1;
#endif
    if (want == IMPL_UNSET)
        return -1;
    __atomic_store_n(&impl, want, __ATOMIC_RELAXED);
    return 0;
}
#endif
