/*
 * segalloc.c -- per-segment space allocator (see segalloc.h).
 *
 * Design
 *  - Only free blocks have metadata. A free block [off, off+len) is a record
 *    in a pool of structs (`blk`), indexed by uint32; allocated blocks cost
 *    nothing (the caller remembers off and n).
 *  - Free blocks sit in segregated doubly linked lists, one per size class.
 *    Classes are TLSF's two levels: sizes below SL_COUNT (32) pages have one
 *    class per size (fl 0, sl = size); a size with highest bit f >= 5 is in
 *    fl = f - 4, sl = the next SL_LOG2 bits, so each power-of-two range is
 *    cut into 32 linear classes (class width <= 1/32 of the sizes in it).
 *    fl_bitmap has bit fl set iff sl_bitmap[fl] != 0; sl_bitmap[fl] has bit
 *    sl set iff list (fl, sl) is non-empty.
 *  - Allocate n pages, O(1): (1) scan at most SCAN_LIMIT (64) entries of
 *    n's own class list and take the best fit (smallest block >= n, an exact
 *    fit ends the scan); (2) if none fits, round n up to the next class
 *    boundary: the first non-empty list at or above that class (two
 *    find-first-set on the bitmaps) holds only blocks >= n, take its head.
 *    The n pages are cut from the start of the chosen block; the rest stays
 *    free. Guarantee: if a free block of at least round_up_class(n) pages
 *    exists, allocation succeeds; it can fail only if every block >= n lies
 *    in n's own class beyond the first 64 entries of that list.
 *    Step (1) first (rather than TLSF's rounded class first) leaves fewer,
 *    smaller remainders: with random 512 KiB..4 MiB values under churn the
 *    usable fraction rises from ~0.985 to ~0.991 (tests/unit/test_segalloc.c).
 *  - Free: two open-addressing hash maps (linear probing, backward-shift
 *    deletion, no tombstones) map a free block's start page and its end page
 *    (off + len, exclusive) to its record, so freeing [off, off+n) finds the
 *    free neighbour ending at off and the one starting at off+n in O(1)
 *    expected and merges with both.
 *  - Reservation: blocks are fully coalesced, so free blocks <= allocated
 *    blocks + 1 (and <= ceil(npages / 2)). Allocate never adds a free block
 *    (it shrinks or removes one); only free does. So before an allocation
 *    succeeds, kvp_segalloc_alloc grows the record pool and both maps (load
 *    <= 1/2) to hold that bound for the new count of allocated blocks; free
 *    then never allocates and never fails.
 *
 * Not thread-safe.
 */
#include "master/segalloc.h"

#include "common/assert.h"
#include "common/mem.h"
#include "kvpool.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define SL_LOG2 5
#define SL_COUNT (1u << SL_LOG2) /* second-level classes per power of two */
#define FL_COUNT (32 - SL_LOG2 + 1) /* fl 0 (small sizes) .. 27 (bit 31) */
#define SCAN_LIMIT 64 /* entries of n's own class examined by alloc step (2) */
#define POOL_MIN 8
#define MAP_MIN 16

/* A free block, or (len == 0) an unused record on the recycle stack. */
typedef struct {
    uint32_t off, len;
    uint32_t prev, next; /* free-list links; `next` also links the recycle stack */
} fblock;

/*
 * Open-addressing map page -> record index. A slot stores record + 1, so an
 * empty slot is all zero bytes.
 *
 * Capacity for the worst case is reserved up front (free must not
 * allocate), but resident memory follows the number of entries: each map
 * owns two zeroed arrays of `cap` slots from kvp_calloc (untouched pages are
 * not resident) and uses a power-of-two prefix of one of them, the active
 * table. When the active table passes half full it is rehashed into a
 * prefix twice as large of the other array, and its old prefix is zeroed:
 * growth without allocation. cap >= 2 x the most entries possible, so the
 * active table can always grow.
 */
typedef struct {
    uint32_t key, val;
} slot;

