/* test_config.c -- defaults, JSON files and strings, flags, validation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/mem.h"
#include "harness.h"
#include "kvpool.h"

#define GI (1024ull * 1024 * 1024)
#define MI (1024ull * 1024)

/* Loads json over defaults; returns rc, message in err. */
static int load(kvp_config *c, const char *json, char *err)
{
    kvp_config_defaults(c);
    err[0] = '\0';
    return kvp_config_load_string(c, json, err, KVP_CONFIG_ERRLEN);
}

/* Every needle must occur in msg (printed on failure). */
static int has_all(const char *msg, const char *const *needles)
{
    for (int i = 0; needles[i]; i++)
        if (!strstr(msg, needles[i])) {
            fprintf(stderr, "    message lacks \"%s\": %s\n", needles[i], msg);
            return 0;
        }
    return 1;
}
#define HAS(msg, ...) has_all((msg), (const char *const[]){__VA_ARGS__, NULL})

/* Writes text to a fresh temporary file; path into buf (caller unlinks). */
static int write_tmp(char *buf, size_t n, const char *text)
{
    snprintf(buf, n, "/tmp/kvp_test_config_XXXXXX.json");
    int fd = mkstemps(buf, 5);
    REQUIRE(fd >= 0);
    size_t len = strlen(text);
    REQUIRE(write(fd, text, len) == (ssize_t)len);
    close(fd);
    return 0;
}

TEST(defaults_match_header)
{
    kvp_config c;
    memset(&c, 0xa5, sizeof c);
    kvp_config_defaults(&c);
    CHECK(strcmp(c.listen, "127.0.0.1:50051") == 0);
    CHECK(strcmp(c.cluster_token, "") == 0);
    CHECK(c.max_frame == 64 * MI);
    CHECK(c.lease_ttl_ms == 5000);
    CHECK(c.put_timeout_ms == 30000);
    CHECK(c.client_ttl_ms == 10000);
    CHECK(c.evict_high == 0.95);
    CHECK(c.evict_low == 0.90);
    CHECK(c.max_key == 4096);
    CHECK(c.max_connections == 4096);
    CHECK(c.max_conns_per_addr == 64);
    CHECK(c.hello_timeout_ms == 5000);
    CHECK(c.input_budget == GI);
    CHECK(c.max_segments == 4096);
    CHECK(c.max_tenants == 1024);
    CHECK(c.max_objects == 0);
    CHECK_EQ(c.log_level, KVP_LOG_INFO);
    CHECK(strcmp(c.log_format, "text") == 0);
    CHECK(strcmp(c.master_addr, "127.0.0.1:50051") == 0);
    CHECK(strcmp(c.local_hostname, "localhost") == 0);
    CHECK(strcmp(c.protocol, "tcp") == 0);
    CHECK(strcmp(c.mode, "standalone-store") == 0);
    CHECK(strcmp(kvp_config_mode(&c), "standalone-store") == 0);
    CHECK(strcmp(c.segment_prefault, "auto") == 0);
    CHECK(c.global_segment_size == 4 * GI);
    CHECK(c.local_buffer_size == 0);
    CHECK_EQ(c.enable_offload, 0);
    CHECK(c.rpc_timeout_ms == 10000);
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
}

