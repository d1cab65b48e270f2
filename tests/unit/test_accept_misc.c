/*
 * test_accept_misc.c -- spec §18 acceptance items for the token database
 * (§6.6, test_mooncake_store_prepare_values.py), put striding against the
 * lookup namespaces (§4.4/§4.5, test_mooncake_store_worker.py "put striding
 * covers every rank's GET namespace (dcp 1 and 4)") and the lookup
 * channel's protocol tags (§9.2). The mapping of every §18 item to a test
 * is docs/ACCEPTANCE.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/mem.h"
#include "connector/keys.h"
#include "connector/lookup.h"
#include "connector/tokendb.h"
#include "harness.h"
#include "kvpool.h"

/* ------------------------------------------------ prepare_values (§6.6) */

#define NBLK 8   /* blocks per registered tensor */
#define MAXSEG 96

/*
 * Registers nseg blocks-first tensors (shape (NBLK, len_i), 1-byte
 * elements) over one buffer: segment i has block_len lens[i % nlens], the
 * C analogue of the Python test's (regions, lens) pairs where block_len is
 * indexed modulo its length.
 */
static uint8_t *mk_layout(kvp_tdb_layout *l, size_t nseg, const size_t *lens, size_t nlens)
{
    size_t total = 0;
    for (size_t i = 0; i < nseg; i++)
        total += NBLK * lens[i % nlens];
    uint8_t *mem = kvp_malloc(total);
    if (!mem || kvp_tdb_layout_init(l, NBLK) != 0)
        return NULL;
    size_t off = 0;
    for (size_t i = 0; i < nseg; i++) {
        size_t len = lens[i % nlens];
        kvp_tdb_tensor t = {.base = mem + off,
                            .storage_len = NBLK * len,
                            .elem_size = 1,
                            .ndim = 2,
                            .shape = {NBLK, len},
                            .stride = {len, 1}};
        int kind = -1;
        if (kvp_tdb_layout_add_tensor(l, &t, &kind) != 0 || kind != KVP_TDB_BLOCKS_FIRST)
            return NULL;
        off += NBLK * len;
    }
    return mem;
}

/*
 * The scalar reference of §6.6 for one chunk [s, e): bid = block_ids[s/B];
 * piece i = (base_i + bid*len_i, len_i * ceil((e-s)/B)).
 */
static int ref_check(const uint8_t *mem, size_t nseg, const size_t *lens, size_t nlens,
                     uint32_t B, uint64_t s, uint64_t e, const uint32_t *ids, const kvp_iov *got,
                     uint32_t got_bid)
{
    uint32_t bid = ids[s / B];
    REQUIRE(got_bid == bid);
    size_t off = 0;
    for (size_t i = 0; i < nseg; i++) {
        size_t len = lens[i % nlens];
        const uint8_t *want = mem + off + (size_t)bid * len;
        size_t want_len = len * (size_t)((e - s + B - 1) / B);
        if ((const uint8_t *)got[i].base != want || got[i].len != want_len) {
            fprintf(stderr, "segment %zu: got (%p, %zu) want (%p, %zu)\n", i, got[i].base,
                    got[i].len, (const void *)want, want_len);
            return -1;
        }
        off += NBLK * len;
    }
    return 0;
}

/* prepare_values over every chunk of T tokens equals the scalar reference,
 * chunk by chunk, and equals the single-chunk wrapper. */
static int equivalence(size_t nseg, const size_t *lens, size_t nlens)
{
    kvp_tdb_layout l;
    uint8_t *mem = mk_layout(&l, nseg, lens, nlens);
    REQUIRE(mem);
    REQUIRE(l.nsegs == nseg);
    kvp_tdb db;
    const uint32_t B = 16, H = 4;
    REQUIRE(kvp_tdb_init(&db, B, H, &l) == 0);
    const uint32_t ids[6] = {3, 7, 0, 5, 1, 6};
    static kvp_iov iov[6 * MAXSEG], one[MAXSEG];
    /* T = 92: five full chunks and a partial (H-aligned) last chunk of 12 */
    kvp_tdb_chunk ch[8];
    size_t n = 0;
    REQUIRE(kvp_tdb_process_tokens(&db, 92, 23, 0, NULL, 0, 1, 0, ch, 8, &n) == 0);
    REQUIRE(n == 6);
    REQUIRE(ch[5].start == 80 && ch[5].end == 92);
    uint32_t cb[6];
    REQUIRE(kvp_tdb_prepare_values(&db, ch, n, ids, 6, iov, 6 * MAXSEG, cb) == 0);
    for (size_t k = 0; k < n; k++) {
        REQUIRE(ref_check(mem, nseg, lens, nlens, B, ch[k].start, ch[k].end, ids,
                          &iov[k * nseg], cb[k]) == 0);
        uint32_t bid = UINT32_MAX;
        REQUIRE(kvp_tdb_prepare_value(&db, ch[k].start, ch[k].end, ids, 6, one, MAXSEG, &bid) ==
                0);
        REQUIRE(bid == cb[k]);
        REQUIRE(memcmp(one, &iov[k * nseg], nseg * sizeof(kvp_iov)) == 0);
    }
    /* a masked, strided selection (not contiguous chunks) */
    const uint8_t mask[5] = {1, 0, 1, 1, 1};
    REQUIRE(kvp_tdb_process_tokens(&db, 92, 23, 16, mask, 5, 2, 1, ch, 8, &n) == 0);
    /* start chunk 1; mask relative to it selects 1, 3, 4, 5; stride 2 rank 1 keeps 1, 3, 5 */
    REQUIRE(n == 3);
    REQUIRE(ch[0].index == 1 && ch[1].index == 3 && ch[2].index == 5);
    REQUIRE(kvp_tdb_prepare_values(&db, ch, n, ids, 6, iov, 6 * MAXSEG, cb) == 0);
    for (size_t k = 0; k < n; k++)
        REQUIRE(ref_check(mem, nseg, lens, nlens, B, ch[k].start, ch[k].end, ids,
                          &iov[k * nseg], cb[k]) == 0);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
    return 0;
}

