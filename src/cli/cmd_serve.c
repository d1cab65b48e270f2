/*
 * cmd_serve.c -- `kvpool serve`: the master and one storage node in one
 * process, the single-machine default.
 *
 * Shutdown order matters: on SIGTERM/SIGINT the node unmounts from the
 * still-running master first, then the master stops.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/log.h"
#include "common/size.h"
#include "kvpool.h"
#include "master/service.h"
#include "net/net.h"
#include "node/node.h"
#include "node/segment.h"

static void *run_master(void *p)
{
    kvp_mserver_run(p);
    return NULL;
}

int kvp_cmd_serve(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"segment-size", KVP_CLI_TEXT},
                                       {"segment-listen", KVP_CLI_LISTEN},
                                       {"port-file", KVP_CLI_TEXT},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[3] = {NULL};
    int rc = kvp_cli_parse(argc, argv, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool serve [--listen HOST:PORT] [--segment-size SIZE]\n"
               "                    [--segment-listen HOST:PORT] [--port-file FILE] [--<key> VALUE]...\n\n"
               "Runs the master and one storage node in one process: the single-machine\n"
               "default. Clients on this host reach the segment through shared memory.\n\n"
               "  --listen HOST:PORT          master address (default 127.0.0.1:50051)\n"
               "  --segment-size SIZE         memory the node contributes (default 4GiB; at most\n"
               "                              what this machine can back); it serves at once and\n"
               "                              faults the memory in behind the first requests\n"
               "                              (--segment-prefault background|sync|off)\n"
               "  --segment-listen HOST:PORT  the node's segment server (default HOST:0)\n"
               "  --port-file FILE            write the master's port there once serving\n");
        return 0;
    }
    if (rc < 0)
        return 2;
    if (v[0] && kvp_cli_size("serve", "segment-size", v[0], 1u << 20, UINT64_MAX,
                             &cfg.global_segment_size) != 0)
        return 2;
    if (cfg.global_segment_size < (1u << 20)) {
        fprintf(stderr, "kvpool serve: the segment size (%llu bytes, from the configuration) "
                "must be at least 1MiB\n", (unsigned long long)cfg.global_segment_size);
        return 2;
    }
    char err[512];
    if (kvp_segment_check_size(cfg.global_segment_size, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool serve: %s\n", err);
        return 2;
    }
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    pthread_sigmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);

    kvp_mserver *ms;
    if (kvp_mserver_create(&cfg, 0, &ms, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool serve: %s\n", err);
        return 1;
    }
    char host[200];
    uint16_t port;
    kvp_net_split(cfg.listen, host, sizeof host, &port);
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::"))
        snprintf(host, sizeof host, "127.0.0.1");
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "%s:%u", host, kvp_mserver_port(ms));
    pthread_t th;
    if (pthread_create(&th, NULL, run_master, ms) != 0) {
        fprintf(stderr, "kvpool serve: cannot start the master thread\n");
        kvp_mserver_destroy(ms);
        return 1;
    }
    char seg_listen[300];
    snprintf(seg_listen, sizeof seg_listen, "%s:0", host);
    kvp_node_opts no = {.cfg = &cfg, .listen = v[1] ? v[1] : seg_listen, .io_threads = 4,
                        .standalone = 1};
    kvp_node *node = NULL;
    int ret = 0;
    if (kvp_node_start(&no, &node, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool serve: %s\n", err);
        ret = 1;
    } else if (v[2]) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", v[2]);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%u\n", kvp_mserver_port(ms)) < 0 || fclose(f) != 0 ||
            rename(tmp, v[2]) != 0) {
            fprintf(stderr, "kvpool serve: cannot write port file %s\n", v[2]);
            ret = 1;
        }
    }
    if (ret == 0) {
        int sig;
        sigwait(&ss, &sig);
        KVP_INFO("serve", "signal %d: shutting down", sig);
    }
    kvp_node_stop(node);
    kvp_mserver_stop(ms);
    pthread_join(th, NULL);
    kvp_mserver_destroy(ms);
    return ret;
}
