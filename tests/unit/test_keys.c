/*
 * test_keys.c -- store keys (spec §4): model name, PoolKey golden strings
 * (§4.2), TP replication factors (§4.3), lookup prefixes (§4.4) and put
 * striding (§4.5).
 */
#include <string.h>

#include "connector/keys.h"
#include "harness.h"
#include "kvpool.h"

static int key_is(const struct kvp_key_meta *md, const char *hash, const char *want)
{
    char out[512];
    size_t len = 0;
    REQUIRE(kvp_key_build(md, (const uint8_t *)hash, strlen(hash), out, sizeof out, &len) == 0);
    REQUIRE(len == strlen(out));
    if (strcmp(out, want) != 0) {
        fprintf(stderr, "key got  %s\n    want %s\n", out, want);
        return -1;
    }
    return 0;
}

TEST(model_name_from_path)
{
    static const char *cases[][2] = {
        {"meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"},
        {"/tmp/m/", "m"},
        {"/tmp/m///", "m"},
        {"test-model", "test-model"},
        {"/models/qwen/Qwen2-7B", "Qwen2-7B"},
        {"/", ""},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[64];
        size_t len;
        CHECK_EQ(kvp_key_model_name(cases[i][0], out, sizeof out, &len), 0);
        CHECK(strcmp(out, cases[i][1]) == 0);
        CHECK_EQ(len, strlen(cases[i][1]));
    }
    char small[4];
    size_t len;
    CHECK_EQ(kvp_key_model_name("a/bcdef", small, sizeof small, &len), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(len, 5);
    CHECK(strcmp(small, "bcd") == 0);
}

TEST(pool_key_golden_examples)
{
    struct kvp_key_meta md;
    uint8_t deadbeef[4] = {0xde, 0xad, 0xbe, 0xef};
    char out[256];
    size_t len;
    CHECK_EQ(kvp_key_meta_init(&md, "test-model", NULL, 0, 0, 0, 0, 0), 0);
    CHECK_EQ(kvp_key_build(&md, deadbeef, 4, out, sizeof out, &len), 0);
    CHECK(strcmp(out, "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@deadbeef") == 0);
    CHECK_EQ(len, strlen(out));
    CHECK_EQ(kvp_key_meta_init(&md, "test-model", "depA", 0, 0, 0, 0, 0), 0);
    CHECK_EQ(kvp_key_build(&md, deadbeef, 4, out, sizeof out, &len), 0);
    CHECK(strcmp(out, "depA@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@deadbeef") == 0);
    /* block hash b"a0" -> @6130; SWA group 1 hash b"h3" -> @group:1@6833; b"h11" -> @683131 */
    CHECK_EQ(kvp_key_meta_init(&md, "test-model", NULL, 0, 0, 0, 0, 0), 0);
    CHECK(key_is(&md, "a0", "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@6130") == 0);
    CHECK_EQ(kvp_key_meta_init(&md, "test-model", NULL, 0, 0, 0, 0, 1), 0);
    CHECK(key_is(&md, "h3", "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:1@6833") == 0);
    CHECK(key_is(&md, "h11", "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:1@683131") == 0);
    /* all fields, multi-digit, model from a path */
    CHECK_EQ(kvp_key_meta_init(&md, "org/Model-X/", "c", 12, 3, 7, 10, 42), 0);
    CHECK(key_is(&md, "\x01\xff", "c@Model-X@tp_rank:12@pcp3@dcp7@pp_rank:10@group:42@01ff") == 0);
}

TEST(prefix_and_key_string_separately)
{
    struct kvp_key_meta md;
    char pre[256], key[256];
    size_t plen, klen;
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, 1, 0, 0, 0, 2), 0);
    CHECK_EQ(kvp_key_build_prefix(&md, 3, KVP_KEY_RANK_SELF, 1, KVP_KEY_RANK_SELF, pre,
                                  sizeof pre, &plen),
             0);
    CHECK(strcmp(pre, "m@tp_rank:3@pcp0@dcp1@pp_rank:0@group:2") == 0);
    uint8_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)(i * 9);
    CHECK_EQ(kvp_key_build_key_string(pre, plen, h, 32, key, sizeof key, &klen), 0);
    CHECK_EQ(klen, plen + 1 + 64);
    CHECK(strncmp(key, pre, plen) == 0 && key[plen] == '@');
    CHECK(strcmp(key + plen + 1,
                 "0009121b242d363f48515a636c757e879099a2abb4bdc6cfd8e1eaf3fc050e17") == 0);
    /* overflow: needed length reported, buffer terminated */
    char small[10];
    CHECK_EQ(kvp_key_build_key_string(pre, plen, h, 32, small, sizeof small, &klen),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(klen, plen + 1 + 64);
    CHECK_EQ(strlen(small), 9);
    CHECK_EQ(kvp_key_build(&md, h, 32, small, sizeof small, &klen), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(klen, plen + 1 + 64);
    CHECK_EQ(strlen(small), 9);
    /* exact fit */
    char exact[128];
    CHECK(klen + 1 <= sizeof exact);
    CHECK_EQ(kvp_key_build(&md, h, 32, exact, klen + 1, &klen), 0);
    CHECK_EQ(kvp_key_build(&md, h, 32, exact, klen, &klen), KVP_EBUFFER_OVERFLOW);
    /* measuring call */
    CHECK_EQ(kvp_key_build_prefix(&md, -1, -1, -1, -1, NULL, 0, &plen), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(plen, strlen("m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:2"));
}

TEST(meta_invalid_params)
{
    struct kvp_key_meta md;
    char longp[400];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, -1, 0, 0, 0, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, 0, 0, 0, 0, -3), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_meta_init(&md, NULL, NULL, 0, 0, 0, 0, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_meta_init(&md, longp, NULL, 0, 0, 0, 0, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_meta_init(&md, "m", longp, 0, 0, 0, 0, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_meta_init(&md, "m", "a@b", 0, 0, 0, 0, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_meta_init(&md, "m", "", 0, 0, 0, 0, 0), 0);
    char out[128];
    size_t len;
    CHECK_EQ(kvp_key_build_prefix(&md, -2, 0, 0, 0, out, sizeof out, &len), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_build_prefix(&md, 0, 0, 0, 0, out, sizeof out, &len), 0);
    CHECK(strcmp(out, "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0") == 0);
}

TEST(fingerprint_segment)
{
    struct kvp_key_meta md;
    char out[256];
    size_t len;
    /* after the model name, before the ranks; none = no segment at all */
    CHECK_EQ(kvp_key_meta_init(&md, "org/Model-X", "c", 1, 0, 0, 0, 2), 0);
    CHECK_EQ(md.fingerprint[0], '\0');
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, "0123456789abcdef"), 0);
    CHECK(key_is(&md, "a0", "c@Model-X@cfg:0123456789abcdef@tp_rank:1@pcp0@dcp0@pp_rank:0@group:2@6130") == 0);
    CHECK_EQ(kvp_key_build_prefix(&md, 3, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF, 1, out, sizeof out,
                                  &len),
             0);
    CHECK(strcmp(out, "c@Model-X@cfg:0123456789abcdef@tp_rank:3@pcp0@dcp0@pp_rank:1@group:2") == 0);
    CHECK_EQ(len, strlen(out));
    /* measuring call counts the segment */
    CHECK_EQ(kvp_key_build_prefix(&md, -1, -1, -1, -1, NULL, 0, &len), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(len, strlen("c@Model-X@cfg:0123456789abcdef@tp_rank:1@pcp0@dcp0@pp_rank:0@group:2"));
    /* bounds: 12 and 32 digits pass, 11 and 33 do not */
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, "abcdef012345"), 0);
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, "0123456789abcdef0123456789abcdef"), 0);
    CHECK(key_is(&md, "", "c@Model-X@cfg:0123456789abcdef0123456789abcdef@tp_rank:1@pcp0@dcp0@pp_rank:0@group:2@") == 0);
    static const char *const bad[] = {
        "abcdef01234",                       /* 11 digits */
        "0123456789abcdef0123456789abcdef0", /* 33 */
        "0123456789ABCDEF",                  /* upper case */
        "0123456789abcdeg",                  /* not hex */
        "0123456789abcd@f",                  /* a separator */
        "0123456789abc def",
        "0123456789abcde\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(kvp_key_fingerprint_valid(bad[i]), 0);
        CHECK_EQ(kvp_key_meta_set_fingerprint(&md, bad[i]), KVP_EINVALID_PARAMS);
        /* refused: md keeps its fingerprint */
        CHECK(strcmp(md.fingerprint, "0123456789abcdef0123456789abcdef") == 0);
    }
    CHECK_EQ(kvp_key_fingerprint_valid(NULL), 0);
    CHECK_EQ(kvp_key_fingerprint_valid(""), 0);
    CHECK_EQ(kvp_key_meta_set_fingerprint(NULL, "0123456789abcdef"), KVP_EINVALID_PARAMS);
    /* NULL or "" clears: the keys of vLLM's in-tree connector again */
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, ""), 0);
    CHECK(key_is(&md, "a0", "c@Model-X@tp_rank:1@pcp0@dcp0@pp_rank:0@group:2@6130") == 0);
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, "0123456789abcdef"), 0);
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, NULL), 0);
    CHECK(key_is(&md, "a0", "c@Model-X@tp_rank:1@pcp0@dcp0@pp_rank:0@group:2@6130") == 0);
}

