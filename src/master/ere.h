/*
 * ere.h -- POSIX extended regular expressions over bytes with a linear-time
 * guarantee (internal to src/master; REMOVE_REGEX).
 *
 * The pattern compiles to a Thompson NFA; matching walks a DFA built lazily
 * from it (RE2's approach): each DFA state is a set of NFA states, made the
 * first time a (state, byte class) transition is taken and kept in a cache
 * of bounded size (ERE_CACHE bytes; when full, the cache is flushed and
 * rebuilt as the walk goes on). So the cost per key byte is one table
 * lookup when cached and at most one state construction, O(m log m) for an
 * NFA of m states, otherwise: never exponential, whatever the pattern's
 * shape (glibc's regexec took 20 ms per 4 KiB key on
 * "(a|b|ab|ba|aa|bb)*...c"). m is at most ERE_MAX_NODES.
 *
 * Semantics: those of glibc regcomp(REG_EXTENDED | REG_NOSUB) + regexec
 * (REG_STARTEND) in the C locale, for the patterns this module accepts:
 * the key is searched anywhere (not anchored), bytes are characters,
 * '.' is any byte but NUL, '^' / '$' match only at the start / end of the
 * key (newlines are ordinary), bracket classes are ASCII's, ranges are by
 * byte value, an unmatched ')' and an empty branch or group are accepted
 * as glibc does. Accepted: literals, '.', '[...]' with ranges and
 * '[:class:]', '\w \W \s \S', '\' before any other non-alphanumeric or
 * non-special letter as a literal, '( )', '|', '*', '+', '?', '^', '$'.
 * Refused (kvp_ere_compile fails): counted repetition '{' / '}' (the
 * automaton it implies), back-references '\1'-'\9' (not regular),
 * word assertions '\b \B \< \> \` \'', '[.x.]' and '[=x=]', a '^' that
 * may follow a byte of the key or a '$' that may precede one ("a^b",
 * "(^a)*", "(x|$)+": never true in POSIX, true next to a newline in glibc),
 * and anything glibc refuses. tests/unit/test_ere.c and tests/fuzz/fuzz_ere.c check the
 * agreement with glibc.
 *
 * Matching is resumable: kvp_ere_search takes a work budget and stops when
 * it is spent, keeping its place in a kvp_ere_run; a later call with the
 * same run and the same bytes goes on. One run per kvp_ere is in progress
 * at a time (a cache flush renumbers the states; the run in progress is
 * carried over, others would not be).
 */
#ifndef KVP_ERE_H
#define KVP_ERE_H

#include <stddef.h>
#include <stdint.h>

#define ERE_MAX_NODES 8192      /* NFA states; longer patterns are refused */
#define ERE_CACHE (1u << 20)    /* bytes of DFA states and transitions */

typedef struct kvp_ere kvp_ere;

/* A search in progress. Set up with kvp_ere_run_init before the first call. */
typedef struct kvp_ere_run {
    size_t pos;     /* key bytes consumed */
    int32_t state;  /* DFA state after them; -1 = not started */
    uint32_t epoch; /* the cache epoch `state` belongs to */
} kvp_ere_run;

enum { KVP_ERE_NOMATCH = 0, KVP_ERE_MATCH = 1, KVP_ERE_MORE = 2 };

/* Compiles pat[0..len) (no NUL bytes). 0, KVP_EINVALID_PARAMS (syntax
 * refused, see above) or KVP_ENOMEM. */
int kvp_ere_compile(const char *pat, size_t len, kvp_ere **out);
void kvp_ere_free(kvp_ere *e);

static inline void kvp_ere_run_init(kvp_ere_run *r)
{
    r->pos = 0;
    r->state = -1;
    r->epoch = 0;
}

/*
 * Searches s[0..len) for a match anywhere, spending at most about *budget
 * work units (one per byte walked through cached states; a state
 * construction costs the NFA states it touches); *budget is decreased by
 * what was spent. KVP_ERE_MATCH / KVP_ERE_NOMATCH when decided,
 * KVP_ERE_MORE when the budget ran out first (call again with the same
 * run, s and len), or KVP_ENOMEM.
 */
int kvp_ere_search(kvp_ere *e, kvp_ere_run *r, const uint8_t *s, size_t len, uint64_t *budget);

/* kvp_ere_search to the end, without a budget (tests, small inputs). */
int kvp_ere_match(kvp_ere *e, const uint8_t *s, size_t len);

#endif
