/* ere.c -- POSIX ERE: parser, Thompson NFA, lazily built DFA; see ere.h.
 *
 * Sections: NFA and parser / byte classes / DFA cache / search. */
#include "master/ere.h"

#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/mem.h"
#include "kvpool.h"

#define END UINT32_MAX /* end of a patch list; "no node" */

/* ============================================================ NFA */

enum { N_CHAR, N_SPLIT, N_JMP, N_BOL, N_EOL, N_MATCH };

typedef struct enode {
    uint8_t op;
    uint32_t out, out1; /* successors (out1: SPLIT only); while dangling, patch links */
    uint32_t set;       /* CHAR: index into sets */
} enode;

typedef struct dstate {
    uint32_t off, len; /* its NFA states (CHAR and pending EOL), sorted, in pool */
    uint32_t hash;
    uint8_t match;     /* MATCH reached: the search is decided */
    uint8_t eol_ok;    /* at the key's end, a pending '$' leads to MATCH */
} dstate;

struct kvp_ere {
    enode *n;
    uint32_t nn, start;
    uint8_t (*sets)[32];
    uint32_t nsets;
    uint8_t cls[256];  /* byte -> class: bytes of a class behave alike in every set */
    uint8_t rep[256];  /* class -> one of its bytes */
    uint32_t ncls;
    /* DFA cache: fixed arrays sized at compile time; full = flush */
    dstate *ds;
    uint32_t nds, ds_cap;
    int32_t *trans;    /* nds x ncls: next state, -1 = not built */
    uint32_t *pool;
    size_t npool, pool_cap;
    int32_t *ht;       /* open addressing over ds by set hash; -1 = empty */
    uint32_t ht_mask;
    int32_t start_bol; /* the state before the first byte; -1 = not built */
    uint32_t epoch;    /* flushes so far */
    /* scratch for closures: stack, visit marks, the set being built */
    uint32_t *stk, *mark, *tmp;
    uint32_t markgen;
};

/* ---------------------------------------------------------- parser */

typedef struct frag {
    uint32_t start, out; /* out: patch list of dangling successor fields */
} frag;

typedef struct parser {
    const uint8_t *s;
    size_t len, i;
    kvp_ere *e;
    int err;
    uint32_t depth;
    uint32_t sets_cap;
    uint32_t node_cap; /* nodes allocated in e->n */
} parser;

static uint32_t node(parser *p, uint8_t op)
{
    kvp_ere *e = p->e;
    if (e->nn >= p->node_cap) {
        p->err = KVP_EINVALID_PARAMS;
        return END;
    }
    uint32_t k = e->nn++;
    e->n[k] = (enode){op, END, END, 0};
    return k;
}

static uint32_t *field(kvp_ere *e, uint32_t l) { return (l & 1) ? &e->n[l >> 1].out1 : &e->n[l >> 1].out; }

static void patch(kvp_ere *e, uint32_t l, uint32_t to)
{
    while (l != END) {
        uint32_t *f = field(e, l);
        l = *f;
        *f = to;
    }
}

static uint32_t append(kvp_ere *e, uint32_t a, uint32_t b)
{
    if (a == END)
        return b;
    uint32_t l = a;
    while (*field(e, l) != END)
        l = *field(e, l);
    *field(e, l) = b;
    return a;
}

static frag single(parser *p, uint8_t op)
{
    uint32_t k = node(p, op);
    return (frag){k, k == END ? END : k << 1};
}

static frag char_node(parser *p, const uint8_t set[32])
{
    kvp_ere *e = p->e;
    if (e->nsets == p->sets_cap) {
        uint32_t cap = p->sets_cap ? 2 * p->sets_cap : 64;
        void *ns = kvp_realloc(e->sets, (size_t)cap * 32);
        if (!ns) {
            p->err = KVP_ENOMEM;
            return (frag){END, END};
        }
        e->sets = ns;
        p->sets_cap = cap;
    }
    frag f = single(p, N_CHAR);
    if (p->err)
        return f;
    memcpy(e->sets[e->nsets], set, 32);
    e->n[f.start].set = e->nsets++;
    return f;
}

static inline void bit_set(uint8_t set[32], unsigned b) { set[b >> 3] |= (uint8_t)(1u << (b & 7)); }
static inline int bit_has(const uint8_t set[32], unsigned b) { return (set[b >> 3] >> (b & 7)) & 1; }

