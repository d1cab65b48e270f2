/*
 * test_ere.c -- the master's regex matcher (src/master/ere.c) against glibc
 * regcomp/regexec (REG_EXTENDED, REG_STARTEND, C locale): the same answer
 * for every pattern both accept, on handwritten and generated patterns and
 * keys; what it refuses; resumable searches with small budgets; and the
 * pattern that made glibc take 20 ms per key.
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "kvpool.h"
#include "master/ere.h"

/* glibc's answer: 1 match, 0 no match, -1 refused */
static int glibc(const char *pat, const uint8_t *s, size_t len)
{
    regex_t re;
    if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB))
        return -1;
    /* NUL-terminated copy: ASan's regexec interceptor reads up to a NUL */
    char *c = malloc(len + 1);
    memcpy(c, s, len);
    c[len] = 0;
    regmatch_t m = {.rm_so = 0, .rm_eo = (regoff_t)len};
    int r = regexec(&re, c, 1, &m, REG_STARTEND) == 0;
    regfree(&re);
    free(c);
    return r;
}

static int ours(const char *pat, const uint8_t *s, size_t len)
{
    kvp_ere *e;
    if (kvp_ere_compile(pat, strlen(pat), &e))
        return -1;
    int r = kvp_ere_match(e, s, len);
    kvp_ere_free(e);
    return r;
}

/* Our answer equals glibc's whenever we accept; glibc accepts whatever we do. */
static int agree(const char *pat, const uint8_t *s, size_t len)
{
    int o = ours(pat, s, len), g = glibc(pat, s, len);
    if (o >= 0 && o != g) {
        fprintf(stderr, "pattern \"%s\" key \"%.*s\" (%zu): ours %d glibc %d\n", pat, (int)len,
                (const char *)s, len, o, g);
        return 0;
    }
    return 1;
}

static const char *const pats[] = {
    "a", "abc", "^abc", "abc$", "^abc$", "a|b", "a|", "|a", "a||b", "()", "(|a)", "a)", ")",
    "(a)", "a*", "a+", "a?", "a**", "x*+?", "(ab)*c", "(a|b)*c", "(a|b|ab|ba|aa|bb)*c",
    "^(a|b)+$", "a.c", ".", "^.$", "..", "[abc]", "[^abc]", "[a-c]x", "[]a]", "[^]a]", "[a-]",
    "[-a]", "[[]", "[a[]", "[\\n]", "[[:digit:]]+", "[[:alpha:][:digit:]_]", "[^[:space:]]",
    "[[:upper:]]", "[[:lower:]]", "[[:punct:]]", "[[:xdigit:]]", "[[:cntrl:]]", "[[:print:]]",
    "[[:graph:]]", "[[:blank:]]", "[[:alnum:]]", "\\w+", "\\W", "\\s", "\\S", "\\.", "\\n",
    "a\\*", "keep\\{", "(^a)", "(a$)|b", "^$", "$", "^", "(^|x)a", "a($|x)",
    "((a))*", "(a*)*", "(a*)+b", "(^)*", "(a?)*$", "x(a|b)*y", "^rx/[0-9]$",
    "rx/", "[0-9][0-9]*\\.[0-9]", "\xff", "[\x80-\xff]", "a[^b]c", "(a|b)(c|d)(e|f)",
    "^[^/]*/[^/]*$", "(.*)*x", "(a+)+b", "([ab]*)*c", "[[:alpha:]-]", "ab|cd|ef|^gh|ij$",
};

static const char *const keys[] = {
    "", "a", "b", "c", "ab", "abc", "xabcx", "aaaaac", "ababab", "ababc", "]", "-", "[", "\\",
    "n", "x.y", "1.5", "rx/1", "rx/12", "rx/", "a)b", ")", "gh", "xgh", "ij", "ijx", "a b",
    "A_9", "\t", "*", "xay", "xy", "acb", "a\nc", "ddd", "x/y", "x/y/z", "bbbbbbbbbbbbbb",
};

TEST(differential_fixed)
{
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++) {
        CHECK(ours(pats[i], (const uint8_t *)"", 0) >= 0); /* all of these are accepted */
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            CHECK(agree(pats[i], (const uint8_t *)keys[k], strlen(keys[k])));
    }
    /* bytes glibc treats specially: NUL (not matched by '.'), 0xff, newline */
    static const uint8_t odd[][3] = {{'a', 0, 'c'}, {'a', 0xff, 'c'}, {'a', '\n', 'c'},
                                     {0, 0, 0}, {'a', 'b', 0}};
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++)
        for (size_t k = 0; k < sizeof odd / sizeof *odd; k++)
            CHECK(agree(pats[i], odd[k], 3));
}

TEST(refused)
{
    /* what glibc refuses, and what we refuse on purpose */
    static const char *const bad[] = {
        "(", "a(b", "[a", "[]", "[^]", "*a", "+a", "?", "a|*b", "(*a)", "^*", "$*", "\\",
        "a{2}", "a{1,255}", "{", "}", "(a)\\1", "\\b", "\\B", "\\<", "\\>", "\\`", "\\'",
        "[[.a.]]", "[[=a=]]", "[[:foo:]]", "[z-a]", "[[:alpha:]-z]", "[[:alpha:]", "[a-c-e]",
        /* anchors inside: glibc lets them hold next to a newline */
        "a^b", "a$b", "(a|^)*b", "(^a)*", "(x|$)+", "$^[^a]", ".^a", "a$.",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvp_ere *e = NULL;
        int rc = kvp_ere_compile(bad[i], strlen(bad[i]), &e);
        if (rc != KVP_EINVALID_PARAMS)
            fprintf(stderr, "accepted: \"%s\"\n", bad[i]);
        CHECK_EQ(rc, KVP_EINVALID_PARAMS);
        CHECK(e == NULL);
    }
    kvp_ere *e = NULL;
    CHECK_EQ(kvp_ere_compile("a\0b", 3, &e), KVP_EINVALID_PARAMS);
}

