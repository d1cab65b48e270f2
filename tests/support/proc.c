/* proc.c -- run kvpool processes (master, storage nodes) from tests; see proc.h. */
#include "proc.h"

#include "kvpool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "net/net.h"
#include "net/rpc.h"
#include "proto/proto.h"

#define START_WAIT_MS 10000
#define STOP_WAIT_MS 15000
#define MAX_ARGS 64

uint64_t tp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0; /* keep going: remove what can be */
}

void tp_rm_dir(const char *dir)
{
    /* depth first, not following links: etcd's data dir holds a tree
     * (member/wal, member/snap) of preallocated files */
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void tp_fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (size_t i = 0; i < len; i++) {
        if ((i & 7) == 0) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        p[i] = (uint8_t)(x >> ((i & 7) * 8));
    }
}

long tp_slurp(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || cap == 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(fd, out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
    close(fd);
    return (long)n;
}

void tp_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

const char *tp_kvpool_bin(void)
{
    const char *b = getenv("KVPOOL_BIN");
    return b && *b ? b : "build/asan/kvpool";
}

static int decode_status(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

/* Waits up to ms for pid; returns its decoded status or -1 on timeout. */
static int wait_bounded(pid_t pid, unsigned ms)
{
    uint64_t end = tp_now_ms() + ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return decode_status(st);
        if (r < 0 && errno != EINTR)
            return -1;
        if (tp_now_ms() >= end)
            return -1;
        tp_sleep_ms(5);
    }
}

static void cleanup_dir(tp_master *m)
{
    if (!m->dir[0])
        return;
    char p[300];
    snprintf(p, sizeof p, "%s/port", m->dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/port.tmp", m->dir);
    unlink(p);
    rmdir(m->dir);
    m->dir[0] = 0;
}

/* fork + execv(argv) with stdin from /dev/null (and o's limit and stderr,
 * when o is given); the child's pid or -1. */
static pid_t spawn_argv_opts(const char *const *argv, const tp_master_opts *o)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            close(nul);
        }
        if (o && o->stderr_path) {
            int fd = open(o->stderr_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) {
                dup2(fd, 2);
                close(fd);
            }
        }
        if (o && o->nofile) {
            struct rlimit rl = {o->nofile, o->nofile};
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
                fprintf(stderr, "setrlimit: %s\n", strerror(errno));
                _exit(127);
            }
        }
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static pid_t spawn_argv(const char *const *argv) { return spawn_argv_opts(argv, NULL); }

int tp_master_start(tp_master *m, const char *const *extra)
{
    return tp_master_start_opts(m, extra, NULL);
}

int tp_master_start_opts(tp_master *m, const char *const *extra, const tp_master_opts *o)
{
    memset(m, 0, sizeof *m);
    const char *tmp = getenv("TMPDIR");
    snprintf(m->dir, sizeof m->dir, "%s/kvp-master-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(m->dir)) {
        fprintf(stderr, "tp_master_start: mkdtemp: %s\n", strerror(errno));
        m->dir[0] = 0;
        return -1;
    }
    char pf[300];
    snprintf(pf, sizeof pf, "%s/port", m->dir);
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = tp_kvpool_bin();
    argv[n++] = "master";
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = pf;
    argv[n++] = "--log-level";
    argv[n++] = "error";
    for (int i = 0; extra && extra[i] && n < MAX_ARGS - 1; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = spawn_argv_opts(argv, o);
    if (pid < 0) {
        cleanup_dir(m);
        return -1;
    }
    m->pid = pid;
    uint64_t end = tp_now_ms() + START_WAIT_MS;
    while (tp_now_ms() < end) {
        FILE *f = fopen(pf, "r");
        if (f) {
            unsigned port = 0;
            int ok = fscanf(f, "%u", &port) == 1 && port > 0 && port < 65536;
            fclose(f);
            if (ok) {
                m->port = (uint16_t)port;
                snprintf(m->addr, sizeof m->addr, "127.0.0.1:%u", port);
                return 0;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "tp_master_start: master exited early (status %d)\n",
                    decode_status(st));
            m->pid = 0;
            cleanup_dir(m);
            return -1;
        }
        tp_sleep_ms(10);
    }
    fprintf(stderr, "tp_master_start: no port file after %d ms\n", START_WAIT_MS);
    tp_master_kill(m);
    return -1;
}

int tp_store_spawn(tp_master *p, const char *const *args)
{
    memset(p, 0, sizeof *p);
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = tp_kvpool_bin();
    argv[n++] = "store";
    argv[n++] = "--log-level";
    argv[n++] = "error";
    for (int i = 0; args && args[i] && n < MAX_ARGS - 1; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = spawn_argv(argv);
    if (pid < 0)
        return -1;
    p->pid = pid;
    return 0;
}

int tp_master_alive(tp_master *m, int *status)
{
    if (m->pid <= 0)
        return 0;
    int st;
    if (waitpid(m->pid, &st, WNOHANG) == m->pid) {
        if (status)
            *status = decode_status(st);
        m->pid = 0;
        return 0;
    }
    return 1;
}

/* State letter of pid (field 3 of /proc/PID/stat), or 0. */
/* The state letter of /proc/PID/stat, or of /proc/PID/task/TID/stat with
 * tid > 0; 0 when unreadable. */
static char proc_state(pid_t pid, pid_t tid)
{
    char path[96], buf[512];
    if (tid > 0)
        snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)tid);
    else
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* the command may hold spaces and ')' */
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

/* 1 when every thread of pid is stopped. A group stop (SIGSTOP) stops the
 * threads one by one, each as it next runs: until the last one has, the
 * others -- a master's loop, say -- still serve, though the main thread
 * already reads 'T'. */
static int all_threads_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int n = 0, all = 1;
    for (struct dirent *e; all && (e = readdir(d));) {
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid <= 0)
            continue;
        char st = proc_state(pid, tid);
        all = st == 'T' || st == 't' || st == 0; /* 0: a thread that just ended */
        n++;
    }
    closedir(d);
    return all && n > 0;
}

