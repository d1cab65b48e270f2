/*
 * fuzz_kvev.c -- the KV-event publisher's pure parts (src/master/kvev.c):
 * the replay request parser, as any client of the ROUTER could send, and
 * the vLLM batch encoder, over events made from the input.
 *
 * Input: byte 0 picks the target (even: parser, odd: encoder).
 *
 * Parser: the rest is frames, each a u16 little-endian length then that
 * many bytes (cut short at the end of the input), 8 at most; each frame is
 * copied into an allocation of exactly its size, so ASan sees any read past
 * it. Invariants (abort on violation):
 *  - kvp_kvpub_parse_replay answers 0 or KVP_EPROTOCOL only;
 *  - 0 exactly when the frames are (id of 1..255 bytes, "", [topic of at
 *    most KVP_KVPUB_MAX_TOPIC bytes,] 8 bytes), read independently here;
 *  - then the topic is frames[2] itself (4 frames) or "default" (3), and
 *    the seq is the last frame read big-endian.
 *
 * Encoder: byte 1 sizes the output buffer (bit 7 set: (byte & 0x7f) * 8
 * bytes, so encodings that do not fit are tried; else 1 MiB), bytes 2..9
 * are ts (any double, NaN included), then 6 bytes per event:
 *   b0 type: 0xff = 0 (invalid), else 1 + b0 % 3;  b1 medium: 0xff = 2
 *   (invalid), else b1 & 1;  b2 group: b2 & 3;  b3 flags: bit 0 has_parent,
 *   bit 1 parent = the previous event's hash (else b4), bit 2 block_size 32
 *   (else 16);  hash = b4 | b5 << 56 (so chains and hashes above INT64_MAX
 *   are frequent).
 * Invariants:
 *  - kvp_kvev_encode answers 0, KVP_EINVALID_PARAMS exactly when an event
 *    is invalid (buffer untouched), or KVP_ETOO_LARGE with the length back;
 *  - 0: the bytes are one msgpack value, nothing after it, decoded with
 *    msgpack-c: [float64 ts (bit for bit), [event...]], and walking the
 *    events gives back the input in order: each BlockStored / BlockRemoved /
 *    AllBlocksCleared with exactly kvev.h's keys and values, each run
 *    obeying the merging rules and maximal (the next input event would not
 *    have joined it).
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "kvpool.h"
#include "master/kvev.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXF 8

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void fuzz_parse(const uint8_t *data, size_t size)
{
    kvp_bytes f[MAXF];
    uint8_t *mem[MAXF];
    size_t n = 0;
    while (size >= 2 && n < MAXF) {
        size_t len = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        mem[n] = malloc(len ? len : 1);
        memcpy(mem[n], data, len);
        f[n] = (kvp_bytes){len ? mem[n] : NULL, (uint32_t)len};
        n++;
        data += len;
        size -= len;
    }
    kvp_bytes topic = {NULL, 0};
    uint64_t seq = 0;
    int rc = kvp_kvpub_parse_replay(f, n, &topic, &seq);
    int want = (n == 3 || n == 4) && f[0].len >= 1 && f[0].len <= 255 && f[1].len == 0 &&
               f[n - 1].len == 8 && (n == 3 || f[2].len <= KVP_KVPUB_MAX_TOPIC);
    if (rc != 0 && rc != KVP_EPROTOCOL)
        abort();
    if ((rc == 0) != want)
        abort();
    if (rc == 0) {
        if (n == 4 && (topic.p != f[2].p || topic.len != f[2].len))
            abort();
        if (n == 3 && (topic.len != 7 || memcmp(topic.p, "default", 7) != 0))
            abort();
        if (seq != be64(f[n - 1].p))
            abort();
    }
    for (size_t i = 0; i < n; i++)
        free(mem[i]);
}

static int str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static int uint_is(const msgpack_object *o, uint64_t v)
{
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == v;
}

static const char *medium(const kvp_kvev *e) { return e->medium ? "kvpool-disk" : "kvpool-dram"; }

/* Whether ev[i] joins the vLLM event whose previous input event is ev[i-1]
 * and whose first is ev[first] (kvev.h's rules, written out anew). */
static int joins(const kvp_kvev *ev, size_t first, size_t i)
{
    const kvp_kvev *a = &ev[first], *b = &ev[i];
    if (a->type != b->type || a->medium != b->medium || a->group != b->group)
        return 0;
    if (a->type == KVP_KVEV_REMOVED)
        return 1;
    return a->type == KVP_KVEV_STORED && a->block_size == b->block_size && b->has_parent &&
           b->parent == ev[i - 1].hash;
}

