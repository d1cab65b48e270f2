/*
 * segment.c -- one memfd mapped once; see segment.h.
 *
 * Invariants: `base` maps exactly `size` bytes of `fd` MAP_SHARED for the
 * segment's whole life; `fd` is sealed F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_SEAL (its size can never change, so no mapping of it, ours or a
 * client's, can SIGBUS). Pages are zero-filled on first touch, by whoever
 * touches them first: the prefault (sync, or its thread) or a transfer.
 * The prefault never writes a byte (MADV_POPULATE_WRITE, else fallocate),
 * so it cannot race with a transfer writing the same page.
 */
#include "node/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"

#define MOD "segment"
#define HUGE_2M (2ull << 20)
/* One madvise of the prefault. It holds the process's mmap_lock (read) that
 * long, and every mmap, munmap and mprotect of the node's process (thread
 * stacks, malloc) waits behind it: 32 MiB steps stalled `kvpool serve`'s
 * start and its requests by 0.1-0.5 s each on a VM whose fresh memory came
 * in at 0.2 GB/s; 2 MiB (one huge page) bounds a step to about 10 ms at
 * that rate. Back to back, though, the next step's read lock is taken
 * ahead of a waiting writer (rwsem readers may steal the lock until the
 * writer has waited a scheduler tick), so in the background the thread
 * sleeps a moment (1 us asked, ~50 us with the default timer slack: ~5 %
 * of a step) after each step: the node's threads then waited at most 1-2
 * ms on the lock, against 5-15 ms without the sleep (perf, mmap_lock
 * tracepoints, bench segment 4 GiB). It keeps its creator's priority: at
 * nice 19 it was preempted inside its madvise and held the lock while
 * waiting for a core (mmaps then waited 10-140 ms), and it starved on a
 * busy machine. Also the stop latency and the granularity of
 * kvp_segment_faulted. */
#define PREFAULT_STEP HUGE_2M

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
    pthread_t th;       /* the background prefault, when th_started */
    int th_started;
    int stop;           /* atomic: the prefault thread stops at its next chunk */
    uint64_t faulted;   /* atomic: bytes [0, faulted) faulted in by the prefault */
};

/* ---------------------------------------------------------------- memory */

/* The /proc/meminfo fields the size check and the huge page choice use (kB
 * there, bytes here); all 0 when it cannot be read. */
typedef struct meminfo {
    uint64_t total, avail, swap_total, swap_free, hugetlb, huge_free, huge_size;
} meminfo;

static void read_meminfo(meminfo *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &v) == 1)
            m->total = v << 10;
        else if (sscanf(line, "MemAvailable: %llu kB", &v) == 1)
            m->avail = v << 10;
        else if (sscanf(line, "SwapTotal: %llu kB", &v) == 1)
            m->swap_total = v << 10;
        else if (sscanf(line, "SwapFree: %llu kB", &v) == 1)
            m->swap_free = v << 10;
        else if (sscanf(line, "Hugetlb: %llu kB", &v) == 1)
            m->hugetlb = v << 10;
        else if (sscanf(line, "HugePages_Free: %llu", &v) == 1)
            m->huge_free = v;
        else if (sscanf(line, "Hugepagesize: %llu kB", &v) == 1)
            m->huge_size = v << 10;
    }
    fclose(f);
}

/* Free 2 MiB huge pages in the default pool (0 when unknown). */
static uint64_t free_huge_pages(const meminfo *m)
{
    return m->huge_size == HUGE_2M ? m->huge_free : 0;
}

/* A limit file of a memory cgroup: a number of bytes, or "max" / a huge
 * value (no limit: UINT64_MAX). UINT64_MAX when unreadable too. */
static uint64_t read_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return UINT64_MAX;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok && v < (1ull << 62) ? v : UINT64_MAX;
}

/*
 * The tightest memory limit of this process's memory cgroup and its
 * ancestors (v2 memory.max, v1 memory.limit_in_bytes), with the file that
 * set it in `where`; UINT64_MAX when none. A path of /proc/self/cgroup
 * that is not under the mounted hierarchy (another cgroup namespace) only
 * finds the files it can: the mount's own root is always looked at.
 */