/* The ASCII character classes (the C locale's). 0, or -1 for an unknown name. */
static int class_bits(const uint8_t *name, size_t n, uint8_t set[32])
{
    static const char *const names[] = {"alpha", "digit", "alnum", "upper", "lower", "space",
                                        "blank", "punct", "print", "graph", "cntrl", "xdigit"};
    int k = -1;
    for (int i = 0; i < 12; i++)
        if (strlen(names[i]) == n && memcmp(names[i], name, n) == 0)
            k = i;
    if (k < 0)
        return -1;
    for (unsigned c = 0; c < 256; c++) {
        int up = c >= 'A' && c <= 'Z', lo = c >= 'a' && c <= 'z', dg = c >= '0' && c <= '9';
        int gr = c >= 33 && c <= 126;
        int in = 0;
        switch (k) {
        case 0: in = up || lo; break;
        case 1: in = dg; break;
        case 2: in = up || lo || dg; break;
        case 3: in = up; break;
        case 4: in = lo; break;
        case 5: in = c == ' ' || (c >= '\t' && c <= '\r'); break;
        case 6: in = c == ' ' || c == '\t'; break;
        case 7: in = gr && !up && !lo && !dg; break;
        case 8: in = c >= 32 && c <= 126; break;
        case 9: in = gr; break;
        case 10: in = c < 32 || c == 127; break;
        case 11: in = dg || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); break;
        }
        if (in)
            bit_set(set, c);
    }
    return 0;
}

/* '[' ... ']' at p->i (on the '['). */
static frag bracket(parser *p)
{
    const uint8_t *s = p->s;
    size_t len = p->len, i = p->i + 1;
    uint8_t set[32] = {0};
    int neg = 0, first = 1;
    if (i < len && s[i] == '^') {
        neg = 1;
        i++;
    }
    for (;;) {
        if (i >= len)
            goto bad;
        uint8_t c = s[i];
        if (c == ']' && !first) {
            i++;
            break;
        }
        first = 0;
        if (c == '[' && i + 1 < len && (s[i + 1] == '.' || s[i + 1] == '='))
            goto bad; /* collating elements, equivalence classes: refused */
        if (c == '[' && i + 1 < len && s[i + 1] == ':') {
            size_t j = i + 2;
            while (j + 1 < len && !(s[j] == ':' && s[j + 1] == ']'))
                j++;
            if (j + 1 >= len || class_bits(s + i + 2, j - i - 2, set) != 0)
                goto bad;
            i = j + 2;
            if (i + 1 < len && s[i] == '-' && s[i + 1] != ']')
                goto bad; /* a class cannot start a range */
            continue;
        }
        i++;
        if (i + 1 < len && s[i] == '-' && s[i + 1] != ']') {
            uint8_t hi = s[i + 1];
            if (hi == '[' && i + 2 < len && (s[i + 2] == '.' || s[i + 2] == '=' || s[i + 2] == ':'))
                goto bad;
            i += 2;
            if (hi < c)
                goto bad;
            for (unsigned b = c; b <= hi; b++)
                bit_set(set, b);
            if (i + 1 < len && s[i] == '-' && s[i + 1] != ']')
                goto bad; /* "a-c-e": glibc refuses a range's end starting another */
        } else {
            bit_set(set, c);
        }
    }
    if (neg)
        for (int k = 0; k < 32; k++)
            set[k] = (uint8_t)~set[k];
    p->i = i;
    return char_node(p, set);
bad:
    p->err = KVP_EINVALID_PARAMS;
    return (frag){END, END};
}

/* '\' at p->i. */
static frag escape(parser *p)
{
    if (p->i + 1 >= p->len) {
        p->err = KVP_EINVALID_PARAMS;
        return (frag){END, END};
    }
    uint8_t c = p->s[p->i + 1];
    p->i += 2;
    uint8_t set[32] = {0};
    if ((c >= '1' && c <= '9') || strchr("bB<>`'", c)) {
        p->err = KVP_EINVALID_PARAMS; /* back-references, assertions */
        return (frag){END, END};
    }
    if (c == 'w' || c == 'W') {
        class_bits((const uint8_t *)"alnum", 5, set);
        bit_set(set, '_');
    } else if (c == 's' || c == 'S') {
        class_bits((const uint8_t *)"space", 5, set);
    } else {
        bit_set(set, c);
        return char_node(p, set);
    }
    if (c == 'W' || c == 'S')
        for (int k = 0; k < 32; k++)
            set[k] = (uint8_t)~set[k];
    return char_node(p, set);
}

