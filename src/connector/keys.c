/*
 * keys.c -- store key strings, TP replication factors, lookup prefixes and
 * put striding (spec §4). Contracts are in keys.h.
 */
#include "connector/keys.h"

#include <stdio.h>
#include <string.h>

#include "kvpool.h"

/* A bounded string builder over a caller buffer: counts what it could not store. */
struct sb {
    char *p;
    size_t cap, len;
};

static void sb_put(struct sb *b, const char *s, size_t n)
{
    if (b->len < b->cap) {
        size_t room = b->cap - b->len;
        memcpy(b->p + b->len, s, n < room ? n : room);
    }
    b->len += n;
}

static void sb_str(struct sb *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_int(struct sb *b, int v)
{
    char t[16];
    int n = snprintf(t, sizeof t, "%d", v);
    sb_put(b, t, (size_t)n);
}

/* NUL-terminates (truncating if needed); 0 or KVP_EBUFFER_OVERFLOW. */
static int sb_end(struct sb *b, size_t *len)
{
    if (len)
        *len = b->len;
    if (b->len < b->cap) {
        b->p[b->len] = '\0';
        return 0;
    }
    if (b->cap)
        b->p[b->cap - 1] = '\0';
    return KVP_EBUFFER_OVERFLOW;
}

int kvp_key_model_name(const char *model_path, char *out, size_t cap, size_t *len)
{
    if (!model_path || (cap && !out))
        return KVP_EINVALID_PARAMS;
    size_t end = strlen(model_path);
    while (end > 0 && model_path[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && model_path[start - 1] != '/')
        start--;
    struct sb b = {out, cap, 0};
    sb_put(&b, model_path + start, end - start);
    return sb_end(&b, len);
}

int kvp_key_meta_init(struct kvp_key_meta *md, const char *model_path, const char *cache_prefix,
                      int tp_rank, int pcp_rank, int dcp_rank, int pp_rank, int group_id)
{
    if (!md || !model_path || tp_rank < 0 || pcp_rank < 0 || dcp_rank < 0 || pp_rank < 0 ||
        group_id < 0)
        return KVP_EINVALID_PARAMS;
    memset(md, 0, sizeof *md);
    if (kvp_key_model_name(model_path, md->model_name, sizeof md->model_name, NULL) != 0)
        return KVP_EINVALID_PARAMS;
    if (cache_prefix) {
        if (strlen(cache_prefix) >= sizeof md->cache_prefix || strchr(cache_prefix, '@'))
            return KVP_EINVALID_PARAMS;
        strcpy(md->cache_prefix, cache_prefix);
    }
    md->tp_rank = tp_rank;
    md->pcp_rank = pcp_rank;
    md->dcp_rank = dcp_rank;
    md->pp_rank = pp_rank;
    md->group_id = group_id;
    return 0;
}

int kvp_key_fingerprint_valid(const char *fp)
{
    if (!fp)
        return 0;
    size_t n = 0;
    for (; fp[n] && n <= KVP_KEY_FP_MAX; n++)
        if (!((fp[n] >= '0' && fp[n] <= '9') || (fp[n] >= 'a' && fp[n] <= 'f')))
            return 0;
    return n >= KVP_KEY_FP_MIN && n <= KVP_KEY_FP_MAX;
}

int kvp_key_meta_set_fingerprint(struct kvp_key_meta *md, const char *fp)
{
    if (!md)
        return KVP_EINVALID_PARAMS;
    if (!fp || !*fp) {
        md->fingerprint[0] = '\0';
        return 0;
    }
    if (!kvp_key_fingerprint_valid(fp))
        return KVP_EINVALID_PARAMS;
    strcpy(md->fingerprint, fp); /* fits: at most KVP_KEY_FP_MAX characters */
    return 0;
}

int kvp_key_build_prefix(const struct kvp_key_meta *md, int tp_rank, int pcp_rank, int dcp_rank,
                         int pp_rank, char *out, size_t cap, size_t *len)
{
    if (!md || (cap && !out) || tp_rank < KVP_KEY_RANK_SELF || pcp_rank < KVP_KEY_RANK_SELF ||
        dcp_rank < KVP_KEY_RANK_SELF || pp_rank < KVP_KEY_RANK_SELF)
        return KVP_EINVALID_PARAMS;
    struct sb b = {out, cap, 0};
    if (md->cache_prefix[0]) {
        sb_str(&b, md->cache_prefix);
        sb_put(&b, "@", 1);
    }
    sb_str(&b, md->model_name);
    if (md->fingerprint[0]) {
        sb_str(&b, "@cfg:");
        sb_str(&b, md->fingerprint);
    }
    sb_str(&b, md->by_head ? "@kvh:" : "@tp_rank:");
    sb_int(&b, tp_rank == KVP_KEY_RANK_SELF ? md->tp_rank : tp_rank);
    sb_str(&b, "@pcp");
    sb_int(&b, pcp_rank == KVP_KEY_RANK_SELF ? md->pcp_rank : pcp_rank);
    sb_str(&b, "@dcp");
    sb_int(&b, dcp_rank == KVP_KEY_RANK_SELF ? md->dcp_rank : dcp_rank);
    sb_str(&b, "@pp_rank:");
    sb_int(&b, pp_rank == KVP_KEY_RANK_SELF ? md->pp_rank : pp_rank);
    sb_str(&b, "@group:");
    sb_int(&b, md->group_id);
    return sb_end(&b, len);
}

int kvp_key_build_config_key(const struct kvp_key_meta *md, char *out, size_t cap, size_t *len)
{
    if (!md || !md->fingerprint[0] || (cap && !out))
        return KVP_EINVALID_PARAMS;
    struct sb b = {out, cap, 0};
    if (md->cache_prefix[0]) {
        sb_str(&b, md->cache_prefix);
        sb_put(&b, "@", 1);
    }
    sb_str(&b, md->model_name);
    sb_str(&b, "@cfg:");
    sb_str(&b, md->fingerprint);
    sb_str(&b, KVP_KEY_CONFIG_SUFFIX);
    return sb_end(&b, len);
}

static void sb_hex(struct sb *b, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        char two[2] = {digits[p[i] >> 4], digits[p[i] & 15]};
        sb_put(b, two, 2);
    }
}

int kvp_key_build_key_string(const char *prefix, size_t prefix_len, const uint8_t *hash,
                             size_t hash_len, char *out, size_t cap, size_t *len)
{
    if ((prefix_len && !prefix) || (hash_len && !hash) || (cap && !out))
        return KVP_EINVALID_PARAMS;
    struct sb b = {out, cap, 0};
    sb_put(&b, prefix, prefix_len);
    sb_put(&b, "@", 1);
    sb_hex(&b, hash, hash_len);
    return sb_end(&b, len);
}

int kvp_key_build(const struct kvp_key_meta *md, const uint8_t *hash, size_t hash_len, char *out,
                  size_t cap, size_t *len)
{
    if (!md || (hash_len && !hash) || (cap && !out))
        return KVP_EINVALID_PARAMS;
    size_t plen = 0;
    int rc = kvp_key_build_prefix(md, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF,
                                  KVP_KEY_RANK_SELF, out, cap, &plen);
    if (rc != 0 && rc != KVP_EBUFFER_OVERFLOW)
        return rc;
    /* append "@hex" after the prefix, counting even when out is full */
    struct sb b = {out, cap, plen};
    sb_put(&b, "@", 1);
    sb_hex(&b, hash, hash_len);
    return sb_end(&b, len);
}

int kvp_key_tp_factor(const enum kvp_key_spec *inner, size_t ninner, int tp_size,
                      int num_kv_heads, int dcp_size, int *factor)
{
    if (!inner || ninner == 0 || !factor || tp_size < 1 || dcp_size < 1)
        return KVP_EINVALID_PARAMS;
    bool any_mamba = false, all_mla = true;
    for (size_t i = 0; i < ninner; i++) {
        switch (inner[i]) {
        case KVP_KEY_SPEC_MAMBA:
            any_mamba = true;
            all_mla = false;
            break;
        case KVP_KEY_SPEC_MLA:
        case KVP_KEY_SPEC_SWA_MLA:
            break;
        case KVP_KEY_SPEC_ATTENTION:
            all_mla = false;
            break;
        default:
            return KVP_EINVALID_PARAMS;
        }
    }
    if (dcp_size > 1 || any_mamba) {
        *factor = 1;
    } else if (all_mla) {
        *factor = tp_size;
    } else {
        if (num_kv_heads < 1)
            return KVP_EINVALID_PARAMS;
        int f = tp_size / num_kv_heads;
        *factor = f > 1 ? f : 1;
    }
    return 0;
}

int kvp_key_tp_rank_for_group(int tp_rank, int factor)
{
    return factor > 1 ? tp_rank / factor : tp_rank;
}

int kvp_key_lookup_namespaces(int tp_size, int pcp_size, int dcp_size, int pp_size, int factor,
                              struct kvp_key_ns *out, size_t cap, size_t *n)
{
    if (!n || tp_size < 1 || pcp_size < 1 || dcp_size < 1 || pp_size < 1 || factor < 1 ||
        (cap && !out))
        return KVP_EINVALID_PARAMS;
    int ntp = dcp_size > 1 ? tp_size : tp_size / factor;
    size_t need = (size_t)pcp_size * (size_t)ntp * (size_t)pp_size;
    *n = need;
    if (need > cap)
        return KVP_EBUFFER_OVERFLOW;
    size_t k = 0;
    for (int pcp = 0; pcp < pcp_size; pcp++)
        for (int t = 0; t < ntp; t++)
            for (int pp = 0; pp < pp_size; pp++)
                out[k++] = (struct kvp_key_ns){
                    .tp = t, .pcp = pcp, .dcp = dcp_size > 1 ? t % dcp_size : 0, .pp = pp};
    return 0;
}

int kvp_key_lookup_prefixes(const struct kvp_key_meta *md, int tp_size, int pcp_size,
                            int dcp_size, int pp_size, int factor, struct kvp_key_ns *ns_scratch,
                            size_t nscratch, char *buf, size_t buf_cap, size_t *off,
                            size_t off_cap, size_t *n, size_t *used)
{
    if (!md || !n || !used || (buf_cap && !buf) || (off_cap && !off))
        return KVP_EINVALID_PARAMS;
    size_t nns = 0;
    int rc = kvp_key_lookup_namespaces(tp_size, pcp_size, dcp_size, pp_size, factor, ns_scratch,
                                       nscratch, &nns);
    *n = nns;
    *used = 0;
    if (rc != 0)
        return rc;
    bool overflow = nns > off_cap;
    size_t pos = 0;
    for (size_t i = 0; i < nns; i++) {
        size_t len = 0;
        char *dst = pos < buf_cap ? buf + pos : NULL;
        size_t room = pos < buf_cap ? buf_cap - pos : 0;
        rc = kvp_key_build_prefix(md, ns_scratch[i].tp, ns_scratch[i].pcp, ns_scratch[i].dcp,
                                  ns_scratch[i].pp, dst, room, &len);
        if (rc == KVP_EBUFFER_OVERFLOW)
            overflow = true;
        else if (rc != 0)
            return rc;
        if (i < off_cap)
            off[i] = pos;
        pos += len + 1;
    }
    *used = pos;
    return overflow ? KVP_EBUFFER_OVERFLOW : 0;
}

bool kvp_key_put_mine(int64_t chunk, int tp_rank, int group_id, int put_step)
{
    if (chunk < 0 || tp_rank < 0 || group_id < 0)
        return false;
    if (put_step <= 1)
        return true;
    return chunk % put_step == ((int64_t)tp_rank + group_id) % put_step;
}
