/*
 * config.h -- kvpool configuration: one struct, filled from defaults, then a
 * JSON file (jansson), then command-line flags.
 *
 * The file is a flat JSON object. Keys are kvpool's own names plus the keys
 * Mooncake's config uses (so an existing MOONCAKE_CONFIG_PATH file works);
 * a Mooncake key is an alias that sets the same field. Keys that belong to
 * Mooncake components kvpool does not have (e.g. "device_name") are accepted
 * and ignored with a debug log line. Any other key is an error.
 *
 * Every error names the key, the value and what is allowed, e.g.
 *   config.json:3:25: key "lease_ttl": value "5x" is not a duration
 *   (allowed: a number of milliseconds or a string like "250ms", "5s", "1m")
 */
#ifndef KVP_CONFIG_H
#define KVP_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVP_CONFIG_ERRLEN 1536

typedef struct kvp_config {
    /* ---- master ---- */
    char listen[256];             /* "listen": master address host:port (127.0.0.1:50051) */
    char etcd[1024];              /* "etcd": etcd endpoints of a cluster of masters ("" = alone) */
    char etcd_user[128];          /* "etcd_user": etcd authentication ("" = none) */
    char etcd_password_file[256]; /* "etcd_password_file": its password (a secret file) */
    char etcd_cacert[256];        /* "etcd_cacert": https to etcd, verified against this CA */
    char etcd_cert[256];          /* "etcd_cert": client certificate for etcd (PEM) */
    char etcd_key[256];           /* "etcd_key": its private key (PEM) */
    char cluster[65];             /* "cluster": the cluster's name in etcd ("default") */
    char advertise[256];          /* "advertise": the address a leader publishes ("" = listen) */
    uint64_t ha_lease_ttl_ms;     /* "ha_lease_ttl" (ms): the leader's etcd lease, 2 s */
    int ha_sync;                  /* "ha_sync": PUT_END answered once the standbys have it */
    uint64_t ha_sync_timeout_ms;  /* "ha_sync_timeout" (ms): a standby's ack is awaited this long */
    uint64_t max_followers;       /* "max_followers": standbys following the index at once (8) */
    uint64_t repl_buffer_budget;  /* "repl_buffer_budget": bytes of all followers' unsent
                                     output together (256 MiB); each gets 1/max_followers */
    char snapshot_file[1024];     /* "snapshot_file": the index on local disk ("" = none) */
    char http[256];               /* "http": master / node HTTP endpoint host:port ("" = off) */
    char http_token_file[256];    /* "http_token_file": the bearer token HTTP requests need */
    char kv_events[256];          /* "kv_events": master: PUB endpoint of KV events ("" = off) */
    char kv_events_replay[256];   /* "kv_events_replay": master: their replay ROUTER ("" = none) */
    uint64_t kv_events_buffer;    /* "kv_events_buffer": batches kept for replay (10000) */
    char cluster_token[256];      /* "cluster_token": "" = none (secret.h: file, env) */
    char cluster_token_file[256]; /* "cluster_token_file": file holding it */
    char node_token[256];         /* "node_token": credential to mount segments */
    char node_token_file[256];    /* "node_token_file" */
    char tenant_token[256];       /* "tenant_token": client: its tenant's credential */
    char tenant_token_file[256];  /* "tenant_token_file" */
    char tenant_tokens_file[256]; /* "tenant_tokens_file": master: "TENANT TOKEN" lines */
    int insecure;                 /* "insecure": listen beyond loopback with no credential */
    int ucx_insecure;             /* "ucx_insecure": master: ucx nodes while tenants are
                                     protected (a remote key exposes every tenant) */
    uint64_t node_max_connections; /* "node_max_connections": segment server (4096) */
    uint64_t idle_timeout_ms;     /* "idle_timeout": segment server idle connections (5 min) */
    uint64_t stall_timeout_ms;    /* "stall_timeout": segment server stalled frames (30 s) */
    uint64_t min_transfer_rate;   /* "min_transfer_rate": bytes/s a busy node connection
                                     moves at least (64 KiB) */
    uint64_t max_master_memory;   /* "max_master_memory": bytes of metadata (4 GiB) */
    uint64_t max_frame;           /* "max_frame_size": bytes (64 MiB); 4 KiB .. 1 GiB */
    uint64_t lease_ttl_ms;        /* "lease_ttl" / "default_kv_lease_ttl" (ms): 5 s */
    uint64_t soft_pin_ttl_ms;     /* "soft_pin_ttl" / "default_kv_soft_pin_ttl": 30 min */
    uint64_t soft_pin_max_ttl_ms; /* "soft_pin_max_ttl" / "max_kv_soft_pin_ttl": 24 h (< 2^31 ms) */
    uint64_t put_timeout_ms;      /* "put_timeout": 30 s */
    uint64_t client_ttl_ms;       /* "client_ttl" (bare number = seconds): 10 s */
    double evict_high;            /* "eviction_high_watermark_ratio": 0.95, (0,1] */
    double evict_low;             /* "eviction_low_watermark_ratio": 0.90, < high */
    uint64_t max_key;             /* "max_key_size": 4096; 1 .. 65535 */
    uint64_t max_connections;     /* "max_connections": 4096 */
    uint64_t max_conns_per_addr;  /* "max_connections_per_address": pre-HELLO, 64 */
    uint64_t hello_timeout_ms;    /* "hello_timeout": 5 s */
    uint64_t input_budget;        /* "input_memory_budget": bytes (1 GiB) */
    uint64_t max_segments;        /* "max_segments": 4096; 1 .. 65535 */
    uint64_t max_tenants;         /* "max_tenants": 1024; 1 .. 65535 */
    uint64_t max_objects;         /* "max_objects": 0 = unlimited */
    uint64_t max_object_size;     /* "max_object_size": bytes (1 GiB); 4 KiB .. 4 GiB - 64 KiB */
    int log_level;                /* "log_level": debug|info|warn|error (info) */
    char log_format[8];           /* "log_format": text | json (text) */

    /* ---- client / storage node ---- */
    char master_addr[256];        /* "master_server_address" / "master_server_addr" / "master" */
    char local_hostname[256];     /* "local_hostname" */
    uint64_t segment_port_min;    /* "segment_port_min": 0 (the kernel picks the port) */
    uint64_t segment_port_max;    /* "segment_port_max": 0; with min: the segment server's
                                     port range when it has no listen address */
    char protocol[32];            /* "protocol": tcp, ucx or rdma (= ucx) */
    char mode[32];                /* "mode": embedded | standalone-store (as given; the
                                     effective mode is kvp_config_mode's) */
    uint64_t global_segment_size; /* "global_segment_size": bytes (4 GiB) */
    char segment_prefault[16];    /* "segment_prefault": auto | background | sync | off */
    uint64_t local_buffer_size;   /* "local_buffer_size": bytes (0) */
    int enable_offload;           /* "enable_offload": bool (false); a storage node: an SSD
                                     tier in offload_dir; a connector: 1280 MiB staging */
    char offload_dir[1024];       /* "offload_dir": the node's SSD tier directory ("") */
    uint64_t offload_capacity;    /* "offload_capacity": bytes (0 = 90 % of the filesystem) */
    uint64_t offload_page_size;   /* "offload_page_size": bytes (128 MiB); 64 MiB .. 1 GiB */
    double offload_high;          /* "offload_high_watermark_ratio": 0.95 */
    double offload_low;           /* "offload_low_watermark_ratio": 0.85, < high */
    uint64_t offload_staging;     /* "offload_staging_budget": bytes (256 MiB) */
    uint64_t rpc_timeout_ms;      /* "rpc_timeout": 10 s */
    uint64_t replica_num;         /* "replica_num": copies written per put (1); 1 .. 3 */
    char preferred_segment[256];  /* "preferred_segment": host:port puts prefer ("" = unset) */
    char tenant[256];             /* "tenant" / "tenant_id": key namespace (default) */
    char shm_group[64];           /* "shm_group": group allowed to attach the memfd ("") */
    uint64_t set_mask[2];            /* keys given explicitly (file, string, flag): one bit per
                                     key in table order; defaults leave it 0 */
} kvp_config;

