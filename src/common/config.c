/*
 * config.c -- the configuration table and its loaders (see config.h).
 *
 * Everything about a key lives in one row of `keys`: its name, the Mooncake
 * names that alias it, its type and limits, where it is stored in
 * kvp_config, its default (as text, in the syntax a flag takes) and its help
 * line. Defaults, file and flag parsing, validation and the printed reference
 * are all driven by that table, so they cannot disagree.
 *
 * Error messages have the form
 *   SOURCE: key "NAME": value VALUE is not a TYPE (allowed: WHAT)
 * where SOURCE is "path:line:col" for a file and "config:line:col" for a
 * string, and VALUE is shown as written (JSON strings quoted, control bytes
 * escaped, long values cut with "..."). A flag (kvp_config_set) is named the
 * way it was typed, once:
 *   flag --NAME: value VALUE is not a TYPE (allowed: WHAT)
 */
#include "common/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"

/* ------------------------------------------------------------------ table */

enum ktype {
    KT_STRING,   /* char[size]; a JSON string of at most size-1 bytes */
    KT_SIZE,     /* uint64_t bytes in [min, max]; number or "4GiB" */
    KT_DURATION, /* uint64_t ms in [min, max]; bare number is in unit_ms */
    KT_RATIO,    /* double in lo..hi, each end open or closed */
    KT_BOOL,     /* int 0/1; true/false or "true"/"false" */
    KT_UINT,     /* uint64_t in [min, max]; number or decimal string */
    KT_LOGLEVEL, /* int KVP_LOG_*; "debug".."off" */
    KT_ENUM,     /* char[size]; one of choices, stored as given */
};

struct key_def {
    const char *name;
    const char *aliases[3]; /* Mooncake names for the same field; NULL-ended */
    unsigned roles;         /* KVP_KEY_*: the kvpool commands that read it; 0 = none
                               (a Mooncake key kept for its files) */
    enum ktype type;
    size_t off;             /* offset of the field in kvp_config */
    size_t size;            /* KT_STRING / KT_ENUM: sizeof the char array */
    uint64_t min, max;      /* KT_SIZE, KT_DURATION (ms), KT_UINT */
    uint64_t unit_ms;       /* KT_DURATION: unit of a bare number */
    double lo, hi;          /* KT_RATIO bounds */
    int lo_open, hi_open;   /* KT_RATIO: 1 = bound excluded */
    const char *const *choices; /* KT_ENUM: NULL-ended */
    const char *def;        /* default, parsed like a flag value */
    const char *help;
};

/*
 * Field locators. The `0 * sizeof(pointer comparison)` term makes the
 * compiler reject (distinct pointer types, -Werror) a row whose type does not
 * match the struct member it points at.
 */
#define FIELD_CHECK(f, T) (0 * sizeof(&((kvp_config *)0)->f == (T *)0))
#define F_U64(f) .off = offsetof(kvp_config, f) + FIELD_CHECK(f, uint64_t)
#define F_INT(f) .off = offsetof(kvp_config, f) + FIELD_CHECK(f, int)
#define F_DBL(f) .off = offsetof(kvp_config, f) + FIELD_CHECK(f, double)
#define F_STR(f)                                                               \
    .off = offsetof(kvp_config, f) + FIELD_CHECK(f[0], char),                  \
    .size = sizeof(((kvp_config *)0)->f)

#define KIB_ 1024ull
#define MIB_ (1024ull * 1024)
#define GIB_ (1024ull * 1024 * 1024)
#define DUR_MAX_MS (30ull * 24 * 3600 * 1000) /* 30 days: keeps ns arithmetic far from overflow */
#define SOFT_PIN_MAX_MS (36ull * 3600 * 1000) /* the master keeps pins within 37 h (src/master/obj.h) */

/* Who reads a key (config.h KVP_KEY_*): each row says which components'
 * code reads its field, so a command can refuse a flag it would ignore. */
#define R_M KVP_KEY_MASTER
#define R_N KVP_KEY_NODE
#define R_C KVP_KEY_CLIENT
#define R_A KVP_KEY_ADMIN
#define R_ALL_NET (R_M | R_N | R_C | R_A)

static const char *const protocol_choices[] = {"tcp", "rdma", "ucx", NULL};
static const char *const mode_choices[] = {"embedded", "standalone-store", NULL};
static const char *const prefault_choices[] = {"auto", "background", "sync", "off", NULL};
static const char *const log_format_choices[] = {"text", "json", NULL};

