/*
 * _conn.c -- kvpool._native's connector types over include/kvpool_connector.h:
 * ConnRequest, ConnSched (the scheduler half) and ConnWorker (one rank's
 * worker half). kvpool/vllm.py translates vLLM's objects into calls on
 * these; every decision stays in the C connector.
 *
 * Contracts
 *  - ConnRequest keeps a request's token ids and block hashes in C. sync()
 *    reads only the items past what it already holds, so a step costs what is
 *    new for the request, not its whole context (vLLM's all_token_ids and
 *    block_hashes only grow; a shorter list truncates).
 *  - Configuration dicts are validated here: an unknown key, a wrong type or
 *    a value out of range raises ValueError / TypeError naming the key; the
 *    C open checks the rest (OpenError(code, message)).
 *  - Calls that may block (a lookup waiting for rank 0, handle_preemptions
 *    waiting for stores, get_finished, close) release the GIL; the others
 *    are short and keep it. A ConnRequest used by a call in flight without
 *    the GIL refuses sync() (RuntimeError) instead of moving its buffers.
 *  - Runtime failures of the C calls raise ConnError(code, name).
 *  - The fence: with fence="cuda" the worker's store thread waits on the
 *    CUDA event set for a step (set_fence_event) before it reads KV memory,
 *    through the driver API loaded at run time (cuEventSynchronize), never
 *    taking the GIL. Events are kept in a ring of FENCE_RING steps; a step
 *    whose event was overwritten waits on the oldest newer one (the engine
 *    records them in order on one stream, so that one completes later).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "_native.h"
#include "kvpool.h"
#include "kvpool_connector.h"

static PyObject *ConnError;
static PyObject *OpenErr;

static PyObject *conn_error(int rc)
{
    PyObject *v = Py_BuildValue("(is)", rc, kvp_err_name(rc));
    if (v) {
        PyErr_SetObject(ConnError, v);
        Py_DECREF(v);
    }
    return NULL;
}

/* ============================================================ small parsers */

/* A Python int in [0, max] into *out; -1 with an exception naming `what`. */
static int as_u64(PyObject *o, const char *what, uint64_t max, uint64_t *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s out of range", what);
        return -1;
    }
    if (v > max) {
        PyErr_Format(PyExc_ValueError, "%s out of range (at most %llu)", what,
                     (unsigned long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

/* PyArg "O&" converter: a non-negative int below 2^64 into a uint64_t. */
static int conv_u64(PyObject *o, void *out)
{
    return as_u64(o, "argument", UINT64_MAX, out) == 0;
}

/* The same into a uint32_t. */
static int conv_u32(PyObject *o, void *out)
{
    uint64_t v;
    if (as_u64(o, "argument", UINT32_MAX, &v) < 0)
        return 0;
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}

/* UTF-8 of a str, no NUL inside; borrowed from o. */
static const char *as_id(PyObject *o, const char *what, Py_ssize_t *len)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return NULL;
    }
    const char *s = PyUnicode_AsUTF8AndSize(o, len);
    if (s && (*len == 0 || *len > UINT32_MAX || memchr(s, 0, (size_t)*len))) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-empty str without NUL", what);
        return NULL;
    }
    return s;
}

/*
 * Per-call scratch memory: every allocation of one call, freed together.
 * The C API borrows what it is given for the call only.
 */
typedef struct {
    void **p;
    size_t n, cap;
} scratch;

static void *scratch_alloc(scratch *s, size_t bytes)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        void **np = PyMem_Realloc(s->p, cap * sizeof *np);
        if (!np)
            return PyErr_NoMemory();
        s->p = np;
        s->cap = cap;
    }
    void *m = PyMem_Calloc(1, bytes ? bytes : 1);
    if (!m)
        return PyErr_NoMemory();
    s->p[s->n++] = m;
    return m;
}

static void scratch_free(scratch *s)
{
    for (size_t i = 0; i < s->n; i++)
        PyMem_Free(s->p[i]);
    PyMem_Free(s->p);
    s->p = NULL;
    s->n = s->cap = 0;
}

/* A tuple/list of per-group block id lists into ngroups kvp_conn_blocks;
 * None -> *out NULL, 0 groups. Block ids are < 2^32. */
static int parse_blocks(scratch *sc, PyObject *o, kvp_conn_blocks **out, uint32_t *ngroups)
{
    *out = NULL;
    *ngroups = 0;
    if (o == Py_None)
        return 0;
    PyObject *groups = PySequence_Fast(o, "block ids must be a sequence of per-group lists");
    if (!groups)
        return -1;
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(groups);
    int rc = -1;
    if (ng > 64) {
        PyErr_SetString(PyExc_ValueError, "at most 64 KV-cache groups");
        goto out;
    }
    kvp_conn_blocks *b = scratch_alloc(sc, (size_t)ng * sizeof *b);
    if (!b)
        goto out;
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyObject *ids = PySequence_Fast(PySequence_Fast_GET_ITEM(groups, g),
                                        "a group's block ids must be a sequence of ints");
        if (!ids)
            goto out;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
        uint32_t *v = n > UINT32_MAX ? NULL : scratch_alloc(sc, (size_t)n * sizeof *v);
        for (Py_ssize_t i = 0; v && i < n; i++) {
            uint64_t x;
            if (as_u64(PySequence_Fast_GET_ITEM(ids, i), "block id", UINT32_MAX, &x) < 0) {
                v = NULL;
                break;
            }
            v[i] = (uint32_t)x;
        }
        Py_DECREF(ids);
        if (!v) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "too many block ids");
            goto out;
        }
        b[g] = (kvp_conn_blocks){.ids = v, .n = (uint32_t)n};
    }
    *out = b;
    *ngroups = (uint32_t)ng;
    rc = 0;
out:
    Py_DECREF(groups);
    return rc;
}

/* A sequence of str into n kvp_conn_str (borrowed from the items, which the
 * returned tuple keeps alive; the caller releases it). */
static PyObject *parse_ids(scratch *sc, PyObject *o, const char *what, kvp_conn_str **out,
                           uint32_t *n)
{
    PyObject *t = PySequence_Tuple(o);
    if (!t)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(t);
    kvp_conn_str *v = k > UINT32_MAX ? NULL : scratch_alloc(sc, (size_t)k * sizeof *v);
    if (!v) {
        Py_DECREF(t);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t len;
        const char *s = as_id(PyTuple_GET_ITEM(t, i), what, &len);
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        v[i] = (kvp_conn_str){.p = s, .len = (uint32_t)len};
    }
    *out = v;
    *n = (uint32_t)k;
    return t;
}

/* ============================================================= ConnRequest */

typedef struct {
    PyObject_HEAD
    char *id;
    uint32_t id_len;
    uint32_t *tok;
    uint32_t ntok, cap_tok;
    uint32_t nprompt;
    uint8_t *hash;
    uint32_t nhash, cap_hash;
    uint8_t hash_len;
    uint64_t num_computed;
    int busy; /* calls reading the buffers without the GIL (guarded by the GIL) */
} ConnRequest;

static PyTypeObject ConnRequestType;

static int Req_init(ConnRequest *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"req_id", "num_prompt_tokens", NULL};
    PyObject *ido;
    uint64_t np;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&:ConnRequest", names, &ido, conv_u64, &np))
        return -1;
    if (self->id) {
        PyErr_SetString(PyExc_RuntimeError, "ConnRequest.__init__ may run only once");
        return -1;
    }
    Py_ssize_t len;
    const char *s = as_id(ido, "req_id", &len);
    if (!s)
        return -1;
    if (np > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "num_prompt_tokens out of range");
        return -1;
    }
    self->id = PyMem_Malloc((size_t)len + 1);
    if (!self->id) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(self->id, s, (size_t)len);
    self->id[len] = 0;
    self->id_len = (uint32_t)len;
    self->nprompt = (uint32_t)np;
    return 0;
}

