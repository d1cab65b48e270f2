/*
 * fuzz_ere.c -- the master's regex matcher (src/master/ere.c) against glibc
 * regcomp/regexec, on short patterns where glibc is safe to run.
 *
 * Input: pattern bytes up to the first NUL (at most 64), then the key (the
 * rest, at most 256 bytes, NULs allowed). Invariants (abort on violation):
 *  - kvp_ere_compile answers 0, KVP_EINVALID_PARAMS or KVP_ENOMEM only;
 *  - a pattern it accepts, glibc (REG_EXTENDED) accepts too, and the match
 *    answer (searched anywhere, REG_STARTEND) is glibc's, where glibc is
 *    safe to run (no stacked repetitions: its regcomp is exponential there);
 *  - the same search with tiny budgets (resumed over many calls) gives the
 *    same answer, and a search without budget spends work linear in the key
 *    (at most ERE_MAX_NODES * 64 units per byte plus a constant).
 */
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "master/ere.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t plen = nul ? (size_t)(nul - data) : size;
    if (plen == 0 || plen > 64)
        return 0;
    const uint8_t *key = nul ? nul + 1 : data + size;
    size_t klen = (size_t)(data + size - key);
    if (klen > 256)
        return 0;
    char pat[65];
    memcpy(pat, data, plen);
    pat[plen] = 0;
    kvp_ere *e = NULL;
    int rc = kvp_ere_compile(pat, plen, &e);
    if (rc != 0) {
        if (rc != KVP_EINVALID_PARAMS && rc != KVP_ENOMEM)
            abort();
        return 0;
    }
    char *k = malloc(klen + 1); /* NUL-terminated: ASan's regexec reads to a NUL */
    memcpy(k, key, klen);
    k[klen] = 0;
    /* glibc is the oracle only where it is safe: stacked repetitions
     * ("a++++", "b*+++") make its regcomp exponential (a 33-byte pattern
     * took 6 s, 62 s under the sanitizers, and memory with it) */
    int reps = 0, stacked = 0;
    for (size_t i = 0; i < plen; i++) {
        int rep = pat[i] == '*' || pat[i] == '+' || pat[i] == '?';
        reps += rep;
        stacked += rep && i > 0 && (pat[i - 1] == '*' || pat[i - 1] == '+' || pat[i - 1] == '?');
    }
    int want = -1; /* unknown: only resumed and whole searches must agree */
    if (stacked <= 1 && reps <= 12) {
        regex_t re;
        if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB) != 0)
            abort(); /* we accepted what glibc refuses */
        regmatch_t m = {.rm_so = 0, .rm_eo = (regoff_t)klen};
        want = regexec(&re, k, 1, &m, REG_STARTEND) == 0;
        regfree(&re);
    }

    kvp_ere_run r;
    kvp_ere_run_init(&r);
    uint64_t budget = UINT64_MAX;
    int got = kvp_ere_search(e, &r, (const uint8_t *)k, klen, &budget);
    if (got != 0 && got != 1)
        abort();
    if (want < 0)
        want = got;
    if (got != want)
        abort();
    if (UINT64_MAX - budget > (uint64_t)(klen + 1) * ERE_MAX_NODES * 64)
        abort();
    kvp_ere_run_init(&r);
    int calls = 0;
    do {
        uint64_t b = 1 + (uint64_t)(calls % 7);
        got = kvp_ere_search(e, &r, (const uint8_t *)k, klen, &b);
        calls++;
    } while (got == KVP_ERE_MORE && calls < 1000000);
    if (got != want)
        abort();
    free(k);
    kvp_ere_free(e);
    return 0;
}
