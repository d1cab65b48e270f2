/* cmd_master.c -- `kvpool master`: run the metadata service. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/log.h"
#include "kvpool.h"
#include "master/service.h"

static void help(void)
{
    printf("usage: kvpool master [--listen HOST:PORT] [--config FILE] [--port-file FILE]\n"
           "                     [--<config key> VALUE]...\n\n"
           "Runs the kvpool master: object metadata, allocation, eviction, leases and\n"
           "liveness. It never touches object bytes. Stops cleanly on SIGTERM/SIGINT.\n\n"
           "  --listen HOST:PORT  address to serve (default 127.0.0.1:50051; port 0 = any)\n"
           "  --config FILE       JSON configuration (default $KVPOOL_CONFIG, then\n"
           "                      $MOONCAKE_CONFIG_PATH)\n"
           "  --port-file FILE    write the bound port there once listening\n\n"
           "The keys the master reads are also flags (--lease-ttl 5s, --client-ttl 10s,\n"
           "...); kvpool help config prints what each key means:\n");
    kvp_config_print_flags(stdout, KVP_KEY_MASTER, NULL, 2);
}

int kvp_cmd_master(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"port-file", KVP_CLI_TEXT}, {NULL, KVP_CLI_TEXT}};
    const char *vals[1] = {NULL};
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_MASTER, &cfg, own, vals, NULL);
    if (rc == 1) {
        help();
        return 0;
    }
    if (rc < 0)
        return 2;
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    kvp_mserver *s;
    rc = kvp_mserver_create(&cfg, 1, &s, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvpool master: %s\n", err);
        return 1;
    }
    if (vals[0]) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", vals[0]);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%u\n", kvp_mserver_port(s)) < 0 || fclose(f) != 0 ||
            rename(tmp, vals[0]) != 0) {
            fprintf(stderr, "kvpool master: cannot write port file %s\n", vals[0]);
            kvp_mserver_destroy(s);
            return 1;
        }
    }
    rc = kvp_mserver_run(s);
    kvp_mserver_destroy(s);
    KVP_INFO("master", "stopped");
    return rc ? 1 : 0;
}