static frag alternation(parser *p);

/* One atom and its '*', '+', '?'. */
static frag piece(parser *p)
{
    kvp_ere *e = p->e;
    uint8_t c = p->s[p->i];
    frag a;
    int anchor = 0;
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == '}') {
        /* nothing to repeat; counted repetition is refused (its cost) */
        p->err = KVP_EINVALID_PARAMS;
        return (frag){END, END};
    }
    if (c == '(') {
        p->i++;
        p->depth++;
        a = alternation(p);
        if (p->err)
            return a;
        if (p->i >= p->len || p->s[p->i] != ')') {
            p->err = KVP_EINVALID_PARAMS;
            return a;
        }
        p->i++;
        p->depth--;
    } else if (c == '^' || c == '$') {
        a = single(p, c == '^' ? N_BOL : N_EOL);
        anchor = 1;
        p->i++;
    } else if (c == '[') {
        a = bracket(p);
    } else if (c == '\\') {
        a = escape(p);
    } else {
        uint8_t set[32] = {0};
        if (c == '.') {
            memset(set, 0xFF, 32);
            set[0] &= 0xFE; /* '.' is any byte but NUL (glibc's RE_DOT_NOT_NULL) */
        } else {
            bit_set(set, c); /* ')' unmatched at the top level included */
        }
        p->i++;
        a = char_node(p, set);
    }
    while (!p->err && p->i < p->len &&
           (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?')) {
        if (anchor) {
            p->err = KVP_EINVALID_PARAMS; /* as glibc: "^*" is refused */
            break;
        }
        uint8_t q = p->s[p->i++];
        uint32_t sp = node(p, N_SPLIT);
        if (p->err)
            break;
        if (q == '*') {
            patch(e, a.out, sp);
            e->n[sp].out = a.start;
            a = (frag){sp, sp << 1 | 1};
        } else if (q == '+') {
            patch(e, a.out, sp);
            e->n[sp].out = a.start;
            a = (frag){a.start, sp << 1 | 1};
        } else {
            e->n[sp].out = a.start;
            a = (frag){sp, append(e, a.out, sp << 1 | 1)};
        }
    }
    return a;
}

/* Pieces up to '|', a closing ')' or the end; empty: an epsilon. */
static frag branch(parser *p)
{
    frag f = {END, END};
    int have = 0;
    while (!p->err && p->i < p->len && p->s[p->i] != '|' && !(p->s[p->i] == ')' && p->depth > 0)) {
        frag g = piece(p);
        if (p->err)
            return g;
        if (!have) {
            f = g;
            have = 1;
        } else {
            patch(p->e, f.out, g.start);
            f.out = g.out;
        }
    }
    if (!have && !p->err)
        f = single(p, N_JMP);
    return f;
}

static frag alternation(parser *p)
{
    frag f = branch(p);
    while (!p->err && p->i < p->len && p->s[p->i] == '|') {
        p->i++;
        frag g = branch(p);
        if (p->err)
            break;
        uint32_t sp = node(p, N_SPLIT);
        if (p->err)
            break;
        p->e->n[sp].out = f.start;
        p->e->n[sp].out1 = g.start;
        f = (frag){sp, append(p->e, f.out, g.out)};
    }
    return f;
}

/* Anchors only at the key's ends: no '^' is reachable (through epsilon
 * moves) from a byte just read, and no byte is read after a '$'. Others
 * ("a^b", "(^a)*", "a$b", "(x|$)+") are refused: they can never hold in
 * POSIX, but glibc's DFA lets them hold next to a newline, so no answer
 * would agree with it. Two linear passes over the NFA. */
