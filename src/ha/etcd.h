/*
 * etcd.h -- a client of etcd's v3 HTTP/JSON gateway (etcd 3.4 and later):
 * the key-value calls, leases and the one transaction an election needs.
 *
 * Transport: HTTP/1.1 POSTs of JSON bodies (/v3/kv/range, /v3/kv/put,
 * /v3/kv/txn, /v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive,
 * /v3/lease/revoke) through libcurl, which is loaded with dlopen at the first
 * kvp_etcd_open: a program that never speaks to etcd neither needs nor loads
 * it (and libkvpool links statically). Endpoints are http://, or https://
 * verified against a CA file (etcd_cacert) with an optional client
 * certificate (etcd_cert, etcd_key).
 *
 * Authentication (etcd with `auth enable`): with a user (etcd_user,
 * password from etcd_password_file) a handle first POSTs
 * /v3/auth/authenticate {name, password}, then sends the token it got in an
 * `Authorization` header on every call; when etcd answers that the token is
 * invalid (expired, revoked: code 16) it authenticates again, once per
 * call. A refused password or a denied permission is KVP_EAUTH.
 * Credentials and TLS files are the process's (kvp_etcd_auth_set, from its
 * configuration at start): every target parsed afterwards carries them.
 *
 * Every answer is untrusted: it is read into a bounded buffer
 * (KVP_ETCD_MAX_ANSWER), parsed by kvp_etcd_parse (pure, fuzzed), and any
 * field of the wrong type, a revision or lease that is not a decimal
 * uint64, bad base64, or a value longer than the caller's buffer is an
 * error, never a partial result.
 *
 * Endpoints: a handle holds up to KVP_ETCD_MAX_ENDPOINTS; a call goes to the
 * current one and, when it cannot be reached or times out, to the next ones
 * in turn (each call tries every endpoint at most once). An answer etcd
 * itself gives (an error JSON) is final.
 *
 * Errors: KVP_ERPC_FAIL (no endpoint reachable, an HTTP error, an etcd
 * error answer), KVP_ERPC_TIMEOUT (the last endpoint tried timed out),
 * KVP_EPROTOCOL (a malformed answer), KVP_EAUTH (etcd refused the
 * credentials or the permission), KVP_ELEASE_EXPIRED (the lease is
 * gone: keepalive or a put under it), KVP_EBUFFER_OVERFLOW (a value larger
 * than the caller's buffer), KVP_EINVALID_PARAMS, KVP_ENOMEM,
 * KVP_ENOT_SUPPORTED (libcurl cannot be loaded: the message names it).
 *
 * Threads: a handle is used by one thread at a time (calls are serialised
 * by a lock inside); separate handles are independent.
 */
#ifndef KVP_ETCD_H
#define KVP_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_ETCD_MAX_ENDPOINTS 8
#define KVP_ETCD_MAX_HOST 255      /* "HOST:PORT" of one endpoint */
#define KVP_ETCD_MAX_CLUSTER 64    /* [A-Za-z0-9._-]+ */
#define KVP_ETCD_MAX_KEY 512
#define KVP_ETCD_MAX_VALUE 65536
#define KVP_ETCD_MAX_ANSWER (1u << 20)
#define KVP_ETCD_MAX_TOKEN 1024    /* an auth token: printable ASCII, no space */

typedef struct kvp_etcd kvp_etcd;

/* Where a cluster lives: "etcd://H:P[,H:P...]/NAME" (kvpool's and
 * Mooncake's form; NAME optional in Mooncake's, then "default"), or the
 * endpoint list alone "http://H:P[,http://H:P...]" (cluster "default"). */
/* The process's etcd credentials and TLS files ("" = not set). */
typedef struct kvp_etcd_auth {
    char user[128];      /* "" = no authentication */
    char password[256];
    char cacert[256];    /* "" = http; else https, the server verified against it */
    char cert[256];      /* client certificate and key (PEM), both or neither */
    char key[256];
} kvp_etcd_auth;

/* Sets the process's etcd credentials (copied; NULL clears them): every
 * kvp_etcd_parse_url afterwards carries them into its target. Thread-safe;
 * meant for the start. */
void kvp_etcd_auth_set(const kvp_etcd_auth *a);

/* Checks and installs (kvp_etcd_auth_set) the configuration's etcd keys:
 * a user needs a password file (read with kvp_secret_read_file's checks)
 * and a password file a user; cert and key go together and need the CA;
 * every file must be readable. Nothing set: credentials cleared. 0 or
 * KVP_ECONFIG with a message naming the key. */
int kvp_etcd_auth_configure(const char *user, const char *password_file, const char *cacert,
                            const char *cert, const char *key, char *err, size_t errlen);

typedef struct kvp_etcd_target {
    char endpoints[KVP_ETCD_MAX_ENDPOINTS][KVP_ETCD_MAX_HOST + 1];
    int n;
    char cluster[KVP_ETCD_MAX_CLUSTER + 1];
    int https;          /* https:// endpoints (given so, or etcd:// with auth.cacert) */
    kvp_etcd_auth auth; /* the process's at parse time */
} kvp_etcd_target;

/* 1 if name[0..n) is a cluster name: 1..64 of [A-Za-z0-9._-]. */
int kvp_etcd_cluster_ok(const char *name, size_t n);
/* 1 if s names etcd (starts with "etcd://"), else 0. */
int kvp_etcd_is_url(const char *s);
/* Parses an etcd address into t. 0, or KVP_EINVALID_PARAMS with a reason
 * in err (err may be NULL). */
