/*
 * test_segment_prefault.c -- kvp_segment_prefault and kvp_segment_check_size
 * (node/segment.h): creation touches no page; sync faults everything in
 * before it returns; background does it behind the caller, 2 MiB per step,
 * never changing a byte the caller wrote meanwhile; destroy stops it mid-way; off does
 * nothing; sizes the machine cannot back are refused naming the limit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/clock.h"
#include "harness.h"
#include "kvpool.h"
#include "node/segment.h"

#define MiB (1024ull * 1024)

/* Resident pages of [p, p+len) by mincore, as a fraction of the pages. */
static double resident(const uint8_t *p, size_t len)
{
    size_t pages = len / 4096;
    unsigned char *v = malloc(pages);
    if (!v || mincore((void *)p, len, v) != 0) {
        free(v);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < pages; i++)
        n += v[i] & 1;
    free(v);
    return (double)n / (double)pages;
}

TEST(create_touches_nothing_sync_faults_all)
{
    char err[512];
    kvp_segment *s = NULL;
    CHECK_EQ(kvp_segment_create(64 * MiB, "t", &s, err, sizeof err), 0);
    if (!kvp_segment_hugetlb(s)) /* hugetlb pages are reserved, mincore says little */
        CHECK(resident(kvp_segment_base(s), 64 * MiB) < 0.01);
    CHECK_EQ(kvp_segment_faulted(s), 0);
    kvp_segment_prefault(s, KVP_PREFAULT_SYNC);
    CHECK_EQ(kvp_segment_faulted(s), 64 * MiB);
    if (!kvp_segment_hugetlb(s))
        CHECK(resident(kvp_segment_base(s), 64 * MiB) > 0.99);
    kvp_segment_destroy(s);
}

TEST(off_does_nothing)
{
    char err[512];
    kvp_segment *s = NULL;
    CHECK_EQ(kvp_segment_create(16 * MiB, "t", &s, err, sizeof err), 0);
    kvp_segment_prefault(s, KVP_PREFAULT_OFF);
    usleep(50000);
    CHECK_EQ(kvp_segment_faulted(s), 0);
    kvp_segment_destroy(s);
}

/* Bytes written while the background prefault runs over them survive it
 * (it never writes), and it completes. */
TEST(background_keeps_concurrent_writes)
{
    char err[512];
    kvp_segment *s = NULL;
    const uint64_t size = 128 * MiB;
    CHECK_EQ(kvp_segment_create(size, "t", &s, err, sizeof err), 0);
    uint8_t *b = kvp_segment_base(s);
    kvp_segment_prefault(s, KVP_PREFAULT_BACKGROUND);
    /* one byte pattern per 64 KiB, written from the top down while the
     * prefault works from the bottom up: they cross */
    for (uint64_t off = size; off >= 65536; off -= 65536)
        memset(b + off - 65536, (int)((off >> 16) & 0xff) | 1, 4096);
    uint64_t t0 = kvp_now_ms();
    while (kvp_segment_faulted(s) < size && kvp_now_ms() - t0 < 60000)
        usleep(10000);
    CHECK_EQ(kvp_segment_faulted(s), size);
    int bad = 0;
    for (uint64_t off = size; off >= 65536 && !bad; off -= 65536) {
        const uint8_t *q = b + off - 65536;
        for (int i = 0; i < 4096; i++)
            bad |= q[i] != (uint8_t)(((off >> 16) & 0xff) | 1);
        for (int i = 4096; i < 65536; i++)
            bad |= q[i] != 0; /* never written: zero-filled */
    }
    CHECK(!bad);
    kvp_segment_destroy(s);
}

/* The background prefault advances 2 MiB per madvise (segment.h: the
 * process's mmap_lock is held no longer), lowest offsets first: every value
 * kvp_segment_faulted shows is a multiple of 2 MiB and never goes back, and
 * values between the old 32 MiB steps show up. */
