/* snapfile.c -- the master's index on local disk (see snapfile.h). */
#include "master/snapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"
#include "proto/proto.h"

#define MOD "master"
#define FRAME_MAX (16u << 20) /* larger than any REPL_DATA frame the writer makes */

struct kvp_snapfile {
    int fd;
    uint64_t size, base;
    int dirty;  /* appended since the last sync */
    int broken; /* an append failed */
    int tfd;    /* the rewrite in progress (path.tmp), or -1 */
    uint64_t tsize, tbase; /* its bytes; of them, snapshot bytes */
    char path[4096];
};

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Replays [p, p + n): the bytes of whole good frames. */
static uint64_t replay(const uint8_t *p, size_t n, int (*apply)(void *, const uint8_t *, size_t),
                       void *ctx, uint64_t *frames, const char *path)
{
    size_t off = 0;
    while (off < n) {
        kvp_frame_hdr h;
        const uint8_t *body;
        int rc = kvp_frame_next(p + off, n - off, FRAME_MAX, &h, &body);
        if (rc == 1 && h.op == KVP_OP_REPL_DATA && apply(ctx, body, h.body_len) == 0) {
            off += KVP_FRAME_HDR + (size_t)h.body_len;
            (*frames)++;
            continue;
        }
        KVP_WARN(MOD, "%s: %s at byte %zu of %zu: the rest is dropped", path,
                 rc == 0 ? "a torn last frame" : "a bad frame", off, n);
        break;
    }
    return off;
}

int kvp_snapfile_open(const char *path, int (*apply)(void *ctx, const uint8_t *body, size_t len),
                      void *ctx, uint64_t *frames, kvp_snapfile **out, char *err, size_t errlen)
{
    *frames = 0;
    kvp_snapfile *f = kvp_calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    snprintf(f->path, sizeof f->path, "%s", path);
    f->tfd = -1;
    f->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0) {
        snprintf(err, errlen, "snapshot_file %s: %s", path, strerror(errno));
        kvp_snapfile_close(f);
        return KVP_EIO;
    }
    uint64_t good = 0;
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, f->fd, 0);
        if (m == MAP_FAILED) {
            snprintf(err, errlen, "snapshot_file %s: mmap: %s", path, strerror(errno));
            kvp_snapfile_close(f);
            return KVP_EIO;
        }
        good = replay(m, (size_t)st.st_size, apply, ctx, frames, path);
        munmap(m, (size_t)st.st_size);
    }
    if (good < (uint64_t)st.st_size && ftruncate(f->fd, (off_t)good) != 0) {
        snprintf(err, errlen, "snapshot_file %s: truncate: %s", path, strerror(errno));
        kvp_snapfile_close(f);
        return KVP_EIO;
    }
    if (lseek(f->fd, (off_t)good, SEEK_SET) < 0) {
        snprintf(err, errlen, "snapshot_file %s: %s", path, strerror(errno));
        kvp_snapfile_close(f);
        return KVP_EIO;
    }
    f->size = f->base = good;
    *out = f;
    return 0;
}

static void tmp_path(const kvp_snapfile *f, char *tmp, size_t n)
{
    snprintf(tmp, n, "%s.tmp", f->path);
}

int kvp_snapfile_rewriting(const kvp_snapfile *f) { return f->tfd >= 0; }

void kvp_snapfile_abort(kvp_snapfile *f)
{
    if (f->tfd < 0)
        return;
    char tmp[4200];
    tmp_path(f, tmp, sizeof tmp);
    close(f->tfd);
    unlink(tmp);
    f->tfd = -1;
}

int kvp_snapfile_begin(kvp_snapfile *f)
{
    char tmp[4200];
    kvp_snapfile_abort(f);
    tmp_path(f, tmp, sizeof tmp);
    f->tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (f->tfd < 0) {
        KVP_ERROR(MOD, "snapshot_file %s: %s", tmp, strerror(errno));
        return KVP_EIO;
    }
    f->tsize = f->tbase = 0;
    return 0;
}

/* Bytes into the rewrite; its writeback starts now, so that the fdatasync
 * at commit has little left to wait for. 0 or KVP_EIO (the rewrite is
 * abandoned, logged). */
static int tmp_write(kvp_snapfile *f, const void *p, size_t n)
{
    if (write_all(f->tfd, p, n) != 0) {
        KVP_ERROR(MOD, "snapshot_file %s.tmp: write: %s (rewrite abandoned)", f->path,
                  strerror(errno));
        kvp_snapfile_abort(f);
        return KVP_EIO;
    }
    sync_file_range(f->tfd, (off_t)f->tsize, (off_t)n, SYNC_FILE_RANGE_WRITE);
    f->tsize += n;
    return 0;
}

int kvp_snapfile_part(kvp_snapfile *f, const void *p, size_t n)
{
    if (f->tfd < 0)
        return KVP_EIO;
    if (tmp_write(f, p, n) != 0)
        return KVP_EIO;
    f->tbase = f->tsize;
    return 0;
}

int kvp_snapfile_commit(kvp_snapfile *f)
{
    char tmp[4200], dir[4096];
    if (f->tfd < 0)
        return KVP_EIO;
    tmp_path(f, tmp, sizeof tmp);
    if (fdatasync(f->tfd) != 0) {
        KVP_ERROR(MOD, "snapshot_file %s: %s", tmp, strerror(errno));
        kvp_snapfile_abort(f);
        return KVP_EIO;
    }
    if (rename(tmp, f->path) != 0) {
        KVP_ERROR(MOD, "snapshot_file %s: rename: %s", f->path, strerror(errno));
        kvp_snapfile_abort(f);
        return KVP_EIO;
    }
    snprintf(dir, sizeof dir, "%s", f->path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    close(f->fd);
    f->fd = f->tfd; /* the new file, positioned at its end */
    f->tfd = -1;
    f->size = f->tsize;
    f->base = f->tbase;
    f->dirty = f->broken = 0;
    return 0;
}

int kvp_snapfile_append(kvp_snapfile *f, const void *p, size_t n)
{
    if (f->tfd >= 0)
        tmp_write(f, p, n); /* the rewrite gets the changes too, in order */
    if (f->broken)
        return KVP_EIO;
    if (write_all(f->fd, p, n) != 0) {
        KVP_ERROR(MOD, "snapshot_file %s: write: %s (rewritten at the next snapshot)", f->path,
                  strerror(errno));
        f->broken = 1;
        return KVP_EIO;
    }
    f->size += n;
    f->dirty = 1;
    return 0;
}

int kvp_snapfile_rewrite(kvp_snapfile *f, const void *p, size_t n)
{
    if (kvp_snapfile_begin(f) != 0 || kvp_snapfile_part(f, p, n) != 0)
        return KVP_EIO;
    return kvp_snapfile_commit(f);
}

void kvp_snapfile_sync(kvp_snapfile *f)
{
    if (f && f->dirty) {
        fdatasync(f->fd);
        f->dirty = 0;
    }
}

uint64_t kvp_snapfile_size(const kvp_snapfile *f) { return f->size; }
uint64_t kvp_snapfile_base(const kvp_snapfile *f) { return f->base; }
int kvp_snapfile_broken(const kvp_snapfile *f) { return f->broken; }

void kvp_snapfile_close(kvp_snapfile *f)
{
    if (!f)
        return;
    kvp_snapfile_abort(f);
    if (f->fd >= 0) {
        kvp_snapfile_sync(f);
        close(f->fd);
    }
    kvp_free(f);
}
