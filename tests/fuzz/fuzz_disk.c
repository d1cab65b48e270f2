/*
 * fuzz_disk.c -- the SSD tier's parsers (node/disk.h) against arbitrary
 * bytes: the record header codec, a page's records as a restart scans them,
 * and a page's index file.
 *
 * Input: byte 0 chooses the target, the rest is its bytes:
 *   0  kvp_disk_hdr_parse: on success the key and tenant lie inside the
 *      input, the lengths are in range, the header re-encodes to the same
 *      bytes (canonical) and parses again to the same fields;
 *   1  a page file: a valid page header, then the bytes, scanned by
 *      kvp_disk_open (values verified: no index file);
 *   2  an index file of that page: magic and page id right, the bytes,
 *      then a correct checksum over them (so the parser itself is reached).
 * Invariants for 1 and 2: open succeeds, every record it indexed lies in
 * the page and reads back as a value matching its checksum, or as
 * CHECKSUM_MISMATCH / EIO (an index may point at bytes that are not the
 * record): never a crash, a hang or a leak.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/log.h"
#include "kvpool.h"
#include "node/disk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PAGE (1u << 20)

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static char g_dir[64];
static kvp_disk *g_d;
static int g_bad;

static void clean(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char p[128];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
}

static void write_file(const char *name, const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return;
    if (write(fd, a, al) != (ssize_t)al || (bl && write(fd, b, bl) != (ssize_t)bl))
        al = 0;
    close(fd);
}

typedef struct keys {
    uint8_t k[64][64];
    uint32_t kl[64], tl[64];
    uint8_t t[64][256];
    int n;
} keys;

static void collect(void *arg, const kvp_disk_rec *r)
{
    keys *ks = arg;
    if (ks->n >= 64 || r->key_len > 64)
        return;
    memcpy(ks->k[ks->n], r->key, r->key_len);
    memcpy(ks->t[ks->n], r->tenant, r->tenant_len);
    ks->kl[ks->n] = r->key_len;
    ks->tl[ks->n++] = r->tenant_len;
    if (r->size > PAGE) /* a record larger than its page was indexed */
        g_bad = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    kvp_log_set_level(KVP_LOG_OFF);
    int mode = data[0] % 3;
    data++;
    size--;
    if (mode == 0) {
        kvp_disk_hdr h;
        if (kvp_disk_hdr_parse(data, size, &h) != 0)
            return 0;
        if (h.key < data || h.tenant + h.tenant_len > data + size || h.key_len == 0 ||
            h.key_len > KVP_DISK_MAX_KEY || h.tenant_len > KVP_DISK_MAX_TENANT ||
            h.hdr_len != KVP_DISK_HDR_FIXED + h.key_len + h.tenant_len ||
            h.total % KVP_DISK_ALIGN || h.total < h.hdr_len + h.size)
            abort();
        uint8_t *b = malloc(h.hdr_len + 1);
        if (!b)
            return 0;
        size_t hl = kvp_disk_hdr_encode(b, &h);
        size_t fixed = KVP_DISK_HDR_FIXED + h.key_len + h.tenant_len;
        kvp_disk_hdr g;
        if (hl != h.hdr_len || memcmp(b, data, fixed) != 0 || kvp_disk_hdr_parse(b, hl, &g) != 0 ||
            g.seq != h.seq || g.size != h.size || g.csum != h.csum)
            abort();
        free(b);
        return 0;
    }
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/kvp-fuzz-disk-XXXXXX");
        if (!mkdtemp(g_dir))
            return 0;
    }
    clean();
    uint8_t ph[4096] = {0};
    memcpy(ph, "KVPPAGE1", 8);
    put64(ph + 8, 1);
    put64(ph + 16, PAGE);
    put64(ph + 24, XXH3_64bits(ph, 24));
    size_t body = size < PAGE - 4096 ? size : PAGE - 4096;
    if (mode == 1) {
        write_file("kvpool-page-0000000000000001.log", ph, sizeof ph, data, body);
    } else {
        write_file("kvpool-page-0000000000000001.log", ph, sizeof ph, NULL, 0);
        uint8_t *ix = malloc(24 + size + 8);
        if (!ix)
            return 0;
        memcpy(ix, "KVPIDX01", 8);
        put64(ix + 8, 1);
        memcpy(ix + 16, data, size < 8 ? size : 8); /* the count comes from the input */
        if (size < 8)
            memset(ix + 16 + size, 0, 8 - size);
        size_t rest = size > 8 ? size - 8 : 0;
        memcpy(ix + 24, data + (size - rest), rest);
        put64(ix + 24 + rest, XXH3_64bits(ix, 24 + rest));
        write_file("kvpool-page-0000000000000001.idx", ix, 24 + rest + 8, NULL, 0);
        free(ix);
    }
    kvp_disk_opts o = {.dir = g_dir, .capacity = 4 * PAGE, .page_size = PAGE,
                       .staging_budget = 4u << 20, .direct = -1, .io = KVP_DISK_IO_PWRITE};
    char err[256];
    if (kvp_disk_open(&o, &g_d, err, sizeof err) != 0)
        abort(); /* a damaged page is never a reason to refuse to start */
    keys *ks = calloc(1, sizeof *ks);
    if (ks)
        kvp_disk_each(g_d, collect, ks);
    static uint8_t buf[PAGE];
    for (int i = 0; ks && i < ks->n; i++) {
        int64_t n = kvp_disk_read(g_d, ks->t[i], ks->tl[i], ks->k[i], ks->kl[i], buf, PAGE, NULL);
        if (!(n >= 0 || n == KVP_ECHECKSUM_MISMATCH || n == KVP_EIO ||
              n == KVP_EOBJECT_NOT_FOUND || n == KVP_EBUFFER_OVERFLOW))
            abort();
    }
    free(ks);
    kvp_disk_close(g_d);
    g_d = NULL;
    if (g_bad)
        abort();
    return 0;
}