int kvp_etcd_parse_url(const char *s, kvp_etcd_target *t, char *err, size_t errlen);

/* A key's record. */
typedef struct kvp_etcd_kv {
    uint64_t create_revision, mod_revision, version, lease;
    size_t value_len;
} kvp_etcd_kv;

/* What one answer said (kvp_etcd_parse). */
enum kvp_etcd_kind {
    KVP_ETCD_ANS_PLAIN = 0, /* put, delete, revoke: the header only */
    KVP_ETCD_ANS_RANGE,     /* kvs[0], when present */
    KVP_ETCD_ANS_TXN,       /* succeeded; the first response's range, when present */
    KVP_ETCD_ANS_GRANT,     /* ID, TTL */
    KVP_ETCD_ANS_KEEPALIVE, /* result.ID, result.TTL (absent or <= 0: expired) */
    KVP_ETCD_ANS_AUTH,      /* token (1..KVP_ETCD_MAX_TOKEN bytes of 0x21..0x7e) */
};
typedef struct kvp_etcd_answer {
    uint64_t revision; /* header.revision (0 when absent) */
    bool succeeded;    /* TXN */
    bool found;        /* RANGE / TXN: a kv was returned (kv, value filled) */
    kvp_etcd_kv kv;
    uint64_t lease_id; /* GRANT / KEEPALIVE */
    int64_t ttl;       /* GRANT / KEEPALIVE: seconds; KEEPALIVE <= 0 = expired */
    int etcd_code;     /* an error answer's gRPC code (0 = none) */
    char message[160]; /* an error answer's message, NUL-terminated */
    char token[KVP_ETCD_MAX_TOKEN + 1]; /* AUTH, NUL-terminated */
} kvp_etcd_answer;

/* Every kv of a range answer, in order: f(key, klen, value, vlen, kv, arg)
 * (a non-zero return stops the walk and is returned). At most
 * KVP_ETCD_MAX_LIST kvs; keys and values are decoded into buffers of
 * KVP_ETCD_MAX_KEY / KVP_ETCD_MAX_VALUE bytes. 0, KVP_EPROTOCOL, KVP_ENOMEM. */
#define KVP_ETCD_MAX_LIST 1024
typedef int (*kvp_etcd_list_fn)(const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                                const kvp_etcd_kv *kv, void *arg);
int kvp_etcd_parse_list(const char *body, size_t len, kvp_etcd_list_fn f, void *arg);

/* Parses an answer body of the given kind; a found value is decoded into
 * val (cap bytes). 0 (an error answer too: etcd_code != 0), KVP_EPROTOCOL,
 * KVP_EBUFFER_OVERFLOW, KVP_ENOMEM. Never reads past len. */
int kvp_etcd_parse(const char *body, size_t len, int kind, kvp_etcd_answer *a, uint8_t *val,
                   size_t cap);

/* A handle on the endpoints of t (copied); timeout_ms bounds each call per
 * endpoint (connect included). */
int kvp_etcd_open(const kvp_etcd_target *t, int timeout_ms, kvp_etcd **out);
void kvp_etcd_close(kvp_etcd *e);
/* The endpoint the last call reached ("HOST:PORT"). */
const char *kvp_etcd_endpoint(const kvp_etcd *e);
/* The last error's text (etcd's message, curl's, or the parser's). */
const char *kvp_etcd_last_error(const kvp_etcd *e);

/* key -> value (cap bytes). *found false = no such key (kv untouched). */
int kvp_etcd_get(kvp_etcd *e, const char *key, uint8_t *val, size_t cap, kvp_etcd_kv *kv,
                 bool *found);
/* Puts key = val (lease 0 = none); *revision (may be NULL) = the put's. */
int kvp_etcd_put(kvp_etcd *e, const char *key, const void *val, size_t len, uint64_t lease,
                 uint64_t *revision);
int kvp_etcd_delete(kvp_etcd *e, const char *key);
/* Every key starting with prefix, through f (kvp_etcd_parse_list). */
int kvp_etcd_list(kvp_etcd *e, const char *prefix, kvp_etcd_list_fn f, void *arg);

int kvp_etcd_lease_grant(kvp_etcd *e, int64_t ttl_s, uint64_t *id);
/* One keepalive: *ttl_s = the seconds etcd now grants. An expired or
 * unknown lease: KVP_ELEASE_EXPIRED. */
int kvp_etcd_lease_keepalive(kvp_etcd *e, uint64_t id, int64_t *ttl_s);
int kvp_etcd_lease_revoke(kvp_etcd *e, uint64_t id);

/*
 * Election (one transaction): if key does not exist, create it = val under
 * lease; *won true and holder->create_revision = the key's creation
 * revision, which is the term's epoch (strictly increasing across terms:
 * etcd revisions never repeat). Else *won false and holder (+ hval, hcap
 * bytes) describe the current holder. Either way the holder's record is
 * filled (value in hval when not won).
 */
int kvp_etcd_campaign(kvp_etcd *e, const char *key, const void *val, size_t len, uint64_t lease,
                      bool *won, kvp_etcd_kv *holder, uint8_t *hval, size_t hcap);
/* Deletes key only if its creation revision is still epoch (a deposed
 * leader never deletes its successor's key). *deleted may be NULL. */
int kvp_etcd_resign(kvp_etcd *e, const char *key, uint64_t epoch, bool *deleted);

#endif