static const struct key_def keys[] = {
    /* ---- master ---- */
    {.name = "listen", .roles = R_M, .type = KT_STRING, F_STR(listen), .def = "127.0.0.1:50051",
     .help = "master: address to listen on, host:port"},
    {.name = "cluster_token", .roles = R_ALL_NET, .type = KT_STRING, F_STR(cluster_token), .def = "",
     .help = "shared secret every client and node must present; empty = no check (also "
             "cluster_token_file, $KVPOOL_CLUSTER_TOKEN; never a flag)"},
    {.name = "cluster_token_file", .roles = R_ALL_NET, .type = KT_STRING, F_STR(cluster_token_file), .def = "",
     .help = "file holding cluster_token (one line, not readable by other users)"},
    {.name = "node_token", .roles = R_M | R_N, .type = KT_STRING, F_STR(node_token), .def = "",
     .help = "credential storage nodes present to mount segments; set on the master, only "
             "its holders may mount, and with etcd only they may follow the index (every "
             "master of a cluster needs it) (also node_token_file, $KVPOOL_NODE_TOKEN)"},
    {.name = "node_token_file", .roles = R_M | R_N, .type = KT_STRING, F_STR(node_token_file), .def = "",
     .help = "file holding node_token"},
    {.name = "tenant_tokens_file", .roles = R_M, .type = KT_STRING, F_STR(tenant_tokens_file), .def = "",
     .help = "master: file of \"TENANT TOKEN\" lines; a listed tenant is reachable only with "
             "its token, and a session holding one reaches only that tenant"},
    {.name = "insecure", .roles = R_M | R_N, .type = KT_BOOL, F_INT(insecure), .def = "false",
     .help = "allow listening on a non-loopback address without any credential"},
    {.name = "ucx_insecure", .roles = R_M, .type = KT_BOOL, F_INT(ucx_insecure), .def = "false",
     .help = "master: accept storage nodes offering the ucx transport while tenant_tokens_file "
             "protects tenants (a node's UCX remote key reads and writes every tenant's bytes "
             "in its segment)"},
    {.name = "max_master_memory", .roles = R_M, .type = KT_SIZE, F_U64(max_master_memory), .min = 1 * MIB_,
     .max = UINT64_MAX, .def = "4GiB",
     .help = "master: metadata memory; past it puts evict or are refused (-200)"},
    {.name = "max_frame_size", .roles = R_M, .type = KT_SIZE, F_U64(max_frame), .min = 4 * KIB_,
     .max = GIB_, .def = "64MiB", .help = "largest protocol message accepted"},
    {.name = "lease_ttl", .roles = R_M, .aliases = {"default_kv_lease_ttl"}, .type = KT_DURATION,
     F_U64(lease_ttl_ms), .unit_ms = 1, .min = 1, .max = DUR_MAX_MS, .def = "5s",
     .help = "how long a read lease protects an object from eviction and removal"},
    {.name = "soft_pin_ttl", .roles = R_M, .aliases = {"default_kv_soft_pin_ttl"}, .type = KT_DURATION,
     F_U64(soft_pin_ttl_ms), .unit_ms = 1, .min = 1, .max = SOFT_PIN_MAX_MS, .def = "1800s",
     .help = "how long a soft pin lasts when a put asks for one without a TTL"},
    {.name = "soft_pin_max_ttl", .roles = R_M, .aliases = {"max_kv_soft_pin_ttl"}, .type = KT_DURATION,
     F_U64(soft_pin_max_ttl_ms), .unit_ms = 1, .min = 1, .max = SOFT_PIN_MAX_MS, .def = "86400s",
     .help = "longest soft pin a put may ask for; longer is refused (-600)"},
    {.name = "put_timeout", .roles = R_M, .type = KT_DURATION, F_U64(put_timeout_ms), .unit_ms = 1, .min = 1,
     .max = DUR_MAX_MS, .def = "30s",
     .help = "a put not completed within this is abandoned and its space freed"},
    {.name = "client_ttl", .roles = R_M, .type = KT_DURATION, F_U64(client_ttl_ms), .unit_ms = 1000, .min = 1,
     .max = DUR_MAX_MS, .def = "10s",
     .help = "a client silent for this long is dropped with its leases and segments"},
    {.name = "eviction_high_watermark_ratio", .roles = R_M, .type = KT_RATIO, F_DBL(evict_high), .lo = 0,
     .hi = 1, .lo_open = 1, .def = "0.95",
     .help = "eviction starts when this fraction of pool memory is used"},
    {.name = "eviction_low_watermark_ratio", .roles = R_M, .type = KT_RATIO, F_DBL(evict_low), .lo = 0,
     .hi = 1, .hi_open = 1, .def = "0.90",
     .help = "eviction stops when usage is down to this fraction (< high)"},
    {.name = "max_key_size", .roles = R_M | R_C, .type = KT_UINT, F_U64(max_key), .min = 1, .max = 65535,
     .def = "4096", .help = "longest key, in bytes"},
    {.name = "max_connections", .roles = R_M, .type = KT_UINT, F_U64(max_connections), .min = 1,
     .max = 1048576, .def = "4096",
     .help = "most client connections the master holds; connections that have not "
             "completed HELLO may hold at most 7/8 of them (over a cap, a newer one evicts "
             "the oldest)"},
    {.name = "max_connections_per_address", .roles = R_M, .type = KT_UINT, F_U64(max_conns_per_addr),
     .min = 1, .max = 1048576, .def = "64",
     .help = "most connections from one address (IPv6: one /64) that have not completed "
             "HELLO; a newer one evicts the oldest"},
    {.name = "hello_timeout", .roles = R_M | R_N, .type = KT_DURATION, F_U64(hello_timeout_ms), .unit_ms = 1,
     .min = 1, .max = DUR_MAX_MS, .def = "5s",
     .help = "a connection that has not completed HELLO within this is answered and closed"},
    {.name = "node_max_connections", .roles = R_N, .type = KT_UINT, F_U64(node_max_connections), .min = 4,
     .max = 1048576, .def = "4096",
     .help = "storage node: most connections its segment server holds (a quarter of them before "
             "HELLO); more are closed at once"},
    {.name = "idle_timeout", .roles = R_N, .type = KT_DURATION, F_U64(idle_timeout_ms), .unit_ms = 1, .min = 1,
     .max = DUR_MAX_MS, .def = "5m",
     .help = "storage node: a connection with no frame in flight and nothing to send is closed "
             "after this (clients reconnect transparently)"},
    {.name = "min_transfer_rate", .roles = R_N, .type = KT_SIZE, F_U64(min_transfer_rate), .min = 1,
     .max = UINT64_MAX, .def = "64KiB",
     .help = "storage node: bytes a second a connection in the middle of a transfer must move "
             "(averaged over 10 s); a slower one is closed"},
    {.name = "stall_timeout", .roles = R_N, .type = KT_DURATION, F_U64(stall_timeout_ms), .unit_ms = 1,
     .min = 1, .max = DUR_MAX_MS, .def = "30s",
     .help = "storage node: a connection in the middle of a frame, or not reading its answers, "
             "is closed after this long without a byte moving"},
    {.name = "input_memory_budget", .roles = R_M, .type = KT_SIZE, F_U64(input_budget), .min = MIB_,
     .max = UINT64_MAX, .def = "1GiB",
     .help = "most bytes all connections' unserved input may hold together; a connection "
             "whose next frame does not fit waits, unread (at least 16/15 of "
             "max_frame_size)"},
    {.name = "max_segments", .roles = R_M, .type = KT_UINT, F_U64(max_segments), .min = 1, .max = 65535,
     .def = "4096", .help = "most memory segments that can be mounted"},
    {.name = "max_tenants", .roles = R_M, .type = KT_UINT, F_U64(max_tenants), .min = 1, .max = 65535,
     .def = "1024", .help = "most tenants (key namespaces)"},
    {.name = "max_objects", .roles = R_M, .type = KT_UINT, F_U64(max_objects), .min = 0, .max = UINT64_MAX,
     .def = "0", .help = "most objects stored; 0 = unlimited"},
    {.name = "max_object_size", .roles = R_M, .type = KT_SIZE, F_U64(max_object_size), .min = 4 * KIB_,
     .max = 4 * GIB_ - 64 * KIB_, .def = "1GiB",
     .help = "largest value a put may store (also at most the low watermark's share of the "
             "pool); larger puts are refused before anything is evicted"},
    {.name = "etcd", .roles = R_M, .type = KT_STRING, F_STR(etcd), .def = "",
     .help = "master: etcd endpoints (http://HOST:PORT[,...] or etcd://HOST:PORT[,...]/CLUSTER) "
             "of a cluster of masters: one is elected leader and serves, the others stand by; "
             "clients and nodes then name the master etcd://HOST:PORT/CLUSTER"},
    {.name = "etcd_user", .roles = R_M | R_N | R_C, .type = KT_STRING, F_STR(etcd_user), .def = "",
     .help = "etcd with authentication: the user (masters, and clients and nodes naming the "
             "master etcd://...); the password comes from etcd_password_file"},
    {.name = "etcd_password_file", .roles = R_M | R_N | R_C, .type = KT_STRING,
     F_STR(etcd_password_file), .def = "",
     .help = "file holding etcd_user's password (one line, not readable by other users)"},
    {.name = "etcd_cacert", .roles = R_M | R_N | R_C, .type = KT_STRING, F_STR(etcd_cacert),
     .def = "", .help = "CA file (PEM): etcd is reached over https:// and its certificate "
                        "verified against this CA (etcd:// addresses included)"},
    {.name = "etcd_cert", .roles = R_M | R_N | R_C, .type = KT_STRING, F_STR(etcd_cert), .def = "",
     .help = "client certificate (PEM) presented to etcd over https (with etcd_key)"},
    {.name = "etcd_key", .roles = R_M | R_N | R_C, .type = KT_STRING, F_STR(etcd_key), .def = "",
     .help = "private key (PEM) of etcd_cert"},
    {.name = "cluster", .roles = R_M, .type = KT_STRING, F_STR(cluster), .def = "default",
     .help = "master with etcd: the cluster's name (letters, digits, '.', '_', '-')"},
    {.name = "advertise", .roles = R_M, .type = KT_STRING, F_STR(advertise), .def = "",
     .help = "master with etcd: the host:port a leader publishes for clients and nodes "
             "(default: the listen address; needed when that is a wildcard)"},
    {.name = "ha_lease_ttl", .roles = R_M, .type = KT_DURATION, F_U64(ha_lease_ttl_ms),
     .unit_ms = 1000, .min = 1000, .max = 60000, .def = "2s",
     .help = "master with etcd: the leader's lease; a leader that cannot renew it within "
             "3/4 of it stops serving, and a standby takes over once it expires"},
    {.name = "ha_sync", .roles = R_M, .type = KT_BOOL, F_INT(ha_sync), .def = "true",
     .help = "master with etcd: a leader answers a PUT_END only once every standby in sync "
             "has the object (a standby that leaves any update unacknowledged for "
             "ha_sync_timeout stops counting until it catches up); false: answer at once, a "
             "failover may lose the last puts; without etcd it does nothing"},
    {.name = "ha_sync_timeout", .roles = R_M, .type = KT_DURATION, F_U64(ha_sync_timeout_ms),
     .unit_ms = 1000, .min = 10, .max = 60000, .def = "1s",
     .help = "master with etcd and ha_sync: how long a standby may leave an update "
             "unacknowledged (from when it was journaled) before the leader stops waiting "
             "for it: the longest a put waits for a standby"},
    {.name = "max_followers", .roles = R_M, .type = KT_UINT, F_U64(max_followers), .min = 1,
     .max = 1024, .def = "8",
     .help = "master with etcd: most standbys following the index at once; a REPL_FOLLOW "
             "beyond is refused (status LIMIT, logged)"},
    {.name = "repl_buffer_budget", .roles = R_M, .type = KT_SIZE, F_U64(repl_buffer_budget),
     .min = 8 * MIB_, .max = UINT64_MAX, .def = "256MiB",
     .help = "master with etcd: most bytes of index stream all standbys' unsent output holds "
             "together; each standby may hold 1/max_followers of it (at least 8 MiB), and one "
             "that would exceed its share is cut off (it follows again, from a snapshot)"},
    {.name = "snapshot_file", .roles = R_M, .type = KT_STRING, F_STR(snapshot_file), .def = "",
     .help = "master: keep the index in this file (a snapshot, then every change) and load "
             "it at start, so a restarted master keeps the objects its nodes still hold "
             "(\"\" = none)"},
    {.name = "http", .roles = R_M | R_N, .type = KT_STRING, F_STR(http), .def = "",
     .help = "master, storage node: serve /metrics (Prometheus), /healthz and /readyz (the "
             "master also its status page / and /api/stats) on this HOST:PORT (\"\" = off); "
             "beyond loopback it needs http_token_file (or insecure)"},
    {.name = "kv_events", .roles = R_M, .type = KT_STRING, F_STR(kv_events), .def = "",
     .help = "master: publish KV events for KV-aware routers (vLLM's wire format: ZeroMQ PUB, "
             "msgpack KVEventBatch, one topic per tenant) on this tcp://HOST:PORT (\"\" = off)"},
    {.name = "kv_events_replay", .roles = R_M, .type = KT_STRING, F_STR(kv_events_replay),
     .def = "",
     .help = "master with kv_events: answer vLLM's replay requests (ZeroMQ ROUTER) on this "
             "tcp://HOST:PORT (\"\" = none)"},
    {.name = "kv_events_buffer", .roles = R_M, .type = KT_UINT, F_U64(kv_events_buffer),
     .min = 1, .max = 1u << 24, .def = "10000",
     .help = "master with kv_events_replay: event batches kept for replay (the oldest go)"},
    {.name = "http_token_file", .roles = R_M | R_N, .type = KT_STRING, F_STR(http_token_file),
     .def = "",
     .help = "file holding the bearer token every HTTP request but the probes (/healthz, "
             "/readyz) must carry (Authorization: Bearer TOKEN; one line, not readable by "
             "other users)"},
    {.name = "log_level", .roles = R_ALL_NET, .type = KT_LOGLEVEL, F_INT(log_level), .def = "info",
     .help = "least severe log level written, process-wide; given in a client's configuration "
             "it sets the process level ($KVPOOL_LOG_LEVEL beats it, a flag beats both)"},
    {.name = "log_format", .roles = R_ALL_NET, .type = KT_ENUM, F_STR(log_format),
     .choices = log_format_choices, .def = "text",
     .help = "log lines: text (\"TIME L component[ peer=HOST:PORT]: message\") or json (one "
             "object a line: ts, level, component, peer when known, msg); process-wide, "
             "like log_level ($KVPOOL_LOG_FORMAT beats it, a flag beats both)"},
    /* ---- client / storage node ---- */
    {.name = "master", .roles = R_N | R_C | R_A, .aliases = {"master_server_address", "master_server_addr"},
     .type = KT_STRING, F_STR(master_addr), .def = "127.0.0.1:50051",
     .help = "client: master address, host:port"},
    {.name = "local_hostname", .roles = R_N | R_C, .type = KT_STRING, F_STR(local_hostname),
     .def = "localhost",
     .help = "storage node, embedded client: the address clients dial for its segment when "
             "it listens on a wildcard address or was given no listen address (unset: the "
             "local address facing a remote master, else localhost)"},
    {.name = "segment_port_min", .roles = R_N, .type = KT_UINT, F_U64(segment_port_min), .min = 0,
     .max = 65535, .def = "0",
     .help = "storage node, embedded client given no listen address: the segment server "
             "listens on a free port in segment_port_min..segment_port_max (0 = any port the "
             "kernel picks); both set or neither"},
    {.name = "segment_port_max", .roles = R_N, .type = KT_UINT, F_U64(segment_port_max), .min = 0,
     .max = 65535, .def = "0", .help = "the last port of segment_port_min's range"},
    {.name = "protocol", .roles = R_C | R_N, .type = KT_ENUM, F_STR(protocol), .choices = protocol_choices,
     .def = "tcp", .help = "transfer protocol between hosts: tcp, or ucx (rdma: the same) for "
     "one-sided transfers through UCX (RDMA NICs; UCX_TLS picks its transports); a node "
     "registers its segment, a client uses it for segments on other hosts"},
    {.name = "mode", .roles = R_C, .type = KT_ENUM, F_STR(mode), .choices = mode_choices,
     .def = "standalone-store",
     .help = "client: standalone-store (uses the pool's storage nodes, contributes no memory) "
             "or embedded (also hosts a segment of global_segment_size); when not given: "
             "embedded if global_segment_size is given and > 0, else standalone-store"},
    {.name = "global_segment_size", .roles = R_N, .type = KT_SIZE, F_U64(global_segment_size),
     .min = 0, .max = UINT64_MAX, .def = "4GiB",
     .help = "memory this node contributes to the pool (an embedded client, kvpool store); "
             "0 = none; at most what the machine can back (MemTotal, or the memory cgroup's "
             "limit, plus swap)"},
    {.name = "segment_prefault", .roles = R_N, .type = KT_ENUM, F_STR(segment_prefault),
     .choices = prefault_choices, .def = "auto",
     .help = "storage node: when the segment's pages are faulted in: background (behind the "
             "first requests), sync (before serving), off (each on first use); auto = "
             "background for kvpool serve / store, off for an embedded client's segment"},
    {.name = "local_buffer_size", .roles = 0, .type = KT_SIZE, F_U64(local_buffer_size), .min = 0,
     .max = UINT64_MAX, .def = "0", .help = "client: local staging buffer for transfers"},
    {.name = "enable_offload", .roles = R_N, .type = KT_BOOL, F_INT(enable_offload), .def = "false",
     .help = "storage node: keep objects evicted from DRAM in an SSD tier under offload_dir "
             "(needs it); connector: a 1280 MiB load staging budget unless staging_budget "
             "is given"},
    {.name = "offload_dir", .roles = R_N, .aliases = {"offload_file_storage_path"}, .type = KT_STRING,
     F_STR(offload_dir), .def = "",
     .help = "storage node: directory of the SSD tier's page files (created 0700; reopened "
             "warm after a restart)"},
    {.name = "offload_capacity", .roles = R_N, .aliases = {"offload_total_size_limit_bytes"}, .type = KT_SIZE,
     F_U64(offload_capacity), .min = 0, .max = UINT64_MAX, .def = "0",
     .help = "storage node: bytes the SSD tier may use (at least 2 pages); 0 = 90 % of the "
             "filesystem's size"},
    {.name = "offload_page_size", .roles = R_N, .type = KT_SIZE, F_U64(offload_page_size), .min = 64 * MIB_,
     .max = GIB_, .def = "128MiB",
     .help = "storage node: SSD tier page file size (a 4 KiB multiple); pages are reclaimed "
             "whole"},
    {.name = "offload_high_watermark_ratio", .roles = R_N, .type = KT_RATIO, F_DBL(offload_high), .lo = 0,
     .hi = 1, .lo_open = 1, .def = "0.95",
     .help = "storage node: the SSD tier drops its least recently used pages past this share "
             "of offload_capacity"},
    {.name = "offload_low_watermark_ratio", .roles = R_N, .type = KT_RATIO, F_DBL(offload_low), .lo = 0,
     .hi = 1, .hi_open = 1, .def = "0.85",
     .help = "storage node: ... down to this share (< high)"},
    {.name = "offload_staging_budget", .roles = R_N, .aliases = {"offload_local_buffer_size_bytes"},
     .type = KT_SIZE, F_U64(offload_staging), .min = 4 * MIB_, .max = UINT64_MAX,
     .def = "256MiB",
     .help = "storage node: bytes of spills waiting for the disk; beyond, spills fail and "
             "puts that need the room get -200 until the writer catches up"},
    {.name = "rpc_timeout", .roles = R_N | R_C | R_A, .type = KT_DURATION, F_U64(rpc_timeout_ms), .unit_ms = 1, .min = 1,
     .max = DUR_MAX_MS, .def = "10s", .help = "client: timeout of one request to the master"},
    {.name = "replica_num", .roles = R_C, .type = KT_UINT, F_U64(replica_num), .min = 1, .max = 3, .def = "1",
     .help = "client: copies of each value a put writes (on distinct segments)"},
    {.name = "preferred_segment", .roles = R_C, .type = KT_STRING, F_STR(preferred_segment), .def = "",
     .help = "client: segment (host:port) puts place their first copy on when it has room; "
             "\"\" = $MOONCAKE_PREFERRED_SEGMENT, else this client's own segment"},
    {.name = "shm_group", .roles = R_N, .type = KT_STRING, F_STR(shm_group), .def = "",
     .help = "storage node: group (name or gid) whose members may attach the segment over "
             "shared memory besides this user; \"\" = this user only"},
    {.name = "tenant_token", .roles = R_N | R_C | R_A, .type = KT_STRING, F_STR(tenant_token), .def = "",
     .help = "client: the credential of its tenant (also tenant_token_file, "
             "$KVPOOL_TENANT_TOKEN)"},
    {.name = "tenant_token_file", .roles = R_N | R_C | R_A, .type = KT_STRING, F_STR(tenant_token_file), .def = "",
     .help = "client: file holding tenant_token"},
    {.name = "tenant", .roles = R_C | R_A, .aliases = {"tenant_id"}, .type = KT_STRING, F_STR(tenant),
     .def = "default", .help = "client: the tenant (key namespace) this client's keys live in"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

/* Mooncake keys for components kvpool does not have: accepted, ignored. */
static const char *const ignored_keys[] = {
    "metadata_server", "device_name",    "rdma_devices",      "master_metrics_port",
    "eviction_ratio",  "transfer_timeout", "use_ascend_direct",
};
#define NIGNORED (sizeof ignored_keys / sizeof ignored_keys[0])

static const struct key_def *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
        for (int a = 0; a < 3 && keys[i].aliases[a]; a++)
            if (strcmp(keys[i].aliases[a], name) == 0)
                return &keys[i];
    }
    return NULL;
}

