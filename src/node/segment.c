/*
 * segment.c -- one memfd mapped once; see segment.h.
 *
 * Invariants: `base` maps exactly `size` bytes of `fd` MAP_SHARED for the
 * segment's whole life; every page was touched once at creation; `fd` is
 * sealed F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL (its size can never
 * change, so no mapping of it, ours or a client's, can SIGBUS).
 */
#include "node/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"

#define MOD "segment"
#define HUGE_2M (2ull << 20)

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct kvp_segment {
    int fd;
    int hugetlb;
    uint8_t *base;
    uint64_t size;
};

/* Free 2 MiB huge pages in the default pool (0 when unknown). */
static uint64_t free_huge_pages(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long n = 0, psz = 0;
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "HugePages_Free: %llu", &n);
        sscanf(line, "Hugepagesize: %llu kB", &psz);
    }
    fclose(f);
    return psz == 2048 ? n : 0;
}

/* Touches every page so no transfer pays a page fault later. */
static void prefault(uint8_t *base, uint64_t size, uint64_t page)
{
    if (madvise(base, size, MADV_POPULATE_WRITE) == 0)
        return;
    for (uint64_t off = 0; off < size; off += page)
        ((volatile uint8_t *)base)[off] = 0;
}

int kvp_segment_create(uint64_t size, const char *name, kvp_segment **out, char *err,
                       size_t errlen)
{
    if (size == 0 || size > (1ull << 46)) {
        snprintf(err, errlen, "segment size %llu is out of range", (unsigned long long)size);
        return KVP_EINVALID_PARAMS;
    }
    kvp_segment *s = kvp_calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    s->fd = -1;
    const char *nm = name && *name ? name : "kvpool-segment";
    if (size % HUGE_2M == 0 && free_huge_pages() >= size / HUGE_2M) {
        int fd = memfd_create(nm, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
        if (fd >= 0 && ftruncate(fd, (off_t)size) == 0) {
            /* hugetlbfs memfds take seals since Linux 4.16; without them
             * the plain path, never an unsealed fd */
            if (fcntl(fd, F_ADD_SEALS, SEALS) != 0) {
                KVP_WARN(MOD, "cannot seal a hugetlb memfd (%s): using regular pages",
                         strerror(errno));
            } else {
                void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p != MAP_FAILED) {
                    s->fd = fd;
                    s->base = p;
                    s->hugetlb = 1;
                }
            }
        }
        if (!s->base && fd >= 0)
            close(fd);
    }
    if (!s->base) {
        size = (size + 4095) & ~4095ull;
        s->fd = memfd_create(nm, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (s->fd < 0 || ftruncate(s->fd, (off_t)size) != 0) {
            snprintf(err, errlen, "memfd of %llu bytes: %s", (unsigned long long)size,
                     strerror(errno));
            kvp_segment_destroy(s);
            return KVP_ENOMEM;
        }
        if (fcntl(s->fd, F_ADD_SEALS, SEALS) != 0) {
            snprintf(err, errlen, "cannot seal the segment memfd against resizing: %s",
                     strerror(errno));
            kvp_segment_destroy(s);
            return KVP_EIO;
        }
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
        if (p == MAP_FAILED) {
            snprintf(err, errlen, "mmap of %llu bytes: %s", (unsigned long long)size,
                     strerror(errno));
            kvp_segment_destroy(s);
            return KVP_ENOMEM;
        }
        s->base = p;
        madvise(p, size, MADV_HUGEPAGE); /* best effort: shmem THP may be off */
    }
    s->size = size;
    uint64_t t0 = kvp_now_ns();
    prefault(s->base, size, s->hugetlb ? HUGE_2M : 4096);
    uint64_t dt = kvp_now_ns() - t0;
    KVP_INFO(MOD, "segment %llu MiB%s faulted in in %.1f ms (%.2f GB/s)",
             (unsigned long long)(size >> 20), s->hugetlb ? " (hugetlb)" : "", dt / 1e6,
             dt ? (double)size / (double)dt : 0.0);
    *out = s;
    return 0;
}

void kvp_segment_destroy(kvp_segment *s)
{
    if (!s)
        return;
    if (s->base)
        munmap(s->base, s->size);
    if (s->fd >= 0)
        close(s->fd);
    kvp_free(s);
}

uint8_t *kvp_segment_base(const kvp_segment *s) { return s->base; }
uint64_t kvp_segment_size(const kvp_segment *s) { return s->size; }
int kvp_segment_fd(const kvp_segment *s) { return s->fd; }
int kvp_segment_hugetlb(const kvp_segment *s) { return s->hugetlb; }