/* Python: (96 regions, 96 lens) -- every segment its own block length. */
TEST(prepare_values_equals_reference_96_regions_96_lens)
{
    size_t lens[96];
    for (size_t i = 0; i < 96; i++)
        lens[i] = 16 + 8 * (i % 13) + i; /* 96 distinct lengths */
    CHECK_EQ(equivalence(96, lens, 96), 0);
}

/* Python: (96, 2) -- block_len indexed modulo its length (K and V sizes). */
TEST(prepare_values_equals_reference_96_regions_2_lens)
{
    size_t lens[2] = {64, 96};
    CHECK_EQ(equivalence(96, lens, 2), 0);
}

/* Python: (1, 1). */
TEST(prepare_values_equals_reference_1_region_1_len)
{
    size_t lens[1] = {256};
    CHECK_EQ(equivalence(1, lens, 1), 0);
}

/* Empty input -> empty outputs (the spec's ([], [], [])), nothing written;
 * an unaligned chunk (129 tokens with B = H = 128) is refused. */
TEST(prepare_values_empty_and_unaligned)
{
    kvp_tdb_layout l;
    size_t lens[1] = {64};
    uint8_t *mem = mk_layout(&l, 1, lens, 1);
    CHECK(mem);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, 16, 4, &l), 0);
    const uint32_t ids[2] = {1, 2};
    kvp_iov iov[2] = {{(void *)1, 77}, {(void *)1, 77}};
    uint32_t cb[2] = {99, 99};
    CHECK_EQ(kvp_tdb_prepare_values(&db, NULL, 0, ids, 2, iov, 2, cb), 0);
    CHECK(iov[0].base == (void *)1 && iov[0].len == 77);
    CHECK_EQ(cb[0], 99);
    /* a chunk whose length is not a multiple of H */
    kvp_tdb_chunk bad = {.start = 0, .end = 14, .index = 0, .hash_idx = 2};
    CHECK_EQ(kvp_tdb_prepare_values(&db, &bad, 1, ids, 2, iov, 2, cb), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_init(&db, 128, 128, &l), 0);
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, 129, ids, 2, iov, 2, NULL), KVP_EINVALID_PARAMS);
    kvp_tdb_chunk bad2 = {.start = 0, .end = 129, .index = 0, .hash_idx = 0};
    CHECK_EQ(kvp_tdb_prepare_values(&db, &bad2, 1, ids, 2, iov, 2, cb), KVP_EINVALID_PARAMS);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

/* --------------------------------- put striding vs lookup namespaces (§4) */

/*
 * Every key a lookup requires (each namespace of kvp_key_lookup_namespaces,
 * each chunk) is PUT by exactly the ranks that own that namespace and the
 * chunk's stripe: for tp = 4 with dcp 1 and dcp 4, for GQA (1 and 2 heads),
 * MLA and Mamba groups, at group ids 0..2. A worker rank r writes under its
 * key namespace (r / factor, pcp, dcp_rank = r % dcp, pp) and stores chunk c
 * iff kvp_key_put_mine(c, r, g, factor).
 */