static void Req_dealloc(ConnRequest *self)
{
    PyMem_Free(self->id);
    PyMem_Free(self->tok);
    PyMem_Free(self->hash);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int grow(void **buf, uint32_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    if (need > UINT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "request too long");
        return -1;
    }
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *p = PyMem_Realloc(*buf, c * elem);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = (uint32_t)c;
    return 0;
}

/* Item i of a sequence: a borrowed reference for lists (no copy of the
 * list), a new one otherwise (*own set). */
static PyObject *seq_item(PyObject *seq, Py_ssize_t i, int *own)
{
    if (PyList_Check(seq)) {
        *own = 0;
        return PyList_GET_ITEM(seq, i);
    }
    *own = 1;
    return PySequence_GetItem(seq, i);
}

static int sync_tokens(ConnRequest *self, PyObject *seq)
{
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return -1;
    if ((size_t)n < self->ntok) /* only grows in vLLM; be robust */
        self->ntok = (uint32_t)n;
    if (grow((void **)&self->tok, &self->cap_tok, (size_t)n, sizeof *self->tok) < 0)
        return -1;
    for (Py_ssize_t i = self->ntok; i < n; i++) {
        int own;
        PyObject *it = seq_item(seq, i, &own);
        if (!it)
            return -1;
        uint64_t v;
        int rc = as_u64(it, "token id", UINT32_MAX, &v);
        if (own)
            Py_DECREF(it);
        if (rc < 0)
            return -1;
        self->tok[i] = (uint32_t)v;
        self->ntok = (uint32_t)i + 1;
    }
    return 0;
}

static int sync_hashes(ConnRequest *self, PyObject *seq)
{
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return -1;
    if ((size_t)n < self->nhash)
        self->nhash = (uint32_t)n;
    for (Py_ssize_t i = self->nhash; i < n; i++) {
        int own;
        PyObject *it = seq_item(seq, i, &own);
        if (!it)
            return -1;
        Py_buffer b;
        int rc = PyObject_GetBuffer(it, &b, PyBUF_SIMPLE);
        if (own)
            Py_DECREF(it);
        if (rc < 0)
            return -1;
        if (b.len < 1 || b.len > 64 || (self->hash_len && b.len != self->hash_len)) {
            PyBuffer_Release(&b);
            PyErr_SetString(PyExc_ValueError,
                            "block hashes must be 1..64 bytes, all of one length");
            return -1;
        }
        self->hash_len = (uint8_t)b.len;
        if (grow((void **)&self->hash, &self->cap_hash, ((size_t)i + 1) * (size_t)b.len, 1) < 0) {
            PyBuffer_Release(&b);
            return -1;
        }
        memcpy(self->hash + (size_t)i * self->hash_len, b.buf, (size_t)b.len);
        PyBuffer_Release(&b);
        self->nhash = (uint32_t)i + 1;
    }
    return 0;
}

static PyObject *Req_sync(ConnRequest *self, PyObject *args)
{
    PyObject *toks, *hashes;
    uint64_t nc;
    if (!PyArg_ParseTuple(args, "OOO&:sync", &toks, &hashes, conv_u64, &nc))
        return NULL;
    if (!self->id) {
        PyErr_SetString(PyExc_RuntimeError, "ConnRequest not initialised");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "ConnRequest is in use by a call in flight");
        return NULL;
    }
    if (sync_tokens(self, toks) < 0 || sync_hashes(self, hashes) < 0)
        return NULL;
    if (self->ntok < self->nprompt) {
        PyErr_SetString(PyExc_ValueError, "fewer token ids than prompt tokens");
        return NULL;
    }
    self->num_computed = nc;
    Py_RETURN_NONE;
}

static PyObject *Req_get_id(ConnRequest *self, void *unused)
{
    return self->id ? PyUnicode_FromStringAndSize(self->id, self->id_len) : Py_NewRef(Py_None);
}

static PyObject *Req_get_ntok(ConnRequest *self, void *unused) { return PyLong_FromUnsignedLong(self->ntok); }
static PyObject *Req_get_nhash(ConnRequest *self, void *unused) { return PyLong_FromUnsignedLong(self->nhash); }

static int req_view(PyObject *o, kvp_conn_request *r)
{
    if (!PyObject_TypeCheck(o, &ConnRequestType) || !((ConnRequest *)o)->id) {
        PyErr_SetString(PyExc_TypeError, "expected an initialised kvpool._native.ConnRequest");
        return -1;
    }
    ConnRequest *q = (ConnRequest *)o;
    *r = (kvp_conn_request){
        .id = {q->id, q->id_len}, .tokens = q->tok, .num_tokens = q->ntok,
        .prompt_tokens = q->tok, .num_prompt_tokens = q->nprompt,
        .num_computed_tokens = q->num_computed, .block_hashes = q->hash,
        .nhashes = q->nhash, .hash_len = q->hash_len,
    };
    return 0;
}

static PyMethodDef Req_methods[] = {
    {"sync", (PyCFunction)Req_sync, METH_VARARGS,
     "sync(all_token_ids, block_hashes, num_computed_tokens): appends the items past those "
     "already held (lists are read in place)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Req_getset[] = {
    {"req_id", (getter)Req_get_id, NULL, "the request id", NULL},
    {"num_tokens", (getter)Req_get_ntok, NULL, "token ids held", NULL},
    {"num_hashes", (getter)Req_get_nhash, NULL, "block hashes held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ConnRequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._native.ConnRequest",
    .tp_basicsize = sizeof(ConnRequest),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ConnRequest(req_id, num_prompt_tokens): a request's tokens and block hashes in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Req_init,
    .tp_dealloc = (destructor)Req_dealloc,
    .tp_methods = Req_methods,
    .tp_getset = Req_getset,
};

/* ================================================================= config */

typedef struct {
    kvp_conn_config c;
    kvp_conn_group groups[64];
    int gids[64]; /* engine_group_ids */
    Py_ssize_t ngids; /* how many were given (-1: none) */
    PyObject *keep; /* a list holding the objects the strings borrow from */
    int fence_cuda;
} config;

static int cfg_str(config *k, PyObject *v, const char *key, const char **out)
{
    if (v == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", key);
        return -1;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(v, &len);
    if (!s)
        return -1;
    if (memchr(s, 0, (size_t)len)) {
        PyErr_Format(PyExc_ValueError, "%s must not contain NUL", key);
        return -1;
    }
    if (PyList_Append(k->keep, v) < 0)
        return -1;
    *out = s;
    return 0;
}

static int cfg_bool(PyObject *v, const char *key, bool *out)
{
    if (!PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be a bool", key);
        return -1;
    }
    *out = v == Py_True;
    return 0;
}

static int cfg_int(PyObject *v, const char *key, uint64_t max, uint64_t *out)
{
    return as_u64(v, key, max, out);
}

static int cfg_group(PyObject *d, kvp_conn_group *g)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "each group must be a dict");
        return -1;
    }
    *g = (kvp_conn_group){0};
    PyObject *key, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &v)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        uint64_t x;
        if (!k) {
            PyErr_SetString(PyExc_TypeError, "group keys must be str");
            return -1;
        }
        if (!strcmp(k, "kind")) {
            const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
            if (s && !strcmp(s, "full_attention"))
                g->kind = KVP_CONN_FULL_ATTENTION;
            else if (s && !strcmp(s, "sliding_window"))
                g->kind = KVP_CONN_SLIDING_WINDOW;
            else if (s && !strcmp(s, "mamba"))
                g->kind = KVP_CONN_MAMBA;
            else {
                PyErr_SetString(PyExc_ValueError,
                                "group kind must be full_attention, sliding_window or mamba");
                return -1;
            }
        } else if (!strcmp(k, "block_size")) {
            if (cfg_int(v, "group block_size", UINT32_MAX, &x) < 0)
                return -1;
            g->block_size = (uint32_t)x;
        } else if (!strcmp(k, "sliding_window")) {
            if (cfg_int(v, "group sliding_window", UINT32_MAX, &x) < 0)
                return -1;
            g->sliding_window = (uint32_t)x;
        } else if (!strcmp(k, "num_kv_heads")) {
            if (cfg_int(v, "group num_kv_heads", UINT32_MAX, &x) < 0)
                return -1;
            g->num_kv_heads = (uint32_t)x;
        } else if (!strcmp(k, "mla")) {
            if (cfg_bool(v, "group mla", &g->mla) < 0)
                return -1;
        } else if (!strcmp(k, "is_eagle")) {
            if (cfg_bool(v, "group is_eagle", &g->is_eagle) < 0)
                return -1;
        } else {
            PyErr_Format(PyExc_ValueError, "unknown group key %R", key);
            return -1;
        }
    }
    return 0;
}

