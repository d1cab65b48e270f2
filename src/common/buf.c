/* buf.c -- bounded writer, checked reader, bump arena. */
#include "common/buf.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/assert.h"
#include "common/mem.h"
#include "kvpool.h"

void kvp_buf_init(kvp_buf *b, size_t cap)
{
    b->data = NULL;
    b->len = b->alloc = 0;
    b->cap = cap;
    b->err = 0;
}

void kvp_buf_free(kvp_buf *b)
{
    kvp_free(b->data);
    b->data = NULL;
    b->len = b->alloc = 0;
}

int kvp_buf_reserve(kvp_buf *b, size_t n)
{
    if (b->err)
        return b->err;
    KVP_ASSERT(b->len <= b->alloc && b->alloc <= b->cap);
    if (n > b->cap || b->len > b->cap - n)
        return b->err = KVP_ETOO_LARGE;
    size_t need = b->len + n;
    if (need <= b->alloc)
        return 0;
    size_t na = b->alloc ? b->alloc : 256;
    while (na < need)
        na = na > SIZE_MAX / 2 ? need : na * 2;
    if (na > b->cap)
        na = b->cap;
    uint8_t *d = kvp_realloc(b->data, na);
    if (!d)
        return b->err = KVP_ENOMEM;
    b->data = d;
    b->alloc = na;
    return 0;
}

void kvp_buf_consume(kvp_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void kvp_buf_shrink(kvp_buf *b, size_t keep)
{
    if (b->len == 0 && b->alloc > keep) {
        kvp_free(b->data);
        b->data = NULL;
        b->alloc = 0;
    }
}

void kvp_buf_put(kvp_buf *b, const void *p, size_t n)
{
    if (n == 0 || kvp_buf_reserve(b, n))
        return;
    KVP_ASSERT(b->len + n <= b->alloc);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void kvp_buf_printf(kvp_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        kvp_buf_put(b, small, (size_t)n);
        return;
    }
    /* room for the text and vsnprintf's NUL, which len does not count */
    if (kvp_buf_reserve(b, (size_t)n + 1))
        return;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void kvp_buf_u8(kvp_buf *b, uint8_t v) { kvp_buf_put(b, &v, 1); }

void kvp_buf_u16(kvp_buf *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    kvp_buf_put(b, x, 2);
}

void kvp_buf_u32(kvp_buf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    kvp_buf_put(b, x, 4);
}

void kvp_buf_u64(kvp_buf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    kvp_buf_put(b, x, 8);
}

void kvp_buf_bytes(kvp_buf *b, const void *p, uint32_t n)
{
    kvp_buf_u32(b, n);
    kvp_buf_put(b, p, n);
}

void kvp_buf_patch_u32(kvp_buf *b, size_t at, uint32_t v)
{
    /* without an error every append landed, so what was written is there */
    if (b->err || KVP_NEVER(at + 4 > b->len))
        return;
    for (int i = 0; i < 4; i++)
        b->data[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

/* ---- reader ---- */

const uint8_t *kvp_rd_raw(kvp_rd *r, size_t n)
{
    KVP_ASSERT(r->off <= r->len); /* a reader never passes its end */
    if (r->err || n > r->len - r->off) {
        r->err = KVP_EPROTOCOL;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

uint8_t kvp_rd_u8(kvp_rd *r)
{
    const uint8_t *p = kvp_rd_raw(r, 1);
    return p ? p[0] : 0;
}

uint16_t kvp_rd_u16(kvp_rd *r)
{
    const uint8_t *p = kvp_rd_raw(r, 2);
    return p ? (uint16_t)(p[0] | (p[1] << 8)) : 0;
}

uint32_t kvp_rd_u32(kvp_rd *r)
{
    const uint8_t *p = kvp_rd_raw(r, 4);
    if (!p)
        return 0;
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t kvp_rd_u64(kvp_rd *r)
{
    const uint8_t *p = kvp_rd_raw(r, 8);
    if (!p)
        return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

kvp_bytes kvp_rd_bytes(kvp_rd *r, uint32_t max_len)
{
    kvp_bytes b = {NULL, 0};
    uint32_t n = kvp_rd_u32(r);
    if (r->err)
        return b;
    if (n > max_len) {
        r->err = KVP_EPROTOCOL;
        return b;
    }
    const uint8_t *p = kvp_rd_raw(r, n);
    if (p) {
        b.p = p;
        b.len = n;
    }
    return b;
}

uint32_t kvp_rd_count(kvp_rd *r, uint32_t max, size_t min_elem_size)
{
    uint32_t n = kvp_rd_u32(r);
    if (r->err)
        return 0;
    KVP_ASSERT(r->off <= r->len);
    if (n > max || (min_elem_size && (size_t)n > (r->len - r->off) / min_elem_size)) {
        r->err = KVP_EPROTOCOL;
        return 0;
    }
    return n;
}

int kvp_rd_finish(const kvp_rd *r)
{
    if (r->err || r->off != r->len)
        return KVP_EPROTOCOL;
    return 0;
}

/* ---- arena ---- */

struct kvp_arena_big {
    struct kvp_arena_big *next;
    size_t size;
    uint8_t mem[] __attribute__((aligned(16)));
};

void kvp_arena_init(kvp_arena *a, size_t cap)
{
    memset(a, 0, sizeof *a);
    a->cap = cap;
}

static size_t arena_big_total(const kvp_arena *a)
{
    size_t t = 0;
    for (struct kvp_arena_big *b = a->big; b; b = b->next)
        t += b->size;
    return t;
}

void kvp_arena_reset(kvp_arena *a)
{
    /* Grow the main block to cover what overflowed, so the next request of
     * the same shape makes no extra allocation. */
    size_t want = a->used + arena_big_total(a);
    while (a->big) {
        struct kvp_arena_big *n = a->big->next;
        kvp_free(a->big);
        a->big = n;
    }
    if (want > a->alloc && want <= a->cap) {
        uint8_t *d = kvp_malloc(want);
        if (d) {
            kvp_free(a->data);
            a->data = d;
            a->alloc = want;
        }
    }
    a->used = 0;
}

void kvp_arena_free(kvp_arena *a)
{
    kvp_arena_reset(a);
    kvp_free(a->data);
    a->data = NULL;
    a->alloc = 0;
}

void *kvp_arena_alloc(kvp_arena *a, size_t n)
{
    /* Refuse before rounding: n near SIZE_MAX would round up to 0 and get a
     * 16-byte block. used <= alloc, and used + big counts memory that really
     * exists, so neither expression below can wrap. */
    if (n > a->cap || n > SIZE_MAX - 15)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    KVP_ASSERT(a->used <= a->alloc);
    if (n <= a->alloc - a->used) {
        void *p = a->data + a->used;
        a->used += n;
        return p;
    }
    size_t have = a->used + arena_big_total(a);
    if (have > a->cap || n > a->cap - have)
        return NULL;
    struct kvp_arena_big *b = kvp_malloc(sizeof *b + n);
    if (!b)
        return NULL;
    b->size = n;
    b->next = a->big;
    a->big = b;
    return b->mem;
}
