/*
 * snapfile.h -- the master's index on local disk, for a warm restart
 * (kvp_snapfile_*; config key snapshot_file).
 *
 * The file is the index stream of ha/repl.h written to disk: REPL_DATA
 * frames, a snapshot (RESET .. SYNCED) followed by the changes journaled
 * since, appended once per loop turn. Replaying it in order rebuilds what
 * the master listed when it last wrote; records are states, so a torn last
 * frame (a crash mid-write) is simply dropped. The file is rewritten from a
 * fresh snapshot when the changes outgrow it (tmp file, fsync, rename, fsync
 * of the directory): the rename is atomic, so a crash leaves the old file or
 * the new one. The rewrite is spread over loop turns (begin, a part of the
 * snapshot per turn, commit): meanwhile appends go to both files, in the
 * order they were made, which a snapshot cut across turns needs
 * (master.c); memory: one turn's part. Appends are fdatasync'ed by kvp_snapfile_sync (once a second
 * by the service): a process crash loses nothing written, a machine crash at
 * most that second.
 *
 * One thread (the master's loop, or before it runs).
 */
#ifndef KVP_SNAPFILE_H
#define KVP_SNAPFILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_snapfile kvp_snapfile;

/* Opens (creating) path and replays what it holds: apply() gets every
 * REPL_DATA body in order; a torn or malformed tail is dropped (logged) and
 * the file is cut back to the last good frame. 0, or KVP_EIO /
 * KVP_ENOMEM with a message in err. *frames: the frames replayed. */
int kvp_snapfile_open(const char *path, int (*apply)(void *ctx, const uint8_t *body, size_t len),
                      void *ctx, uint64_t *frames, kvp_snapfile **out, char *err, size_t errlen);
/* Appends frames. 0 or KVP_EIO (logged once; the file is then rewritten by
 * the next kvp_snapfile_rewrite). */
int kvp_snapfile_append(kvp_snapfile *f, const void *p, size_t n);
/* Replaces the whole file by p (a snapshot). 0 or KVP_EIO (the old file stays). */
int kvp_snapfile_rewrite(kvp_snapfile *f, const void *p, size_t n);
/* The same over many calls: begin (a new path.tmp; a rewrite in progress
 * is abandoned), part (snapshot bytes, in order), commit (fdatasync,
 * rename, the new file takes the appends). 0 or KVP_EIO (logged; the
 * rewrite is abandoned, the old file stays). abort drops it. */
int kvp_snapfile_begin(kvp_snapfile *f);
int kvp_snapfile_part(kvp_snapfile *f, const void *p, size_t n);
int kvp_snapfile_commit(kvp_snapfile *f);
void kvp_snapfile_abort(kvp_snapfile *f);
int kvp_snapfile_rewriting(const kvp_snapfile *f);
/* fdatasync when something was appended since the last. */
void kvp_snapfile_sync(kvp_snapfile *f);
/* Bytes in the file now, and right after the last rewrite. */
uint64_t kvp_snapfile_size(const kvp_snapfile *f);
uint64_t kvp_snapfile_base(const kvp_snapfile *f);
/* Whether an append failed since the last rewrite. */
int kvp_snapfile_broken(const kvp_snapfile *f);
/* Syncs and closes. */
void kvp_snapfile_close(kvp_snapfile *f);

#endif
