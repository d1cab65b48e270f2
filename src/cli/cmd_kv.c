/*
 * cmd_kv.c -- `kvpool put|get|exist|rm KEY`: single objects from the shell.
 * Values come from / go to a file, or standard input/output ("-" or no
 * file). A missing key is a message and exit status 1.
 *
 * The client is the library's (kvp_client_open_config) with every client key
 * of the file and the flags (KVP_KEY_CLIENT: master, tenant, tenant and
 * cluster credentials, rpc_timeout, protocol, replica_num, ...), always in
 * standalone-store mode: a one-shot command contributes no memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "client/client_int.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"

#define MAX_VALUE (4ull << 30)

/* Opens a client that contributes no memory (standalone-store mode: a
 * file's "mode" and segment size are for the processes that host one). Its
 * log level: the one given (--log-level, $KVPOOL_LOG_LEVEL, the file), else
 * warn: these commands print their own results, the client's info lines
 * would be noise. */
static int open_client(kvp_config *cfg, const char *cmd, kvp_client **c)
{
    char err[KVP_CONFIG_ERRLEN];
    snprintf(cfg->mode, sizeof cfg->mode, "standalone-store");
    cfg->global_segment_size = 0;
    if (!kvp_config_was_set(cfg, "log_level") &&
        kvp_config_set(cfg, "log_level", "warn", err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: %s\n", cmd, err);
        return KVP_ECONFIG;
    }
    int rc = kvp_client_open_config(cfg, c, err, sizeof err);
    char hint[512];
    if (rc)
        fprintf(stderr, "kvpool %s: %s%s\n", cmd, err, kvp_cli_tenant_hint(cfg, rc, hint, sizeof hint));
    return rc;
}

/* Reads a whole file (or stdin) into a kvp_malloc'ed buffer. */
static int slurp(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = (!path || !strcmp(path, "-")) ? stdin : fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = kvp_malloc(cap);
    while (b) {
        if (n == cap) {
            if (cap >= MAX_VALUE) {
                kvp_free(b);
                b = NULL;
                errno = EFBIG;
                break;
            }
            uint8_t *nb = kvp_realloc(b, cap * 2);
            if (!nb) {
                kvp_free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (!b || bad) {
        kvp_free(b);
        return -1;
    }
    *out = b;
    *len = n;
    return 0;
}

static int usage_kv(const char *cmd)
{
    if (!strcmp(cmd, "put"))
        printf("usage: kvpool put KEY [FILE|-] [--master HOST:PORT] [--replica-num N]\n"
               "Stores the file's bytes (standard input for - or no FILE) under KEY,\n"
               "in N copies on distinct segments (replica_num, default 1).\n"
               "Keys are immutable: putting an existing key changes nothing.\n");
    else if (!strcmp(cmd, "get"))
        printf("usage: kvpool get KEY [FILE|-] [--master HOST:PORT]\n"
               "Writes KEY's value to FILE (standard output for - or no FILE).\n");
    else if (!strcmp(cmd, "exist"))
        printf("usage: kvpool exist KEY... [--master HOST:PORT]\n"
               "Prints whether each key exists; exit status 0 only if all do.\n");
    else
        printf("usage: kvpool rm KEY... [--force] [--master HOST:PORT]\n"
               "Removes keys (--force: even while being read or pinned).\n");
    printf("\nKeys live in a tenant's namespace: --tenant NAME (default \"default\"); a\n"
           "protected tenant's token comes from --tenant-token-file FILE or\n"
           "$KVPOOL_TENANT_TOKEN, never from a flag. The configuration keys %s reads,\n"
           "also from --config FILE (kvpool help config for all of them):\n", cmd);
    kvp_config_print_flags(stdout, KVP_KEY_CLIENT, NULL, 2);
    return 0;
}

int kvp_cmd_kv(int argc, char **argv)
{
    const char *cmd = argv[0];
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    /* "mode" is the key's name: only the mode this command is takes effect */
    static const kvp_cli_flag own[] = {{"force", KVP_CLI_BOOL}, {"mode", KVP_CLI_TEXT},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[2] = {NULL};
    int n = 0;
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_CLIENT, &cfg, own, v, &n);
    if (rc == 1)
        return usage_kv(cmd);
    if (rc < 0)
        return 2;
    if (v[1] && strcmp(v[1], "standalone-store") != 0) {
        char q[96];
        fprintf(stderr, "kvpool %s: flag --mode: value %s is not this command's mode (allowed: "
                "standalone-store; a one-shot command contributes no memory)\n", cmd,
                kvp_cli_quote(v[1], q, sizeof q));
        return 2;
    }
    const char **pos = (const char **)argv + 1;
    int is_put = !strcmp(cmd, "put"), is_get = !strcmp(cmd, "get");
    if (n < 1 || ((is_put || is_get) && n > 2)) {
        fprintf(stderr, "kvpool %s: expected %s, got %d argument%s (see kvpool %s --help)\n",
                cmd, is_put || is_get ? "KEY [FILE]" : "KEY...", n, n == 1 ? "" : "s", cmd);
        return 2;
    }
    for (int i = 0; i < ((is_put || is_get) ? 1 : n); i++)
        if (!*pos[i] || strlen(pos[i]) > cfg.max_key) {
            char q[96];
            fprintf(stderr, "kvpool %s: key %s (%zu bytes) is not allowed (allowed: 1 to %llu "
                    "bytes)\n", cmd, kvp_cli_quote(pos[i], q, sizeof q), strlen(pos[i]),
                    (unsigned long long)cfg.max_key);
            return 2;
        }
    uint8_t *val = NULL;
    size_t len = 0;
    if (is_put && slurp(n == 2 ? pos[1] : NULL, &val, &len) != 0) {
        fprintf(stderr, "kvpool put: cannot read %s: %s\n", n == 2 ? pos[1] : "standard input",
                strerror(errno));
        return 1;
    }
    kvp_client *c;
    if (open_client(&cfg, cmd, &c)) {
        kvp_free(val);
        return 1;
    }
    int ret = 0;
    char hint[512];
    if (is_put) {
        rc = kvp_client_put(c, pos[0], val, len);
        if (rc) {
            fprintf(stderr, "kvpool put: %s: %s%s\n", pos[0], kvp_strerror(rc),
                    kvp_cli_tenant_hint(&cfg, rc, hint, sizeof hint));
            ret = 1;
        }
    } else if (is_get) {
        int64_t size = kvp_client_size(c, pos[0]);
        uint8_t *buf = size >= 0 ? kvp_malloc((size_t)size + 1) : NULL;
        int64_t got = size < 0 ? size : buf ? kvp_client_get(c, pos[0], buf, (size_t)size) : KVP_ENOMEM;
        if (got < 0) {
            fprintf(stderr, "kvpool get: %s: %s%s\n", pos[0], kvp_strerror((int)got),
                    kvp_cli_tenant_hint(&cfg, (int)got, hint, sizeof hint));
            ret = 1;
        } else {
            FILE *f = (n == 2 && strcmp(pos[1], "-")) ? fopen(pos[1], "wb") : stdout;
            if (!f || fwrite(buf, 1, (size_t)got, f) != (size_t)got || (f != stdout && fclose(f))) {
                fprintf(stderr, "kvpool get: cannot write %s: %s\n", n == 2 ? pos[1] : "output",
                        strerror(errno));
                ret = 1;
            }
        }
        kvp_free(buf);
    } else if (!strcmp(cmd, "exist")) {
        int *res = kvp_calloc((size_t)n, sizeof *res);
        rc = res ? kvp_client_exist(c, pos, (size_t)n, res) : KVP_ENOMEM;
        if (rc) {
            fprintf(stderr, "kvpool exist: %s%s\n", kvp_strerror(rc),
                    kvp_cli_tenant_hint(&cfg, rc, hint, sizeof hint));
            ret = 1;
        }
        for (int i = 0; rc == 0 && i < n; i++) {
            printf("%s: %s%s\n", pos[i], res[i] == 1 ? "yes" : res[i] == 0 ? "no" : kvp_strerror(res[i]),
                   res[i] < 0 ? kvp_cli_tenant_hint(&cfg, res[i], hint, sizeof hint) : "");
            if (res[i] != 1)
                ret = 1;
        }
        kvp_free(res);
    } else {
        for (int i = 0; i < n; i++) {
            rc = kvp_client_remove(c, pos[i], v[0] != NULL);
            if (rc) {
                fprintf(stderr, "kvpool rm: %s: %s%s\n", pos[i], kvp_strerror(rc),
                        kvp_cli_tenant_hint(&cfg, rc, hint, sizeof hint));
                ret = 1;
            }
        }
    }
    kvp_client_close(c);
    kvp_free(val);
    return ret;
}