/* The scalar keys of the connector config: name, kind, field, largest value. */
enum cfg_kind { CK_BOOL, CK_U32, CK_INT, CK_SIZE, CK_U64, CK_I64, CK_STR };
static const struct cfg_key {
    const char *name;
    enum cfg_kind kind;
    size_t off;
    uint64_t max;
} CFG_KEYS[] = {
#define K(n, kind, max) {#n, kind, offsetof(kvp_conn_config, n), max}
    K(model, CK_STR, 0),
    K(hash_block_size, CK_U32, UINT32_MAX),
    K(block_size, CK_U32, UINT32_MAX),
    K(enable_lookup, CK_BOOL, 1),
    K(load_async, CK_BOOL, 1),
    K(lookup_async, CK_BOOL, 1),
    K(partial_hash_hits, CK_BOOL, 1),
    K(cache_prefix, CK_STR, 0),
    K(lookup_socket, CK_STR, 0),
    K(lookup_timeout_ms, CK_U32, UINT32_MAX),
    K(store_config, CK_STR, 0),
    K(tp_size, CK_INT, 1 << 20),
    K(tp_rank, CK_INT, 1 << 20),
    K(pp_size, CK_INT, 1 << 20),
    K(pp_rank, CK_INT, 1 << 20),
    K(pcp_size, CK_INT, 1 << 20),
    K(pcp_rank, CK_INT, 1 << 20),
    K(dcp_size, CK_INT, 1 << 20),
    K(dcp_rank, CK_INT, 1 << 20),
    K(use_eagle, CK_BOOL, 1),
    K(num_blocks, CK_SIZE, UINT32_MAX),
    K(recv_threads, CK_U32, 64),
    K(staging_budget, CK_U64, UINT64_MAX),
    K(kv_events, CK_BOOL, 1),
    K(pool_blocks, CK_BOOL, 1),
    K(lookup_gid, CK_I64, UINT32_MAX - 1), /* absent: -1, no group */
    K(config_fingerprint, CK_STR, 0),      /* checked by kvp_conn_*_open */
    K(config_description, CK_STR, 0),
    K(save_decode_cache, CK_BOOL, 1),
    K(tp_independent, CK_BOOL, 1),
#undef K
};

/* One scalar key into its field; 1 when n is not a scalar key, 0, -1 on error. */
static int cfg_scalar(config *k, const char *n, PyObject *v)
{
    for (size_t i = 0; i < sizeof CFG_KEYS / sizeof CFG_KEYS[0]; i++) {
        const struct cfg_key *e = &CFG_KEYS[i];
        if (strcmp(n, e->name) != 0)
            continue;
        char *f = (char *)&k->c + e->off;
        uint64_t x;
        if (e->kind == CK_STR)
            return cfg_str(k, v, n, (const char **)f);
        if (e->kind == CK_BOOL)
            return cfg_bool(v, n, (bool *)f);
        if (cfg_int(v, n, e->max, &x) < 0)
            return -1;
        switch (e->kind) {
        case CK_U32: *(uint32_t *)f = (uint32_t)x; break;
        case CK_INT: *(int *)f = (int)x; break;
        case CK_SIZE: *(size_t *)f = (size_t)x; break;
        case CK_I64: *(int64_t *)f = (int64_t)x; break;
        default: *(uint64_t *)f = x; break;
        }
        return 0;
    }
    return 1;
}

static int cfg_parse(config *k, PyObject *d)
{
    kvp_conn_config *c = &k->c;
    kvp_conn_config_default(c);
    k->fence_cuda = 0;
    k->ngids = -1;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "config must be a dict");
        return -1;
    }
    if (!(k->keep = PyList_New(0)))
        return -1;
    PyObject *key, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &v)) {
        const char *n = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!n) {
            PyErr_SetString(PyExc_TypeError, "config keys must be str");
            return -1;
        }
        int rc = cfg_scalar(k, n, v);
        if (rc < 0)
            return -1;
        if (rc == 0)
            continue;
        if (!strcmp(n, "role")) {
            const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
            if (s && !strcmp(s, "kv_producer"))
                c->role = KVP_CONN_PRODUCER;
            else if (s && !strcmp(s, "kv_consumer"))
                c->role = KVP_CONN_CONSUMER;
            else if (s && !strcmp(s, "kv_both"))
                c->role = KVP_CONN_BOTH;
            else {
                PyErr_SetString(PyExc_ValueError,
                                "role must be kv_producer, kv_consumer or kv_both");
                return -1;
            }
        } else if (!strcmp(n, "groups")) {
            PyObject *t = PySequence_Fast(v, "groups must be a list of dicts");
            if (!t)
                return -1;
            Py_ssize_t ng = PySequence_Fast_GET_SIZE(t);
            if (ng < 1 || ng > 64) {
                Py_DECREF(t);
                PyErr_SetString(PyExc_ValueError, "need 1..64 groups");
                return -1;
            }
            for (Py_ssize_t i = 0; i < ng; i++)
                if (cfg_group(PySequence_Fast_GET_ITEM(t, i), &k->groups[i]) < 0) {
                    Py_DECREF(t);
                    return -1;
                }
            Py_DECREF(t);
            c->groups = k->groups;
            c->ngroups = (size_t)ng;
        } else if (!strcmp(n, "engine_group_ids")) {
            PyObject *t = PySequence_Fast(v, "engine_group_ids must be a list of ints");
            if (!t)
                return -1;
            Py_ssize_t ng = PySequence_Fast_GET_SIZE(t);
            if (ng > 64) {
                Py_DECREF(t);
                PyErr_SetString(PyExc_ValueError, "engine_group_ids: at most 64");
                return -1;
            }
            for (Py_ssize_t i = 0; i < ng; i++) {
                uint64_t x;
                if (cfg_int(PySequence_Fast_GET_ITEM(t, i), "engine_group_ids", INT32_MAX, &x) <
                    0) {
                    Py_DECREF(t);
                    return -1;
                }
                k->gids[i] = (int)x;
            }
            Py_DECREF(t);
            c->engine_group_ids = k->gids;
            k->ngids = ng;
        } else if (!strcmp(n, "fence")) {
            const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
            if (v == Py_None || (s && !strcmp(s, "none")))
                k->fence_cuda = 0;
            else if (s && !strcmp(s, "cuda"))
                k->fence_cuda = 1;
            else {
                PyErr_SetString(PyExc_ValueError, "fence must be None, 'none' or 'cuda'");
                return -1;
            }
        } else {
            PyErr_Format(PyExc_ValueError, "unknown connector config key %R", key);
            return -1;
        }
    }
    if (k->ngids >= 0 && (size_t)k->ngids != c->ngroups) {
        PyErr_SetString(PyExc_ValueError, "engine_group_ids: one per group");
        return -1;
    }
    return 0;
}

