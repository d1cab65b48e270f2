/*
 * ucx.c -- UCP loaded at run time; see ucx.h.
 */
#include "common/ucx.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpool.h"
#include "net/net.h"

kvp_ucx_api kvp_ucx;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_err[256]; /* "" once loaded */

static void load(void)
{
    const char *name = getenv("KVPOOL_UCX_LIB");
    if (!name || !*name)
        name = "libucp.so.0";
    /* UCX logs to stdout by default, where `kvpool get` writes the value */
    setenv("UCX_LOG_FILE", "stderr", 0);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_err, sizeof load_err, "cannot load %s (%s); install UCX (Debian: libucx0)",
                 name, e ? e : "?");
        return;
    }
    /* ucs_status_string lives in libucs, which libucp pulls in */
    void *hs = dlopen("libucs.so.0", RTLD_NOW | RTLD_LOCAL);
    struct {
        void **slot;
        const char *sym;
        void *lib;
    } t[] = {
#define S(f, s) {(void **)&kvp_ucx.f, s, h}
        S(config_read, "ucp_config_read"),
        S(config_release, "ucp_config_release"),
        S(config_modify, "ucp_config_modify"),
        S(init_version, "ucp_init_version"),
        S(cleanup, "ucp_cleanup"),
        S(worker_create, "ucp_worker_create"),
        S(worker_destroy, "ucp_worker_destroy"),
        S(worker_get_address, "ucp_worker_get_address"),
        S(worker_release_address, "ucp_worker_release_address"),
        S(worker_progress, "ucp_worker_progress"),
        S(worker_get_efd, "ucp_worker_get_efd"),
        S(worker_arm, "ucp_worker_arm"),
        S(ep_create, "ucp_ep_create"),
        S(ep_close_nbx, "ucp_ep_close_nbx"),
        S(ep_flush_nbx, "ucp_ep_flush_nbx"),
        S(put_nbx, "ucp_put_nbx"),
        S(get_nbx, "ucp_get_nbx"),
        S(request_check_status, "ucp_request_check_status"),
        S(request_free, "ucp_request_free"),
        S(mem_map, "ucp_mem_map"),
        S(mem_unmap, "ucp_mem_unmap"),
        S(rkey_pack, "ucp_rkey_pack"),
        S(rkey_buffer_release, "ucp_rkey_buffer_release"),
        S(ep_rkey_unpack, "ucp_ep_rkey_unpack"),
        S(rkey_destroy, "ucp_rkey_destroy"),
#undef S
        {(void **)&kvp_ucx.status_string, "ucs_status_string", hs ? hs : h},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        *t[i].slot = dlsym(t[i].lib, t[i].sym);
        if (!*t[i].slot) {
            snprintf(load_err, sizeof load_err, "%s has no %s (UCX older than 1.10?)", name,
                     t[i].sym);
            memset(&kvp_ucx, 0, sizeof kvp_ucx);
            return; /* the handles stay open: harmless, and dlclose is not needed */
        }
    }
}

int kvp_ucx_load(char *err, size_t errlen)
{
    pthread_once(&once, load);
    if (!kvp_ucx.init_version) {
        snprintf(err, errlen, "%s", load_err[0] ? load_err : "UCX not loaded");
        return KVP_ENOT_SUPPORTED;
    }
    return 0;
}

int kvp_ucx_context(int mt, const char *net_devices, ucp_context_h *out, char *err,
                    size_t errlen)
{
    int rc = kvp_ucx_load(err, errlen);
    if (rc)
        return rc;
    ucp_config_t *cfg = NULL;
    ucs_status_t st = kvp_ucx.config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_config_read: %s", kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    if (net_devices && *net_devices &&
        (st = kvp_ucx.config_modify(cfg, "NET_DEVICES", net_devices)) != UCS_OK) {
        kvp_ucx.config_release(cfg);
        snprintf(err, errlen, "UCX NET_DEVICES=%s: %s", net_devices, kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    ucp_params_t p = {0};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                   UCP_PARAM_FIELD_NAME;
    /* no UCP_FEATURE_WAKEUP: it would leave out the shared-memory transports
     * (they have no event fd); waiters back off instead (kvp_ucx_idle) */
    p.features = UCP_FEATURE_RMA;
    p.mt_workers_shared = mt;
    p.name = "kvpool";
    st = kvp_ucx.init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, out);
    kvp_ucx.config_release(cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_init: %s (check UCX_TLS)", kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    return 0;
}

void kvp_ucx_idle(unsigned *idle)
{
    unsigned n = (*idle)++;
    if (n < 1024) {
        sched_yield();
        return;
    }
    unsigned shift = (n - 1024) / 16; /* 16 naps at each length */
    long ns = 20000L << (shift < 6 ? shift : 6);
    struct timespec ts = {0, ns < 1000000 ? ns : 1000000};
    nanosleep(&ts, NULL);
}

int kvp_ucx_worker(ucp_context_h ctx, ucs_thread_mode_t mode, ucp_worker_h *out, char *err,
                   size_t errlen)
{
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = mode;
    ucs_status_t st = kvp_ucx.worker_create(ctx, &wp, out);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_worker_create: %s", kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    return 0;
}

/* The name of the interface whose flags have IFF_LOOPBACK, or of the one
 * carrying the address in `want` (family AF_INET / AF_INET6), into out.
 * 1 when found. */
static int find_iface(const struct ifaddrs *ifs, int loopback, int family, const void *want,
                      char *out, size_t outlen)
{
    for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_name || !i->ifa_addr)
            continue;
        int hit = 0;
        if (loopback)
            hit = (i->ifa_flags & IFF_LOOPBACK) != 0;
        else if (family == AF_INET && i->ifa_addr->sa_family == AF_INET)
            hit = !memcmp(&((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr,
                          want, 4);
        else if (family == AF_INET6 && i->ifa_addr->sa_family == AF_INET6)
            hit = !memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                          want, 16);
        if (hit && strlen(i->ifa_name) < outlen) {
            snprintf(out, outlen, "%s", i->ifa_name);
            return 1;
        }
    }
    return 0;
}

int kvp_ucx_net_devices(const char *host, int loopback_only, char *out, size_t outlen, char *err,
                        size_t errlen)
{
    out[0] = 0;
    unsigned char a[16];
    int family = 0;
    if (inet_pton(AF_INET, host, a) == 1)
        family = AF_INET;
    else if (inet_pton(AF_INET6, host, a) == 1)
        family = AF_INET6;
    int loop = loopback_only || kvp_net_is_loopback(host);
    int wild = (family == AF_INET && !memcmp(a, "\0\0\0\0", 4)) ||
               (family == AF_INET6 && !memcmp(a, &in6addr_any, 16));
    if (!loop && (!family || wild))
        return 0; /* a name or a wildcard: UCX's environment */
    const char *env = getenv("UCX_NET_DEVICES");
    if (!loop && env && *env)
        return 0; /* the operator named the devices (RDMA ones included) */
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        snprintf(err, errlen, "getifaddrs failed: cannot bind UCX to %s's interface", host);
        return KVP_ECONFIG;
    }
    int found = find_iface(ifs, loop, family, a, out, outlen);
    freeifaddrs(ifs);
    if (!found) {
        snprintf(err, errlen, "no interface of this host carries %s%s: cannot bind UCX to it",
                 loop ? "a loopback address" : host, loop ? " (loopback)" : "");
        return KVP_ECONFIG;
    }
    return 0;
}
