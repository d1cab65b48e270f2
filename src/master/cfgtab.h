/*
 * cfgtab.h -- objects and bytes per configuration (internal to src/master):
 * what `kvpool stat`, CONFIGS, /api/stats and the status page show of the
 * engine configurations a pool holds.
 *
 * A configuration is named by its keys: the kvpool connector's keys read
 * "<name>@cfg:<fp>@tp_rank:..." (src/connector/keys.h), name being
 * "[cache_prefix@]<model>" and fp 12..32 lower-case hex digits. A key's
 * configuration is (tenant, name, fp) taken from the LAST "@cfg:" in it:
 * name is what precedes it, fp the digits after it, which must be 12..32
 * of [0-9a-f] ending at '@' or the key's end (else the key names no
 * configuration). A key without one belongs to none and is not counted
 * here. Names longer than KVP_CFGTAB_NAME_MAX - 1 bytes are cut there (two
 * such names alike up to the cut share a row).
 *
 * Rows. At most KVP_CFGTAB_MAX configurations have a row of their own;
 * the objects of any other configuration are counted in their tenant's
 * "other" pair (objects, bytes), kept by the caller (the master keeps one
 * per tenant) and passed in. Invariant: while a configuration has a row,
 * every published object of it is counted there; while it has none, in its
 * tenant's other pair. So a configuration gets a row only while its
 * tenant's other pair is empty (then none of its objects is counted
 * elsewhere), and a row is given up only at 0 objects: rows at 0 stay (with
 * their name) until a new configuration needs the slot. Counts are exact,
 * never estimated: kvp_cfgtab_check verifies them.
 *
 * Cost: parsing scans the key once from its end; finding a row is one
 * probe of an open-addressing index (rebuilt, O(KVP_CFGTAB_MAX), only when
 * a row is created or reused). Memory: about 100 KiB per table.
 *
 * Not thread-safe: the master's loop thread only.
 */
#ifndef KVP_CFGTAB_H
#define KVP_CFGTAB_H

#include <stddef.h>
#include <stdint.h>

#define KVP_CFGTAB_MAX 256       /* configurations with a row of their own */
#define KVP_CFGTAB_NAME_MAX 256  /* bytes of a row's name kept, NUL included */
#define KVP_CFGTAB_FP_MIN 12     /* fingerprint digits (src/connector/keys.h) */
#define KVP_CFGTAB_FP_MAX 32

typedef struct kvp_cfgtab_row {
    uint64_t objects, bytes;        /* published objects of it, their value bytes */
    uint16_t tenant;
    uint8_t fplen;                  /* 0 = a free slot */
    char fp[KVP_CFGTAB_FP_MAX + 1]; /* NUL-terminated */
    uint16_t namelen;
    char name[KVP_CFGTAB_NAME_MAX]; /* NUL-terminated, possibly cut */
} kvp_cfgtab_row;

typedef struct kvp_cfgtab {
    kvp_cfgtab_row *rows; /* KVP_CFGTAB_MAX slots */
    uint32_t nrows;       /* slots in use (objects or not) */
    uint16_t *ix;         /* open addressing: row + 1, 0 = empty */
    uint32_t ix_mask;
} kvp_cfgtab;

/* A key's configuration, borrowed from the key. */
typedef struct kvp_cfgkey {
    const uint8_t *name, *fp;
    size_t namelen, fplen;
} kvp_cfgkey;

/* 1 and *out set if key[0..len) names a configuration (rule above), else 0. */
int kvp_cfgtab_parse(const uint8_t *key, size_t len, kvp_cfgkey *out);

/* 0 or KVP_ENOMEM. kvp_cfgtab_free on a zeroed or initialised table. */
int kvp_cfgtab_init(kvp_cfgtab *t);
void kvp_cfgtab_free(kvp_cfgtab *t);

/*
 * An object of `size` bytes with key[0..len) in tenant `tenant` was
 * published (+1) or is gone (-1): counted in its row, or in other[0..1]
 * (its tenant's objects, bytes) as the invariant says. A key of no
 * configuration: nothing. A -1 must match an earlier +1 of the same key,
 * tenant and size (the caller's bookkeeping; asserted).
 */
void kvp_cfgtab_count(kvp_cfgtab *t, uint16_t tenant, const uint8_t *key, size_t len,
                      uint64_t size, int delta, uint64_t other[2]);

/* The row of a configuration, or NULL (none: its objects are in other). */
const kvp_cfgtab_row *kvp_cfgtab_find(const kvp_cfgtab *t, uint16_t tenant, const kvp_cfgkey *k);

/* The row in slot i < KVP_CFGTAB_MAX, NULL when free; rows with 0 objects
 * are in use but hold nothing (readers skip them). */
const kvp_cfgtab_row *kvp_cfgtab_slot(const kvp_cfgtab *t, uint32_t i);

/* Index consistency (every row found by its own key, nrows right): 0 or -1. */
int kvp_cfgtab_check(const kvp_cfgtab *t);

#endif
