/* test_node_addr.c -- the address a storage node registers (src/node/node.c
 * node_addr): a wildcard listen advertises the address facing the master
 * unless local_hostname is set; the route-source helper and the loopback
 * test of src/net/net.c. Real `kvpool store` processes against a real
 * `kvpool master` on 127.0.0.1. (Two hosts: tests/python/test_multihost.py.) */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "kvpool.h"
#include "net/net.h"
#include "proc.h"

/* Starts a store with extra flags, returns the name it registered. */
static int store_name(const char *master, const char *const *extra, char *out, size_t len)
{
    tp_store s;
    REQUIRE(tp_store_start(&s, master, extra) == 0);
    int rc = tp_master_seg_list(master, NULL, out, len) == 1 ? 0 : -1;
    printf("  %s %s -> %s\n", extra[0], extra[1], rc ? "?" : out);
    int st = tp_store_stop(&s);
    REQUIRE(rc == 0);
    REQUIRE(st == 0);
    return 0;
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

TEST(wildcard_listen_advertises_the_address_facing_the_master)
{
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    char name[320];
    /* 0.0.0.0 cannot be dialled: the name is the address the master is
     * reached from (here loopback), not the default local_hostname */
    CHECK_EQ(store_name(m.addr, (const char *[]){"--listen", "0.0.0.0:0", "--insecure", NULL},
                        name, sizeof name), 0);
    CHECK(starts_with(name, "127.0.0.1:"));
    CHECK(strcmp(name, "127.0.0.1:0") != 0);
    /* an explicit local_hostname wins */
    CHECK_EQ(store_name(m.addr, (const char *[]){"--listen", "0.0.0.0:0", "--insecure",
                                                 "--local-hostname", "localhost", NULL},
                        name, sizeof name), 0);
    CHECK(starts_with(name, "localhost:"));
    /* a specific listen host is its own name */
    CHECK_EQ(store_name(m.addr, (const char *[]){"--listen", "127.0.0.1:0", NULL}, name,
                        sizeof name), 0);
    CHECK(starts_with(name, "127.0.0.1:"));
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(no_listen_with_a_loopback_master_stays_on_loopback)
{
    /* one machine: no credential needed, the segment on localhost as before */
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    const char *args[] = {"--master", m.addr, "--segment-size", "64MiB", NULL};
    tp_master s;
    CHECK_EQ(tp_store_spawn(&s, args), 0);
    char name[320] = "";
    uint64_t end = tp_now_ms() + 10000;
    while (tp_now_ms() < end && tp_master_seg_list(m.addr, NULL, name, sizeof name) != 1)
        tp_sleep_ms(50);
    printf("  no --listen -> %s\n", name);
    CHECK(starts_with(name, "localhost:"));
    CHECK_EQ(tp_master_stop(&s), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(source_address_and_loopback)
{
    char host[64], err[256];
    CHECK_EQ(kvp_net_source_for("127.0.0.1:9", host, sizeof host, err, sizeof err), 0);
    CHECK(strcmp(host, "127.0.0.1") == 0);
    CHECK_EQ(kvp_net_source_for("127.3.4.5:9", host, sizeof host, err, sizeof err), 0);
    CHECK(kvp_net_is_loopback(host));
    CHECK_EQ(kvp_net_source_for("no-port", host, sizeof host, err, sizeof err),
             KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "no-port") != NULL);
    CHECK_EQ(kvp_net_source_for("nosuchhost.invalid:1", host, sizeof host, err, sizeof err),
             KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "nosuchhost.invalid") != NULL);
    CHECK(kvp_net_is_loopback("localhost"));
    CHECK(kvp_net_is_loopback("127.0.0.1"));
    CHECK(kvp_net_is_loopback("::1"));
    CHECK(kvp_net_is_loopback("::ffff:127.0.0.2"));
    CHECK(!kvp_net_is_loopback("10.0.0.1"));
    CHECK(!kvp_net_is_loopback("0.0.0.0"));
    CHECK(!kvp_net_is_loopback("::"));
    CHECK(!kvp_net_is_loopback("node7"));
}
