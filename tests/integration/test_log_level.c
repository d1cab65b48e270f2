/*
 * test_log_level.c -- where the log level comes from (common/log.h):
 * a client's configuration "log_level", $KVPOOL_LOG_LEVEL for the library
 * and the CLI (flag > environment > file > default), an invalid value, the
 * last explicit configuration winning in one process, and the sink hook the
 * Python extension uses.
 *
 * Every client runs in a forked child whose stderr is a temporary file, so
 * what it wrote is read back line by line; a real master (and for the CLI a
 * real `kvpool serve`) answers it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "harness.h"
#include "kvpool.h"
#include "kvpool_connector.h"
#include "proc.h"

static char out[1 << 18];

/* Lines of `text` whose level letter (after the "...Z " timestamp) is c. */
static int count_level(const char *text, char c)
{
    int n = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        /* "2026-12-02T06:15:48.419Z I master: ..." */
        if (len > 27 && p[4] == '-' && p[23] == 'Z' && p[24] == ' ' && p[25] == c && p[26] == ' ')
            n++;
        p += len + (nl ? 1 : 0);
    }
    return n;
}

/* Reads the whole file into out (NUL-terminated); 0 or -1. */
static int slurp(const char *path)
{
    REQUIRE(tp_slurp(path, out, sizeof out) >= 0);
    return 0;
}

/*
 * Runs this binary again as a child (child_main: mode, config) with
 * $KVPOOL_LOG_LEVEL = env (NULL: unset) and stderr written to a file; the
 * child's stderr ends up in out. A fresh exec, not a bare fork: the level
 * and the environment are read once per process. Returns the child's exit
 * status (0 = it succeeded) or -1.
 */
