/*
 * proc.h -- test support: run `kvpool master` as a real process.
 *
 *   tp_master m;
 *   if (tp_master_start(&m, (const char *[]){"--client-ttl", "2s", NULL}) != 0) ...
 *   ... connect to m.addr ("127.0.0.1:PORT") ...
 *   CHECK_EQ(tp_master_stop(&m), 0);   // SIGTERM, bounded wait, exit status
 *
 * The binary is $KVPOOL_BIN (default build/asan/kvpool). The master listens
 * on 127.0.0.1:0 and reports its port through --port-file in a private temp
 * dir; start waits (bounded) for that file. Its stderr is inherited, so
 * sanitizer reports show up in the test's output.
 */
#ifndef KVP_TEST_PROC_H
#define KVP_TEST_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct tp_master {
    pid_t pid;         /* 0 when not running */
    uint16_t port;
    char addr[64];     /* "127.0.0.1:PORT" */
    char dir[256];     /* temp dir holding the port file */
} tp_master;

/* The kvpool binary under test: $KVPOOL_BIN or build/asan/kvpool. */
const char *tp_kvpool_bin(void);

/* Starts `kvpool master --listen 127.0.0.1:0 --port-file F --log-level error
 * <extra...>` (extra: NULL-terminated, may be NULL; later flags win) and
 * waits up to 10 s for the port. 0, or -1 (the child is killed). */
int tp_master_start(tp_master *m, const char *const *extra);

/* tp_master_start with a descriptor limit and/or stderr sent to a file
 * (the port file still counts against nofile). o may be NULL. */
typedef struct tp_master_opts {
    unsigned nofile;         /* RLIMIT_NOFILE (soft and hard) of the master; 0 = inherited */
    const char *stderr_path; /* truncated and written instead of inheriting stderr; NULL */
} tp_master_opts;
int tp_master_start_opts(tp_master *m, const char *const *extra, const tp_master_opts *o);

/* SIGTERM, then waits up to 15 s. Returns the exit status (0 = clean
 * shutdown), 128 + signal when it was killed by one, or -1 when it did not
 * stop in time (it is then killed with SIGKILL). */
int tp_master_stop(tp_master *m);

/* SIGKILL and reap (a crash, as far as clients can tell). */
void tp_master_kill(tp_master *m);

/*
 * Starts `kvpool store --log-level error <args...>` (args NULL-terminated)
 * and returns at once; p->pid is set, p->port / addr stay empty (the
 * store's port is learnt from the master). tp_master_stop / tp_master_kill /
 * tp_master_alive work on it. 0 or -1.
 */
int tp_store_spawn(tp_master *p, const char *const *args);

/* Still running? (reaps it when it exited; *status gets what stop returns) */
int tp_master_alive(tp_master *m, int *status);

/* Waits up to ms for process pid to be stopped, every thread of it (SIGSTOP
 * delivered: state 'T' in /proc/PID/task/TID/stat for each; kill() returns
 * before that, and on a loaded machine a thread may go on for milliseconds).
 * 0, or -1 on timeout. */
int tp_proc_wait_stopped(pid_t pid, unsigned ms);
/* Bytes waiting unread in the receive queues of pid's TCP sockets
 * (/proc/PID/fd against /proc/net/tcp{,6}): what a frozen process has been
 * sent and not read. -1 when /proc cannot be read. */
long tp_proc_rx_queued(pid_t pid);

/*
 * Storage nodes: `kvpool store --master ADDR --segment-size 64MiB
 * --listen 127.0.0.1:0 <extra...>` (extra: NULL-terminated, may be NULL;
 * later flags win, e.g. {"--segment-size", "32MiB", NULL}).
 *
 *   tp_store s;
 *   if (tp_store_start(&s, m.addr, NULL) != 0) ...
 *   tp_store_kill(&s);                 // kill -9: a crashed node
 *
 * start returns once the master's STATS counts one more mounted segment
 * than before the start (bounded: 10 s), so the node is usable; start
 * nodes one at a time. Its stderr is inherited.
 */
typedef struct tp_store {
    pid_t pid; /* 0 when not running */
} tp_store;

