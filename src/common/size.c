/*
 * size.c -- parsing and formatting of sizes and durations (see size.h).
 *
 * Grammar shared by both parsers (no leading or trailing blanks, no sign):
 *   DIGITS [ "." DIGITS ] [ " " ] [ UNIT ]
 * The value is INT * MULT + floor(FRAC * MULT), computed exactly in integers
 * (no floating point), so "1.5GiB" is exactly 1610612736 and any result that
 * does not fit in 64 bits is rejected.
 */
#include "common/size.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kvpool.h"

/* One unit suffix and its multiplier. */
struct unit {
    const char *name;
    uint64_t mult;
};

#define KIB 1024ull
static const struct unit size_units[] = {
    {"", 1},          {"b", 1},
    {"k", KIB},       {"kb", KIB},       {"kib", KIB},
    {"m", KIB * KIB}, {"mb", KIB * KIB}, {"mib", KIB * KIB},
    {"g", KIB * KIB * KIB},       {"gb", KIB * KIB * KIB},       {"gib", KIB * KIB * KIB},
    {"t", KIB * KIB * KIB * KIB}, {"tb", KIB * KIB * KIB * KIB}, {"tib", KIB * KIB * KIB * KIB},
};

/* Duration multipliers in microseconds. */
static const struct unit duration_units[] = {
    {"us", 1}, {"ms", 1000}, {"s", 1000000}, {"m", 60000000}, {"h", 3600000000ull},
};

/* The pieces of "DIGITS[.DIGITS][ ]UNIT". */
struct num {
    uint64_t ipart;      /* integer part (checked for overflow) */
    const char *frac;    /* first fraction digit, or NULL */
    size_t frac_len;     /* number of fraction digits (>= 1 when frac) */
    const char *unit;    /* rest of the string after the optional space */
};

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Splits s; 0 or KVP_EINVALID_PARAMS (empty, no leading digit, overflow,
 * "1." without fraction digits, two spaces, a space without a unit). */
static int split_number(const char *s, struct num *n)
{
    if (!s || !is_digit(*s))
        return KVP_EINVALID_PARAMS;
    n->ipart = 0;
    while (is_digit(*s)) {
        if (__builtin_mul_overflow(n->ipart, 10, &n->ipart) ||
            __builtin_add_overflow(n->ipart, (uint64_t)(*s - '0'), &n->ipart))
            return KVP_EINVALID_PARAMS;
        s++;
    }
    n->frac = NULL;
    n->frac_len = 0;
    if (*s == '.') {
        s++;
        if (!is_digit(*s))
            return KVP_EINVALID_PARAMS;
        n->frac = s;
        while (is_digit(*s))
            s++;
        n->frac_len = (size_t)(s - n->frac);
    }
    if (*s == ' ') {
        s++;
        if (*s == '\0')
            return KVP_EINVALID_PARAMS;
    }
    n->unit = s;
    return 0;
}

/*
 * floor(mult * 0.d1d2...dk), exactly. Runs from the last digit:
 * a = floor((mult*d_i + a) / 10), using floor((m + x)/10) = floor((m + floor x)/10)
 * for integer m. Requires mult < UINT64_MAX / 10 (every multiplier here is).
 */
static uint64_t frac_times(const char *digits, size_t len, uint64_t mult)
{
    uint64_t a = 0;
    for (size_t i = len; i-- > 0;)
        a = (mult * (uint64_t)(digits[i] - '0') + a) / 10;
    return a;
}

/* ipart * mult + floor(frac * mult); 0 or KVP_EINVALID_PARAMS on overflow. */
static int combine(const struct num *n, uint64_t mult, uint64_t *out)
{
    uint64_t v;
    if (__builtin_mul_overflow(n->ipart, mult, &v))
        return KVP_EINVALID_PARAMS;
    if (n->frac && __builtin_add_overflow(v, frac_times(n->frac, n->frac_len, mult), &v))
        return KVP_EINVALID_PARAMS;
    *out = v;
    return 0;
}

static const struct unit *find_unit(const struct unit *u, size_t count, const char *name)
{
    for (size_t i = 0; i < count; i++)
        if (strcasecmp(u[i].name, name) == 0)
            return &u[i];
    return NULL;
}

int kvp_size_parse(const char *s, uint64_t *out)
{
    struct num n;
    if (split_number(s, &n) != 0)
        return KVP_EINVALID_PARAMS;
    const struct unit *u = find_unit(size_units, sizeof size_units / sizeof size_units[0], n.unit);
    if (!u)
        return KVP_EINVALID_PARAMS;
    /* Bytes are whole: a fraction needs a unit bigger than a byte. */
    if (n.frac && u->mult == 1)
        return KVP_EINVALID_PARAMS;
    uint64_t v;
    if (combine(&n, u->mult, &v) != 0)
        return KVP_EINVALID_PARAMS;
    *out = v;
    return 0;
}

int kvp_duration_parse(const char *s, uint64_t unit_ms, uint64_t *out_ms)
{
    struct num n;
    if (unit_ms == 0 || split_number(s, &n) != 0)
        return KVP_EINVALID_PARAMS;
    uint64_t mult_us;
    if (*n.unit == '\0') {
        if (__builtin_mul_overflow(unit_ms, 1000, &mult_us) || mult_us >= UINT64_MAX / 10)
            return KVP_EINVALID_PARAMS;
    } else {
        const struct unit *u =
            find_unit(duration_units, sizeof duration_units / sizeof duration_units[0], n.unit);
        if (!u)
            return KVP_EINVALID_PARAMS;
        mult_us = u->mult;
    }
    uint64_t us;
    if (combine(&n, mult_us, &us) != 0)
        return KVP_EINVALID_PARAMS;
    *out_ms = us / 1000; /* sub-millisecond remainders are dropped */
    return 0;
}

char *kvp_size_format(uint64_t bytes, char *buf, size_t n)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (!buf || n == 0)
        return buf;
    if (bytes < KIB) {
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    int i = 0;
    uint64_t scale = 1;
    while (i < 6 && bytes / scale >= KIB) {
        scale *= KIB;
        i++;
    }
    /* One decimal, rounded down, so the text never overstates the size. */
    uint64_t whole = bytes / scale;
    uint64_t tenth = (uint64_t)(((unsigned __int128)(bytes % scale) * 10) / scale);
    snprintf(buf, n, "%llu.%llu %s", (unsigned long long)whole, (unsigned long long)tenth,
             names[i]);
    return buf;
}
