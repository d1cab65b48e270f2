/* main.c -- `kvpool`: one program, subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "sim/sim.h"
#include "common/log.h"
#include "kvpool.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"serve", kvp_cmd_serve, "run a master and a storage node in one process (single machine)"},
    {"master", kvp_cmd_master, "run the master (metadata service)"},
    {"store", kvp_cmd_store, "run a storage node (segment server, mounted at the master)"},
    {"stat", kvp_cmd_stat, "show the pool: usage, hits, misses, evictions, segments"},
    {"reset", kvp_cmd_reset, "remove every object (asks unless --yes)"},
    {"put", kvp_cmd_kv, "store a file's bytes (or stdin) under a key"},
    {"get", kvp_cmd_kv, "write a key's value to a file (or stdout)"},
    {"exist", kvp_cmd_kv, "tell whether keys exist"},
    {"rm", kvp_cmd_kv, "remove keys"},
    {"sim", kvp_sim_main, "engine simulator: instances x TP ranks driving the connector"},
    {"bench", kvp_bench_main, "benchmarks: `kvpool bench master|store|connector|sim|gpu|disk`"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpool <command> [options]   (kvpool <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "  %-10s %s\n", "version", "print the version");
    fprintf(f, "\nFlags (--name VALUE or --name=VALUE) and arguments may come in any order;\n"
               "\"--\" ends the flags. A usage error exits with status 2.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("kvpool %s\n", kvp_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvpool: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