TEST(every_default_parses)
{
    /* Each row's default text must be accepted by its own parser: set every
     * key from the reference's default column via the flag path. */
    kvp_config a, b;
    kvp_config_defaults(&a);
    kvp_config_defaults(&b);
    char err[KVP_CONFIG_ERRLEN];
    static const char *const kv[][2] = {
        {"listen", "127.0.0.1:50051"}, {"cluster_token", ""}, {"max_frame_size", "64MiB"},
        {"lease_ttl", "5s"}, {"put_timeout", "30s"}, {"client_ttl", "10s"},
        {"eviction_high_watermark_ratio", "0.95"}, {"eviction_low_watermark_ratio", "0.90"},
        {"max_key_size", "4096"}, {"max_connections", "4096"}, {"max_segments", "4096"},
        {"max_tenants", "1024"}, {"max_objects", "0"}, {"log_level", "info"}, {"log_format", "text"},
        {"master", "127.0.0.1:50051"}, {"local_hostname", "localhost"}, {"protocol", "tcp"},
        {"mode", "standalone-store"}, {"global_segment_size", "4GiB"}, {"local_buffer_size", "0"},
        {"enable_offload", "false"}, {"rpc_timeout", "10s"}, {"replica_num", "1"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECK_EQ(kvp_config_set(&b, kv[i][0], kv[i][1], err, sizeof err), 0);
    CHECK((b.set_mask[0] | b.set_mask[1]) != 0 && (a.set_mask[0] | a.set_mask[1]) == 0);
    b.set_mask[0] = b.set_mask[1] = 0; /* explicit vs default */
    CHECK(memcmp(&a, &b, sizeof a) == 0);
}

TEST(every_type_from_json)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    const char *json = "{\n"
                       "  \"listen\": \"0.0.0.0:6000\",\n"
                       "  \"cluster_token\": \"s3cret\",\n"
                       "  \"max_frame_size\": \"1MB\",\n"
                       "  \"lease_ttl\": \"250ms\",\n"
                       "  \"put_timeout\": 1500,\n"
                       "  \"client_ttl\": 20,\n"
                       "  \"eviction_high_watermark_ratio\": 0.8,\n"
                       "  \"eviction_low_watermark_ratio\": \"0.5\",\n"
                       "  \"max_key_size\": \"100\",\n"
                       "  \"max_connections\": 10,\n"
                       "  \"max_segments\": 3,\n"
                       "  \"max_tenants\": 2,\n"
                       "  \"max_objects\": 1000000,\n"
                       "  \"log_level\": \"warn\",\n"
                       "  \"master\": \"10.0.0.1:50051\",\n"
                       "  \"local_hostname\": \"node7\",\n"
                       "  \"protocol\": \"rdma\",\n"
                       "  \"mode\": \"embedded\",\n"
                       "  \"global_segment_size\": 1073741824,\n"
                       "  \"local_buffer_size\": \"512 MiB\",\n"
                       "  \"enable_offload\": true,\n"
                       "  \"rpc_timeout\": \"2m\"\n"
                       "}\n";
    CHECK_EQ(load(&c, json, err), 0);
    CHECK(strcmp(c.listen, "0.0.0.0:6000") == 0);
    CHECK(strcmp(c.cluster_token, "s3cret") == 0);
    CHECK(c.max_frame == MI);
    CHECK(c.lease_ttl_ms == 250);
    CHECK(c.put_timeout_ms == 1500);
    CHECK(c.client_ttl_ms == 20000); /* bare client_ttl is seconds */
    CHECK(c.evict_high == 0.8);
    CHECK(c.evict_low == 0.5);
    CHECK(c.max_key == 100);
    CHECK(c.max_connections == 10);
    CHECK(c.max_segments == 3);
    CHECK(c.max_tenants == 2);
    CHECK(c.max_objects == 1000000);
    CHECK_EQ(c.log_level, KVP_LOG_WARN);
    CHECK(strcmp(c.master_addr, "10.0.0.1:50051") == 0);
    CHECK(strcmp(c.local_hostname, "node7") == 0);
    CHECK(strcmp(c.protocol, "rdma") == 0);
    CHECK(strcmp(c.mode, "embedded") == 0);
    CHECK(c.global_segment_size == GI);
    CHECK(c.local_buffer_size == 512 * MI);
    CHECK_EQ(c.enable_offload, 1);
    CHECK(c.rpc_timeout_ms == 120000);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
}

TEST(empty_object_keeps_defaults)
{
    kvp_config c, d;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{}", err), 0);
    kvp_config_defaults(&d);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
}

TEST(mooncake_aliases)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    /* A Mooncake-style client config. */
    CHECK_EQ(load(&c,
                  "{\"local_hostname\": \"192.168.0.5\", \"metadata_server\": \"P2PHANDSHAKE\","
                  " \"protocol\": \"tcp\", \"device_name\": \"\","
                  " \"master_server_address\": \"192.168.0.1:50051\","
                  " \"global_segment_size\": \"4GB\", \"local_buffer_size\": 536870912,"
                  " \"default_kv_lease_ttl\": 3000, \"client_ttl\": 10,"
                  " \"eviction_high_watermark_ratio\": 0.92, \"eviction_ratio\": 0.05,"
                  " \"rdma_devices\": [\"mlx5_0\"], \"master_metrics_port\": 9003,"
                  " \"transfer_timeout\": 30, \"use_ascend_direct\": false,"
                  " \"enable_offload\": \"true\", \"mode\": \"embedded\"}",
                  err),
             0);
    CHECK(strcmp(c.master_addr, "192.168.0.1:50051") == 0);
    CHECK(strcmp(c.local_hostname, "192.168.0.5") == 0);
    CHECK(c.global_segment_size == 4 * GI);
    CHECK(c.local_buffer_size == 512 * MI);
    CHECK(c.lease_ttl_ms == 3000); /* bare default_kv_lease_ttl is ms */
    CHECK(c.client_ttl_ms == 10000);
    CHECK(c.evict_high == 0.92);
    CHECK_EQ(c.enable_offload, 1);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);

    CHECK_EQ(load(&c, "{\"master_server_addr\": \"h:1\"}", err), 0);
    CHECK(strcmp(c.master_addr, "h:1") == 0);
}

TEST(ignored_keys_any_value)
{
    kvp_config c, d;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c,
                  "{\"metadata_server\": null, \"device_name\": {\"x\": [1, 2]},"
                  " \"rdma_devices\": \"\", \"master_metrics_port\": \"9003\","
                  " \"eviction_ratio\": 1e9, \"transfer_timeout\": [], \"use_ascend_direct\": 1}",
                  err),
             0);
    kvp_config_defaults(&d);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    CHECK_EQ(kvp_config_set(&c, "device-name", "mlx5_0", err, sizeof err), 0);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
}

