/*
 * test_cfgtab.c -- master/cfgtab: which keys name a configuration, and the
 * row / "other" bookkeeping on its own (test_master.c drives it through
 * the master, with kvp_master_check recounting).
 */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "master/cfgtab.h"

static int parse(const char *key, char *name, char *fp)
{
    kvp_cfgkey k;
    if (!kvp_cfgtab_parse((const uint8_t *)key, strlen(key), &k))
        return 0;
    snprintf(name, 300, "%.*s", (int)k.namelen, (const char *)k.name);
    snprintf(fp, 40, "%.*s", (int)k.fplen, (const char *)k.fp);
    return 1;
}

TEST(parse_takes_the_last_tag)
{
    static const struct {
        const char *key, *name, *fp;
    } yes[] = {
        {"m@cfg:0123456789ab@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@00ff", "m", "0123456789ab"},
        {"p@m@cfg:0123456789abcdef0123456789abcdef", "p@m", "0123456789abcdef0123456789abcdef"},
        {"@cfg:0123456789ab", "", "0123456789ab"},
        {"a@cfg:x@b@cfg:0123456789ab@c", "a@cfg:x@b", "0123456789ab"},
        {"m@cfg:0123456789abcdef@kvpool-config", "m", "0123456789abcdef"},
    };
    char name[300], fp[40];
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        CHECK_EQ(parse(yes[i].key, name, fp), 1);
        CHECK(strcmp(name, yes[i].name) == 0);
        CHECK(strcmp(fp, yes[i].fp) == 0);
    }
    static const char *const no[] = {
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@00ff",
        "m@cfg:0123456789a@tp_rank:0",             /* 11 digits */
        "m@cfg:0123456789abcdef0123456789abcdef0", /* 33 */
        "m@cfg:0123456789ABCDEF",                  /* upper case */
        "m@cfg:0123456789abcdefg@x",               /* not '@' after the digits */
        "m@cfg:0123456789ab@cfg:zz",               /* the last tag is malformed */
        "m@cfg:0123456789ab@cfg:",
        "m@CFG:0123456789ab",
        "",
        "@cfg:",
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (parse(no[i], name, fp))
            th_fail(__FILE__, __LINE__, "%s parsed", no[i]);
    kvp_cfgkey k;
    CHECK_EQ(kvp_cfgtab_parse(NULL, 20, &k), 0);
    /* a key is bytes: a NUL before the tag is part of the name */
    static const uint8_t bin[] = "m\0x@cfg:0123456789ab";
    CHECK_EQ(kvp_cfgtab_parse(bin, sizeof bin - 1, &k), 1);
    CHECK_EQ(k.namelen, 3);
}

TEST(rows_other_and_cut_names)
{
    kvp_cfgtab t;
    CHECK(kvp_cfgtab_init(&t) == 0);
    if (!t.rows)
        return;
    uint64_t other[2][2] = {{0, 0}, {0, 0}};
    const char *k1 = "m@cfg:0123456789ab@tp_rank:0@x";
    kvp_cfgtab_count(&t, 0, (const uint8_t *)k1, strlen(k1), 10, 1, other[0]);
    kvp_cfgtab_count(&t, 1, (const uint8_t *)k1, strlen(k1), 20, 1, other[1]);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"plain", 5, 30, 1, other[0]); /* not counted */
    CHECK_EQ(t.nrows, 2);
    CHECK_EQ(kvp_cfgtab_check(&t), 0);
    kvp_cfgkey k;
    CHECK(kvp_cfgtab_parse((const uint8_t *)k1, strlen(k1), &k));
    const kvp_cfgtab_row *r0 = kvp_cfgtab_find(&t, 0, &k), *r1 = kvp_cfgtab_find(&t, 1, &k);
    CHECK(r0 && r1 && r0 != r1 && r0->objects == 1 && r0->bytes == 10 && r1->bytes == 20);
    CHECK(kvp_cfgtab_find(&t, 2, &k) == NULL);
    /* names past KVP_CFGTAB_NAME_MAX - 1 bytes are cut: alike up to there, one row */
    char a[600], b[600];
    memset(a, 'n', 400);
    memcpy(b, a, 400);
    b[300] = 'X';
    snprintf(a + 400, 200, "@cfg:0123456789ab@t");
    snprintf(b + 400, 200, "@cfg:0123456789ab@t");
    kvp_cfgtab_count(&t, 0, (const uint8_t *)a, strlen(a), 1, 1, other[0]);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)b, strlen(b), 1, 1, other[0]);
    CHECK(kvp_cfgtab_parse((const uint8_t *)a, strlen(a), &k));
    const kvp_cfgtab_row *ra = kvp_cfgtab_find(&t, 0, &k);
    CHECK(ra && ra->objects == 2 && ra->namelen == KVP_CFGTAB_NAME_MAX - 1);
    CHECK_EQ(t.nrows, 3);
    /* back to zero: the rows stay (idle), other untouched */
    kvp_cfgtab_count(&t, 0, (const uint8_t *)a, strlen(a), 1, -1, other[0]);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)b, strlen(b), 1, -1, other[0]);
    CHECK(ra->objects == 0 && ra->bytes == 0);
    CHECK(other[0][0] == 0 && other[1][0] == 0);
    CHECK_EQ(kvp_cfgtab_check(&t), 0);
    /* fill every slot: the next configuration goes to its tenant's other;
     * with other not empty, even an idle row is not taken */
    char key[64];
    for (int i = 0; t.nrows < KVP_CFGTAB_MAX; i++) {
        snprintf(key, sizeof key, "f@cfg:%016x", i);
        kvp_cfgtab_count(&t, 0, (const uint8_t *)key, strlen(key), 1, 1, other[0]);
    }
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"g@cfg:aaaaaaaaaaaa", 18, 5, 1, other[0]);
    CHECK(other[0][0] == 0); /* the idle row (the cut name's) was reused: other was empty */
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"g@cfg:bbbbbbbbbbbb", 18, 5, 1, other[0]);
    CHECK(other[0][0] == 1 && other[0][1] == 5);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"f@cfg:0000000000000000", 22, 1, -1, other[0]);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"g@cfg:cccccccccccc", 18, 5, 1, other[0]);
    CHECK(other[0][0] == 2); /* an idle row exists, but other is not empty */
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"g@cfg:bbbbbbbbbbbb", 18, 5, -1, other[0]);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"g@cfg:cccccccccccc", 18, 5, -1, other[0]);
    CHECK(other[0][0] == 0 && other[0][1] == 0);
    kvp_cfgtab_count(&t, 0, (const uint8_t *)"g@cfg:dddddddddddd", 18, 5, 1, other[0]);
    CHECK(other[0][0] == 0); /* now it takes the idle row */
    CHECK(kvp_cfgtab_parse((const uint8_t *)"g@cfg:dddddddddddd", 18, &k));
    CHECK(kvp_cfgtab_find(&t, 0, &k) != NULL);
    CHECK_EQ(t.nrows, KVP_CFGTAB_MAX);
    CHECK_EQ(kvp_cfgtab_check(&t), 0);
    kvp_cfgtab_free(&t);
    kvp_cfgtab_free(&t); /* twice: a zeroed table */
}
