/*
 * csum.h -- XXH3-64 (seed 0) of the values the data plane moves: the same
 * function as libxxhash's XXH3_64bits, computed with the widest vector unit
 * this CPU has.
 *
 * Why not libxxhash's own: Debian's library is built for baseline x86-64
 * (SSE2), ~20 GB/s here; the same hash with AVX2 runs ~40 GB/s on data in
 * L1/L2 (and its x86 dispatch entry points are missing from libxxhash.a, so
 * a static link of libkvpool would break). On x86-64 this module is built
 * with xxhash.h's dispatch support (function-level target attributes: no
 * special compiler flags) and picks AVX2 at first use when the CPU and the
 * kernel support it (__builtin_cpu_supports), else SSE2; elsewhere it is
 * plain XXH3. The value is identical whichever runs -- XXH3 is defined
 * independently of the vector width -- so checksums stored by one client
 * verify on another.
 *
 * Streaming: kvp_csum_reset, any number of kvp_csum_update (pieces of any
 * size, in order), kvp_csum_digest == kvp_csum64 of the concatenation.
 * Thread-safe (a state belongs to one thread at a time).
 */
#ifndef KVP_CSUM_H
#define KVP_CSUM_H

#include <stddef.h>
#include <stdint.h>

/* An XXH3 streaming state, opaque: room for libxxhash's XXH3_state_t as
 * built by csum.c (checked there at compile time), 64-byte aligned. */
typedef struct kvp_csum {
    _Alignas(64) unsigned char opaque[640];
} kvp_csum;

uint64_t kvp_csum64(const void *p, size_t len);
void kvp_csum_reset(kvp_csum *st);
void kvp_csum_update(kvp_csum *st, const void *p, size_t len);
uint64_t kvp_csum_digest(const kvp_csum *st);
/* "avx2", "sse2" or "generic": what kvp_csum64 / kvp_csum_update run. */
const char *kvp_csum_impl(void);

#ifdef KVP_TESTING
/* Tests: runs the named implementation ("avx2", "sse2" on x86-64;
 * "generic" elsewhere) from now on; "auto": chosen again at the next use.
 * 0, or -1 when it is unknown or this CPU lacks it. */
int kvp_csum_force(const char *name);
#endif

#endif
