/*
 * test_quota.c -- the tenant tokens file's per-tenant options (quotas and
 * fair-eviction share), parsed by kvp_secret_tenants_load.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mem.h"
#include "common/secret.h"
#include "harness.h"
#include "kvpool.h"

/* Tenant lines take options after the token: quotas and a share; an
 * unknown, repeated or malformed option is an error naming the line. */
TEST(tenant_tokens_options)
{
    char path[] = "/tmp/kvp-tenant-opts-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *txt = "alice tok-a max_bytes=4GiB max_objects=1000 share=3\n"
                      "bob tok-b\n"
                      "carol tok-c share=2 max_bytes=512MiB\n";
    CHECK(write(fd, txt, strlen(txt)) == (ssize_t)strlen(txt));
    close(fd);
    CHECK(chmod(path, 0600) == 0);
    kvp_tenant_cred *t = NULL;
    size_t n = 0;
    char err[512];
    CHECK_EQ(kvp_secret_tenants_load(path, &t, &n, err, sizeof err), 0);
    CHECK_EQ(n, 3);
    if (n == 3) {
        CHECK(t[0].max_bytes == 4ull << 30 && t[0].max_objects == 1000 && t[0].share == 3);
        CHECK(t[1].max_bytes == 0 && t[1].max_objects == 0 && t[1].share == 1);
        CHECK(t[2].max_bytes == 512ull << 20 && t[2].share == 2 && !strcmp(t[2].token, "tok-c"));
    }
    kvp_free(t);
    static const char *const bad[] = {"a tok max_bytes=\n", "a tok share=1000001\n",
                                      "a tok max_objects=-1\n", "a tok share=1 share=2\n",
                                      "a tok nonsense\n", "a tok max_objects=12x\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fd = open(path, O_WRONLY | O_TRUNC);
        CHECK(fd >= 0);
        CHECK(write(fd, bad[i], strlen(bad[i])) == (ssize_t)strlen(bad[i]));
        close(fd);
        t = NULL;
        CHECK_EQ(kvp_secret_tenants_load(path, &t, &n, err, sizeof err), KVP_ECONFIG);
        CHECK(strstr(err, ":1:") != NULL);
        kvp_free(t);
    }
    unlink(path);
}
