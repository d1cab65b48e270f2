/*
 * segment.h -- a storage segment: one memfd, mapped once.
 *
 * Huge pages (MFD_HUGETLB) when the system has free ones, else regular
 * pages with MADV_HUGEPAGE. Creation touches no page: first touch of fresh
 * memory is slow (~0.3 GB/s on small VMs, 14 s for 4 GiB), so the owner
 * chooses when the pages are faulted in (kvp_segment_prefault): before
 * serving, behind the first requests, or never (each page on first use).
 * A page not yet faulted in reads as zeros, like any fresh memfd page, so
 * the choice changes timing only, never bytes. The memfd can be handed to same-host
 * clients (SCM_RIGHTS) who map it themselves: a same-host put or get is
 * then one memcpy. The memfd is sealed against shrinking and growing
 * (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so a client cannot make the
 * node's or another client's mapping fault; it is not sealed against
 * writes: whoever holds it can read and write the whole segment, and punch
 * holes in it (fallocate PUNCH_HOLE, MADV_REMOVE: they need no more than a
 * writable mapping, and F_SEAL_WRITE / F_SEAL_FUTURE_WRITE, which refuse
 * them, refuse every later writable mapping too). A hole reads as zeros:
 * corrupt values, caught by the readers' checksums (test_attack_memfd).
 */
#ifndef KVP_SEGMENT_H
#define KVP_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_segment kvp_segment;

/*
 * Whether this machine can back a segment of `size` bytes: refused
 * (KVP_ECONFIG, a message naming the limit in err) above what it could
 * ever hold -- MemTotal less the huge page pool, or the memory cgroup's
 * limit (memory.max / memory.limit_in_bytes of it and its ancestors) when
 * lower, plus SwapTotal -- unless enough free 2 MiB huge pages back it
 * (create then uses them). 0 when /proc/meminfo is unreadable. Create
 * checks the same, and also warns above MemAvailable + SwapFree (allowed:
 * other processes hold the rest now).
 */
int kvp_segment_check_size(uint64_t size, char *err, size_t errlen);

/* size is rounded up to 4 KiB (2 MiB with huge pages); kvp_segment_check_size
 * first. No page is touched. 0 or a negative code with a message in err. */
int kvp_segment_create(uint64_t size, const char *name, kvp_segment **out, char *err,
                       size_t errlen);
/* Stops and joins a background prefault first. */
void kvp_segment_destroy(kvp_segment *s);

/*
 * When the pages are faulted in (config key segment_prefault):
 *   OFF         never: each page on first touch by a transfer;
 *   BACKGROUND  a thread faults them in, lowest offsets first (where the
 *               master allocates first), 2 MiB per madvise with a short
 *               sleep after each (the process's mmap_lock is held no
 *               longer, and a waiting mmap gets it in between), and returns
 *               at once; transfers meanwhile fault what they touch
 *               themselves. It runs at the caller's priority (see
 *               segment.c: a lower one made mmaps wait longer);
 *   SYNC        before returning (the node serves once all are in).
 * Faulting in early finds an overcommitted machine at start rather than at
 * the first full pool, and keeps later transfers free of page faults. It
 * never writes a byte (MADV_POPULATE_WRITE, else fallocate on the memfd),
 * so it cannot race with transfers. Logged at INFO: start, progress every
 * 10 s (2 s on a terminal), end with GB/s; a failure (out of memory) is a
 * warning and stops it. Called once, after create.
 */
typedef enum kvp_segment_prefault_mode {
    KVP_PREFAULT_OFF,
    KVP_PREFAULT_BACKGROUND,
    KVP_PREFAULT_SYNC,
} kvp_segment_prefault_mode;
void kvp_segment_prefault(kvp_segment *s, kvp_segment_prefault_mode mode);
/* Bytes [0, n) the prefault has faulted in so far (tests, stat; 2 MiB
 * steps). */
uint64_t kvp_segment_faulted(const kvp_segment *s);
uint8_t *kvp_segment_base(const kvp_segment *s);
uint64_t kvp_segment_size(const kvp_segment *s);
int kvp_segment_fd(const kvp_segment *s);
int kvp_segment_hugetlb(const kvp_segment *s); /* 1 if backed by hugetlbfs pages */
#endif