static int open_failed(int rc, const char *err)
{
    PyObject *v = Py_BuildValue("(is)", rc, err[0] ? err : kvp_strerror(rc));
    if (v) {
        PyErr_SetObject(OpenErr, v);
        Py_DECREF(v);
    }
    return -1;
}

/* ============================================================== ConnSched */

typedef struct {
    PyObject_HEAD
    kvp_conn_sched *s;
    pthread_mutex_t mu; /* one C call at a time (the handle is single-threaded) */
    int init_done;
} ConnSched;

/* Takes self->mu; releases the GIL only while waiting for it (a lookup in
 * flight holds it without the GIL). */
static void sched_lock(ConnSched *self)
{
    if (pthread_mutex_trylock(&self->mu) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *Sched_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    ConnSched *self = (ConnSched *)type->tp_alloc(type, 0);
    if (self) {
        pthread_mutex_init(&self->mu, NULL);
        self->init_done = 1;
    }
    return (PyObject *)self;
}

static int Sched_init(ConnSched *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"config", NULL};
    PyObject *d;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:ConnSched", names, &d))
        return -1;
    if (self->s) {
        PyErr_SetString(PyExc_RuntimeError, "ConnSched.__init__ may run only once");
        return -1;
    }
    config k = {0};
    int ret = -1;
    if (cfg_parse(&k, d) == 0) {
        char err[512] = "";
        int rc = kvp_conn_sched_open(&k.c, &self->s, err, sizeof err);
        ret = rc ? open_failed(rc, err) : 0;
    }
    Py_XDECREF(k.keep);
    return ret;
}

static void Sched_close_(ConnSched *self)
{
    sched_lock(self);
    kvp_conn_sched *s = self->s;
    self->s = NULL;
    pthread_mutex_unlock(&self->mu);
    kvp_conn_sched_close(s);
}

static void Sched_dealloc(ConnSched *self)
{
    if (self->init_done) {
        Sched_close_(self);
        pthread_mutex_destroy(&self->mu);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Sched_close(ConnSched *self, PyObject *unused)
{
    Sched_close_(self);
    Py_RETURN_NONE;
}

static int sched_open(ConnSched *self)
{
    if (self->s)
        return 0;
    pthread_mutex_unlock(&self->mu);
    conn_error(KVP_ECLOSED);
    return -1;
}

/* lookup(req, num_computed_tokens) -> (num_new | None, load_async) */
static PyObject *Sched_lookup(ConnSched *self, PyObject *args)
{
    PyObject *ro;
    uint64_t nc;
    if (!PyArg_ParseTuple(args, "OO&:lookup", &ro, conv_u64, &nc))
        return NULL;
    kvp_conn_request r;
    if (req_view(ro, &r) < 0)
        return NULL;
    ConnRequest *q = (ConnRequest *)ro;
    sched_lock(self);
    if (sched_open(self) < 0)
        return NULL;
    uint64_t num_new = 0;
    bool async = false;
    int rc;
    q->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_conn_get_num_new_matched_tokens(self->s, &r, nc, &num_new, &async);
    Py_END_ALLOW_THREADS
    q->busy--;
    pthread_mutex_unlock(&self->mu);
    if (rc == KVP_CONN_PENDING)
        return Py_BuildValue("(OO)", Py_None, Py_False);
    if (rc < 0)
        return conn_error(rc);
    return Py_BuildValue("(KO)", (unsigned long long)num_new, async ? Py_True : Py_False);
}

static PyObject *Sched_after_alloc(ConnSched *self, PyObject *args)
{
    PyObject *ro, *bo;
    uint64_t next;
    if (!PyArg_ParseTuple(args, "OOO&:update_state_after_alloc", &ro, &bo, conv_u64, &next))
        return NULL;
    kvp_conn_request r;
    if (req_view(ro, &r) < 0)
        return NULL;
    scratch sc = {0};
    kvp_conn_blocks *b;
    uint32_t ng;
    if (parse_blocks(&sc, bo, &b, &ng) < 0) {
        scratch_free(&sc);
        return NULL;
    }
    sched_lock(self);
    int rc = KVP_ECLOSED;
    if (self->s)
        rc = kvp_conn_update_state_after_alloc(self->s, &r, b, ng, next);
    pthread_mutex_unlock(&self->mu);
    scratch_free(&sc);
    if (rc < 0)
        return conn_error(rc);
    Py_RETURN_NONE;
}

/* new_reqs: [(ConnRequest, num_scheduled_tokens, blocks[, num_prefill_tokens])]: the
 * prefill is the prompt, or the first num_prefill_tokens tokens held (vLLM's v2
 * model runner resumes a preempted request as a new one: prompt + generated) */
static int parse_new(scratch *sc, PyObject *o, kvp_conn_new_req **out, uint32_t *n,
                     kvp_conn_request **reqs)
{
    PyObject *t = PySequence_Fast(o, "new_reqs must be a sequence");
    if (!t)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(t);
    kvp_conn_new_req *v = scratch_alloc(sc, (size_t)k * sizeof *v);
    kvp_conn_request *rq = scratch_alloc(sc, (size_t)k * sizeof *rq);
    int rc = v && rq ? 0 : -1;
    for (Py_ssize_t i = 0; rc == 0 && i < k; i++) {
        PyObject *ro, *bo, *po = Py_None;
        uint64_t ns;
        PyObject *it = PySequence_Fast_GET_ITEM(t, i);
        kvp_conn_blocks *b;
        uint32_t ng;
        if (!PyTuple_Check(it) ||
            !PyArg_ParseTuple(it, "OO&O|O:new_req", &ro, conv_u64, &ns, &bo, &po) ||
            req_view(ro, &rq[i]) < 0 || parse_blocks(sc, bo, &b, &ng) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError,
                                "new_reqs items are (ConnRequest, num_scheduled_tokens, blocks"
                                "[, num_prefill_tokens])");
            rc = -1;
            break;
        }
        if (po != Py_None) { /* the prefill is the first n tokens held (a v2 resume) */
            unsigned long long np = PyLong_AsUnsignedLongLong(po);
            if (PyErr_Occurred() || np > rq[i].num_tokens || np < rq[i].num_prompt_tokens) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "num_prefill_tokens must lie between the "
                                                  "prompt's and the held token count");
                rc = -1;
                break;
            }
            rq[i].num_prompt_tokens = (uint32_t)np;
        }
        v[i] = (kvp_conn_new_req){.req = &rq[i], .num_scheduled_tokens = ns, .blocks = b,
                                  .ngroups = ng};
    }
    Py_DECREF(t);
    *out = v;
    *n = (uint32_t)k;
    *reqs = rq;
    return rc;
}

