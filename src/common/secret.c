/*
 * secret.c -- credentials; see secret.h.
 */
#include "common/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"
#include "net/net.h"

int kvp_secret_equal(const void *a, size_t alen, const void *b, size_t blen)
{
    const volatile uint8_t *x = a, *y = b;
    size_t n = alen > blen ? alen : blen;
    unsigned diff = alen != blen;
    for (size_t i = 0; i < n; i++) {
        uint8_t u = i < alen ? x[i] : 0, v = i < blen ? y[i] : 0;
        diff |= (unsigned)(u ^ v);
    }
    return diff == 0;
}

/* Reads at most cap-1 bytes of a secret file into out (NUL-terminated). */
static int read_secret_text(const char *path, char *out, size_t cap, size_t *len, char *err,
                            size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(err, errlen, "secret file \"%s\": %s", path, strerror(errno));
        return KVP_ECONFIG;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "secret file \"%s\": not a regular file", path);
        rc = KVP_ECONFIG;
    } else if (st.st_mode & (S_IROTH | S_IWOTH)) {
        snprintf(err, errlen,
                 "secret file \"%s\": mode %04o lets other users read or change it (chmod 600)",
                 path, (unsigned)(st.st_mode & 07777));
        rc = KVP_ECONFIG;
    } else if ((uint64_t)st.st_size >= cap) {
        snprintf(err, errlen, "secret file \"%s\": %lld bytes, at most %zu allowed", path,
                 (long long)st.st_size, cap - 1);
        rc = KVP_ECONFIG;
    } else {
        ssize_t n = read(fd, out, cap - 1);
        if (n < 0) {
            snprintf(err, errlen, "secret file \"%s\": %s", path, strerror(errno));
            rc = KVP_ECONFIG;
        } else {
            out[n] = 0;
            *len = (size_t)n;
        }
    }
    close(fd);
    return rc;
}

int kvp_secret_read_file(const char *path, char *out, size_t cap, char *err, size_t errlen)
{
    size_t n;
    int rc = read_secret_text(path, out, cap, &n, err, errlen);
    if (rc)
        return rc;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        out[--n] = 0;
    if (n == 0 || strchr(out, '\n') || strlen(out) != n) {
        snprintf(err, errlen, "secret file \"%s\": %s", path,
                 n == 0 ? "empty" : "must hold one line of text");
        memset(out, 0, cap);
        return KVP_ECONFIG;
    }
    return 0;
}

/* One credential: the config value, else its file, else the environment. */
static int resolve_one(char *val, size_t cap, const char *file, const char *key,
                       const char *env, char *err, size_t errlen)
{
    if (val[0])
        return 0;
    if (file[0]) {
        char e[KVP_CONFIG_ERRLEN];
        if (kvp_secret_read_file(file, val, cap, e, sizeof e) != 0) {
            snprintf(err, errlen, "key \"%s_file\": %s", key, e);
            return KVP_ECONFIG;
        }
        return 0;
    }
    const char *v = getenv(env);
    if (v && *v) {
        if (strlen(v) >= cap) {
            snprintf(err, errlen, "$%s: %zu bytes, at most %zu allowed", env, strlen(v), cap - 1);
            return KVP_ECONFIG;
        }
        memcpy(val, v, strlen(v) + 1);
    }
    return 0;
}

int kvp_secret_resolve(kvp_config *c, char *err, size_t errlen)
{
    int rc = resolve_one(c->cluster_token, sizeof c->cluster_token, c->cluster_token_file,
                         "cluster_token", "KVPOOL_CLUSTER_TOKEN", err, errlen);
    if (!rc)
        rc = resolve_one(c->node_token, sizeof c->node_token, c->node_token_file, "node_token",
                         "KVPOOL_NODE_TOKEN", err, errlen);
    if (!rc)
        rc = resolve_one(c->tenant_token, sizeof c->tenant_token, c->tenant_token_file,
                         "tenant_token", "KVPOOL_TENANT_TOKEN", err, errlen);
    return rc;
}

