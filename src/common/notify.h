/*
 * notify.h -- service manager readiness notification (the sd_notify
 * protocol) without libsystemd.
 *
 * systemd (Type=notify) and other supervisors give a service the address
 * of a unix datagram socket in $NOTIFY_SOCKET: an absolute path, or "@name"
 * for a socket in the abstract namespace. The service sends it datagrams of
 * newline-separated assignments: "READY=1" once it serves, "STOPPING=1"
 * when it begins to shut down, "STATUS=free text" for `systemctl status`.
 */
#ifndef KVP_NOTIFY_H
#define KVP_NOTIFY_H

/*
 * Sends `state` (e.g. "READY=1", "STOPPING=1", "STATUS=serving") as one
 * datagram to $NOTIFY_SOCKET. The variable is read at every call and left
 * set (a forked helper would inherit it; kvpool forks none).
 *
 * Returns 0 when sent, and 0 without doing anything when $NOTIFY_SOCKET is
 * unset or empty (no supervisor asked). Errors, nothing sent:
 *   KVP_EINVALID_PARAMS  state NULL or empty
 *   KVP_ECONFIG          $NOTIFY_SOCKET neither an absolute path nor "@name",
 *                        or longer than a unix socket address holds (107
 *                        bytes; "@" alone is refused too)
 *   KVP_EIO              the socket could not be made or the send failed
 *                        (errno tells why: no listener, permission, ...)
 * Thread-safe; never blocks on a full receiver (MSG_DONTWAIT).
 */
int kvp_notify(const char *state);

#endif