typedef struct {
    slot *s;        /* active table: the first mask+1 slots of this array */
    slot *spare;    /* the other array, all zero */
    uint64_t mask;  /* active slots - 1; a power of two */
    uint64_t cap;   /* slots in each array; a power of two */
    unsigned shift; /* 64 - log2(active slots), for the multiplicative hash */
    uint32_t count;
} pmap;

struct kvp_segalloc {
    uint32_t npages;
    uint64_t free_pages;
    uint32_t nfree;  /* free blocks (= records in use) */
    uint64_t nalloc; /* allocated blocks outstanding */

    fblock *blk;
    uint32_t cap;     /* records allocated */
    uint32_t hwm;     /* records ever handed out; [hwm, cap) never used */
    uint32_t recycle; /* stack of unused records below hwm, linked by next */
    uint32_t claim_end; /* end of the last kvp_segalloc_claim: where the next
                           ascending claim's free block starts */

    pmap by_start; /* off -> record */
    pmap by_end;   /* off + len -> record */

    uint32_t fl_bitmap;
    uint32_t sl_bitmap[FL_COUNT];
    uint32_t head[FL_COUNT][SL_COUNT];
};

/* ------------------------------------------------------------ size classes */

static unsigned log2_floor(uint32_t x) /* x >= 1 */
{
    return 31u - (unsigned)__builtin_clz(x);
}

/* Class of a block of n >= 1 pages. */
static void mapping_insert(uint32_t n, unsigned *fl, unsigned *sl)
{
    if (n < SL_COUNT) {
        *fl = 0;
        *sl = n;
    } else {
        unsigned f = log2_floor(n);
        *fl = f - SL_LOG2 + 1;
        *sl = (n >> (f - SL_LOG2)) - SL_COUNT;
    }
}

/*
 * Smallest class whose every block has >= n pages. Returns 0 if there is no
 * such class (n rounded up exceeds 2^32-1).
 */
static int mapping_search(uint32_t n, unsigned *fl, unsigned *sl)
{
    uint64_t r = n;
    if (n >= SL_COUNT)
        r += (1ull << (log2_floor(n) - SL_LOG2)) - 1;
    if (r > UINT32_MAX)
        return 0;
    mapping_insert((uint32_t)r, fl, sl);
    return 1;
}

/* ---------------------------------------------------------------- hash maps */

static uint64_t pmap_hash(const pmap *m, uint32_t key)
{
    return ((uint64_t)key * 0x9E3779B97F4A7C15ull) >> m->shift;
}

static void pmap_set_active(pmap *m, uint64_t slots)
{
    m->mask = slots - 1;
    m->shift = 64u - (unsigned)__builtin_ctzll(slots);
}

/* Allocates an empty map with room for `slots` (power of two >= 2). */
static int pmap_init(pmap *m, uint64_t slots)
{
    if (slots > SIZE_MAX / sizeof(slot))
        return KVP_ENOMEM;
    slot *s = kvp_calloc((size_t)slots, sizeof(slot));
    slot *sp = s ? kvp_calloc((size_t)slots, sizeof(slot)) : NULL;
    if (!sp) {
        kvp_free(s);
        return KVP_ENOMEM;
    }
    m->s = s;
    m->spare = sp;
    m->cap = slots;
    pmap_set_active(m, slots < MAP_MIN ? slots : MAP_MIN);
    m->count = 0;
    return 0;
}

static void pmap_free(pmap *m)
{
    kvp_free(m->s);
    kvp_free(m->spare);
    m->s = m->spare = NULL;
}

static uint64_t pmap_find_slot(const pmap *m, uint32_t key)
{
    uint64_t i = pmap_hash(m, key);
    while (m->s[i].val != 0 && m->s[i].key != key)
        i = (i + 1) & m->mask;
    return i;
}

/* Record for key, or NIL. */
static uint32_t pmap_get(const pmap *m, uint32_t key)
{
    return m->s[pmap_find_slot(m, key)].val - 1; /* empty: 0 - 1 == NIL */
}

