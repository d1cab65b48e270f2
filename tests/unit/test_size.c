/* test_size.c -- kvp_size_parse, kvp_duration_parse, kvp_size_format. */
#include <stdio.h>
#include <string.h>

#include "common/size.h"
#include "harness.h"
#include "kvpool.h"

#define KI 1024ull
#define MI (1024ull * 1024)
#define GI (1024ull * 1024 * 1024)
#define TI (1024ull * 1024 * 1024 * 1024)

struct size_case {
    const char *in;
    uint64_t want;
};

TEST(size_valid)
{
    static const struct size_case cases[] = {
        {"0", 0},
        {"4096", 4096},
        {"17B", 17},
        {"17 b", 17},
        {"64k", 64 * KI},
        {"64K", 64 * KI},
        {"64kb", 64 * KI},
        {"64KiB", 64 * KI},
        {"64 KIB", 64 * KI},
        {"2m", 2 * MI},
        {"512MiB", 512 * MI},
        {"512 MB", 512 * MI},
        {"4GB", 4 * GI},
        {"4 GB", 4 * GI},
        {"4gib", 4 * GI},
        {"4g", 4 * GI},
        {"1.5GiB", 1610612736ull},
        {"1.5 GB", 1610612736ull},
        {"0.5k", 512},
        {"0.0001k", 0},          /* 0.1024 bytes, rounded down */
        {"1.9999999999999999999999k", 2047}, /* long fractions stay exact */
        {"2T", 2 * TI},
        {"1TiB", TI},
        {"007", 7},
        {"18446744073709551615", UINT64_MAX},
        {"16777215.999999999TiB", 16777215ull * TI + 1099511626676ull},
        {"16777215.9999999999999TiB", UINT64_MAX}, /* largest value with a fraction */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 12345;
        int rc = kvp_size_parse(cases[i].in, &v);
        if (rc != 0 || v != cases[i].want)
            fprintf(stderr, "    case \"%s\": rc %d value %llu\n", cases[i].in, rc,
                    (unsigned long long)v);
        CHECK_EQ(rc, 0);
        CHECK(v == cases[i].want);
    }
}

TEST(size_invalid)
{
    static const char *cases[] = {
        "", " 4GB", "4GB ", "4  GB", "4 ", "-1", "+1", "-0", "1.5", "1.5B", "1.", ".5",
        "1.5.2GB", "4XB", "4GBB", "GB", "4 G B", "0x10", "1e3", "12abc", "4\tGB", "nan",
        "18446744073709551616",  /* UINT64_MAX + 1 */
        "99999999999999999999999", "16777216TiB", "17179869184GiB",
        "4 GB\n",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 12345;
        int rc = kvp_size_parse(cases[i], &v);
        if (rc != KVP_EINVALID_PARAMS)
            fprintf(stderr, "    case \"%s\" accepted as %llu\n", cases[i], (unsigned long long)v);
        CHECK_EQ(rc, KVP_EINVALID_PARAMS);
        CHECK(v == 12345); /* untouched on error */
    }
    uint64_t v;
    CHECK_EQ(kvp_size_parse(NULL, &v), KVP_EINVALID_PARAMS);
}

TEST(size_largest_exact)
{
    /* The largest whole number of TiB that fits, and one more. */
    uint64_t v;
    CHECK_EQ(kvp_size_parse("16777215TiB", &v), 0);
    CHECK(v == 16777215ull * TI);
    CHECK_EQ(kvp_size_parse("16777216TiB", &v), KVP_EINVALID_PARAMS);
}

struct dur_case {
    const char *in;
    uint64_t unit_ms;
    uint64_t want_ms;
};