TEST(put_striding_covers_every_lookup_namespace_dcp_1_and_4)
{
    const int tp = 4;
    static const int dcps[] = {1, 4};
    static const int heads[] = {1, 2};
    static const enum kvp_key_spec specs[] = {KVP_KEY_SPEC_ATTENTION, KVP_KEY_SPEC_MLA,
                                              KVP_KEY_SPEC_MAMBA};
    for (size_t d = 0; d < 2; d++)
        for (size_t hh = 0; hh < 2; hh++)
            for (size_t s = 0; s < 3; s++)
                for (int g = 0; g < 3; g++) {
                    int dcp = dcps[d], f = 0;
                    CHECK_EQ(kvp_key_tp_factor(&specs[s], 1, tp, heads[hh], dcp, &f), 0);
                    if (dcp > 1)
                        CHECK_EQ(f, 1);
                    struct kvp_key_ns ns[16];
                    size_t n = 0;
                    CHECK_EQ(kvp_key_lookup_namespaces(tp, 1, dcp, 1, f, ns, 16, &n), 0);
                    CHECK_EQ(n, (size_t)(dcp > 1 ? tp : tp / f));
                    for (size_t i = 0; i < n; i++) {
                        for (int c = 0; c < 17; c++) {
                            int writers = 0;
                            for (int r = 0; r < tp; r++) {
                                int key_tp = kvp_key_tp_rank_for_group(r, f);
                                int key_dcp = dcp > 1 ? r % dcp : 0;
                                if (key_tp == ns[i].tp && key_dcp == ns[i].dcp &&
                                    kvp_key_put_mine(c, r, g, f))
                                    writers++;
                            }
                            /* exactly one rank writes each required key */
                            CHECK_EQ(writers, 1);
                        }
                    }
                }
    /* dcp 4: the four namespaces of the spec's example, in order */
    enum kvp_key_spec gqa = KVP_KEY_SPEC_ATTENTION;
    int f = 0;
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 1, 4, &f), 0);
    struct kvp_key_ns ns[8];
    size_t n = 0;
    CHECK_EQ(kvp_key_lookup_namespaces(4, 1, 4, 1, f, ns, 8, &n), 0);
    CHECK_EQ(n, 4);
    for (int t = 0; t < 4; t++) {
        CHECK_EQ(ns[t].tp, t);
        CHECK_EQ(ns[t].dcp, t);
    }
}

/* ------------------------------------------------ protocol tags (§9.2) */

static int t_lookup(void *arg, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                    size_t hash_len, int apply_eagle, uint32_t *hit)
{
    (void)arg, (void)hashes, (void)hash_len, (void)apply_eagle;
    *hit = (uint32_t)nhashes * 16 < num_tokens ? (uint32_t)nhashes * 16 : 0;
    return 0;
}
static int t_reset(void *arg)
{
    (void)arg;
    return 0;
}

/* Sends one framed body, reads one framed reply; -1 when closed. */
static int xchg(int fd, const uint8_t *body, uint32_t n, uint8_t *reply, size_t cap)
{
    uint8_t buf[64];
    buf[0] = (uint8_t)(n >> 24);
    buf[1] = (uint8_t)(n >> 16);
    buf[2] = (uint8_t)(n >> 8);
    buf[3] = (uint8_t)n;
    memcpy(buf + 4, body, n);
    if (send(fd, buf, 4 + n, MSG_NOSIGNAL) != (ssize_t)(4 + n))
        return -1;
    uint8_t hdr[4];
    if (recv(fd, hdr, 4, MSG_WAITALL) != 4)
        return -1;
    uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (len > cap || recv(fd, reply, len, MSG_WAITALL) != (ssize_t)len)
        return -1;
    return (int)len;
}

/*
 * The request tags (lookup 'L', reset 'R') are distinct, each answer
 * carries its request's tag, and an unknown tag gets the error answer
 * ('E', the spec's RESP_ERR for an unknown tag) without closing the
 * connection.
 */
TEST(protocol_tags_distinct_and_echoed)
{
    char path[108];
    snprintf(path, sizeof path, "/tmp/kvp-accept-%d.sock", (int)getpid());
    kvp_lookup_handler h = {.lookup = t_lookup, .reset = t_reset, .arg = NULL};
    kvp_lookup_server *srv = NULL;
    CHECK_EQ(kvp_lookup_server_start(path, &h, &srv), 0);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t r[16];
    /* lookup: 'L' u32 48 u16 1 [2 hashes of 1 byte] u8 1 -> 'L' u32 32 */
    const uint8_t lk[] = {'L', 0, 0, 0, 48, 0, 1, 9, 9, 1};
    CHECK_EQ(xchg(fd, lk, sizeof lk, r, sizeof r), 5);
    CHECK_EQ(r[0], 'L');
    CHECK_EQ(r[1] << 24 | r[2] << 16 | r[3] << 8 | r[4], 32);
    const uint8_t rs[] = {'R'};
    CHECK_EQ(xchg(fd, rs, 1, r, sizeof r), 2);
    CHECK_EQ(r[0], 'R');
    CHECK_EQ(r[1], 1); /* RESP_OK */
    const uint8_t uk[] = {'X'};
    CHECK_EQ(xchg(fd, uk, 1, r, sizeof r), 2);
    CHECK_EQ(r[0], 'E');
    CHECK_EQ(r[1], 0); /* RESP_ERR */
    /* the connection still serves */
    CHECK_EQ(xchg(fd, lk, sizeof lk, r, sizeof r), 5);
    CHECK_EQ(r[0], 'L');
    close(fd);
    kvp_lookup_server_stop(srv);
}