TEST(numbers_or_strings)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{\"global_segment_size\": \"4096\", \"local_buffer_size\": \"1.5k\"}", err), 0);
    CHECK(c.global_segment_size == 4096);
    CHECK(c.local_buffer_size == 1536);
    CHECK_EQ(load(&c, "{\"global_segment_size\": 4e9}", err), 0); /* whole real */
    CHECK(c.global_segment_size == 4000000000ull);
    CHECK_EQ(load(&c, "{\"lease_ttl\": 2.5, \"client_ttl\": 0.5}", err), 0);
    CHECK(c.lease_ttl_ms == 2);
    CHECK(c.client_ttl_ms == 500);
    CHECK_EQ(load(&c, "{\"client_ttl\": \"1.25\", \"lease_ttl\": \"1s\"}", err), 0);
    CHECK(c.client_ttl_ms == 1250);
    CHECK_EQ(load(&c, "{\"max_key_size\": 5.0}", err), 0);
    CHECK(c.max_key == 5);
    CHECK_EQ(load(&c, "{\"eviction_high_watermark_ratio\": 1}", err), 0);
    CHECK(c.evict_high == 1.0);
    CHECK_EQ(load(&c, "{\"enable_offload\": \"FALSE\"}", err), 0);
    CHECK_EQ(c.enable_offload, 0);
    CHECK_EQ(load(&c, "{\"log_level\": \"DEBUG\"}", err), 0);
    CHECK_EQ(c.log_level, KVP_LOG_DEBUG);
    CHECK_EQ(load(&c, "{\"log_level\": \"off\"}", err), 0);
    CHECK_EQ(c.log_level, KVP_LOG_OFF);
}

TEST(log_format_key)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    CHECK(!kvp_config_was_set(&c, "log_format"));
    CHECK_EQ(load(&c, "{\"log_format\": \"json\"}", err), 0);
    CHECK(strcmp(c.log_format, "json") == 0);
    CHECK(kvp_config_was_set(&c, "log_format"));
    CHECK_EQ(kvp_config_set(&c, "log-format", "text", err, sizeof err), 0);
    CHECK(strcmp(c.log_format, "text") == 0);
    CHECK(kvp_config_set(&c, "log_format", "xml", err, sizeof err) != 0);
    CHECK(strstr(err, "log_format") && strstr(err, "xml") && strstr(err, "json"));
    CHECK(strcmp(c.log_format, "text") == 0);
    CHECK(load(&c, "{\"log_format\": 1}", err) != 0);
    /* a configuration that gives it sets the process format (no $KVPOOL_LOG_FORMAT) */
    unsetenv(KVP_LOG_FORMAT_ENV);
    CHECK_EQ(load(&c, "{\"log_format\": \"json\"}", err), 0);
    kvp_config_apply_log_level(&c);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_JSON);
    kvp_config_defaults(&c); /* not given: left alone */
    kvp_config_apply_log_level(&c);
    CHECK_EQ(kvp_log_get_format(), KVP_LOG_JSON);
}

