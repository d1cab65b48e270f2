/*
 * test_blockhash.c -- SHA-256 (FIPS 180-4 vectors), canonical CBOR (bytes
 * checked against cbor2), XXH3-128 digest byte order, and vLLM block-hash
 * chains against tests/vectors/block_hashes.txt (written by
 * tests/vectors/gen_block_hashes.py with cbor2 + hashlib + xxhash).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "connector/blockhash.h"
#include "harness.h"
#include "kvpool.h"

static int unhex(const char *s, uint8_t *out, size_t cap, size_t *n)
{
    size_t len = strlen(s);
    if (len % 2 || len / 2 > cap)
        return -1;
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    *n = len / 2;
    return 0;
}

static void tohex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
    out[2 * n] = '\0';
}

static int sha_is(const void *data, size_t n, const char *want)
{
    uint8_t d[32];
    char hex[65];
    kvp_bh_sha256(data, n, d);
    tohex(d, 32, hex);
    if (strcmp(hex, want) != 0) {
        fprintf(stderr, "sha256 got %s want %s\n", hex, want);
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- SHA-256 */

TEST(sha256_fips_vectors)
{
    CHECK(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    CHECK(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK_EQ(strlen(m448), 56);
    CHECK(sha_is(m448, 56, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    CHECK(sha_is(m896, 112, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"));
    char *mil = malloc(1000000);
    CHECK(mil != NULL);
    memset(mil, 'a', 1000000);
    int ok = sha_is(mil, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(mil);
    CHECK(ok);
}

TEST(sha256_streaming_any_split)
{
    /* 1,000,000 x 'a' fed in uneven pieces; and every split of a 130-byte message */
    static char a[997];
    memset(a, 'a', sizeof a);
    struct kvp_bh_sha256 c;
    kvp_bh_sha256_init(&c);
    size_t left = 1000000, step = 1;
    while (left) {
        size_t n = step < left ? step : left;
        kvp_bh_sha256_update(&c, a, n);
        left -= n;
        step = step % 900 + 13; /* 13..912 < sizeof a */
    }
    uint8_t d[32], ref[32];
    char hex[65];
    kvp_bh_sha256_final(&c, d);
    tohex(d, 32, hex);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
    uint8_t msg[130];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 31 + 7);
    kvp_bh_sha256(msg, sizeof msg, ref);
    for (size_t split = 0; split <= sizeof msg; split++) {
        kvp_bh_sha256_init(&c);
        kvp_bh_sha256_update(&c, msg, split);
        kvp_bh_sha256_update(&c, msg + split, sizeof msg - split);
        kvp_bh_sha256_final(&c, d);
        CHECK(memcmp(d, ref, 32) == 0);
    }
    /* padding edge cases: 55, 56, 63, 64 bytes (one vs two final blocks) */
    CHECK(sha_is(a, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"));
    CHECK(sha_is(a, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"));
    CHECK(sha_is(a, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"));
}

/* ---------------------------------------------------------------- CBOR */

static int enc_is(struct kvp_bh_cbor *c, uint8_t *buf, const char *want)
{
    char hex[512];
    if (kvp_bh_cbor_finish(c) != 0 || kvp_bh_cbor_len(c) * 2 >= sizeof hex)
        return 0;
    tohex(buf, kvp_bh_cbor_len(c), hex);
    if (strcmp(hex, want) != 0) {
        fprintf(stderr, "cbor got  %s\n     want %s\n", hex, want);
        return 0;
    }
    return 1;
}

TEST(cbor_integers_shortest_form)
{
    /* expected bytes from cbor2.dumps([...], canonical=True) */
    uint8_t buf[256];
    struct kvp_bh_cbor c;
    kvp_bh_cbor_init_buf(&c, buf, sizeof buf);
    static const int64_t v[] = {0,          23,          24,  255,  256,  65535,    65536,
                                4294967295, 4294967296LL, -1, -24,  -25,  -256,     -257,
                                INT64_MIN};
    size_t nv = sizeof v / sizeof v[0];
    kvp_bh_cbor_array(&c, nv + 1);
    for (size_t i = 0; i < nv; i++)
        kvp_bh_cbor_int(&c, v[i]);
    kvp_bh_cbor_uint(&c, UINT64_MAX);
    CHECK(enc_is(&c, buf,
                 "900017181818ff19010019ffff1a000100001affffffff1b0000000100000000203738"
                 "1838ff3901003b7fffffffffffffff1bffffffffffffffff"));
}

TEST(cbor_strings_arrays_null)
{
    uint8_t buf[256];
    struct kvp_bh_cbor c;
    kvp_bh_cbor_init_buf(&c, buf, sizeof buf);
    /* ['', 'a', b'', b'\x01\x02', None, ('x', 3), 'é'*12] */
    kvp_bh_cbor_array(&c, 7);
    kvp_bh_cbor_text(&c, "", 0);
    kvp_bh_cbor_text(&c, "a", 1);
    kvp_bh_cbor_bytes(&c, NULL, 0);
    kvp_bh_cbor_bytes(&c, "\x01\x02", 2);
    kvp_bh_cbor_null(&c);
    kvp_bh_cbor_array(&c, 2);
    kvp_bh_cbor_text(&c, "x", 1);
    kvp_bh_cbor_int(&c, 3);
    char e12[25] = "";
    for (int i = 0; i < 12; i++)
        strcat(e12, "\xc3\xa9");
    kvp_bh_cbor_text(&c, e12, 24);
    CHECK(enc_is(&c, buf, "8760616140420102f6826178037818c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9"));
}

TEST(cbor_buffer_overflow_reports_needed_size)
{
    uint8_t buf[4];
    struct kvp_bh_cbor c;
    kvp_bh_cbor_init_buf(&c, buf, sizeof buf);
    kvp_bh_cbor_text(&c, "hello world", 11);
    CHECK_EQ(kvp_bh_cbor_finish(&c), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(kvp_bh_cbor_len(&c), 12);
    CHECK(memcmp(buf, "\x6bhel", 4) == 0);
    /* measuring mode: NULL buffer */
    kvp_bh_cbor_init_buf(&c, NULL, 100);
    kvp_bh_cbor_uint(&c, 1000);
    CHECK_EQ(kvp_bh_cbor_len(&c), 3);
    CHECK_EQ(kvp_bh_cbor_finish(&c), KVP_EBUFFER_OVERFLOW);
}

struct collect {
    uint8_t b[2048];
    size_t n, calls;
};
static void collect_sink(void *arg, const void *p, size_t n)
{
    struct collect *cl = arg;
    memcpy(cl->b + cl->n, p, n);
    cl->n += n;
    cl->calls++;
}

TEST(cbor_sink_mode_same_bytes)
{
    /* a large payload (> staging area) and many small items: same bytes either way */
    static uint8_t big[1000], ref[2048];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)i;
    struct collect cl = {.n = 0};
    struct kvp_bh_cbor s, b;
    kvp_bh_cbor_init_sink(&s, collect_sink, &cl);
    kvp_bh_cbor_init_buf(&b, ref, sizeof ref);
    for (int pass = 0; pass < 2; pass++) {
        struct kvp_bh_cbor *c = pass ? &b : &s;
        kvp_bh_cbor_array(c, 3);
        for (int i = 0; i < 100; i++)
            kvp_bh_cbor_int(c, i * 1000);
        kvp_bh_cbor_bytes(c, big, sizeof big);
        kvp_bh_cbor_text(c, "tail", 4);
    }
    CHECK_EQ(kvp_bh_cbor_finish(&s), 0);
    CHECK_EQ(kvp_bh_cbor_finish(&b), 0);
    CHECK_EQ(cl.n, kvp_bh_cbor_len(&b));
    CHECK_EQ(kvp_bh_cbor_len(&s), kvp_bh_cbor_len(&b));
    CHECK(memcmp(cl.b, ref, cl.n) == 0);
    CHECK(cl.calls < 10);
}

/* ---------------------------------------------------------------- algos */

TEST(algo_names_and_pickle_variants_rejected)
{
    enum kvp_bh_algo a;
    CHECK_EQ(kvp_bh_algo_parse("sha256_cbor", &a), 0);
    CHECK_EQ(a, KVP_BH_SHA256_CBOR);
    CHECK_EQ(kvp_bh_algo_parse("xxhash_cbor", &a), 0);
    CHECK_EQ(a, KVP_BH_XXHASH_CBOR);
    CHECK_EQ(kvp_bh_algo_parse("sha256", &a), KVP_ENOT_SUPPORTED);
    CHECK_EQ(kvp_bh_algo_parse("xxhash", &a), KVP_ENOT_SUPPORTED);
    CHECK_EQ(kvp_bh_algo_parse("sha256_msgpack", &a), KVP_ENOT_SUPPORTED);
    CHECK_EQ(kvp_bh_algo_parse("md5", &a), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_bh_algo_parse(NULL, &a), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_bh_hash_len(KVP_BH_SHA256_CBOR), 32);
    CHECK_EQ(kvp_bh_hash_len(KVP_BH_XXHASH_CBOR), 16);
    CHECK_EQ(kvp_bh_hash_len((enum kvp_bh_algo)9), 0);
    CHECK(strcmp(kvp_bh_algo_name(KVP_BH_XXHASH_CBOR), "xxhash_cbor") == 0);
}

TEST(none_hash_seeded_and_random)
{
    struct kvp_bh_hash h, h2;
    char hex[65];
    /* sha256(cbor2.dumps("0")) = sha256(b"\x61\x30") */
    uint8_t want[32];
    kvp_bh_sha256("\x61\x30", 2, want);
    CHECK_EQ(kvp_bh_none_hash(KVP_BH_SHA256_CBOR, "0", &h), 0);
    CHECK_EQ(h.len, 32);
    CHECK(memcmp(h.b, want, 32) == 0);
    CHECK_EQ(kvp_bh_none_hash(KVP_BH_XXHASH_CBOR, "12345", &h), 0);
    CHECK_EQ(h.len, 16);
    /* random: 32 bytes for every algo, different each call */
    CHECK_EQ(kvp_bh_none_hash(KVP_BH_XXHASH_CBOR, NULL, &h), 0);
    CHECK_EQ(kvp_bh_none_hash(KVP_BH_XXHASH_CBOR, NULL, &h2), 0);
    CHECK_EQ(h.len, 32);
    CHECK(memcmp(h.b, h2.b, 32) != 0);
    CHECK(strlen(kvp_bh_hex(&h, hex, sizeof hex)) == 64);
    CHECK_EQ(kvp_bh_none_hash((enum kvp_bh_algo)0, "0", &h), KVP_EINVALID_PARAMS);
}

TEST(block_digest_byte_order)
{
    /* [b"\xab", [7], None] encodes as 83 41 ab 81 07 f6; Python:
     * xxhash.xxh3_128(b"\x83\x41\xab\x81\x07\xf6").hexdigest() (the
     * big-endian canonical form, as .digest()) and hashlib.sha256(...). */
    struct kvp_bh_hash parent = {.len = 1, .b = {0xAB}}, out;
    int64_t tok = 7;
    char hex[65];
    CHECK_EQ(kvp_bh_hash_block(KVP_BH_XXHASH_CBOR, &parent, &tok, 1, NULL, 0, &out), 0);
    CHECK_EQ(out.len, 16);
    CHECK(strcmp(kvp_bh_hex(&out, hex, sizeof hex), "87988cb1ed842d49fd6182088a10f9f6") == 0);
    uint8_t want[32];
    kvp_bh_sha256("\x83\x41\xab\x81\x07\xf6", 6, want);
    CHECK_EQ(kvp_bh_hash_block(KVP_BH_SHA256_CBOR, &parent, &tok, 1, NULL, 0, &out), 0);
    CHECK_EQ(out.len, 32);
    CHECK(memcmp(out.b, want, 32) == 0);
    /* kvp_bh_hex truncates to the buffer, always terminated */
    CHECK_EQ(strlen(kvp_bh_hex(&out, hex, 5)), 4);
}

/* ---------------------------------------------------------------- vectors */

#define MAX_BLOCKS 64
#define MAX_ITEMS 8

struct vkey_store {
    struct kvp_bh_key k[MAX_ITEMS];
    uint8_t data[MAX_ITEMS][64];
    size_t n;
};

struct vcase {
    char name[128];
    enum kvp_bh_algo algo;
    char seed[32];
    int has_seed;
    struct kvp_bh_hash none;
    size_t bs;
    int64_t *tok;
    size_t ntok;
    struct vkey_store extra[MAX_BLOCKS];
    uint8_t cbor0[4096];
    size_t ncbor0;
    struct kvp_bh_hash want[MAX_BLOCKS];
    size_t nwant;
};

static int parse_item(const char *it, struct vkey_store *ks)
{
    REQUIRE(ks->n < MAX_ITEMS);
    struct kvp_bh_key *k = &ks->k[ks->n];
    uint8_t *d = ks->data[ks->n];
    size_t n = 0;
    char tmp[160];
    REQUIRE(strlen(it) < sizeof tmp);
    strcpy(tmp, it);
    if (tmp[0] == 'i') {
        k->kind = KVP_BH_KEY_INT;
        k->num = strtoll(tmp + 2, NULL, 10);
    } else if (tmp[0] == 'm') {
        char *colon = strchr(tmp + 2, ':');
        REQUIRE(colon);
        *colon = '\0';
        REQUIRE(unhex(tmp + 2, d, 64, &n) == 0);
        k->kind = KVP_BH_KEY_MM;
        k->num = strtoll(colon + 1, NULL, 10);
    } else {
        REQUIRE(tmp[0] == 's' || tmp[0] == 'b');
        REQUIRE(unhex(tmp + 2, d, 64, &n) == 0);
        k->kind = tmp[0] == 's' ? KVP_BH_KEY_TEXT : KVP_BH_KEY_BYTES;
    }
    k->data = d;
    k->len = n;
    ks->n++;
    return 0;
}

static int parse_line(struct vcase *vc, char *line)
{
    char *sp = strchr(line, ' ');
    REQUIRE(sp);
    *sp = '\0';
    char *v = sp + 1;
    size_t n;
    if (strcmp(line, "algo") == 0) {
        REQUIRE(kvp_bh_algo_parse(v, &vc->algo) == 0);
    } else if (strcmp(line, "seed") == 0) {
        vc->has_seed = strcmp(v, "-") != 0;
        REQUIRE(strlen(v) < sizeof vc->seed);
        strcpy(vc->seed, v);
    } else if (strcmp(line, "none") == 0) {
        REQUIRE(unhex(v, vc->none.b, KVP_BH_MAX_LEN, &n) == 0);
        vc->none.len = (uint8_t)n;
    } else if (strcmp(line, "bs") == 0) {
        vc->bs = strtoul(v, NULL, 10);
    } else if (strcmp(line, "tokens") == 0) {
        if (strcmp(v, "-") == 0)
            return 0;
        size_t cap = strlen(v) / 2 + 1;
        vc->tok = malloc(cap * sizeof *vc->tok);
        REQUIRE(vc->tok);
        for (char *s = strtok(v, " "); s; s = strtok(NULL, " ")) {
            REQUIRE(vc->ntok < cap);
            vc->tok[vc->ntok++] = strtoll(s, NULL, 10);
        }
    } else if (strcmp(line, "extra") == 0) {
        char *save = NULL;
        size_t idx = strtoul(strtok_r(v, " ", &save), NULL, 10);
        REQUIRE(idx < MAX_BLOCKS);
        for (char *s = strtok_r(NULL, " ", &save); s; s = strtok_r(NULL, " ", &save))
            REQUIRE(parse_item(s, &vc->extra[idx]) == 0);
    } else if (strcmp(line, "cbor0") == 0) {
        REQUIRE(unhex(v, vc->cbor0, sizeof vc->cbor0, &vc->ncbor0) == 0);
    } else if (strcmp(line, "hash") == 0) {
        REQUIRE(vc->nwant < MAX_BLOCKS);
        REQUIRE(unhex(v, vc->want[vc->nwant].b, KVP_BH_MAX_LEN, &n) == 0);
        vc->want[vc->nwant++].len = (uint8_t)n;
    } else {
        REQUIRE(!"unknown line");
    }
    return 0;
}

static int vextra(void *arg, size_t idx, size_t start, size_t end,
                  const struct kvp_bh_key **keys, size_t *nkeys)
{
    struct vcase *vc = arg;
    if (idx >= MAX_BLOCKS || start != idx * vc->bs || end != start + vc->bs)
        return KVP_EINTERNAL_ERROR;
    *keys = vc->extra[idx].k;
    *nkeys = vc->extra[idx].n;
    return 0;
}

static int same(const struct kvp_bh_hash *a, const struct kvp_bh_hash *b)
{
    return a->len == b->len && memcmp(a->b, b->b, a->len) == 0;
}

/* Everything one vector case must satisfy; returns 0 or -1 (after th_fail). */
static int check_case(struct vcase *vc)
{
    struct kvp_bh_hash h;
    if (vc->has_seed) {
        REQUIRE(kvp_bh_none_hash(vc->algo, vc->seed, &h) == 0);
        REQUIRE(same(&h, &vc->none));
    }
    REQUIRE(vc->nwant == vc->ntok / vc->bs);
    /* CBOR of block 0, encoded by hand with the public encoder */
    if (vc->nwant) {
        static uint8_t buf[4096];
        struct kvp_bh_cbor c;
        kvp_bh_cbor_init_buf(&c, buf, sizeof buf);
        kvp_bh_cbor_array(&c, 3);
        kvp_bh_cbor_bytes(&c, vc->none.b, vc->none.len);
        kvp_bh_cbor_array(&c, vc->bs);
        for (size_t i = 0; i < vc->bs; i++)
            kvp_bh_cbor_int(&c, vc->tok[i]);
        if (vc->extra[0].n == 0) {
            kvp_bh_cbor_null(&c);
        } else {
            kvp_bh_cbor_array(&c, vc->extra[0].n);
            for (size_t i = 0; i < vc->extra[0].n; i++) {
                const struct kvp_bh_key *k = &vc->extra[0].k[i];
                if (k->kind == KVP_BH_KEY_TEXT)
                    kvp_bh_cbor_text(&c, k->data, k->len);
                else if (k->kind == KVP_BH_KEY_BYTES)
                    kvp_bh_cbor_bytes(&c, k->data, k->len);
                else if (k->kind == KVP_BH_KEY_INT)
                    kvp_bh_cbor_int(&c, k->num);
                else {
                    kvp_bh_cbor_array(&c, 2);
                    kvp_bh_cbor_text(&c, k->data, k->len);
                    kvp_bh_cbor_int(&c, k->num);
                }
            }
        }
        REQUIRE(kvp_bh_cbor_finish(&c) == 0);
        REQUIRE(kvp_bh_cbor_len(&c) == vc->ncbor0);
        REQUIRE(memcmp(buf, vc->cbor0, vc->ncbor0) == 0);
    }
    /* whole-sequence API */
    struct kvp_bh_hash got[MAX_BLOCKS];
    size_t n = 99;
    REQUIRE(kvp_bh_block_hashes(vc->algo, &vc->none, vc->tok, vc->ntok, vc->bs, vextra, vc,
                                got, MAX_BLOCKS, &n) == 0);
    REQUIRE(n == vc->nwant);
    for (size_t i = 0; i < n; i++)
        REQUIRE(same(&got[i], &vc->want[i]));
    /* one block at a time */
    for (size_t i = 0; i < n; i++) {
        REQUIRE(kvp_bh_hash_block(vc->algo, i ? &vc->want[i - 1] : &vc->none,
                                  vc->tok + i * vc->bs, vc->bs, vc->extra[i].k, vc->extra[i].n,
                                  &h) == 0);
        REQUIRE(same(&h, &vc->want[i]));
    }
    /* incremental, with several append patterns */
    static const size_t steps[] = {1, 3, 7, 16, 17, 1000};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        struct kvp_bh_chain ch;
        REQUIRE(kvp_bh_chain_init(&ch, vc->algo, &vc->none, vc->bs, vextra, vc) == 0);
        size_t pos = 0, have = 0;
        int bad = 0;
        while (pos < vc->ntok && !bad) {
            size_t k = steps[s] < vc->ntok - pos ? steps[s] : vc->ntok - pos;
            size_t nn;
            if (kvp_bh_chain_append(&ch, vc->tok + pos, k, got + have, MAX_BLOCKS - have, &nn))
                bad = 1;
            have += nn;
            pos += k;
        }
        bad |= kvp_bh_chain_ntokens(&ch) != vc->ntok;
        kvp_bh_chain_destroy(&ch);
        REQUIRE(!bad);
        REQUIRE(have == vc->nwant);
        for (size_t i = 0; i < have; i++)
            REQUIRE(same(&got[i], &vc->want[i]));
    }
    return 0;
}

TEST(vectors_from_python_vllm_semantics)
{
    FILE *f = fopen("tests/vectors/block_hashes.txt", "r");
    if (!f)
        SKIP("tests/vectors/block_hashes.txt not found (run from the repo root)");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    struct vcase *vc = NULL;
    int ncases = 0, failed = 0, sha = 0, xxh = 0, seeds0 = 0, seeds12345 = 0, extra = 0;
    while (!failed && (len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (strncmp(line, "case ", 5) == 0) {
            vc = calloc(1, sizeof *vc);
            if (!vc || strlen(line + 5) >= sizeof vc->name) {
                failed = 1;
                break;
            }
            strcpy(vc->name, line + 5);
        } else if (strcmp(line, "end") == 0) {
            if (!vc) {
                failed = 1;
                break;
            }
            if (check_case(vc) != 0) {
                fprintf(stderr, "vector case %s failed\n", vc->name);
                failed = 1;
            }
            ncases++;
            sha += vc->algo == KVP_BH_SHA256_CBOR;
            xxh += vc->algo == KVP_BH_XXHASH_CBOR;
            seeds0 += vc->has_seed && strcmp(vc->seed, "0") == 0;
            seeds12345 += vc->has_seed && strcmp(vc->seed, "12345") == 0;
            for (size_t i = 0; i < MAX_BLOCKS; i++)
                if (vc->extra[i].n) {
                    extra++;
                    break;
                }
            free(vc->tok);
            free(vc);
            vc = NULL;
        } else if (!vc || parse_line(vc, line) != 0) {
            fprintf(stderr, "bad vector line: %s\n", line);
            failed = 1;
        }
    }
    if (vc) {
        free(vc->tok);
        free(vc);
    }
    free(line);
    fclose(f);
    CHECK(!failed);
    CHECK(ncases >= 40);
    CHECK(sha > 0 && xxh > 0 && seeds0 > 0 && seeds12345 > 0 && extra > 0);
}

/* ---------------------------------------------------------------- API edges */

static int fail_at_block2(void *arg, size_t idx, size_t start, size_t end,
                          const struct kvp_bh_key **keys, size_t *nkeys)
{
    static const struct kvp_bh_key lora = {.kind = KVP_BH_KEY_TEXT, .data = "l", .len = 1};
    int *calls = arg;
    (*calls)++;
    if (idx == 2)
        return KVP_EIO;
    *keys = &lora;
    *nkeys = 1;
    return 0;
}

TEST(chain_errors_leave_state_unchanged)
{
    struct kvp_bh_hash none, out[8], ref[8];
    CHECK_EQ(kvp_bh_none_hash(KVP_BH_SHA256_CBOR, "0", &none), 0);
    int64_t tok[40];
    for (int i = 0; i < 40; i++)
        tok[i] = i;
    int calls = 0;
    struct kvp_bh_chain ch;
    CHECK_EQ(kvp_bh_chain_init(&ch, KVP_BH_SHA256_CBOR, &none, 4, fail_at_block2, &calls), 0);
    size_t n;
    CHECK_EQ(kvp_bh_chain_append(&ch, tok, 6, out, 8, &n), 0);
    CHECK_EQ(n, 1);
    /* too small an output array: nothing happens, n says how many needed */
    CHECK_EQ(kvp_bh_chain_append(&ch, tok + 6, 30, out, 2, &n), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(n, 8);
    CHECK_EQ(kvp_bh_chain_ntokens(&ch), 6);
    /* extra_fn fails on block 2: error passed through, chain unchanged */
    CHECK_EQ(kvp_bh_chain_append(&ch, tok + 6, 6, out, 8, &n), KVP_EIO);
    CHECK_EQ(kvp_bh_chain_ntokens(&ch), 6);
    CHECK_EQ(ch.nblocks, 1);
    kvp_bh_chain_destroy(&ch);
    /* same via the whole-sequence API */
    calls = 0;
    CHECK_EQ(kvp_bh_block_hashes(KVP_BH_SHA256_CBOR, &none, tok, 12, 4, fail_at_block2, &calls,
                                 ref, 8, &n),
             KVP_EIO);
    CHECK_EQ(kvp_bh_block_hashes(KVP_BH_SHA256_CBOR, &none, tok, 40, 4, NULL, NULL, ref, 3, &n),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(n, 10);
}

TEST(invalid_params_and_oom)
{
    struct kvp_bh_hash none, out[2], empty = {.len = 0};
    int64_t t[4] = {1, 2, 3, 4};
    size_t n;
    CHECK_EQ(kvp_bh_none_hash(KVP_BH_XXHASH_CBOR, "0", &none), 0);
    CHECK_EQ(kvp_bh_block_hashes(KVP_BH_XXHASH_CBOR, &none, t, 4, 0, NULL, NULL, out, 2, &n),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_bh_block_hashes(KVP_BH_XXHASH_CBOR, &empty, t, 4, 2, NULL, NULL, out, 2, &n),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_bh_block_hashes(KVP_BH_XXHASH_CBOR, &none, NULL, 4, 2, NULL, NULL, out, 2, &n),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_bh_hash_block(KVP_BH_XXHASH_CBOR, NULL, t, 4, NULL, 0, out),
             KVP_EINVALID_PARAMS);
    struct kvp_bh_key bad = {.kind = (enum kvp_bh_key_kind)99};
    CHECK_EQ(kvp_bh_hash_block(KVP_BH_XXHASH_CBOR, &none, t, 4, &bad, 1, out),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_bh_hash_block(KVP_BH_XXHASH_CBOR, &none, t, 4, NULL, 1, out),
             KVP_EINVALID_PARAMS);
    /* an empty token list is a valid (if odd) block: [parent, [], null] */
    CHECK_EQ(kvp_bh_hash_block(KVP_BH_XXHASH_CBOR, &none, NULL, 0, NULL, 0, out), 0);
    struct kvp_bh_chain ch;
    CHECK_EQ(kvp_bh_chain_init(&ch, KVP_BH_XXHASH_CBOR, &none, 0, NULL, NULL),
             KVP_EINVALID_PARAMS);
    kvp_mem_fail_nth(1, 0);
    CHECK_EQ(kvp_bh_chain_init(&ch, KVP_BH_XXHASH_CBOR, &none, 16, NULL, NULL), KVP_ENOMEM);
    kvp_mem_fail_nth(0, 0);
    uint64_t before = kvp_mem_used();
    CHECK_EQ(kvp_bh_chain_init(&ch, KVP_BH_XXHASH_CBOR, &none, 16, NULL, NULL), 0);
    CHECK(kvp_mem_used() > before);
    kvp_bh_chain_destroy(&ch);
    kvp_bh_chain_destroy(&ch); /* idempotent */
    CHECK_EQ(kvp_mem_used(), before);
}