static void appendf(char *buf, size_t n, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* name with '-' as '_' into n[cap]; 0, or -1 when it does not fit. */
static int canon_name(const char *name, char *n, size_t cap)
{
    size_t l = strlen(name);
    if (l >= cap)
        return -1;
    for (size_t i = 0; i <= l; i++)
        n[i] = name[i] == '-' ? '_' : name[i];
    return 0;
}

int kvp_config_key_is_bool(const char *name)
{
    char n[64];
    if (canon_name(name, n, sizeof n) != 0)
        return 0;
    const struct key_def *k = find_key(n);
    return k && k->type == KT_BOOL;
}

static int is_ignored(const char *name)
{
    for (size_t i = 0; i < NIGNORED; i++)
        if (strcmp(ignored_keys[i], name) == 0)
            return 1;
    return 0;
}

int kvp_config_key_roles(const char *name)
{
    char n[64];
    if (canon_name(name, n, sizeof n) != 0)
        return -1;
    const struct key_def *k = find_key(n);
    if (k)
        return (int)k->roles;
    return is_ignored(n) ? 0 : -1;
}

const char *kvp_config_roles_text(unsigned roles, char *buf, size_t n)
{
    /* the commands of each role, in the order `kvpool --help` lists them */
    static const struct {
        const char *cmd;
        unsigned roles;
    } cmds[] = {{"serve", R_M | R_N}, {"master", R_M}, {"store", R_N}, {"stat", R_A},
                {"reset", R_A},       {"put", R_C},    {"get", R_C},   {"exist", R_C},
                {"rm", R_C}};
    size_t len = 0, count = 0, all = sizeof cmds / sizeof cmds[0];
    if (n)
        buf[0] = '\0';
    for (size_t i = 0; i < all; i++)
        count += (cmds[i].roles & roles) != 0;
    if (count == 0 || count == all) {
        appendf(buf, n, &len, "%s", count ? "every command" : "no kvpool command");
        return buf;
    }
    appendf(buf, n, &len, "kvpool");
    for (size_t i = 0, k = 0; i < all; i++)
        if (cmds[i].roles & roles)
            appendf(buf, n, &len, "%s %s", k++ ? "," : "", cmds[i].cmd);
    return buf;
}

void kvp_config_print_flags(FILE *f, unsigned roles, const char *const *skip, int indent)
{
    int col = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t nl = strlen(keys[i].name);
        int skipped = 0;
        for (size_t j = 0; skip && skip[j]; j++)
            skipped |= !strcmp(skip[j], keys[i].name);
        /* a secret is never a flag (its *_file key is) */
        if (skipped || !(keys[i].roles & roles) ||
            (nl > 6 && !strcmp(keys[i].name + nl - 6, "_token")))
            continue;
        char flag[72];
        snprintf(flag, sizeof flag, "--%s", keys[i].name);
        for (char *p = flag; *p; p++)
            *p = *p == '_' ? '-' : *p;
        int w = (int)strlen(flag);
        if (col > 0 && col + 1 + w > 79) {
            fputc('\n', f);
            col = 0;
        }
        if (col == 0)
            col = fprintf(f, "%*s%s", indent, "", flag);
        else
            col += fprintf(f, " %s", flag);
    }
    if (col)
        fputc('\n', f);
}

