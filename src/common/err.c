/* err.c -- the error table's messages and names. */
#include "kvpool.h"

const char *kvp_strerror(int err)
{
    switch (err) {
#define KVP__ERR_MSG(name, num, msg) case num: return msg;
    KVP_ERRNO_MAP(KVP__ERR_MSG)
#undef KVP__ERR_MSG
    }
    return "unknown error";
}

const char *kvp_err_name(int err)
{
    switch (err) {
#define KVP__ERR_NAME(name, num, msg) case num: return #name;
    KVP_ERRNO_MAP(KVP__ERR_NAME)
#undef KVP__ERR_NAME
    }
    return "UNKNOWN";
}

const char *kvp_version(void) { return KVPOOL_VERSION_STRING; }
