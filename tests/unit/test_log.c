/*
 * test_log.c -- the line formats of common/log.h: text with and without a
 * peer, JSON lines and their escaping of every byte value, cutting a long
 * line, the thread-local peer, the format's names and $KVPOOL_LOG_FORMAT,
 * and that the sink sees the peer and the formatted line.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "harness.h"

static const struct timespec T0 = {1796256000, 123456789}; /* 2026-12-03T00:00:00.123Z */

static size_t render(char *out, size_t cap, int fmt, const char *peer, const char *msg,
                     size_t n)
{
    return kvp_log_render(out, cap, fmt, &T0, KVP_LOG_WARN, "master", peer, msg, n);
}

TEST(text_line_with_and_without_peer)
{
    char out[512];
    size_t n = render(out, sizeof out, KVP_LOG_TEXT, NULL, "hello", 5);
    CHECK(strcmp(out, "2026-12-03T00:00:00.123Z W master: hello\n") == 0);
    CHECK_EQ(n, strlen(out));
    render(out, sizeof out, KVP_LOG_TEXT, "10.0.0.1:5555", "hello", 5);
    CHECK(strcmp(out, "2026-12-03T00:00:00.123Z W master peer=10.0.0.1:5555: hello\n") == 0);
}

TEST(json_line_fields)
{
    char out[512];
    size_t n = render(out, sizeof out, KVP_LOG_JSON, NULL, "hello", 5);
    CHECK(strcmp(out, "{\"ts\":\"2026-12-03T00:00:00.123Z\",\"level\":\"warn\","
                      "\"component\":\"master\",\"msg\":\"hello\"}\n") == 0);
    CHECK_EQ(n, strlen(out));
    render(out, sizeof out, KVP_LOG_JSON, "[::1]:7", "x", 1);
    CHECK(strcmp(out, "{\"ts\":\"2026-12-03T00:00:00.123Z\",\"level\":\"warn\","
                      "\"component\":\"master\",\"peer\":\"[::1]:7\",\"msg\":\"x\"}\n") == 0);
}

/* The msg value of a one-line JSON object rendered from msg[0..n). */
static const char *json_msg(const char *msg, size_t n)
{
    static char out[8192];
    render(out, sizeof out, KVP_LOG_JSON, NULL, msg, n);
    char *p = strstr(out, "\"msg\":\"");
    if (!p)
        return "";
    p += 7;
    size_t l = strlen(p);
    if (l >= 3 && !strcmp(p + l - 3, "\"}\n"))
        p[l - 3] = 0;
    return p;
}

TEST(json_escapes_quotes_backslashes_and_control_bytes)
{
    CHECK(strcmp(json_msg("a\"b\\c", 5), "a\\\"b\\\\c") == 0);
    CHECK(strcmp(json_msg("\n\r\t", 3), "\\n\\r\\t") == 0);
    CHECK(strcmp(json_msg("\x01\x1f\x7f", 3), "\\u0001\\u001f\\u007f") == 0);
    CHECK(strcmp(json_msg("a\0b", 3), "a\\u0000b") == 0);
    CHECK(strcmp(json_msg("\x1b[2J", 4), "\\u001b[2J") == 0);
}