TEST(background_steps_of_2mib)
{
    char err[512];
    kvp_segment *s = NULL;
    const uint64_t size = 256 * MiB;
    CHECK_EQ(kvp_segment_create(size, "t", &s, err, sizeof err), 0);
    kvp_segment_prefault(s, KVP_PREFAULT_BACKGROUND);
    uint64_t last = 0, seen = 0, fine = 0, t0 = kvp_now_ms();
    while (last < size && kvp_now_ms() - t0 < 60000) {
        uint64_t f = kvp_segment_faulted(s);
        CHECK(f % (2 * MiB) == 0 && f >= last && f <= size);
        if (f != last) {
            seen++;
            fine += f % (32 * MiB) != 0;
        }
        last = f;
    }
    CHECK_EQ(last, size);
    CHECK(fine > 0);
    printf("  %llu distinct values seen, %llu between 32 MiB steps\n", (unsigned long long)seen,
           (unsigned long long)fine);
    kvp_segment_destroy(s);
}

/* Free 2 MiB huge pages of the default pool (0 when none or unknown). */
static long free_huge_2m(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long fr = 0, sz = 0;
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "HugePages_Free: %ld", &fr);
        sscanf(line, "Hugepagesize: %ld kB", &sz);
    }
    if (f)
        fclose(f);
    return sz == 2048 ? fr : 0;
}

/* A hugetlb segment's background prefault keeps what is written before
 * and meanwhile, and zero-fills the rest. Runs only where 32 free 2 MiB
 * pages exist already (the test never reserves any: that is the machine's
 * setting; `kvpool bench segment --hugetlb` reserves them). */
TEST(background_hugetlb_keeps_concurrent_writes)
{
    const uint64_t size = 64 * MiB;
    if (free_huge_2m() < (long)(size / (2 * MiB)))
        SKIP("fewer than 32 free 2 MiB huge pages (echo N > /proc/sys/vm/nr_hugepages)");
    char err[512];
    kvp_segment *s = NULL;
    CHECK_EQ(kvp_segment_create(size, "t", &s, err, sizeof err), 0);
    if (!kvp_segment_hugetlb(s)) {
        kvp_segment_destroy(s);
        SKIP("the kernel gave regular pages (hugetlb memfds cannot be sealed here)");
    }
    uint8_t *b = kvp_segment_base(s);
    /* written before and while the prefault runs: the top half first */
    memset(b + size - 4096, 0x5a, 4096);
    kvp_segment_prefault(s, KVP_PREFAULT_BACKGROUND);
    for (uint64_t off = size; off >= 2 * MiB; off -= 2 * MiB)
        b[off - 2 * MiB + 17] = (uint8_t)(off >> 21);
    uint64_t t0 = kvp_now_ms();
    while (kvp_segment_faulted(s) < size && kvp_now_ms() - t0 < 60000)
        usleep(1000);
    CHECK_EQ(kvp_segment_faulted(s), size);
    int bad = 0;
    for (uint64_t off = size; off >= 2 * MiB; off -= 2 * MiB) {
        const uint8_t *q = b + off - 2 * MiB;
        bad |= q[17] != (uint8_t)(off >> 21) || q[16] != 0 || q[18] != 0 || q[2 * MiB - 8192] != 0;
    }
    CHECK(!bad);
    CHECK(b[size - 1] == 0x5a && b[size - 4096] == 0x5a);
    kvp_segment_destroy(s);
}

/* destroy in the middle of a background prefault stops it (bounded). */
TEST(destroy_stops_background)
{
    char err[512];
    kvp_segment *s = NULL;
    CHECK_EQ(kvp_segment_create(512 * MiB, "t", &s, err, sizeof err), 0);
    kvp_segment_prefault(s, KVP_PREFAULT_BACKGROUND);
    usleep(20000);
    uint64_t t0 = kvp_now_ms();
    kvp_segment_destroy(s);
    CHECK(kvp_now_ms() - t0 < 5000);
}

TEST(check_size)
{
    char err[512] = "";
    CHECK_EQ(kvp_segment_check_size(4096, err, sizeof err), 0);
    CHECK_EQ(kvp_segment_check_size(64ull << 40, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "segment size 64.0 TiB exceeds the memory this machine can back") != NULL);
    CHECK(strstr(err, "MemTotal") || strstr(err, "memory cgroup limit"));
    kvp_segment *s = NULL;
    CHECK_EQ(kvp_segment_create(64ull << 40, "t", &s, err, sizeof err), KVP_ECONFIG);
    CHECK(s == NULL);
    /* a short buffer is cut, never overrun */
    char small[16];
    CHECK_EQ(kvp_segment_check_size(64ull << 40, small, sizeof small), KVP_ECONFIG);
    CHECK(strlen(small) == sizeof small - 1);
}