TEST(duration_valid)
{
    static const struct dur_case cases[] = {
        {"250ms", 1, 250},   {"250 ms", 1, 250}, {"5s", 1, 5000},     {"5S", 1, 5000},
        {"1m", 1, 60000},    {"2h", 1, 7200000}, {"100us", 1, 0},     {"1500us", 1, 1},
        {"1.5s", 1, 1500},   {"0.25h", 1, 900000}, {"250", 1, 250},   {"10", 1000, 10000},
        {"1.5", 1000, 1500}, {"1.9", 1, 1},      {"0", 1, 0},         {"0s", 1000, 0},
        {"5s", 1000, 5000},  {"3", 60000, 180000},
        {"18446744073709551ms", 1, 18446744073709551ull},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 777;
        int rc = kvp_duration_parse(cases[i].in, cases[i].unit_ms, &v);
        if (rc != 0 || v != cases[i].want_ms)
            fprintf(stderr, "    case \"%s\" unit %llu: rc %d value %llu\n", cases[i].in,
                    (unsigned long long)cases[i].unit_ms, rc, (unsigned long long)v);
        CHECK_EQ(rc, 0);
        CHECK(v == cases[i].want_ms);
    }
}

TEST(duration_invalid)
{
    static const struct dur_case cases[] = {
        {"", 1, 0},        {"5x", 1, 0},       {"-5s", 1, 0},      {"5 s ", 1, 0},
        {"s", 1, 0},       {"5sec", 1, 0},     {"5d", 1, 0},       {" 5s", 1, 0},
        {"5..s", 1, 0},    {"5ms5", 1, 0},     {"1e3", 1, 0},      {"5 ", 1000, 0},
        {"5GB", 1, 0},
        {"18446744073709551616", 1, 0},           /* overflow */
        {"18446744073709552ms", 1, 0},            /* overflow in microseconds */
        {"5124095576030432h", 1, 0},              /* overflow after the multiply */
        {"5", 0, 0},                              /* no unit for bare numbers */
        {"5", UINT64_MAX / 100, 0},               /* unit too large */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 777;
        int rc = kvp_duration_parse(cases[i].in, cases[i].unit_ms, &v);
        if (rc != KVP_EINVALID_PARAMS)
            fprintf(stderr, "    case \"%s\" accepted as %llu\n", cases[i].in,
                    (unsigned long long)v);
        CHECK_EQ(rc, KVP_EINVALID_PARAMS);
        CHECK(v == 777);
    }
    uint64_t v;
    CHECK_EQ(kvp_duration_parse(NULL, 1, &v), KVP_EINVALID_PARAMS);
}

TEST(size_format)
{
    static const struct {
        uint64_t in;
        const char *want;
    } cases[] = {
        {0, "0 B"},
        {17, "17 B"},
        {1023, "1023 B"},
        {1024, "1.0 KiB"},
        {1536, "1.5 KiB"},
        {2047, "1.9 KiB"}, /* rounded down, never overstated */
        {512 * MI, "512.0 MiB"},
        {4 * GI, "4.0 GiB"},
        {1610612736ull, "1.5 GiB"},
        {3 * TI, "3.0 TiB"},
        {1024 * TI, "1.0 PiB"},
        {UINT64_MAX, "15.9 EiB"},
    };
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *r = kvp_size_format(cases[i].in, buf, sizeof buf);
        CHECK(r == buf);
        if (strcmp(buf, cases[i].want) != 0)
            fprintf(stderr, "    %llu -> \"%s\", want \"%s\"\n", (unsigned long long)cases[i].in,
                    buf, cases[i].want);
        CHECK(strcmp(buf, cases[i].want) == 0);
    }
}

TEST(size_format_small_buffer)
{
    char buf[4] = "xyz";
    kvp_size_format(4 * GI, buf, sizeof buf);
    CHECK(strcmp(buf, "4.0") == 0); /* truncated, still terminated */
    char one[1] = {'x'};
    kvp_size_format(5, one, 0);
    CHECK(one[0] == 'x'); /* n == 0 writes nothing */
}

TEST(size_format_round_trip)
{
    /* Whatever format prints for a whole unit parses back to the same value. */
    static const uint64_t vals[] = {KI, 64 * KI, MI, 512 * MI, GI, 4 * GI, TI};
    char buf[32];
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        uint64_t v;
        kvp_size_format(vals[i], buf, sizeof buf);
        CHECK_EQ(kvp_size_parse(buf, &v), 0);
        CHECK(v == vals[i]);
    }
}
