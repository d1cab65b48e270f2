/*
 * prom.h -- the Prometheus text exposition format (version 0.0.4): metric
 * families, samples, escaped label values, and latency histograms a hot
 * path can update without a lock.
 *
 * A family is written as "# HELP", "# TYPE", then its samples, each family
 * once per exposition (promtool checks this). Names are the caller's
 * constants (base units: _bytes, _seconds, counters end in _total); label
 * values are untrusted text (a segment or tenant name) and are escaped
 * here: backslash, double quote and newline, and any byte that is not
 * printable ASCII becomes '?' so that a hostile name cannot break a line;
 * a value is bounded (KVP_PROM_VALUE_MAX) without two values ever sharing
 * a series: one shortened or altered keeps a prefix and gets a hash of
 * the whole value (kvp_prom_label).
 * Callers keep label cardinality bounded (segments, tenants, ops, codes).
 */
#ifndef KVP_PROM_H
#define KVP_PROM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* A label value's longest written form, and a pair's with a key of up to
 * 31 bytes: [,]k="value". */
#define KVP_PROM_VALUE_MAX 96
#define KVP_PROM_PAIR_MAX (1 + 31 + 3 + KVP_PROM_VALUE_MAX)

/* The Content-Type of an exposition. */
#define KVP_PROM_CTYPE "text/plain; version=0.0.4; charset=utf-8"

/* "# HELP name help\n# TYPE name type\n"; type: "counter", "gauge",
 * "histogram". */
void kvp_prom_family(kvp_buf *b, const char *name, const char *type, const char *help);
/* One sample: name{labels} value. labels: NULL/"" or preformatted pairs
 * from kvp_prom_label ("k=\"v\",k2=\"v2\""). */
void kvp_prom_u64(kvp_buf *b, const char *name, const char *labels, uint64_t v);
void kvp_prom_f64(kvp_buf *b, const char *name, const char *labels, double v);
/* Appends k="value" (with a leading comma when out is not empty) to the
 * NUL-terminated out of capacity cap. v: len bytes, not NUL-terminated.
 * The value is written verbatim (escaped) when that form has at most
 * KVP_PROM_VALUE_MAX bytes and tells v exactly: every byte printable ASCII
 * and none a '~'. Otherwise -- a value too long, a byte replaced by '?',
 * a '~' -- it is written as the longest prefix of that form (whole escapes)
 * that leaves room for '~' and 16 hex digits of XXH3-64 over all of v, at
 * most KVP_PROM_VALUE_MAX bytes in all: two values that differ anywhere
 * give two label values (unless their 64-bit hashes collide; the hash is
 * not keyed, so that a series keeps its name across restarts), and a
 * verbatim value never looks like a hashed one. A pair is written whole or
 * not at all: 0, or -1 with out unchanged when it does not fit (size out
 * with KVP_PROM_PAIR_MAX per pair and no pair is ever dropped). */
int kvp_prom_label(char *out, size_t cap, const char *k, const void *v, size_t len);

/*
 * Latency histogram with fixed buckets (10 us .. 10 s, then +Inf), in
 * nanoseconds. kvp_prom_hist_add is lock-free: relaxed atomic adds, so any
 * number of threads may add while one writes it out; the exposition may
 * see a count and a sum a few adds apart, never torn values.
 */
#define KVP_PROM_HBUCKETS 19
typedef struct kvp_prom_hist {
    _Atomic uint64_t bucket[KVP_PROM_HBUCKETS]; /* not cumulative; last = +Inf */
    _Atomic uint64_t count, sum_ns;
} kvp_prom_hist;
void kvp_prom_hist_add(kvp_prom_hist *h, uint64_t ns);
/* Appends the samples of one histogram (name_bucket{labels,le=...},
 * name_sum, name_count); the caller wrote the family line once. */
void kvp_prom_hist_write(kvp_buf *b, const char *name, const char *labels, const kvp_prom_hist *h);
/* Upper bound of bucket i in seconds (INFINITY for the last). */
double kvp_prom_hist_le(int i);
/* A quantile (0..1) estimated from the buckets, in seconds (0 when empty):
 * linear within the bucket, as Prometheus' histogram_quantile does. */
double kvp_prom_hist_quantile(const kvp_prom_hist *h, double q);

#endif
