/*
 * meta_samples.h -- sample connector step metadata (connector/meta.h) for
 * the unit tests, the fuzz target's seed generator and round-trip checks.
 * ms_sample(v, &s) fills s with sample v (0 <= v < MS_COUNT) pointing at
 * static storage (no allocation; do not kvp_meta_step_free it).
 *   0: an empty step
 *   1: one new request that saves (2 groups, 32-byte hashes, token ids)
 *   2: one request of every kind (new, running, resumed, load-only,
 *      partial-tail-only, finished flush) + unfinished and preempted ids
 *   3: a load-only request (16-byte hashes) + preempted ids
 */
#ifndef KVP_META_SAMPLES_H
#define KVP_META_SAMPLES_H

#include <string.h>

#include "connector/meta.h"

#define MS_COUNT 4

static uint8_t ms_hash32[8 * 32];
static uint8_t ms_hash16[4 * 16];
static uint32_t ms_ids0[3] = {1, 2, 3};
static uint32_t ms_ids1[2] = {7, 0x7FFFFFFF};
static uint32_t ms_ids2[1] = {9};
static uint32_t ms_toks[5] = {101, 102, 0, 0xFFFFFFFFu, 7};
static kvp_meta_ids ms_groups2[2];
static kvp_meta_ids ms_groups1[1];
static kvp_meta_ids ms_groups_empty[2];
static kvp_meta_load_spec ms_load = {16, 48, 48, true};
static kvp_meta_load_spec ms_load2 = {0, 32, 0, true};
static kvp_meta_tail ms_tails[2] = {{0, 5, 44}, {1, 7, 44}};
static kvp_meta_tail ms_tails_empty[1];
static kvp_meta_req ms_reqs[6];
static kvp_meta_str ms_unfin[3] = {{"req-a", 5}, {"req-b", 5}, {"x", 1}};
static kvp_meta_str ms_pre[2] = {{"req-p", 5}, {"\xff\x01z", 3}};

static void ms_init_data(void)
{
    for (size_t i = 0; i < sizeof ms_hash32; i++)
        ms_hash32[i] = (uint8_t)(i * 37 + 1);
    for (size_t i = 0; i < sizeof ms_hash16; i++)
        ms_hash16[i] = (uint8_t)(255 - i);
    ms_groups2[0] = (kvp_meta_ids){ms_ids0, 3, 0};
    ms_groups2[1] = (kvp_meta_ids){ms_ids1, 2, 0};
    ms_groups1[0] = (kvp_meta_ids){ms_ids2, 1, 0};
    ms_groups_empty[0] = (kvp_meta_ids){NULL, 0, 0};
    ms_groups_empty[1] = (kvp_meta_ids){NULL, 0, 0};
}

static kvp_meta_req ms_new_req(void)
{
    kvp_meta_req r;
    memset(&r, 0, sizeof r);
    r.req_id = (kvp_meta_str){"cmpl-0001-new", 13};
    r.kind = KVP_META_NEW;
    r.token_len_chunk = 48;
    r.block_ids = ms_groups2;
    r.ngroups = 2;
    r.block_hashes = ms_hash32;
    r.nhashes = 8;
    r.hash_len = 32;
    r.can_save = KVP_META_TRUE;
    r.is_last_chunk = KVP_META_FALSE;
    r.token_ids = ms_toks;
    r.n_token_ids = 5;
    r.has_num_prompt_tokens = true;
    r.num_prompt_tokens = 50;
    return r;
}

static int ms_sample(int v, kvp_meta_step *s)
{
    ms_init_data();
    memset(s, 0, sizeof *s);
    switch (v) {
    case 0:
        return 0;
    case 1:
        ms_reqs[0] = ms_new_req();
        s->reqs = ms_reqs;
        s->nreqs = 1;
        return 0;
    case 2: {
        ms_reqs[0] = ms_new_req();
        kvp_meta_req r = ms_new_req(); /* running: chunked prefill, last chunk */
        r.req_id = (kvp_meta_str){"run", 3};
        r.kind = KVP_META_RUNNING;
        r.token_len_chunk = 64;
        r.is_last_chunk = KVP_META_TRUE;
        r.token_ids = NULL;
        r.n_token_ids = 0;
        ms_reqs[1] = r;
        r = ms_new_req(); /* resumed with a load: never saves */
        r.req_id = (kvp_meta_str){"resumed", 7};
        r.kind = KVP_META_RESUMED;
        r.can_save = KVP_META_FALSE;
        r.load_spec = &ms_load;
        ms_reqs[2] = r;
        r = ms_new_req(); /* pending async load only */
        r.req_id = (kvp_meta_str){"load", 4};
        r.kind = KVP_META_LOAD;
        r.token_len_chunk = 0;
        r.block_ids = ms_groups1;
        r.ngroups = 1;
        r.can_save = KVP_META_FALSE;
        r.is_last_chunk = KVP_META_UNSET;
        r.load_spec = &ms_load2;
        r.token_ids = NULL;
        r.n_token_ids = 0;
        r.num_prompt_tokens = 0;
        ms_reqs[3] = r;
        r = ms_new_req(); /* partial-tail offload only */
        r.req_id = (kvp_meta_str){"tail", 4};
        r.kind = KVP_META_TAIL;
        r.token_len_chunk = 0;
        r.is_last_chunk = KVP_META_UNSET;
        r.token_ids = NULL;
        r.n_token_ids = 0;
        r.tails = ms_tails;
        r.ntails = 2;
        ms_reqs[4] = r;
        memset(&r, 0, sizeof r); /* finished flush: bare, empty tail list */
        r.req_id = (kvp_meta_str){"fin", 3};
        r.kind = KVP_META_FINISHED;
        r.block_ids = ms_groups_empty;
        r.ngroups = 2;
        r.can_save = KVP_META_UNSET;
        r.is_last_chunk = KVP_META_UNSET;
        r.tails = ms_tails_empty;
        r.ntails = 0;
        ms_reqs[5] = r;
        s->reqs = ms_reqs;
        s->nreqs = 6;
        s->unfinished = ms_unfin;
        s->nunfinished = 3;
        s->preempted = ms_pre;
        s->npreempted = 2;
        return 0;
    }
    case 3: {
        kvp_meta_req r;
        memset(&r, 0, sizeof r);
        r.req_id = (kvp_meta_str){"L", 1};
        r.kind = KVP_META_LOAD;
        r.block_ids = ms_groups1;
        r.ngroups = 1;
        r.block_hashes = ms_hash16;
        r.nhashes = 4;
        r.hash_len = 16;
        r.can_save = KVP_META_FALSE;
        r.is_last_chunk = KVP_META_UNSET;
        r.load_spec = &ms_load2;
        r.has_num_prompt_tokens = true;
        r.num_prompt_tokens = 64;
        ms_reqs[0] = r;
        s->reqs = ms_reqs;
        s->nreqs = 1;
        s->preempted = ms_pre;
        s->npreempted = 1;
        return 0;
    }
    default:
        return -1;
    }
}

#endif
