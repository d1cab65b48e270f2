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
    {"bench", kvp_bench_main, "benchmarks: `kvpool bench master|store|connector|sim|gpu|disk|ha|scrape|kvev|segment`"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpool <command> [options]   (kvpool <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "  %-10s %s\n", "help", "`kvpool help config`: every configuration key (type,");
    fprintf(f, "  %-10s %s\n", "", "default, meaning, which commands read it); `kvpool help CMD`");
    fprintf(f, "  %-10s %s\n", "", "= `kvpool CMD --help`");
    fprintf(f, "  %-10s %s\n", "version", "print the version");
    fprintf(f, "\nFlags (--name VALUE or --name=VALUE) and arguments may come in any order;\n"
               "\"--\" ends the flags. A boolean flag is --name alone or --name=true|false\n"
               "(also 1|0, yes|no, on|off). A configuration key is a flag of the commands\n"
               "that read it (--lease-ttl 5s for master and serve); others refuse it.\n"
               "A usage error exits with status 2.\n");
}

/* `kvpool help config` (the key reference) or `kvpool help CMD` (CMD --help). */
static int help_topic(int argc, char **argv)
{
    if (argc == 1 && !strcmp(argv[0], "config")) {
        printf("Configuration keys: in a JSON file (--config FILE, else $KVPOOL_CONFIG, else\n"
               "$MOONCAKE_CONFIG_PATH), or as --key-name VALUE flags of the commands that read\n"
               "them (docs/CONFIG.md).\n\n");
        kvp_config_print_reference(stdout);
        return 0;
    }
    for (size_t i = 0; argc == 1 && i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[0], cmds[i].name))
            return cmds[i].fn(2, (char *[]){argv[0], "--help", NULL});
    char q[96];
    fprintf(stderr, "kvpool help: %s%s (allowed: kvpool help config, or kvpool help CMD for a "
            "command of kvpool --help)\n", argc == 1 ? "unknown topic " : "expected one topic",
            argc == 1 ? kvp_cli_quote(argv[0], q, sizeof q) : "");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        (!strcmp(argv[1], "help") && argc == 2)) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "help"))
        return help_topic(argc - 2, argv + 2);
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