/* Fills the defaults above. */
void kvp_config_defaults(kvp_config *c);

/*
 * Applies a JSON file / string over *c. 0 on success; KVP_ECONFIG (or
 * KVP_EFILE_NOT_FOUND / KVP_EFILE_READ_FAIL) with a message in err.
 * On error *c may be partly updated.
 */
int kvp_config_load_file(kvp_config *c, const char *path, char *err, size_t errlen);
int kvp_config_load_string(kvp_config *c, const char *json, char *err, size_t errlen);

/*
 * Sets one key from a string value (used for command-line flags, where
 * "--lease-ttl 5s" becomes key "lease_ttl"; '-' and '_' are equivalent).
 * Same validation as the file; messages name the flag as given, once:
 * 'flag --lease-ttl: value "5x" is not a duration (allowed: ...)',
 * A boolean key takes the words of kvp_config_bool_word (a file: JSON
 * true / false or the strings "true" / "false").
 * 'unknown flag --lease-tll (did you mean --lease-ttl?) (allowed: ...)'.
 */
int kvp_config_set(kvp_config *c, const char *key, const char *value, char *err, size_t errlen);

/* A boolean flag's value: 1 for true, 1, yes, on; 0 for false, 0, no, off
 * (case-insensitive); -1 for anything else. */
