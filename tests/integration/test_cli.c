/*
 * test_cli.c -- the `kvpool` command line, run as a real program: flags and
 * positional arguments in any order, "--", "--name=value", HOST:PORT ports
 * out of range, missing, empty and malformed values, and messages that name
 * the flag once. Every usage error must exit with status 2 (never a crash:
 * the binary is the ASan build) and say what is allowed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "proc.h"

static char out[65536];

/* Runs `kvpool ARGS...` (NULL-terminated), capturing which (1 stdout, 2
 * stderr, 3 both) into out; returns the exit status. */
#define KVPOOL(which, ...)                                                     \
    tp_run_capture((const char *const[]){tp_kvpool_bin(), __VA_ARGS__, NULL}, (which), out, \
                   sizeof out, 20000)

/* A master and a storage node for the commands that need a pool. */
typedef struct pool {
    tp_master m;
    tp_store st;
    char dir[64];
} pool;

static int pool_up(pool *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/kvp-cli-XXXXXX");
    REQUIRE(mkdtemp(p->dir) != NULL);
    REQUIRE(tp_master_start(&p->m, NULL) == 0);
    REQUIRE(tp_store_start(&p->st, p->m.addr,
                           (const char *const[]){"--segment-size", "16MiB", NULL}) == 0);
    return 0;
}

static void pool_down(pool *p)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", p->dir);
    CHECK_EQ(system(cmd), 0);
    CHECK_EQ(tp_store_stop(&p->st), 0);
    CHECK_EQ(tp_master_stop(&p->m), 0);
}

/* Writes text into DIR/name; path gets the file's path. */
static int write_file(const pool *p, const char *name, const char *text, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", p->dir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    REQUIRE(fputs(text, f) >= 0);
    REQUIRE(fclose(f) == 0);
    return 0;
}

/* put and get with the flags before, between and after the positionals,
 * "--master=ADDR", and "--" before a key that starts with '-'. */
TEST(flags_and_arguments_in_any_order)
{
    pool p;
    CHECK_EQ(pool_up(&p), 0);
    const char *m = p.m.addr;
    char eq[96], f1[128], f2[128], f3[128];
    snprintf(eq, sizeof eq, "--master=%s", m);
    CHECK_EQ(write_file(&p, "v1", "one", f1, sizeof f1), 0);
    CHECK_EQ(write_file(&p, "v2", "two", f2, sizeof f2), 0);
    CHECK_EQ(write_file(&p, "v3", "three", f3, sizeof f3), 0);

    /* flag first: the order once refused */
    CHECK_EQ(KVPOOL(2, "put", "--master", m, "k1", f1), 0);
    CHECK_EQ(KVPOOL(2, "put", "k2", "--master", m, f2), 0); /* between */
    CHECK_EQ(KVPOOL(2, "put", "--", "-k3", f3, eq), 2);     /* after "--": 3 positionals */
    CHECK(strstr(out, "expected KEY [FILE], got 3 arguments") != NULL);
    CHECK_EQ(KVPOOL(2, "put", eq, "--", "-k3", f3), 0);
    CHECK_EQ(KVPOOL(1, "get", "k1", "--master", m), 0);
    CHECK(strcmp(out, "one") == 0);
    CHECK_EQ(KVPOOL(1, "get", eq, "k2"), 0);
    CHECK(strcmp(out, "two") == 0);
    CHECK_EQ(KVPOOL(1, "get", "--master", m, "--", "-k3"), 0);
    CHECK(strcmp(out, "three") == 0);
    /* without "--", "-k3" is an unknown flag, and the message says how */
    CHECK_EQ(KVPOOL(2, "get", "--master", m, "-k3"), 2);
    CHECK(strstr(out, "unknown flag \"-k3\"") != NULL && strstr(out, "\"--\"") != NULL);
    /* several keys with flags among them; "--help" after "--" is a key */
    CHECK_EQ(KVPOOL(1, "exist", "k1", "--master", m, "k2", "--", "-k3", "--help"), 1);
    CHECK(strcmp(out, "k1: yes\nk2: yes\n-k3: yes\n--help: no\n") == 0);
    CHECK_EQ(KVPOOL(2, "rm", "--force", "--master", m, "--", "-k3"), 0);
    CHECK_EQ(KVPOOL(1, "exist", eq, "--", "-k3"), 1);
    CHECK(strcmp(out, "-k3: no\n") == 0);
    /* --help wins wherever it is (before "--") */
    CHECK_EQ(KVPOOL(1, "put", "k9", "--master", m, "--help"), 0);
    CHECK(strstr(out, "usage: kvpool put") != NULL);
    pool_down(&p);
}

