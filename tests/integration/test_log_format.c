/*
 * test_log_format.c -- `--log-format` / $KVPOOL_LOG_FORMAT on a real
 * `kvpool master`: JSON lines (every line one object, the peer of a
 * connection that sent garbage named in "peer"), the text form's
 * "peer=HOST:PORT", and an invalid $KVPOOL_LOG_FORMAT refused with exit
 * status 2.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "harness.h"
#include "net/net.h"
#include "proc.h"

static char out[1 << 16];

static int slurp(const char *path)
{
    REQUIRE(tp_slurp(path, out, sizeof out) >= 0);
    return 0;
}

/* Connects to the master and sends 24 bytes that are no frame header: the
 * master answers, logs one WARN about it, and closes. Our local address
 * ("127.0.0.1:PORT", as the master saw it) goes into peer. */
static int send_garbage(const char *addr, char *peer, size_t peerlen)
{
    char err[KVP_NET_ERRLEN];
    int fd = kvp_net_connect(addr, 2000, err, sizeof err);
    REQUIRE(fd >= 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    REQUIRE(getsockname(fd, (struct sockaddr *)&ss, &sl) == 0);
    kvp_net_peer_text(&ss, peer, peerlen);
    static const char junk[24] = "GET / HTTP/1.1\r\n\r\n\"\\\x01";
    REQUIRE(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    char b[256];
    while (read(fd, b, sizeof b) > 0) /* until the master closes */
        ;
    close(fd);
    return 0;
}

/* Runs a master with the flags, sends it garbage, stops it; its stderr in
 * out, the garbage connection's address in peer. */
static int run_master(const char *const *flags, char *peer, size_t peerlen)
{
    char path[] = "/tmp/kvp-logfmt-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    tp_master m;
    tp_master_opts o = {.stderr_path = path};
    REQUIRE(tp_master_start_opts(&m, flags, &o) == 0);
    int g = send_garbage(m.addr, peer, peerlen);
    int st = tp_master_stop(&m);
    int rc = slurp(path);
    unlink(path);
    REQUIRE(g == 0 && st == 0 && rc == 0);
    return 0;
}

TEST(json_lines_with_the_peer)
{
    char peer[KVP_NET_PEERLEN];
    unsetenv(KVP_LOG_FORMAT_ENV);
    CHECK(run_master((const char *[]){"--log-level", "info", "--log-format", "json", NULL}, peer,
                     sizeof peer) == 0);
    int lines = 0, listening = 0, with_peer = 0;
    char want[128];
    snprintf(want, sizeof want, "\"component\":\"master\",\"peer\":\"%s\",\"msg\":\"", peer);
    for (char *p = out, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        CHECK(nl != NULL); /* every line ends */
        *nl = 0;
        lines++;
        if (strncmp(p, "{\"ts\":\"20", 9) != 0 || strcmp(nl - 2, "\"}") != 0) {
            fprintf(stderr, "    not a JSON line: %s\n", p);
            CHECK(0);
        }
        for (char *q = p; *q; q++)
            CHECK((unsigned char)*q >= 0x20);
        listening += strstr(p, "\"level\":\"info\",\"component\":\"master\",\"msg\":\"listening on") != NULL;
        with_peer += strstr(p, "\"level\":\"warn\"") && strstr(p, want);
    }
    CHECK(lines >= 2);
    CHECK_EQ(listening, 1);
    CHECK_EQ(with_peer, 1);
}

TEST(environment_json_flag_text_with_the_peer)
{
    char peer[KVP_NET_PEERLEN], want[128];
    setenv(KVP_LOG_FORMAT_ENV, "JSON", 1); /* the flag beats it */
    CHECK(run_master((const char *[]){"--log-level", "warn", "--log-format", "text", NULL}, peer,
                     sizeof peer) == 0);
    snprintf(want, sizeof want, "Z W master peer=%s: connection fd ", peer);
    CHECK(strstr(out, want) != NULL);
    CHECK(strchr(out, '{') == NULL);
}

TEST(environment_alone_sets_json)
{
    char peer[KVP_NET_PEERLEN];
    setenv(KVP_LOG_FORMAT_ENV, "json", 1);
    CHECK(run_master((const char *[]){"--log-level", "warn", NULL}, peer, sizeof peer) == 0);
    CHECK(strncmp(out, "{\"ts\":\"", 7) == 0);
    CHECK(strstr(out, peer) != NULL);
}

TEST(invalid_environment_or_flag_is_a_usage_error)
{
    setenv(KVP_LOG_FORMAT_ENV, "yaml", 1);
    const char *argv[] = {tp_kvpool_bin(), "master", "--listen", "127.0.0.1:0", NULL};
    int st = tp_run_capture(argv, 2, out, sizeof out, 10000);
    CHECK_EQ(st, 2);
    CHECK(strstr(out, "$KVPOOL_LOG_FORMAT: value \"yaml\" is not a log format (allowed: text, "
                      "json)") != NULL);
    unsetenv(KVP_LOG_FORMAT_ENV);
    const char *argv2[] = {tp_kvpool_bin(), "store", "--log-format", "xml", NULL};
    st = tp_run_capture(argv2, 2, out, sizeof out, 10000);
    CHECK_EQ(st, 2);
    CHECK(strstr(out, "--log-format") && strstr(out, "xml"));
    const char *argv3[] = {tp_kvpool_bin(), "serve", "--help", NULL};
    st = tp_run_capture(argv3, 1, out, sizeof out, 10000);
    CHECK_EQ(st, 0);
    CHECK(strstr(out, "--log-format") != NULL);
}