static void pmap_put(pmap *m, uint32_t key, uint32_t val);

/* Doubles the active table into the spare array; allocates nothing. */
static void pmap_double(pmap *m)
{
    slot *old = m->s;
    uint64_t n = m->mask + 1;
    m->s = m->spare;
    m->spare = old;
    pmap_set_active(m, n * 2);
    m->count = 0;
    for (uint64_t i = 0; i < n; i++)
        if (old[i].val != 0)
            pmap_put(m, old[i].key, old[i].val - 1);
    memset(old, 0, (size_t)n * sizeof(slot));
}

/* Inserts a key that is not present. Capacity was reserved: may double the
 * active table (within the reserved arrays) but never allocates. */
static void pmap_put(pmap *m, uint32_t key, uint32_t val)
{
    if ((uint64_t)(m->count + 1) * 2 > m->mask + 1 && (m->mask + 1) * 2 <= m->cap)
        pmap_double(m);
    uint64_t i = pmap_find_slot(m, key);
    KVP_ASSERT(m->s[i].val == 0); /* not present */
    KVP_ASSERT((uint64_t)m->count + 1 <= m->mask); /* an empty slot stays */
    m->s[i].key = key;
    m->s[i].val = val + 1;
    m->count++;
}

/* Removes a key that is present; backward-shift keeps probe chains intact. */
static void pmap_del(pmap *m, uint32_t key)
{
    uint64_t i = pmap_find_slot(m, key);
    KVP_ASSERT(m->s[i].val != 0 && m->count > 0); /* present */
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->s[j].val == 0)
            break;
        uint64_t home = pmap_hash(m, m->s[j].key);
        /* entry j may move to hole i iff its home is not in (i, j] cyclically */
        if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].val = 0;
    m->count--;
}

/* Reserves arrays of `slots` slots (> m->cap); the active table is copied
 * as it is (same size, same layout). On failure m is unchanged. */
static int pmap_grow(pmap *m, uint64_t slots)
{
    pmap n;
    if (pmap_init(&n, slots) != 0)
        return KVP_ENOMEM;
    memcpy(n.s, m->s, (size_t)(m->mask + 1) * sizeof(slot));
    pmap_set_active(&n, m->mask + 1);
    n.count = m->count;
    pmap_free(m);
    *m = n;
    return 0;
}

/* ------------------------------------------------------------- free lists */

static void list_insert(kvp_segalloc *a, uint32_t b)
{
    unsigned fl, sl;
    mapping_insert(a->blk[b].len, &fl, &sl);
    uint32_t h = a->head[fl][sl];
    a->blk[b].prev = NIL;
    a->blk[b].next = h;
    if (h != NIL)
        a->blk[h].prev = b;
    a->head[fl][sl] = b;
    a->sl_bitmap[fl] |= 1u << sl;
    a->fl_bitmap |= 1u << fl;
}

static void list_remove(kvp_segalloc *a, uint32_t b)
{
    unsigned fl, sl;
    mapping_insert(a->blk[b].len, &fl, &sl);
    uint32_t p = a->blk[b].prev, n = a->blk[b].next;
    if (p != NIL)
        a->blk[p].next = n;
    else
        a->head[fl][sl] = n;
    if (n != NIL)
        a->blk[n].prev = p;
    if (a->head[fl][sl] == NIL) {
        a->sl_bitmap[fl] &= ~(1u << sl);
        if (a->sl_bitmap[fl] == 0)
            a->fl_bitmap &= ~(1u << fl);
    }
}

/* First non-empty list at class (fl, sl) or above; its head, or NIL. */
static uint32_t find_suitable(const kvp_segalloc *a, unsigned fl, unsigned sl)
{
    uint32_t sm = a->sl_bitmap[fl] & (~0u << sl);
    if (!sm) {
        uint32_t fm = fl + 1 < 32 ? a->fl_bitmap & (~0u << (fl + 1)) : 0;
        if (!fm)
            return NIL;
        fl = (unsigned)__builtin_ctz(fm);
        sm = a->sl_bitmap[fl];
    }
    return a->head[fl][(unsigned)__builtin_ctz(sm)];
}