/* cached: [(ConnRequest, resumed, num_scheduled_tokens, blocks | None)] */
static int parse_cached(scratch *sc, PyObject *o, kvp_conn_cached_req **out, uint32_t *n)
{
    PyObject *t = PySequence_Fast(o, "cached must be a sequence");
    if (!t)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(t);
    kvp_conn_cached_req *v = scratch_alloc(sc, (size_t)k * sizeof *v);
    kvp_conn_request *rq = scratch_alloc(sc, (size_t)k * sizeof *rq);
    int rc = v && rq ? 0 : -1;
    for (Py_ssize_t i = 0; rc == 0 && i < k; i++) {
        PyObject *ro, *bo;
        int resumed;
        uint64_t ns;
        PyObject *it = PySequence_Fast_GET_ITEM(t, i);
        kvp_conn_blocks *b;
        uint32_t ng;
        if (!PyTuple_Check(it) ||
            !PyArg_ParseTuple(it, "OpO&O:cached_req", &ro, &resumed, conv_u64, &ns, &bo) ||
            req_view(ro, &rq[i]) < 0 || parse_blocks(sc, bo, &b, &ng) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "cached items are (ConnRequest, resumed, "
                                                 "num_scheduled_tokens, blocks or None)");
            rc = -1;
            break;
        }
        v[i] = (kvp_conn_cached_req){.req = &rq[i], .resumed = resumed != 0,
                                     .num_scheduled_tokens = ns, .blocks = b, .ngroups = ng};
    }
    Py_DECREF(t);
    *out = v;
    *n = (uint32_t)k;
    return rc;
}

/* tails: [(req_id, [(group, cow_block_id, boundary_tokens)])] */
static PyObject *parse_tails(scratch *sc, PyObject *o, kvp_conn_tail_req **out, uint32_t *n)
{
    PyObject *t = PySequence_Tuple(o);
    if (!t)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(t);
    kvp_conn_tail_req *v = scratch_alloc(sc, (size_t)k * sizeof *v);
    if (!v)
        goto fail;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *it = PyTuple_GET_ITEM(t, i), *ido, *lo;
        if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "OO:tail_req", &ido, &lo))
            goto fail;
        Py_ssize_t len;
        const char *id = as_id(ido, "tail req_id", &len);
        PyObject *l = id ? PySequence_Fast(lo, "tails must be a sequence") : NULL;
        if (!l)
            goto fail;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(l);
        kvp_conn_tail *tl = scratch_alloc(sc, (size_t)m * sizeof *tl);
        for (Py_ssize_t j = 0; tl && j < m; j++) {
            uint32_t g, bid;
            uint64_t bt;
            PyObject *e = PySequence_Fast_GET_ITEM(l, j);
            if (!PyTuple_Check(e) ||
                !PyArg_ParseTuple(e, "O&O&O&:tail", conv_u32, &g, conv_u32, &bid, conv_u64, &bt)) {
                tl = NULL;
                break;
            }
            tl[j] = (kvp_conn_tail){.group = g, .cow_block_id = bid, .boundary_tokens = bt};
        }
        Py_DECREF(l);
        if (!tl)
            goto fail;
        v[i] = (kvp_conn_tail_req){.id = {id, (uint32_t)len}, .tails = tl, .ntails = (uint32_t)m};
    }
    *out = v;
    *n = (uint32_t)k;
    return t;
fail:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError,
                        "tails items are (req_id, [(group, cow_block_id, boundary_tokens)])");
    Py_DECREF(t);
    return NULL;
}

/* build_meta(new_reqs, cached, preempted, finished, tails) -> bytes */
static PyObject *Sched_build_meta(ConnSched *self, PyObject *args)
{
    PyObject *no, *co, *po, *fo, *to;
    if (!PyArg_ParseTuple(args, "OOOOO:build_meta", &no, &co, &po, &fo, &to))
        return NULL;
    scratch sc = {0};
    kvp_conn_step st = {0};
    kvp_conn_request *rq = NULL;
    kvp_conn_str *pre = NULL, *fin = NULL;
    PyObject *keep1 = NULL, *keep2 = NULL, *keep3 = NULL, *res = NULL;
    if (parse_new(&sc, no, (kvp_conn_new_req **)&st.new_reqs, &st.n_new, &rq) < 0 ||
        parse_cached(&sc, co, (kvp_conn_cached_req **)&st.cached, &st.n_cached) < 0 ||
        !(keep1 = parse_ids(&sc, po, "preempted id", &pre, &st.n_preempted)) ||
        !(keep2 = parse_ids(&sc, fo, "finished id", &fin, &st.n_finished)) ||
        !(keep3 = parse_tails(&sc, to, (kvp_conn_tail_req **)&st.tails, &st.n_tails)))
        goto out;
    st.preempted = pre;
    st.finished = fin;
    sched_lock(self);
    const uint8_t *bytes = NULL;
    size_t len = 0;
    int rc = KVP_ECLOSED;
    if (self->s)
        rc = kvp_conn_build_meta(self->s, &st, &bytes, &len);
    if (rc == 0)
        res = PyBytes_FromStringAndSize((const char *)bytes, (Py_ssize_t)len);
    pthread_mutex_unlock(&self->mu);
    if (rc < 0)
        conn_error(rc);
out:
    Py_XDECREF(keep1);
    Py_XDECREF(keep2);
    Py_XDECREF(keep3);
    scratch_free(&sc);
    return res;
}

/* request_finished(req_id, blocks) -> delay_free */
static PyObject *Sched_finished(ConnSched *self, PyObject *args)
{
    PyObject *ido, *bo;
    if (!PyArg_ParseTuple(args, "OO:request_finished", &ido, &bo))
        return NULL;
    Py_ssize_t len;
    const char *id = as_id(ido, "req_id", &len);
    if (!id)
        return NULL;
    scratch sc = {0};
    kvp_conn_blocks *b;
    uint32_t ng;
    if (parse_blocks(&sc, bo, &b, &ng) < 0) {
        scratch_free(&sc);
        return NULL;
    }
    bool delay = false;
    sched_lock(self);
    int rc = KVP_ECLOSED;
    if (self->s)
        rc = kvp_conn_request_finished(self->s, (kvp_conn_str){id, (uint32_t)len}, b, ng, &delay);
    pthread_mutex_unlock(&self->mu);
    scratch_free(&sc);
    if (rc < 0)
        return conn_error(rc);
    return PyBool_FromLong(delay);
}

/* register_finished_tail(req_id, blocks, [(group, block_id, boundary_tokens)]) -> queued */
static PyObject *Sched_finished_tail(ConnSched *self, PyObject *args)
{
    PyObject *ido, *bo, *to;
    if (!PyArg_ParseTuple(args, "OOO:register_finished_tail", &ido, &bo, &to))
        return NULL;
    scratch sc = {0};
    kvp_conn_blocks *b;
    uint32_t ng;
    kvp_conn_tail_req *tr = NULL;
    uint32_t ntr = 0;
    PyObject *item = Py_BuildValue("(OO)", ido, to); /* parse_tails' shape: one request */
    PyObject *pair = item ? PyTuple_Pack(1, item) : NULL;
    PyObject *keep = NULL, *res = NULL;
    Py_XDECREF(item);
    if (!pair || parse_blocks(&sc, bo, &b, &ng) < 0 ||
        !(keep = parse_tails(&sc, pair, &tr, &ntr)) || ntr != 1)
        goto out;
    bool queued = false;
    sched_lock(self);
    int rc = KVP_ECLOSED;
    if (self->s)
        rc = kvp_conn_register_finished_tail(self->s, tr[0].id, b, ng, tr[0].tails,
                                             tr[0].ntails, &queued);
    pthread_mutex_unlock(&self->mu);
    res = rc < 0 ? conn_error(rc) : PyBool_FromLong(queued);
out:
    Py_XDECREF(keep);
    Py_XDECREF(pair);
    scratch_free(&sc);
    return res;
}

