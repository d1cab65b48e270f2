/* test_prom.c -- the Prometheus text writer: label escaping, families,
 * histogram buckets and quantiles; kvp_buf_printf. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/prom.h"
#include "harness.h"
#include "kvpool.h"

static const char *text(kvp_buf *b)
{
    kvp_buf_u8(b, 0);
    b->len--;
    return (const char *)b->data;
}

TEST(labels_escape_hostile_names)
{
    char l[64] = "";
    /* a replaced byte makes the value lossy: prefix, '~', hash */
    kvp_prom_label(l, sizeof l, "segment", "a\"b\\c\nd", 7);
    CHECK(!strcmp(l, "segment=\"a\\\"b\\\\c\\nd\""));
    CHECK_EQ(kvp_prom_label(l, sizeof l, "tier", "dram", 4), 0);
    CHECK(!strcmp(l, "segment=\"a\\\"b\\\\c\\nd\",tier=\"dram\""));
    char x1[256] = "", x2[256] = "";
    kvp_prom_label(x1, sizeof x1, "s", "d\x01\xff", 3);
    kvp_prom_label(x2, sizeof x2, "s", "d\x02\xfe", 3);
    CHECK(!strncmp(x1, "s=\"d??~", 7) && strlen(x1) == 7 + 16 + 1);
    CHECK(strcmp(x1, x2) != 0);
    /* a '~' is hashed too, so that no verbatim value looks hashed */
    x1[0] = '\0';
    kvp_prom_label(x1, sizeof x1, "s", "a~b", 3);
    CHECK(!strncmp(x1, "s=\"a~b~", 7) && strlen(x1) == 7 + 16 + 1);
    /* no room for the whole pair: out unchanged, -1 */
    char small[16] = "";
    CHECK_EQ(kvp_prom_label(small, sizeof small, "k", "0123456789abcdef", 16), -1);
    CHECK(!strcmp(small, ""));
    char tiny[6] = "x=\"\"";
    CHECK_EQ(kvp_prom_label(tiny, sizeof tiny, "k", "v", 1), -1);
    CHECK(!strcmp(tiny, "x=\"\""));
}

/* Two 255-byte names that differ in the last byte: two bounded label
 * values, and the label after them is kept. */
TEST(labels_long_values_bounded_distinct)
{
    char a[255], b2[255];
    memset(a, 's', sizeof a);
    memcpy(b2, a, sizeof a);
    b2[254] = 't';
    char la[2 * KVP_PROM_PAIR_MAX + 1] = "", lb[sizeof la] = "";
    CHECK_EQ(kvp_prom_label(la, sizeof la, "segment", a, sizeof a), 0);
    CHECK_EQ(kvp_prom_label(la, sizeof la, "tier", "dram", 4), 0);
    CHECK_EQ(kvp_prom_label(lb, sizeof lb, "segment", b2, sizeof b2), 0);
    CHECK_EQ(kvp_prom_label(lb, sizeof lb, "tier", "dram", 4), 0);
    CHECK(strcmp(la, lb) != 0);
    const char *end = strstr(la, "\",tier=\"dram\"");
    CHECK(end && !end[strlen("\",tier=\"dram\"")]);
    size_t vlen = (size_t)(end - (la + strlen("segment=\"")));
    CHECK(vlen <= KVP_PROM_VALUE_MAX);
    CHECK(la[9] == 's' && end[-17] == '~');
    /* the hashed form is stable, and escapes are never split */
    char lc[2 * KVP_PROM_PAIR_MAX + 1] = "";
    kvp_prom_label(lc, sizeof lc, "segment", a, sizeof a);
    CHECK(!strncmp(la, lc, strlen(lc)));
    char q[200];
    memset(q, '"', sizeof q);
    char lq[KVP_PROM_PAIR_MAX + 1] = "";
    CHECK_EQ(kvp_prom_label(lq, sizeof lq, "k", q, sizeof q), 0);
    const char *tl = strchr(lq, '~');
    CHECK(tl && (tl - (lq + 3)) % 2 == 0 && tl[-1] == '"' && tl[-2] == '\\');
    CHECK(strlen(lq) - 4 <= KVP_PROM_VALUE_MAX);
}

TEST(samples_and_families)
{
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_prom_family(&b, "kvpool_objects", "gauge", "Objects.");
    kvp_prom_u64(&b, "kvpool_objects", NULL, 7);
    kvp_prom_u64(&b, "kvpool_used_bytes", "tier=\"dram\"", 4096);
    kvp_prom_f64(&b, "x_seconds", NULL, 0.25);
    kvp_prom_f64(&b, "y", NULL, INFINITY);
    CHECK(!strcmp(text(&b), "# HELP kvpool_objects Objects.\n# TYPE kvpool_objects gauge\n"
                            "kvpool_objects 7\nkvpool_used_bytes{tier=\"dram\"} 4096\n"
                            "x_seconds 0.25\ny +Inf\n"));
    kvp_buf_free(&b);
}

TEST(printf_grows_past_the_small_buffer)
{
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    char big[1000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvp_buf_printf(&b, "<%s>", big);
    CHECK_EQ(b.len, 1001);
    CHECK(b.data[0] == '<' && b.data[1000] == '>' && b.data[500] == 'z');
    kvp_buf_free(&b);
    kvp_buf_init(&b, 10);
    kvp_buf_printf(&b, "%s", big);
    CHECK_EQ(b.err, KVP_ETOO_LARGE);
    kvp_buf_free(&b);
}

TEST(histogram_buckets_are_cumulative)
{
    static kvp_prom_hist h;
    memset(&h, 0, sizeof h);
    kvp_prom_hist_add(&h, 5000);        /* 5 us: first bucket */
    kvp_prom_hist_add(&h, 10000);       /* exactly 10 us: first bucket (le) */
    kvp_prom_hist_add(&h, 3000000);     /* 3 ms: le 0.005 */
    kvp_prom_hist_add(&h, 99000000000); /* 99 s: +Inf */
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_prom_hist_write(&b, "lat_seconds", "op=\"GET\"", &h);
    const char *t = text(&b);
    CHECK(strstr(t, "lat_seconds_bucket{op=\"GET\",le=\"1e-05\"} 2\n") != NULL);
    CHECK(strstr(t, "lat_seconds_bucket{op=\"GET\",le=\"0.0025\"} 2\n") != NULL);
    CHECK(strstr(t, "lat_seconds_bucket{op=\"GET\",le=\"0.005\"} 3\n") != NULL);
    CHECK(strstr(t, "lat_seconds_bucket{op=\"GET\",le=\"10\"} 3\n") != NULL);
    CHECK(strstr(t, "lat_seconds_bucket{op=\"GET\",le=\"+Inf\"} 4\n") != NULL);
    CHECK(strstr(t, "lat_seconds_count{op=\"GET\"} 4\n") != NULL);
    CHECK(strstr(t, "lat_seconds_sum{op=\"GET\"} 99.003015\n") != NULL);
    kvp_buf_free(&b);
    /* the median lies in the first bucket, the top quantile at the highest finite bound */
    double q50 = kvp_prom_hist_quantile(&h, 0.5);
    CHECK(q50 > 0 && q50 <= 10e-6);
    CHECK(kvp_prom_hist_quantile(&h, 1.0) == 10.0);
    static kvp_prom_hist empty;
    CHECK(kvp_prom_hist_quantile(&empty, 0.5) == 0);
}