/* --------------------------------------------------------------- text bits */

/* Appends printf output to buf[*len..n), keeping it NUL-terminated. */
static void appendf(char *buf, size_t n, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t n, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    if (r > 0)
        *len = (*len + (size_t)r < n) ? *len + (size_t)r : n - 1;
}

/* s as a double-quoted string: control and non-ASCII bytes as \xNN, '"' and
 * '\' escaped, cut after 60 bytes with "...". */
static void quote(const char *s, char *buf, size_t n)
{
    size_t len = 0;
    appendf(buf, n, &len, "\"");
    size_t i = 0;
    for (; s[i] && i < 60; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            appendf(buf, n, &len, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            appendf(buf, n, &len, "\\x%02x", ch);
        else
            appendf(buf, n, &len, "%c", ch);
    }
    appendf(buf, n, &len, "%s\"", s[i] ? "..." : "");
}

/* "250ms", "5s", "2m", "720h": the largest unit that divides ms exactly. */
static void fmt_ms(uint64_t ms, char *buf, size_t n)
{
    unsigned long long v = (unsigned long long)ms;
    if (v != 0 && v % 3600000 == 0)
        snprintf(buf, n, "%lluh", v / 3600000);
    else if (v != 0 && v % 60000 == 0)
        snprintf(buf, n, "%llum", v / 60000);
    else if (v != 0 && v % 1000 == 0)
        snprintf(buf, n, "%llus", v / 1000);
    else
        snprintf(buf, n, "%llums", v);
}

/* What a key accepts, for the "(allowed: ...)" part of messages. */
static void describe_allowed(const struct key_def *k, char *buf, size_t n)
{
    size_t len = 0;
    char a[48], b[48];
    buf[0] = '\0';
    switch (k->type) {
    case KT_STRING:
        appendf(buf, n, &len, "a string of at most %zu bytes", k->size - 1);
        break;
    case KT_SIZE:
        appendf(buf, n, &len, "a number of bytes or a string like \"64MB\", \"4GiB\", \"512k\"");
        if (k->min > 0 || k->max < UINT64_MAX)
            appendf(buf, n, &len, ", from %llu (%s) to %llu (%s) bytes",
                    (unsigned long long)k->min, kvp_size_format(k->min, a, sizeof a),
                    (unsigned long long)k->max, kvp_size_format(k->max, b, sizeof b));
        break;
    case KT_DURATION:
        appendf(buf, n, &len,
                "a number of %s or a string like \"250ms\", \"5s\", \"1m\", \"2h\"",
                k->unit_ms == 1000 ? "seconds" : "milliseconds");
        fmt_ms(k->min, a, sizeof a);
        fmt_ms(k->max, b, sizeof b);
        appendf(buf, n, &len, ", from %s to %s", a, b);
        break;
    case KT_RATIO:
        appendf(buf, n, &len, "a number in %c%g, %g%c", k->lo_open ? '(' : '[', k->lo, k->hi,
                k->hi_open ? ')' : ']');
        break;
    case KT_BOOL:
        appendf(buf, n, &len, "true or false");
        break;
    case KT_UINT:
        appendf(buf, n, &len, "a whole number from %llu to %llu", (unsigned long long)k->min,
                (unsigned long long)k->max);
        break;
    case KT_LOGLEVEL:
        appendf(buf, n, &len, "\"debug\", \"info\", \"warn\", \"error\", \"off\"");
        break;
    case KT_ENUM:
        for (int i = 0; k->choices[i]; i++)
            appendf(buf, n, &len, "%s\"%s\"", i ? ", " : "", k->choices[i]);
        break;
    }
}

static const char *type_name(enum ktype t)
{
    switch (t) {
    case KT_STRING: return "string";
    case KT_SIZE: return "size";
    case KT_DURATION: return "duration";
    case KT_RATIO: return "ratio";
    case KT_BOOL: return "bool";
    case KT_UINT: return "integer";
    case KT_LOGLEVEL: return "log level";
    case KT_ENUM: return "enum";
    }
    return "?";
}

/* Edit distance of two short strings (both < 64 bytes), for suggestions. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The closest known name within edit distance 2, or NULL. */
static const char *suggest(const char *name)
{
    if (strlen(name) >= 64)
        return NULL;
    const char *best = NULL;
    size_t bestd = 3;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *cand[4] = {keys[i].name, keys[i].aliases[0], keys[i].aliases[1],
                               keys[i].aliases[2]};
        for (int c = 0; c < 4 && cand[c]; c++) {
            if (strlen(cand[c]) >= 64)
                continue;
            size_t d = edit_distance(name, cand[c]);
            if (d < bestd) {
                bestd = d;
                best = cand[c];
            }
        }
    }
    return best;
}