TEST(fingerprint_lookup_prefixes)
{
    /* every lookup prefix carries the fingerprint */
    struct kvp_key_meta md;
    struct kvp_key_ns ns[4];
    char buf[512];
    size_t off[4], n, used;
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, 0, 0, 0, 0, 0), 0);
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, "00112233445566ff"), 0);
    CHECK_EQ(kvp_key_lookup_prefixes(&md, 2, 1, 1, 1, 1, ns, 4, buf, sizeof buf, off, 4, &n, &used),
             0);
    CHECK_EQ(n, 2);
    CHECK(strcmp(buf + off[0], "m@cfg:00112233445566ff@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0") == 0);
    CHECK(strcmp(buf + off[1], "m@cfg:00112233445566ff@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0") == 0);
}

TEST(tp_factor_rules)
{
    enum kvp_key_spec mla = KVP_KEY_SPEC_MLA, gqa = KVP_KEY_SPEC_ATTENTION,
                      mamba = KVP_KEY_SPEC_MAMBA, swmla = KVP_KEY_SPEC_SWA_MLA;
    int f;
    /* the spec's example: tp=4, num_kv_head=2, groups (MLA, GQA, Mamba) -> (4, 2, 1) */
    CHECK_EQ(kvp_key_tp_factor(&mla, 1, 4, 2, 1, &f), 0);
    CHECK_EQ(f, 4);
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 2, 1, &f), 0);
    CHECK_EQ(f, 2);
    CHECK_EQ(kvp_key_tp_factor(&mamba, 1, 4, 2, 1, &f), 0);
    CHECK_EQ(f, 1);
    /* GQA: more heads than ranks -> 1; max(1, ...) */
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 8, 1, &f), 0);
    CHECK_EQ(f, 1);
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 8, 1, 1, &f), 0);
    CHECK_EQ(f, 8);
    /* DCP > 1 wins over everything */
    CHECK_EQ(kvp_key_tp_factor(&mla, 1, 4, 1, 2, &f), 0);
    CHECK_EQ(f, 1);
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 1, 4, &f), 0);
    CHECK_EQ(f, 1);
    /* uniform-type groups: all MLA-like -> tp; any Mamba -> 1; mixed -> GQA rule */
    enum kvp_key_spec u1[] = {KVP_KEY_SPEC_MLA, KVP_KEY_SPEC_SWA_MLA};
    CHECK_EQ(kvp_key_tp_factor(u1, 2, 4, 2, 1, &f), 0);
    CHECK_EQ(f, 4);
    enum kvp_key_spec u2[] = {KVP_KEY_SPEC_MLA, KVP_KEY_SPEC_MAMBA};
    CHECK_EQ(kvp_key_tp_factor(u2, 2, 4, 2, 1, &f), 0);
    CHECK_EQ(f, 1);
    enum kvp_key_spec u3[] = {KVP_KEY_SPEC_MLA, KVP_KEY_SPEC_ATTENTION};
    CHECK_EQ(kvp_key_tp_factor(u3, 2, 4, 2, 1, &f), 0);
    CHECK_EQ(f, 2);
    CHECK_EQ(kvp_key_tp_factor(&swmla, 1, 2, 0, 1, &f), 0); /* heads unused for MLA */
    CHECK_EQ(f, 2);
    /* invalid */
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 0, 1, &f), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_tp_factor(&gqa, 0, 4, 1, 1, &f), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 0, 1, 1, &f), KVP_EINVALID_PARAMS);
    enum kvp_key_spec bad = (enum kvp_key_spec)77;
    CHECK_EQ(kvp_key_tp_factor(&bad, 1, 4, 1, 1, &f), KVP_EINVALID_PARAMS);
    /* key tp rank */
    CHECK_EQ(kvp_key_tp_rank_for_group(3, 2), 1);
    CHECK_EQ(kvp_key_tp_rank_for_group(3, 4), 0);
    CHECK_EQ(kvp_key_tp_rank_for_group(3, 1), 3);
}