/* ----------------------------------------------------------------- records */

/* Takes an unused record. Capacity was reserved: nfree < cap before. */
static uint32_t rec_get(kvp_segalloc *a)
{
    KVP_ASSERT(a->nfree < a->cap);
    uint32_t b = a->recycle;
    if (b != NIL)
        a->recycle = a->blk[b].next;
    else
        b = a->hwm++;
    KVP_ASSERT(b < a->cap);
    a->nfree++;
    return b;
}

static void rec_put(kvp_segalloc *a, uint32_t b)
{
    KVP_ASSERT(a->nfree > 0);
    a->blk[b].len = 0;
    a->blk[b].off = 0;
    a->blk[b].next = a->recycle;
    a->recycle = b;
    a->nfree--;
}

/* Free blocks possible with `nalloc` allocated blocks (fully coalesced). */
static uint64_t max_free_blocks(const kvp_segalloc *a, uint64_t nalloc)
{
    uint64_t bound = nalloc + 1;
    uint64_t geo = ((uint64_t)a->npages + 1) / 2; /* free blocks are >= 1 apart */
    if (geo < 1)
        geo = 1;
    return bound < geo ? bound : geo;
}

static uint64_t map_slots_for(uint64_t entries)
{
    uint64_t s = MAP_MIN;
    while (s < 2 * entries)
        s *= 2;
    return s;
}

/*
 * Makes room for `need` free-block records and map entries. Only grows
 * capacity; on failure the allocator state (blocks, lists, maps' contents) is
 * unchanged, though some capacity may already have grown.
 */
static int reserve(kvp_segalloc *a, uint64_t need)
{
    if (need > a->cap) {
        uint64_t nc = (uint64_t)a->cap * 2;
        if (nc < need)
            nc = need;
        if (nc > (uint64_t)NIL)
            nc = NIL; /* need <= 2^31, so this still covers it */
        if (nc > SIZE_MAX / sizeof(fblock))
            return KVP_ENOMEM;
        fblock *nb = kvp_realloc(a->blk, (size_t)nc * sizeof(fblock));
        if (!nb)
            return KVP_ENOMEM;
        a->blk = nb;
        a->cap = (uint32_t)nc;
    }
    uint64_t slots = map_slots_for(need);
    if (slots > a->by_start.cap && pmap_grow(&a->by_start, slots) != 0)
        return KVP_ENOMEM;
    if (slots > a->by_end.cap && pmap_grow(&a->by_end, slots) != 0)
        return KVP_ENOMEM;
    return 0;
}

/* ---------------------------------------------------------------------- API */

int kvp_segalloc_create(uint32_t npages, kvp_segalloc **out)
{
    if (!out || npages == 0)
        return KVP_EINVALID_PARAMS;
    kvp_segalloc *a = kvp_calloc(1, sizeof *a);
    if (!a)
        return KVP_ENOMEM;
    a->npages = npages;
    a->recycle = NIL;
    memset(a->head, 0xff, sizeof a->head); /* every head NIL */
    a->blk = kvp_malloc(POOL_MIN * sizeof(fblock));
    if (!a->blk || pmap_init(&a->by_start, MAP_MIN) != 0 ||
        pmap_init(&a->by_end, MAP_MIN) != 0) {
        kvp_segalloc_destroy(a);
        return KVP_ENOMEM;
    }
    a->cap = POOL_MIN;
    uint32_t b = rec_get(a);
    a->blk[b].off = 0;
    a->blk[b].len = npages;
    pmap_put(&a->by_start, 0, b);
    pmap_put(&a->by_end, npages, b);
    list_insert(a, b);
    a->free_pages = npages;
    *out = a;
    return 0;
}

void kvp_segalloc_destroy(kvp_segalloc *a)
{
    if (!a)
        return;
    kvp_free(a->blk);
    pmap_free(&a->by_start);
    pmap_free(&a->by_end);
    kvp_free(a);
}

