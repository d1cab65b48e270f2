/*
 * net.h -- socket helpers: address parsing, listen, connect with deadline.
 * Addresses are "host:port" (IPv4 dotted or a name resolved once) or
 * "[v6addr]:port". Errors go to a caller buffer of KVP_NET_ERRLEN bytes.
 */
#ifndef KVP_NET_H
#define KVP_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define KVP_NET_ERRLEN 256

/* Splits "host:port"; host and port NUL-terminated copies. 0 or KVP_EINVALID_PARAMS. */
int kvp_net_split(const char *addr, char *host, size_t hostlen, uint16_t *port);
/* Non-blocking listening TCP socket; *port_out gets the bound port (useful
 * with port 0). Returns the fd or a negative KVP_E* code. */
int kvp_net_listen(const char *addr, int backlog, uint16_t *port_out, char *err, size_t errlen);
/* Blocking-mode connected TCP socket with TCP_NODELAY, connect bounded by
 * timeout_ms. Returns the fd or KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT / KVP_EINVALID_PARAMS. */
int kvp_net_connect(const char *addr, int timeout_ms, char *err, size_t errlen);
int kvp_net_set_nonblock(int fd, int on);
/* Waits until fd is ready for ev (POLLIN / POLLOUT) or the deadline
 * (kvp_now_ms clock) passes. 0, KVP_ERPC_TIMEOUT, or KVP_EIO (poll failed). */
int kvp_net_wait(int fd, short ev, uint64_t deadline_ms);
void kvp_net_set_nodelay(int fd);
/* Is host (no port, no brackets) the name "localhost" or a loopback
 * address (127/8, ::1, ::ffff:127/104)? */
int kvp_net_is_loopback(const char *host);
/* The local address this machine sends from to reach addr ("host:port",
 * resolved once): the address of a UDP socket connected there, which sends
 * nothing. Numeric, without brackets, into host. 0, or KVP_EINVALID_PARAMS
 * (a bad or unresolvable address) / KVP_EIO (no route) with a message. */
int kvp_net_source_for(const char *addr, char *host, size_t hostlen, char *err, size_t errlen);
/* A peer's address as "HOST:PORT" ("[ADDR]:PORT" for IPv6, "?" for another
 * family), for log lines (kvp_log_set_peer); KVP_NET_PEERLEN is enough. */
#define KVP_NET_PEERLEN 64
void kvp_net_peer_text(const struct sockaddr_storage *ss, char *out, size_t outlen);
#endif