/* One bad value per row: the message names source, key, value and what is allowed. */
TEST(value_errors_name_everything)
{
    static const struct {
        const char *json;
        const char *needles[5];
    } cases[] = {
        {"{\"lease_ttl\": \"5x\"}",
         {"config:1:15: ", "key \"lease_ttl\"", "value \"5x\" is not a duration",
          "allowed: a number of milliseconds or a string like \"250ms\"", "from 1ms to 720h"}},
        {"{\"client_ttl\": true}",
         {"key \"client_ttl\"", "value true is not a duration", "a number of seconds", NULL}},
        {"{\"lease_ttl\": 0}", {"key \"lease_ttl\"", "value 0 is out of range", "from 1ms", NULL}},
        {"{\"lease_ttl\": -5}", {"value -5 is out of range", NULL}},
        {"{\"listen\": 5}",
         {"key \"listen\"", "value 5 is not a string", "a string of at most 255 bytes", NULL}},
        {"{\"listen\": null}", {"value null is not a string", NULL}},
        {"{\"protocol\": \"udp\"}",
         {"key \"protocol\"", "value \"udp\" is not one of the allowed values",
          "allowed: \"tcp\", \"rdma\"", NULL}},
        {"{\"protocol\": \"TCP\"}", {"value \"TCP\" is not one of", NULL}},
        {"{\"mode\": \"cluster\"}", {"allowed: \"embedded\", \"standalone-store\"", NULL}},
        {"{\"max_frame_size\": \"2GB\"}",
         {"key \"max_frame_size\"", "value \"2GB\" is out of range",
          "from 4096 (4.0 KiB) to 1073741824 (1.0 GiB) bytes", NULL}},
        {"{\"max_frame_size\": 100}", {"value 100 is out of range", NULL}},
        {"{\"global_segment_size\": \"4 gigs\"}",
         {"value \"4 gigs\" is not a size", "\"64MB\", \"4GiB\"", NULL}},
        {"{\"global_segment_size\": \"1.5\"}", {"value \"1.5\" is not a size", NULL}},
        {"{\"global_segment_size\": 1.5}", {"value 1.5 is not a size", NULL}},
        {"{\"global_segment_size\": \"99999999999999999999GB\"}", {"is not a size", NULL}},
        {"{\"local_buffer_size\": [1]}", {"value [...] is not a size", NULL}},
        {"{\"eviction_high_watermark_ratio\": 0}",
         {"key \"eviction_high_watermark_ratio\"", "value 0 is out of range",
          "allowed: a number in (0, 1]", NULL}},
        {"{\"eviction_high_watermark_ratio\": 1.5}", {"value 1.5 is out of range", NULL}},
        {"{\"eviction_low_watermark_ratio\": 1}", {"allowed: a number in [0, 1)", NULL}},
        {"{\"eviction_low_watermark_ratio\": \"half\"}", {"value \"half\" is not a number", NULL}},
        {"{\"eviction_low_watermark_ratio\": \"nan\"}", {"is not a number", NULL}},
        {"{\"eviction_low_watermark_ratio\": \"0x1p-1\"}", {"is not a number", NULL}},
        {"{\"enable_offload\": \"yes\"}",
         {"key \"enable_offload\"", "value \"yes\" is not a boolean", "allowed: true or false",
          NULL}},
        {"{\"enable_offload\": 1}", {"value 1 is not a boolean", NULL}},
        {"{\"max_key_size\": 0}",
         {"key \"max_key_size\"", "value 0 is out of range", "a whole number from 1 to 65535",
          NULL}},
        {"{\"max_key_size\": \"12k\"}", {"value \"12k\" is not a whole number", NULL}},
        {"{\"max_key_size\": 2.5}", {"value 2.5 is not a whole number", NULL}},
        {"{\"max_tenants\": 65536}", {"value 65536 is out of range", NULL}},
        {"{\"max_objects\": -1}", {"key \"max_objects\"", "value -1 is out of range", NULL}},
        {"{\"log_level\": \"loud\"}",
         {"key \"log_level\"", "value \"loud\" is not a log level",
          "\"debug\", \"info\", \"warn\", \"error\", \"off\"", NULL}},
        {"{\"log_level\": 3}", {"value 3 is not a log level", NULL}},
        {"{\"master_server_address\": 1}",
         {"key \"master_server_address\"", "value 1 is not a string", NULL}},
        {"{\"default_kv_lease_ttl\": \"soon\"}",
         {"key \"default_kv_lease_ttl\"", "value \"soon\" is not a duration", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_config c;
        char err[KVP_CONFIG_ERRLEN];
        int rc = load(&c, cases[i].json, err);
        if (rc != KVP_ECONFIG)
            fprintf(stderr, "    case %s: rc %d\n", cases[i].json, rc);
        CHECK_EQ(rc, KVP_ECONFIG);
        const char *const *n = cases[i].needles;
        for (int j = 0; j < 5 && n[j]; j++) {
            if (!strstr(err, n[j]))
                fprintf(stderr, "    case %s: message lacks \"%s\": %s\n", cases[i].json, n[j],
                        err);
            CHECK(strstr(err, n[j]) != NULL);
        }
        CHECK(strncmp(err, "config:1:", 9) == 0);
    }
}

TEST(string_too_long)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN], json[600];
    char longv[300];
    memset(longv, 'a', 256);
    longv[256] = '\0';
    snprintf(json, sizeof json, "{\"cluster_token\": \"%s\"}", longv);
    CHECK_EQ(load(&c, json, err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"cluster_token\"", "is too long (256 bytes)",
              "a string of at most 255 bytes", "aaaa...\""));
    CHECK(strcmp(c.cluster_token, "") == 0); /* unchanged */
    longv[255] = '\0';
    snprintf(json, sizeof json, "{\"cluster_token\": \"%s\"}", longv);
    CHECK_EQ(load(&c, json, err), 0);
    CHECK_EQ(strlen(c.cluster_token), 255);
    CHECK_EQ(load(&c, "{\"protocol\": \"tcp\\u0001\"}", err), KVP_ECONFIG);
    CHECK(HAS(err, "value \"tcp\\x01\" is not one of")); /* control bytes escaped */
}

TEST(unknown_key)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{\n  \"lease_ttl\": 100,\n  \"lease_tll\": 5\n}", err), KVP_ECONFIG);
    CHECK(HAS(err, "config:3:3: unknown key \"lease_tll\"", "did you mean \"lease_ttl\"?",
              "(allowed: listen, cluster_token, ", "max_frame_size, lease_ttl", "rpc_timeout",
              "Mooncake aliases: default_kv_lease_ttl, default_kv_soft_pin_ttl, max_kv_soft_pin_ttl, "
              "master_server_address, master_server_addr, "
              "offload_file_storage_path, offload_total_size_limit_bytes, "
              "offload_local_buffer_size_bytes, tenant_id)"));
    CHECK_EQ(load(&c, "{\"zzzzzzzzzzzz\": 5}", err), KVP_ECONFIG);
    CHECK(HAS(err, "unknown key \"zzzzzzzzzzzz\" (allowed: "));
    CHECK(strstr(err, "did you mean") == NULL);
    /* the whole list fits in the documented buffer size */
    CHECK(err[strlen(err) - 1] == ')');
}