/* loads_failed(req_ids, block_ids): what the workers reported failing */
static PyObject *Sched_loads_failed(ConnSched *self, PyObject *args)
{
    PyObject *io, *bo;
    if (!PyArg_ParseTuple(args, "OO:loads_failed", &io, &bo))
        return NULL;
    scratch sc = {0};
    kvp_conn_str *ids = NULL;
    uint32_t nids = 0;
    PyObject *keep = parse_ids(&sc, io, "request id", &ids, &nids);
    PyObject *res = NULL;
    if (!keep)
        goto out;
    PyObject *blk = PyTuple_Pack(1, bo); /* one "group" of block ids */
    kvp_conn_blocks *b = NULL;
    uint32_t ng = 0;
    int bad = !blk || parse_blocks(&sc, blk, &b, &ng) < 0;
    Py_XDECREF(blk);
    if (bad)
        goto out;
    sched_lock(self);
    int rc = KVP_ECLOSED;
    if (self->s)
        rc = kvp_conn_loads_failed(self->s, ids, nids, b[0].ids, b[0].n);
    pthread_mutex_unlock(&self->mu);
    res = rc < 0 ? conn_error(rc) : Py_NewRef(Py_None);
out:
    Py_XDECREF(keep);
    scratch_free(&sc);
    return res;
}

static PyObject *Sched_reset(ConnSched *self, PyObject *unused)
{
    sched_lock(self);
    if (sched_open(self) < 0)
        return NULL;
    bool ok;
    Py_BEGIN_ALLOW_THREADS
    ok = kvp_conn_reset_cache(self->s);
    Py_END_ALLOW_THREADS
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(ok);
}

static PyMethodDef Sched_methods[] = {
    {"lookup", (PyCFunction)Sched_lookup, METH_VARARGS,
     "lookup(req, num_computed_tokens) -> (num_new_tokens | None while pending, load_async)"},
    {"update_state_after_alloc", (PyCFunction)Sched_after_alloc, METH_VARARGS,
     "update_state_after_alloc(req, blocks_per_group, num_external_tokens)"},
    {"build_meta", (PyCFunction)Sched_build_meta, METH_VARARGS,
     "build_meta(new_reqs, cached, preempted, finished, tails) -> the step's bytes"},
    {"request_finished", (PyCFunction)Sched_finished, METH_VARARGS,
     "request_finished(req_id, blocks_per_group) -> delay_free"},
    {"register_finished_tail", (PyCFunction)Sched_finished_tail, METH_VARARGS,
     "register_finished_tail(req_id, blocks, tails) -> queued: a finish-time boundary-state "
     "hand-off stored by the next build_meta (request_finished then delays the free)"},
    {"loads_failed", (PyCFunction)Sched_loads_failed, METH_VARARGS,
     "loads_failed(req_ids, block_ids): those requests miss on later lookups (recompute)"},
    {"reset_cache", (PyCFunction)Sched_reset, METH_NOARGS,
     "reset_cache() -> True when the pool was emptied"},
    {"close", (PyCFunction)Sched_close, METH_NOARGS, "close()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ConnSchedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._native.ConnSched",
    .tp_basicsize = sizeof(ConnSched),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ConnSched(config): the scheduler half of the connector (kvpool_connector.h)",
    .tp_new = Sched_new,
    .tp_init = (initproc)Sched_init,
    .tp_dealloc = (destructor)Sched_dealloc,
    .tp_methods = Sched_methods,
};

/* ============================================================ CUDA fence */

#define FENCE_RING 64

typedef int (*cu_sync_fn)(void *event);

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static cu_sync_fn cu_event_sync;

static void cuda_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h)
        cu_event_sync = (cu_sync_fn)dlsym(h, "cuEventSynchronize");
}

typedef struct {
    pthread_mutex_t mu;
    uint64_t step[FENCE_RING]; /* 0 = empty */
    void *event[FENCE_RING];
} fence_ring;

/* The store thread: waits for the event of `step` (or the oldest newer one).
 * No event recorded at or after it: nothing to wait for. */
static int cuda_fence(void *arg, uint64_t step)
{
    fence_ring *f = arg;
    void *ev = NULL;
    uint64_t best = UINT64_MAX;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < FENCE_RING; i++)
        if (f->step[i] >= step && f->step[i] < best) {
            best = f->step[i];
            ev = f->event[i];
        }
    pthread_mutex_unlock(&f->mu);
    if (!ev)
        return 0;
    return cu_event_sync && cu_event_sync(ev) == 0 ? 0 : 1;
}

/* ============================================================= ConnWorker */

typedef struct {
    PyObject_HEAD
    kvp_conn_worker *w;
    pthread_rwlock_t rw; /* calls hold it shared; close exclusive */
    fence_ring fence;
    int fence_cuda;
    int init_done;
} ConnWorker;

static PyObject *Worker_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    ConnWorker *self = (ConnWorker *)type->tp_alloc(type, 0);
    if (self) {
        pthread_rwlock_init(&self->rw, NULL);
        pthread_mutex_init(&self->fence.mu, NULL);
        self->init_done = 1;
    }
    return (PyObject *)self;
}

static int Worker_init(ConnWorker *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"config", NULL};
    PyObject *d;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:ConnWorker", names, &d))
        return -1;
    if (self->w) {
        PyErr_SetString(PyExc_RuntimeError, "ConnWorker.__init__ may run only once");
        return -1;
    }
    config k = {0};
    int ret = -1;
    if (cfg_parse(&k, d) == 0) {
        if (k.fence_cuda) {
            pthread_once(&cuda_once, cuda_load);
            if (!cu_event_sync) {
                PyErr_SetString(PyExc_RuntimeError,
                                "fence='cuda' needs the CUDA driver (libcuda.so.1 with "
                                "cuEventSynchronize); it could not be loaded");
                Py_XDECREF(k.keep);
                return -1;
            }
            k.c.fence = cuda_fence;
            k.c.fence_arg = &self->fence;
            self->fence_cuda = 1;
        }
        char err[512] = "";
        int rc;
        kvp_conn_worker *w = NULL;
        Py_BEGIN_ALLOW_THREADS
        rc = kvp_conn_worker_open(&k.c, &w, err, sizeof err);
        Py_END_ALLOW_THREADS
        self->w = w;
        ret = rc ? open_failed(rc, err) : 0;
    }
    Py_XDECREF(k.keep);
    return ret;
}

static void Worker_close_(ConnWorker *self)
{
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->rw);
    kvp_conn_worker *w = self->w;
    self->w = NULL;
    kvp_conn_worker_close(w); /* finishes queued transfers (the fence may wait) */
    pthread_rwlock_unlock(&self->rw);
    Py_END_ALLOW_THREADS
}