int kvp_segalloc_alloc(kvp_segalloc *a, uint32_t n, uint32_t *off)
{
    if (!a || !off || n == 0)
        return KVP_EINVALID_PARAMS;
    if (n > a->free_pages)
        return KVP_ENO_AVAILABLE_HANDLE;

    /* (1) best fit among the first SCAN_LIMIT blocks of n's own class */
    unsigned fl, sl;
    uint32_t b = NIL, best = 0;
    mapping_insert(n, &fl, &sl);
    uint32_t c = a->head[fl][sl];
    for (int i = 0; i < SCAN_LIMIT && c != NIL; i++, c = a->blk[c].next) {
        uint32_t len = a->blk[c].len;
        if (len >= n && (b == NIL || len < best)) {
            b = c;
            best = len;
            if (len == n)
                break;
        }
    }
    /* (2) else the first block of the smallest class holding only blocks >= n */
    if (b == NIL && mapping_search(n, &fl, &sl))
        b = find_suitable(a, fl, sl);
    if (b == NIL)
        return KVP_ENO_AVAILABLE_HANDLE;

    /* what the matching frees may need, once this block is allocated */
    if (reserve(a, max_free_blocks(a, a->nalloc + 1)) != 0)
        return KVP_ENOMEM;

    fblock *f = &a->blk[b];
    KVP_ASSERT(f->len >= n && f->len <= a->free_pages);
    uint32_t start = f->off;
    list_remove(a, b);
    pmap_del(&a->by_start, start);
    if (f->len == n) {
        pmap_del(&a->by_end, start + n);
        rec_put(a, b);
    } else {
        f->off += n;
        f->len -= n;
        pmap_put(&a->by_start, f->off, b);
        list_insert(a, b);
    }
    a->free_pages -= n;
    a->nalloc++;
    *off = start;
    return 0;
}

/* The free block holding [off, off + n), or NIL. O(1) when it starts at
 * the last claim's end (ascending claims), else a walk of the records. */
static uint32_t containing(const kvp_segalloc *a, uint32_t off, uint32_t n)
{
    uint32_t b = pmap_get(&a->by_start, a->claim_end <= off ? a->claim_end : off);
    if (b == NIL || a->blk[b].off > off || a->blk[b].off + (uint64_t)a->blk[b].len < (uint64_t)off + n)
        b = NIL;
    for (uint32_t i = 0; b == NIL && i < a->hwm; i++)
        if (a->blk[i].len && a->blk[i].off <= off &&
            a->blk[i].off + (uint64_t)a->blk[i].len >= (uint64_t)off + n)
            b = i;
    return b;
}

int kvp_segalloc_claim(kvp_segalloc *a, uint32_t off, uint32_t n)
{
    if (!a || n == 0 || off >= a->npages || n > a->npages - off)
        return KVP_EINVALID_PARAMS;
    uint32_t b = containing(a, off, n);
    if (b == NIL)
        return KVP_ENO_AVAILABLE_HANDLE;
    if (reserve(a, max_free_blocks(a, a->nalloc + 1)) != 0)
        return KVP_ENOMEM;
    fblock *f = &a->blk[b];
    uint32_t start = f->off, end = f->off + f->len;
    list_remove(a, b);
    pmap_del(&a->by_start, start);
    pmap_del(&a->by_end, end);
    if (start < off) { /* the left part stays free in record b */
        f->len = off - start;
        pmap_put(&a->by_start, start, b);
        pmap_put(&a->by_end, off, b);
        list_insert(a, b);
        b = NIL;
    }
    if (off + n < end) { /* the right part: b, or a new record */
        if (b == NIL)
            b = rec_get(a);
        a->blk[b].off = off + n;
        a->blk[b].len = end - (off + n);
        pmap_put(&a->by_start, off + n, b);
        pmap_put(&a->by_end, end, b);
        list_insert(a, b);
    } else if (b != NIL) {
        rec_put(a, b);
    }
    a->free_pages -= n;
    a->nalloc++;
    a->claim_end = off + n;
    return 0;
}

