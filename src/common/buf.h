/*
 * buf.h -- bounded byte buffers: a growable writer, a bounds-checked reader
 * and a bump arena. All little-endian.
 *
 * kvp_buf: grows on demand up to `cap` bytes (a hard upper bound fixed at
 *   init); an append that would pass it, or fail to allocate, sets `err`
 *   (KVP_ETOO_LARGE / KVP_ENOMEM) and every later append is a no-op, so
 *   encoders write straight-line code and check `err` once at the end.
 * kvp_rd: reads from a borrowed byte range; a read past the end sets `err`
 *   (KVP_EPROTOCOL) and returns zeros, so decoders check once at the end.
 * kvp_arena: bump allocator for per-request scratch (decoded arrays), reset
 *   between requests, bounded by `cap`.
 */
#ifndef KVP_BUF_H
#define KVP_BUF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct kvp_buf {
    uint8_t *data;
    size_t len;   /* bytes written */
    size_t alloc; /* bytes allocated */
    size_t cap;   /* hard upper bound on len */
    int err;      /* first error, sticky */
} kvp_buf;

void kvp_buf_init(kvp_buf *b, size_t cap);
void kvp_buf_free(kvp_buf *b);
/* Drops the contents, keeps the allocation, clears err. */
static inline void kvp_buf_reset(kvp_buf *b) { b->len = 0; b->err = 0; }
/* Ensures room for n more bytes; returns 0 or the (sticky) error. */
int kvp_buf_reserve(kvp_buf *b, size_t n);
/* Removes the first n bytes (consumed output). */
void kvp_buf_consume(kvp_buf *b, size_t n);
/* Releases memory above `keep` bytes when the buffer is empty. */
void kvp_buf_shrink(kvp_buf *b, size_t keep);

void kvp_buf_put(kvp_buf *b, const void *p, size_t n);
void kvp_buf_u8(kvp_buf *b, uint8_t v);
void kvp_buf_u16(kvp_buf *b, uint16_t v);
void kvp_buf_u32(kvp_buf *b, uint32_t v);
void kvp_buf_u64(kvp_buf *b, uint64_t v);
static inline void kvp_buf_i32(kvp_buf *b, int32_t v) { kvp_buf_u32(b, (uint32_t)v); }
/* u32 length then the bytes. */
void kvp_buf_bytes(kvp_buf *b, const void *p, uint32_t n);
static inline void kvp_buf_str(kvp_buf *b, const char *s) { kvp_buf_bytes(b, s, (uint32_t)strlen(s)); }
/* Formatted text (no NUL is appended; len counts the text only). */
void kvp_buf_printf(kvp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Overwrites a u32 written earlier at offset `at` (for back-patched counts). */
void kvp_buf_patch_u32(kvp_buf *b, size_t at, uint32_t v);

/* A borrowed byte string: NOT NUL-terminated. */
typedef struct kvp_bytes {
    const uint8_t *p;
    uint32_t len;
} kvp_bytes;

typedef struct kvp_rd {
    const uint8_t *p;
    size_t len;
    size_t off;
    int err;
} kvp_rd;

static inline void kvp_rd_init(kvp_rd *r, const void *p, size_t len)
{
    r->p = (const uint8_t *)p;
    r->len = len;
    r->off = 0;
    r->err = 0;
}
static inline size_t kvp_rd_left(const kvp_rd *r) { return r->err ? 0 : r->len - r->off; }
uint8_t kvp_rd_u8(kvp_rd *r);
uint16_t kvp_rd_u16(kvp_rd *r);
uint32_t kvp_rd_u32(kvp_rd *r);
uint64_t kvp_rd_u64(kvp_rd *r);
static inline int32_t kvp_rd_i32(kvp_rd *r) { return (int32_t)kvp_rd_u32(r); }
/* u32 length then bytes; the result borrows from the reader's range.
 * A length above max_len is an error (KVP_EPROTOCOL). */
kvp_bytes kvp_rd_bytes(kvp_rd *r, uint32_t max_len);
/* Raw n bytes (no length prefix); NULL and err on short input. */
const uint8_t *kvp_rd_raw(kvp_rd *r, size_t n);
/* A u32 element count, checked against `max` and against the bytes left
 * (each element needs at least min_elem_size bytes) so a hostile count
 * cannot make the decoder allocate more than the frame justifies. */
uint32_t kvp_rd_count(kvp_rd *r, uint32_t max, size_t min_elem_size);
/* 0 if everything was read and no error occurred, else KVP_EPROTOCOL. */
int kvp_rd_finish(const kvp_rd *r);

typedef struct kvp_arena {
    uint8_t *data;
    size_t used;
    size_t alloc;
    size_t cap;
    struct kvp_arena_big *big; /* allocations that did not fit `data` */
} kvp_arena;

void kvp_arena_init(kvp_arena *a, size_t cap);
/* Frees everything allocated since init/reset; keeps one block for reuse. */
void kvp_arena_reset(kvp_arena *a);
void kvp_arena_free(kvp_arena *a);
/* 16-byte aligned; NULL when over `cap` in total or out of memory. */
void *kvp_arena_alloc(kvp_arena *a, size_t n);

#endif