int tp_proc_wait_stopped(pid_t pid, unsigned ms)
{
    for (unsigned waited = 0;; waited += 2) {
        char st = proc_state(pid, 0);
        if ((st == 'T' || st == 't') && all_threads_stopped(pid))
            return 0;
        if (waited >= ms)
            return -1;
        usleep(2000);
    }
}

/* Adds the rx_queue of the lines of a /proc/net/tcp file whose inode is in
 * ino[0..n). */
static void rx_of(const char *path, const unsigned long *ino, size_t n, long *sum)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[512];
    if (!fgets(line, sizeof line, f)) { /* header */
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        unsigned long txq, rxq, inode;
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, "%*s %*s %*s %*s %lx:%lx %*s %*s %*s %*s %lu", &txq, &rxq, &inode) != 3)
            continue;
        for (size_t i = 0; i < n; i++)
            if (ino[i] == inode)
                *sum += (long)rxq;
    }
    fclose(f);
}

long tp_proc_rx_queued(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    unsigned long ino[256];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < sizeof ino / sizeof ino[0]) {
        char fp[320], target[64];
        snprintf(fp, sizeof fp, "%s/%s", path, de->d_name);
        ssize_t k = readlink(fp, target, sizeof target - 1);
        if (k <= 0)
            continue;
        target[k] = 0;
        if (sscanf(target, "socket:[%lu]", &ino[n]) == 1)
            n++;
    }
    closedir(d);
    long sum = 0;
    rx_of("/proc/net/tcp", ino, n, &sum);
    rx_of("/proc/net/tcp6", ino, n, &sum);
    return sum;
}

int tp_master_stop(tp_master *m)
{
    if (m->pid <= 0) {
        cleanup_dir(m);
        return -1;
    }
    kill(m->pid, SIGTERM);
    int rc = wait_bounded(m->pid, STOP_WAIT_MS);
    if (rc < 0) {
        fprintf(stderr, "tp_master_stop: pid %d did not stop in %d ms; killing it\n",
                (int)m->pid, STOP_WAIT_MS);
        kill(m->pid, SIGKILL);
        wait_bounded(m->pid, 5000);
    }
    m->pid = 0;
    cleanup_dir(m);
    return rc;
}

void tp_master_kill(tp_master *m)
{
    if (m->pid > 0) {
        kill(m->pid, SIGKILL);
        wait_bounded(m->pid, 5000);
    }
    m->pid = 0;
    cleanup_dir(m);
}