void kvp_segalloc_free(kvp_segalloc *a, uint32_t off, uint32_t n)
{
    uint32_t end = off + n; /* <= npages for a range alloc returned */
    KVP_ASSERT(n > 0 && off < a->npages && n <= a->npages - off);
    KVP_ASSERT(a->nalloc > 0 && a->free_pages + n <= a->npages);
    KVP_ASSERT(pmap_get(&a->by_start, off) == NIL); /* not free already */
    uint32_t left = pmap_get(&a->by_end, off);
    uint32_t right = end < a->npages ? pmap_get(&a->by_start, end) : NIL;

    if (left != NIL && right != NIL) {
        uint32_t rend = a->blk[right].off + a->blk[right].len;
        list_remove(a, right);
        pmap_del(&a->by_start, end);
        pmap_del(&a->by_end, rend);
        uint32_t rlen = a->blk[right].len;
        rec_put(a, right);
        list_remove(a, left);
        pmap_del(&a->by_end, off);
        a->blk[left].len += n + rlen;
        pmap_put(&a->by_end, rend, left);
        list_insert(a, left);
    } else if (left != NIL) {
        list_remove(a, left);
        pmap_del(&a->by_end, off);
        a->blk[left].len += n;
        pmap_put(&a->by_end, end, left);
        list_insert(a, left);
    } else if (right != NIL) {
        list_remove(a, right);
        pmap_del(&a->by_start, end);
        a->blk[right].off = off;
        a->blk[right].len += n;
        pmap_put(&a->by_start, off, right);
        list_insert(a, right);
    } else {
        uint32_t b = rec_get(a);
        a->blk[b].off = off;
        a->blk[b].len = n;
        pmap_put(&a->by_start, off, b);
        pmap_put(&a->by_end, end, b);
        list_insert(a, b);
    }
    a->free_pages += n;
    a->nalloc--;
}

uint32_t kvp_segalloc_pages(const kvp_segalloc *a)
{
    return a->npages;
}

uint64_t kvp_segalloc_free_pages(const kvp_segalloc *a)
{
    return a->free_pages;
}

/* O(length of the highest non-empty class list). */
uint32_t kvp_segalloc_largest_free(const kvp_segalloc *a)
{
    if (!a->fl_bitmap)
        return 0;
    unsigned fl = log2_floor(a->fl_bitmap);
    unsigned sl = log2_floor(a->sl_bitmap[fl]);
    uint32_t best = 0;
    for (uint32_t c = a->head[fl][sl]; c != NIL; c = a->blk[c].next)
        if (a->blk[c].len > best)
            best = a->blk[c].len;
    return best;
}

uint32_t kvp_segalloc_free_blocks(const kvp_segalloc *a)
{
    return a->nfree;
}

/* ------------------------------------------------------------------ check */

static int cmp_u64(const void *x, const void *y)
{
    uint64_t p = *(const uint64_t *)x, q = *(const uint64_t *)y;
    return p < q ? -1 : p > q;
}

/* Every occupied slot is reachable by lookup; count matches. */
static int check_map(const kvp_segalloc *a, const pmap *m, int is_end)
{
    uint32_t cnt = 0;
    for (uint64_t i = 0; i <= m->mask; i++) {
        uint32_t v = m->s[i].val - 1;
        if (v == NIL)
            continue;
        cnt++;
        if (v >= a->hwm || a->blk[v].len == 0)
            return -1;
        uint32_t k = is_end ? a->blk[v].off + a->blk[v].len : a->blk[v].off;
        if (m->s[i].key != k || pmap_find_slot(m, k) != i)
            return -1;
    }
    if (cnt != m->count || cnt != a->nfree || 2 * (uint64_t)cnt > m->mask + 1)
        return -1;
    return 0;
}