static uint64_t cgroup_limit(char *where, size_t wl)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return UINT64_MAX;
    uint64_t best = UINT64_MAX;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        const char *ctl = c1 + 1, *fmt;
        if (!*ctl)
            fmt = "/sys/fs/cgroup%s/memory.max"; /* v2 */
        else if (strstr(ctl, "memory"))
            fmt = "/sys/fs/cgroup/memory%s/memory.limit_in_bytes"; /* v1 */
        else
            continue;
        char dir[3072];
        snprintf(dir, sizeof dir, "%s", c2 + 1);
        for (;;) {
            size_t n = strlen(dir);
            while (n > 0 && dir[n - 1] == '/')
                dir[--n] = 0;
            char path[3200];
            snprintf(path, sizeof path, fmt, dir);
            uint64_t v = read_limit(path);
            if (v < best) {
                best = v;
                snprintf(where, wl, "%s", path);
            }
            char *slash = strrchr(dir, '/');
            if (!n || !slash)
                break;
            *slash = 0;
        }
    }
    fclose(f);
    return best;
}

/* kvp_segment_check_size; warn: also the warning above MemAvailable (create
 * only, so a CLI that checked first does not print it twice). */
static int check_size(uint64_t size, char *err, size_t errlen, int warn)
{
    meminfo m;
    read_meminfo(&m);
    if (!m.total)
        return 0; /* no /proc/meminfo: nothing to compare with */
    char a[32], b[32], c[32], d[32];
    /* huge pages: create uses them when enough are free, else regular pages */
    if (size % HUGE_2M == 0 && free_huge_pages(&m) >= size / HUGE_2M)
        return 0;
    uint64_t ram = m.total > m.hugetlb ? m.total - m.hugetlb : 0;
    char where[3200] = "";
    uint64_t cg = cgroup_limit(where, sizeof where);
    uint64_t limit = (cg < ram ? cg : ram) + m.swap_total;
    if (size > limit) {
        int n = snprintf(err, errlen, "segment size %s exceeds the memory this machine can back (",
                         kvp_size_format(size, a, sizeof a));
        if (n < 0 || (size_t)n >= errlen)
            return KVP_ECONFIG;
        if (cg < ram)
            n += snprintf(err + n, errlen - (size_t)n, "memory cgroup limit %s in %s",
                          kvp_size_format(cg, b, sizeof b), where);
        else
            n += snprintf(err + n, errlen - (size_t)n, "MemTotal %s%s%s",
                          kvp_size_format(m.total, b, sizeof b),
                          m.hugetlb ? " less huge pages " : "",
                          m.hugetlb ? kvp_size_format(m.hugetlb, d, sizeof d) : "");
        if ((size_t)n < errlen)
            snprintf(err + n, errlen - (size_t)n, ", swap %s): global_segment_size "
                     "(--segment-size) may be at most %s",
                     kvp_size_format(m.swap_total, c, sizeof c),
                     kvp_size_format(limit, d, sizeof d));
        return KVP_ECONFIG;
    }
    uint64_t now = m.avail + m.swap_free;
    if (warn && m.avail && size > now)
        KVP_WARN(MOD, "segment size %s exceeds the memory available now (MemAvailable %s, free "
                      "swap %s): other processes hold the rest; filling the segment may swap or "
                      "end in the OOM killer",
                 kvp_size_format(size, a, sizeof a), kvp_size_format(m.avail, b, sizeof b),
                 kvp_size_format(m.swap_free, c, sizeof c));
    return 0;
}

int kvp_segment_check_size(uint64_t size, char *err, size_t errlen)
{
    return check_size(size, err, errlen, 0);
}

/* -------------------------------------------------------------- prefault */

/* Faults [off, off+len) in without writing a byte: MADV_POPULATE_WRITE
 * (Linux 5.14), else fallocate on the memfd (allocates the pages; the
 * mapping's page tables then fill on first touch). Not fallocate for
 * hugetlb pages although it would zero them without our mmap_lock: it
 * holds the memfd's inode lock, which every client's mmap of the segment
 * takes, so fresh clients' attaches waited 20-70 ms behind it on slow
 * memory. 0 or an errno. */
static int fault_range(kvp_segment *s, uint64_t off, uint64_t len)
{
    if (madvise(s->base + off, len, MADV_POPULATE_WRITE) == 0)
        return 0;
    int e = errno;
    if (e != EINVAL)
        return e;
    if (fallocate(s->fd, 0, (off_t)off, (off_t)len) == 0)
        return 0;
    return errno;
}