/* The options after "TENANT TOKEN" on a tenant line: NAME=VALUE words. */
static int tenant_opts(const char *p, kvp_tenant_cred *lim, const char *path, unsigned line,
                       char *err, size_t errlen)
{
    unsigned seen = 0;
    char w[300];
    int used;
    while (sscanf(p, "%299s%n", w, &used) == 1) {
        p += used;
        char *eq = strchr(w, '=');
        unsigned bit = 0;
        int bad = !eq || (*p && *p != ' ' && *p != '\t'); /* a word cut at 299 bytes */
        if (!bad) {
            *eq = 0;
            const char *v = eq + 1;
            char *end;
            if (!strcmp(w, "max_bytes")) {
                bit = 1;
                bad = kvp_size_parse(v, &lim->max_bytes) != 0;
            } else if (!strcmp(w, "max_objects")) {
                bit = 2;
                bad = !*v || *v == '-' || !(*v >= '0' && *v <= '9');
                end = NULL;
                unsigned long long n = bad ? 0 : strtoull(v, &end, 10);
                bad = bad || *end || n >= (1ull << 48);
                lim->max_objects = n;
            } else if (!strcmp(w, "share")) {
                bit = 4;
                bad = !(*v >= '1' && *v <= '9');
                end = NULL;
                unsigned long n = bad ? 0 : strtoul(v, &end, 10);
                bad = bad || *end || n > KVP_TENANT_SHARE_MAX;
                lim->share = (uint32_t)n;
            } else {
                bad = 1;
            }
            *eq = '=';
        }
        if (bad || (seen & bit)) {
            snprintf(err, errlen,
                     "%s:%u: \"%.64s\": %s (max_bytes=SIZE, max_objects=N, share=1..%u)", path,
                     line, w, bad ? "not a valid option" : "given twice", KVP_TENANT_SHARE_MAX);
            return KVP_ECONFIG;
        }
        seen |= bit;
    }
    return 0;
}

int kvp_secret_tenants_load(const char *path, kvp_tenant_cred **out, size_t *n, char *err,
                            size_t errlen)
{
    enum { CAP = 1 << 20 };
    char *text = kvp_malloc(CAP);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    size_t len;
    int rc = read_secret_text(path, text, CAP, &len, err, errlen);
    kvp_tenant_cred *t = NULL;
    size_t nt = 0, cap = 0;
    unsigned line = 0;
    for (char *p = text, *nl; rc == 0 && p < text + len; p = nl + 1) {
        line++;
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl)
            nl = text + len;
        *nl = 0;
        if (nl > p && nl[-1] == '\r')
            nl[-1] = 0;
        char *s = p + strspn(p, " \t");
        if (!*s || *s == '#')
            continue;
        char name[300], tok[300];
        int used = 0;
        int k = sscanf(s, "%299s %299s%n", name, tok, &used);
        if (k != 2 || strlen(name) > 255 || strlen(tok) > 255) {
            snprintf(err, errlen,
                     "%s:%u: expected \"TENANT TOKEN [max_bytes=SIZE] [max_objects=N] "
                     "[share=W]\" (tenant and token each at most 255 bytes)",
                     path, line);
            rc = KVP_ECONFIG;
            break;
        }
        kvp_tenant_cred lim = {.share = 1};
        rc = tenant_opts(s + used, &lim, path, line, err, errlen);
        if (rc)
            break;
        for (size_t i = 0; i < nt && rc == 0; i++)
            if (!strcmp(t[i].tenant, name) || !strcmp(t[i].token, tok)) {
                snprintf(err, errlen, "%s:%u: tenant \"%s\" %s", path, line, name,
                         !strcmp(t[i].tenant, name) ? "is listed twice"
                                                    : "has another tenant's token");
                rc = KVP_ECONFIG;
            }
        if (rc)
            break;
        if (nt == cap) {
            cap = cap ? cap * 2 : 8;
            kvp_tenant_cred *g = kvp_realloc(t, cap * sizeof *g);
            if (!g) {
                snprintf(err, errlen, "out of memory");
                rc = KVP_ENOMEM;
                break;
            }
            t = g;
        }
        memcpy(t[nt].tenant, name, strlen(name) + 1); /* <= 255 bytes, checked */
        memcpy(t[nt].token, tok, strlen(tok) + 1);
        t[nt].max_bytes = lim.max_bytes;
        t[nt].max_objects = lim.max_objects;
        t[nt].share = lim.share;
        nt++;
    }
    memset(text, 0, CAP);
    kvp_free(text);
    if (rc) {
        if (t)
            memset(t, 0, nt * sizeof *t);
        kvp_free(t);
        return rc;
    }
    *out = t;
    *n = nt;
    return 0;
}

int kvp_secret_listen_check(const char *listen, int have_cred, int insecure, const char *what,
                            char *err, size_t errlen)
{
    char host[256];
    uint16_t port;
    if (kvp_net_split(listen, host, sizeof host, &port) != 0)
        return 0; /* the listener reports a bad address itself */
    if (have_cred || insecure || kvp_net_is_loopback(host))
        return 0;
    snprintf(err, errlen,
             "%s listens on %s, reachable from other machines, without a credential: set "
             "cluster_token (cluster_token_file or $KVPOOL_CLUSTER_TOKEN), or pass --insecure "
             "to accept any peer (docs/SECURITY.md)",
             what, listen);
    return KVP_ECONFIG;
}
