/*
 * fuzz_config.c -- libFuzzer target for the configuration parsers.
 *
 * The input, made NUL-terminated, is fed to kvp_config_load_string (over
 * defaults; when accepted, kvp_config_validate must not crash either), to
 * kvp_config_set as the value of one key per type, and to kvp_size_parse /
 * kvp_duration_parse. Invariants checked: a parser that succeeds produced a
 * value that formats, a duration with a unit ignores the bare-number unit,
 * an error always comes with a terminated message, and
 * nothing leaks (counted allocator back to its starting level).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    uint64_t before = kvp_mem_used();

    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    err[0] = '\0';
    int rc = kvp_config_load_string(&c, s, err, sizeof err);
    if (rc != 0 && (err[0] == '\0' || memchr(err, '\0', sizeof err) == NULL))
        abort();
    if (rc == 0)
        (void)kvp_config_validate(&c, err, sizeof err);

    static const char *const keys[] = {"listen", "max_frame_size", "lease_ttl", "client_ttl",
                                       "eviction_high_watermark_ratio", "max_key_size",
                                       "enable_offload", "log_level", "protocol"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        err[0] = '\0';
        if (kvp_config_set(&c, keys[i], s, err, sizeof err) != 0 && err[0] == '\0')
            abort();
    }
    err[0] = '\0';
    if (kvp_config_set(&c, s, "1", err, sizeof err) != 0 && err[0] == '\0')
        abort();

    uint64_t v;
    char buf[32];
    if (kvp_size_parse(s, &v) == 0)
        kvp_size_format(v, buf, sizeof buf);
    /* A duration with an explicit unit does not depend on the bare-number unit. */
    uint64_t ms1 = 0, ms1000 = 0;
    int r1 = kvp_duration_parse(s, 1, &ms1);
    int r1000 = kvp_duration_parse(s, 1000, &ms1000);
    size_t len = strlen(s); /* the input may hold NUL bytes */
    if (r1 == 0 && r1000 == 0 && len > 0 && (s[len - 1] < '0' || s[len - 1] > '9') &&
        ms1 != ms1000)
        abort();

    if (kvp_mem_used() != before)
        abort();
    free(s);
    return 0;
}
