/* cli.h -- the `kvpool` command's subcommands (one file each). */
#ifndef KVP_CLI_H
#define KVP_CLI_H

#include "common/config.h"

/* Each returns the process exit status. argv[0] is the subcommand name. */
int kvp_cmd_master(int argc, char **argv);
int kvp_cmd_store(int argc, char **argv);
int kvp_cmd_bench(int argc, char **argv);
/* `kvpool bench store` (cmd_bench_store.c); argv[0] is "store". */
int kvp_bench_store(int argc, char **argv);
/* `kvpool bench connector` (cmd_bench_connector.c); argv[0] is "connector". */
int kvp_bench_connector(int argc, char **argv);
/* `kvpool bench sim` (cmd_bench_sim.c); argv[0] is "sim". */
int kvp_bench_sim(int argc, char **argv);
int kvp_cmd_stat(int argc, char **argv);
int kvp_cmd_reset(int argc, char **argv);
int kvp_cmd_serve(int argc, char **argv);
/* `kvpool sim` (cmd_sim.c): the engine simulator */
int kvp_cmd_sim(int argc, char **argv);
/* put | get | exist | rm, by argv[0] */
int kvp_cmd_kv(int argc, char **argv);

/*
 * Shared option handling: loads the config file (--config FILE, else
 * $KVPOOL_CONFIG, else $MOONCAKE_CONFIG_PATH), then applies every
 * "--key value" / "--key=value" flag as a config key ('-' = '_').
 * Flags listed in `own` (NULL-terminated, without "--") are not config
 * keys: their values are returned in own_vals (NULL if absent; a flag in
 * `own` ending in '!' is boolean and yields "1").
 * Prints a message naming the flag and returns -1 on error, 1 for --help.
 */
int kvp_cli_parse(int argc, char **argv, kvp_config *cfg, const char *const *own,
                  const char **own_vals);
/*
 * Starts this binary (/proc/self/exe) with `kvpool <args...> --listen
 * 127.0.0.1:0 --port-file F` (args NULL-terminated, e.g. {"serve",
 * "--segment-size", "1GiB", NULL}), waits up to wait_ms for the port file,
 * and writes "127.0.0.1:PORT" into addr. The child gets SIGTERM if this
 * process dies. Returns its pid, or -1 (the child, if any, is killed).
 */
#include <sys/types.h>
pid_t kvp_cli_spawn_self(const char *const *args, int wait_ms, char *addr, size_t addrlen);
#endif