/*
 * Walks lists, bitmaps, maps and the recycle stack. Overlap/order check:
 * sorts the free blocks in a scratch array (kvp_malloc); if that cannot be
 * had (fault injection), compares all pairs instead.
 */
int kvp_segalloc_check(const kvp_segalloc *a)
{
    if (!a || a->hwm > a->cap || a->nfree > a->hwm)
        return -1;
    uint64_t need = max_free_blocks(a, a->nalloc);
    if (a->cap < need || a->by_start.cap < 2 * need || a->by_end.cap < 2 * need ||
        (uint64_t)a->by_start.count * 2 > a->by_start.mask + 1 ||
        (uint64_t)a->by_end.count * 2 > a->by_end.mask + 1)
        return -1; /* the reservation that makes free infallible is missing */

    uint64_t *scratch = a->nfree ? kvp_malloc((size_t)a->nfree * sizeof(uint64_t)) : NULL;
    uint32_t seen = 0;
    uint64_t pages = 0;
    int rc = -1;
    for (unsigned fl = 0; fl < FL_COUNT; fl++) {
        if (((a->fl_bitmap >> fl) & 1) != (a->sl_bitmap[fl] != 0))
            goto out;
        for (unsigned sl = 0; sl < SL_COUNT; sl++) {
            uint32_t h = a->head[fl][sl];
            if (((a->sl_bitmap[fl] >> sl) & 1) != (h != NIL))
                goto out;
            uint32_t prev = NIL;
            for (uint32_t c = h; c != NIL; prev = c, c = a->blk[c].next) {
                if (c >= a->hwm || seen >= a->nfree)
                    goto out;
                const fblock *f = &a->blk[c];
                unsigned cf, cs;
                if (f->len == 0 || f->prev != prev ||
                    (uint64_t)f->off + f->len > a->npages)
                    goto out;
                mapping_insert(f->len, &cf, &cs);
                if (cf != fl || cs != sl)
                    goto out;
                if (pmap_get(&a->by_start, f->off) != c ||
                    pmap_get(&a->by_end, f->off + f->len) != c)
                    goto out;
                /* full coalescing: no free neighbour on either side */
                if (pmap_get(&a->by_end, f->off) != NIL ||
                    pmap_get(&a->by_start, f->off + f->len) != NIL)
                    goto out;
                if (scratch)
                    scratch[seen] = ((uint64_t)f->off << 32) | f->len;
                seen++;
                pages += f->len;
            }
        }
    }
    if (seen != a->nfree || pages != a->free_pages || pages > a->npages)
        goto out;
    if (check_map(a, &a->by_start, 0) || check_map(a, &a->by_end, 1))
        goto out;

    /* recycle stack: exactly hwm - nfree unused records */
    uint32_t unused = 0;
    for (uint32_t c = a->recycle; c != NIL; c = a->blk[c].next) {
        if (c >= a->hwm || a->blk[c].len != 0 || ++unused > a->hwm - a->nfree)
            goto out;
    }
    if (unused != a->hwm - a->nfree)
        goto out;

    /* no overlaps (and, again, no adjacency) */
    if (scratch) {
        qsort(scratch, seen, sizeof *scratch, cmp_u64);
        for (uint32_t i = 1; i < seen; i++) {
            uint64_t pend = (scratch[i - 1] >> 32) + (scratch[i - 1] & 0xffffffffu);
            if (pend >= (scratch[i] >> 32))
                goto out;
        }
    } else {
        for (uint32_t i = 0; i < a->hwm; i++) {
            if (a->blk[i].len == 0)
                continue;
            uint64_t s1 = a->blk[i].off, e1 = s1 + a->blk[i].len;
            for (uint32_t j = i + 1; j < a->hwm; j++) {
                if (a->blk[j].len == 0)
                    continue;
                uint64_t s2 = a->blk[j].off, e2 = s2 + a->blk[j].len;
                if (s1 <= e2 && s2 <= e1) /* overlapping or touching */
                    goto out;
            }
        }
    }
    rc = 0;
out:
    kvp_free(scratch);
    return rc;
}
