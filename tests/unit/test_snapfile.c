/* test_snapfile.c -- the snapshot file's rewrite spread over loop turns
 * (kvp_snapfile_begin / _part / _commit): the changes appended meanwhile
 * reach both the old file (a crash before the commit keeps it whole) and
 * the new one, in the order they were made; an abandoned rewrite leaves
 * the old file and no tmp file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "harness.h"
#include "kvpool.h"
#include "master/snapfile.h"
#include "proto/proto.h"

typedef struct seen {
    char order[64];
    size_t n;
} seen;

/* Each frame's body is one letter: the replay's order as a string. */
static int apply(void *ctx, const uint8_t *body, size_t len)
{
    seen *s = ctx;
    if (len == 1 && s->n + 1 < sizeof s->order)
        s->order[s->n++] = (char)body[0];
    return 0;
}

static void frame(kvp_buf *b, char c)
{
    kvp_buf_reset(b);
    size_t off = kvp_frame_begin(b, KVP_OP_REPL_DATA, KVP_FLAG_ONEWAY, 0, 0);
    kvp_buf_u8(b, (uint8_t)c);
    kvp_frame_end(b, off);
}

static int put(kvp_snapfile *f, kvp_buf *b, char c, int part)
{
    frame(b, c);
    return part ? kvp_snapfile_part(f, b->data, b->len) : kvp_snapfile_append(f, b->data, b->len);
}

/* The file's frames, replayed: their letters in order. */
static void replay(const char *path, seen *s)
{
    memset(s, 0, sizeof *s);
    kvp_snapfile *f;
    uint64_t frames;
    char err[256];
    CHECK(kvp_snapfile_open(path, apply, s, &frames, &f, err, sizeof err) == 0);
    kvp_snapfile_close(f);
}

TEST(rewrite_over_turns_keeps_the_changes_in_order)
{
    char dir[] = "/tmp/kvp-snapfile-XXXXXX", path[64], tmp[80];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/index", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    seen s;
    kvp_snapfile *f;
    uint64_t frames;
    char err[256];
    CHECK(kvp_snapfile_open(path, apply, &s, &frames, &f, err, sizeof err) == 0);
    CHECK(put(f, &b, 'a', 0) == 0); /* the old file's content */
    CHECK(put(f, &b, 'b', 0) == 0);

    /* a rewrite over three turns, changes appended between its parts */
    CHECK(kvp_snapfile_begin(f) == 0);
    CHECK(kvp_snapfile_rewriting(f));
    CHECK(put(f, &b, 'S', 1) == 0);
    CHECK(put(f, &b, 'c', 0) == 0);
    CHECK(put(f, &b, 'T', 1) == 0);
    replay(path, &s); /* a crash now: the old file, with every change */
    CHECK(strcmp(s.order, "abc") == 0);
    CHECK(put(f, &b, 'd', 0) == 0);
    CHECK(put(f, &b, 'U', 1) == 0);
    CHECK(kvp_snapfile_commit(f) == 0);
    CHECK(!kvp_snapfile_rewriting(f));
    CHECK(access(tmp, F_OK) != 0);
    CHECK(put(f, &b, 'e', 0) == 0); /* appends go to the new file */
    kvp_snapfile_close(f);
    replay(path, &s);
    CHECK(strcmp(s.order, "ScTdUe") == 0);

    /* abandoned: the file stays as it was, no tmp file */
    CHECK(kvp_snapfile_open(path, apply, &s, &frames, &f, err, sizeof err) == 0);
    CHECK(kvp_snapfile_begin(f) == 0);
    CHECK(put(f, &b, 'V', 1) == 0);
    CHECK(put(f, &b, 'f', 0) == 0);
    kvp_snapfile_abort(f);
    CHECK(access(tmp, F_OK) != 0);
    CHECK(put(f, &b, 'g', 0) == 0);
    kvp_snapfile_close(f);
    replay(path, &s);
    CHECK(strcmp(s.order, "ScTdUefg") == 0);

    kvp_buf_free(&b);
    unlink(path);
    rmdir(dir);
}
