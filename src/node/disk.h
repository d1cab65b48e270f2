/*
 * disk.h -- a storage node's SSD tier: objects kept in log-structured page
 * files on local disk, written with O_DIRECT, found again after a restart.
 *
 * Layout: under `dir`, page files kvpool-page-<16 hex id>.log of page_size
 * bytes (64 MiB .. 1 GiB, default 128 MiB), each a 4 KiB page header and
 * then records, appended in order, every one 4 KiB aligned:
 *   header  magic "KVPR", version, flags (TOMBSTONE), key and tenant
 *           lengths, value size, the object's end-to-end checksum (XXH3-64
 *           of the value, as the master knows it), a sequence number, a
 *           checksum of the header, then the key and tenant bytes
 *   value   the bytes, right after the header; the record zero-padded to
 *           4 KiB (a small value costs one block, not two)
 * A remove appends a tombstone (a header-only record): after a restart a
 * record is live when no record of the same key has a higher sequence (nor
 * is a tombstone of the same one). Sequences are unique and increasing (a
 * reopened store continues above every one it found), so a sequence names
 * one record: kvp_disk_forget removes a record by it.
 *
 * Writes are asynchronous: kvp_disk_write copies the value into the
 * writer's staging memory (bounded by staging_budget: beyond it the answer
 * is KVP_ENO_AVAILABLE_HANDLE, -200, the caller's cue to back off) and
 * returns; a writer thread appends the records in queue order, keeping
 * io_depth writes in flight (io_uring through liburing where the kernel
 * allows it, else pwrite one after the other), and gives a value's staging
 * memory back once its write has finished; a syncer thread makes what has
 * been written durable in groups (group commit: one fdatasync of each page
 * file written, issued at once, while the next writes go on), and only
 * then indexes the records and calls on_durable, in queue order: a record
 * is never readable, nor reported, before it is durable, and a later write
 * of a key replaces an earlier one.
 *
 * Reads are synchronous on the caller's thread (pread, O_DIRECT, through a
 * bounded pool of aligned buffers), verify the value against its checksum
 * and never return a wrong byte: a mismatch drops the record (on_dropped;
 * a tombstone keeps it dropped across a restart) and is
 * KVP_ECHECKSUM_MISMATCH.
 *
 * Space: at most `capacity` bytes of page files. Past high_watermark the
 * least recently used pages (by their last write or read; never one with
 * writes still in flight) are dropped whole down to low_watermark, their
 * live records reported (on_dropped). What was dropped stays gone across a
 * restart: where another page still holds an older copy of a dropped
 * record's key (an older value, a record a removed tombstone had killed),
 * a tombstone of the record's sequence is written into the open page first,
 * and the dropped page's file is deleted once that is durable.
 * Pages mostly dead are compacted: kvp_disk_tick moves at most `budget`
 * bytes of live records per call into the open page, then deletes the
 * page.
 *
 * Restart: kvp_disk_open scans every page (headers and their checksums;
 * in the page that was open when the node stopped, values too, so a torn
 * last record is found) and rebuilds the index; kvp_disk_each lists the
 * live records so the node can register them with the master again.
 *
 * Thread-safe: any number of threads may call write / read / remove / stats
 * at once; callbacks run with no lock of this module held, on the syncer
 * thread: on_durable (in queue order) and on_dropped for pages dropped for
 * room (a drop is reported before the on_durable of any record indexed
 * after it, and never reports a record before its on_durable); on_dropped
 * for a checksum failure runs on the reader's thread.
 */
#ifndef KVP_DISK_H
#define KVP_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct kvp_disk kvp_disk;

/* A record as callers see it: tenant and key point into the module's memory
 * for the duration of the callback only. */
typedef struct kvp_disk_rec {
    const uint8_t *tenant;
    uint32_t tenant_len;
    const uint8_t *key;
    uint32_t key_len;
    uint64_t size;
    uint64_t csum;
    uint64_t seq;
} kvp_disk_rec;

enum { KVP_DISK_IO_AUTO = 0, KVP_DISK_IO_URING = 1, KVP_DISK_IO_PWRITE = 2 };

typedef struct kvp_disk_opts {
    const char *dir;          /* created if missing (0700) */
    uint64_t capacity;        /* bytes of page files at most (>= 2 pages) */
    uint64_t page_size;       /* 0 = 128 MiB; 64 MiB .. 1 GiB, 4 KiB multiple */
    double high_watermark;    /* 0 = 0.95: above this share of capacity, drop pages */
    double low_watermark;     /* 0 = 0.85: ... down to this share */
    uint64_t staging_budget;  /* 0 = 256 MiB: bytes waiting to be written (also
                                 the most bytes of written records waiting
                                 for their fdatasync: only their headers
                                 stay in memory) */
    uint64_t read_budget;     /* 0 = 64 MiB: aligned read buffers in use at once */
    int io;                   /* KVP_DISK_IO_* */
    int io_depth;             /* 0 = 32: writes in flight (io_uring) */
    int direct;               /* 0 = O_DIRECT (refused by the filesystem: buffered, logged);
                                 -1 = buffered I/O (tests on tmpfs) */
    /* A write finished: status 0 (durable and indexed), or < 0 (the record
     * is not on disk: KVP_EIO, KVP_ENO_AVAILABLE_HANDLE when the disk is
     * full). cookie is kvp_disk_write's. */
    void (*on_durable)(void *arg, const kvp_disk_rec *r, void *cookie, int status);
    /* Records that left the tier without a remove: pages dropped for room,
     * records found corrupt on a read. */
    void (*on_dropped)(void *arg, const kvp_disk_rec *r, size_t n);
    void *arg;
} kvp_disk_opts;