static void Worker_dealloc(ConnWorker *self)
{
    if (self->init_done) {
        Worker_close_(self);
        pthread_rwlock_destroy(&self->rw);
        pthread_mutex_destroy(&self->fence.mu);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Worker_close(ConnWorker *self, PyObject *unused)
{
    Worker_close_(self);
    Py_RETURN_NONE;
}

/* Enters a call (shared lock, taken without the GIL); -1 (ConnError
 * CLOSED, lock not held) on a closed worker. */
static int wenter(ConnWorker *self)
{
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&self->rw);
    Py_END_ALLOW_THREADS
    if (self->w)
        return 0;
    pthread_rwlock_unlock(&self->rw);
    conn_error(KVP_ECLOSED);
    return -1;
}

static void wleave(ConnWorker *self) { pthread_rwlock_unlock(&self->rw); }

/* register_kv_caches([(base, storage_len, elem_size, shape, stride)]) */
static PyObject *Worker_register(ConnWorker *self, PyObject *arg)
{
    PyObject *t = PySequence_Fast(arg, "register_kv_caches takes a sequence of tensor tuples");
    if (!t)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(t);
    kvp_conn_tensor *tt = n > 0 && n < 65536 ? PyMem_Calloc((size_t)n, sizeof *tt) : NULL;
    PyObject *res = NULL;
    if (!tt) {
        PyErr_SetString(PyExc_ValueError, "need 1..65535 tensors");
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(t, i), *so, *sto;
        uint64_t base, len, es;
        if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "O&O&O&OO:tensor", conv_u64, &base,
                                                     conv_u64, &len, conv_u64, &es, &so, &sto)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError,
                                "tensors are (base, storage_len, elem_size, shape, stride)");
            goto out;
        }
        PyObject *sh = PySequence_Fast(so, "shape must be a sequence"), *st = NULL;
        if (!sh || !(st = PySequence_Fast(sto, "stride must be a sequence"))) {
            Py_XDECREF(sh);
            goto out;
        }
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(sh);
        int bad = nd < 1 || nd > KVP_CONN_MAX_DIMS || PySequence_Fast_GET_SIZE(st) != nd ||
                  es == 0 || es > 64 || len == 0;
        for (Py_ssize_t d = 0; !bad && d < nd; d++) {
            uint64_t a, b;
            if (as_u64(PySequence_Fast_GET_ITEM(sh, d), "shape", SIZE_MAX, &a) < 0 ||
                as_u64(PySequence_Fast_GET_ITEM(st, d), "stride", SIZE_MAX, &b) < 0)
                bad = 2;
            else {
                tt[i].shape[d] = (size_t)a;
                tt[i].stride[d] = (size_t)b;
            }
        }
        Py_DECREF(sh);
        Py_DECREF(st);
        if (bad) {
            if (bad == 1)
                PyErr_SetString(PyExc_ValueError, "tensor needs 1..8 dims, equal shape and "
                                                  "stride lengths, elem_size 1..64, bytes > 0");
            goto out;
        }
        tt[i].base = (void *)(uintptr_t)base;
        tt[i].storage_len = (size_t)len;
        tt[i].elem_size = (size_t)es;
        tt[i].ndim = (int)nd;
    }
    if (wenter(self) < 0)
        goto out;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
        if (!self->fence_cuda &&
            !kvp_py_range_mapped_rw((uintptr_t)tt[i].base, tt[i].storage_len))
            rc = KVP_EINVALID_PARAMS; /* host memory only without the CUDA fence */
    if (rc == 0)
        rc = kvp_conn_register_kv_caches(self->w, tt, (size_t)n);
    Py_END_ALLOW_THREADS
    wleave(self);
    if (rc < 0)
        conn_error(rc);
    else
        res = Py_NewRef(Py_None);
out:
    PyMem_Free(tt);
    Py_DECREF(t);
    return res;
}

/* Strings of a sequence of str, copied (C may read them without the GIL). */
static char **dup_ids(PyObject *o, size_t *n)
{
    PyObject *t = PySequence_Tuple(o);
    if (!t)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(t);
    char **v = PyMem_Calloc((size_t)k + 1, sizeof *v);
    for (Py_ssize_t i = 0; v && i < k; i++) {
        Py_ssize_t len;
        const char *s = as_id(PyTuple_GET_ITEM(t, i), "request id", &len);
        if (!s || !(v[i] = PyMem_Malloc((size_t)len + 1))) {
            for (Py_ssize_t j = 0; j < i; j++)
                PyMem_Free(v[j]);
            PyMem_Free(v);
            v = NULL;
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            break;
        }
        memcpy(v[i], s, (size_t)len + 1);
    }
    if (!v && !PyErr_Occurred())
        PyErr_NoMemory();
    Py_DECREF(t);
    *n = (size_t)k;
    return v;
}

static void free_ids(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        PyMem_Free(v[i]);
    PyMem_Free(v);
}

