/*
 * kvpool.h -- public API of libkvpool.
 *
 * Conventions (apply to every function declared here):
 *  - Functions return int: 0 on success, a negative KVP_E* code on failure.
 *    The numbers match Mooncake Store's ErrorCode where the meaning is the
 *    same, so code written against Mooncake keeps working.
 *  - Handles are opaque; their lifetimes are stated next to the function
 *    that creates them.
 *  - Error text, where offered, goes into a caller buffer of fixed size.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVPOOL_VERSION_MAJOR 0
#define KVPOOL_VERSION_MINOR 1
#define KVPOOL_VERSION_PATCH 0
#define KVPOOL_VERSION_STRING "0.1.0"

/*
 * The one error table. XX(NAME, number, message).
 * Mooncake's numbers for shared meanings; kvpool's own codes live in the
 * -2000 range, outside both errno and Mooncake's ranges.
 */
#define KVP_ERRNO_MAP(XX)                                                      \
    XX(OK, 0, "success")                                                       \
    XX(INTERNAL_ERROR, -1, "internal error")                                   \
    XX(BUFFER_OVERFLOW, -10, "buffer too small")                               \
    XX(SEGMENT_NOT_FOUND, -101, "segment not found")                           \
    XX(SEGMENT_ALREADY_EXISTS, -102, "segment already exists")                 \
    XX(CLIENT_NOT_FOUND, -103, "client not found")                             \
    XX(NO_AVAILABLE_HANDLE, -200, "no space: nothing evictable would make room") \
    XX(INVALID_VERSION, -300, "protocol version not supported")                \
    XX(INVALID_KEY, -400, "invalid key")                                       \
    XX(WRITE_FAIL, -500, "write failed")                                       \
    XX(INVALID_PARAMS, -600, "invalid parameters")                             \
    XX(ILLEGAL_CLIENT, -601, "operation not allowed for this client")          \
    XX(INVALID_WRITE, -700, "invalid write")                                   \
    XX(INVALID_READ, -701, "invalid read")                                     \
    XX(INVALID_REPLICA, -702, "invalid replica")                               \
    XX(REPLICA_IS_NOT_READY, -703, "object is being written")                  \
    XX(OBJECT_NOT_FOUND, -704, "object not found")                             \
    XX(OBJECT_ALREADY_EXISTS, -705, "object already exists")                   \
    XX(OBJECT_HAS_LEASE, -706, "object has an active lease")                   \
    XX(LEASE_EXPIRED, -707, "lease expired")                                   \
    XX(TRANSFER_FAIL, -800, "transfer failed")                                 \
    XX(CHECKSUM_MISMATCH, -801, "checksum mismatch")                           \
    XX(RPC_FAIL, -900, "rpc failed")                                           \
    XX(RPC_TIMEOUT, -901, "rpc timed out")                                     \
    XX(NOT_SUPPORTED, -1012, "not supported")                                  \
    XX(FILE_NOT_FOUND, -1100, "file not found")                                \
    XX(FILE_OPEN_FAIL, -1101, "cannot open file")                              \
    XX(FILE_READ_FAIL, -1102, "cannot read file")                              \
    XX(FILE_WRITE_FAIL, -1103, "cannot write file")                            \
    XX(NOMEM, -2001, "out of memory")                                          \
    XX(PROTOCOL, -2002, "malformed message")                                   \
    XX(AUTH, -2003, "authentication failed: wrong cluster token")              \
    XX(TOO_LARGE, -2004, "message exceeds the maximum frame size")             \
    XX(CONFIG, -2005, "invalid configuration")                                 \
    XX(AGAIN, -2006, "try again")                                              \
    XX(IO, -2007, "i/o error")                                                 \
    XX(CLOSED, -2008, "connection closed")                                     \
    XX(UNKNOWN_OP, -2009, "unknown operation")                                 \
    XX(NO_HELLO, -2010, "HELLO required before any other operation")           \
    XX(LIMIT, -2011, "a configured limit was reached")                         \
    XX(OBJECT_PINNED, -2012, "object is pinned: remove it with force")

enum kvp_errno {
#define KVP__ERR_ENUM(name, num, msg) KVP_E##name = (num),
    KVP_ERRNO_MAP(KVP__ERR_ENUM)
#undef KVP__ERR_ENUM
};
#define KVP_OK KVP_EOK

/* Message for an error code; never NULL ("unknown error" for unknown codes). */
const char *kvp_strerror(int err);
/* Symbolic name ("OBJECT_NOT_FOUND") for an error code; never NULL. */
const char *kvp_err_name(int err);

/* Library version string, e.g. "0.1.0". */
const char *kvp_version(void);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_H */