TEST(json_keeps_utf8_and_replaces_ill_formed_bytes)
{
    /* é, €, U+1F600: well formed, kept */
    CHECK(strcmp(json_msg("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9),
                 "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80") == 0);
    CHECK(strcmp(json_msg("\xff", 1), "\\ufffd") == 0);
    CHECK(strcmp(json_msg("\x80z", 2), "\\ufffdz") == 0);              /* stray continuation */
    CHECK(strcmp(json_msg("\xc0\xaf", 2), "\\ufffd\\ufffd") == 0);     /* overlong '/' */
    CHECK(strcmp(json_msg("\xe0\x80\xaf", 3), "\\ufffd\\ufffd\\ufffd") == 0); /* overlong */
    CHECK(strcmp(json_msg("\xed\xa0\x80", 3), "\\ufffd\\ufffd\\ufffd") == 0); /* surrogate */
    CHECK(strcmp(json_msg("\xf4\x90\x80\x80", 4), "\\ufffd\\ufffd\\ufffd\\ufffd") == 0);
    CHECK(strcmp(json_msg("\xe2\x82", 2), "\\ufffd\\ufffd") == 0);     /* cut short */
    CHECK(strcmp(json_msg("\xc3\xa9\xc3", 3), "\xc3\xa9\\ufffd") == 0);
}

/* Every byte value, alone and after 'a': the line is one JSON object with
 * only printable ASCII or well-formed UTF-8, no raw control byte. */
TEST(json_every_byte_value_gives_a_clean_line)
{
    for (int c = 0; c < 256; c++) {
        char msg[2] = {'a', (char)c};
        char out[256];
        size_t n = render(out, sizeof out, KVP_LOG_JSON, "p\"\n", msg, 2);
        CHECK(n > 2 && out[n - 1] == '\n' && out[n - 2] == '}' && out[0] == '{');
        CHECK(strstr(out, "\"peer\":\"p\\\"\\n\""));
        for (size_t i = 0; i + 1 < n; i++)
            CHECK((unsigned char)out[i] >= 0x20 && (unsigned char)out[i] != 0x7f);
        size_t q = 0; /* unescaped quotes: 5 keys and 5 values, both ends */
        for (size_t i = 0; i < n; i++) {
            if (out[i] == '\\')
                i++; /* the escaped byte */
            else if (out[i] == '"')
                q++;
        }
        CHECK_EQ(q, 20);
    }
}

TEST(long_lines_are_cut_whole)
{
    static char msg[1024], out[300];
    memset(msg, '"', sizeof msg);
    size_t n = render(out, sizeof out, KVP_LOG_JSON, NULL, msg, sizeof msg);
    CHECK(n < sizeof out);
    CHECK_EQ(n, strlen(out));
    CHECK(!strcmp(out + n - 3, "\"}\n"));
    /* never half an escape: the msg is whole \" pairs */
    const char *p = strstr(out, "\"msg\":\"") + 7;
    CHECK_EQ((size_t)(out + n - 3 - p) % 2, 0);
    for (const char *q = p; q < out + n - 3; q += 2)
        CHECK(q[0] == '\\' && q[1] == '"');
    n = render(out, sizeof out, KVP_LOG_TEXT, "h:1", msg, sizeof msg);
    CHECK_EQ(n, sizeof out - 1);
    CHECK(out[n - 1] == '\n');
}

static void *peer_thread(void *arg)
{
    (void)arg;
    return (void *)kvp_log_get_peer();
}

TEST(peer_is_per_thread)
{
    CHECK(kvp_log_get_peer() == NULL);
    kvp_log_set_peer("1.2.3.4:5");
    pthread_t t;
    void *other = (void *)1;
    CHECK_EQ(pthread_create(&t, NULL, peer_thread, NULL), 0);
    pthread_join(t, &other);
    CHECK(other == NULL);
    CHECK(!strcmp(kvp_log_get_peer(), "1.2.3.4:5"));
    kvp_log_set_peer(NULL);
    CHECK(kvp_log_get_peer() == NULL);
}

TEST(format_names_and_environment)
{
    CHECK_EQ(kvp_log_format_parse("text"), KVP_LOG_TEXT);
    CHECK_EQ(kvp_log_format_parse("JSON"), KVP_LOG_JSON);
    CHECK_EQ(kvp_log_format_parse("xml"), -1);
    CHECK(!strcmp(kvp_log_format_name(KVP_LOG_JSON), "json"));
    CHECK(!strcmp(kvp_log_format_name(KVP_LOG_TEXT), "text"));
    unsetenv(KVP_LOG_FORMAT_ENV);
    CHECK_EQ(kvp_log_env_format(), -1);
    setenv(KVP_LOG_FORMAT_ENV, "Json", 1);
    CHECK_EQ(kvp_log_env_format(), KVP_LOG_JSON);
    setenv(KVP_LOG_FORMAT_ENV, "yaml", 1);
    CHECK_EQ(kvp_log_env_format(), -2);
    unsetenv(KVP_LOG_FORMAT_ENV);
}

/* Read once, at the first use: $KVPOOL_LOG_FORMAT beats a configuration,
 * an explicit call beats both. (Each test is its own forked process.) */
TEST(environment_beats_configuration_explicit_beats_both)
{
    setenv(KVP_LOG_FORMAT_ENV, "json", 1);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_JSON);
    kvp_log_set_configured_format(KVP_LOG_TEXT);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_JSON);
    kvp_log_set_format(KVP_LOG_TEXT);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_TEXT);
    unsetenv(KVP_LOG_FORMAT_ENV);
}

TEST(configuration_sets_the_format_without_environment)
{
    unsetenv(KVP_LOG_FORMAT_ENV);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_TEXT);
    kvp_log_set_configured_format(KVP_LOG_JSON);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_JSON);
}

struct seen {
    char line[8192];
    char peer[64];
    char msg[256];
    int n;
};

static void sink_fn(void *ctx, const kvp_log_record *r)
{
    struct seen *s = ctx;
    s->n++;
    snprintf(s->line, sizeof s->line, "%.*s", (int)r->line_len, r->line);
    snprintf(s->peer, sizeof s->peer, "%s", r->peer ? r->peer : "(none)");
    snprintf(s->msg, sizeof s->msg, "%.*s", (int)r->msg_len, r->msg);
}

TEST(sink_sees_the_peer_the_message_and_the_formatted_line)
{
    static struct seen s;
    static const kvp_log_sink sink = {sink_fn, &s};
    kvp_log_set_level(KVP_LOG_INFO);
    kvp_log_set_format(KVP_LOG_JSON);
    kvp_log_set_sink(&sink);
    kvp_log_set_peer("10.1.2.3:4000");
    KVP_WARN("node", "bad \"frame\" %d", 7);
    kvp_log_set_peer(NULL);
    KVP_INFO("node", "after");
    kvp_log_set_sink(NULL);
    CHECK_EQ(s.n, 2);
    CHECK(!strcmp(s.peer, "(none)"));
    CHECK(!strcmp(s.msg, "after"));
    CHECK(strstr(s.line, "\"component\":\"node\",\"msg\":\"after\"}\n"));
    s.n = 0;
    kvp_log_set_sink(&sink);
    kvp_log_set_peer("10.1.2.3:4000");
    KVP_WARN("node", "bad \"frame\" %d", 7);
    kvp_log_set_peer(NULL);
    kvp_log_set_sink(NULL);
    CHECK_EQ(s.n, 1);
    CHECK(!strcmp(s.peer, "10.1.2.3:4000"));
    CHECK(!strcmp(s.msg, "bad \"frame\" 7"));
    CHECK(strstr(s.line, "\"level\":\"warn\",\"component\":\"node\",\"peer\":\"10.1.2.3:4000\","
                         "\"msg\":\"bad \\\"frame\\\" 7\"}\n"));
}