/* '<src>: unknown key "X" (did you mean "Y"?) (allowed: a, b, ...; Mooncake
 * aliases: ...)'. `shown` is the key as written, `lookup` the name the
 * suggestion is computed from. Always KVP_ECONFIG. */
static int unknown_key(const char *src, const char *shown, const char *lookup, char *err,
                       size_t errlen)
{
    char q[96];
    size_t len = 0;
    quote(shown, q, sizeof q);
    if (!err || errlen == 0)
        return KVP_ECONFIG;
    err[0] = '\0';
    appendf(err, errlen, &len, "%s: unknown key %s", src, q);
    const char *s = suggest(lookup);
    if (s)
        appendf(err, errlen, &len, " (did you mean \"%s\"?)", s);
    appendf(err, errlen, &len, " (allowed:");
    for (size_t i = 0; i < NKEYS; i++)
        appendf(err, errlen, &len, "%s %s", i ? "," : "", keys[i].name);
    appendf(err, errlen, &len, "; Mooncake aliases:");
    int first = 1;
    for (size_t i = 0; i < NKEYS; i++)
        for (int a = 0; a < 3 && keys[i].aliases[a]; a++, first = 0)
            appendf(err, errlen, &len, "%s %s", first ? "" : ",", keys[i].aliases[a]);
    appendf(err, errlen, &len, ")");
    return KVP_ECONFIG;
}

/* ------------------------------------------------------------ value apply */

/* One value to apply, from JSON or from a flag (always a string). */
struct val {
    enum { V_STRING, V_INT, V_REAL, V_TRUE, V_FALSE, V_NULL, V_OBJECT, V_ARRAY } kind;
    const char *s;
    long long i;
    double d;
};

/* Where a value came from, for messages. */
struct ctx {
    char where[300]; /* "path:3:25", "config:1:9", "flag --lease-ttl" */
    const char *key; /* as written by the user; NULL: `where` names it (a flag) */
    char *err;
    size_t errlen;
};

static void show(const struct val *v, char *buf, size_t n)
{
    switch (v->kind) {
    case V_STRING: quote(v->s, buf, n); break;
    case V_INT: snprintf(buf, n, "%lld", v->i); break;
    case V_REAL: snprintf(buf, n, "%.15g", v->d); break;
    case V_TRUE: snprintf(buf, n, "true"); break;
    case V_FALSE: snprintf(buf, n, "false"); break;
    case V_NULL: snprintf(buf, n, "null"); break;
    case V_OBJECT: snprintf(buf, n, "{...}"); break;
    case V_ARRAY: snprintf(buf, n, "[...]"); break;
    }
}

/* '<where>: key "K": value V <what> (allowed: A)', or for a flag '<where>: value V
 * <what> (allowed: A)'; returns KVP_ECONFIG. */
static int bad_value(struct ctx *x, const struct key_def *k, const struct val *v, const char *what)
{
    char kq[100] = "", vq[96], allowed[256];
    if (x->key) {
        memcpy(kq, ": key ", 6);
        quote(x->key, kq + 6, sizeof kq - 6);
    }
    show(v, vq, sizeof vq);
    describe_allowed(k, allowed, sizeof allowed);
    if (x->err && x->errlen)
        snprintf(x->err, x->errlen, "%s%s: value %s %s (allowed: %s)", x->where, kq, vq, what,
                 allowed);
    return KVP_ECONFIG;
}

/* Decimal digits only, no sign or blanks; 0 or -1 (also on overflow). */
static int parse_uint(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
            return -1;
    }
    *out = v;
    return 0;
}

/* A finite decimal number like "0.9", ".5", "1", "1e-1"; 0 or -1. */
static int parse_double(const char *s, double *out)
{
    if (!((*s >= '0' && *s <= '9') || *s == '.' || *s == '-' || *s == '+') || strpbrk(s, "xX"))
        return -1; /* no blanks, "nan", "inf" or hex floats */
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

/* The integer a SIZE / DURATION / UINT value stands for; 0, 1 = not of
 * that type, 2 = negative or too big. */
static int numeric_value(const struct key_def *k, const struct val *v, uint64_t *out)
{
    char tmp[64];
    const char *s;
    if (v->kind == V_INT) {
        if (v->i < 0)
            return 2;
        uint64_t u = (uint64_t)v->i;
        if (k->type == KT_DURATION && __builtin_mul_overflow(u, k->unit_ms, &u))
            return 2;
        *out = u;
        return 0;
    }
    if (v->kind == V_REAL) {
        if (v->d < 0)
            return 2;
        /* 15 significant digits reproduce what was written ("1.5", "0.25"). */
        snprintf(tmp, sizeof tmp, "%.15g", v->d);
        s = tmp;
    } else if (v->kind == V_STRING) {
        s = v->s;
    } else {
        return 1;
    }
    int r;
    if (k->type == KT_SIZE)
        r = kvp_size_parse(s, out);
    else if (k->type == KT_DURATION)
        r = kvp_duration_parse(s, k->unit_ms, out);
    else
        r = parse_uint(s, out);
    return r == 0 ? 0 : 1;
}

static int parse_bool(const struct val *v, int *out)
{
    if (v->kind == V_TRUE || v->kind == V_FALSE) {
        *out = v->kind == V_TRUE;
        return 0;
    }
    if (v->kind == V_STRING && strcasecmp(v->s, "true") == 0) {
        *out = 1;
        return 0;
    }
    if (v->kind == V_STRING && strcasecmp(v->s, "false") == 0) {
        *out = 0;
        return 0;
    }
    return -1;
}

static int ratio_in_range(const struct key_def *k, double d)
{
    if (k->lo_open ? !(d > k->lo) : !(d >= k->lo))
        return 0;
    if (k->hi_open ? !(d < k->hi) : !(d <= k->hi))
        return 0;
    return 1;
}

/* Checks v against k and stores it in c; on error *c is unchanged. */
static int apply(kvp_config *c, const struct key_def *k, const struct val *v, struct ctx *x)
{
    char *field = (char *)c + k->off;
    switch (k->type) {
    case KT_STRING:
    case KT_ENUM: {
        if (v->kind != V_STRING)
            return bad_value(x, k, v, "is not a string");
        size_t len = strlen(v->s);
        if (k->type == KT_ENUM) {
            int ok = 0;
            for (int i = 0; k->choices[i]; i++)
                ok |= strcmp(k->choices[i], v->s) == 0;
            if (!ok)
                return bad_value(x, k, v, "is not one of the allowed values");
        } else if (len >= k->size) {
            char what[64];
            snprintf(what, sizeof what, "is too long (%zu bytes)", len);
            return bad_value(x, k, v, what);
        }
        memcpy(field, v->s, len + 1);
        return 0;
    }
    case KT_SIZE:
    case KT_DURATION:
    case KT_UINT: {
        uint64_t u = 0;
        int r = numeric_value(k, v, &u);
        if (r == 1) {
            const char *what = k->type == KT_SIZE       ? "is not a size"
                               : k->type == KT_DURATION ? "is not a duration"
                                                        : "is not a whole number";
            return bad_value(x, k, v, what);
        }
        if (r == 2 || u < k->min || u > k->max)
            return bad_value(x, k, v, "is out of range");
        memcpy(field, &u, sizeof u);
        return 0;
    }
    case KT_RATIO: {
        double d;
        if (v->kind == V_INT)
            d = (double)v->i;
        else if (v->kind == V_REAL)
            d = v->d;
        else if (v->kind != V_STRING || parse_double(v->s, &d) != 0)
            return bad_value(x, k, v, "is not a number");
        if (!ratio_in_range(k, d))
            return bad_value(x, k, v, "is out of range");
        memcpy(field, &d, sizeof d);
        return 0;
    }
    case KT_BOOL: {
        int b;
        if (parse_bool(v, &b) != 0)
            return bad_value(x, k, v, "is not a boolean");
        memcpy(field, &b, sizeof b);
        return 0;
    }
    case KT_LOGLEVEL: {
        int lv = v->kind == V_STRING ? kvp_log_level_parse(v->s) : -1;
        if (lv < 0)
            return bad_value(x, k, v, "is not a log level");
        memcpy(field, &lv, sizeof lv);
        return 0;
    }
    }
    return KVP_ECONFIG;
}

/* ---------------------------------------------------------------- defaults */

_Static_assert(NKEYS <= 128, "kvp_config.set_mask has one bit per key");

/* Records that key k was given by a file, a string or a flag. */
static void mark_set(kvp_config *c, const struct key_def *k)
{
    size_t i = (size_t)(k - keys);
    c->set_mask[i / 64] |= 1ull << (i % 64);
}

/* Whether the key named `name` was given explicitly. */
static int was_set(const kvp_config *c, const char *name)
{
    const struct key_def *k = find_key(name);
    return k && (c->set_mask[(size_t)(k - keys) / 64] >> ((size_t)(k - keys) % 64)) & 1u;
}

int kvp_config_was_set(const kvp_config *c, const char *name)
{
    char n[64];
    return c && canon_name(name, n, sizeof n) == 0 && was_set(c, n);
}

const char *kvp_config_mode(const kvp_config *c)
{
    if (was_set(c, "mode"))
        return c->mode;
    return was_set(c, "global_segment_size") && c->global_segment_size ? "embedded"
                                                                      : "standalone-store";
}

void kvp_config_defaults(kvp_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++) {
        struct val v = {.kind = V_STRING, .s = keys[i].def};
        struct ctx x = {.where = "default", .key = keys[i].name};
        /* Every default parses (test_config checks each row). */
        (void)apply(c, &keys[i], &v, &x);
    }
}