/* Every port outside the allowed range is refused before any connection,
 * with a message that names the flag, the value and the range. */
TEST(port_out_of_range_names_the_range)
{
    static const char *const bad[] = {"0", "65536", "99999", "-1", "abc", "", "+80", " 80",
                                      "18446744073709551617"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char addr[64], shown[80];
        snprintf(addr, sizeof addr, "127.0.0.1:%s", bad[i]);
        snprintf(shown, sizeof shown, "value \"%s\"", addr);
        CHECK_EQ(KVPOOL(2, "put", "key", "--master", addr), 2);
        CHECK(strstr(out, "kvpool put: flag --master: ") == out);
        CHECK(strstr(out, shown) != NULL);
        CHECK(strstr(out, "(allowed: HOST:PORT with a port from 1 to 65535)") != NULL);
        CHECK_EQ(KVPOOL(2, "stat", "--master", addr), 2);
        CHECK(strstr(out, "port from 1 to 65535") != NULL);
        CHECK_EQ(KVPOOL(2, "sim", "--master", addr), 2);
        CHECK(strstr(out, "port from 1 to 65535") != NULL);
    }
    CHECK_EQ(KVPOOL(2, "get", "key", "--master=127.0.0.1:0"), 2);
    CHECK(strcmp(out, "kvpool get: flag --master: value \"127.0.0.1:0\" has port 0, out of range "
                      "(allowed: HOST:PORT with a port from 1 to 65535)\n") == 0);
    /* the Mooncake name of the same key, and the environment, too */
    CHECK_EQ(KVPOOL(2, "stat", "--master-server-address", "127.0.0.1:65536"), 2);
    CHECK(strstr(out, "flag --master-server-address: value \"127.0.0.1:65536\"") != NULL);
    setenv("KVPOOL_MASTER", "127.0.0.1:0", 1);
    int rc = KVPOOL(2, "stat");
    unsetenv("KVPOOL_MASTER");
    CHECK_EQ(rc, 2);
    CHECK(strstr(out, "$KVPOOL_MASTER: value \"127.0.0.1:0\"") != NULL);
    /* no port, no host */
    CHECK_EQ(KVPOOL(2, "stat", "--master", "localhost"), 2);
    CHECK(strstr(out, "has no port") != NULL);
    CHECK_EQ(KVPOOL(2, "stat", "--master", ":50051"), 2);
    CHECK(strstr(out, "has no host") != NULL);
    /* listening: port 0 means any free port (documented), 65536 is refused */
    CHECK_EQ(KVPOOL(2, "master", "--listen", "127.0.0.1:65536"), 2);
    CHECK(strstr(out, "flag --listen: value \"127.0.0.1:65536\" has port 65536, out of range "
                      "(allowed: HOST:PORT with a port from 0 to 65535, 0 = any free port)") !=
          NULL);
    CHECK_EQ(KVPOOL(2, "store", "--listen", "h:99999"), 2);
    CHECK(strstr(out, "0 to 65535") != NULL);
    CHECK_EQ(KVPOOL(2, "serve", "--segment-listen", "h:-1"), 2);
    CHECK(strstr(out, "0 to 65535") != NULL);
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0); /* --listen 127.0.0.1:0 */
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* Missing, empty and malformed values, stray arguments: one message each,
 * exit status 2, never a crash. */