int tp_run_capture(const char *const *argv, int which, char *out, size_t outlen, int timeout_ms)
{
    int p[2];
    if (outlen)
        out[0] = 0;
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            if (!(which & 2))
                dup2(nul, 2);
        }
        if (which & 1)
            dup2(p[1], 1);
        if (which & 2)
            dup2(p[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    uint64_t end = tp_now_ms() + (uint64_t)timeout_ms;
    int timed_out = 0;
    for (;;) {
        uint64_t now = tp_now_ms();
        if (now >= end) {
            timed_out = 1;
            break;
        }
        struct pollfd pf = {p[0], POLLIN, 0};
        int n = poll(&pf, 1, (int)(end - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            timed_out = n == 0;
            break;
        }
        char buf[4096];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* EOF: the child closed its ends */
        if (outlen && len < outlen - 1) {
            size_t c = (size_t)r < outlen - 1 - len ? (size_t)r : outlen - 1 - len;
            memcpy(out + len, buf, c);
            len += c;
            out[len] = 0;
        }
    }
    close(p[0]);
    if (timed_out) {
        kill(pid, SIGKILL);
        wait_bounded(pid, 5000);
        return -1;
    }
    int rc = wait_bounded(pid, (unsigned)timeout_ms);
    if (rc < 0) {
        kill(pid, SIGKILL);
        wait_bounded(pid, 5000);
    }
    return rc;
}

/* ------------------------------------------------------------ storage nodes */

int tp_master_segments(const char *master_addr)
{
    return tp_master_seg_list(master_addr, NULL, NULL, 0);
}

int tp_master_seg_list(const char *master_addr, uint64_t *id, char *name, size_t len)
{
    kvp_rpc_opts o = {.name = "test stats", .timeout_ms = 2000};
    kvp_rpc *r;
    char err[256];
    if (kvp_rpc_open(master_addr, &o, &r, err, sizeof err) != 0)
        return -1;
    int32_t st = 0;
    const uint8_t *b;
    uint32_t bl;
    int n = -1;
    if (kvp_rpc_call(r, KVP_OP_STATS, NULL, 0, &st, &b, &bl) == 0 && st == 0) {
        kvp_arena a;
        kvp_arena_init(&a, 16u << 20);
        kvp_proto_limits lim;
        kvp_proto_limits_default(&lim);
        kvp_msg_stats_resp sr;
        if (kvp_dec_stats_resp(b, bl, &lim, &a, &sr) == 0) {
            n = (int)sr.n_segs;
            if (n > 0 && id)
                *id = sr.segs[0].id;
            if (n > 0 && name && len) {
                size_t l = sr.segs[0].name.len < len - 1 ? sr.segs[0].name.len : len - 1;
                memcpy(name, sr.segs[0].name.p, l);
                name[l] = 0;
            }
        }
        kvp_arena_free(&a);
    }
    kvp_rpc_close(r);
    return n;
}

int tp_node_socks(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        k += strncmp(de->d_name, "kvpool-seg-", 11) == 0;
    closedir(d);
    return k;
}

int tp_store_start(tp_store *s, const char *master_addr, const char *const *extra)
{
    memset(s, 0, sizeof *s);
    int before = tp_master_segments(master_addr);
    if (before < 0) {
        fprintf(stderr, "tp_store_start: master %s does not answer STATS\n", master_addr);
        return -1;
    }
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = tp_kvpool_bin();
    argv[n++] = "store";
    argv[n++] = "--master";
    argv[n++] = master_addr;
    argv[n++] = "--segment-size";
    argv[n++] = "64MiB";
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    for (int i = 0; extra && extra[i] && n < MAX_ARGS - 1; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = spawn_argv(argv);
    if (pid < 0)
        return -1;
    s->pid = pid;
    uint64_t end = tp_now_ms() + START_WAIT_MS;
    while (tp_now_ms() < end) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "tp_store_start: store exited early (status %d)\n", decode_status(st));
            s->pid = 0;
            return -1;
        }
        if (tp_master_segments(master_addr) > before)
            return 0;
        tp_sleep_ms(20);
    }
    fprintf(stderr, "tp_store_start: no new segment at %s after %d ms\n", master_addr,
            START_WAIT_MS);
    tp_store_kill(s);
    return -1;
}

int tp_store_stop(tp_store *s)
{
    if (s->pid <= 0)
        return -1;
    kill(s->pid, SIGTERM);
    int rc = wait_bounded(s->pid, STOP_WAIT_MS);
    if (rc < 0) {
        fprintf(stderr, "tp_store_stop: pid %d did not stop in %d ms; killing it\n", (int)s->pid,
                STOP_WAIT_MS);
        kill(s->pid, SIGKILL);
        wait_bounded(s->pid, 5000);
    }
    s->pid = 0;
    return rc;
}

void tp_store_kill(tp_store *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        wait_bounded(s->pid, 5000);
    }
    s->pid = 0;
}

int tp_free_addr(char *out, size_t outlen)
{
    uint16_t port = 0;
    char err[256];
    int fd = kvp_net_listen("127.0.0.1:0", 1, &port, err, sizeof err);
    if (fd < 0)
        return -1;
    close(fd);
    snprintf(out, outlen, "127.0.0.1:%u", port);
    return 0;
}