/* Builds group md's lookup prefixes and compares them with want[0..nwant). */
static int prefixes_are(const struct kvp_key_meta *md, int tp, int pcp, int dcp, int pp,
                        int factor, const char *const *want, size_t nwant)
{
    struct kvp_key_ns ns[64];
    char buf[4096];
    size_t off[64], n, used;
    REQUIRE(kvp_key_lookup_prefixes(md, tp, pcp, dcp, pp, factor, ns, 64, buf, sizeof buf, off,
                                    64, &n, &used) == 0);
    if (n != nwant) {
        fprintf(stderr, "got %zu prefixes, want %zu\n", n, nwant);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(buf + off[i], want[i]) != 0) {
            fprintf(stderr, "prefix %zu: got %s want %s\n", i, buf + off[i], want[i]);
            return -1;
        }
    }
    REQUIRE(used == off[n - 1] + strlen(want[n - 1]) + 1);
    return 0;
}

TEST(lookup_prefixes_spec_examples)
{
    struct kvp_key_meta md;
    enum kvp_key_spec gqa = KVP_KEY_SPEC_ATTENTION, mamba = KVP_KEY_SPEC_MAMBA;
    int f;
    /* tp=4, 1 KV head, dcp=4 -> tp_rank:t@pcp0@dcpt for t = 0..3 */
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, 0, 0, 0, 0, 0), 0);
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 1, 4, &f), 0);
    CHECK_EQ(f, 1);
    static const char *const dcp4[] = {
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0", "m@tp_rank:1@pcp0@dcp1@pp_rank:0@group:0",
        "m@tp_rank:2@pcp0@dcp2@pp_rank:0@group:0", "m@tp_rank:3@pcp0@dcp3@pp_rank:0@group:0"};
    CHECK(prefixes_are(&md, 4, 1, 4, 1, f, dcp4, 4) == 0);
    /* tp=4, pcp=2 (1 KV head: factor 4) -> tp_rank:0@pcp0, tp_rank:0@pcp1 */
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 4, 1, 1, &f), 0);
    CHECK_EQ(f, 4);
    static const char *const pcp2[] = {"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0",
                                       "m@tp_rank:0@pcp1@dcp0@pp_rank:0@group:0"};
    CHECK(prefixes_are(&md, 4, 2, 1, 1, f, pcp2, 2) == 0);
    /* FA + Mamba, tp=2, 1 head: group 0 one prefix, group 1 tp_rank:0 and tp_rank:1 */
    CHECK_EQ(kvp_key_tp_factor(&gqa, 1, 2, 1, 1, &f), 0);
    CHECK_EQ(f, 2);
    static const char *const fa[] = {"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0"};
    CHECK(prefixes_are(&md, 2, 1, 1, 1, f, fa, 1) == 0);
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, 0, 0, 0, 0, 1), 0);
    CHECK_EQ(kvp_key_tp_factor(&mamba, 1, 2, 1, 1, &f), 0);
    CHECK_EQ(f, 1);
    static const char *const mb[] = {"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:1",
                                     "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:1"};
    CHECK(prefixes_are(&md, 2, 1, 1, 1, f, mb, 2) == 0);
    /* order pcp > tp > pp, with a cache prefix */
    CHECK_EQ(kvp_key_meta_init(&md, "m", "p", 0, 0, 0, 0, 0), 0);
    static const char *const order[] = {
        "p@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0", "p@m@tp_rank:0@pcp0@dcp0@pp_rank:1@group:0",
        "p@m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0", "p@m@tp_rank:1@pcp0@dcp0@pp_rank:1@group:0",
        "p@m@tp_rank:0@pcp1@dcp0@pp_rank:0@group:0", "p@m@tp_rank:0@pcp1@dcp0@pp_rank:1@group:0",
        "p@m@tp_rank:1@pcp1@dcp0@pp_rank:0@group:0", "p@m@tp_rank:1@pcp1@dcp0@pp_rank:1@group:0"};
    CHECK(prefixes_are(&md, 4, 2, 1, 2, 2, order, 8) == 0);
    /* dcp=2 < tp=4: dcp rank = tp % dcp */
    struct kvp_key_ns ns[8];
    size_t n;
    CHECK_EQ(kvp_key_lookup_namespaces(4, 1, 2, 1, 1, ns, 8, &n), 0);
    CHECK_EQ(n, 4);
    CHECK(ns[2].tp == 2 && ns[2].dcp == 0 && ns[3].tp == 3 && ns[3].dcp == 1);
}

