/*
 * test_config_roles.c -- who reads each configuration key (the role mask
 * the command line refuses flags by), the boolean words a flag takes, and
 * kvp_config_was_set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "harness.h"
#include "kvpool.h"

#define M KVP_KEY_MASTER
#define N KVP_KEY_NODE
#define C KVP_KEY_CLIENT
#define A KVP_KEY_ADMIN

/* The roles follow the code that reads each field (src/master, src/node,
 * src/client, src/cli/cmd_admin.c); '-' and '_' and aliases alike. */
TEST(roles_follow_the_readers)
{
    static const struct {
        const char *name;
        int roles;
    } want[] = {
        {"listen", M},
        {"lease_ttl", M},
        {"default_kv_lease_ttl", M},
        {"client-ttl", M},
        {"tenant_tokens_file", M},
        {"max_key_size", M | C},
        {"hello_timeout", M | N},
        {"insecure", M | N},
        {"node_token_file", M | N},
        {"idle_timeout", N},
        {"enable-offload", N},
        {"offload_file_storage_path", N},
        {"global_segment_size", N},
        {"shm_group", N},
        {"master", N | C | A},
        {"master_server_address", N | C | A},
        {"rpc_timeout", N | C | A},
        {"tenant_token_file", N | C | A},
        {"tenant", C | A},
        {"tenant_id", C | A},
        {"protocol", N | C},
        {"mode", C},
        {"replica_num", C},
        {"preferred_segment", C},
        {"cluster_token_file", M | N | C | A},
        {"log_level", M | N | C | A},
        {"log_format", M | N | C | A},
        {"local_buffer_size", 0}, /* nobody reads it: a Mooncake file's key */
        {"device_name", 0},       /* Mooncake, no such component */
        {"lease_tll", -1},
        {"", -1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int r = kvp_config_key_roles(want[i].name);
        if (r != want[i].roles)
            fprintf(stderr, "    %s: roles %d, want %d\n", want[i].name, r, want[i].roles);
        CHECK_EQ(r, want[i].roles);
    }
    char b[160];
    CHECK(!strcmp(kvp_config_roles_text(M, b, sizeof b), "kvpool serve, master"));
    CHECK(!strcmp(kvp_config_roles_text(N, b, sizeof b), "kvpool serve, store"));
    CHECK(!strcmp(kvp_config_roles_text(C | A, b, sizeof b),
                  "kvpool stat, reset, put, get, exist, rm"));
    CHECK(!strcmp(kvp_config_roles_text(M | N | C | A, b, sizeof b), "every command"));
    CHECK(!strcmp(kvp_config_roles_text(0, b, sizeof b), "no kvpool command"));
}

/* A flag's boolean: true/false/1/0/yes/no/on/off in any case, nothing else;
 * a file keeps JSON's true/false and "true"/"false". */
TEST(boolean_words)
{
    static const char *const yes[] = {"true", "TRUE", "1", "yes", "Yes", "on", "ON"};
    static const char *const no[] = {"false", "False", "0", "no", "NO", "off", "Off"};
    static const char *const bad[] = {"", "2", "y", "n", "enable", "truee", " true", "01"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        CHECK_EQ(kvp_config_bool_word(yes[i]), 1);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        CHECK_EQ(kvp_config_bool_word(no[i]), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_EQ(kvp_config_bool_word(bad[i]), -1);
    CHECK_EQ(kvp_config_bool_word(NULL), -1);

    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    CHECK_EQ(kvp_config_set(&c, "enable-offload", "ON", err, sizeof err), 0);
    CHECK_EQ(c.enable_offload, 1);
    CHECK_EQ(kvp_config_set(&c, "enable_offload", "0", err, sizeof err), 0);
    CHECK_EQ(c.enable_offload, 0);
    CHECK_EQ(kvp_config_set(&c, "insecure", "yes", err, sizeof err), 0);
    CHECK_EQ(c.insecure, 1);
    CHECK_EQ(kvp_config_set(&c, "insecure", "maybe", err, sizeof err), KVP_ECONFIG);
    CHECK(!strcmp(err, "flag --insecure: value \"maybe\" is not a boolean (allowed: true, false, "
                       "1, 0, yes, no, on, off (any case))"));
    CHECK_EQ(c.insecure, 1); /* unchanged */
    /* a file: JSON booleans and "true"/"false" only */
    CHECK_EQ(kvp_config_load_string(&c, "{\"enable_offload\": \"yes\"}", err, sizeof err),
             KVP_ECONFIG);
    CHECK_EQ(kvp_config_load_string(&c, "{\"enable_offload\": true}", err, sizeof err), 0);
    CHECK_EQ(c.enable_offload, 1);
}

/* kvp_config_was_set: a key given by a file or a flag, under any of its
 * names; defaults are not "set". */
TEST(was_set)
{
    kvp_config c;
    char err[KVP_CONFIG_ERRLEN];
    kvp_config_defaults(&c);
    CHECK(!kvp_config_was_set(&c, "tenant"));
    CHECK(!kvp_config_was_set(&c, "no_such_key"));
    CHECK(!kvp_config_was_set(NULL, "tenant"));
    CHECK_EQ(kvp_config_load_string(&c, "{\"tenant_id\": \"teamX\"}", err, sizeof err), 0);
    CHECK(kvp_config_was_set(&c, "tenant") && kvp_config_was_set(&c, "tenant-id"));
    CHECK(!kvp_config_was_set(&c, "master"));
    CHECK_EQ(kvp_config_set(&c, "master-server-addr", "h:1", err, sizeof err), 0);
    CHECK(kvp_config_was_set(&c, "master"));
}

/* The flag list of a role: its keys as --key-name, no secret, no skipped key. */
TEST(print_flags)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    kvp_config_print_flags(f, KVP_KEY_ADMIN, (const char *const[]){"rpc_timeout", NULL}, 2);
    fclose(f);
    CHECK(strstr(buf, "  --cluster-token-file") == buf);
    CHECK(strstr(buf, "--tenant-token-file") && strstr(buf, "--tenant\n") &&
          strstr(buf, "--master "));
    CHECK(!strstr(buf, "--tenant-token ") && !strstr(buf, "--cluster-token ") &&
          !strstr(buf, "--rpc-timeout") && !strstr(buf, "--lease-ttl"));
    for (char *l = buf; *l;) { /* wrapped at 80 columns */
        char *e = strchr(l, '\n');
        CHECK(e != NULL && e - l < 80);
        if (!e)
            break;
        l = e + 1;
    }
    free(buf);
}