/* ------------------------------------------------------------- JSON input */

/* A cursor over JSON text that tracks line and column (1-based; a column is
 * a character, so UTF-8 continuation bytes do not count), as jansson does. */
struct scan {
    const char *p, *end;
    int line, col;
};

static void adv(struct scan *s)
{
    char ch = *s->p++;
    if (ch == '\n') {
        s->line++;
        s->col = 1;
    } else if (((unsigned char)ch & 0xC0) != 0x80) {
        s->col++;
    }
}

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        adv(s);
}

/* At an opening '"': moves past the closing one. */
static void skip_string(struct scan *s)
{
    adv(s);
    while (s->p < s->end && *s->p != '"') {
        if (*s->p == '\\' && s->p + 1 < s->end)
            adv(s);
        adv(s);
    }
    if (s->p < s->end)
        adv(s);
}

static void skip_value(struct scan *s)
{
    int depth = 0;
    while (s->p < s->end) {
        char ch = *s->p;
        if (ch == '"') {
            skip_string(s);
        } else if (ch == '{' || ch == '[') {
            depth++;
            adv(s);
        } else if (ch == '}' || ch == ']') {
            if (depth == 0)
                return;
            depth--;
            adv(s);
        } else if (depth == 0 && (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r')) {
            return;
        } else {
            adv(s);
        }
        if (depth == 0 && (ch == '"' || ch == '}' || ch == ']'))
            return;
    }
}

/* Does the raw JSON string token [a, b) (quotes included) decode to key? */
static int token_is(const char *a, const char *b, const char *key)
{
    if (!memchr(a, '\\', (size_t)(b - a))) {
        size_t n = (size_t)(b - a) - 2;
        return strlen(key) == n && memcmp(a + 1, key, n) == 0;
    }
    json_t *j = json_loadb(a, (size_t)(b - a), JSON_DECODE_ANY, NULL);
    int eq = j && json_is_string(j) && strcmp(json_string_value(j), key) == 0;
    json_decref(j);
    return eq;
}

/*
 * Position of top-level key `key` and of its value in `text`, which jansson
 * has already accepted as a JSON object. Leaves the outputs at 0 if absent.
 */
static void locate(const char *text, size_t len, const char *key, int *kl, int *kc, int *vl,
                   int *vc)
{
    struct scan s = {.p = text, .end = text + len, .line = 1, .col = 1};
    *kl = *kc = *vl = *vc = 0;
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{')
        return;
    adv(&s);
    for (;;) {
        skip_ws(&s);
        if (s.p >= s.end || *s.p != '"')
            return;
        int line = s.line, col = s.col;
        const char *a = s.p;
        skip_string(&s);
        int match = token_is(a, s.p, key);
        skip_ws(&s);
        if (s.p >= s.end || *s.p != ':')
            return;
        adv(&s);
        skip_ws(&s);
        if (match) {
            *kl = line, *kc = col, *vl = s.line, *vc = s.col;
            return;
        }
        skip_value(&s);
        skip_ws(&s);
        if (s.p >= s.end || *s.p != ',')
            return;
        adv(&s);
    }
}

static void at(char *buf, size_t n, const char *src, int line, int col)
{
    if (line > 0)
        snprintf(buf, n, "%s:%d:%d", src, line, col);
    else
        snprintf(buf, n, "%s", src);
}

static struct val val_of(json_t *j)
{
    struct val v = {.kind = V_NULL};
    switch (json_typeof(j)) {
    case JSON_STRING: v.kind = V_STRING, v.s = json_string_value(j); break;
    case JSON_INTEGER: v.kind = V_INT, v.i = (long long)json_integer_value(j); break;
    case JSON_REAL: v.kind = V_REAL, v.d = json_real_value(j); break;
    case JSON_TRUE: v.kind = V_TRUE; break;
    case JSON_FALSE: v.kind = V_FALSE; break;
    case JSON_NULL: v.kind = V_NULL; break;
    case JSON_OBJECT: v.kind = V_OBJECT; break;
    case JSON_ARRAY: v.kind = V_ARRAY; break;
    }
    return v;
}

static int load_json(kvp_config *c, const char *text, size_t len, const char *src, char *err,
                     size_t errlen);

/* Whole-line comments: a line whose first characters other than blanks
 * (space, tab) are "#" or "//" is turned into blanks, its newline kept, so
 * every line and column jansson and locate() report stay those of the file.
 * A JSON string cannot span lines, so such a line is never inside one: a
 * "#" or "//" after a value, or inside a string, is left to the parser.
 * Returns a kvp_malloc'ed copy of len bytes, or NULL when out of memory. */
static char *blank_comments(const char *text, size_t len)
{
    char *t = kvp_malloc(len ? len : 1);
    if (!t)
        return NULL;
    memcpy(t, text, len);
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && (t[j] == ' ' || t[j] == '\t'))
            j++;
        int comment = j < len && (t[j] == '#' || (t[j] == '/' && j + 1 < len && t[j + 1] == '/'));
        while (j < len && t[j] != '\n') {
            if (comment)
                t[j] = ' ';
            j++;
        }
        i = j + 1;
    }
    return t;
}

/* Parses text[0..len) as a flat JSON object (whole-line comments blanked)
 * and applies each key over *c. src names the input in messages ("path"
 * or "config"). */
static int load_text(kvp_config *c, const char *raw, size_t len, const char *src, char *err,
                     size_t errlen)
{
    char *text = blank_comments(raw, len);
    if (!text) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory reading the configuration", src);
        return KVP_ENOMEM;
    }
    int rc = load_json(c, text, len, src, err, errlen);
    kvp_free(text);
    return rc;
}

/* load_text's parse of the comment-free text. */
static int load_json(kvp_config *c, const char *text, size_t len, const char *src, char *err,
                     size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (err && errlen)
            snprintf(err, errlen, "%s:%d:%d: invalid JSON: %s", src, je.line, je.column, je.text);
        return KVP_ECONFIG;
    }
    if (!json_is_object(root)) {
        if (err && errlen)
            snprintf(err, errlen, "%s: the configuration must be a JSON object of keys, not an array",
                     src);
        json_decref(root);
        return KVP_ECONFIG;
    }
    int rc = 0;
    const char *name;
    json_t *value;
    json_object_foreach(root, name, value)
    {
        int kl, kc, vl, vc;
        const struct key_def *k = find_key(name);
        if (!k && is_ignored(name)) {
            KVP_DEBUG("config", "%s: ignoring Mooncake key \"%s\" (no such component in kvpool)",
                      src, name);
            continue;
        }
        locate(text, len, name, &kl, &kc, &vl, &vc);
        if (!k) {
            char where[300];
            at(where, sizeof where, src, kl, kc);
            rc = unknown_key(where, name, name, err, errlen);
            break;
        }
        struct ctx x = {.key = name, .err = err, .errlen = errlen};
        at(x.where, sizeof x.where, src, vl, vc);
        struct val v = val_of(value);
        rc = apply(c, k, &v, &x);
        if (rc != 0)
            break;
        mark_set(c, k);
    }
    json_decref(root);
    return rc;
}

int kvp_config_load_string(kvp_config *c, const char *json, char *err, size_t errlen)
{
    if (!c || !json) {
        if (err && errlen)
            snprintf(err, errlen, "config: no configuration text");
        return KVP_EINVALID_PARAMS;
    }
    return load_text(c, json, strlen(json), "config", err, errlen);
}

#define CONFIG_FILE_MAX (16u << 20) /* a configuration file is small; refuse more */