static int anchors_at_ends(kvp_ere *e)
{
    for (int pass = 0; pass < 2; pass++) {
        uint8_t from = pass == 0 ? N_CHAR : N_EOL;
        uint32_t sp = 0;
        memset(e->mark, 0, (size_t)e->nn * sizeof *e->mark);
        for (uint32_t k = 0; k < e->nn; k++) {
            uint32_t t = e->n[k].out;
            if (e->n[k].op == from && t != END && !e->mark[t]) {
                e->mark[t] = 1;
                e->stk[sp++] = t;
            }
        }
        while (sp) {
            const enode *x = &e->n[e->stk[--sp]];
            if ((pass == 0 && x->op == N_BOL) || (pass == 1 && x->op == N_CHAR))
                return 0;
            if (x->op == N_CHAR || x->op == N_MATCH)
                continue;
            uint32_t next[2] = {x->out, x->op == N_SPLIT ? x->out1 : END};
            for (int j = 0; j < 2; j++)
                if (next[j] != END && !e->mark[next[j]]) {
                    e->mark[next[j]] = 1;
                    e->stk[sp++] = next[j];
                }
        }
    }
    memset(e->mark, 0, (size_t)e->nn * sizeof *e->mark);
    return 1;
}

/* ===================================================== byte classes */

/* Refines the partition of bytes by every set: two bytes share a class
 * when no set tells them apart. */
static void byte_classes(kvp_ere *e)
{
    memset(e->cls, 0, sizeof e->cls);
    e->ncls = 1;
    int16_t map[512];
    for (uint32_t k = 0; k < e->nsets && e->ncls < 256; k++) {
        memset(map, 0xFF, sizeof map);
        uint32_t nc = 0;
        for (unsigned b = 0; b < 256; b++) {
            unsigned key = e->cls[b] * 2u + (unsigned)bit_has(e->sets[k], b);
            if (map[key] < 0)
                map[key] = (int16_t)nc++;
            e->cls[b] = (uint8_t)map[key];
        }
        e->ncls = nc;
    }
    for (int b = 255; b >= 0; b--)
        e->rep[e->cls[b]] = (uint8_t)b;
}

/* ======================================================== DFA cache */

static void cache_flush(kvp_ere *e)
{
    e->nds = 0;
    e->npool = 0;
    memset(e->ht, 0xFF, ((size_t)e->ht_mask + 1) * sizeof *e->ht);
    e->start_bol = -1;
    e->epoch++;
}

static int cache_init(kvp_ere *e)
{
    size_t per = sizeof(dstate) + (size_t)e->ncls * sizeof(int32_t);
    e->ds_cap = (uint32_t)(ERE_CACHE / 2 / per);
    if (e->ds_cap < 16)
        e->ds_cap = 16;
    e->pool_cap = ERE_CACHE / 2 / sizeof(uint32_t);
    if (e->pool_cap < 3 * (size_t)e->nn + 16)
        e->pool_cap = 3 * (size_t)e->nn + 16; /* room for the state in hand and the next */
    uint32_t hs = 32;
    while (hs < 2 * e->ds_cap)
        hs <<= 1;
    e->ht_mask = hs - 1;
    e->ds = kvp_malloc((size_t)e->ds_cap * sizeof *e->ds);
    e->trans = kvp_malloc((size_t)e->ds_cap * e->ncls * sizeof *e->trans);
    e->pool = kvp_malloc(e->pool_cap * sizeof *e->pool);
    e->ht = kvp_malloc((size_t)hs * sizeof *e->ht);
    e->stk = kvp_malloc((size_t)e->nn * sizeof *e->stk);
    e->mark = kvp_calloc(e->nn, sizeof *e->mark);
    e->tmp = kvp_malloc((size_t)e->nn * sizeof *e->tmp);
    if (!e->ds || !e->trans || !e->pool || !e->ht || !e->stk || !e->mark || !e->tmp)
        return KVP_ENOMEM;
    cache_flush(e);
    e->epoch = 1;
    return 0;
}

/* Adds the epsilon closure of node k to e->tmp[*n] (nodes not yet marked
 * with e->markgen): CHAR nodes and, unless `eol`, EOL nodes are kept; '^'
 * passes only when `bol`. Returns 1 if MATCH was reached. *work counts
 * the nodes visited. */