int kvp_config_bool_word(const char *v);
#define KVP_CONFIG_BOOL_WORDS "true, false, 1, 0, yes, no, on, off (any case)"

/*
 * Loads what kvp_client_open's `config` argument names over *c: JSON object
 * text ("{...}", leading white space allowed), else the path of a JSON
 * file; NULL or "" = the file named by the environment
 * (kvp_config_path_from_env), else nothing. Same returns as the loaders.
 */
int kvp_config_load_spec(kvp_config *c, const char *spec, char *err, size_t errlen);

/* The library's rule for "log_level" and "log_format" (common/log.h):
 * when c gives one explicitly, kvp_log_set_configured(c->log_level) /
 * kvp_log_set_configured_format(its format); else nothing. */
void kvp_config_apply_log_level(const kvp_config *c);

/* Is `name` ('-' or '_') a boolean key? (a bare --name flag means true) */
int kvp_config_key_is_bool(const char *name);

/*
 * Which kvpool commands read a key: a command given a key of none of its
 * roles as a flag refuses it (src/cli/opts.c) rather than ignore it. A
 * configuration file may hold any key (one file serves every component);
 * library users (kvp_client_open, the connector) read every key of theirs.
 */
enum {
    KVP_KEY_MASTER = 1, /* the master: kvpool master, kvpool serve */
    KVP_KEY_NODE = 2,   /* a storage node: kvpool store, kvpool serve (and the
                           segment an embedded client hosts) */
    KVP_KEY_CLIENT = 4, /* a client that stores and loads: kvpool put, get, exist, rm */
    KVP_KEY_ADMIN = 8,  /* a session that only asks the master: kvpool stat, reset */
};

/* The KVP_KEY_* mask of key `name` ('-' or '_', aliases too): 0 for a
 * Mooncake key no kvpool command reads (accepted, ignored), -1 unknown. */
int kvp_config_key_roles(const char *name);

/* Who reads keys of mask `roles`, in words ("the master and storage nodes",
 * "no kvpool command"); returns buf. */
const char *kvp_config_roles_text(unsigned roles, char *buf, size_t n);

/* Was key `name` (its canonical or a Mooncake name) given by a file, a
 * string or a flag (not left at its default)? */
int kvp_config_was_set(const kvp_config *c, const char *name);

/* The flags of the keys of `roles` ("--key-name", aliases not listed; not
 * the secrets, never flags, nor the keys named in `skip`, NULL-ended, may
 * be NULL), wrapped at 80 columns with `indent` spaces before each line. */
void kvp_config_print_flags(FILE *f, unsigned roles, const char *const *skip, int indent);

/* The client's mode: "mode" when given, else "embedded" when
 * global_segment_size was given and is > 0, else "standalone-store" (a
 * client that names no memory contributes none). */
const char *kvp_config_mode(const kvp_config *c);

/* Cross-field checks (evict_low < evict_high, lease_ttl <= client_ttl, ...). */
int kvp_config_validate(const kvp_config *c, char *err, size_t errlen);

/*
 * The configuration file named by the environment: $KVPOOL_CONFIG if set and
 * non-empty, else $MOONCAKE_CONFIG_PATH if set and non-empty, else NULL.
 * The returned pointer is getenv()'s (valid until the environment changes).
 */
const char *kvp_config_path_from_env(void);

/* The canonical name of the i-th key of the table (the order of kvpool help
 * config), NULL for i past the last: lets a tool or a test walk every key. */
const char *kvp_config_key_name(size_t i);

/* Writes the key reference (key, type, default, meaning) for --help and README. */
void kvp_config_print_reference(FILE *f);

#endif
