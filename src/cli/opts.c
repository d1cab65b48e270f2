/*
 * opts.c -- the command line of every subcommand (contract in cli.h):
 * flags and positionals in any order, "--", "--name=value", one message per
 * error; and kvp_cli_spawn_self.
 *
 * A command line is read by one iterator (next_item) twice: a quiet first
 * pass only looks for --help and --config (the file is loaded before any
 * flag applies, so flags override it wherever they are), the second applies
 * everything and reports the first error.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/log.h"
#include "common/secret.h"
#include "common/size.h"
#include "ha/etcd.h"
#include "kvpool.h"

/* ------------------------------------------------------------ messages */

const char *kvp_cli_quote(const char *s, char *buf, size_t n)
{
    size_t len = 0, i = 0;
    if (n < 8) {
        if (n)
            buf[0] = '\0';
        return buf;
    }
    buf[len++] = '"';
    for (; s[i] && i < 60 && len + 8 < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            len += (size_t)snprintf(buf + len, n - len, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            len += (size_t)snprintf(buf + len, n - len, "\\x%02x", ch);
        else
            buf[len++] = (char)ch;
    }
    snprintf(buf + len, n - len, "%s\"", s[i] ? "..." : "");
    return buf;
}

/* "kvpool CMD: flag --FLAG: value "V" <what...>\n" on stderr (a FLAG starting
 * with '$' is an environment variable, named as is); returns -1. */
static int bad_flag(const char *cmd, const char *flag, const char *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad_flag(const char *cmd, const char *flag, const char *v, const char *fmt, ...)
{
    char q[96];
    fprintf(stderr, "kvpool %s: %s%s: value %s ", cmd, flag[0] == '$' ? "" : "flag --", flag,
            kvp_cli_quote(v, q, sizeof q));
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return -1;
}

/* -------------------------------------------------------------- values */

/* Decimal digits only (no sign, blank or junk), no overflow; 0 or -1. */
static int digits(const char *v, uint64_t *out)
{
    uint64_t x = 0;
    if (!*v)
        return -1;
    for (; *v; v++) {
        if (*v < '0' || *v > '9' || __builtin_mul_overflow(x, 10, &x) ||
            __builtin_add_overflow(x, (uint64_t)(*v - '0'), &x))
            return -1;
    }
    *out = x;
    return 0;
}

int kvp_cli_uint(const char *cmd, const char *flag, const char *v, uint64_t lo, uint64_t hi,
                 uint64_t *out)
{
    uint64_t x;
    if (digits(v, &x) != 0 || x < lo || x > hi)
        return bad_flag(cmd, flag, v, "is not a whole number from %llu to %llu",
                        (unsigned long long)lo, (unsigned long long)hi);
    *out = x;
    return 0;
}

int kvp_cli_seconds(const char *cmd, const char *flag, const char *v, double lo, int lo_open,
                    double hi, double *out)
{
    char *end = (char *)v;
    errno = 0;
    /* strtod would take blanks, a sign, hex, "inf" and "nan": digits and '.' only */
    double d = v[strspn(v, "0123456789.")] == '\0' && *v ? strtod(v, &end) : NAN;
    if (isnan(d) || errno || *end || d > hi || d < lo || (lo_open && d == lo))
        return bad_flag(cmd, flag, v, "is not a number of seconds (allowed: %s %g up to %g)",
                        lo_open ? "more than" : "from", lo, hi);
    *out = d;
    return 0;
}

int kvp_cli_size(const char *cmd, const char *flag, const char *v, uint64_t lo, uint64_t hi,
                 uint64_t *out)
{
    uint64_t x;
    char a[32], b[32];
    if (kvp_size_parse(v, &x) != 0 || x < lo || x > hi) {
        if (hi == UINT64_MAX)
            snprintf(b, sizeof b, "or more");
        else
            snprintf(b, sizeof b, "to %s", kvp_size_format(hi, (char[32]){0}, 32));
        return bad_flag(cmd, flag, v, "is not a size of %s %s (allowed: bytes or a number "
                        "with a unit, like 512MiB or 4GiB)",
                        kvp_size_format(lo, a, sizeof a), b);
    }
    *out = x;
    return 0;
}

int kvp_cli_addr(const char *cmd, const char *flag, const char *v, int any_port)
{
    const char *allowed = any_port ? "HOST:PORT with a port from 0 to 65535, 0 = any free port"
                                   : "HOST:PORT with a port from 1 to 65535";
    const char *colon = NULL;
    size_t hostlen = 0;
    if (v[0] == '[') {
        const char *rb = strchr(v, ']');
        if (rb && rb[1] == ':') {
            colon = rb + 1;
            hostlen = (size_t)(rb - v - 1);
        }
    } else if ((colon = strrchr(v, ':')) != NULL) {
        hostlen = (size_t)(colon - v);
    }
    uint64_t port = 0;
    if (!any_port && kvp_etcd_is_url(v)) { /* a cluster's master, found through etcd */
        kvp_etcd_target t;
        char err[160];
        if (kvp_etcd_parse_url(v, &t, err, sizeof err) != 0)
            return bad_flag(cmd, flag, v, "is not a usable etcd address: %s", err);
        return 0;
    }
    if (!*v)
        return bad_flag(cmd, flag, v, "is empty (allowed: %s)", allowed);
    if (strlen(v) > 255)
        return bad_flag(cmd, flag, v, "is longer than 255 bytes (allowed: %s)", allowed);
    if (!colon || !colon[1])
        return bad_flag(cmd, flag, v, "has no port (allowed: %s)", allowed);
    if (hostlen == 0)
        return bad_flag(cmd, flag, v, "has no host (allowed: %s)", allowed);
    if (digits(colon + 1, &port) != 0)
        return bad_flag(cmd, flag, v, "has a port that is not a number (allowed: %s)", allowed);
    if (port > 65535 || (port == 0 && !any_port))
        return bad_flag(cmd, flag, v, "has port %llu, out of range (allowed: %s)",
                        (unsigned long long)port, allowed);
    return 0;
}

/* Checks the value of a flag of kind k; 0 or -1 after the message. */
static int check_value(const char *cmd, const char *flag, kvp_cli_kind k, const char *v)
{
    switch (k) {
    case KVP_CLI_BOOL:
        return kvp_config_bool_word(v) >= 0
                   ? 0
                   : bad_flag(cmd, flag, v, "is not a boolean (allowed: %s)",
                              KVP_CONFIG_BOOL_WORDS);
    case KVP_CLI_TEXT:
        return *v ? 0 : bad_flag(cmd, flag, v, "is empty (allowed: a non-empty value)");
    case KVP_CLI_CONNECT:
        return kvp_cli_addr(cmd, flag, v, 0);
    case KVP_CLI_LISTEN:
        return kvp_cli_addr(cmd, flag, v, 1);
    }
    return -1;
}

/* The check a configuration key given as a flag gets here, before the
 * table's own (kvp_config_set): an address kind, KVP_CLI_TEXT for a key
 * that must not be empty, or -1 for none. */
static int config_kind(const char *name)
{
    char n[32];
    size_t l = strlen(name);
    if (l >= sizeof n)
        return -1;
    for (size_t i = 0; i <= l; i++)
        n[i] = name[i] == '-' ? '_' : name[i];
    if (!strcmp(n, "master") || !strcmp(n, "master_server_address") ||
        !strcmp(n, "master_server_addr"))
        return KVP_CLI_CONNECT;
    if (!strcmp(n, "listen") || !strcmp(n, "http"))
        return KVP_CLI_LISTEN;
    if (!strcmp(n, "tenant") || !strcmp(n, "tenant_id"))
        return KVP_CLI_TEXT;
    return -1;
}

/* ------------------------------------------------------------ scanning */

struct scan {
    int argc;
    char **argv; /* argv[0]: the command name, for messages */
    int i;       /* next argument */
    int rest;    /* after "--": everything is positional */
    int quiet;   /* first pass: no messages */
    int keys;    /* flags outside `own` are configuration keys (else errors) */
    const kvp_cli_flag *own;
};

/* One command-line item. */
struct item {
    enum { IT_END, IT_POS, IT_HELP, IT_FLAG, IT_ERR } type;
    const char *arg;         /* IT_POS: the argument */
    char name[128];          /* IT_FLAG: without "--" and "=VALUE" */
    int own;                 /* IT_FLAG: index in the own table, or -1 */
    const char *val;         /* IT_FLAG: its value ("1" for a boolean) */
};

static int item_err(struct scan *s, struct item *it, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int item_err(struct scan *s, struct item *it, const char *fmt, ...)
{
    if (!s->quiet) {
        fprintf(stderr, "kvpool %s: ", s->argv[0]);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
    return it->type = IT_ERR;
}

/* Reads the next item; a flag's value is taken from "=VALUE" or the next
 * argument (whatever it is, as getopt does). */
static int next_item(struct scan *s, struct item *it)
{
    char q[96];
    it->own = -1;
    if (s->i >= s->argc)
        return it->type = IT_END;
    const char *a = s->argv[s->i++];
    if (!s->rest && !strcmp(a, "--")) {
        s->rest = 1;
        return next_item(s, it);
    }
    if (s->rest || a[0] != '-' || a[1] == '\0') {
        it->arg = a;
        return it->type = IT_POS;
    }
    if (!strcmp(a, "--help") || !strcmp(a, "-h"))
        return it->type = IT_HELP;
    const char *name = a + 2, *eq = strchr(a, '=');
    size_t nl = eq ? (size_t)(eq - name) : strlen(name);
    /* a name no flag can have (control bytes, blanks, ...) is shown quoted */
    if (a[1] != '-' || nl == 0 || nl >= sizeof it->name ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") < nl)
        return item_err(s, it, "unknown flag %s (flags are --name VALUE or --name=VALUE; put "
                        "\"--\" before a positional argument that starts with '-')",
                        kvp_cli_quote(a, q, sizeof q));
    memcpy(it->name, name, nl);
    it->name[nl] = '\0';
    kvp_cli_kind kind = KVP_CLI_TEXT;
    for (int k = 0; s->own && s->own[k].name; k++)
        if (!strcmp(s->own[k].name, it->name)) {
            it->own = k;
            kind = s->own[k].kind;
        }
    if (it->own < 0 && !s->keys)
        return item_err(s, it, "unknown flag --%s (see kvpool %s --help)", it->name,
                        s->argv[0]);
    if (kind == KVP_CLI_BOOL) {
        it->val = eq ? eq + 1 : "1"; /* never the next argument: a positional */
    } else if (eq) {
        it->val = eq + 1;
    } else if (it->own < 0 && kvp_config_key_is_bool(it->name) &&
               (s->i >= s->argc || kvp_config_bool_word(s->argv[s->i]) < 0)) {
        it->val = "true"; /* --insecure alone; "--insecure false" still works */
    } else if (s->i < s->argc) {
        it->val = s->argv[s->i++];
    } else {
        return item_err(s, it, "flag --%s needs a value (--%s VALUE or --%s=VALUE)", it->name,
                        it->name, it->name);
    }
    return it->type = IT_FLAG;
}

/*
 * First pass: 1 when --help is there, else 0 with *config set to the last
 * --config value (when keys: flags outside own are configuration keys; else
 * NULL).
 */
static int prescan(int argc, char **argv, const kvp_cli_flag *own, int keys,
                   const char **config)
{
    struct scan s = {.argc = argc, .argv = argv, .i = 1, .quiet = 1, .keys = keys,
                     .own = own};
    struct item it;
    *config = NULL;
    while (next_item(&s, &it) != IT_END) {
        if (it.type == IT_HELP)
            return 1;
        if (it.type == IT_FLAG && it.own < 0 && keys && !strcmp(it.name, "config"))
            *config = it.val;
    }
    return 0;
}

/* The credentials (secret.h): never taken from a flag. */
static const char *const secret_flags[][2] = {
    {"cluster-token", "CLUSTER_TOKEN"}, {"node-token", "NODE_TOKEN"},
    {"tenant-token", "TENANT_TOKEN"},
};

static int secret_index(const char *name)
{
    for (size_t i = 0; i < sizeof secret_flags / sizeof secret_flags[0]; i++) {
        const char *a = secret_flags[i][0], *b = name;
        while (*a && (*a == *b || (*a == '-' && *b == '_')))
            a++, b++;
        if (!*a && !*b)
            return (int)i;
    }
    return -1;
}

static int secret_flag(const char *name) { return secret_index(name) >= 0; }
static const char *secret_env(const char *name) { return secret_flags[secret_index(name)][1]; }

/*
 * Second pass: applies every item. cfg NULL: flags outside `own` are
 * errors; else configuration keys (--config was loaded by the caller).
 * 0 or -1 after the message.
 */
static int apply_all(int argc, char **argv, kvp_config *cfg, unsigned roles,
                     const kvp_cli_flag *own, const char **vals, int *npos)
{
    struct scan s = {.argc = argc, .argv = argv, .i = 1, .keys = cfg != NULL, .own = own};
    struct item it;
    const char *cmd = argv[0];
    char err[KVP_CONFIG_ERRLEN], q[96], who[160];
    int r;
    if (npos)
        *npos = 0;
    while (next_item(&s, &it) != IT_END) {
        switch (it.type) {
        case IT_ERR:
            return -1;
        case IT_HELP:
        case IT_END:
            break;
        case IT_POS:
            if (!npos) {
                fprintf(stderr, "kvpool %s: unexpected argument %s (this command takes only "
                        "flags; see kvpool %s --help)\n", cmd,
                        kvp_cli_quote(it.arg, q, sizeof q), cmd);
                return -1;
            }
            /* slots up to s.i - 1 are consumed: compacting in place is safe */
            argv[1 + (*npos)++] = (char *)it.arg;
            break;
        case IT_FLAG:
            if (it.own >= 0) {
                if (check_value(cmd, it.name, own[it.own].kind, it.val) != 0)
                    return -1;
                /* a boolean is "1" when true, NULL when false (later ones win) */
                vals[it.own] = own[it.own].kind != KVP_CLI_BOOL ? it.val
                               : kvp_config_bool_word(it.val) ? "1" : NULL;
            } else if (cfg && !strcmp(it.name, "config")) {
                if (check_value(cmd, it.name, KVP_CLI_TEXT, it.val) != 0)
                    return -1;
            } else {
                if (secret_flag(it.name)) {
                    fprintf(stderr,
                            "kvpool %s: flag --%s: a secret on the command line is visible to "
                            "every user (ps); use --%s-file FILE or $KVPOOL_%s\n",
                            cmd, it.name, it.name, secret_env(it.name));
                    return -1;
                }
                /* a key this command does not read is refused, not ignored */
                if ((r = kvp_config_key_roles(it.name)) == 0) {
                    fprintf(stderr, "kvpool %s: flag --%s: no kvpool command reads this key (a "
                            "Mooncake key, accepted in configuration files only; see kvpool "
                            "help config)\n", cmd, it.name);
                    return -1;
                }
                if (r > 0 && !((unsigned)r & roles)) {
                    fprintf(stderr, "kvpool %s: flag --%s: a key read only by %s; %s does not "
                            "use it (kvpool help config: who reads each key)\n", cmd, it.name,
                            kvp_config_roles_text((unsigned)r, who, sizeof who), cmd);
                    return -1;
                }
                int k = config_kind(it.name);
                if (k >= 0 && check_value(cmd, it.name, (kvp_cli_kind)k, it.val) != 0)
                    return -1;
                if (kvp_config_set(cfg, it.name, it.val, err, sizeof err) != 0) {
                    fprintf(stderr, "kvpool %s: %s\n", cmd, err);
                    return -1;
                }
            }
            break;
        }
    }
    return 0;
}

int kvp_cli_env_log_level(const char *cmd, int *level)
{
    int lv = kvp_log_env_level();
    if (lv == -1)
        return 0;
    if (lv == -2) {
        char q[96];
        fprintf(stderr,
                "kvpool %s: $%s: value %s is not a log level (allowed: debug, info, warn, "
                "error, off)\n",
                cmd, KVP_LOG_ENV, kvp_cli_quote(getenv(KVP_LOG_ENV), q, sizeof q));
        return -1;
    }
    *level = lv;
    return 1;
}

int kvp_cli_env_log_format(const char *cmd, int *format)
{
    int f = kvp_log_env_format();
    if (f == -1)
        return 0;
    if (f == -2) {
        char q[96];
        fprintf(stderr, "kvpool %s: $%s: value %s is not a log format (allowed: text, json)\n",
                cmd, KVP_LOG_FORMAT_ENV, kvp_cli_quote(getenv(KVP_LOG_FORMAT_ENV), q, sizeof q));
        return -1;
    }
    *format = f;
    return 1;
}

int kvp_cli_scan(int argc, char **argv, const kvp_cli_flag *own, const char **own_vals,
                 int *npos)
{
    const char *unused;
    if (prescan(argc, argv, own, 0, &unused))
        return 1;
    return apply_all(argc, argv, NULL, 0, own, own_vals, npos);
}

int kvp_cli_parse(int argc, char **argv, kvp_config *cfg, const kvp_cli_flag *own,
                  const char **own_vals, int *npos)
{
    return kvp_cli_parse_for(argc, argv, KVP_KEY_MASTER | KVP_KEY_NODE | KVP_KEY_CLIENT |
                                             KVP_KEY_ADMIN, cfg, own, own_vals, npos);
}

int kvp_cli_parse_for(int argc, char **argv, unsigned roles, kvp_config *cfg,
                      const kvp_cli_flag *own, const char **own_vals, int *npos)
{
    char err[KVP_CONFIG_ERRLEN];
    const char *file;
    if (prescan(argc, argv, own, 1, &file))
        return 1;
    /* the file, then $KVPOOL_MASTER, then the flags in order */
    if (!file)
        file = kvp_config_path_from_env();
    if (file && *file && kvp_config_load_file(cfg, file, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: %s\n", argv[0], err);
        return -1;
    }
    const char *env_master = getenv("KVPOOL_MASTER");
    if (env_master && *env_master) {
        if (kvp_cli_addr(argv[0], "$KVPOOL_MASTER", env_master, 0) != 0)
            return -1;
        if (kvp_config_set(cfg, "master", env_master, err, sizeof err) != 0) {
            fprintf(stderr, "kvpool %s: $KVPOOL_MASTER: %s\n", argv[0], err);
            return -1;
        }
    }
    /* $KVPOOL_LOG_LEVEL beats the file, a --log-level flag beats both */
    int elv, e = kvp_cli_env_log_level(argv[0], &elv);
    if (e < 0)
        return -1;
    if (e > 0 && kvp_config_set(cfg, "log_level", kvp_log_level_name(elv), err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: $%s: %s\n", argv[0], KVP_LOG_ENV, err);
        return -1;
    }
    /* the same for $KVPOOL_LOG_FORMAT and --log-format */
    int efmt;
    if ((e = kvp_cli_env_log_format(argv[0], &efmt)) < 0)
        return -1;
    if (e > 0 &&
        kvp_config_set(cfg, "log_format", kvp_log_format_name(efmt), err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: $%s: %s\n", argv[0], KVP_LOG_FORMAT_ENV, err);
        return -1;
    }
    if (apply_all(argc, argv, cfg, roles, own, own_vals, npos) != 0)
        return -1;
    if (kvp_config_validate(cfg, err, sizeof err) != 0 ||
        kvp_secret_resolve(cfg, err, sizeof err) != 0 ||
        kvp_etcd_auth_configure(cfg->etcd_user, cfg->etcd_password_file, cfg->etcd_cacert,
                                cfg->etcd_cert, cfg->etcd_key, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: %s\n", argv[0], err);
        return -1;
    }
    kvp_log_set_level(cfg->log_level);
    kvp_log_set_format(kvp_log_format_parse(cfg->log_format) == KVP_LOG_JSON ? KVP_LOG_JSON
                                                                             : KVP_LOG_TEXT);
    return 0;
}

/* ---------------------------------------------------------- credentials */

const char *kvp_cli_tenant_hint(const kvp_config *cfg, int rc, char *buf, size_t n)
{
    char q[96];
    const char *t = kvp_cli_quote(cfg->tenant, q, sizeof q);
    int tt = cfg->tenant_token[0] != 0, ct = cfg->cluster_token[0] != 0;
    if (n)
        buf[0] = '\0';
    if ((rc == KVP_EAUTH || rc == KVP_EAUTH_BACKOFF) && tt)
        snprintf(buf, n, " (the master knows no such tenant token%s: check tenant_token_file "
                 "or $KVPOOL_TENANT_TOKEN)", ct ? ", or the cluster token is wrong" : "");
    else if (rc == KVP_EILLEGAL_CLIENT && tt)
        snprintf(buf, n, " (this session's tenant token is not the token of tenant %s: a token "
                 "reaches only its own tenant)", t);
    else if (rc == KVP_EILLEGAL_CLIENT)
        snprintf(buf, n, " (tenant %s is protected: give its token with --tenant-token-file "
                 "FILE or $KVPOOL_TENANT_TOKEN)", t);
    return buf;
}

/* --------------------------------------------------------------- spawn */

pid_t kvp_cli_spawn_self(const char *const *args, int wait_ms, char *addr, size_t addrlen)
{
    char pf[] = "/tmp/kvpool-spawn-XXXXXX";
    int fd = mkstemp(pf);
    if (fd < 0)
        return -1;
    close(fd);
    unlink(pf);
    const char *argv[32];
    int n = 0;
    argv[n++] = "kvpool";
    for (int i = 0; args[i] && n < 26; i++)
        argv[n++] = args[i];
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = pf;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    for (int t = 0; t < wait_ms; t += 10) {
        FILE *f = fopen(pf, "r");
        unsigned port = 0;
        if (f) {
            int ok = fscanf(f, "%u", &port) == 1;
            fclose(f);
            if (ok) {
                unlink(pf);
                snprintf(addr, addrlen, "127.0.0.1:%u", port);
                return pid;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(pf);
    return -1;
}