/* Opens (scanning what `dir` holds). 0, or KVP_ECONFIG / KVP_EIO with the
 * reason in err. */
int kvp_disk_open(const kvp_disk_opts *o, kvp_disk **out, char *err, size_t errlen);
/* Waits for queued writes (made durable, their callbacks run), then closes. */
void kvp_disk_close(kvp_disk *d);

/* Calls fn for every live record (after open: what to register again), with
 * the module's lock held: fn must not call into this module. */
void kvp_disk_each(kvp_disk *d, void (*fn)(void *arg, const kvp_disk_rec *r), void *arg);

/* Queues value v[0..n) (size bytes in all, csum its XXH3-64 as the master
 * knows it) for writing; the caller's memory is free on return. 0, or
 * KVP_ENO_AVAILABLE_HANDLE (staging full or the disk full: retry later),
 * KVP_EINVALID_PARAMS, KVP_ENOMEM. A later record of the same key replaces
 * an earlier one once durable. */
int kvp_disk_write(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                   uint32_t klen, uint64_t csum, const struct iovec *v, int n, uint64_t size,
                   void *cookie);

/* Reads a live record's value into dst (cap bytes). Its size (>= 0), or
 * KVP_EOBJECT_NOT_FOUND, KVP_EBUFFER_OVERFLOW, KVP_ECHECKSUM_MISMATCH (the
 * record is dropped), KVP_EIO. csum (may be NULL) gets the record's. */
int64_t kvp_disk_read(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                      uint32_t klen, void *dst, uint64_t cap, uint64_t *csum);

/* Removes a record (a tombstone is written). 0 or KVP_EOBJECT_NOT_FOUND. */
int kvp_disk_remove(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                    uint32_t klen);

/* A record's id as the master knows it (proto.h `rec`): the low 32 bits of
 * its sequence. */
static inline uint32_t kvp_disk_rec_id(uint64_t seq) { return (uint32_t)seq; }

/* Removes the key's live record only if it is the one named: its id is
 * rec and its size and checksum are size and csum. The tombstone carries
 * that record's own sequence, so it kills no other record of the key --
 * not a newer one already queued (written later, indexed later), nor one
 * seen again by a restart's scan. 0 removed; 1 the key's live record is
 * another one: nothing done; KVP_EOBJECT_NOT_FOUND no live record;
 * KVP_EINVALID_PARAMS, KVP_ENOMEM. */
int kvp_disk_forget(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                    uint32_t klen, uint32_t rec, uint64_t size, uint64_t csum);

/* Bounded background work: compaction of at most budget bytes. Returns the
 * bytes moved. */
uint64_t kvp_disk_tick(kvp_disk *d, uint64_t budget);
/* Waits until every write queued before the call has finished. */
void kvp_disk_flush(kvp_disk *d);
/* Holds the writer (on) or lets it go: tests of a writer that falls behind. */
void kvp_disk_pause(kvp_disk *d, int on);

typedef struct kvp_disk_stats {
    uint64_t capacity, used, live_bytes, records, pages;
    uint64_t writes, write_bytes, write_errors, pressure; /* -200 answers */
    uint64_t reads, read_bytes, read_misses, corrupt;
    uint64_t dropped_pages, dropped_records, compacted_pages, compacted_bytes;
    uint64_t scan_records, scan_torn, scan_ms;
    const char *io;                                      /* "io_uring" or "pwrite" */
} kvp_disk_stats;
void kvp_disk_get_stats(kvp_disk *d, kvp_disk_stats *out);

/* Record header codec (the scan's parser; fuzzed). kvp_disk_hdr_parse
 * checks a header block of len bytes read at a record start: 0 with the
 * record's fields and total length (header + value, aligned), or -1. */
#define KVP_DISK_ALIGN 4096u
#define KVP_DISK_HDR_FIXED 48u
typedef struct kvp_disk_hdr {
    uint32_t flags, key_len, tenant_len;
    uint64_t size, csum, seq;
    const uint8_t *key, *tenant;
    uint64_t hdr_len; /* fixed part + key + tenant: the value starts here */
    uint64_t total;   /* header + value, aligned */
} kvp_disk_hdr;
#define KVP_DISK_TOMBSTONE 0x1u
#define KVP_DISK_MAX_KEY 65536u
#define KVP_DISK_MAX_TENANT 255u
int kvp_disk_hdr_parse(const uint8_t *p, size_t len, kvp_disk_hdr *h);
/* Writes h's header (fixed part, key, tenant) at p; returns its length.
 * Bytes after it (the value) are not touched. */
size_t kvp_disk_hdr_encode(uint8_t *p, const kvp_disk_hdr *h);
#endif