TEST(missing_empty_and_malformed_values)
{
    CHECK_EQ(KVPOOL(2, "put", "key", "--master"), 2);
    CHECK(strcmp(out, "kvpool put: flag --master needs a value (--master VALUE or "
                      "--master=VALUE)\n") == 0);
    CHECK_EQ(KVPOOL(2, "sim", "--duration"), 2);
    CHECK(strstr(out, "flag --duration needs a value") != NULL);
    CHECK_EQ(KVPOOL(2, "master", "--config"), 2);
    CHECK(strstr(out, "flag --config needs a value") != NULL);
    CHECK_EQ(KVPOOL(2, "stat", "--master="), 2);
    CHECK(strstr(out, "flag --master: value \"\" is empty") != NULL);
    CHECK_EQ(KVPOOL(2, "reset", "--yes", "--tenant="), 2);
    CHECK(strstr(out, "flag --tenant: value \"\" is empty") != NULL);
    /* a boolean takes a boolean word only (test_cli_contract: the words) */
    CHECK_EQ(KVPOOL(2, "stat", "--json=2"), 2);
    CHECK(strstr(out, "flag --json: value \"2\" is not a boolean") != NULL);
    CHECK_EQ(KVPOOL(2, "sim", "--mla=yess"), 2);
    CHECK(strstr(out, "flag --mla: value \"yess\" is not a boolean") != NULL);
    /* numbers: trailing junk, a sign, overflow, out of range */
    CHECK_EQ(KVPOOL(2, "store", "--io-threads", "3x"), 2);
    CHECK(strstr(out, "flag --io-threads: value \"3x\" is not a whole number from 1 to 256") !=
          NULL);
    CHECK_EQ(KVPOOL(2, "sim", "--users", "-5"), 2);
    CHECK(strstr(out, "flag --users: value \"-5\"") != NULL);
    CHECK_EQ(KVPOOL(2, "sim", "--seed", "18446744073709551616"), 2);
    CHECK(strstr(out, "flag --seed") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "master", "--objects", "10k"), 2);
    CHECK(strstr(out, "kvpool bench master: flag --objects: value \"10k\"") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "store", "--rounds", "1001"), 2);
    CHECK(strstr(out, "kvpool bench store: flag --rounds") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "store", "--contend", "65"), 2);
    CHECK(strstr(out, "kvpool bench store: flag --contend: value \"65\"") != NULL);
    CHECK_EQ(KVPOOL(2, "stat", "--watch", "nan"), 2);
    CHECK(strstr(out, "flag --watch: value \"nan\" is not a number of seconds") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "sim", "--duration", "1e9"), 2);
    CHECK(strstr(out, "flag --duration") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "ha", "--failovers", "11"), 2);
    CHECK(strstr(out, "kvpool bench ha: flag --failovers: value \"11\" is not a whole number "
                      "from 0 to 10") != NULL);
    CHECK_EQ(KVPOOL(2, "serve", "--segment-size", "12 parsecs"), 2);
    CHECK(strstr(out, "flag --segment-size: value \"12 parsecs\" is not a size") != NULL);
    /* positionals where a command takes none; wrong counts */
    CHECK_EQ(KVPOOL(2, "stat", "extra"), 2);
    CHECK(strstr(out, "kvpool stat: unexpected argument \"extra\" (this command takes only "
                      "flags; see kvpool stat --help)") != NULL);
    CHECK_EQ(KVPOOL(2, "sim", "foo"), 2);
    CHECK(strcmp(out, "kvpool sim: unexpected argument \"foo\" (this command takes only flags; "
                      "see kvpool sim --help)\n") == 0);
    CHECK_EQ(KVPOOL(2, "bench", "connector", "x"), 2);
    CHECK(strstr(out, "unexpected argument \"x\"") != NULL);
    CHECK_EQ(KVPOOL(2, "rm"), 2);
    CHECK(strstr(out, "expected KEY..., got 0 arguments") != NULL);
    CHECK_EQ(KVPOOL(2, "put", ""), 2);
    CHECK(strstr(out, "key \"\" (0 bytes) is not allowed (allowed: 1 to ") != NULL);
    /* a long key and control bytes: cut and escaped in the message */
    char big[70000];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    CHECK_EQ(KVPOOL(2, "get", big), 2);
    CHECK(strstr(out, "...\" (69999 bytes) is not allowed") != NULL && strlen(out) < 300);
    CHECK_EQ(KVPOOL(2, "stat", "--master", "a\x01\x1b[2J:1x"), 2);
    CHECK(strstr(out, "\"a\\x01\\x1b[2J:1x\" has a port that is not a number") != NULL);
    /* an unknown flag, in every command */
    CHECK_EQ(KVPOOL(2, "sim", "--bogus", "1"), 2);
    CHECK(strstr(out, "unknown flag --bogus") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "sim", "--bogus"), 2);
    CHECK(strstr(out, "unknown flag --bogus") != NULL);
    CHECK_EQ(KVPOOL(2, "exist", "k", "--lease-tll", "5s"), 2);
    CHECK(strstr(out, "unknown flag --lease-tll (did you mean --lease-ttl?)") != NULL);
}

