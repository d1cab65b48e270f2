/* prom.c -- Prometheus text exposition writer and lock-free histograms. */
#include "common/prom.h"

#include "common/csum.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Upper bounds in ns of every bucket but +Inf. */
static const uint64_t le_ns[KVP_PROM_HBUCKETS - 1] = {
    10000,     25000,     50000,     100000,     250000,     500000,
    1000000,   2500000,   5000000,   10000000,   25000000,   50000000,
    100000000, 250000000, 500000000, 1000000000, 2500000000, 10000000000ull};

void kvp_prom_family(kvp_buf *b, const char *name, const char *type, const char *help)
{
    kvp_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void kvp_prom_u64(kvp_buf *b, const char *name, const char *labels, uint64_t v)
{
    if (labels && *labels)
        kvp_buf_printf(b, "%s{%s} %llu\n", name, labels, (unsigned long long)v);
    else
        kvp_buf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

void kvp_prom_f64(kvp_buf *b, const char *name, const char *labels, double v)
{
    char num[64];
    if (isinf(v))
        snprintf(num, sizeof num, v > 0 ? "+Inf" : "-Inf");
    else if (isnan(v))
        snprintf(num, sizeof num, "NaN");
    else
        snprintf(num, sizeof num, "%.9g", v);
    if (labels && *labels)
        kvp_buf_printf(b, "%s{%s} %s\n", name, labels, num);
    else
        kvp_buf_printf(b, "%s %s\n", name, num);
}

/* One byte of a label value as the exposition writes it: 1 or 2 bytes in
 * e[]; *lossy when the byte was replaced (not printable ASCII) or is the
 * hash separator, so that the written form alone no longer names it. */
static size_t esc_byte(uint8_t b, char e[2], int *lossy)
{
    if (b == '\\' || b == '"' || b == '\n') {
        e[0] = '\\';
        e[1] = b == '\n' ? 'n' : (char)b;
        return 2;
    }
    if (b < 0x20 || b > 0x7e) {
        *lossy = 1;
        e[0] = '?';
        return 1;
    }
    if (b == '~')
        *lossy = 1;
    e[0] = (char)b;
    return 1;
}

int kvp_prom_label(char *out, size_t cap, const char *k, const void *v, size_t len)
{
    if (cap == 0)
        return -1;
    size_t o = strnlen(out, cap - 1);
    out[o] = '\0';
    const uint8_t *p = v;
    /* the value as written, bounded: verbatim when it is short and
     * lossless, else a prefix, '~' and the hash of every byte */
    char val[KVP_PROM_VALUE_MAX + 1], e[2];
    size_t n = 0, i = 0;
    int lossy = 0;
    for (; i < len; i++) {
        size_t w = esc_byte(p[i], e, &lossy);
        if (n + w > KVP_PROM_VALUE_MAX)
            break;
        memcpy(val + n, e, w);
        n += w;
    }
    if (i < len || lossy) {
        /* the prefix: whole escapes only, room for "~" + 16 hex digits */
        n = 0;
        for (size_t j = 0; j < len; j++) {
            size_t w = esc_byte(p[j], e, &lossy);
            if (n + w > KVP_PROM_VALUE_MAX - 17)
                break;
            memcpy(val + n, e, w);
            n += w;
        }
        n += (size_t)snprintf(val + n, sizeof val - n, "~%016llx",
                              (unsigned long long)kvp_csum64(v, len));
    }
    /* the pair, [,]k="val", all or nothing */
    size_t klen = strlen(k), need = (o ? 1 : 0) + klen + 3 + n;
    if (o + need >= cap)
        return -1;
    if (o)
        out[o++] = ',';
    memcpy(out + o, k, klen);
    o += klen;
    out[o++] = '=';
    out[o++] = '"';
    memcpy(out + o, val, n);
    o += n;
    out[o++] = '"';
    out[o] = '\0';
    return 0;
}

void kvp_prom_hist_add(kvp_prom_hist *h, uint64_t ns)
{
    int i = 0;
    while (i < KVP_PROM_HBUCKETS - 1 && ns > le_ns[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

double kvp_prom_hist_le(int i)
{
    return i < KVP_PROM_HBUCKETS - 1 ? (double)le_ns[i] / 1e9 : INFINITY;
}

void kvp_prom_hist_write(kvp_buf *b, const char *name, const char *labels, const kvp_prom_hist *h)
{
    char sample[160], lab[512];
    uint64_t cum = 0;
    snprintf(sample, sizeof sample, "%s_bucket", name);
    for (int i = 0; i < KVP_PROM_HBUCKETS; i++) {
        cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        char le[32];
        if (i < KVP_PROM_HBUCKETS - 1)
            snprintf(le, sizeof le, "%.9g", kvp_prom_hist_le(i));
        else
            snprintf(le, sizeof le, "+Inf");
        snprintf(lab, sizeof lab, "%s%sle=\"%s\"", labels ? labels : "",
                 labels && *labels ? "," : "", le);
        kvp_prom_u64(b, sample, lab, cum);
    }
    /* count = the +Inf bucket's, so that the exposition is consistent */
    snprintf(sample, sizeof sample, "%s_sum", name);
    kvp_prom_f64(b, sample, labels,
                 (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
    snprintf(sample, sizeof sample, "%s_count", name);
    kvp_prom_u64(b, sample, labels, cum);
}

double kvp_prom_hist_quantile(const kvp_prom_hist *h, double q)
{
    uint64_t n[KVP_PROM_HBUCKETS], total = 0;
    for (int i = 0; i < KVP_PROM_HBUCKETS; i++)
        total += n[i] = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
    if (total == 0)
        return 0;
    double rank = q * (double)total, cum = 0;
    for (int i = 0; i < KVP_PROM_HBUCKETS; i++) {
        if (cum + (double)n[i] >= rank && n[i]) {
            if (i == KVP_PROM_HBUCKETS - 1) /* +Inf: the highest finite bound */
                return kvp_prom_hist_le(i - 1);
            double lo = i ? kvp_prom_hist_le(i - 1) : 0, hi = kvp_prom_hist_le(i);
            return lo + (hi - lo) * (rank - cum) / (double)n[i];
        }
        cum += (double)n[i];
    }
    return kvp_prom_hist_le(KVP_PROM_HBUCKETS - 2);
}