int kvp_config_load_file(kvp_config *c, const char *path, char *err, size_t errlen)
{
    if (!c || !path) {
        if (err && errlen)
            snprintf(err, errlen, "config: no file name");
        return KVP_EINVALID_PARAMS;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open configuration file: %s", path, strerror(e));
        return e == ENOENT ? KVP_EFILE_NOT_FOUND : KVP_EFILE_READ_FAIL;
    }
    /* Read to EOF in a loop (the file may be a pipe, so no fseek/ftell). */
    size_t cap = 0, len = 0;
    char *buf = NULL;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 4096;
            if (ncap > CONFIG_FILE_MAX) {
                if (err && errlen)
                    snprintf(err, errlen, "%s: configuration file larger than %u bytes", path,
                             CONFIG_FILE_MAX);
                rc = KVP_EFILE_READ_FAIL;
                break;
            }
            char *nb = kvp_realloc(buf, ncap);
            if (!nb) {
                if (err && errlen)
                    snprintf(err, errlen, "%s: out of memory reading the configuration", path);
                rc = KVP_ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                int e = errno;
                if (err && errlen)
                    snprintf(err, errlen, "%s: cannot read configuration file: %s", path,
                             strerror(e));
                rc = KVP_EFILE_READ_FAIL;
            }
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        rc = load_text(c, buf ? buf : "", len, path, err, errlen);
    kvp_free(buf);
    return rc;
}

/* ----------------------------------------------------------------- flags */

/* 'unknown flag --NAME (did you mean --OTHER?; the flags are every configuration
 * key as --key-name, see --help)'. Always KVP_ECONFIG. */