static int closure(kvp_ere *e, uint32_t k, int bol, int eol, uint32_t *n, uint64_t *work)
{
    int match = 0;
    uint32_t sp = 0;
    if (e->mark[k] == e->markgen)
        return 0;
    e->mark[k] = e->markgen;
    e->stk[sp++] = k;
    while (sp) {
        const enode *x = &e->n[e->stk[--sp]];
        uint32_t next[2] = {END, END};
        (*work)++;
        switch (x->op) {
        case N_CHAR: e->tmp[(*n)++] = (uint32_t)(x - e->n); break;
        case N_MATCH: match = 1; break;
        case N_SPLIT: next[0] = x->out; next[1] = x->out1; break;
        case N_JMP: next[0] = x->out; break;
        case N_BOL: if (bol) next[0] = x->out; break;
        case N_EOL:
            if (eol)
                next[0] = x->out;
            else
                e->tmp[(*n)++] = (uint32_t)(x - e->n);
            break;
        }
        for (int j = 0; j < 2; j++) {
            uint32_t t = next[j];
            if (t != END && e->mark[t] != e->markgen) {
                e->mark[t] = e->markgen;
                e->stk[sp++] = t;
            }
        }
    }
    return match;
}

static void mark_next(kvp_ere *e)
{
    if (++e->markgen == 0) {
        memset(e->mark, 0, (size_t)e->nn * sizeof *e->mark);
        e->markgen = 1;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Whether a pending '$' of the set leads to MATCH at the key's end. */
static int eol_reaches_match(kvp_ere *e, const uint32_t *set, uint32_t n, uint64_t *work)
{
    mark_next(e);
    /* closure() appends to e->tmp (free again: the set is in the pool);
     * only the MATCH flag matters here */
    for (uint32_t i = 0; i < n; i++) {
        const enode *x = &e->n[set[i]];
        uint32_t scratch = 0;
        if (x->op == N_EOL && x->out != END && closure(e, x->out, 0, 1, &scratch, work))
            return 1;
    }
    return 0;
}

/* The state of the set in e->tmp[0..n) (unsorted) with the MATCH flag:
 * found in the cache or added (flushing it when full). */
static int32_t state_get(kvp_ere *e, uint32_t n, int match, uint64_t *work)
{
    qsort(e->tmp, n, sizeof *e->tmp, cmp_u32);
    *work += n;
    uint32_t h = 2166136261u ^ (uint32_t)match;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ e->tmp[i]) * 16777619u;
    for (uint32_t j = h & e->ht_mask;; j = (j + 1) & e->ht_mask) {
        int32_t id = e->ht[j];
        if (id < 0)
            break;
        const dstate *d = &e->ds[id];
        if (d->hash == h && d->len == n && d->match == match &&
            memcmp(e->pool + d->off, e->tmp, (size_t)n * sizeof *e->tmp) == 0)
            return id;
    }
    if (e->nds == e->ds_cap || e->npool + n > e->pool_cap)
        cache_flush(e);
    int32_t id = (int32_t)e->nds++;
    dstate *d = &e->ds[id];
    d->off = (uint32_t)e->npool;
    d->len = n;
    d->hash = h;
    d->match = (uint8_t)match;
    memcpy(e->pool + e->npool, e->tmp, (size_t)n * sizeof *e->tmp);
    e->npool += n;
    /* e->tmp is reused by the EOL closure: work from the pool copy */
    d->eol_ok = !match && (uint8_t)eol_reaches_match(e, e->pool + d->off, n, work);
    for (uint32_t c = 0; c < e->ncls; c++)
        e->trans[(size_t)id * e->ncls + c] = -1;
    *work += e->ncls;
    uint32_t j = h & e->ht_mask;
    while (e->ht[j] >= 0)
        j = (j + 1) & e->ht_mask;
    e->ht[j] = id;
    return id;
}

/* The state after `from` reads a byte of class c; a new match may start
 * after the byte (the search is unanchored). */
static int32_t step(kvp_ere *e, int32_t from, uint32_t c, uint64_t *work)
{
    mark_next(e);
    uint32_t n = 0;
    int match = 0;
    const dstate *d = &e->ds[from];
    uint8_t b = e->rep[c];
    for (uint32_t i = 0; i < d->len; i++) {
        const enode *x = &e->n[e->pool[d->off + i]];
        (*work)++;
        if (x->op == N_CHAR && bit_has(e->sets[x->set], b))
            match |= closure(e, x->out, 0, 0, &n, work);
    }
    match |= closure(e, e->start, 0, 0, &n, work);
    uint32_t epoch = e->epoch;
    int32_t to = state_get(e, n, match, work);
    if (e->epoch == epoch)
        e->trans[(size_t)from * e->ncls + c] = to; /* `from` survived: remember */
    return to;
}

static int32_t start_state(kvp_ere *e, uint64_t *work)
{
    if (e->start_bol < 0) {
        mark_next(e);
        uint32_t n = 0;
        int match = closure(e, e->start, 1, 0, &n, work);
        int32_t id = state_get(e, n, match, work);
        e->start_bol = id;
    }
    return e->start_bol;
}

/* ======================================================== interface */

int kvp_ere_compile(const char *pat, size_t len, kvp_ere **out)
{
    *out = NULL;
    if (memchr(pat, 0, len))
        return KVP_EINVALID_PARAMS;
    kvp_ere *e = kvp_calloc(1, sizeof *e);
    if (!e)
        return KVP_ENOMEM;
    /* at most two nodes per pattern byte, plus MATCH and an empty branch */
    size_t cap = 2 * len + 4 < ERE_MAX_NODES ? 2 * len + 4 : ERE_MAX_NODES;
    e->n = kvp_malloc(cap * sizeof *e->n);
    if (!e->n) {
        kvp_free(e);
        return KVP_ENOMEM;
    }
    parser p = {(const uint8_t *)pat, len, 0, e, 0, 0, 0, (uint32_t)cap};
    frag f = alternation(&p);
    if (!p.err && p.i != len)
        p.err = KVP_EINVALID_PARAMS; /* not reached: branch() stops only at '|', ')' or the end */
    if (!p.err) {
        uint32_t mk = node(&p, N_MATCH);
        if (!p.err) {
            patch(e, f.out, mk);
            e->start = f.start;
        }
    }
    int rc = p.err;
    if (!rc) {
        byte_classes(e);
        rc = cache_init(e);
        if (!rc && !anchors_at_ends(e))
            rc = KVP_EINVALID_PARAMS;
    }
    if (rc) {
        kvp_ere_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void kvp_ere_free(kvp_ere *e)
{
    if (!e)
        return;
    kvp_free(e->n);
    kvp_free(e->sets);
    kvp_free(e->ds);
    kvp_free(e->trans);
    kvp_free(e->pool);
    kvp_free(e->ht);
    kvp_free(e->stk);
    kvp_free(e->mark);
    kvp_free(e->tmp);
    kvp_free(e);
}

int kvp_ere_search(kvp_ere *e, kvp_ere_run *r, const uint8_t *s, size_t len, uint64_t *budget)
{
    uint64_t work = 0;
    if (len == 0) {
        /* '^' and '$' both hold at the only position */
        mark_next(e);
        uint32_t n = 0;
        int m = closure(e, e->start, 1, 1, &n, &work);
        *budget = *budget > work ? *budget - work : 0;
        return m ? KVP_ERE_MATCH : KVP_ERE_NOMATCH;
    }
    KVP_ASSERT(r->state < 0 || r->epoch == e->epoch); /* one run at a time */
    int32_t st = r->state;
    size_t pos = r->pos;
    if (st < 0) {
        st = start_state(e, &work);
        pos = 0;
    }
    int rc = KVP_ERE_MORE;
    while (rc == KVP_ERE_MORE) {
        if (e->ds[st].match) {
            rc = KVP_ERE_MATCH;
        } else if (pos == len) {
            rc = e->ds[st].eol_ok ? KVP_ERE_MATCH : KVP_ERE_NOMATCH;
        } else if (work >= *budget) {
            break;
        } else {
            uint32_t c = e->cls[s[pos]];
            int32_t nx = e->trans[(size_t)st * e->ncls + c];
            if (nx < 0)
                nx = step(e, st, c, &work);
            else
                work++;
            st = nx;
            pos++;
        }
    }
    r->state = st;
    r->pos = pos;
    r->epoch = e->epoch;
    *budget = *budget > work ? *budget - work : 0;
    return rc;
}

int kvp_ere_match(kvp_ere *e, const uint8_t *s, size_t len)
{
    kvp_ere_run r;
    kvp_ere_run_init(&r);
    uint64_t budget = UINT64_MAX;
    return kvp_ere_search(e, &r, s, len, &budget);
}