/* Checks decoded event o against the run of ev starting at *i; advances *i. */
static void check_event(const msgpack_object *o, const kvp_kvev *ev, size_t n, size_t *i)
{
    if (o->type != MSGPACK_OBJECT_MAP || *i >= n)
        abort();
    const msgpack_object_kv *kv = o->via.map.ptr;
    const kvp_kvev *e = &ev[*i];
    uint32_t nkv = o->via.map.size;
    if (nkv < 1 || !str_is(&kv[0].key, "type"))
        abort();
    if (e->type == KVP_KVEV_CLEARED) {
        if (nkv != 1 || !str_is(&kv[0].val, "AllBlocksCleared"))
            abort();
        (*i)++;
        return;
    }
    int st = e->type == KVP_KVEV_STORED;
    if (nkv != (st ? 10u : 5u) || !str_is(&kv[0].val, st ? "BlockStored" : "BlockRemoved") ||
        !str_is(&kv[1].key, "block_hashes") || kv[1].val.type != MSGPACK_OBJECT_ARRAY)
        abort();
    const msgpack_object_array *h = &kv[1].val.via.array;
    size_t first = *i;
    if (h->size == 0 || first + h->size > n)
        abort();
    for (uint32_t k = 0; k < h->size; k++)
        if ((k && !joins(ev, first, first + k)) || !uint_is(&h->ptr[k], ev[first + k].hash))
            abort();
    *i = first + h->size;
    if (*i < n && joins(ev, first, *i)) /* the run is maximal */
        abort();
    const msgpack_object_kv *rest = kv + 2;
    if (st) {
        if (!str_is(&rest[0].key, "parent_block_hash") ||
            !(e->has_parent ? uint_is(&rest[0].val, e->parent)
                            : rest[0].val.type == MSGPACK_OBJECT_NIL) ||
            !str_is(&rest[1].key, "token_ids") || rest[1].val.type != MSGPACK_OBJECT_ARRAY ||
            rest[1].val.via.array.size != 0 || !str_is(&rest[2].key, "block_size") ||
            !uint_is(&rest[2].val, e->block_size) || !str_is(&rest[3].key, "lora_id") ||
            rest[3].val.type != MSGPACK_OBJECT_NIL)
            abort();
        rest += 4;
    }
    if (!str_is(&rest[0].key, "medium") || !str_is(&rest[0].val, medium(e)))
        abort();
    if (st) {
        if (!str_is(&rest[1].key, "lora_name") || rest[1].val.type != MSGPACK_OBJECT_NIL)
            abort();
        rest++;
    }
    if (!str_is(&rest[1].key, "group_idx") || !uint_is(&rest[1].val, e->group) ||
        !str_is(&rest[2].key, "locality") || !str_is(&rest[2].val, "REMOTE"))
        abort();
}

static void fuzz_encode(const uint8_t *data, size_t size)
{
    if (size < 9)
        return;
    size_t cap = data[0] & 0x80 ? (size_t)(data[0] & 0x7f) * 8 : (size_t)1 << 20;
    double ts;
    memcpy(&ts, data + 1, 8);
    data += 9;
    size -= 9;
    size_t n = size / 6;
    kvp_kvev *ev = malloc((n ? n : 1) * sizeof *ev);
    int invalid = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = data + 6 * i;
        kvp_kvev *e = &ev[i];
        *e = (kvp_kvev){0};
        e->type = b[0] == 0xff ? 0 : (uint8_t)(1 + b[0] % 3);
        e->medium = b[1] == 0xff ? 2 : (uint8_t)(b[1] & 1);
        e->group = b[2] & 3;
        e->has_parent = b[3] & 1;
        e->parent = (b[3] & 2) && i ? ev[i - 1].hash : b[4];
        e->block_size = b[3] & 4 ? 32 : 16;
        e->hash = b[4] | (uint64_t)b[5] << 56;
        invalid |= e->type == 0 || (e->type != KVP_KVEV_CLEARED && e->medium > KVP_KVEV_DISK);
    }
    kvp_buf out;
    kvp_buf_init(&out, cap);
    kvp_buf_put(&out, "#", cap ? 1 : 0); /* something before: the encoder appends */
    size_t before = out.len;
    int rc = kvp_kvev_encode(&out, ts, ev, n);
    if (rc == KVP_EINVALID_PARAMS) {
        if (!invalid || out.len != before || out.err)
            abort();
    } else if (rc == KVP_ETOO_LARGE) {
        if (invalid || out.len != before || out.err != KVP_ETOO_LARGE)
            abort();
    } else if (rc != 0 || invalid) {
        abort();
    } else {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        const char *p = (const char *)out.data + before;
        size_t len = out.len - before;
        if (msgpack_unpack_next(&u, p, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
            abort();
        const msgpack_object *o = &u.data;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3)
            abort();
        const msgpack_object *t = &o->via.array.ptr[0], *evs = &o->via.array.ptr[1];
        if (t->type != MSGPACK_OBJECT_FLOAT64 || memcmp(&t->via.f64, &ts, 8) != 0 ||
            evs->type != MSGPACK_OBJECT_ARRAY)
            abort();
        size_t i = 0;
        for (uint32_t k = 0; k < evs->via.array.size; k++)
            check_event(&evs->via.array.ptr[k], ev, n, &i);
        if (i != n)
            abort();
        msgpack_unpacked_destroy(&u);
    }
    kvp_buf_free(&out);
    free(ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        fuzz_encode(data + 1, size - 1);
    else
        fuzz_parse(data + 1, size - 1);
    return 0;
}