static PyObject *Worker_preempt(ConnWorker *self, PyObject *arg)
{
    size_t n;
    char **ids = dup_ids(arg, &n);
    if (!ids)
        return NULL;
    if (wenter(self) < 0) {
        free_ids(ids, n);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_conn_handle_preemptions(self->w, (const char *const *)ids, n);
    Py_END_ALLOW_THREADS
    wleave(self);
    free_ids(ids, n);
    if (rc < 0)
        return conn_error(rc);
    Py_RETURN_NONE;
}

static PyObject *ids_list(const kvp_conn_ids *s)
{
    PyObject *l = PyList_New((Py_ssize_t)s->n);
    for (size_t i = 0; l && i < s->n; i++) {
        PyObject *v = PyUnicode_FromString(s->ids[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    return l;
}

/* get_finished(step_bytes | None, finished_ids) -> (done_sending, done_recving) */
static PyObject *Worker_get_finished(ConnWorker *self, PyObject *args)
{
    PyObject *bo, *fo;
    if (!PyArg_ParseTuple(args, "OO:get_finished", &bo, &fo))
        return NULL;
    Py_buffer b = {0};
    int have = bo != Py_None;
    if (have && PyObject_GetBuffer(bo, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t nf = 0;
    char **fin = dup_ids(fo, &nf);
    PyObject *res = NULL;
    if (!fin)
        goto out;
    if (wenter(self) < 0)
        goto out;
    kvp_conn_ids snd = {0}, rcv = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_conn_get_finished(self->w, have ? b.buf : NULL, have ? (size_t)b.len : 0,
                               (const char *const *)fin, nf, &snd, &rcv);
    Py_END_ALLOW_THREADS
    wleave(self);
    if (rc < 0) {
        conn_error(rc);
    } else {
        PyObject *a = ids_list(&snd), *c = a ? ids_list(&rcv) : NULL;
        if (a && c)
            res = PyTuple_Pack(2, a, c);
        Py_XDECREF(a);
        Py_XDECREF(c);
    }
    kvp_conn_ids_free(&snd);
    kvp_conn_ids_free(&rcv);
out:
    free_ids(fin, nf);
    if (have)
        PyBuffer_Release(&b);
    return res;
}

static PyObject *Worker_step(ConnWorker *self, void *unused)
{
    if (wenter(self) < 0)
        return NULL;
    uint64_t s = kvp_conn_worker_step(self->w);
    wleave(self);
    return PyLong_FromUnsignedLongLong(s);
}

/* set_fence_event(step, cuda_event_handle): the event recorded after the
 * forward of `step` (the value of .step before that step's get_finished). */
static PyObject *Worker_set_fence(ConnWorker *self, PyObject *args)
{
    uint64_t step, ev;
    if (!PyArg_ParseTuple(args, "O&O&:set_fence_event", conv_u64, &step, conv_u64, &ev))
        return NULL;
    if (!self->fence_cuda) {
        PyErr_SetString(PyExc_RuntimeError, "this worker was opened without fence='cuda'");
        return NULL;
    }
    if (step == 0 || ev == 0) {
        PyErr_SetString(PyExc_ValueError, "step and event must be non-zero");
        return NULL;
    }
    fence_ring *f = &self->fence;
    pthread_mutex_lock(&f->mu);
    int slot = (int)(step % FENCE_RING);
    f->step[slot] = step;
    f->event[slot] = (void *)(uintptr_t)ev;
    pthread_mutex_unlock(&f->mu);
    Py_RETURN_NONE;
}

static PyObject *Worker_load_errors(ConnWorker *self, PyObject *unused)
{
    if (wenter(self) < 0)
        return NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    int rc = kvp_conn_load_errors(self->w, &ids, &n);
    wleave(self);
    if (rc < 0)
        return conn_error(rc);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(ids[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    kvp_conn_free(ids);
    return l;
}

static PyObject *Worker_load_failed(ConnWorker *self, PyObject *unused)
{
    if (wenter(self) < 0)
        return NULL;
    kvp_conn_ids ids = {0};
    int rc = kvp_conn_load_failed(self->w, &ids);
    wleave(self);
    PyObject *l = rc < 0 ? conn_error(rc) : ids_list(&ids);
    kvp_conn_ids_free(&ids);
    return l;
}

static PyObject *Worker_take_stats(ConnWorker *self, PyObject *unused)
{
    if (wenter(self) < 0)
        return NULL;
    kvp_conn_stats st;
    int any = kvp_conn_take_stats(self->w, &st);
    wleave(self);
    if (any < 0)
        return conn_error(any);
    if (!any)
        Py_RETURN_NONE;
    static const char *names[] = {"store", "load", "lookup"};
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < KVP_CONN_OP_COUNT; i++) {
        const kvp_conn_op_stats *o = &st.op[i];
        PyObject *e = Py_BuildValue(
            "{sKsKsKsKsKsKsKsKsK}", "count", (unsigned long long)o->count, "total_ns",
            (unsigned long long)o->total_ns, "max_ns", (unsigned long long)o->max_ns, "keys",
            (unsigned long long)o->keys, "bytes", (unsigned long long)o->bytes, "failed_keys",
            (unsigned long long)o->failed_keys, "existing_keys",
            (unsigned long long)o->existing_keys, "partial", (unsigned long long)o->partial,
            "errors", (unsigned long long)o->errors);
        if (!e || PyDict_SetItemString(d, names[i], e) < 0)
            Py_CLEAR(d);
        Py_XDECREF(e);
    }
    return d;
}

/* pool_status() -> {available, attached, unavailable_ms, outages, skipped_stores,
 * skipped_lookups, failed_loads}: the pool's availability; counters since open */
static PyObject *Worker_pool_status(ConnWorker *self, PyObject *unused)
{
    if (wenter(self) < 0)
        return NULL;
    kvp_conn_pool_status st;
    kvp_conn_pool_status_init(&st);
    int rc = kvp_conn_pool_status_get(self->w, &st);
    wleave(self);
    if (rc < 0)
        return conn_error(rc);
    return Py_BuildValue("{sOsOsKsKsKsKsK}", "available", st.available ? Py_True : Py_False,
                         "attached", st.attached ? Py_True : Py_False, "unavailable_ms",
                         (unsigned long long)st.unavailable_ms, "outages",
                         (unsigned long long)st.outages, "skipped_stores",
                         (unsigned long long)st.skipped_stores, "skipped_lookups",
                         (unsigned long long)st.skipped_lookups, "failed_loads",
                         (unsigned long long)st.failed_loads);
}

/* take_events() -> [(group, block_size, hash, parent | None, start, end, token_ids | None)] */
static PyObject *Worker_take_events(ConnWorker *self, PyObject *unused)
{
    if (wenter(self) < 0)
        return NULL;
    kvp_conn_event *ev = NULL;
    size_t n = 0;
    int rc = kvp_conn_take_events(self->w, &ev, &n);
    wleave(self);
    if (rc < 0)
        return conn_error(rc);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        const kvp_conn_event *e = &ev[i];
        PyObject *toks = Py_NewRef(Py_None);
        if (e->token_ids) {
            Py_DECREF(toks);
            toks = PyList_New(e->n_token_ids);
            for (uint32_t j = 0; toks && j < e->n_token_ids; j++) {
                PyObject *v = PyLong_FromUnsignedLong(e->token_ids[j]);
                if (!v) {
                    Py_CLEAR(toks);
                    break;
                }
                PyList_SET_ITEM(toks, j, v);
            }
        }
        PyObject *item = toks ? Py_BuildValue(
            "(IIy#" "N" "KKO)", e->group, e->block_size, (const char *)e->hash,
            (Py_ssize_t)e->hash_len,
            e->has_parent ? PyBytes_FromStringAndSize((const char *)e->parent, e->hash_len)
                          : Py_NewRef(Py_None),
            (unsigned long long)e->start, (unsigned long long)e->end, toks) : NULL;
        Py_XDECREF(toks);
        if (!item) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, item);
    }
    kvp_conn_events_free(ev, n);
    return l;
}

static PyObject *Worker_drain(ConnWorker *self, PyObject *unused)
{
    if (wenter(self) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    kvp_conn_worker_drain(self->w);
    Py_END_ALLOW_THREADS
    wleave(self);
    Py_RETURN_NONE;
}

static PyMethodDef Worker_methods[] = {
    {"register_kv_caches", (PyCFunction)Worker_register, METH_O,
     "register_kv_caches([(base, storage_len, elem_size, shape, stride)])"},
    {"handle_preemptions", (PyCFunction)Worker_preempt, METH_O, "handle_preemptions(req_ids)"},
    {"get_finished", (PyCFunction)Worker_get_finished, METH_VARARGS,
     "get_finished(step_bytes | None, finished_ids) -> (done_sending, done_recving)"},
    {"set_fence_event", (PyCFunction)Worker_set_fence, METH_VARARGS,
     "set_fence_event(step, cuda_event): with fence='cuda', the event of step's forward"},
    {"load_errors", (PyCFunction)Worker_load_errors, METH_NOARGS,
     "load_errors() -> block ids whose load failed since the last call"},
    {"load_failed", (PyCFunction)Worker_load_failed, METH_NOARGS,
     "load_failed() -> ids of requests with a failed load since the last call"},
    {"take_stats", (PyCFunction)Worker_take_stats, METH_NOARGS,
     "take_stats() -> {store|load|lookup: counters} or None when nothing happened"},
    {"pool_status", (PyCFunction)Worker_pool_status, METH_NOARGS,
     "pool_status() -> {available, attached, unavailable_ms, outages, skipped_stores, "
     "skipped_lookups, failed_loads}: the pool's availability (counters since open)"},
    {"take_events", (PyCFunction)Worker_take_events, METH_NOARGS,
     "take_events() -> BlockStored tuples (group, block_size, hash, parent, start, end, tokens)"},
    {"drain", (PyCFunction)Worker_drain, METH_NOARGS, "drain(): waits for queued transfers"},
    {"close", (PyCFunction)Worker_close, METH_NOARGS, "close(): finishes transfers, closes"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Worker_getset[] = {
    {"step", (getter)Worker_step, NULL, "the step number the next get_finished stores under", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ConnWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._native.ConnWorker",
    .tp_basicsize = sizeof(ConnWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ConnWorker(config): one rank's worker half of the connector",
    .tp_new = Worker_new,
    .tp_init = (initproc)Worker_init,
    .tp_dealloc = (destructor)Worker_dealloc,
    .tp_methods = Worker_methods,
    .tp_getset = Worker_getset,
};

/* ================================================================= module */

int kvp_py_conn_init(PyObject *m, PyObject *open_error)
{
    OpenErr = open_error;
    if (PyType_Ready(&ConnRequestType) < 0 || PyType_Ready(&ConnSchedType) < 0 ||
        PyType_Ready(&ConnWorkerType) < 0)
        return -1;
    ConnError = PyErr_NewException("kvpool._native.ConnError", PyExc_RuntimeError, NULL);
    if (!ConnError || PyModule_AddObjectRef(m, "ConnError", ConnError) < 0 ||
        PyModule_AddObjectRef(m, "ConnRequest", (PyObject *)&ConnRequestType) < 0 ||
        PyModule_AddObjectRef(m, "ConnSched", (PyObject *)&ConnSchedType) < 0 ||
        PyModule_AddObjectRef(m, "ConnWorker", (PyObject *)&ConnWorkerType) < 0 ||
        PyModule_AddIntConstant(m, "CONN_API_VERSION", KVP_CONN_API_VERSION) < 0)
        return -1;
    return 0;
}