/* 0, or -1 (the child, if any, is killed). */
int tp_store_start(tp_store *s, const char *master_addr, const char *const *extra);
/* SIGTERM, bounded wait; same return as tp_master_stop. */
int tp_store_stop(tp_store *s);
/* SIGKILL and reap. */
void tp_store_kill(tp_store *s);

/* Mounted segments according to the master's STATS, or -1 when the master
 * cannot be asked (bounded: 2 s). */
int tp_master_segments(const char *master_addr);
/* The segments the master's STATS lists (their number, or -1 when the
 * master cannot be asked; bounded: 2 s), with the first one's id in *id and
 * name in name[0..len) when there is one (either may be NULL). */
int tp_master_seg_list(const char *master_addr, uint64_t *id, char *name, size_t len);
/* How many sockets named like a storage node's (kvpool-seg-*) are in dir,
 * or -1 when it cannot be read. */
int tp_node_socks(const char *dir);

/*
 * Runs argv (argv[0] = path) with stdin from /dev/null, capturing stdout
 * and/or stderr (which: 1 = stdout, 2 = stderr, 3 = both) into out
 * (NUL-terminated, truncated to outlen). Returns the exit status, 128 + signal,
 * or -1 on error / timeout (the child is killed).
 */
int tp_run_capture(const char *const *argv, int which, char *out, size_t outlen, int timeout_ms);

/* Runs `kvpool sim --json` on the master at addr with the tests' small
 * workload (2 instances, TP tp, 6 users x 3 turns, 256 system-prompt
 * tokens) plus extra flags (NULL-terminated, may be NULL); stdout into
 * out. Returns tp_run_capture's status. */
int tp_sim_run(const char *addr, const char *tp, const char *duration, const char *const *extra,
               char *out, size_t outlen);

/* "127.0.0.1:PORT" with a port nobody listened on a moment ago (bound to
 * port 0, then closed), for processes that must be started on a known
 * address. 0 or -1. */
int tp_free_addr(char *out, size_t outlen);

/* Monotonic milliseconds and a sleep, for tests. */
/* A standalone-store client of master_addr (kvp_client_open); extra_json is
 * spliced into the configuration object (", \"key\": value ..."; NULL =
 * none). NULL on failure, with kvp_client_open's message on stderr. */
struct kvp_client *tp_client_open(const char *master_addr, const char *extra_json);

uint64_t tp_now_ms(void);
void tp_sleep_ms(unsigned ms);
/* Reads the whole file (at most cap - 1 bytes) into out, NUL-terminated:
 * the bytes read, or -1 when it cannot be opened. */
long tp_slurp(const char *path, char *out, size_t cap);
/* Removes dir and everything under it (a test's temporary directory; links
 * are removed, not followed). Quiet when it does not exist. */
void tp_rm_dir(const char *dir);
/* Deterministic bytes for (seed, len): what a test key's value must be. */
void tp_fill(uint8_t *p, size_t len, uint64_t seed);

/*
 * A real etcd (Debian etcd-server) on loopback: free client and peer ports,
 * a private data dir, stderr to a log in it. tp_etcd_start returns 0, 1
 * when no etcd binary is installed (why says so: the caller skips), -1 when
 * it would not come up. tp_etcd_stop kills it and removes the dir.
 */
typedef struct tp_etcd {
    pid_t pid;
    char addr[64]; /* "127.0.0.1:PORT" of its client URL */
    char dir[256];
} tp_etcd;
int tp_etcd_start(tp_etcd *e, char *why, size_t whylen);
/* tp_etcd_start with TLS (cert and key: PEM files; the client URL is then
 * https://) and/or extra etcd flags (NULL-terminated, at most 8). o may be
 * NULL. */
typedef struct tp_etcd_opts {
    const char *cert, *key;
    const char *const *extra;
} tp_etcd_opts;
int tp_etcd_start_opts(tp_etcd *e, const tp_etcd_opts *o, char *why, size_t whylen);
void tp_etcd_stop(tp_etcd *e);
/* Waits up to ms for child pid to exit: its status (exit code, 128 + signal),
 * or -1 when it is still running then. */
int tp_wait_exit(pid_t pid, unsigned ms);
/* SIGSTOP / SIGCONT: an etcd that hangs rather than dies. */
void tp_etcd_pause(tp_etcd *e, int paused);

#endif