static int unknown_flag(const char *shown, const char *lookup, char *err, size_t errlen)
{
    char q[96], dashed[64];
    size_t len = 0;
    if (!err || errlen == 0)
        return KVP_ECONFIG;
    err[0] = '\0';
    /* bare when it is a plausible name, else quoted (control bytes escaped) */
    if (*shown && strlen(shown) <= 60 &&
        strspn(shown, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
            strlen(shown)) {
        appendf(err, errlen, &len, "unknown flag --%s", shown);
    } else {
        quote(shown, q, sizeof q);
        appendf(err, errlen, &len, "unknown flag %s", q);
    }
    const char *s = suggest(lookup);
    if (s && strlen(s) < sizeof dashed) {
        for (size_t i = 0; i <= strlen(s); i++)
            dashed[i] = s[i] == '_' ? '-' : s[i];
        appendf(err, errlen, &len, " (did you mean --%s?)", dashed);
    }
    appendf(err, errlen, &len, " (allowed: this command's flags and the configuration keys "
                               "it reads as --key-name, listed by its --help)");
    return KVP_ECONFIG;
}

int kvp_config_set(kvp_config *c, const char *key, const char *value, char *err, size_t errlen)
{
    if (!c || !key) {
        if (err && errlen)
            snprintf(err, errlen, "flag: no key");
        return KVP_EINVALID_PARAMS;
    }
    /* "--lease-ttl" and "lease-ttl" both mean "lease_ttl". */
    char name[96];
    const char *k0 = key;
    if (k0[0] == '-' && k0[1] == '-')
        k0 += 2;
    size_t n = strlen(k0);
    if (n >= sizeof name)
        return unknown_flag(k0, k0, err, errlen);
    for (size_t i = 0; i <= n; i++)
        name[i] = k0[i] == '-' ? '_' : k0[i];
    const struct key_def *k = find_key(name);
    int ignored = !k && is_ignored(name);
    if (!k && !ignored)
        return unknown_flag(k0, name, err, errlen);
    /* k0 is a known key name (letters, digits, '_', '-'): shown bare */
    struct ctx x = {.key = NULL, .err = err, .errlen = errlen};
    snprintf(x.where, sizeof x.where, "flag --%s", k0);
    if (!value) {
        if (err && errlen)
            snprintf(err, errlen, "%s: missing value", x.where);
        return KVP_ECONFIG;
    }
    if (ignored) {
        KVP_DEBUG("config", "flag: ignoring Mooncake key \"%s\" (no such component in kvpool)",
                  name);
        return 0;
    }
    struct val v = {.kind = V_STRING, .s = value};
    if (k->type == KT_BOOL) {
        /* a flag takes the words of every boolean flag (cli.h); a file JSON's
         * true / false or "true" / "false" */
        int b = kvp_config_bool_word(value);
        if (b < 0) {
            char vq[96];
            quote(value, vq, sizeof vq);
            if (err && errlen)
                snprintf(err, errlen, "%s: value %s is not a boolean (allowed: %s)", x.where, vq,
                         KVP_CONFIG_BOOL_WORDS);
            return KVP_ECONFIG;
        }
        v.s = b ? "true" : "false";
    }
    int rc = apply(c, k, &v, &x);
    if (rc == 0)
        mark_set(c, k);
    return rc;
}

int kvp_config_bool_word(const char *v)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; v && i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

/* ------------------------------------------------------------- validation */

static int invalid(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int invalid(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        size_t len = 0;
        err[0] = '\0';
        appendf(err, errlen, &len, "invalid configuration: ");
        va_list ap;
        va_start(ap, fmt);
        if (len + 1 < errlen)
            vsnprintf(err + len, errlen - len, fmt, ap);
        va_end(ap);
    }
    return KVP_ECONFIG;
}

/* The current value of k in c, as text. */
static void show_field(const kvp_config *c, const struct key_def *k, char *buf, size_t n)
{
    const char *field = (const char *)c + k->off;
    uint64_t u;
    double d;
    int i;
    switch (k->type) {
    case KT_STRING:
    case KT_ENUM:
        if (memchr(field, '\0', k->size))
            quote(field, buf, n);
        else
            snprintf(buf, n, "(not NUL-terminated)");
        break;
    case KT_SIZE:
    case KT_UINT:
        memcpy(&u, field, sizeof u);
        snprintf(buf, n, "%llu", (unsigned long long)u);
        break;
    case KT_DURATION:
        memcpy(&u, field, sizeof u);
        fmt_ms(u, buf, n);
        break;
    case KT_RATIO:
        memcpy(&d, field, sizeof d);
        snprintf(buf, n, "%g", d);
        break;
    case KT_BOOL:
    case KT_LOGLEVEL:
        memcpy(&i, field, sizeof i);
        snprintf(buf, n, "%d", i);
        break;
    }
}

/* Is the stored field within the key's own limits? */
static int field_ok(const kvp_config *c, const struct key_def *k)
{
    const char *field = (const char *)c + k->off;
    uint64_t u;
    double d;
    int i;
    switch (k->type) {
    case KT_STRING:
        return memchr(field, '\0', k->size) != NULL;
    case KT_ENUM:
        if (!memchr(field, '\0', k->size))
            return 0;
        for (int j = 0; k->choices[j]; j++)
            if (strcmp(k->choices[j], field) == 0)
                return 1;
        return 0;
    case KT_SIZE:
    case KT_DURATION:
    case KT_UINT:
        memcpy(&u, field, sizeof u);
        return u >= k->min && u <= k->max;
    case KT_RATIO:
        memcpy(&d, field, sizeof d);
        return ratio_in_range(k, d);
    case KT_BOOL:
        memcpy(&i, field, sizeof i);
        return i == 0 || i == 1;
    case KT_LOGLEVEL:
        memcpy(&i, field, sizeof i);
        return i >= KVP_LOG_DEBUG && i <= KVP_LOG_OFF;
    }
    return 0;
}

int kvp_config_validate(const kvp_config *c, char *err, size_t errlen)
{
    if (!c)
        return invalid(err, errlen, "no configuration");
    for (size_t i = 0; i < NKEYS; i++) {
        if (!field_ok(c, &keys[i])) {
            char v[96], allowed[256];
            show_field(c, &keys[i], v, sizeof v);
            describe_allowed(&keys[i], allowed, sizeof allowed);
            return invalid(err, errlen, "key \"%s\": value %s is out of range (allowed: %s)",
                           keys[i].name, v, allowed);
        }
    }
    if ((c->kv_events[0] && strncmp(c->kv_events, "tcp://", 6) != 0) ||
        (c->kv_events_replay[0] && strncmp(c->kv_events_replay, "tcp://", 6) != 0))
        return invalid(err, errlen, "key \"%s\": \"%s\" is not a tcp://HOST:PORT endpoint",
                       c->kv_events[0] && strncmp(c->kv_events, "tcp://", 6) ? "kv_events"
                                                                           : "kv_events_replay",
                       c->kv_events[0] && strncmp(c->kv_events, "tcp://", 6)
                           ? c->kv_events
                           : c->kv_events_replay);
    if (c->kv_events_replay[0] && !c->kv_events[0])
        return invalid(err, errlen, "key \"kv_events_replay\" needs key \"kv_events\"");
    if (!(c->evict_low < c->evict_high))
        return invalid(err, errlen,
                       "key \"eviction_low_watermark_ratio\" (%g) must be less than key "
                       "\"eviction_high_watermark_ratio\" (%g)",
                       c->evict_low, c->evict_high);
    if (!(c->offload_low < c->offload_high))
        return invalid(err, errlen,
                       "key \"offload_low_watermark_ratio\" (%g) must be less than key "
                       "\"offload_high_watermark_ratio\" (%g)",
                       c->offload_low, c->offload_high);
    if ((c->segment_port_min == 0) != (c->segment_port_max == 0) ||
        c->segment_port_min > c->segment_port_max)
        return invalid(err, errlen,
                       "keys \"segment_port_min\" (%llu) and \"segment_port_max\" (%llu) must "
                       "both be 0 or form a range min <= max",
                       (unsigned long long)c->segment_port_min,
                       (unsigned long long)c->segment_port_max);
    if (c->offload_page_size % 4096)
        return invalid(err, errlen,
                       "key \"offload_page_size\": %llu is not a multiple of 4 KiB",
                       (unsigned long long)c->offload_page_size);
    if (c->offload_capacity && c->offload_capacity < 2 * c->offload_page_size)
        return invalid(err, errlen,
                       "key \"offload_capacity\" (%llu) must hold at least two pages of "
                       "key \"offload_page_size\" (%llu), or be 0 (90 %% of the filesystem)",
                       (unsigned long long)c->offload_capacity,
                       (unsigned long long)c->offload_page_size);
    if (c->soft_pin_ttl_ms > c->soft_pin_max_ttl_ms) {
        char a[32], b[32];
        fmt_ms(c->soft_pin_ttl_ms, a, sizeof a);
        fmt_ms(c->soft_pin_max_ttl_ms, b, sizeof b);
        return invalid(err, errlen,
                       "key \"soft_pin_ttl\" (%s) must not exceed key \"soft_pin_max_ttl\" (%s)",
                       a, b);
    }
    if (c->lease_ttl_ms > c->client_ttl_ms) {
        char a[32], b[32];
        fmt_ms(c->lease_ttl_ms, a, sizeof a);
        fmt_ms(c->client_ttl_ms, b, sizeof b);
        return invalid(err, errlen,
                       "key \"lease_ttl\" (%s) must not exceed key \"client_ttl\" (%s): the "
                       "leases of a dropped client must have expired when it is dropped",
                       a, b);
    }
    /* Mooncake's client rules (spec §3.1): an embedded client contributes
     * memory; a standalone-store client contributes none (the storage
     * nodes do), so a segment size given for it is a mistake. */
    if (strcmp(kvp_config_mode(c), "embedded") == 0 && c->global_segment_size == 0)
        return invalid(err, errlen,
                       "embedded mode requires global_segment_size > 0 (use \"mode\": "
                       "\"standalone-store\" for a client that contributes no memory)");
    if (strcmp(c->mode, "standalone-store") == 0 && was_set(c, "mode") &&
        c->global_segment_size != 0 && was_set(c, "global_segment_size"))
        return invalid(err, errlen,
                       "standalone-store mode requires global_segment_size == 0 (the storage "
                       "nodes contribute the memory; this client contributes none)");
    if (c->preferred_segment[0] && strspn(c->preferred_segment, " \t\r\n") ==
                                       strlen(c->preferred_segment))
        return invalid(err, errlen,
                       "key \"preferred_segment\" must be a non-empty host:port (it is only "
                       "white space)");
    if (!c->tenant[0] || strspn(c->tenant, " \t\r\n") == strlen(c->tenant))
        return invalid(err, errlen, "key \"tenant\" must be a non-empty name (it is \"%s\")",
                       c->tenant);
    /* a group name (resolved when the node starts) or a numeric gid */
    if (c->shm_group[0] &&
        (c->shm_group[0] == '-' ||
         strspn(c->shm_group, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              "0123456789._-") != strlen(c->shm_group)))
        return invalid(err, errlen,
                       "key \"shm_group\" must be a group name or a numeric gid (it is \"%s\")",
                       c->shm_group);
    /* service.c: frames above 256 KiB may use 15/16 of the budget, so one
     * largest frame must fit in that share */
    if (c->input_budget - c->input_budget / 16 < c->max_frame + 24)
        return invalid(err, errlen,
                       "key \"input_memory_budget\" (%llu) must be at least 16/15 of key "
                       "\"max_frame_size\" (%llu) plus 24 bytes: one largest frame must fit in "
                       "the 15/16 of the budget large frames may use",
                       (unsigned long long)c->input_budget, (unsigned long long)c->max_frame);
    /* master.c: a follower's share of the budget holds a snapshot step's
     * output above the window the service produces it under */
    if (c->repl_buffer_budget / c->max_followers < 8 * MIB_)
        return invalid(err, errlen,
                       "key \"repl_buffer_budget\" (%llu) must be at least 8 MiB per follower: "
                       "key \"max_followers\" (%llu) times 8 MiB",
                       (unsigned long long)c->repl_buffer_budget,
                       (unsigned long long)c->max_followers);
    if (c->max_key >= c->max_frame)
        return invalid(err, errlen,
                       "key \"max_key_size\" (%llu) must be less than key \"max_frame_size\" "
                       "(%llu): a key must fit in one message",
                       (unsigned long long)c->max_key, (unsigned long long)c->max_frame);
    return 0;
}

/* -------------------------------------------------------------- reference */

const char *kvp_config_key_name(size_t i)
{
    return i < NKEYS ? keys[i].name : NULL;
}

void kvp_config_print_reference(FILE *f)
{
    fprintf(f, "%-30s %-9s %-18s %s\n", "key", "type", "default", "meaning");
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key_def *k = &keys[i];
        char def[64], allowed[256], who[128];
        if (k->type == KT_STRING || k->type == KT_ENUM)
            quote(k->def, def, sizeof def);
        else
            snprintf(def, sizeof def, "%s", k->def);
        describe_allowed(k, allowed, sizeof allowed);
        fprintf(f, "%-30s %-9s %-18s %s\n", k->name, type_name(k->type), def, k->help);
        fprintf(f, "%-30s %-9s %-18s   allowed: %s\n", "", "", "", allowed);
        fprintf(f, "%-30s %-9s %-18s   read by: %s\n", "", "", "",
                kvp_config_roles_text(k->roles, who, sizeof who));
        if (k->aliases[0]) {
            fprintf(f, "%-30s %-9s %-18s   also accepted as (Mooncake):", "", "", "");
            for (int a = 0; a < 3 && k->aliases[a]; a++)
                fprintf(f, "%s %s", a ? "," : "", k->aliases[a]);
            fputc('\n', f);
        }
    }
    fprintf(f, "Mooncake keys accepted in a file and ignored (refused as flags):");
    for (size_t i = 0; i < NIGNORED; i++)
        fprintf(f, "%s %s", i ? "," : "", ignored_keys[i]);
    fprintf(f, "\nFlags: --key-name VALUE sets a key ('-' and '_' are the same) for a command "
               "that reads it (\"read by\"); other commands refuse it. A file may hold every "
               "key. Flags override the file, the file overrides the defaults.\n");
}

/* ------------------------------------------------------------ environment */


void kvp_config_apply_log_level(const kvp_config *c)
{
    if (kvp_config_was_set(c, "log_level"))
        kvp_log_set_configured(c->log_level);
    int f = kvp_log_format_parse(c->log_format);
    if (kvp_config_was_set(c, "log_format") && f >= 0)
        kvp_log_set_configured_format(f);
}

int kvp_config_load_spec(kvp_config *c, const char *spec, char *err, size_t errlen)
{
    const char *t = spec, *path;
    while (t && (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r'))
        t++;
    if (t && *t == '{')
        return kvp_config_load_string(c, spec, err, errlen);
    if (t && *t) /* not JSON text: the path of a JSON file */
        return kvp_config_load_file(c, spec, err, errlen);
    if ((path = kvp_config_path_from_env()) != NULL)
        return kvp_config_load_file(c, path, err, errlen);
    return 0;
}

const char *kvp_config_path_from_env(void)
{
    const char *p = getenv("KVPOOL_CONFIG");
    if (p && *p)
        return p;
    p = getenv("MOONCAKE_CONFIG_PATH");
    if (p && *p)
        return p;
    return NULL;
}
