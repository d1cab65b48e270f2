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
#include "common/notify.h"
#include "common/size.h"
#include "kvpool.h"
#include "master/service.h"
#include "net/http.h"
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
    /* the node inside talks to this process's master: the key "master" (and
     * its Mooncake names) is taken here to be refused, not ignored */
    static const kvp_cli_flag own[] = {{"segment-size", KVP_CLI_TEXT},
                                       {"segment-listen", KVP_CLI_LISTEN},
                                       {"port-file", KVP_CLI_TEXT},
                                       {"unix-dir", KVP_CLI_TEXT},
                                       {"master", KVP_CLI_TEXT},
                                       {"master-server-address", KVP_CLI_TEXT},
                                       {"master-server-addr", KVP_CLI_TEXT},
                                       {"master_server_address", KVP_CLI_TEXT},
                                       {"master_server_addr", KVP_CLI_TEXT},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[9] = {NULL};
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_MASTER | KVP_KEY_NODE, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool serve [--listen HOST:PORT] [--segment-size SIZE]\n"
               "                    [--segment-listen HOST:PORT] [--unix-dir DIR]\n"
               "                    [--port-file FILE] [--config FILE] [--<key> VALUE]...\n\n"
               "Runs the master and one storage node in one process: the single-machine\n"
               "default. Clients on this host reach the segment through shared memory.\n\n"
               "  --listen HOST:PORT          master address (default 127.0.0.1:50051)\n"
               "  --segment-size SIZE         memory the node contributes (default 4GiB; at most\n"
               "                              what this machine can back); it serves at once and\n"
               "                              faults the memory in behind the first requests\n"
               "                              (--segment-prefault background|sync|off)\n"
               "  --segment-listen HOST:PORT  the node's segment server (default HOST:0)\n"
               "  --unix-dir DIR              directory of the same-host unix socket (default\n"
               "                              $XDG_RUNTIME_DIR/kvpool, else /tmp/kvpool-UID);\n"
               "                              created 0700 if missing; must be ours and not\n"
               "                              writable by others\n"
               "  --port-file FILE            write the master's port there once serving\n"
               "  --config FILE               JSON configuration (default $KVPOOL_CONFIG, then\n"
               "                              $MOONCAKE_CONFIG_PATH)\n\n"
               "The keys of the master and of a storage node are also flags (the node uses\n"
               "this process's master, so --master is refused); kvpool help config prints\n"
               "what each key means:\n");
        kvp_config_print_flags(stdout, KVP_KEY_MASTER | KVP_KEY_NODE,
                               (const char *const[]){"master", NULL}, 2);
        return 0;
    }
    if (rc < 0)
        return 2;
    for (int i = 4; i < 9; i++)
        if (v[i]) {
            fprintf(stderr, "kvpool serve: flag --%s: serve's storage node uses the master of "
                    "this process (on --listen); run kvpool store --master HOST:PORT for a node "
                    "of another master\n", own[i].name);
            return 2;
        }
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
    /* the segment listens where the master does; on a wildcard it is
     * registered as local_hostname (node.c), which only the user can know */
    int wild = !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
    char seg_listen[300];
    snprintf(seg_listen, sizeof seg_listen, strchr(host, ':') ? "[%s]:0" : "%s:0", host);
    if (wild) {
        if (!kvp_config_was_set(&cfg, "local_hostname")) {
            KVP_WARN("serve", "the master listens on %s, but the segment is registered as "
                     "127.0.0.1: clients on other hosts cannot reach it; set local_hostname "
                     "to this host's address, or give --listen this host's address", cfg.listen);
            snprintf(seg_listen, sizeof seg_listen, "127.0.0.1:0");
        }
        snprintf(host, sizeof host, "127.0.0.1");
    }
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "%s:%u", host, kvp_mserver_port(ms));
    pthread_t th;
    if (pthread_create(&th, NULL, run_master, ms) != 0) {
        fprintf(stderr, "kvpool serve: cannot start the master thread\n");
        kvp_mserver_destroy(ms);
        return 1;
    }
    kvp_node_opts no = {.cfg = &cfg, .listen = v[1] ? v[1] : seg_listen, .unix_dir = v[3],
                        .io_threads = 4, .standalone = 1};
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
    kvp_http *http = NULL;
    if (ret == 0 && kvp_cli_http_start("serve", &cfg, ms, node, &http) != 0)
        ret = 1;
    if (ret == 0) {
        kvp_notify("READY=1"); /* the master serves, the node is mounted */
        int sig;
        sigwait(&ss, &sig);
        KVP_INFO("serve", "signal %d: shutting down", sig);
        kvp_notify("STOPPING=1");
    }
    kvp_http_stop(http);
    kvp_node_stop(node);
    kvp_mserver_stop(ms);
    pthread_join(th, NULL);
    kvp_mserver_destroy(ms);
    return ret;
}
