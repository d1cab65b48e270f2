/*
 * test_cli_contract.c -- the `kvpool` command line does what it says: every
 * flag it accepts takes effect, every other is refused (exit status 2, one
 * message naming the flag). Run as a real program (the ASan build) against
 * real masters, storage nodes and `kvpool serve`.
 *
 *   boolean flags     --name alone, --name=true|false|1|0|yes|no|on|off
 *   key roles         a key a command does not read is refused; the client
 *                     keys of put/get/exist/rm/stat/reset take effect
 *   serve --unix-dir  the node inside serve puts its socket there, and a
 *                     same-host client attaches through shared memory
 *   tenants           --tenant with tenant_token_file / $KVPOOL_TENANT_TOKEN
 *                     in the data and admin commands; the token never a flag
 *   help config       the key reference, named by --help
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"

static char out[65536];

/* Runs `kvpool ARGS...` (NULL-terminated), capturing which (1 stdout, 2
 * stderr, 3 both) into out; returns the exit status. */
#define KVPOOL(which, ...)                                                                     \
    tp_run_capture((const char *const[]){tp_kvpool_bin(), __VA_ARGS__, NULL}, (which), out,    \
                   sizeof out, 30000)

#define HAS(s) (strstr(out, (s)) != NULL)

/* In a TEST: CHECK(cond), and end the test when it failed. */
#define NEED(cond)                                                                             \
    do {                                                                                       \
        int need_ok_ = (cond) ? 1 : 0;                                                         \
        CHECK(need_ok_ && #cond);                                                              \
        if (!need_ok_)                                                                         \
            return;                                                                            \
    } while (0)

/* Writes text into a new 0600 file DIR/name; path gets its name. */
static int write_file(const char *dir, const char *name, const char *text, char *path,
                      size_t n)
{
    snprintf(path, n, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    size_t len = strlen(text);
    REQUIRE(write(fd, text, len) == (ssize_t)len);
    REQUIRE(close(fd) == 0);
    return 0;
}

static int mkdir_tmp(char *dir, size_t n, const char *tag)
{
    snprintf(dir, n, "/tmp/kvp-clic-%s-XXXXXX", tag);
    REQUIRE(mkdtemp(dir) != NULL);
    return 0;
}

/* ------------------------------------------------------ boolean flags */

/*
 * A boolean flag takes --name alone or --name=WORD (true, false, 1, 0, yes,
 * no, on, off, any case): the command's own (reset --yes, rm --force,
 * stat --json) and the boolean configuration keys (--insecure,
 * --enable-offload). Anything else is refused naming the flag, the value
 * and the words allowed.
 */
TEST(boolean_flags_take_a_value)
{
    char dir[64], f[128];
    CHECK_EQ(mkdir_tmp(dir, sizeof dir, "bool"), 0);
    CHECK_EQ(write_file(dir, "v", "value", f, sizeof f), 0);
    tp_master m;
    /* a boolean key with =WORD and alone, on the master */
    NEED(tp_master_start(&m, (const char *const[]){"--insecure=yes", "--insecure=Off",
                                                      "--insecure", "--insecure=0", NULL}) == 0);
    tp_store st;
    NEED(tp_store_start(&st, m.addr, (const char *const[]){"--segment-size", "16MiB",
                                                               "--enable-offload=FALSE", NULL}) ==
            0);
    const char *M = m.addr;
    CHECK_EQ(KVPOOL(2, "put", "k1", f, "--master", M), 0);
    /* own booleans: =WORD */
    CHECK_EQ(KVPOOL(1, "stat", "--json=on", "--master", M), 0);
    CHECK(out[0] == '{' && HAS("\"counters\""));
    CHECK_EQ(KVPOOL(1, "stat", "--json=false", "--master", M), 0);
    CHECK(out[0] != '{' && HAS("objects 1"));
    CHECK_EQ(KVPOOL(1, "stat", "--json", "--json=0", "--master", M), 0); /* later ones win */
    CHECK(out[0] != '{');
    CHECK_EQ(KVPOOL(1, "rm", "k1", "--force=YES", "--master", M), 0);
    CHECK_EQ(KVPOOL(2, "put", "k2", f, "--master", M), 0);
    /* reset --yes=false: not confirmed (standard input is no terminal) */
    CHECK_EQ(KVPOOL(2, "reset", "--yes=false", "--master", M), 2);
    CHECK(HAS("refusing without --yes"));
    CHECK_EQ(KVPOOL(1, "reset", "--yes=true", "--master", M), 0);
    CHECK(HAS("removed 1 objects"));
    CHECK_EQ(KVPOOL(1, "reset", "--yes=1", "--force=no", "--master", M), 0);
    CHECK(HAS("removed 0 objects"));
    /* bad words: the flag, the value, the words allowed */
    CHECK_EQ(KVPOOL(2, "reset", "--yes=maybe", "--master", M), 2);
    CHECK(strcmp(out, "kvpool reset: flag --yes: value \"maybe\" is not a boolean (allowed: true, "
                      "false, 1, 0, yes, no, on, off (any case))\n") == 0);
    CHECK_EQ(KVPOOL(2, "stat", "--json=", "--master", M), 2);
    CHECK(HAS("flag --json: value \"\" is not a boolean"));
    CHECK_EQ(KVPOOL(2, "rm", "k", "--force=2"), 2);
    CHECK(HAS("flag --force: value \"2\" is not a boolean"));
    CHECK_EQ(KVPOOL(2, "master", "--insecure=enable"), 2);
    CHECK(strstr(out, "kvpool master: flag --insecure: value \"enable\" is not a boolean "
                      "(allowed: true, false, 1, 0, yes, no, on, off") == out);
    CHECK_EQ(KVPOOL(2, "store", "--enable-offload=2"), 2);
    CHECK(HAS("flag --enable-offload: value \"2\" is not a boolean"));
    CHECK_EQ(KVPOOL(2, "sim", "--mla=perhaps"), 2); /* kvp_cli_scan's booleans too */
    CHECK(HAS("flag --mla: value \"perhaps\" is not a boolean"));
    /* a boolean key alone means true: the node then wants its directory */
    CHECK_EQ(KVPOOL(2, "store", "--enable-offload", "--master", M, "--segment-size", "4MiB"), 1);
    CHECK(HAS("offload_dir"));
    CHECK_EQ(KVPOOL(2, "store", "--enable-offload=on", "--master", M, "--segment-size", "4MiB"),
             1);
    CHECK(HAS("offload_dir"));
    CHECK_EQ(tp_store_stop(&st), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
    tp_rm_dir(dir);
}

/* --------------------------------------------------------- key roles */

/* A key the command does not read is refused, with who reads it: server
 * keys for the client commands, client keys for the servers, Mooncake keys
 * no command reads for everyone. (It was silently accepted.) */
TEST(keys_a_command_does_not_read_are_refused)
{
    static const char *const dead = "127.0.0.1:1";
    CHECK_EQ(KVPOOL(2, "put", "k", "--lease-ttl", "5s", "--master", dead), 2);
    CHECK(strcmp(out, "kvpool put: flag --lease-ttl: a key read only by kvpool serve, master; "
                      "put does not use it (kvpool help config: who reads each key)\n") == 0);
    CHECK_EQ(KVPOOL(2, "get", "k", "--max-master-memory=1GiB", "--master", dead), 2);
    CHECK(HAS("kvpool get: flag --max-master-memory: a key read only by kvpool serve, master; "
              "get does not use it"));
    CHECK_EQ(KVPOOL(2, "exist", "k", "--offload-dir", "/tmp/x", "--master", dead), 2);
    CHECK(HAS("flag --offload-dir: a key read only by kvpool serve, store; exist does not use it"));
    CHECK_EQ(KVPOOL(2, "rm", "k", "--listen", "127.0.0.1:0", "--master", dead), 2);
    CHECK(HAS("kvpool rm: flag --listen: a key read only by kvpool serve, master"));
    CHECK_EQ(KVPOOL(2, "put", "k", "--global-segment-size", "1GiB", "--master", dead), 2);
    CHECK(HAS("flag --global-segment-size: a key read only by kvpool serve, store"));
    CHECK_EQ(KVPOOL(2, "put", "k", "--tenant-tokens-file", "/etc/passwd", "--master", dead), 2);
    CHECK(HAS("flag --tenant-tokens-file: a key read only by kvpool serve, master"));
    CHECK_EQ(KVPOOL(2, "stat", "--replica-num", "2", "--master", dead), 2);
    CHECK(HAS("kvpool stat: flag --replica-num: a key read only by kvpool put, get, exist, rm; "
              "stat does not use it"));
    CHECK_EQ(KVPOOL(2, "reset", "--yes", "--client-ttl", "20s", "--master", dead), 2);
    CHECK(HAS("kvpool reset: flag --client-ttl: a key read only by kvpool serve, master"));
    CHECK_EQ(KVPOOL(2, "stat", "--protocol", "tcp", "--master", dead), 2);
    CHECK(HAS("flag --protocol: a key read only by kvpool serve, store, put, get, exist, rm"));
    /* the servers: client keys */
    CHECK_EQ(KVPOOL(2, "master", "--tenant", "teamX"), 2);
    CHECK(HAS("kvpool master: flag --tenant: a key read only by kvpool stat, reset, put, get, "
              "exist, rm; master does not use it"));
    CHECK_EQ(KVPOOL(2, "master", "--master", "127.0.0.1:5"), 2);
    CHECK(HAS("kvpool master: flag --master: a key read only by"));
    CHECK_EQ(KVPOOL(2, "master", "--tenant-token-file", "/tmp/t"), 2);
    CHECK(HAS("kvpool master: flag --tenant-token-file: a key read only by"));
    CHECK_EQ(KVPOOL(2, "master", "--offload-dir", "/tmp/x"), 2);
    CHECK(HAS("flag --offload-dir: a key read only by kvpool serve, store; master does not"));
    CHECK_EQ(KVPOOL(2, "store", "--lease-ttl", "5s"), 2);
    CHECK(HAS("kvpool store: flag --lease-ttl: a key read only by kvpool serve, master; store "
              "does not use it"));
    CHECK_EQ(KVPOOL(2, "store", "--tenant", "teamX"), 2);
    CHECK(HAS("kvpool store: flag --tenant: a key read only by"));
    CHECK_EQ(KVPOOL(2, "store", "--replica-num", "2"), 2);
    CHECK(HAS("kvpool store: flag --replica-num"));
    CHECK_EQ(KVPOOL(2, "serve", "--preferred-segment", "h:1"), 2);
    CHECK(HAS("kvpool serve: flag --preferred-segment: a key read only by kvpool put, get"));
    CHECK_EQ(KVPOOL(2, "serve", "--mode", "embedded"), 2);
    CHECK(HAS("kvpool serve: flag --mode: a key read only by"));
    /* serve's node uses serve's own master: --master would be ignored */
    CHECK_EQ(KVPOOL(2, "serve", "--master", "127.0.0.1:5"), 2);
    CHECK(HAS("kvpool serve: flag --master: serve's storage node uses the master of this "
              "process"));
    CHECK_EQ(KVPOOL(2, "serve", "--master-server-address=127.0.0.1:5"), 2);
    CHECK(HAS("kvpool serve: flag --master-server-address: serve's storage node"));
    /* keys no command reads (Mooncake's, kept for their files) */
    CHECK_EQ(KVPOOL(2, "put", "k", "--local-buffer-size", "1GiB", "--master", dead), 2);
    CHECK(HAS("kvpool put: flag --local-buffer-size: no kvpool command reads this key"));
    CHECK_EQ(KVPOOL(2, "master", "--device-name", "mlx5_0"), 2);
    CHECK(HAS("kvpool master: flag --device-name: no kvpool command reads this key"));
    /* the data commands are standalone-store clients: --mode embedded is refused */
    CHECK_EQ(KVPOOL(2, "put", "k", "--mode", "embedded", "--master", dead), 2);
    CHECK(HAS("kvpool put: flag --mode: value \"embedded\" is not this command's mode (allowed: "
              "standalone-store"));
    /* the secrets stay refused as flags, in every command */
    CHECK_EQ(KVPOOL(2, "put", "k", "--tenant-token", "s3cret"), 2);
    CHECK(HAS("flag --tenant-token: a secret on the command line"));
    CHECK_EQ(KVPOOL(2, "master", "--tenant-token", "s3cret"), 2);
    CHECK(HAS("flag --tenant-token: a secret on the command line"));
    CHECK_EQ(KVPOOL(2, "stat", "--cluster-token=s3cret"), 2);
    CHECK(HAS("flag --cluster-token: a secret on the command line"));
    /* a file may hold every key: one file serves every component */
    char dir[64], cf[128];
    CHECK_EQ(mkdir_tmp(dir, sizeof dir, "roles"), 0);
    CHECK_EQ(write_file(dir, "c.json", "{\"lease_ttl\": \"5s\", \"offload_dir\": \"/tmp/x\", "
                                       "\"local_buffer_size\": 0, \"device_name\": \"x\"}",
                        cf, sizeof cf),
             0);
    CHECK_EQ(KVPOOL(2, "exist", "k", "--config", cf, "--master", dead), 1); /* ran: no master */
    CHECK(HAS("kvpool exist:") && !HAS("flag"));
    tp_rm_dir(dir);
}

/* The client keys of the data and admin commands take effect (they were
 * dropped: the client saw only master, cluster_token and rpc_timeout). */
TEST(client_keys_take_effect)
{
    char dir[64], f[128], cf[128];
    CHECK_EQ(mkdir_tmp(dir, sizeof dir, "ckeys"), 0);
    CHECK_EQ(write_file(dir, "v", "value", f, sizeof f), 0);
    tp_master m;
    NEED(tp_master_start(&m, NULL) == 0);
    tp_store st;
    NEED(tp_store_start(&st, m.addr, (const char *const[]){"--segment-size", "16MiB", NULL}) ==
            0);
    const char *M = m.addr;
    /* protocol: a transport kvpool lacks is refused, not silently tcp; rdma
     * (UCX) is taken, and this host's node is reached over shared memory */
    CHECK_EQ(KVPOOL(2, "put", "k1", f, "--master", M, "--protocol", "nvlink"), 2);
    CHECK(HAS("--protocol"));
    CHECK_EQ(KVPOOL(1, "exist", "k1", "--master", M), 1);
    CHECK(strcmp(out, "k1: no\n") == 0);
    CHECK_EQ(KVPOOL(2, "put", "k1", f, "--master", M, "--protocol", "rdma"), 0);
    CHECK_EQ(KVPOOL(1, "exist", "k1", "--master", M), 0);
    CHECK(strcmp(out, "k1: yes\n") == 0);
    CHECK_EQ(KVPOOL(1, "rm", "k1", "--master", M), 0);
    /* replica_num: two copies, one on each segment */
    tp_store st2;
    NEED(tp_store_start(&st2, M, (const char *const[]){"--segment-size", "16MiB", NULL}) == 0);
    CHECK_EQ(KVPOOL(2, "put", "k2", f, "--master", M, "--replica-num", "2"), 0);
    CHECK_EQ(KVPOOL(1, "stat", "--json", "--master", M), 0);
    const char *segs = strstr(out, "\"segments\": ["), *end = strstr(out, "\"tenants\": [");
    int copies = 0;
    for (const char *p = segs; p && (p = strstr(p, "\"objects\": 1,")) != NULL && p < end; p++)
        copies++;
    CHECK_EQ(copies, 2);
    CHECK_EQ(tp_store_stop(&st2), 0);
    /* the same keys from the file: the file's "mode": "embedded" is for the
     * processes that host a segment; the command stays standalone-store */
    CHECK_EQ(write_file(dir, "bad.json", "{\"protocol\": \"nvlink\"}", cf, sizeof cf), 0);
    CHECK_EQ(KVPOOL(2, "get", "k2", "--config", cf, "--master", M), 2);
    CHECK(HAS("nvlink"));
    CHECK_EQ(write_file(dir, "c.json", "{\"mode\": \"embedded\", \"protocol\": \"ucx\"}", cf,
                        sizeof cf),
             0);
    CHECK_EQ(KVPOOL(1, "get", "k2", "--config", cf, "--master", M), 0);
    CHECK(strcmp(out, "value") == 0);
    CHECK_EQ(KVPOOL(1, "get", "k2", "--config", cf, "--master", M, "--protocol", "tcp",
                    "--mode", "standalone-store"),
             0);
    CHECK(strcmp(out, "value") == 0);
    /* rpc_timeout and log_level are read (the client's debug log shows) */
    CHECK_EQ(KVPOOL(2, "exist", "k2", "--master", "127.0.0.1:1", "--rpc-timeout", "3s",
                    "--log-level", "debug"),
             1);
    CHECK(HAS(" D client: connect to master 127.0.0.1:1"));
    CHECK_EQ(tp_store_stop(&st), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
    tp_rm_dir(dir);
}

/* ------------------------------------------------- serve and --unix-dir */

typedef struct serve_proc {
    pid_t pid;
    char addr[64];
} serve_proc;

/* `kvpool serve --listen 127.0.0.1:0 --port-file F --log-level error
 * <extra...>`, waiting (bounded) for the port. 0 or -1. */
static int serve_start(serve_proc *s, const char *dir, const char *const *extra)
{
    char pf[128];
    snprintf(pf, sizeof pf, "%s/port", dir);
    unlink(pf);
    const char *argv[40];
    int n = 0;
    argv[n++] = tp_kvpool_bin();
    argv[n++] = "serve";
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = pf;
    argv[n++] = "--log-level";
    argv[n++] = "error";
    for (int i = 0; extra && extra[i] && n < 39; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    s->pid = fork();
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    REQUIRE(s->pid > 0);
    for (int t = 0; t < 20000; t += 20) {
        FILE *f = fopen(pf, "r");
        unsigned port = 0;
        if (f) {
            int ok = fscanf(f, "%u", &port) == 1;
            fclose(f);
            if (ok) {
                snprintf(s->addr, sizeof s->addr, "127.0.0.1:%u", port);
                unlink(pf);
                return 0;
            }
        }
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            return -1;
        }
        tp_sleep_ms(20);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

/* SIGTERM, bounded wait; the exit status, or -1. */
static int serve_stop(serve_proc *s)
{
    if (s->pid <= 0)
        return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int t = 0; t < 15000; t += 20) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        tp_sleep_ms(20);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

/* `kvpool serve --unix-dir DIR` (documented, was refused): the node's
 * socket is in DIR, a same-host client attaches the segment through shared
 * memory, and the socket is gone after a clean stop. serve also takes the
 * master's and the node's keys it reads. */
TEST(serve_takes_unix_dir)
{
    char dir[64], sd[128];
    CHECK_EQ(mkdir_tmp(dir, sizeof dir, "serve"), 0);
    snprintf(sd, sizeof sd, "%s/sock", dir); /* created 0700 by the node */
    serve_proc s;
    NEED(serve_start(&s, dir, (const char *const[]){
                                     "--segment-size", "16MiB", "--unix-dir", sd,
                                     "--lease-ttl", "2s", "--client-ttl", "6s",
                                     "--node-max-connections", "64", "--idle-timeout", "1m",
                                     "--hello-timeout", "3s", "--rpc-timeout", "5s",
                                     "--insecure=false", "--max-objects", "1000", NULL}) == 0);
    CHECK_EQ(tp_node_socks(sd), 1);
    struct stat stt;
    CHECK(stat(sd, &stt) == 0 && (stt.st_mode & 077) == 0);
    /* a client on this host: the value moves over shm */
    char conf[256], err[512], desc[2048];
    snprintf(conf, sizeof conf, "{\"master\": \"%s\", \"mode\": \"standalone-store\", "
                                "\"log_level\": \"error\"}", s.addr);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    if (c) {
        static const char val[] = "through shared memory";
        CHECK_EQ(kvp_client_put(c, "shm-key", val, sizeof val), 0);
        CHECK(kvp_client_describe_json(c, "shm-key", desc, sizeof desc) > 0);
        CHECK(strstr(desc, "\"transport\": \"shm\"") != NULL);
        char back[64] = {0};
        CHECK_EQ(kvp_client_get(c, "shm-key", back, sizeof back), (int64_t)sizeof val);
        CHECK(memcmp(back, val, sizeof val) == 0);
        kvp_client_close(c);
    }
    /* and the command line reaches it */
    CHECK_EQ(KVPOOL(1, "exist", "shm-key", "--master", s.addr), 0);
    CHECK_EQ(serve_stop(&s), 0);
    CHECK_EQ(tp_node_socks(sd), 0);
    /* --unix-dir gets the node's checks: a shared directory is refused */
    CHECK_EQ(KVPOOL(2, "serve", "--listen", "127.0.0.1:0", "--segment-size", "4MiB",
                    "--unix-dir", "/tmp"),
             1);
    CHECK(HAS("writable by other users"));
    rmdir(sd);
    tp_rm_dir(dir);
}

/* ----------------------------------------------------------- tenants */

#define NODE_TOKEN "clic-node-token-0123456789"

/*
 * A master with a tenant tokens file: put --tenant teamX with its token
 * from tenant_token_file lands in teamX (a get without the tenant misses,
 * with it hits); without the token, or with a wrong one, the protected
 * tenant is refused with a message and a non-zero status; the token also
 * comes from $KVPOOL_TENANT_TOKEN, never from a flag; stat shows the
 * tenant; reset of the tenant removes only its keys.
 */
TEST(tenant_flags_reach_a_protected_tenant)
{
    char dir[64], tenants[128], tok[128], bad[128], f[128], g[128];
    CHECK_EQ(mkdir_tmp(dir, sizeof dir, "tenant"), 0);
    CHECK_EQ(write_file(dir, "tenants", "teamX tokX-0123456789\n", tenants, sizeof tenants), 0);
    CHECK_EQ(write_file(dir, "tok", "tokX-0123456789\n", tok, sizeof tok), 0);
    CHECK_EQ(write_file(dir, "bad", "not-the-token\n", bad, sizeof bad), 0);
    CHECK_EQ(write_file(dir, "v", "teamX value", f, sizeof f), 0);
    CHECK_EQ(write_file(dir, "w", "default value", g, sizeof g), 0);
    setenv("KVPOOL_NODE_TOKEN", NODE_TOKEN, 1);
    tp_master m;
    int up = tp_master_start(&m, (const char *const[]){"--tenant-tokens-file", tenants, NULL});
    tp_store st = {0};
    if (up == 0)
        up = tp_store_start(&st, m.addr, (const char *const[]){"--segment-size", "16MiB", NULL});
    unsetenv("KVPOOL_NODE_TOKEN");
    NEED(up == 0);
    const char *M = m.addr;

    CHECK_EQ(KVPOOL(2, "put", "k", f, "--master", M, "--tenant", "teamX", "--tenant-token-file",
                    tok),
             0);
    CHECK_EQ(KVPOOL(2, "put", "d", g, "--master", M), 0); /* the default tenant */
    /* the key is teamX's: not in default */
    CHECK_EQ(KVPOOL(3, "get", "k", "--master", M), 1);
    CHECK(HAS("not found") || HAS("NOT_FOUND") || HAS("-704"));
    CHECK_EQ(KVPOOL(1, "exist", "k", "--master", M), 1);
    CHECK(strcmp(out, "k: no\n") == 0);
    CHECK_EQ(KVPOOL(1, "get", "k", "--master", M, "--tenant=teamX", "--tenant-token-file", tok),
             0);
    CHECK(strcmp(out, "teamX value") == 0);
    CHECK_EQ(KVPOOL(1, "exist", "k", "--tenant", "teamX", "--tenant-token-file", tok, "--master",
                    M),
             0);
    CHECK(strcmp(out, "k: yes\n") == 0);
    /* the token from the environment */
    setenv("KVPOOL_TENANT_TOKEN", "tokX-0123456789", 1);
    int rc = KVPOOL(1, "get", "k", "--master", M, "--tenant", "teamX");
    unsetenv("KVPOOL_TENANT_TOKEN");
    CHECK_EQ(rc, 0);
    CHECK(strcmp(out, "teamX value") == 0);
    /* the tenant name from a configuration file, the token from its file key */
    char cf[160], json[512];
    snprintf(json, sizeof json, "{\"tenant_id\": \"teamX\", \"tenant_token_file\": \"%s\"}", tok);
    CHECK_EQ(write_file(dir, "c.json", json, cf, sizeof cf), 0);
    CHECK_EQ(KVPOOL(1, "get", "k", "--master", M, "--config", cf), 0);
    CHECK(strcmp(out, "teamX value") == 0);
    /* no token: the protected tenant is refused */
    CHECK_EQ(KVPOOL(2, "get", "k", "--master", M, "--tenant", "teamX"), 1);
    CHECK(strstr(out, "kvpool get: k: operation not allowed for this client (tenant \"teamX\" is "
                      "protected: give its token with --tenant-token-file FILE or "
                      "$KVPOOL_TENANT_TOKEN)") == out);
    /* a wrong token: refused at HELLO with a message, non-zero */
    rc = KVPOOL(2, "put", "k2", f, "--master", M, "--tenant", "teamX", "--tenant-token-file", bad);
    CHECK_EQ(rc, 1);
    CHECK(strstr(out, "kvpool put: ") == out);
    CHECK(HAS("(the master knows no such tenant token: check tenant_token_file or "
              "$KVPOOL_TENANT_TOKEN)"));
    CHECK(!HAS("not-the-token")); /* the secret is never shown */
    CHECK_EQ(KVPOOL(2, "stat", "--master", M, "--tenant-token-file", bad), 1);
    CHECK(strstr(out, "kvpool stat: ") == out && HAS("the master knows no such tenant token"));
    /* the token is never a flag */
    CHECK_EQ(KVPOOL(2, "get", "k", "--master", M, "--tenant", "teamX", "--tenant-token",
                    "tokX-0123456789"),
             2);
    CHECK(HAS("a secret on the command line is visible to every user"));
    /* stat: a tenant-bound session sees its tenant */
    CHECK_EQ(KVPOOL(1, "stat", "--master", M, "--tenant", "teamX", "--tenant-token-file", tok),
             0);
    CHECK(HAS("TENANT") && HAS("teamX") && !HAS("\ndefault "));
    CHECK_EQ(KVPOOL(1, "stat", "--json", "--master", M, "--tenant", "default"), 0);
    CHECK(HAS("\"name\": \"default\"") && !HAS("teamX"));
    /* reset of teamX removes teamX's keys only */
    CHECK_EQ(KVPOOL(1, "reset", "--yes", "--master", M, "--tenant", "teamX"), 1); /* no token */
    CHECK_EQ(KVPOOL(1, "reset", "--yes", "--master", M, "--tenant", "teamX",
                    "--tenant-token-file", tok),
             0);
    CHECK(HAS("removed 1 objects of tenant \"teamX\""));
    CHECK_EQ(KVPOOL(1, "exist", "k", "--tenant", "teamX", "--tenant-token-file", tok, "--master",
                    M),
             1);
    CHECK_EQ(KVPOOL(1, "get", "d", "--master", M), 0);
    CHECK(strcmp(out, "default value") == 0);
    /* rm in the tenant */
    CHECK_EQ(KVPOOL(2, "put", "k3", f, "--master", M, "--tenant", "teamX", "--tenant-token-file",
                    tok),
             0);
    CHECK_EQ(KVPOOL(2, "rm", "k3", "--master", M), 1); /* not in default */
    CHECK_EQ(KVPOOL(2, "rm", "k3", "--master", M, "--tenant", "teamX", "--tenant-token-file",
                    tok),
             0);
    tp_store_kill(&st);
    CHECK_EQ(tp_master_stop(&m), 0);
    tp_rm_dir(dir);
}

/* -------------------------------------------------------- help config */

/* `kvpool help config` prints the key reference (kvp_config_print_reference:
 * every key, its default and who reads it); `kvpool --help` names it and
 * every command; the servers' --help point at it and list their flags. */
TEST(help_config_prints_the_reference)
{
    CHECK_EQ(KVPOOL(1, "help", "config"), 0);
    static const char *const keys[] = {"listen", "lease_ttl", "tenant_tokens_file",
                                       "enable_offload", "tenant_token_file", "rpc_timeout",
                                       "master_server_address", "\"127.0.0.1:50051\"",
                                       "read by: kvpool serve, master", "read by: every command",
                                       "default_kv_lease_ttl", NULL};
    for (int i = 0; keys[i]; i++)
        CHECK(HAS(keys[i]));
    CHECK_EQ(KVPOOL(1, "--help"), 0);
    static const char *const cmds[] = {"serve", "master", "store", "stat", "reset", "put", "get",
                                       "exist", "rm", "sim", "bench", "version", NULL};
    for (int i = 0; cmds[i]; i++) {
        char line[32];
        snprintf(line, sizeof line, "\n  %-10s ", cmds[i]);
        CHECK(HAS(line));
    }
    CHECK(HAS("kvpool help config"));
    static const char *const servers[] = {"master", "store", "serve", NULL};
    for (int i = 0; servers[i]; i++) {
        CHECK_EQ(KVPOOL(1, servers[i], "--help"), 0);
        CHECK(HAS("kvpool help config"));
    }
    CHECK(HAS("--unix-dir") && HAS("--lease-ttl") && HAS("--offload-dir")); /* serve */
    CHECK_EQ(KVPOOL(1, "master", "--help"), 0);
    CHECK(HAS("--lease-ttl") && !HAS("--offload-dir") && !HAS("--tenant "));
    CHECK_EQ(KVPOOL(1, "help", "stat"), 0);
    CHECK(HAS("usage: kvpool stat"));
    CHECK_EQ(KVPOOL(2, "help", "bogus"), 2);
    CHECK(HAS("kvpool help: unknown topic \"bogus\""));
}
