/*
 * ucx.h -- UCX's UCP API, loaded at run time (dlopen "libucp.so.0"), for
 * the one-sided "ucx" transport (client/cucx.h, node/nucx.h).
 *
 * Nothing links against UCX: a build needs only its headers (Debian
 * libucx-dev), and a process that never asks for the transport never loads
 * it (nor UCX's memory hooks). kvp_ucx_load resolves every entry point once;
 * afterwards kvp_ucx is the table, read-only. The types are UCX's own.
 *
 * Environment, read by UCX itself: UCX_TLS picks the transports (unset:
 * everything it finds -- InfiniBand / RoCE verbs, shared memory, TCP);
 * UCX_LOG_FILE defaults to stderr here (UCX's own default is stdout).
 * UCX_NET_DEVICES the NICs. KVPOOL_UCX_LIB overrides the library's name.
 */
#ifndef KVP_UCX_H
#define KVP_UCX_H

#include <stddef.h>

#include <ucp/api/ucp.h>

typedef struct kvp_ucx_api {
    ucs_status_t (*config_read)(const char *, const char *, ucp_config_t **);
    void (*config_release)(ucp_config_t *);
    ucs_status_t (*config_modify)(ucp_config_t *, const char *, const char *);
    ucs_status_t (*init_version)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *,
                                 ucp_context_h *);
    void (*cleanup)(ucp_context_h);
    ucs_status_t (*worker_create)(ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *);
    void (*worker_destroy)(ucp_worker_h);
    ucs_status_t (*worker_get_address)(ucp_worker_h, ucp_address_t **, size_t *);
    void (*worker_release_address)(ucp_worker_h, ucp_address_t *);
    unsigned (*worker_progress)(ucp_worker_h);
    ucs_status_t (*worker_get_efd)(ucp_worker_h, int *);
    ucs_status_t (*worker_arm)(ucp_worker_h);
    ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
    ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
    ucs_status_ptr_t (*ep_flush_nbx)(ucp_ep_h, const ucp_request_param_t *);
    ucs_status_ptr_t (*put_nbx)(ucp_ep_h, const void *, size_t, uint64_t, ucp_rkey_h,
                                const ucp_request_param_t *);
    ucs_status_ptr_t (*get_nbx)(ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h,
                                const ucp_request_param_t *);
    ucs_status_t (*request_check_status)(void *);
    void (*request_free)(void *);
    ucs_status_t (*mem_map)(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *);
    ucs_status_t (*mem_unmap)(ucp_context_h, ucp_mem_h);
    ucs_status_t (*rkey_pack)(ucp_context_h, ucp_mem_h, void **, size_t *);
    void (*rkey_buffer_release)(void *);
    ucs_status_t (*ep_rkey_unpack)(ucp_ep_h, const void *, ucp_rkey_h *);
    void (*rkey_destroy)(ucp_rkey_h);
    const char *(*status_string)(ucs_status_t);
} kvp_ucx_api;

extern kvp_ucx_api kvp_ucx;

/* Loads UCP once (thread-safe; later calls answer the first's result).
 * 0, or KVP_ENOT_SUPPORTED with the reason in err (no library, a missing
 * symbol). */
int kvp_ucx_load(char *err, size_t errlen);

/* A UCP context with RMA (mt: shared by threads), from UCX's environment.
 * net_devices (NULL = UCX's environment, UCX_NET_DEVICES) overrides the
 * network devices UCX may use, and so where its TCP transport listens:
 * "lo" keeps it on loopback (kvp_ucx_net_devices). No wakeup feature: it
 * would exclude UCX's shared-memory transports, so whoever waits on a
 * worker polls it, backing off with kvp_ucx_idle. 0 or KVP_ENOT_SUPPORTED
 * (reason in err). */
int kvp_ucx_context(int mt, const char *net_devices, ucp_context_h *out, char *err,
                    size_t errlen);

/*
 * The network devices a listener's UCX may use, from the host it listens
 * on (an IP address, numeric), into out:
 *   - loopback (127.0.0.0/8, ::1), or loopback_only (no credential: the
 *     loopback-only rule of common/secret.h): the loopback interface ("lo");
 *   - an address of this host's: the interface that carries it (a
 *     UCX_NET_DEVICES of the operator's own wins: RDMA devices have names
 *     of their own, "mlx5_0:1", which no IP address maps to);
 *   - a wildcard (0.0.0.0, ::) or a name: "" (UCX's environment decides).
 * 0, or KVP_ECONFIG (err says why: an address no interface here carries).
 */
int kvp_ucx_net_devices(const char *host, int loopback_only, char *out, size_t outlen, char *err,
                        size_t errlen);

/* A worker of ctx in `mode` (UCS_THREAD_MODE_*). 0 or KVP_ENOT_SUPPORTED. */
int kvp_ucx_worker(ucp_context_h ctx, ucs_thread_mode_t mode, ucp_worker_h *out, char *err,
                   size_t errlen);
/* One idle turn of a worker's polling loop (*idle: turns since the worker
 * last made progress; reset it to 0 on progress): yields for the first 1024
 * (about a millisecond when nothing else wants the core; UCX's shared-memory
 * transports need the peer's worker polled promptly: waiting by naps at once
 * cost gets 40 %), then naps from 20 us doubling to 1 ms, so an idle worker
 * costs about a thousand wake-ups a second and an active one stays responsive. */
void kvp_ucx_idle(unsigned *idle);
#endif
