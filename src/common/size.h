/*
 * size.h -- human-friendly sizes and durations.
 *
 * Sizes: "4096", "4GB", "4 GB", "512MiB", "1.5GiB", "64k", "2m" (case-insensitive).
 *   K/KB/KiB = 1024, M/MB/MiB = 1024^2, G/GB/GiB = 1024^3, T/TB/TiB = 1024^4
 *   (like Mooncake's config, GB means GiB), B = bytes; no suffix = bytes.
 *   Fractions are allowed with a unit ("1.5GB") and rounded down to a byte.
 * Durations: "250ms", "5s", "1m", "2h", "100us"; a bare number is in the
 *   caller's default unit (unit_ms: 1 = milliseconds, 1000 = seconds).
 * Both reject empty input, negative values, trailing garbage and overflow.
 */
#ifndef KVP_SIZE_H
#define KVP_SIZE_H
#include <stddef.h>
#include <stdint.h>

/* 0 or KVP_EINVALID_PARAMS. */
int kvp_size_parse(const char *s, uint64_t *out);
/* Milliseconds; 0 or KVP_EINVALID_PARAMS. */
int kvp_duration_parse(const char *s, uint64_t unit_ms, uint64_t *out_ms);
/* "4.0 GiB", "512.0 MiB", "17 B" into buf; returns buf. */
char *kvp_size_format(uint64_t bytes, char *buf, size_t n);
#endif