int tp_sim_run(const char *addr, const char *tp, const char *duration, const char *const *extra,
               char *out, size_t outlen)
{
    const char *argv[40] = {tp_kvpool_bin(), "sim", "--master", addr, "--instances", "2",
                            "--tp", tp, "--duration", duration, "--users", "6", "--turns", "3",
                            "--system-prompt-tokens", "256", "--turn-tokens", "64",
                            "--reply-tokens", "32", "--json"};
    size_t n = 0;
    while (argv[n])
        n++;
    for (size_t i = 0; extra && extra[i] && n + 1 < sizeof argv / sizeof argv[0]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return tp_run_capture(argv, 1, out, outlen, 60000);
}

/* ---------------------------------------------------------------- etcd */

static const char *etcd_bin(void)
{
    const char *env = getenv("KVPOOL_ETCD");
    if (env && *env)
        return access(env, X_OK) == 0 ? env : NULL;
    static const char *const cands[] = {"/usr/bin/etcd", "/usr/local/bin/etcd", NULL};
    for (int i = 0; cands[i]; i++)
        if (access(cands[i], X_OK) == 0)
            return cands[i];
    return NULL;
}

/* A TCP connect to addr succeeds. */
static int addr_up(const char *addr)
{
    char err[128];
    int fd = kvp_net_connect(addr, 200, err, sizeof err);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

int tp_etcd_start(tp_etcd *e, char *why, size_t whylen)
{
    return tp_etcd_start_opts(e, NULL, why, whylen);
}

int tp_etcd_start_opts(tp_etcd *e, const tp_etcd_opts *o, char *why, size_t whylen)
{
    memset(e, 0, sizeof *e);
    const char *bin = etcd_bin();
    if (!bin) {
        snprintf(why, whylen, "no etcd binary (Debian etcd-server; scripts/install-deps)");
        return 1;
    }
    char peer[64], curl[96], purl[96], cluster[128], data[300], log[300];
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof e->dir, "%s/kvp-etcd-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(e->dir) || tp_free_addr(e->addr, sizeof e->addr) != 0 ||
        tp_free_addr(peer, sizeof peer) != 0) {
        snprintf(why, whylen, "etcd: no temp dir or port");
        return -1;
    }
    int tls = o && o->cert && o->key;
    snprintf(curl, sizeof curl, "%s://%s", tls ? "https" : "http", e->addr);
    snprintf(purl, sizeof purl, "http://%s", peer);
    snprintf(cluster, sizeof cluster, "kvp=%s", purl);
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(log, sizeof log, "%s/etcd.log", e->dir);
    const char *argv[40] = {bin, "--name", "kvp", "--data-dir", data, "--listen-client-urls",
                            curl, "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                            "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                            "--log-level", "error"};
    int n = 17;
    if (tls) {
        argv[n++] = "--cert-file";
        argv[n++] = o->cert;
        argv[n++] = "--key-file";
        argv[n++] = o->key;
    }
    for (int i = 0; o && o->extra && o->extra[i] && i < 8; i++)
        argv[n++] = o->extra[i];
    argv[n] = NULL;
    tp_master_opts mo = {.stderr_path = log};
    e->pid = spawn_argv_opts(argv, &mo);
    if (e->pid <= 0) {
        snprintf(why, whylen, "etcd: fork failed");
        return -1;
    }
    for (uint64_t end = tp_now_ms() + 15000; tp_now_ms() < end; tp_sleep_ms(50)) {
        int st;
        if (waitpid(e->pid, &st, WNOHANG) == e->pid) {
            e->pid = 0;
            snprintf(why, whylen, "etcd exited at start (log %s)", log);
            return -1;
        }
        if (addr_up(e->addr))
            return 0;
    }
    snprintf(why, whylen, "etcd did not listen on %s within 15 s", e->addr);
    tp_etcd_stop(e);
    return -1;
}

int tp_wait_exit(pid_t pid, unsigned ms) { return wait_bounded(pid, ms); }

void tp_etcd_pause(tp_etcd *e, int paused)
{
    if (e->pid > 0)
        kill(e->pid, paused ? SIGSTOP : SIGCONT);
}

void tp_etcd_stop(tp_etcd *e)
{
    if (e->pid > 0) {
        kill(e->pid, SIGCONT);
        kill(e->pid, SIGKILL);
        wait_bounded(e->pid, 5000);
    }
    e->pid = 0;
    if (e->dir[0])
        tp_rm_dir(e->dir);
    e->dir[0] = 0;
}

struct kvp_client *tp_client_open(const char *master_addr, const char *extra_json)
{
    char cfg[1024], err[512];
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"%s}",
             master_addr, extra_json ? extra_json : "");
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, err, sizeof err);
    if (rc)
        fprintf(stderr, "    kvp_client_open: %s (%s)\n", err, kvp_err_name(rc));
    return rc ? NULL : c;
}