TEST(unknown_key_with_escapes_located)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    /* Keys are matched after unescaping; positions count characters. */
    CHECK_EQ(load(&c, "{\"\\u00e9\\\"x\": {\"a\": [1, \"}\"]}, \"b\\u00e9\": 1}", err), KVP_ECONFIG);
    CHECK(HAS(err, "unknown key"));
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_load_string(&c, "{\"device_name\": {\"x\": \"}\"},\n \"l\\u0069sten\": 7}",
                                    err, sizeof err),
             KVP_ECONFIG);
    CHECK(HAS(err, "config:2:17: key \"listen\": value 7 is not a string"));
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_load_string(&c, "{\"listen\": \"é\", \"mode\": 1}", err, sizeof err),
             KVP_ECONFIG);
    CHECK(HAS(err, "config:1:25: key \"mode\""));
}

TEST(json_syntax_error_has_position)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{\n  \"lease_ttl\": 5,\n  \"put_timeout\": ,\n}", err), KVP_ECONFIG);
    CHECK(HAS(err, "config:3:", "invalid JSON"));
    CHECK_EQ(load(&c, "", err), KVP_ECONFIG);
    CHECK(HAS(err, "invalid JSON"));
    CHECK_EQ(load(&c, "{\"a\": 1} trailing", err), KVP_ECONFIG);
    CHECK(HAS(err, "invalid JSON"));
    CHECK_EQ(load(&c, "[1, 2]", err), KVP_ECONFIG);
    CHECK(HAS(err, "must be a JSON object"));
    CHECK_EQ(load(&c, "{\"lease_ttl\": 5, \"lease_ttl\": 6}", err), KVP_ECONFIG);
    CHECK(HAS(err, "config:1:", "duplicate"));
    CHECK_EQ(load(&c, "{\"listen\": \"a\\u0000b\"}", err), KVP_ECONFIG); /* NUL in a string */
    CHECK(HAS(err, "invalid JSON"));
    CHECK_EQ(kvp_config_load_string(&c, NULL, err, sizeof err), KVP_EINVALID_PARAMS);
}

TEST(file_load_and_errors)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN], path[64];
    CHECK_EQ(write_tmp(path, sizeof path,
                       "{\n  \"listen\": \"0.0.0.0:7000\",\n  \"max_segments\": \"lots\"\n}\n"),
             0);
    kvp_config_defaults(&c);
    int rc = kvp_config_load_file(&c, path, err, sizeof err);
    unlink(path);
    CHECK_EQ(rc, KVP_ECONFIG);
    char want[128];
    snprintf(want, sizeof want, "%s:3:19: key \"max_segments\": value \"lots\"", path);
    CHECK(HAS(err, want, "is not a whole number", "allowed: a whole number from 1 to 65535"));
    CHECK(strcmp(c.listen, "0.0.0.0:7000") == 0); /* partly updated, as documented */

    CHECK_EQ(write_tmp(path, sizeof path, "{\"listen\": \"0.0.0.0:7000\",\n\"mode\" \"x\"}"), 0);
    rc = kvp_config_load_file(&c, path, err, sizeof err);
    unlink(path);
    CHECK_EQ(rc, KVP_ECONFIG);
    snprintf(want, sizeof want, "%s:2:", path);
    CHECK(HAS(err, want, "invalid JSON"));

    CHECK_EQ(write_tmp(path, sizeof path, "{\"max_objects\": 12}"), 0);
    kvp_config_defaults(&c);
    rc = kvp_config_load_file(&c, path, err, sizeof err);
    unlink(path);
    CHECK_EQ(rc, 0);
    CHECK(c.max_objects == 12);

    CHECK_EQ(write_tmp(path, sizeof path, ""), 0);
    rc = kvp_config_load_file(&c, path, err, sizeof err);
    unlink(path);
    CHECK_EQ(rc, KVP_ECONFIG);
}

TEST(file_missing_and_unreadable)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_load_file(&c, "/nonexistent/kvpool.json", err, sizeof err),
             KVP_EFILE_NOT_FOUND);
    CHECK(HAS(err, "/nonexistent/kvpool.json", "cannot open", "No such file"));
    CHECK_EQ(kvp_config_load_file(&c, "/tmp", err, sizeof err), KVP_EFILE_READ_FAIL);
    CHECK(HAS(err, "/tmp: cannot read"));
    CHECK_EQ(kvp_config_load_file(&c, NULL, err, sizeof err), KVP_EINVALID_PARAMS);
}

TEST(file_large_and_out_of_memory)
{
    /* A file bigger than the first read buffer, then the same with the
     * buffer allocation failing. */
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN], path[64];
    size_t n = 20000;
    char *text = malloc(n + 64);
    CHECK(text != NULL);
    memset(text, ' ', n);
    strcpy(text + n, "{\"max_objects\": 77}");
    int w = write_tmp(path, sizeof path, text);
    free(text);
    CHECK_EQ(w, 0);
    kvp_config_defaults(&c);
    uint64_t before = kvp_mem_used();
    CHECK_EQ(kvp_config_load_file(&c, path, err, sizeof err), 0);
    CHECK(c.max_objects == 77);
    CHECK(kvp_mem_used() == before);
    kvp_mem_fail_nth(2, 0); /* the first growth of the buffer */
    int rc = kvp_config_load_file(&c, path, err, sizeof err);
    kvp_mem_fail_nth(0, 0);
    unlink(path);
    CHECK_EQ(rc, KVP_ENOMEM);
    CHECK(HAS(err, "out of memory"));
    CHECK(kvp_mem_used() == before);
}

