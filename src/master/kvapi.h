/*
 * kvapi.h -- the master's HTTP API over its core: a KV-aware router's
 * prefix question (LOOKUP_HASHES of one chain, master.h kvp_master_lookup)
 * asked over HTTP, per request, as routers ask Mooncake's master.
 *
 *   GET /api/kv/lookup?hashes=H1,H2,...[&group=G][&tenant=T]
 *   200 application/json
 *   {"tenant":"T","group":G,"blocks":N,"dram":D,"disk":K,"any":A}
 *
 * N is the number of hashes asked; D, K and A are how many leading blocks
 * of the chain have every part in DRAM, on disk, and in either (what a
 * load can read). Arguments:
 *   hashes  the chain, in order: 1 .. KVP_KVAPI_MAX_HASHES engine block
 *           hashes, comma-separated, each an unsigned 64-bit integer in
 *           decimal (vLLM's int form) or hex with 0x (no sign, no spaces)
 *   group   the KV cache group, 0 .. 255 (default 0; blocks are put with
 *           groups 0 .. 31, so a larger one holds nothing)
 *   tenant  the tenant's name, at most 255 bytes of UTF-8 (default
 *           "default"; "" is "default"; an unknown tenant holds nothing)
 * Empty arguments ("&&") are nothing; anything else is 400 with
 * {"error": "..."} naming what is wrong: a
 * missing, empty or malformed argument, a number out of range, more than
 * KVP_KVAPI_MAX_HASHES hashes, an argument given twice, an unknown one.
 *
 * The route runs on the HTTP thread, which never touches the core: the
 * query goes to the master's loop (kvp_mserver_lookup), which answers it
 * in its next turn; the thread waits at most KVP_KVAPI_WAIT_MS for it
 * (then 503 {"error":"the master's loop did not answer"}). A master that
 * is not serving answers 503 at once, as /readyz does: a standby (the
 * leader answers), a loop that has not run for 5 s, a stopping master.
 *
 * Credentials: the endpoint's bearer token (net/http.h), which opens every
 * tenant's blocks: tenant tokens are not asked for here.
 */
#ifndef KVP_KVAPI_H
#define KVP_KVAPI_H

#include "common/buf.h"
#include "net/http.h"

#define KVP_KVAPI_MAX_HASHES 4096
#define KVP_KVAPI_WAIT_MS 2000

/* GET /api/kv/lookup: a kvp_http_req_fn; ctx = the kvp_mserver (whose
 * kvp_mserver_status is not NULL: its config has "http"). */
int kvp_kvapi_lookup(void *ctx, const kvp_http_req *req, kvp_buf *out, const char **ctype);

#endif