/* Generated patterns over a small alphabet, so keys hit them often. */
static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static void gen(char *p, size_t *n, size_t cap, int depth)
{
    static const char *const atoms[] = {"a", "b", "c", ".", "[ab]", "[^a]", "^", "$", "\\.",
                                        "[[:alpha:]]", "x", "[a-c]", ")"};
    unsigned parts = 1 + rnd(3);
    for (unsigned k = 0; k < parts && *n + 16 < cap; k++) {
        if (k > 0 && rnd(4) == 0)
            p[(*n)++] = '|';
        if (depth < 4 && rnd(4) == 0) {
            p[(*n)++] = '(';
            gen(p, n, cap, depth + 1);
            p[(*n)++] = ')';
        } else {
            const char *a = atoms[rnd(sizeof atoms / sizeof *atoms)];
            if (depth > 0 && a[0] == ')')
                a = "a";
            memcpy(p + *n, a, strlen(a));
            *n += strlen(a);
            if (a[0] == '^' || a[0] == '$')
                continue;
        }
        unsigned q = rnd(6);
        if (q < 3)
            p[(*n)++] = "*+?"[q];
    }
}

TEST(differential_random)
{
    unsigned checked = 0;
    for (int t = 0; t < 400; t++) {
        char pat[256];
        size_t n = 0;
        gen(pat, &n, sizeof pat, 0);
        pat[n] = 0;
        for (int k = 0; k < 20; k++) {
            uint8_t key[16];
            size_t len = rnd(sizeof key);
            for (size_t j = 0; j < len; j++)
                key[j] = (uint8_t)"abcx.\n"[rnd(6)];
            CHECK(agree(pat, key, len));
            checked++;
        }
    }
    CHECK(checked > 0);
}

TEST(resumable_with_small_budgets)
{
    static const char pat[] = "(a|b)*abb(a|b)*c$";
    kvp_ere *e;
    CHECK_EQ(kvp_ere_compile(pat, strlen(pat), &e), 0);
    uint8_t key[3000];
    for (size_t i = 0; i < sizeof key; i++)
        key[i] = "ab"[(i * 7 + i / 3) % 2];
    memcpy(key + 1000, "abb", 3);
    key[sizeof key - 1] = 'c';
    for (uint64_t chunk = 1; chunk < 5000; chunk = chunk * 3 + 1) {
        kvp_ere_run r;
        kvp_ere_run_init(&r);
        int rc, calls = 0;
        do {
            uint64_t b = chunk;
            rc = kvp_ere_search(e, &r, key, sizeof key, &b);
            calls++;
        } while (rc == KVP_ERE_MORE);
        CHECK_EQ(rc, glibc(pat, key, sizeof key));
        CHECK(chunk > 1000 || calls > 1);
    }
    kvp_ere_free(e);
}

/* A pattern whose DFA outgrows the cache: flushes mid-search, same answers. */
TEST(cache_flush)
{
    /* (a|b)*a(a|b)^k: 2^k DFA states */
    char pat[128];
    snprintf(pat, sizeof pat, "(a|b)*a(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)"
                              "(a|b)(a|b)c");
    kvp_ere *e;
    CHECK_EQ(kvp_ere_compile(pat, strlen(pat), &e), 0);
    static uint8_t key[200000];
    for (size_t i = 0; i < sizeof key; i++)
        key[i] = (uint8_t)"ab"[rnd(2)];
    CHECK_EQ(kvp_ere_match(e, key, sizeof key), 0);
    key[sizeof key - 1] = 'c';
    key[sizeof key - 16] = 'a';
    CHECK_EQ(kvp_ere_match(e, key, sizeof key), 1);
    CHECK_EQ(kvp_ere_match(e, key, sizeof key), glibc(pat, key, sizeof key));
    kvp_ere_free(e);
}

/* The attack's pattern: (a|b|ab|ba|aa|bb)* 50 times, then 'c' (901 bytes). */
static char *attack_pattern(void)
{
    static const char unit[] = "(a|b|ab|ba|aa|bb)*";
    char *p = malloc(1024);
    size_t n = 0;
    for (int i = 0; i < 50; i++)
        n += (size_t)sprintf(p + n, "%s", unit);
    p[n++] = 'c';
    p[n] = 0;
    return p;
}

TEST(attack_pattern_linear)
{
    char *pat = attack_pattern();
    kvp_ere *e;
    CHECK_EQ(kvp_ere_compile(pat, strlen(pat), &e), 0);
    static uint8_t key[4096];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t work = 0;
    for (int k = 0; k < 200; k++) {
        for (size_t i = 0; i < sizeof key; i++)
            key[i] = (uint8_t)"ab"[rnd(2)];
        kvp_ere_run r;
        kvp_ere_run_init(&r);
        uint64_t b = UINT64_MAX;
        CHECK_EQ(kvp_ere_search(e, &r, key, sizeof key, &b), 0);
        work += UINT64_MAX - b;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("attack pattern: 200 keys of 4096 bytes in %.1f ms, %llu work units\n", ms,
           (unsigned long long)work);
    /* linear: about one unit per byte once the few DFA states are built */
    CHECK(work < 200ull * 4096 * 4);
    key[100] = 'c';
    CHECK_EQ(kvp_ere_match(e, key, sizeof key), 1);
    kvp_ere_free(e);
    free(pat);
}