/* The prefault loop, lowest offsets first (where the master's allocator
 * places first), a short sleep after each step when `pause` (in the
 * background). Stops early on s->stop or an error; logs its progress
 * (every 10 s, every 2 s on a terminal) and its end. */
static void prefault_run(kvp_segment *s, const char *how, int pause)
{
    char a[32], b[32];
    uint64_t t0 = kvp_now_ns(), last = t0;
    uint64_t every = (isatty(2) ? 2ull : 10ull) * 1000000000ull;
    KVP_INFO(MOD, "faulting in %s%s %s", kvp_size_format(s->size, a, sizeof a),
             s->hugetlb ? " (hugetlb)" : "", how);
    uint64_t off = 0;
    int e = 0;
    while (off < s->size && !__atomic_load_n(&s->stop, __ATOMIC_RELAXED)) {
        uint64_t len = s->size - off < PREFAULT_STEP ? s->size - off : PREFAULT_STEP;
        if ((e = fault_range(s, off, len)) != 0)
            break;
        off += len;
        __atomic_store_n(&s->faulted, off, __ATOMIC_RELEASE);
        if (pause) { /* a waiting mmap takes the lock now: see PREFAULT_STEP */
            struct timespec ts = {0, 1000};
            nanosleep(&ts, NULL);
        }
        uint64_t now = kvp_now_ns();
        if (now - last >= every && off < s->size) {
            last = now;
            KVP_INFO(MOD, "faulting in: %s of %s (%.0f %%), %.2f GB/s",
                     kvp_size_format(off, a, sizeof a), kvp_size_format(s->size, b, sizeof b),
                     100.0 * (double)off / (double)s->size, (double)off / (double)(now - t0));
        }
    }
    uint64_t dt = kvp_now_ns() - t0;
    if (e)
        KVP_WARN(MOD, "faulting in stopped at %s of %s: %s (transfers fault the rest in "
                      "themselves; is the machine out of memory?)",
                 kvp_size_format(off, a, sizeof a), kvp_size_format(s->size, b, sizeof b),
                 strerror(e));
    else if (off == s->size)
        KVP_INFO(MOD, "segment %s%s faulted in in %.1f s (%.2f GB/s)",
                 kvp_size_format(s->size, a, sizeof a), s->hugetlb ? " (hugetlb)" : "",
                 dt / 1e9, dt ? (double)s->size / (double)dt : 0.0);
}

static void *prefault_main(void *arg)
{
    prefault_run(arg, "in the background", 1);
    return NULL;
}

void kvp_segment_prefault(kvp_segment *s, kvp_segment_prefault_mode mode)
{
    if (mode == KVP_PREFAULT_OFF || s->th_started)
        return;
    if (mode == KVP_PREFAULT_SYNC) {
        prefault_run(s, "before serving", 0);
        return;
    }
    if (pthread_create(&s->th, NULL, prefault_main, s) != 0) {
        KVP_WARN(MOD, "cannot start the prefault thread: transfers fault pages in themselves");
        return;
    }
    s->th_started = 1;
}

uint64_t kvp_segment_faulted(const kvp_segment *s)
{
    return __atomic_load_n(&s->faulted, __ATOMIC_ACQUIRE);
}

/* ---------------------------------------------------------------- create */

int kvp_segment_create(uint64_t size, const char *name, kvp_segment **out, char *err,
                       size_t errlen)
{
    if (size == 0 || size > (1ull << 46)) {
        snprintf(err, errlen, "segment size %llu is out of range", (unsigned long long)size);
        return KVP_EINVALID_PARAMS;
    }
    int rc = check_size(size, err, errlen, 1);
    if (rc)
        return rc;
    kvp_segment *s = kvp_calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    s->fd = -1;
    const char *nm = name && *name ? name : "kvpool-segment";
    meminfo m;
    read_meminfo(&m);
    if (size % HUGE_2M == 0 && free_huge_pages(&m) >= size / HUGE_2M) {
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
    KVP_DEBUG(MOD, "segment %llu MiB%s created", (unsigned long long)(size >> 20),
              s->hugetlb ? " (hugetlb)" : "");
    *out = s;
    return 0;
}

void kvp_segment_destroy(kvp_segment *s)
{
    if (!s)
        return;
    if (s->th_started) {
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
        pthread_join(s->th, NULL);
    }
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