TEST(flags_set)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_set(&c, "--lease-ttl", "2s", err, sizeof err), 0);
    CHECK(c.lease_ttl_ms == 2000);
    CHECK_EQ(kvp_config_set(&c, "lease-ttl", "300", err, sizeof err), 0);
    CHECK(c.lease_ttl_ms == 300);
    CHECK_EQ(kvp_config_set(&c, "client_ttl", "3", err, sizeof err), 0);
    CHECK(c.client_ttl_ms == 3000);
    CHECK_EQ(kvp_config_set(&c, "max-frame-size", "1 MiB", err, sizeof err), 0);
    CHECK(c.max_frame == MI);
    CHECK_EQ(kvp_config_set(&c, "eviction-high-watermark-ratio", "0.99", err, sizeof err), 0);
    CHECK(c.evict_high == 0.99);
    CHECK_EQ(kvp_config_set(&c, "--enable-offload", "true", err, sizeof err), 0);
    CHECK_EQ(c.enable_offload, 1);
    CHECK_EQ(kvp_config_set(&c, "log-level", "error", err, sizeof err), 0);
    CHECK_EQ(c.log_level, KVP_LOG_ERROR);
    CHECK_EQ(kvp_config_set(&c, "master-server-address", "m:1", err, sizeof err), 0);
    CHECK(strcmp(c.master_addr, "m:1") == 0);
    CHECK_EQ(kvp_config_set(&c, "--master", "m:2", err, sizeof err), 0);
    CHECK(strcmp(c.master_addr, "m:2") == 0);
    CHECK_EQ(kvp_config_set(&c, "max_objects", "18446744073709551615", err, sizeof err), 0);
    CHECK(c.max_objects == UINT64_MAX);
    CHECK_EQ(kvp_config_set(&c, "cluster-token", "", err, sizeof err), 0);
    CHECK(strcmp(c.cluster_token, "") == 0);
}

TEST(flag_errors)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_set(&c, "--lease-ttl", "5x", err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "flag --lease-ttl: value \"5x\" is not a duration",
              "allowed: a number of milliseconds"));
    CHECK(c.lease_ttl_ms == 5000);
    CHECK_EQ(kvp_config_set(&c, "--lease-tll", "5s", err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "unknown flag --lease-tll", "did you mean --lease-ttl?", "allowed:"));
    CHECK(strstr(err, "flag: ") == NULL); /* named once, no "flag: key" prefix */
    CHECK_EQ(kvp_config_set(&c, "max-objects", "-1", err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "value \"-1\" is not a whole number"));
    CHECK_EQ(kvp_config_set(&c, "max-objects", "18446744073709551616", err, sizeof err),
             KVP_ECONFIG);
    CHECK_EQ(kvp_config_set(&c, "max-objects", " 1", err, sizeof err), KVP_ECONFIG);
    CHECK_EQ(kvp_config_set(&c, "eviction-low-watermark-ratio", "0.5 ", err, sizeof err),
             KVP_ECONFIG);
    CHECK_EQ(kvp_config_set(&c, "listen", NULL, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "flag --listen: missing value"));
    char longkey[200];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    CHECK_EQ(kvp_config_set(&c, longkey, "1", err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "unknown flag \"kkkk"));
    CHECK_EQ(kvp_config_set(&c, NULL, "1", err, sizeof err), KVP_EINVALID_PARAMS);
    /* a tiny error buffer is filled and terminated, never overrun */
    char small[8];
    CHECK_EQ(kvp_config_set(&c, "--lease-ttl", "5x", small, sizeof small), KVP_ECONFIG);
    CHECK_EQ(strlen(small), 7);
    CHECK_EQ(kvp_config_set(&c, "nope", "5x", small, sizeof small), KVP_ECONFIG);
    CHECK_EQ(strlen(small), 7);
    CHECK_EQ(kvp_config_set(&c, "nope", "5x", NULL, 0), KVP_ECONFIG);
}

