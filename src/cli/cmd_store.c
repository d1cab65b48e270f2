/* cmd_store.c -- `kvpool store`: run a storage node (segment + segment
 * server + master link) until SIGTERM/SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/log.h"
#include "common/notify.h"
#include "net/http.h"
#include "kvpool.h"
#include "node/node.h"
#include "node/segment.h"

static void help(void)
{
    printf("usage: kvpool store [--listen HOST:PORT] [--master HOST:PORT] [--segment-size SIZE]\n"
           "                    [--unix-dir DIR] [--io-threads N] [--master-optional]\n"
           "                    [--config FILE] [--<config key> VALUE]...\n\n"
           "Runs a storage node: one segment of memory, served to clients over TCP and\n"
           "(same host) shared memory, mounted at the master. Stops cleanly on SIGTERM/SIGINT\n"
           "(the segment is unmounted first).\n\n"
           "  --listen HOST:PORT   segment server address (default: with a master on another\n"
           "                       host, the local address facing it, port 0, which needs the\n"
           "                       cluster and node tokens; else local_hostname:0)\n"
           "  --master HOST:PORT   the master (config key master_server_address)\n"
           "  --segment-size SIZE  segment size, e.g. 4GB, 512MiB (global_segment_size)\n"
           "  --unix-dir DIR       directory of the same-host unix socket (default\n"
           "                       $XDG_RUNTIME_DIR/kvpool, else /tmp/kvpool-UID); created 0700\n"
           "                       if missing; must be ours and not writable by others\n"
           "  --shm-group GROUP    also let this group's members attach the segment (shm_group)\n"
           "  --io-threads N       segment server worker threads (default 2)\n"
           "  --master-optional    start even when the master is unreachable\n\n"
           "The keys a storage node reads are also flags; kvpool help config prints what\n"
           "each key means:\n");
    kvp_config_print_flags(stdout, KVP_KEY_NODE, NULL, 2);
}

int kvp_cmd_store(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"listen", KVP_CLI_LISTEN},
                                       {"segment-size", KVP_CLI_TEXT},
                                       {"unix-dir", KVP_CLI_TEXT},
                                       {"io-threads", KVP_CLI_TEXT},
                                       {"master-optional", KVP_CLI_BOOL},
                                       {NULL, KVP_CLI_TEXT}};
    const char *vals[5] = {NULL};
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_NODE, &cfg, own, vals, NULL);
    if (rc == 1) {
        help();
        return 0;
    }
    if (rc < 0)
        return 2;
    uint64_t io = 0;
    if ((vals[1] && kvp_cli_size("store", "segment-size", vals[1], 4096, UINT64_MAX,
                                 &cfg.global_segment_size) != 0) ||
        (vals[3] && kvp_cli_uint("store", "io-threads", vals[3], 1, 256, &io) != 0))
        return 2;
    char err[512];
    if (kvp_segment_check_size(cfg.global_segment_size, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool store: %s\n", err);
        return 2;
    }
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    sigprocmask(SIG_BLOCK, &ss, NULL); /* before any thread starts: all inherit it */
    signal(SIGPIPE, SIG_IGN);
    kvp_node_opts o = {&cfg, vals[0], vals[2], (int)io, vals[4] != NULL, 1};
    kvp_node *n;
    rc = kvp_node_start(&o, &n, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvpool store: %s\n", err);
        if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT)
            fprintf(stderr, "kvpool store: is the master running at %s? (kvpool master listens "
                    "on 127.0.0.1:50051 unless given --listen; start it first)\n",
                    cfg.master_addr);
        return 1;
    }
    KVP_INFO("store", "segment %016llx serving on port %u, master %s",
             (unsigned long long)kvp_node_segment_id(n), kvp_node_port(n), cfg.master_addr);
    kvp_http *http;
    if (kvp_cli_http_start("store", &cfg, NULL, n, &http) != 0) {
        kvp_node_stop(n);
        return 1;
    }
    kvp_notify("READY=1"); /* mounted (or serving without a master: --master-optional) */
    int sig = 0;
    sigwait(&ss, &sig);
    KVP_INFO("store", "signal %d: shutting down", sig);
    kvp_notify("STOPPING=1");
    kvp_http_stop(http);
    kvp_node_stop(n);
    KVP_INFO("store", "stopped");
    return 0;
}
