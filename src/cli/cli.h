/* cli.h -- the `kvpool` command's subcommands (one file each). */
#ifndef KVP_CLI_H
#define KVP_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"

/* Each returns the process exit status. argv[0] is the subcommand name.
 * `kvpool bench ...` is src/bench/bench.h, `kvpool sim` src/sim/sim.h. */
int kvp_cmd_master(int argc, char **argv);
int kvp_cmd_store(int argc, char **argv);
int kvp_cmd_stat(int argc, char **argv);
int kvp_cmd_reset(int argc, char **argv);
int kvp_cmd_serve(int argc, char **argv);
/* `kvpool sim` (cmd_sim.c): the engine simulator */
int kvp_sim_main(int argc, char **argv);
/* put | get | exist | rm, by argv[0] */
int kvp_cmd_kv(int argc, char **argv);

/*
 * The command line (opts.c), the same for every subcommand: GNU-style.
 *
 *   - flags and positional arguments in any order: `put KEY --master H:P`
 *     and `put --master H:P KEY` are the same;
 *   - "--name VALUE" or "--name=VALUE";
 *   - a boolean flag (a command's own, or a boolean configuration key) is
 *     "--name" alone (true) or "--name=WORD", WORD one of true, false, 1, 0,
 *     yes, no, on, off in any case (kvp_config_bool_word); a boolean key
 *     also takes "--name WORD" (a command's own boolean does not: the word
 *     would be a positional argument);
 *   - "--" ends the flags: what follows is positional, even "-x" or "--y";
 *     "-" alone is positional (standard input/output);
 *   - "--help" / "-h" (before any "--") means help, wherever it is.
 *
 *   - a configuration key is a flag only for a command that reads it (its
 *     roles, config.h KVP_KEY_*): any other is refused, never ignored
 *     ("kvpool put: flag --lease-ttl: a key read only by kvpool serve,
 *     master; put does not use it ..."); a secret key (cluster_token,
 *     node_token, tenant_token) is never a flag: its *_file key or
 *     environment variable is (docs/SECURITY.md).
 *
 * Every byte is untrusted: a missing or empty value, an unknown flag, a
 * number with a sign or trailing junk, out of range or overflowing, a
 * HOST:PORT without a port or with a port out of range is one message on
 * stderr, "kvpool CMD: flag --NAME: value "V" PROBLEM (allowed: WHAT)"
 * (values quoted, control bytes escaped, long ones cut), and the parser
 * returns -1: commands then exit with status 2, the usage-error status.
 */

/* What a flag of the command's own table takes. */
typedef enum kvp_cli_kind {
    KVP_CLI_TEXT,    /* a non-empty string */
    KVP_CLI_BOOL,    /* "--name" or "--name=WORD" (see above): own_vals gets "1" when
                        true, NULL when false */
    KVP_CLI_CONNECT, /* HOST:PORT of a server to reach: port 1 to 65535 */
    KVP_CLI_LISTEN,  /* HOST:PORT to listen on: port 0 to 65535, 0 = any free port */
} kvp_cli_kind;

/* One flag of a command's own table (name without "--"); {NULL} ends it. */
typedef struct kvp_cli_flag {
    const char *name;
    kvp_cli_kind kind;
} kvp_cli_flag;

/*
 * Parses a command that has a configuration: loads the file (--config FILE,
 * else $KVPOOL_CONFIG, else $MOONCAKE_CONFIG_PATH), applies $KVPOOL_MASTER,
 * then every flag in order. A flag of `own` stores its value in
 * own_vals[its index] (left alone when absent; later ones win); any other
 * flag is a configuration key ('-' = '_'; --master and its aliases are
 * checked as KVP_CLI_CONNECT, --listen as KVP_CLI_LISTEN). argv[0] is the
 * command name used in messages.
 *
 * Positional arguments are moved, in order, to argv[1 .. *npos] (the rest of
 * argv is then unspecified); with npos NULL the command takes none and one
 * is an error. Returns 0, 1 for help (then nothing is reported, loaded or
 * moved), or -1 after printing the message.
 *
 * kvp_cli_parse_for takes only the keys of `roles` (KVP_KEY_*: the
 * components the command runs or is) as flags; a flag of `own` with a key's
 * name wins over the key, so a command can take a key its own way or refuse
 * it with its own message. kvp_cli_parse takes every key (the benchmarks,
 * which hand their configuration to the processes they start).
 */