TEST(validation)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    c.evict_low = 0.95;
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"eviction_low_watermark_ratio\" (0.95) must be less than key "
                   "\"eviction_high_watermark_ratio\" (0.95)"));

    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_set(&c, "lease_ttl", "20s", err, sizeof err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"lease_ttl\" (20s) must not exceed key \"client_ttl\" (10s)"));
    CHECK_EQ(kvp_config_set(&c, "client_ttl", "20", err, sizeof err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0); /* equal is fine */

    kvp_config_defaults(&c);
    c.lease_ttl_ms = 0;
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"lease_ttl\": value 0ms is out of range", "from 1ms"));

    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_set(&c, "max_frame_size", "4k", err, sizeof err), 0);
    CHECK_EQ(kvp_config_set(&c, "max_key_size", "4096", err, sizeof err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"max_key_size\" (4096) must be less than key \"max_frame_size\" (4096)"));

    /* one largest frame must fit the 15/16 of the input budget large frames may use */
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_set(&c, "input_memory_budget", "64MiB", err, sizeof err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"input_memory_budget\" (67108864) must be at least 16/15 of key "
                   "\"max_frame_size\" (67108864)"));
    CHECK_EQ(kvp_config_set(&c, "input_memory_budget", "69MiB", err, sizeof err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
    CHECK_EQ(kvp_config_set(&c, "hello_timeout", "0", err, sizeof err), KVP_ECONFIG);
    CHECK_EQ(kvp_config_set(&c, "max_connections_per_address", "0", err, sizeof err), KVP_ECONFIG);

    kvp_config_defaults(&c);
    memcpy(c.protocol, "udp", 4);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"protocol\": value \"udp\"", "\"tcp\", \"rdma\""));

    kvp_config_defaults(&c);
    memset(c.listen, 'x', sizeof c.listen);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"listen\"", "not NUL-terminated"));

    kvp_config_defaults(&c);
    c.log_level = 9;
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"log_level\""));

    kvp_config_defaults(&c);
    c.evict_high = 2.0;
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"eviction_high_watermark_ratio\": value 2 is out of range"));
    c.evict_high = NAN;
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"eviction_high_watermark_ratio\": value "));

    CHECK_EQ(kvp_config_validate(NULL, err, sizeof err), KVP_ECONFIG);
}

/* The SSD tier's keys: Mooncake names, sizes, ratios and their checks. */
TEST(offload_keys)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{\"enable_offload\": true, \"offload_file_storage_path\": \"/nvme/kv\", "
                      "\"offload_total_size_limit_bytes\": \"2TB\", \"offload_page_size\": "
                      "\"256MiB\", \"offload_local_buffer_size_bytes\": \"1.25GiB\"}", err), 0);
    CHECK(c.enable_offload && !strcmp(c.offload_dir, "/nvme/kv"));
    CHECK_EQ(c.offload_capacity, 2ull << 40); /* "TB" is binary, as Mooncake's sizes */
    CHECK_EQ(c.offload_page_size, 256ull << 20);
    CHECK_EQ(c.offload_staging, 1342177280ull);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
    CHECK_EQ(load(&c, "{\"offload_page_size\": \"32MiB\"}", err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"offload_page_size\"", "32MiB"));
    CHECK_EQ(load(&c, "{\"offload_page_size\": 67112960}", err), 0); /* 64 MiB + 4 KiB */
    CHECK_EQ(load(&c, "{\"offload_page_size\": 67109000}", err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"offload_page_size\": 67109000 is not a multiple of 4 KiB"));
    CHECK_EQ(load(&c, "{\"offload_capacity\": \"100MiB\"}", err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"offload_capacity\"", "at least two pages"));
    CHECK_EQ(load(&c, "{\"offload_low_watermark_ratio\": 0.96}", err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"offload_low_watermark_ratio\" (0.96) must be less than key "
                   "\"offload_high_watermark_ratio\" (0.95)"));
    CHECK_EQ(load(&c, "{\"offload_high_watermark_ratio\": 1.5}", err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"offload_high_watermark_ratio\""));
    CHECK_EQ(load(&c, "{\"offload_staging_budget\": \"1MiB\"}", err), KVP_ECONFIG);
    CHECK(HAS(err, "key \"offload_staging_budget\""));
    CHECK_EQ(kvp_config_set(&c, "offload-dir", "/tmp/x", err, sizeof err), 0); /* a flag too */
    CHECK(!strcmp(c.offload_dir, "/tmp/x"));
}

TEST(reference_lists_every_key)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    kvp_config_print_reference(f);
    fclose(f);
    static const char *const names[] = {
        "listen", "cluster_token", "max_frame_size", "lease_ttl", "put_timeout", "client_ttl",
        "eviction_high_watermark_ratio", "eviction_low_watermark_ratio", "max_key_size",
        "max_connections", "max_segments", "max_tenants", "max_objects", "log_level", "log_format",
        "allowed: \"text\", \"json\"", "master",
        "local_hostname", "protocol", "mode", "global_segment_size", "local_buffer_size",
        "enable_offload", "rpc_timeout", "replica_num", "master_server_address", "master_server_addr",
        "default_kv_lease_ttl", "metadata_server", "use_ascend_direct", "64MiB", "4GiB",
        "\"127.0.0.1:50051\"", "duration", "ratio", NULL};
    int ok = has_all(buf, names);
    free(buf);
    CHECK(ok);
}

TEST(env_path)
{
    unsetenv("KVPOOL_CONFIG");
    unsetenv("MOONCAKE_CONFIG_PATH");
    CHECK(kvp_config_path_from_env() == NULL);
    setenv("MOONCAKE_CONFIG_PATH", "/etc/mooncake.json", 1);
    CHECK(strcmp(kvp_config_path_from_env(), "/etc/mooncake.json") == 0);
    setenv("KVPOOL_CONFIG", "", 1);
    CHECK(strcmp(kvp_config_path_from_env(), "/etc/mooncake.json") == 0);
    setenv("KVPOOL_CONFIG", "/etc/kvpool.json", 1);
    CHECK(strcmp(kvp_config_path_from_env(), "/etc/kvpool.json") == 0);
}

