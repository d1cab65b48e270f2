/*
 * segment.h -- a storage segment: one memfd, mapped once.
 *
 * Huge pages (MFD_HUGETLB) when the system has free ones, else regular
 * pages with MADV_HUGEPAGE. Faulted in once at creation (first touch of
 * fresh memory is slow: ~0.4 GB/s on small VMs), which is logged, so no
 * transfer pays for page faults. The memfd can be handed to same-host
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

/* size is rounded up to 4 KiB (2 MiB with huge pages). 0 or a negative
 * code with a message in err. */
int kvp_segment_create(uint64_t size, const char *name, kvp_segment **out, char *err,
                       size_t errlen);
void kvp_segment_destroy(kvp_segment *s);
uint8_t *kvp_segment_base(const kvp_segment *s);
uint64_t kvp_segment_size(const kvp_segment *s);
int kvp_segment_fd(const kvp_segment *s);
int kvp_segment_hugetlb(const kvp_segment *s); /* 1 if backed by hugetlbfs pages */
#endif
