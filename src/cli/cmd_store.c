/* cmd_store.c -- `kvpool store`: run a storage node (segment + segment
 * server + master link) until SIGTERM/SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/log.h"
#include "kvpool.h"
#include "node/node.h"

static void help(void)
{
    printf("usage: kvpool store [--listen HOST:PORT] [--master HOST:PORT] [--segment-size SIZE]\n"
           "                    [--unix-dir DIR] [--io-threads N] [--master-optional]\n"
           "                    [--config FILE] [--<config key> VALUE]...\n\n"
           "Runs a storage node: one segment of memory, served to clients over TCP and\n"
           "(same host) shared memory, mounted at the master. Stops cleanly on SIGTERM/SIGINT\n"
           "(the segment is unmounted first).\n\n"
           "  --listen HOST:PORT   segment server address (default local_hostname:0)\n"
           "  --master HOST:PORT   the master (config key master_server_address)\n"
           "  --segment-size SIZE  segment size, e.g. 4GB, 512MiB (global_segment_size)\n"
           "  --unix-dir DIR       directory of the same-host unix socket (default\n"
           "                       $XDG_RUNTIME_DIR/kvpool, else /tmp/kvpool-UID); created 0700\n"
           "                       if missing; must be ours and not writable by others\n"
           "  --shm-group GROUP    also let this group's members attach the segment (shm_group)\n"
           "  --io-threads N       segment server worker threads (default 2)\n"
           "  --master-optional    start even when the master is unreachable\n\n"
           "Every configuration key is also a flag:\n\n");
    kvp_config_print_reference(stdout);
}

int kvp_cmd_store(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const char *const own[] = {"listen",   "master",     "segment-size",     "unix-dir",
                                      "io-threads", "master-optional!", NULL};
    const char *vals[6] = {NULL};
    int rc = kvp_cli_parse(argc, argv, &cfg, own, vals);
    if (rc == 1) {
        help();
        return 0;
    }
    if (rc < 0)
        return 2;
    char err[512];
    if ((vals[1] && kvp_config_set(&cfg, "master", vals[1], err, sizeof err) != 0) ||
        (vals[2] && kvp_config_set(&cfg, "global_segment_size", vals[2], err, sizeof err) != 0)) {
        fprintf(stderr, "kvpool store: %s\n", err);
        return 2;
    }
    int io = 0;
    if (vals[4] && (sscanf(vals[4], "%d", &io) != 1 || io < 1 || io > 256)) {
        fprintf(stderr, "kvpool store: flag --io-threads: \"%s\" is not a number in 1..256\n",
                vals[4]);
        return 2;
    }
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    sigprocmask(SIG_BLOCK, &ss, NULL); /* before any thread starts: all inherit it */
    signal(SIGPIPE, SIG_IGN);
    kvp_node_opts o = {&cfg, vals[0], vals[3], io, vals[5] != NULL};
    kvp_node *n;
    rc = kvp_node_start(&o, &n, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvpool store: %s\n", err);
        return 1;
    }
    KVP_INFO("store", "segment %016llx serving on port %u, master %s",
             (unsigned long long)kvp_node_segment_id(n), kvp_node_port(n), cfg.master_addr);
    int sig = 0;
    sigwait(&ss, &sig);
    KVP_INFO("store", "signal %d: shutting down", sig);
    kvp_node_stop(n);
    KVP_INFO("store", "stopped");
    return 0;
}