TEST(later_sources_override)
{
    /* defaults < file < flags, key by key */
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{\"lease_ttl\": \"1s\", \"put_timeout\": \"2s\"}", err), 0);
    CHECK_EQ(kvp_config_set(&c, "--put-timeout", "3s", err, sizeof err), 0);
    CHECK(c.lease_ttl_ms == 1000);
    CHECK(c.put_timeout_ms == 3000);
    CHECK(c.rpc_timeout_ms == 10000);
}

/* Mooncake's client rules (spec §3.1): embedded needs a segment; a
 * standalone-store client given a segment size is refused; a standalone
 * client that leaves the key at its default is fine. */
TEST(embedded_and_standalone_segment_rules)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "{\"mode\": \"embedded\", \"global_segment_size\": 0}", err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "embedded mode requires global_segment_size > 0") != NULL);
    CHECK_EQ(load(&c, "{\"mode\": \"standalone-store\", \"global_segment_size\": \"1GiB\"}",
                  err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "standalone-store mode requires global_segment_size == 0") != NULL);
    CHECK_EQ(load(&c, "{\"mode\": \"standalone-store\", \"global_segment_size\": 0}", err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
    CHECK_EQ(load(&c, "{\"mode\": \"standalone-store\"}", err), 0);
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
    CHECK_EQ(load(&c, "{\"mode\": \"embedded\"}", err), 0); /* default 4 GiB */
    CHECK_EQ(kvp_config_validate(&c, err, sizeof err), 0);
}

/* Whole-line comments ('#' or '//' after blanks) are blanked before parsing:
 * accepted anywhere a line may be, never inside a string, and the positions
 * in messages are those of the file. */
TEST(whole_line_comments)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    CHECK_EQ(load(&c, "# kvpool\n{\n  // the master\n  \"listen\": \"0.0.0.0:7000\",\n"
                      "\t# a tab first\n  \"tenant\": \"a#b//c\"\n   #\n}\n// end", err), 0);
    CHECK(strcmp(c.listen, "0.0.0.0:7000") == 0);
    CHECK(strcmp(c.tenant, "a#b//c") == 0); /* inside a string: untouched */
    /* a comment after a value on its line is not a whole-line comment */
    CHECK_EQ(load(&c, "{\"listen\": \"h:1\" # no\n}", err), KVP_ECONFIG);
    CHECK(HAS(err, "config:1:", "invalid JSON"));
    /* a single '/' starts no comment */
    CHECK_EQ(load(&c, "/ x\n{}", err), KVP_ECONFIG);
    /* positions after comment lines are the file's */
    const char *bad = "# one\n// two\n{\n  # three\n  \"lease_ttl\": \"5x\"\n}\n";
    CHECK_EQ(load(&c, bad, err), KVP_ECONFIG);
    CHECK(HAS(err, "config:5:16: key \"lease_ttl\": value \"5x\""));
    CHECK_EQ(load(&c, "# one\n{\n  # two\n  \"lease_tll\": 1\n}", err), KVP_ECONFIG);
    CHECK(HAS(err, "config:4:3: unknown key \"lease_tll\""));
    CHECK_EQ(load(&c, "# a\n{\n  \"listen\": \"h:1\",\n  # b\n  ,\n}", err), KVP_ECONFIG);
    CHECK(HAS(err, "config:5:"));
    /* the same in a file */
    char path[64];
    CHECK_EQ(write_tmp(path, sizeof path, "# c\n{\n// d\n\"max_key_size\": 0\n}\n"), 0);
    kvp_config_defaults(&c);
    int rc = kvp_config_load_file(&c, path, err, sizeof err);
    unlink(path);
    CHECK_EQ(rc, KVP_ECONFIG);
    CHECK(HAS(err, ":4:17: key \"max_key_size\""));
}

/* deploy/kvpool.example.json: loads through the real loader, validates, and
 * gives every key of the table (a key added without its example fails). */
TEST(example_config_has_every_key)
{
    char path[4096] = "deploy/kvpool.example.json";
    if (access(path, R_OK) != 0) { /* not run from the repository root: from the binary */
        char exe[3000];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        CHECK(n > 0);
        exe[n] = 0;
        char *b = strstr(exe, "/build/");
        CHECK(b != NULL);
        *b = 0;
        snprintf(path, sizeof path, "%s/deploy/kvpool.example.json", exe);
    }
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN] = "";
    kvp_config_defaults(&c);
    int rc = kvp_config_load_file(&c, path, err, sizeof err);
    if (rc)
        fprintf(stderr, "    %s\n", err);
    CHECK_EQ(rc, 0);
    rc = kvp_config_validate(&c, err, sizeof err);
    if (rc)
        fprintf(stderr, "    %s\n", err);
    CHECK_EQ(rc, 0);
    size_t i = 0;
    for (const char *k; (k = kvp_config_key_name(i)) != NULL; i++)
        if (!kvp_config_was_set(&c, k)) {
            fprintf(stderr, "    %s lacks key \"%s\"\n", path, k);
            CHECK(kvp_config_was_set(&c, k));
        }
    CHECK(i > 50);
}