int kvp_cli_parse_for(int argc, char **argv, unsigned roles, kvp_config *cfg,
                      const kvp_cli_flag *own, const char **own_vals, int *npos);
int kvp_cli_parse(int argc, char **argv, kvp_config *cfg, const kvp_cli_flag *own,
                  const char **own_vals, int *npos);
/* The same for a command without a configuration (`kvpool sim`, benchmarks):
 * a flag not in `own` is an error. */
int kvp_cli_scan(int argc, char **argv, const kvp_cli_flag *own, const char **own_vals,
                 int *npos);

/*
 * Value checks for flags the parser hands over as text; each prints
 * "kvpool CMD: flag --FLAG: value "V" ... (allowed: ...)" and returns -1, or
 * stores the value and returns 0.
 *   kvp_cli_uint:    decimal digits only, lo <= x <= hi
 *   kvp_cli_seconds: a decimal number of seconds, lo < x (lo_open) or
 *                    lo <= x, and x <= hi
 *   kvp_cli_size:    a size ("4GiB", "512MiB", bytes), lo <= x <= hi
 *   kvp_cli_addr:    HOST:PORT (HOST a name, IPv4 or [IPv6]) with a port
 *                    from 1 (from 0 with any_port: KVP_CLI_LISTEN) to 65535
 * A flag starting with '$' names an environment variable instead.
 */
int kvp_cli_uint(const char *cmd, const char *flag, const char *v, uint64_t lo, uint64_t hi,
                 uint64_t *out);
int kvp_cli_seconds(const char *cmd, const char *flag, const char *v, double lo, int lo_open,
                    double hi, double *out);
int kvp_cli_size(const char *cmd, const char *flag, const char *v, uint64_t lo, uint64_t hi,
                 uint64_t *out);
int kvp_cli_addr(const char *cmd, const char *flag, const char *v, int any_port);
/* s as a double-quoted string for messages: '"', '\' and control or
 * non-ASCII bytes escaped, cut after 60 bytes with "..."; returns buf. */
const char *kvp_cli_quote(const char *s, char *buf, size_t n);

/* $KVPOOL_LOG_LEVEL for the CLI (flag > environment > file > default info):
 * 0 when unset or empty, 1 with *level set, -1 when invalid (message on
 * stderr naming the variable; the command exits with status 2). */
int kvp_cli_env_log_level(const char *cmd, int *level);
/* The same for $KVPOOL_LOG_FORMAT (text | json, any case). */
int kvp_cli_env_log_format(const char *cmd, int *format);

/*
 * What a refusal by the master means for this session's credentials, to
 * follow the error on the same line: for KVP_EAUTH / KVP_EAUTH_BACKOFF with
 * a tenant token, that the master knows no such token (or the cluster
 * token is wrong); for KVP_EILLEGAL_CLIENT, that tenant cfg->tenant needs
 * its own token and where it comes from (never a flag). "" otherwise.
 * Never shows a secret. Returns buf.
 */
const char *kvp_cli_tenant_hint(const kvp_config *cfg, int rc, char *buf, size_t n);

/*
 * Starts this binary (/proc/self/exe) with `kvpool <args...> --listen
 * 127.0.0.1:0 --port-file F` (args NULL-terminated, e.g. {"serve",
 * "--segment-size", "1GiB", NULL}), waits up to wait_ms for the port file,
 * and writes "127.0.0.1:PORT" into addr. The child gets SIGTERM if this
 * process dies. Returns its pid, or -1 (the child, if any, is killed).
 */
pid_t kvp_cli_spawn_self(const char *const *args, int wait_ms, char *addr, size_t addrlen);
/*
 * The HTTP endpoint of a server command (config key "http"; endpoint.c):
 * the master's pages, metrics and /api/kv/lookup (master), the storage
 * node's metrics (node), or both in one (kvpool serve). /metrics, /healthz
 * and /readyz answer for every part given (ready = every part ready).
 * Returns 0 with *out (NULL when cfg->http is empty), or 1 after a message
 * on stderr. master and node must outlive the endpoint: kvp_http_stop it
 * first.
 */
struct kvp_mserver;
struct kvp_node;
struct kvp_http;
int kvp_cli_http_start(const char *cmd, const kvp_config *cfg, struct kvp_mserver *master,
                       struct kvp_node *node, struct kvp_http **out);
#endif