TEST(lookup_prefixes_overflow)
{
    struct kvp_key_meta md;
    struct kvp_key_ns ns[4];
    char buf[50];
    size_t off[4], n, used;
    CHECK_EQ(kvp_key_meta_init(&md, "m", NULL, 0, 0, 0, 0, 0), 0);
    /* namespace scratch too small */
    CHECK_EQ(kvp_key_lookup_prefixes(&md, 8, 1, 1, 1, 1, ns, 4, buf, sizeof buf, off, 4, &n,
                                     &used),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(n, 8);
    /* string buffer too small: needed size reported */
    CHECK_EQ(kvp_key_lookup_prefixes(&md, 2, 1, 1, 1, 1, ns, 4, buf, sizeof buf, off, 4, &n,
                                     &used),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(n, 2);
    CHECK_EQ(used, 2 * (strlen("m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0") + 1));
    /* offsets array too small */
    char big[200];
    CHECK_EQ(kvp_key_lookup_prefixes(&md, 2, 1, 1, 1, 1, ns, 4, big, sizeof big, off, 1, &n,
                                     &used),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(kvp_key_lookup_namespaces(0, 1, 1, 1, 1, ns, 4, &n), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_key_lookup_namespaces(2, 1, 1, 1, 0, ns, 4, &n), KVP_EINVALID_PARAMS);
}

/*
 * For every (tp, heads, group spec, group id) combination: the ranks sharing
 * a key namespace (same tp_rank / factor) together store each chunk exactly
 * once, over any window [resume, nchunks) -- the rule depends on the
 * absolute chunk index only -- and every namespace a lookup requires is
 * written by some rank.
 */
TEST(put_striding_covers_every_chunk_once)
{
    static const int tps[] = {1, 2, 3, 4, 8};
    static const int heads[] = {1, 2, 4, 8, 16};
    static const enum kvp_key_spec specs[] = {KVP_KEY_SPEC_ATTENTION, KVP_KEY_SPEC_MLA,
                                              KVP_KEY_SPEC_MAMBA};
    static const int dcps[] = {1, 2};
    int combos = 0;
    for (size_t a = 0; a < sizeof tps / sizeof tps[0]; a++)
        for (size_t b = 0; b < sizeof heads / sizeof heads[0]; b++)
            for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
                for (size_t d = 0; d < sizeof dcps / sizeof dcps[0]; d++)
                    for (int g = 0; g < 4; g++) {
                        int tp = tps[a], dcp = dcps[d], f;
                        if (dcp > tp)
                            continue;
                        CHECK_EQ(kvp_key_tp_factor(&specs[s], 1, tp, heads[b], dcp, &f), 0);
                        CHECK(f >= 1 && tp % f == 0);
                        for (int resume = 0; resume < 5; resume++) {
                            const int nchunks = 23;
                            for (int nsid = 0; nsid < tp / f; nsid++) {
                                int count[23] = {0};
                                for (int r = 0; r < tp; r++) {
                                    if (kvp_key_tp_rank_for_group(r, f) != nsid)
                                        continue;
                                    for (int c = resume; c < nchunks; c++)
                                        count[c] += kvp_key_put_mine(c, r, g, f);
                                }
                                for (int c = resume; c < nchunks; c++)
                                    CHECK_EQ(count[c], 1);
                            }
                        }
                        /* every looked-up namespace's tp rank is some rank's key rank */
                        struct kvp_key_ns ns[64];
                        size_t n;
                        CHECK_EQ(kvp_key_lookup_namespaces(tp, 1, dcp, 1, f, ns, 64, &n), 0);
                        for (size_t i = 0; i < n; i++) {
                            int found = 0;
                            for (int r = 0; r < tp; r++)
                                found |= kvp_key_tp_rank_for_group(r, f) == ns[i].tp &&
                                         (dcp == 1 || r % dcp == ns[i].dcp);
                            CHECK(found);
                        }
                        combos++;
                    }
    CHECK(combos > 100);
    /* the rotation: group g shifts the phase */
    CHECK(kvp_key_put_mine(0, 0, 0, 2));
    CHECK(!kvp_key_put_mine(0, 0, 1, 2));
    CHECK(kvp_key_put_mine(1, 0, 1, 2));
    CHECK(kvp_key_put_mine(5, 3, 7, 1));
    CHECK(!kvp_key_put_mine(-1, 0, 0, 1));
}

/* The TP-independent layout: "@kvh:<head>" where the rank layout has
 * "@tp_rank:<rank>"; the lookup prefixes of a group are its heads. */
TEST(head_layout_keys)
{
    struct kvp_key_meta md;
    CHECK_EQ(kvp_key_meta_init(&md, "org/m", NULL, 3, 0, 0, 1, 2), 0);
    CHECK_EQ(kvp_key_meta_set_fingerprint(&md, "0123456789ab"), 0);
    md.by_head = true;
    char out[256];
    size_t len;
    uint8_t h[2] = {0xab, 0x01};
    CHECK_EQ(kvp_key_build(&md, h, 2, out, sizeof out, &len), 0);
    CHECK(strcmp(out, "m@cfg:0123456789ab@kvh:3@pcp0@dcp0@pp_rank:1@group:2@ab01") == 0);
    struct kvp_key_ns ns[4];
    size_t off[4], n, used;
    char buf[512];
    CHECK_EQ(kvp_key_lookup_prefixes(&md, 4, 1, 1, 1, 1, ns, 4, buf, sizeof buf, off, 4, &n,
                                     &used), 0);
    CHECK_EQ(n, 4);
    CHECK(strcmp(buf + off[2], "m@cfg:0123456789ab@kvh:2@pcp0@dcp0@pp_rank:0@group:2") == 0);
}
