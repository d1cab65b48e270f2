/*
 * nucx.h -- the storage node's side of the "ucx" transport: the segment
 * registered with UCP once, and a thread that progresses the node's UCP
 * worker.
 *
 * One-sided: a client puts and gets bytes straight into the segment through
 * the remote key (rkey) this node hands out in its UCX_ATTACH answer; the
 * node's CPU does no work per transfer on RDMA hardware. Over UCX's TCP or
 * shared-memory transports (UCX_TLS=tcp / sm) UCX emulates some operations
 * in software, which needs the target's worker progressed: hence the
 * thread, which naps (up to 1 ms) while no request comes.
 *
 * Trust (docs/SECURITY.md): the rkey covers the whole segment, like the
 * memfd a same-host client receives; the node gives it only to connections
 * that passed HELLO (cluster token). Checksums, verified by every reader,
 * catch a stale or hostile write. Revocation: kvp_nucx_stop deregisters the
 * memory (an RDMA NIC then refuses the old rkey); a node's registration
 * lives as long as the node.
 *
 * With InfiniBand / RoCE without on-demand paging, registration pins (and so
 * faults in) the whole segment when the node starts.
 */
#ifndef KVP_NUCX_H
#define KVP_NUCX_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_nucx kvp_nucx;

/* Registers [base, base + size) and starts the progress thread; UCX uses
 * only net_devices (kvp_ucx_net_devices; NULL or "" = UCX's environment).
 * 0, or KVP_ENOT_SUPPORTED / KVP_ENOMEM with the reason in err (no UCX, no
 * usable transport). */
int kvp_nucx_start(uint8_t *base, uint64_t size, const char *net_devices, kvp_nucx **out,
                   char *err, size_t errlen);

/* Stops the thread, deregisters the memory, frees. NULL is a no-op. */
void kvp_nucx_stop(kvp_nucx *u);

/* The encoded UCX_ATTACH answer body (kvp_msg_ucx_attach): valid until
 * kvp_nucx_stop. */
const uint8_t *kvp_nucx_attach_body(const kvp_nucx *u, uint32_t *len);
#endif