static int in_child(const char *env, const char *mode, const char *config)
{
    char path[] = "/tmp/kvp-loglevel-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        if (env)
            setenv(KVP_LOG_ENV, env, 1);
        else
            unsetenv(KVP_LOG_ENV);
        setenv("KVP_LOGTEST_CHILD", mode, 1);
        setenv("KVP_LOGTEST_CONFIG", config, 1);
        execl("/proc/self/exe", "test_log_level", (char *)NULL);
        _exit(127);
    }
    close(fd);
    REQUIRE(pid > 0);
    int st = 0;
    uint64_t end = tp_now_ms() + 60000;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && tp_now_ms() < end)
        tp_sleep_ms(20);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    int rc = slurp(path);
    unlink(path);
    REQUIRE(rc == 0);
    REQUIRE(w == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* One embedded client (it hosts a 64 MiB segment: the node logs INFO lines
 * while it starts and mounts): open, put, get, close. */
static int one_client(const char *config)
{
    kvp_client *c = NULL;
    char err[512] = "";
    int rc = kvp_client_open(config, &c, err, sizeof err);
    if (rc) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    char buf[16];
    rc = kvp_client_put(c, "log-level-key", "value", 5);
    int64_t got = kvp_client_get(c, "log-level-key", buf, sizeof buf);
    kvp_client_close(c);
    return rc == 0 && got == 5 ? 0 : -1;
}

static tp_master master;
static char cfg_plain[512], cfg_error[512], cfg_info[512], cfg_debug[512];
static void make_configs(const char *addr);

/* The child side of in_child: runs before the harness (a constructor) and
 * exits. "one": one client of $KVP_LOGTEST_CONFIG; "three": clients with
 * "log_level" error, none, info (of the master $KVP_LOGTEST_CONFIG names),
 * a marker line between them. */
__attribute__((constructor(200))) static void child_main(void)
{
    const char *mode = getenv("KVP_LOGTEST_CHILD"), *config = getenv("KVP_LOGTEST_CONFIG");
    if (!mode || !config)
        return;
    int rc = -1;
    if (strcmp(mode, "sched") == 0) {
        /* the scheduler half: store_config's log_level, nothing else read */
        kvp_conn_group g = {.kind = KVP_CONN_FULL_ATTENTION, .block_size = 16};
        kvp_conn_config cc;
        kvp_conn_config_default(&cc);
        cc.model = "/models/org/Test-Model";
        cc.groups = &g;
        cc.ngroups = 1;
        cc.enable_lookup = false;
        cc.role = KVP_CONN_CONSUMER;
        cc.store_config = config;
        kvp_conn_sched *s = NULL;
        char err[256] = "";
        int lv0 = kvp_log_get_level();
        rc = kvp_conn_sched_open(&cc, &s, err, sizeof err);
        fprintf(stderr, "=== sched open %d, level %s -> %s\n", rc, kvp_log_level_name(lv0),
                kvp_log_level_name(kvp_log_get_level()));
        kvp_conn_sched_close(s);
    } else if (strcmp(mode, "one") == 0) {
        rc = one_client(config);
    } else if (strcmp(mode, "three") == 0) {
        make_configs(config);
        rc = one_client(cfg_error);
        fprintf(stderr, "=== second\n");
        if (rc == 0)
            rc = one_client(cfg_plain);
        fprintf(stderr, "=== third\n");
        if (rc == 0)
            rc = one_client(cfg_info);
    }
    _exit(rc == 0 ? 0 : 1);
}
static void make_configs(const char *addr)
{
    const char *fmt = "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": "
                      "\"64MiB\"%s}";
    snprintf(cfg_plain, sizeof cfg_plain, fmt, addr, "");
    snprintf(cfg_error, sizeof cfg_error, fmt, addr, ", \"log_level\": \"error\"");
    snprintf(cfg_info, sizeof cfg_info, fmt, addr, ", \"log_level\": \"info\"");
    snprintf(cfg_debug, sizeof cfg_debug, fmt, addr, ", \"log_level\": \"DEBUG\"");
}

static int master_up(void)
{
    REQUIRE(tp_master_start(&master, NULL) == 0);
    make_configs(master.addr);
    return 0;
}

TEST(client_config_log_level_applies)
{
    if (master_up() != 0)
        return;
    /* control: without the key the node's INFO lines are written */
    CHECK_EQ(in_child(NULL, "one", cfg_plain), 0);
    CHECK(count_level(out, 'I') > 0);
    /* "log_level": "error": none */
    CHECK_EQ(in_child(NULL, "one", cfg_error), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    CHECK_EQ(count_level(out, 'D'), 0);
    if (count_level(out, 'I'))
        fprintf(stderr, "    stderr of the client:\n%s", out);
    /* "DEBUG" (any case) is a level too */
    CHECK_EQ(in_child(NULL, "one", cfg_debug), 0);
    CHECK(count_level(out, 'I') > 0);
    CHECK_EQ(tp_master_stop(&master), 0);
}

TEST(env_beats_client_config)
{
    if (master_up() != 0)
        return;
    /* $KVPOOL_LOG_LEVEL=error beats "log_level": "info" */
    CHECK_EQ(in_child("error", "one", cfg_info), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    /* ... and applies without any key */
    CHECK_EQ(in_child("ERROR", "one", cfg_plain), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    /* $KVPOOL_LOG_LEVEL=warn beats "log_level": "debug" */
    CHECK_EQ(in_child("warn", "one", cfg_debug), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    CHECK_EQ(count_level(out, 'D'), 0);
    /* empty = unset: the configuration's level */
    CHECK_EQ(in_child("", "one", cfg_error), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    CHECK_EQ(tp_master_stop(&master), 0);
}

TEST(invalid_env_is_one_warning_then_the_default)
{
    if (master_up() != 0)
        return;
    CHECK_EQ(in_child("loud\x01", "one", cfg_plain), 0);
    CHECK_EQ(count_level(out, 'W'), 1);
    CHECK(strstr(out, "$KVPOOL_LOG_LEVEL=\"loud?\" is not a log level") != NULL);
    CHECK(strstr(out, "(allowed: debug, info, warn, error, off); ignored") != NULL);
    CHECK(count_level(out, 'I') > 0); /* the default, info */
    /* ignored: the configuration's own level still applies */
    CHECK_EQ(in_child("loud", "one", cfg_error), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    CHECK_EQ(tp_master_stop(&master), 0);
}

TEST(last_explicit_configuration_wins)
{
    if (master_up() != 0)
        return;
    CHECK_EQ(in_child(NULL, "three", master.addr), 0);
    char *second = strstr(out, "=== second\n"), *third = strstr(out, "=== third\n");
    CHECK(second != NULL && third != NULL && second < third);
    if (second && third) {
        *second = 0;
        *third = 0;
        CHECK_EQ(count_level(out, 'I'), 0);                 /* error */
        CHECK_EQ(count_level(second + 1, 'I'), 0);          /* no key: left alone */
        CHECK(count_level(third + 1, 'I') > 0);             /* info */
    }
    CHECK_EQ(tp_master_stop(&master), 0);
}

TEST(scheduler_store_config_log_level)
{
    CHECK_EQ(in_child(NULL, "sched", "{\"log_level\": \"error\"}"), 0);
    CHECK(strstr(out, "=== sched open 0, level info -> error\n") != NULL);
    /* the environment beats it */
    CHECK_EQ(in_child("warn", "sched", "{\"log_level\": \"error\"}"), 0);
    CHECK(strstr(out, "=== sched open 0, level warn -> warn\n") != NULL);
    /* no key: left alone */
    CHECK_EQ(in_child(NULL, "sched", "{\"tenant\": \"t\"}"), 0);
    CHECK(strstr(out, "=== sched open 0, level info -> info\n") != NULL);
    /* a configuration that does not load: one warning, the open succeeds */
    CHECK_EQ(in_child(NULL, "sched", "{\"log_level\": \"loud\"}"), 0);
    CHECK(strstr(out, "=== sched open 0, level info -> info\n") != NULL);
    CHECK_EQ(count_level(out, 'W'), 1);
    CHECK(strstr(out, "connector: store_config does not load (the worker half reports why)") !=
          NULL);
    CHECK(strstr(out, "loud") == NULL); /* values are not logged (a token could be one) */
    if (!strstr(out, "connector: store_config"))
        fprintf(stderr, "    stderr of the scheduler:\n%s", out);
}

/* ------------------------------------------------------------------ CLI */

/* Runs `kvpool serve ARGS` with $KVPOOL_LOG_LEVEL = env until it reports
 * its port, then stops it with SIGTERM; its stderr lands in out. The exit
 * status, or -1 (never reported a port within 20 s). */
static int serve_once(const char *env, const char *const *args)
{
    char dir[] = "/tmp/kvp-loglevel-serve-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char pf[128], errf[128];
    snprintf(pf, sizeof pf, "%s/port", dir);
    snprintf(errf, sizeof errf, "%s/stderr", dir);
    const char *argv[16] = {tp_kvpool_bin(), "serve", "--listen", "127.0.0.1:0", "--port-file",
                            pf, "--segment-size", "16MiB"};
    int n = 8;
    for (int i = 0; args && args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 2);
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        if (env)
            setenv(KVP_LOG_ENV, env, 1);
        else
            unsetenv(KVP_LOG_ENV);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    REQUIRE(pid > 0);
    int st = 0, exited = 0;
    uint64_t end = tp_now_ms() + 20000;
    struct stat sb;
    while (tp_now_ms() < end) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            exited = 1;
            break;
        }
        if (stat(pf, &sb) == 0 && sb.st_size > 0)
            break;
        tp_sleep_ms(20);
    }
    int ported = !exited && tp_now_ms() < end;
    if (!exited) {
        if (ported)
            tp_sleep_ms(300); /* the node mounts its segment meanwhile */
        kill(pid, ported ? SIGTERM : SIGKILL);
        waitpid(pid, &st, 0);
    }
    int rc = slurp(errf);
    tp_rm_dir(dir);
    REQUIRE(rc == 0);
    if (!exited && !ported)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(cli_env_sets_the_level)
{
    /* control: by default serve writes INFO lines ("listening on ...") */
    CHECK_EQ(serve_once(NULL, NULL), 0);
    CHECK(count_level(out, 'I') > 0);
    CHECK_EQ(count_level(out, 'D'), 0);
    /* $KVPOOL_LOG_LEVEL=error: none */
    CHECK_EQ(serve_once("error", NULL), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    if (count_level(out, 'I'))
        fprintf(stderr, "    stderr of kvpool serve:\n%s", out);
    /* debug: the master's DEBUG lines (a node's connection) */
    CHECK_EQ(serve_once("debug", NULL), 0);
    CHECK(count_level(out, 'D') > 0);
    CHECK(count_level(out, 'I') > 0);
}

TEST(cli_flag_beats_env_beats_file)
{
    char dir[] = "/tmp/kvp-loglevel-cfg-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/c.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("{\"log_level\": \"info\"}\n", f);
    fclose(f);
    /* the file says info, the environment error: error */
    CHECK_EQ(serve_once("error", (const char *const[]){"--config", path, NULL}), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    /* a flag beats the environment */
    CHECK_EQ(serve_once("error", (const char *const[]){"--log-level", "info", NULL}), 0);
    CHECK(count_level(out, 'I') > 0);
    /* the file alone */
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"log_level\": \"error\"}\n", f);
        fclose(f);
    }
    CHECK_EQ(serve_once(NULL, (const char *const[]){"--config", path, NULL}), 0);
    CHECK_EQ(count_level(out, 'I'), 0);
    tp_rm_dir(dir);
}

TEST(cli_invalid_env_is_a_usage_error)
{
    /* serve refuses to start, status 2, naming the variable and the choices */
    CHECK_EQ(serve_once("loud", NULL), 2);
    CHECK(strstr(out, "kvpool serve: $KVPOOL_LOG_LEVEL: value \"loud\" is not a log level "
                      "(allowed: debug, info, warn, error, off)") != NULL);
    CHECK_EQ(count_level(out, 'I'), 0);
    /* so does put (before it reads its input or connects) */
    setenv(KVP_LOG_ENV, "verbose", 1);
    int rc = tp_run_capture((const char *const[]){tp_kvpool_bin(), "put", "k", "/dev/null",
                                                  "--master", "127.0.0.1:1", NULL},
                            2, out, sizeof out, 20000);
    unsetenv(KVP_LOG_ENV);
    CHECK_EQ(rc, 2);
    CHECK(strstr(out, "kvpool put: $KVPOOL_LOG_LEVEL: value \"verbose\" is not a log level") !=
          NULL);
    /* --help still works */
    setenv(KVP_LOG_ENV, "verbose", 1);
    rc = tp_run_capture((const char *const[]){tp_kvpool_bin(), "put", "--help", NULL}, 1, out,
                        sizeof out, 20000);
    unsetenv(KVP_LOG_ENV);
    CHECK_EQ(rc, 0);
}

/* ----------------------------------------------------------------- sink */

#define SINK_THREADS 4
#define SINK_LINES 2000

struct sink_state {
    pthread_mutex_t mu;
    int n[KVP_LOG_OFF];
    int bad;
    char last[128];
};

static void sink_fn(void *ctx, const kvp_log_record *r)
{
    struct sink_state *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (r->level >= KVP_LOG_DEBUG && r->level < KVP_LOG_OFF)
        s->n[r->level]++;
    /* the record's parts agree with the line */
    if (r->line_len < r->msg_len + 2 || r->line[r->line_len - 1] != '\n' ||
        r->msg + r->msg_len != r->line + r->line_len - 1 || strcmp(r->mod, "sinktest") != 0 ||
        r->time.tv_sec == 0)
        s->bad++;
    snprintf(s->last, sizeof s->last, "%.*s", (int)r->msg_len, r->msg);
    pthread_mutex_unlock(&s->mu);
}

static void *sink_writer(void *arg)
{
    for (int i = 0; i < SINK_LINES; i++) {
        KVP_INFO("sinktest", "line %d of thread %ld", i, (long)(intptr_t)arg);
        KVP_DEBUG("sinktest", "debug %d", i);
        if (i % 100 == 0) /* the level moves under the writers' feet */
            kvp_log_set_configured(i % 200 ? KVP_LOG_INFO : KVP_LOG_DEBUG);
    }
    return NULL;
}

TEST(sink_gets_every_line_from_every_thread)
{
    static struct sink_state st = {.mu = PTHREAD_MUTEX_INITIALIZER};
    static const kvp_log_sink sink = {sink_fn, &st};
    int saved = kvp_log_get_level();
    kvp_log_set_level(KVP_LOG_INFO);
    kvp_log_set_sink(&sink);
    pthread_t t[SINK_THREADS];
    for (long i = 0; i < SINK_THREADS; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, sink_writer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < SINK_THREADS; i++)
        pthread_join(t[i], NULL);
    kvp_log_set_level(KVP_LOG_WARN);
    KVP_INFO("sinktest", "filtered before the sink");
    KVP_ERROR("sinktest", "the last %s", "one");
    kvp_log_set_sink(NULL);
    kvp_log_set_level(saved);
    pthread_mutex_lock(&st.mu);
    CHECK_EQ(st.n[KVP_LOG_INFO], SINK_THREADS * SINK_LINES);
    CHECK_EQ(st.n[KVP_LOG_ERROR], 1);
    CHECK_EQ(st.bad, 0);
    CHECK(strcmp(st.last, "the last one") == 0);
    pthread_mutex_unlock(&st.mu);
}

TEST(level_names_round_trip)
{
    for (int lv = KVP_LOG_DEBUG; lv <= KVP_LOG_OFF; lv++)
        CHECK_EQ(kvp_log_level_parse(kvp_log_level_name(lv)), lv);
    CHECK(strcmp(kvp_log_level_name(42), "?") == 0);
}