/* A configuration flag's error names the flag once: the exact text (it read
 * 'flag --lease-ttl: flag: key "lease-ttl": value ...' before). */
TEST(error_names_the_flag_once)
{
    CHECK_EQ(KVPOOL(2, "master", "--lease-ttl", "5x"), 2);
    CHECK(strcmp(out, "kvpool master: flag --lease-ttl: value \"5x\" is not a duration (allowed: "
                      "a number of milliseconds or a string like \"250ms\", \"5s\", \"1m\", "
                      "\"2h\", from 1ms to 720h)\n") == 0);
    CHECK_EQ(KVPOOL(2, "put", "k", "--rpc-timeout=forever"), 2);
    CHECK(strstr(out, "kvpool put: flag --rpc-timeout: value \"forever\"") == out);
    CHECK(strstr(out, "flag: ") == NULL && strstr(out, "key \"") == NULL);
    CHECK_EQ(KVPOOL(2, "store", "--no-such-key", "1"), 2);
    CHECK(strstr(out, "kvpool store: unknown flag --no-such-key (") == out);
    CHECK(strstr(out, "flag: ") == NULL);
}

/* `kvpool sim` and the benchmarks use the same parser as everything else. */
TEST(sim_flags_like_every_command)
{
    CHECK_EQ(KVPOOL(2, "sim", "--users=x"), 2);
    CHECK(strstr(out, "kvpool sim: flag --users: value \"x\" is not a whole number from 1 to "
                      "100000") != NULL);
    CHECK_EQ(KVPOOL(2, "sim", "--verify=some"), 2);
    CHECK(strstr(out, "flag --verify: value \"some\"") != NULL && strstr(out, "full") != NULL);
    CHECK_EQ(KVPOOL(2, "sim", "--", "--users"), 2);
    CHECK(strstr(out, "unexpected argument \"--users\"") != NULL);
    setenv("KVPOOL_MASTER", "127.0.0.1:99999", 1);
    int rc = KVPOOL(2, "sim");
    unsetenv("KVPOOL_MASTER");
    CHECK_EQ(rc, 2);
    CHECK(strstr(out, "kvpool sim: $KVPOOL_MASTER: value \"127.0.0.1:99999\" has port 99999") ==
          out);
    CHECK_EQ(KVPOOL(1, "sim", "--users", "3", "--help"), 0);
    CHECK(strstr(out, "usage: kvpool sim") != NULL);
    CHECK_EQ(KVPOOL(1, "bench", "connector", "--help"), 0);
    CHECK(strstr(out, "usage: kvpool bench connector") != NULL);
    CHECK_EQ(KVPOOL(1, "bench", "ha", "--help"), 0);
    CHECK(strstr(out, "usage: kvpool bench ha") != NULL);
    CHECK_EQ(KVPOOL(2, "bench", "bogus"), 2); /* the list names every benchmark */
    CHECK(strstr(out, "usage: kvpool bench master|store|connector|sim|gpu|disk|ha") != NULL);
}
