/*
 * fuzz_repl.c -- the leader -> standby index stream (ha/repl.h) against
 * arbitrary REPL_DATA bodies, as a hostile or broken leader could send them
 * to a standby.
 *
 * Invariants checked (abort on violation): kvp_repl_check answers 0 or
 * KVP_EPROTOCOL; a body it accepts re-encodes, record by record through
 * kvp_repl_wr, to exactly the same bytes (one canonical encoding); a
 * standby's kvp_master_repl_apply agrees with the check (EPROTOCOL for a
 * refused body, and then nothing applied; else 0, KVP_ENOMEM or
 * KVP_ELIMIT), the master stays consistent (kvp_master_check), and the
 * same body applied twice leaves the same parked count (records are
 * idempotent); nothing leaks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "ha/repl.h"
#include "kvpool.h"
#include "master/master.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_roundtrip(const uint8_t *data, size_t size)
{
    kvp_repl_rd it;
    uint64_t seq;
    if (kvp_repl_open(&it, data, size, &seq) != 0)
        abort();
    kvp_buf out;
    kvp_buf_init(&out, size + 4096);
    kvp_repl_wr w = {.out = &out};
    kvp_repl_rec r;
    while (kvp_repl_next(&it, &r) == 1)
        kvp_repl_wr_add(&w, &r, seq); /* inputs < KVP_REPL_FRAME: one frame */
    kvp_repl_wr_close(&w);
    if (out.len && (out.err || out.len != KVP_FRAME_HDR + size ||
                    memcmp(out.data + KVP_FRAME_HDR, data, size) != 0))
        abort();
    kvp_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int ok = kvp_repl_check(data, size);
    if (ok != 0 && ok != KVP_EPROTOCOL)
        abort();
    if (ok == 0)
        check_roundtrip(data, size);
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    cfg.max_segments = 16;
    kvp_master *m;
    if (kvp_master_create(&cfg, 1000, &m) != 0)
        return 0;
    uint64_t seq = 0, st[KVP_STAT__COUNT];
    int rc = kvp_master_repl_apply(m, data, size, &seq);
    if (ok != 0 ? rc != KVP_EPROTOCOL : (rc != 0 && rc != KVP_ENOMEM && rc != KVP_ELIMIT))
        abort();
    kvp_master_stats(m, st);
    uint64_t parked = st[KVP_STAT_PARKED];
    if (ok != 0 && parked != 0)
        abort();
    if (kvp_master_check(m) != 0)
        abort();
    if (rc == 0) {
        if (kvp_master_repl_apply(m, data, size, &seq) != 0)
            abort();
        kvp_master_stats(m, st);
        if (st[KVP_STAT_PARKED] != parked || kvp_master_check(m) != 0)
            abort();
    }
    kvp_master_takeover(m, 2000);
    kvp_master_tick(m, 2000 + cfg.client_ttl_ms + 1); /* nothing mounted: all dropped */
    kvp_master_stats(m, st);
    if (st[KVP_STAT_PARKED] != 0 || kvp_master_check(m) != 0)
        abort();
    kvp_master_destroy(m);
    return 0;
}
