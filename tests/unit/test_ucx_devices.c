/* test_ucx_devices.c -- kvp_ucx_net_devices (src/common/ucx.c): the network
 * device a node's UCX is limited to, from its listen host. Needs no UCX
 * library (it only reads this host's interfaces). */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ucx.h"
#include "harness.h"
#include "kvpool.h"

/* The loopback interface's name, "" when none. */
static void loopback_name(char *out, size_t len)
{
    struct ifaddrs *ifs = NULL;
    out[0] = 0;
    if (getifaddrs(&ifs) != 0)
        return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (i->ifa_name && (i->ifa_flags & IFF_LOOPBACK)) {
            snprintf(out, len, "%s", i->ifa_name);
            break;
        }
    freeifaddrs(ifs);
}

TEST(loopback_and_no_credential_mean_the_loopback_device)
{
    char lo[IF_NAMESIZE + 1], dev[IF_NAMESIZE + 1], err[256];
    loopback_name(lo, sizeof lo);
    if (!lo[0])
        SKIP("no loopback interface");
    setenv("UCX_NET_DEVICES", "eth0,mlx5_0:1", 1); /* the operator's choice loses on loopback */
    CHECK_EQ(kvp_ucx_net_devices("127.0.0.1", 0, dev, sizeof dev, err, sizeof err), 0);
    CHECK(strcmp(dev, lo) == 0);
    CHECK_EQ(kvp_ucx_net_devices("localhost", 0, dev, sizeof dev, err, sizeof err), 0);
    CHECK(strcmp(dev, lo) == 0);
    /* no credential: loopback whatever the address (the listener rule) */
    CHECK_EQ(kvp_ucx_net_devices("0.0.0.0", 1, dev, sizeof dev, err, sizeof err), 0);
    CHECK(strcmp(dev, lo) == 0);
    unsetenv("UCX_NET_DEVICES");
}

TEST(wildcards_names_and_foreign_addresses)
{
    char dev[IF_NAMESIZE + 1], err[256];
    unsetenv("UCX_NET_DEVICES");
    CHECK_EQ(kvp_ucx_net_devices("0.0.0.0", 0, dev, sizeof dev, err, sizeof err), 0);
    CHECK_EQ(dev[0], 0);
    CHECK_EQ(kvp_ucx_net_devices("::", 0, dev, sizeof dev, err, sizeof err), 0);
    CHECK_EQ(dev[0], 0);
    CHECK_EQ(kvp_ucx_net_devices("node7.example", 0, dev, sizeof dev, err, sizeof err), 0);
    CHECK_EQ(dev[0], 0);
    /* an address no interface here carries (TEST-NET-3) */
    err[0] = 0;
    CHECK_EQ(kvp_ucx_net_devices("203.0.113.77", 0, dev, sizeof dev, err, sizeof err),
             KVP_ECONFIG);
    CHECK(strstr(err, "203.0.113.77") != NULL);
}

/* Every IPv4 address of this host maps to the interface carrying it. */
TEST(an_address_maps_to_its_interface)
{
    struct ifaddrs *ifs = NULL;
    CHECK(getifaddrs(&ifs) == 0);
    unsetenv("UCX_NET_DEVICES");
    int n = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        char host[INET_ADDRSTRLEN], dev[IF_NAMESIZE + 1], err[256];
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, host,
                  sizeof host);
        if (kvp_ucx_net_devices(host, 0, dev, sizeof dev, err, sizeof err) != 0 ||
            strcmp(dev, i->ifa_name) != 0)
            th_fail(__FILE__, __LINE__, "%s: got '%s', want %s", host, dev, i->ifa_name);
        /* the operator's UCX_NET_DEVICES wins beyond loopback (RDMA devices) */
        setenv("UCX_NET_DEVICES", "mlx5_0:1", 1);
        if (kvp_ucx_net_devices(host, 0, dev, sizeof dev, err, sizeof err) != 0 || dev[0])
            th_fail(__FILE__, __LINE__, "%s with UCX_NET_DEVICES: got '%s'", host, dev);
        unsetenv("UCX_NET_DEVICES");
        n++;
    }
    freeifaddrs(ifs);
    printf("  %d non-loopback IPv4 addresses checked\n", n);
}
