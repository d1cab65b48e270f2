/*
 * _native.c -- kvpool._native, the CPython extension over include/kvpool.h.
 *
 * A translator and nothing more: Python arguments in, kvp_client_* calls,
 * Python results out. Every decision (placement, retries, checksums) stays
 * in the C core, which is compiled into this module.
 *
 * Contracts
 *  - Results are ints as the C API gives them (bytes moved >= 0, or a
 *    negative KVP_E* code); kvpool/__init__.py turns codes into exceptions,
 *    kvpool/mooncake.py passes them through as Mooncake does. Malformed
 *    arguments (wrong types, mismatched lengths, negative sizes) raise
 *    TypeError / ValueError before anything is sent.
 *  - Argument lists are parsed here, in C, once per call. Keys are borrowed
 *    as UTF-8 (str) or raw bytes; a key with a NUL byte is refused
 *    (KVP_EINVALID_KEY for that key) because the C API carries C strings.
 *  - Every blocking call releases the GIL. Before it does, the call takes
 *    its own references to every key object and a Py_buffer on every buffer
 *    object (exporters such as bytearray cannot resize while exported), so
 *    another thread mutating the argument lists cannot free what C reads.
 *  - Raw addresses (ints) are accepted only inside ranges registered with
 *    register_buffer: kvp_client_check_registered refuses the rest before a
 *    byte is touched (KVP_EINVALID_PARAMS for that key).
 *  - Client objects are shared between threads. close() marks the client
 *    closed, waits for the calls in flight and then closes it; calls on a
 *    closed client return KVP_ECLOSED. unregister_buffer returns once the
 *    calls that started before it (which may be moving bytes in the range)
 *    have left.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "_native.h"
#include "client/gpu.h"
#include "common/log.h"
#include "kvpool.h"

/* Raised by Client(...) when kvp_client_open fails: args (code, message). */
static PyObject *OpenError;

/* ============================================================== client */

typedef struct {
    PyObject_HEAD
    kvp_client *c;
    pthread_mutex_t mu; /* guards inflight, epoch and closed */
    pthread_cond_t cv;  /* broadcast on every leave while someone waits */
    int inflight[2];    /* calls in flight, by the epoch (parity) they entered in */
    unsigned epoch;
    int waiters;        /* threads in pthread_cond_wait on cv */
    pthread_mutex_t unreg_mu; /* one unregister_buffer at a time (it flips epoch) */
    int closed;
    int init_done;
    int opened; /* __init__ ran (guarded by mu) */
} Client;

/*
 * Calls in flight are counted per epoch parity, so unregister_buffer can
 * wait for exactly the calls that started before it (which may still be
 * moving bytes in the range) while new ones count in the other slot. A
 * thread is inside at most one call (the GIL serialises a thread's calls;
 * none nests), so its slot lives in a thread-local.
 */
static _Thread_local int call_slot;

/* Enters a call: 0, or KVP_ECLOSED when the client is closed. */
static int enter(Client *self)
{
    int rc = 0;
    pthread_mutex_lock(&self->mu);
    if (self->closed || !self->c) {
        rc = KVP_ECLOSED;
    } else {
        call_slot = (int)(self->epoch & 1);
        self->inflight[call_slot]++;
    }
    pthread_mutex_unlock(&self->mu);
    return rc;
}

static void leave(Client *self)
{
    pthread_mutex_lock(&self->mu);
    self->inflight[call_slot]--;
    if (self->waiters) /* close waits for 0, an unregister for its own call alone */
        pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
}

/* From inside a call: waits (GIL released by the caller) until every other
 * call that entered before this moment has left. */
static void wait_calls_before(Client *self)
{
    pthread_mutex_lock(&self->unreg_mu);
    pthread_mutex_lock(&self->mu);
    int old = (int)(self->epoch & 1);
    self->epoch++;
    int own = call_slot == old; /* this call counts in the old slot */
    self->waiters++;
    while (self->inflight[old] > own)
        pthread_cond_wait(&self->cv, &self->mu);
    self->waiters--;
    pthread_mutex_unlock(&self->mu);
    pthread_mutex_unlock(&self->unreg_mu);
}

/* Marks closed, waits for calls in flight (GIL released), closes. */
static void close_client(Client *self)
{
    kvp_client *c = NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    self->closed = 1;
    self->waiters++;
    while (self->inflight[0] + self->inflight[1] > 0)
        pthread_cond_wait(&self->cv, &self->mu);
    self->waiters--;
    c = self->c;
    self->c = NULL;
    pthread_mutex_unlock(&self->mu);
    if (c)
        kvp_client_close(c);
    Py_END_ALLOW_THREADS
}

static PyTypeObject ClientType;

int kvp_py_is_client(PyObject *o) { return PyObject_TypeCheck(o, &ClientType); }

kvp_client *kvp_py_client_of(PyObject *o) { return ((Client *)o)->c; }

int kvp_py_client_enter(void *o) { return enter((Client *)o); }

void kvp_py_client_leave(void *o) { leave((Client *)o); }

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Client *self = (Client *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    pthread_mutex_init(&self->unreg_mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    self->init_done = 1;
    return (PyObject *)self;
}

static int Client_init(Client *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"config", NULL};
    const char *config = "";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|s:Client", names, &config))
        return -1;
    pthread_mutex_lock(&self->mu);
    int again = self->opened;
    self->opened = 1; /* one open per object, even when it fails or was closed */
    pthread_mutex_unlock(&self->mu);
    if (again) {
        PyErr_SetString(PyExc_RuntimeError, "Client.__init__ may run only once");
        return -1;
    }
    char err[512] = "";
    kvp_client *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_client_open(config, &c, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyObject *v = Py_BuildValue("(is)", rc, err[0] ? err : kvp_strerror(rc));
        if (v) {
            PyErr_SetObject(OpenError, v);
            Py_DECREF(v);
        }
        return -1;
    }
    self->c = c;
    self->closed = 0;
    return 0;
}

static void Client_dealloc(Client *self)
{
    if (self->init_done) {
        close_client(self);
        pthread_cond_destroy(&self->cv);
        pthread_mutex_destroy(&self->unreg_mu);
        pthread_mutex_destroy(&self->mu);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Client_close(Client *self, PyObject *unused)
{
    close_client(self);
    Py_RETURN_NONE;
}

static PyObject *Client_closed(Client *self, void *unused)
{
    pthread_mutex_lock(&self->mu);
    int closed = self->closed || !self->c;
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(closed);
}

/* ============================================================ argument parsing */

/*
 * One call's parsed arguments. Everything a call hands to C while the GIL
 * is released is owned here: key references, buffer views, piece arrays.
 */
typedef struct {
    Py_ssize_t n;
    const char **keys;    /* n; NULL for a key C must refuse (NUL byte) */
    PyObject **keyrefs;   /* n strong references */
    kvp_iov *pieces;      /* all keys' pieces, key after key */
    size_t npieces, cap_pieces;
    size_t *first;        /* n: index of each key's first piece */
    size_t *niov;         /* n */
    const kvp_iov **iovs; /* n: pieces + first[i], filled by args_finish */
    Py_buffer *views;     /* buffer views taken */
    size_t nviews, cap_views;
    int64_t *results;     /* n */
    int *codes;           /* n, for the int-result calls */
} args;

static void args_free(args *a)
{
    if (a->keyrefs)
        for (Py_ssize_t i = 0; i < a->n; i++)
            Py_XDECREF(a->keyrefs[i]);
    for (size_t i = 0; i < a->nviews; i++)
        PyBuffer_Release(&a->views[i]);
    PyMem_Free(a->keys);
    PyMem_Free(a->keyrefs);
    PyMem_Free(a->pieces);
    PyMem_Free(a->first);
    PyMem_Free(a->niov);
    PyMem_Free(a->iovs);
    PyMem_Free(a->views);
    PyMem_Free(a->results);
    PyMem_Free(a->codes);
    memset(a, 0, sizeof *a);
}

/* The key list: str (UTF-8) or bytes items. 0, or -1 with an exception. */
static int args_keys(args *a, PyObject *seq)
{
    if (PyUnicode_Check(seq) || PyBytes_Check(seq) || PyByteArray_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list of str, not one string");
        return -1;
    }
    PyObject *fast = PySequence_Fast(seq, "keys must be a sequence of str");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    a->n = n;
    size_t m = n > 0 ? (size_t)n : 1;
    a->keys = PyMem_Calloc(m, sizeof *a->keys);
    a->keyrefs = PyMem_Calloc(m, sizeof *a->keyrefs);
    a->first = PyMem_Calloc(m, sizeof *a->first);
    a->niov = PyMem_Calloc(m, sizeof *a->niov);
    a->iovs = PyMem_Calloc(m, sizeof *a->iovs);
    a->results = PyMem_Calloc(m, sizeof *a->results);
    a->codes = PyMem_Calloc(m, sizeof *a->codes);
    if (!a->keys || !a->keyrefs || !a->first || !a->niov || !a->iovs || !a->results ||
        !a->codes) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PySequence_Fast_GET_ITEM(fast, i);
        const char *s;
        Py_ssize_t len;
        if (PyUnicode_Check(k)) {
            s = PyUnicode_AsUTF8AndSize(k, &len);
            if (!s) {
                Py_DECREF(fast);
                return -1;
            }
        } else if (PyBytes_Check(k)) {
            s = PyBytes_AS_STRING(k);
            len = PyBytes_GET_SIZE(k);
        } else {
            Py_DECREF(fast);
            PyErr_Format(PyExc_TypeError, "key %zd: expected str or bytes, got %.100s", i,
                         Py_TYPE(k)->tp_name);
            return -1;
        }
        Py_INCREF(k);
        a->keyrefs[i] = k;
        a->keys[i] = strlen(s) == (size_t)len ? s : NULL; /* NUL inside: refused by C */
    }
    Py_DECREF(fast);
    return 0;
}

/* Room for one more piece; returns it. NULL with MemoryError. */
static kvp_iov *args_piece(args *a)
{
    if (a->npieces == a->cap_pieces) {
        size_t nc = a->cap_pieces ? a->cap_pieces * 2 : 64;
        kvp_iov *np = PyMem_Realloc(a->pieces, nc * sizeof *np);
        if (!np) {
            PyErr_NoMemory();
            return NULL;
        }
        a->pieces = np;
        a->cap_pieces = nc;
    }
    return &a->pieces[a->npieces++];
}

/* A buffer view of obj (writable for gets); the piece it describes. */
static int args_view(args *a, PyObject *obj, int writable, Py_ssize_t key)
{
    if (a->nviews == a->cap_views) {
        size_t nc = a->cap_views ? a->cap_views * 2 : 16;
        Py_buffer *nv = PyMem_Realloc(a->views, nc * sizeof *nv);
        if (!nv) {
            PyErr_NoMemory();
            return -1;
        }
        a->views = nv;
        a->cap_views = nc;
    }
    Py_buffer *v = &a->views[a->nviews];
    if (PyObject_GetBuffer(obj, v, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyObject *t, *val, *tb;
        PyErr_Fetch(&t, &val, &tb);
        Py_XDECREF(t);
        Py_XDECREF(val);
        Py_XDECREF(tb);
        PyErr_Format(PyExc_TypeError,
                     "value %zd: expected a %sC-contiguous buffer (bytes, bytearray, "
                     "memoryview, numpy array), got %.100s",
                     key, writable ? "writable " : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    a->nviews++;
    kvp_iov *p = args_piece(a);
    if (!p)
        return -1;
    p->base = v->buf;
    p->len = (size_t)v->len;
    return 0;
}

/*
 * A tuple of seq's items (a new reference; seq itself when it is a tuple).
 * Parsing iterates the copy: getting a buffer or an index may run Python
 * code (__buffer__, __index__) that mutates the caller's list, and the
 * tuple keeps every item alive meanwhile.
 */
static PyObject *as_tuple(PyObject *seq, const char *what)
{
    if (PyTuple_Check(seq)) {
        Py_INCREF(seq);
        return seq;
    }
    if (!PyList_Check(seq) && !PySequence_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a sequence, not %.100s", what,
                     Py_TYPE(seq)->tp_name);
        return NULL;
    }
    return PySequence_Tuple(seq);
}

/*
 * Buffers: values[i] is one buffer object or a list / tuple of them (the
 * pieces gathered into / scattered from key i).
 */
static int args_buffers(args *a, PyObject *values, int writable)
{
    PyObject *vals = as_tuple(values, "values");
    if (!vals)
        return -1;
    if (PyTuple_GET_SIZE(vals) != a->n) {
        PyErr_Format(PyExc_ValueError, "%zd keys but %zd values", a->n, PyTuple_GET_SIZE(vals));
        Py_DECREF(vals);
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t i = 0; i < a->n && rc == 0; i++) {
        PyObject *v = PyTuple_GET_ITEM(vals, i);
        a->first[i] = a->npieces;
        if (PyList_Check(v) || PyTuple_Check(v)) {
            PyObject *parts = as_tuple(v, "pieces");
            if (!parts) {
                rc = -1;
                break;
            }
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(parts) && rc == 0; j++)
                rc = args_view(a, PyTuple_GET_ITEM(parts, j), writable, i);
            Py_DECREF(parts);
        } else {
            rc = args_view(a, v, writable, i);
        }
        a->niov[i] = a->npieces - a->first[i];
    }
    Py_DECREF(vals);
    return rc;
}

static int as_size_long(PyObject *o, const char *what, Py_ssize_t key, size_t *out);

/* A non-negative integer (int or __index__) that fits size_t / uintptr_t. */
static int as_size(PyObject *o, const char *what, Py_ssize_t key, size_t *out)
{
    if (!PyLong_Check(o) && !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s of key %zd: expected int, got %.100s", what, key,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *num = PyNumber_Index(o); /* numpy integers and other __index__ types */
    if (!num)
        return -1;
    int rc = as_size_long(num, what, key, out);
    Py_DECREF(num);
    return rc;
}

static int as_size_long(PyObject *o, const char *what, Py_ssize_t key, size_t *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (u > SIZE_MAX) {
            PyErr_Format(PyExc_ValueError, "%s of key %zd is too large", what, key);
            return -1;
        }
        *out = (size_t)u;
        return 0;
    }
    if (overflow < 0 || v < 0) {
        PyErr_Format(PyExc_ValueError, "%s of key %zd must not be negative", what, key);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/*
 * Addresses: ptrs[i] / sizes[i] are ints (one piece) or equally long lists
 * of ints (the pieces of key i).
 */
static int args_ptrs(args *a, PyObject *ptrs, PyObject *sizes)
{
    PyObject *fp = as_tuple(ptrs, "buffer_ptrs");
    if (!fp)
        return -1;
    PyObject *fs = as_tuple(sizes, "sizes");
    if (!fs) {
        Py_DECREF(fp);
        return -1;
    }
    int rc = 0;
    if (PyTuple_GET_SIZE(fp) != a->n || PyTuple_GET_SIZE(fs) != a->n) {
        PyErr_Format(PyExc_ValueError, "%zd keys, %zd buffer addresses and %zd sizes", a->n,
                     PyTuple_GET_SIZE(fp), PyTuple_GET_SIZE(fs));
        rc = -1;
    }
    for (Py_ssize_t i = 0; i < a->n && rc == 0; i++) {
        PyObject *p0 = PyTuple_GET_ITEM(fp, i), *s0 = PyTuple_GET_ITEM(fs, i);
        a->first[i] = a->npieces;
        int plist = PyList_Check(p0) || PyTuple_Check(p0);
        int slist = PyList_Check(s0) || PyTuple_Check(s0);
        PyObject *p = plist ? as_tuple(p0, "buffer addresses") : (Py_INCREF(p0), p0);
        PyObject *s = slist ? as_tuple(s0, "sizes") : (Py_INCREF(s0), s0);
        if (!p || !s) {
            Py_XDECREF(p);
            Py_XDECREF(s);
            rc = -1;
            break;
        }
        if (plist != slist || (plist && PyTuple_GET_SIZE(p) != PyTuple_GET_SIZE(s))) {
            PyErr_Format(PyExc_ValueError,
                         "key %zd: buffer addresses and sizes must have the same shape", i);
            Py_DECREF(p);
            Py_DECREF(s);
            rc = -1;
            break;
        }
        Py_ssize_t m = plist ? PyTuple_GET_SIZE(p) : 1;
        for (Py_ssize_t j = 0; j < m && rc == 0; j++) {
            size_t addr, len;
            PyObject *pj = plist ? PyTuple_GET_ITEM(p, j) : p;
            PyObject *sj = slist ? PyTuple_GET_ITEM(s, j) : s;
            if (as_size(pj, "buffer address", i, &addr) || as_size(sj, "size", i, &len)) {
                rc = -1;
                break;
            }
            kvp_iov *piece = args_piece(a);
            if (!piece) {
                rc = -1;
                break;
            }
            piece->base = (void *)(uintptr_t)addr;
            piece->len = len;
        }
        Py_DECREF(p);
        Py_DECREF(s);
        a->niov[i] = a->npieces - a->first[i];
    }
    Py_DECREF(fp);
    Py_DECREF(fs);
    return rc;
}

/* Points iovs[] into pieces (stable now that parsing is done). */
static void args_finish(args *a)
{
    for (Py_ssize_t i = 0; i < a->n; i++)
        a->iovs[i] = a->pieces ? a->pieces + a->first[i] : NULL;
}

/*
 * Keys whose pieces are raw addresses outside every registered range get
 * KVP_EINVALID_PARAMS; the others are compacted to the front of the arrays
 * (their original index kept in map) so C only sees checked pieces.
 */
static size_t args_check_registered(kvp_client *c, args *a, size_t *map)
{
    size_t m = 0;
    for (Py_ssize_t i = 0; i < a->n; i++) {
        int rc = kvp_client_check_registered(c, a->iovs[i], a->niov[i]);
        if (rc) {
            a->results[i] = rc;
            continue;
        }
        map[m] = (size_t)i;
        a->keys[m] = a->keys[i];
        a->iovs[m] = a->iovs[i];
        a->niov[m] = a->niov[i];
        m++;
    }
    return m;
}

static PyObject *list_of_i64(const int64_t *v, Py_ssize_t n)
{
    PyObject *l = PyList_New(n);
    if (!l)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

/* Every key of a gets code (a call that could not run). */
static PyObject *all_codes(args *a, int code)
{
    for (Py_ssize_t i = 0; i < a->n; i++)
        a->results[i] = code;
    return list_of_i64(a->results, a->n);
}

/* ====================================================== put and get */

/* Put options from Python: replica_num (0 = client default), flags
 * (PUT_*), preferred segment (None = client default), soft_pin_ttl_ms
 * (None = not given; an int >= 0). */
typedef struct {
    kvp_put_opts o;
    Py_buffer blocks; /* blocks=: kvp_block records, one per key (buf NULL: none) */
} put_kw;

static int parse_put_kw(PyObject *replica, PyObject *flags, PyObject *pref, PyObject *ttl,
                        put_kw *k)
{
    kvp_put_opts_init(&k->o);
    k->blocks.buf = NULL;
    size_t v;
    if (replica && replica != Py_None) {
        if (as_size(replica, "replica_num", 0, &v))
            return -1;
        if (v > 3) {
            PyErr_SetString(PyExc_ValueError, "replica_num must be 0..3");
            return -1;
        }
        k->o.replica_num = (uint32_t)v;
    }
    if (flags && flags != Py_None) {
        if (as_size(flags, "flags", 0, &v))
            return -1;
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "flags must fit 32 bits");
            return -1;
        }
        k->o.flags = (uint32_t)v;
    }
    if (ttl && ttl != Py_None) {
        if (as_size(ttl, "soft_pin_ttl_ms", 0, &v))
            return -1;
        if (v > INT64_MAX) {
            PyErr_SetString(PyExc_ValueError, "soft_pin_ttl_ms must fit 63 bits");
            return -1;
        }
        k->o.soft_pin_ttl_ms = (int64_t)v;
    }
    if (pref && pref != Py_None) {
        if (!PyUnicode_Check(pref)) {
            PyErr_SetString(PyExc_TypeError, "preferred_segment must be str or None");
            return -1;
        }
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(pref, &len);
        if (!s)
            return -1;
        if (strlen(s) != (size_t)len) {
            PyErr_SetString(PyExc_ValueError, "preferred_segment contains a NUL byte");
            return -1;
        }
        k->o.preferred_segment = s; /* pref is referenced by the caller's args */
    }
    return 0;
}

enum src_kind { SRC_BUFFERS, SRC_PTRS };

/* put_buffers(keys, values, replica_num=None, flags=None, preferred=None,
 *             soft_pin_ttl_ms=None)
 * put_ptrs(keys, ptrs, sizes, replica_num=None, flags=None, preferred=None,
 *          soft_pin_ttl_ms=None) */
static PyObject *do_put(Client *self, PyObject *args_, PyObject *kw, enum src_kind kind)
{
    static char *nb[] = {"keys", "values", "replica_num", "flags", "preferred",
                         "soft_pin_ttl_ms", "blocks", NULL};
    static char *np[] = {"keys", "ptrs", "sizes", "replica_num", "flags", "preferred",
                         "soft_pin_ttl_ms", "blocks", NULL};
    PyObject *keys, *values = NULL, *ptrs = NULL, *sizes = NULL;
    PyObject *replica = NULL, *flags = NULL, *pref = NULL, *ttl = NULL, *blocks = NULL;
    int ok = kind == SRC_BUFFERS
                 ? PyArg_ParseTupleAndKeywords(args_, kw, "OO|OOOOO:put_buffers", nb, &keys,
                                               &values, &replica, &flags, &pref, &ttl, &blocks)
                 : PyArg_ParseTupleAndKeywords(args_, kw, "OOO|OOOOO:put_ptrs", np, &keys, &ptrs,
                                               &sizes, &replica, &flags, &pref, &ttl, &blocks);
    if (!ok)
        return NULL;
    put_kw pk;
    if (parse_put_kw(replica, flags, pref, ttl, &pk))
        return NULL;
    args a = {0};
    PyObject *out = NULL;
    if (args_keys(&a, keys))
        goto done;
    if ((kind == SRC_BUFFERS ? args_buffers(&a, values, 0) : args_ptrs(&a, ptrs, sizes)))
        goto done;
    args_finish(&a);
    if (blocks && blocks != Py_None) {
        /* packed kvp_block records (kvpool.Block), one per key */
        if (PyObject_GetBuffer(blocks, &pk.blocks, PyBUF_SIMPLE))
            goto done;
        if ((size_t)pk.blocks.len != (size_t)a.n * sizeof(kvp_block)) {
            PyErr_Format(PyExc_ValueError, "blocks: %zd bytes for %zd keys (want %zu each)",
                         pk.blocks.len, a.n, sizeof(kvp_block));
            goto done;
        }
        if (((uintptr_t)pk.blocks.buf & 7) != 0) { /* read as kvp_block structs */
            PyErr_SetString(PyExc_ValueError, "blocks: buffer not 8-byte aligned");
            goto done;
        }
        pk.o.blocks = pk.blocks.buf;
    }
    int rc = enter(self);
    if (rc) {
        out = all_codes(&a, rc);
        goto done;
    }
    size_t *map = NULL;
    if (kind == SRC_PTRS && a.n > 0 && !(map = PyMem_Calloc((size_t)a.n, sizeof *map))) {
        leave(self);
        PyErr_NoMemory();
        goto done;
    }
    int64_t *res = a.results;
    Py_BEGIN_ALLOW_THREADS
    if (kind == SRC_PTRS) {
        size_t m = args_check_registered(self->c, &a, map);
        /* Results of the checked keys land in a scratch array, then map back. */
        int64_t *tmp = m ? malloc(m * sizeof *tmp) : NULL;
        if (m && !tmp) {
            for (size_t i = 0; i < m; i++)
                res[map[i]] = KVP_ENOMEM;
        } else if (m) {
            rc = kvp_client_batch_put_opts(self->c, a.keys, a.iovs, a.niov, m, &pk.o, tmp);
            for (size_t i = 0; i < m; i++)
                res[map[i]] = rc ? rc : tmp[i];
        }
        free(tmp);
    } else {
        rc = kvp_client_batch_put_opts(self->c, a.keys, a.iovs, a.niov, (size_t)a.n, &pk.o, res);
        if (rc)
            for (Py_ssize_t i = 0; i < a.n; i++)
                res[i] = rc;
    }
    Py_END_ALLOW_THREADS
    leave(self);
    PyMem_Free(map);
    out = list_of_i64(a.results, a.n);
done:
    if (pk.blocks.buf)
        PyBuffer_Release(&pk.blocks);
    args_free(&a);
    return out;
}

static PyObject *Client_put_buffers(Client *self, PyObject *a, PyObject *kw)
{
    return do_put(self, a, kw, SRC_BUFFERS);
}

static PyObject *Client_put_ptrs(Client *self, PyObject *a, PyObject *kw)
{
    return do_put(self, a, kw, SRC_PTRS);
}

/* get_buffers(keys, buffers, exact=False) / get_ptrs(keys, ptrs, sizes, exact=False):
 * exact: the pieces' total must equal the value (multi-buffer gets); else
 * the pieces may hold more (get_into). */
static PyObject *do_get(Client *self, PyObject *args_, PyObject *kw, enum src_kind kind)
{
    static char *nb[] = {"keys", "buffers", "exact", NULL};
    static char *np[] = {"keys", "ptrs", "sizes", "exact", NULL};
    PyObject *keys, *values = NULL, *ptrs = NULL, *sizes = NULL;
    int exact = 0;
    int ok = kind == SRC_BUFFERS
                 ? PyArg_ParseTupleAndKeywords(args_, kw, "OO|p:get_buffers", nb, &keys, &values,
                                               &exact)
                 : PyArg_ParseTupleAndKeywords(args_, kw, "OOO|p:get_ptrs", np, &keys, &ptrs,
                                               &sizes, &exact);
    if (!ok)
        return NULL;
    args a = {0};
    PyObject *out = NULL;
    if (args_keys(&a, keys))
        goto done;
    if ((kind == SRC_BUFFERS ? args_buffers(&a, values, 1) : args_ptrs(&a, ptrs, sizes)))
        goto done;
    args_finish(&a);
    int rc = enter(self);
    if (rc) {
        out = all_codes(&a, rc);
        goto done;
    }
    size_t *map = PyMem_Calloc(a.n > 0 ? (size_t)a.n : 1, sizeof *map);
    if (!map) {
        leave(self);
        PyErr_NoMemory();
        goto done;
    }
    int64_t *res = a.results;
    Py_BEGIN_ALLOW_THREADS
    size_t m = (size_t)a.n;
    if (kind == SRC_PTRS)
        m = args_check_registered(self->c, &a, map);
    else
        for (size_t i = 0; i < m; i++)
            map[i] = i;
    int64_t *tmp = m ? malloc(m * sizeof *tmp) : NULL;
    if (m && !tmp) {
        for (size_t i = 0; i < m; i++)
            res[map[i]] = KVP_ENOMEM;
    } else if (m) {
        rc = exact ? kvp_client_batch_get_into_multi_buffers(self->c, a.keys, a.iovs, a.niov, m,
                                                            tmp)
                   : kvp_client_batch_get_into(self->c, a.keys, a.iovs, a.niov, m, tmp);
        for (size_t i = 0; i < m; i++)
            res[map[i]] = rc ? rc : tmp[i];
    }
    free(tmp);
    Py_END_ALLOW_THREADS
    leave(self);
    PyMem_Free(map);
    out = list_of_i64(a.results, a.n);
done:
    args_free(&a);
    return out;
}

static PyObject *Client_get_buffers(Client *self, PyObject *a, PyObject *kw)
{
    return do_get(self, a, kw, SRC_BUFFERS);
}

static PyObject *Client_get_ptrs(Client *self, PyObject *a, PyObject *kw)
{
    return do_get(self, a, kw, SRC_PTRS);
}

/*
 * get_bytes(keys) -> list of bytes (found) or int (negative code).
 * One GET: once the sizes are known, the allocation callback takes the GIL
 * back for a moment to create the bytes objects the values are read into.
 */
typedef struct {
    PyObject **objs; /* one slot per key, NULL until allocated */
} bytes_alloc;

static int alloc_bytes(void *arg, size_t m, const size_t *idx, const uint64_t *sizes,
                       kvp_iov *out)
{
    bytes_alloc *ba = arg;
    int slot = call_slot; /* allocation may run finalizers that make calls of their own */
    PyGILState_STATE st = PyGILState_Ensure();
    for (size_t j = 0; j < m; j++) {
        if (sizes[j] == 0 || sizes[j] > (uint64_t)PY_SSIZE_T_MAX)
            continue;
        PyObject *o = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizes[j]);
        if (!o) {
            PyErr_Clear(); /* this key answers KVP_ENOMEM */
            continue;
        }
        Py_XSETREF(ba->objs[idx[j]], o);
        out[idx[j]] = (kvp_iov){PyBytes_AS_STRING(o), (size_t)sizes[j]};
    }
    PyGILState_Release(st);
    call_slot = slot;
    return 0;
}

static PyObject *Client_get_bytes(Client *self, PyObject *keys)
{
    args a = {0};
    PyObject *out = NULL;
    bytes_alloc ba = {NULL};
    if (args_keys(&a, keys))
        goto done;
    int rc = enter(self);
    if (rc) {
        out = all_codes(&a, rc);
        goto done;
    }
    ba.objs = PyMem_Calloc(a.n > 0 ? (size_t)a.n : 1, sizeof *ba.objs);
    if (!ba.objs) {
        leave(self);
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = kvp_client_batch_get_alloc(self->c, a.keys, (size_t)a.n, alloc_bytes, &ba, a.results);
    Py_END_ALLOW_THREADS
    leave(self);
    out = PyList_New(a.n);
    if (!out)
        goto done;
    for (Py_ssize_t i = 0; i < a.n; i++) {
        int64_t r = rc ? rc : a.results[i];
        PyObject *x;
        if (r >= 0 && ba.objs[i] && r == PyBytes_GET_SIZE(ba.objs[i])) {
            x = ba.objs[i];
            ba.objs[i] = NULL;
        } else {
            x = PyLong_FromLongLong(r < 0 ? r : KVP_EINTERNAL_ERROR);
            if (!x) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, i, x);
    }
done:
    if (ba.objs)
        for (Py_ssize_t i = 0; i < a.n; i++)
            Py_XDECREF(ba.objs[i]);
    PyMem_Free(ba.objs);
    args_free(&a);
    return out;
}

/* ================================================ metadata calls */

enum keyed { K_EXIST, K_SIZE, K_REMOVE, K_REMOVE_FORCE, K_TIERS };

static PyObject *keyed_call(Client *self, PyObject *keys, enum keyed op)
{
    args a = {0};
    PyObject *out = NULL;
    if (args_keys(&a, keys))
        goto done;
    int rc = enter(self);
    if (rc) {
        out = all_codes(&a, rc);
        goto done;
    }
    size_t n = (size_t)a.n;
    Py_BEGIN_ALLOW_THREADS
    switch (op) {
    case K_EXIST:
        rc = kvp_client_exist(self->c, a.keys, n, a.codes);
        break;
    case K_TIERS:
        rc = kvp_client_tiers(self->c, a.keys, n, a.codes);
        break;
    case K_SIZE:
        rc = kvp_client_batch_size(self->c, a.keys, n, a.results);
        break;
    case K_REMOVE:
    case K_REMOVE_FORCE:
        rc = kvp_client_batch_remove(self->c, a.keys, n, op == K_REMOVE_FORCE, a.codes);
        break;
    }
    Py_END_ALLOW_THREADS
    leave(self);
    for (size_t i = 0; i < n; i++) /* the int-coded calls answered in codes[] */
        a.results[i] = rc ? rc : op == K_SIZE ? a.results[i] : a.codes[i];
    out = list_of_i64(a.results, a.n);
done:
    args_free(&a);
    return out;
}

static PyObject *Client_exist(Client *self, PyObject *keys) { return keyed_call(self, keys, K_EXIST); }
static PyObject *Client_tiers(Client *self, PyObject *keys) { return keyed_call(self, keys, K_TIERS); }
static PyObject *Client_sizes(Client *self, PyObject *keys) { return keyed_call(self, keys, K_SIZE); }

/* exist_lease(keys) -> list[(int, int)]: per key (TIER_DRAM held / TIER_DISK
 * / 0 absent / < 0, the value's size or 0); a master without EXIST_LEASE:
 * (NOT_SUPPORTED, 0) for every key. */
static PyObject *Client_exist_lease(Client *self, PyObject *keys)
{
    args a = {0};
    PyObject *out = NULL;
    uint64_t *sizes = NULL;
    if (args_keys(&a, keys))
        goto done;
    sizes = PyMem_Calloc(a.n > 0 ? (size_t)a.n : 1, sizeof *sizes);
    if (!sizes) {
        PyErr_NoMemory();
        goto done;
    }
    int rc = enter(self);
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvp_client_exist_lease(self->c, a.keys, (size_t)a.n, a.codes, sizes);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    if (!(out = PyList_New(a.n)))
        goto done;
    for (Py_ssize_t i = 0; i < a.n; i++) {
        PyObject *t = Py_BuildValue("(iK)", rc ? rc : a.codes[i],
                                    (unsigned long long)(rc ? 0 : sizes[i]));
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, t);
    }
done:
    PyMem_Free(sizes);
    args_free(&a);
    return out;
}

static PyObject *Client_remove(Client *self, PyObject *args_, PyObject *kw)
{
    static char *names[] = {"keys", "force", NULL};
    PyObject *keys;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args_, kw, "O|p:remove", names, &keys, &force))
        return NULL;
    return keyed_call(self, keys, force ? K_REMOVE_FORCE : K_REMOVE);
}

static PyObject *Client_prefix(Client *self, PyObject *keys)
{
    args a = {0};
    PyObject *out = NULL;
    if (args_keys(&a, keys))
        goto done;
    int64_t r = enter(self);
    if (r == 0) {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_client_prefix(self->c, a.keys, (size_t)a.n);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    out = PyLong_FromLongLong(r);
done:
    args_free(&a);
    return out;
}

/* lookup_hashes(hashes, lens, groups) -> [(dram, disk, any)]: hashes a
 * buffer of native uint64 (all chains back to back), lens a sequence of
 * chain lengths, groups bytes (one per chain) or None. */
static PyObject *Client_lookup_hashes(Client *self, PyObject *args_)
{
    PyObject *hashes, *lens, *groups;
    if (!PyArg_ParseTuple(args_, "OOO:lookup_hashes", &hashes, &lens, &groups))
        return NULL;
    Py_buffer hb = {0}, gb = {0};
    PyObject *lt = NULL, *out = NULL;
    size_t *ln = NULL;
    kvp_hash_prefix *res = NULL;
    if (PyObject_GetBuffer(hashes, &hb, PyBUF_SIMPLE))
        return NULL;
    if (groups != Py_None && PyObject_GetBuffer(groups, &gb, PyBUF_SIMPLE))
        goto done;
    if (!(lt = PySequence_Fast(lens, "lens must be a sequence")))
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(lt);
    if (gb.buf && gb.len != n) {
        PyErr_SetString(PyExc_ValueError, "groups: one byte per chain");
        goto done;
    }
    ln = PyMem_Calloc((size_t)n + 1, sizeof *ln);
    res = PyMem_Calloc((size_t)n + 1, sizeof *res);
    if (!ln || !res) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_size(PySequence_Fast_GET_ITEM(lt, i), "lens", 0, &ln[i]))
            goto done;
        total += ln[i];
    }
    if (hb.len < 0 || (size_t)hb.len != total * sizeof(uint64_t) || ((uintptr_t)hb.buf & 7)) {
        PyErr_SetString(PyExc_ValueError, "hashes: an aligned buffer of sum(lens) uint64");
        goto done;
    }
    int rc = enter(self);
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvp_client_lookup_hashes(self->c, hb.buf, ln, gb.buf, (size_t)n, res);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    if (rc) {
        out = PyLong_FromLong(rc);
        goto done;
    }
    if (!(out = PyList_New(n)))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(kkk)", (unsigned long)res[i].dram,
                                    (unsigned long)res[i].disk, (unsigned long)res[i].any);
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, t);
    }
done:
    PyMem_Free(ln);
    PyMem_Free(res);
    Py_XDECREF(lt);
    if (gb.buf)
        PyBuffer_Release(&gb);
    PyBuffer_Release(&hb);
    return out;
}

/* The snapshot's entries, packed (hash u64, group u8, tier u8) while the
 * GIL is released; turned into a list after. */
typedef struct snapbuf {
    uint8_t *p;
    size_t n, cap;
    int oom;
} snapbuf;

static void snap_add(void *arg, uint64_t hash, unsigned group, unsigned tier)
{
    snapbuf *b = arg;
    if (b->oom)
        return;
    if (b->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        uint8_t *np = realloc(b->p, nc * 10);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n * 10, &hash, 8);
    b->p[b->n * 10 + 8] = (uint8_t)group;
    b->p[b->n * 10 + 9] = (uint8_t)tier;
    b->n++;
}

/* kv_snapshot() -> (seq, [(hash, group, tier)]) or an error code */
static PyObject *Client_kv_snapshot(Client *self, PyObject *unused)
{
    (void)unused;
    snapbuf b = {0};
    uint64_t seq = 0;
    int64_t rc = enter(self);
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvp_client_kv_snapshot(self->c, &seq, snap_add, &b);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    if (rc >= 0 && b.oom)
        rc = KVP_ENOMEM;
    PyObject *out = NULL, *l = NULL;
    if (rc < 0) {
        out = PyLong_FromLongLong(rc);
        goto done;
    }
    if (!(l = PyList_New((Py_ssize_t)b.n)))
        goto done;
    for (size_t i = 0; i < b.n; i++) {
        uint64_t h;
        memcpy(&h, b.p + i * 10, 8);
        PyObject *t = Py_BuildValue("(KII)", (unsigned long long)h, (unsigned)b.p[i * 10 + 8],
                                    (unsigned)b.p[i * 10 + 9]);
        if (!t) {
            Py_CLEAR(l);
            goto done;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    out = Py_BuildValue("(KN)", (unsigned long long)seq, l);
    l = NULL;
done:
    Py_XDECREF(l);
    free(b.p);
    return out;
}

static PyObject *Client_remove_all(Client *self, PyObject *args_, PyObject *kw)
{
    static char *names[] = {"force", NULL};
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args_, kw, "|p:remove_all", names, &force))
        return NULL;
    int64_t r = enter(self);
    if (r == 0) {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_client_remove_all(self->c, force);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    return PyLong_FromLongLong(r);
}

static PyObject *Client_remove_regex(Client *self, PyObject *args_, PyObject *kw)
{
    static char *names[] = {"pattern", "force", NULL};
    const char *pat;
    Py_ssize_t plen;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args_, kw, "s#|p:remove_regex", names, &pat, &plen, &force))
        return NULL;
    if (strlen(pat) != (size_t)plen)
        return PyLong_FromLong(KVP_EINVALID_PARAMS);
    int64_t r = enter(self);
    if (r == 0) {
        Py_BEGIN_ALLOW_THREADS
        r = kvp_client_remove_regex(self->c, pat, force);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    return PyLong_FromLongLong(r);
}

/* A text answer of unknown length: grows the buffer on BUFFER_OVERFLOW.
 * Returns str, or int (negative code). */
typedef int (*text_fn)(kvp_client *c, const char *key, char *buf, size_t len);

static int stat_fn(kvp_client *c, const char *key, char *buf, size_t len)
{
    (void)key;
    return kvp_client_stat(c, buf, len);
}

static PyObject *text_call(Client *self, const char *key, text_fn fn)
{
    int rc = enter(self);
    if (rc)
        return PyLong_FromLong(rc);
    size_t cap = 4096;
    char *buf = NULL;
    for (;;) {
        char *nb = PyMem_Realloc(buf, cap);
        if (!nb) {
            rc = KVP_ENOMEM;
            break;
        }
        buf = nb;
        Py_BEGIN_ALLOW_THREADS
        rc = fn(self->c, key, buf, cap);
        Py_END_ALLOW_THREADS
        if (rc != KVP_EBUFFER_OVERFLOW || cap >= (64u << 20))
            break;
        cap *= 4;
    }
    leave(self);
    PyObject *out = rc >= 0 ? PyUnicode_DecodeUTF8(buf, rc, "replace") : PyLong_FromLong(rc);
    PyMem_Free(buf);
    return out;
}

static PyObject *Client_describe(Client *self, PyObject *args_, PyObject *kw)
{
    static char *names[] = {"key", "json", NULL};
    const char *key;
    Py_ssize_t klen;
    int json = 0;
    if (!PyArg_ParseTupleAndKeywords(args_, kw, "s#|p:describe", names, &key, &klen, &json))
        return NULL;
    if (strlen(key) != (size_t)klen)
        return PyLong_FromLong(KVP_EINVALID_KEY);
    return text_call(self, key, json ? kvp_client_describe_json : kvp_client_describe);
}

static PyObject *Client_stat(Client *self, PyObject *unused) { return text_call(self, "", stat_fn); }

/* kvp_client_stats: [(path name, put_bytes, get_bytes, put_ops, get_ops)]
 * in enum kvp_path order, or the error code. No request: no GIL release. */
static PyObject *Client_transfer_stats(Client *self, PyObject *unused)
{
    (void)unused;
    kvp_transfer_stats ts;
    kvp_transfer_stats_init(&ts);
    int rc = enter(self);
    if (rc == 0) {
        rc = kvp_client_stats(self->c, &ts);
        leave(self);
    }
    if (rc)
        return PyLong_FromLong(rc);
    PyObject *l = PyList_New(KVP_NPATHS);
    for (int p = 0; l && p < KVP_NPATHS; p++) {
        const kvp_path_stats *x = &ts.path[p];
        PyObject *t = Py_BuildValue("(sKKKK)", kvp_path_name(p), (unsigned long long)x->put_bytes,
                                    (unsigned long long)x->get_bytes,
                                    (unsigned long long)x->put_ops, (unsigned long long)x->get_ops);
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, p, t);
    }
    return l;
}

/*
 * 1 when [p, p+len) lies in mappings of this process that are readable and
 * writable (/proc/self/maps, sorted by address), else 0. A range a Python
 * caller registers is read and written by C later: an unmapped or
 * read-only range (or device memory, reserved PROT_NONE in this address
 * space) is refused here rather than faulting then.
 */
int kvp_py_range_mapped_rw(uintptr_t p, size_t len)
{
    return kvp_gpu_host_mapped((const void *)p, len);
}

static PyObject *Client_register(Client *self, PyObject *args_)
{
    PyObject *po, *lo;
    size_t p, len;
    if (!PyArg_ParseTuple(args_, "OO:register_buffer", &po, &lo))
        return NULL;
    if (as_size(po, "buffer address", 0, &p) || as_size(lo, "size", 0, &len))
        return NULL;
    /* the C side decides what the range is: host memory mapped read-write
     * here, or device memory the CUDA driver knows; anything else refused */
    int rc = enter(self);
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvp_client_register_buffer(self->c, (void *)(uintptr_t)p, len);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    return PyLong_FromLong(rc);
}

static PyObject *Client_unregister(Client *self, PyObject *po)
{
    size_t p;
    if (as_size(po, "buffer address", 0, &p))
        return NULL;
    int rc = enter(self);
    if (rc == 0) {
        /* new calls refuse the range from here; calls already past their
         * range check may still move bytes there: wait for them, so the
         * caller may free the memory once this returns */
        rc = kvp_client_unregister_buffer(self->c, (void *)(uintptr_t)p);
        if (rc == 0) {
            Py_BEGIN_ALLOW_THREADS
            wait_calls_before(self);
            Py_END_ALLOW_THREADS
        }
        leave(self);
    }
    return PyLong_FromLong(rc);
}

static PyObject *Client_check_registered(Client *self, PyObject *args_)
{
    PyObject *po, *lo;
    size_t p, len;
    if (!PyArg_ParseTuple(args_, "OO:check_registered", &po, &lo))
        return NULL;
    if (as_size(po, "buffer address", 0, &p) || as_size(lo, "size", 0, &len))
        return NULL;
    int rc = enter(self);
    if (rc == 0) {
        kvp_iov v = {(void *)(uintptr_t)p, len};
        rc = kvp_client_check_registered(self->c, &v, 1);
        leave(self);
    }
    return PyLong_FromLong(rc);
}

static PyObject *Client_segment_name(Client *self, void *unused)
{
    if (enter(self))
        return PyUnicode_FromString("");
    PyObject *s = PyUnicode_FromString(kvp_client_segment_name(self->c));
    leave(self);
    return s;
}

static PyObject *Client_disk_reads(Client *self, void *unused)
{
    if (enter(self))
        return PyLong_FromLong(0);
    PyObject *n = PyLong_FromUnsignedLongLong(kvp_client_disk_reads(self->c));
    leave(self);
    return n;
}

static PyObject *Client_tenant(Client *self, void *unused)
{
    if (enter(self))
        return PyUnicode_FromString("");
    PyObject *s = PyUnicode_FromString(kvp_client_tenant(self->c));
    leave(self);
    return s;
}

static PyMethodDef Client_methods[] = {
    {"close", (PyCFunction)Client_close, METH_NOARGS,
     "close(): waits for calls in flight, then closes; later calls return KVP_ECLOSED"},
    {"put_buffers", (PyCFunction)(void (*)(void))Client_put_buffers, METH_VARARGS | METH_KEYWORDS,
     "put_buffers(keys, values, replica_num=None, flags=None, preferred=None) -> list[int]"},
    {"put_ptrs", (PyCFunction)(void (*)(void))Client_put_ptrs, METH_VARARGS | METH_KEYWORDS,
     "put_ptrs(keys, ptrs, sizes, replica_num=None, flags=None, preferred=None) -> list[int]"},
    {"get_buffers", (PyCFunction)(void (*)(void))Client_get_buffers, METH_VARARGS | METH_KEYWORDS,
     "get_buffers(keys, buffers, exact=False) -> list[int]"},
    {"get_ptrs", (PyCFunction)(void (*)(void))Client_get_ptrs, METH_VARARGS | METH_KEYWORDS,
     "get_ptrs(keys, ptrs, sizes, exact=False) -> list[int]"},
    {"get_bytes", (PyCFunction)Client_get_bytes, METH_O, "get_bytes(keys) -> list[bytes | int]"},
    {"exist", (PyCFunction)Client_exist, METH_O, "exist(keys) -> list[int]: 1, 0 or < 0"},
    {"tiers", (PyCFunction)Client_tiers, METH_O,
     "tiers(keys) -> list[int]: TIER_DRAM | TIER_DISK bits, 0 absent, or < 0"},
    {"exist_lease", (PyCFunction)Client_exist_lease, METH_O,
     "exist_lease(keys) -> list[(int, int)]: (TIER_DRAM held | TIER_DISK | 0 | < 0, size)"},
    {"sizes", (PyCFunction)Client_sizes, METH_O, "sizes(keys) -> list[int]"},
    {"prefix", (PyCFunction)Client_prefix, METH_O, "prefix(keys) -> int"},
    {"lookup_hashes", (PyCFunction)Client_lookup_hashes, METH_VARARGS,
     "lookup_hashes(hashes, lens, groups) -> [(dram, disk, any)] or code"},
    {"kv_snapshot", (PyCFunction)Client_kv_snapshot, METH_NOARGS,
     "kv_snapshot() -> (seq, [(hash, group, tier)]) or code"},
    {"remove", (PyCFunction)(void (*)(void))Client_remove, METH_VARARGS | METH_KEYWORDS,
     "remove(keys, force=False) -> list[int]"},
    {"remove_all", (PyCFunction)(void (*)(void))Client_remove_all, METH_VARARGS | METH_KEYWORDS,
     "remove_all(force=False) -> int"},
    {"remove_regex", (PyCFunction)(void (*)(void))Client_remove_regex, METH_VARARGS | METH_KEYWORDS,
     "remove_regex(pattern, force=False) -> int: objects removed or < 0"},
    {"describe", (PyCFunction)(void (*)(void))Client_describe, METH_VARARGS | METH_KEYWORDS,
     "describe(key, json=False) -> str | int"},
    {"stat", (PyCFunction)Client_stat, METH_NOARGS, "stat() -> str (JSON) | int"},
    {"transfer_stats", (PyCFunction)Client_transfer_stats, METH_NOARGS,
     "transfer_stats() -> [(path, put_bytes, get_bytes, put_ops, get_ops)] | int"},
    {"register_buffer", (PyCFunction)Client_register, METH_VARARGS,
     "register_buffer(ptr, size) -> int"},
    {"unregister_buffer", (PyCFunction)Client_unregister, METH_O, "unregister_buffer(ptr) -> int"},
    {"check_registered", (PyCFunction)Client_check_registered, METH_VARARGS,
     "check_registered(ptr, size) -> int: 0 when [ptr, ptr+size) is inside a registered range"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Client_getset[] = {
    {"closed", (getter)Client_closed, NULL, "True once closed", NULL},
    {"segment_name", (getter)Client_segment_name, NULL, "embedded segment host:port or ''", NULL},
    {"tenant", (getter)Client_tenant, NULL, "the tenant of this client's keys", NULL},
    {"disk_reads", (getter)Client_disk_reads, NULL,
     "values read that a node had to stage from its SSD tier (kvp_client_disk_reads)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._native.Client",
    .tp_basicsize = sizeof(Client),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Client(config: str = '') -- a kvp_client (include/kvpool.h)",
    .tp_new = Client_new,
    .tp_init = (initproc)Client_init,
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
};

/* ============================================================ log bridge */
/*
 * The C core's log lines become `logging` records (kvpool/_log.py).
 *
 * Why a pipe and not a call into Python: lines are written by C threads
 * (node server threads, the heartbeat, store and load threads) that may
 * hold library mutexes. Taking the GIL there (PyGILState_Ensure) can
 * deadlock: a Python thread holding the GIL may be blocked on that very
 * mutex (a call that waits for a lock the logging thread holds). So the
 * sink (common/log.h) only formats a small binary record and write(2)s it
 * to a non-blocking pipe: no lock, no allocation, no GIL, never blocks.
 * A record is at most PIPE_BUF bytes, so each write is atomic: the pipe
 * holds whole records only, from any number of writer threads. A full
 * pipe drops the record and counts it (log_dropped); the reader reports
 * the count as a WARNING record.
 *
 * The reader is a Python daemon thread (_log.py): _log_wait blocks in
 * poll(2) without the GIL, _log_drain then reads the whole records waiting
 * (with the GIL, non-blocking) and returns them as tuples. flush() drains
 * from the calling thread too (Client.close, atexit), so the lines of a
 * short program are emitted before it ends.
 *
 * Record: u16 message length, u8 level, u8 module length, u32 nanoseconds,
 * i64 seconds (CLOCK_REALTIME), then the module name and the message.
 */
#define LOG_HDR 16
#define LOG_MOD_MAX 64
#define LOG_MSG_MAX 1024
_Static_assert(LOG_HDR + LOG_MOD_MAX + LOG_MSG_MAX <= PIPE_BUF, "one atomic write per record");

static atomic_int log_wfd = -1, log_rfd = -1;
static atomic_ulong log_dropped;
static pid_t log_pid; /* the process that made the pipe (a forked child makes its own) */

static void log_sink_fn(void *ctx, const kvp_log_record *r)
{
    uint8_t rec[LOG_HDR + LOG_MOD_MAX + LOG_MSG_MAX];
    size_t ml = strlen(r->mod), n = r->msg_len;
    if (ml > LOG_MOD_MAX)
        ml = LOG_MOD_MAX;
    if (n > LOG_MSG_MAX)
        n = LOG_MSG_MAX;
    uint16_t n16 = (uint16_t)n;
    uint32_t ns = (uint32_t)r->time.tv_nsec;
    int64_t sec = (int64_t)r->time.tv_sec;
    memcpy(rec, &n16, 2);
    rec[2] = (uint8_t)r->level;
    rec[3] = (uint8_t)ml;
    memcpy(rec + 4, &ns, 4);
    memcpy(rec + 8, &sec, 8);
    memcpy(rec + LOG_HDR, r->mod, ml);
    memcpy(rec + LOG_HDR + ml, r->msg, n);
    size_t len = LOG_HDR + ml + n;
    int fd = atomic_load(&log_wfd);
    ssize_t w = fd >= 0 ? write(fd, rec, len) : -1;
    if (w != (ssize_t)len)
        atomic_fetch_add(&log_dropped, 1);
}

static const kvp_log_sink log_sink = {log_sink_fn, NULL};

/* _log_start(): makes the pipe (once per process: a forked child, where
 * the parent's reader thread does not exist, gets a new one) and routes
 * the core's lines to it. True when this call made a new pipe (the caller
 * then starts a reader thread). */
static PyObject *mod_log_start(PyObject *m, PyObject *unused)
{
    if (atomic_load(&log_rfd) >= 0 && log_pid == getpid())
        Py_RETURN_FALSE;
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20); /* room for bursts; the default if refused */
    int ow = atomic_exchange(&log_wfd, p[1]), orf = atomic_exchange(&log_rfd, p[0]);
    /* a forked child: only this thread exists, no writer can hold the old fds */
    if (ow >= 0)
        close(ow);
    if (orf >= 0)
        close(orf);
    log_pid = getpid();
    kvp_log_set_sink(&log_sink);
    Py_RETURN_TRUE;
}

/* _log_wait(timeout_ms): blocks (GIL released) until a record waits or
 * the timeout (< 0: none) passes; True when one waits. */
static PyObject *mod_log_wait(PyObject *m, PyObject *arg)
{
    long t = PyLong_AsLong(arg);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    int fd = atomic_load(&log_rfd), r;
    if (fd < 0)
        Py_RETURN_FALSE;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    Py_BEGIN_ALLOW_THREADS
    do
        r = poll(&pfd, 1, t < 0 ? -1 : t > INT32_MAX ? INT32_MAX : (int)t);
    while (r < 0 && errno == EINTR && t < 0);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(r > 0 && (pfd.revents & POLLIN));
}

/* Reads exactly n bytes that are known to be in the pipe; 0 or -1. */
static int log_read_n(int fd, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* _log_drain() -> ([(level, module, message, time), ...], dropped): the
 * records waiting now (at most 4096), read without blocking, and the
 * count of records dropped since the last call. The GIL is held
 * throughout, so two drains never interleave their reads. */
static PyObject *mod_log_drain(PyObject *m, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    int fd = atomic_load(&log_rfd);
    for (int i = 0; fd >= 0 && i < 4096; i++) {
        uint8_t h[LOG_HDR], body[LOG_MOD_MAX + LOG_MSG_MAX];
        ssize_t r = read(fd, h, sizeof h);
        if (r < 0 && errno == EINTR) {
            i--;
            continue;
        }
        if (r <= 0)
            break; /* EAGAIN: nothing more */
        uint16_t n;
        uint32_t ns;
        int64_t sec;
        memcpy(&n, h, 2);
        memcpy(&ns, h + 4, 4);
        memcpy(&sec, h + 8, 8);
        size_t ml = h[3];
        /* whole records only (atomic writes): a short one means a broken
         * pipe protocol; stop rather than misparse */
        if (r != LOG_HDR || ml > LOG_MOD_MAX || n > LOG_MSG_MAX ||
            log_read_n(fd, body, ml + n) != 0)
            break;
        PyObject *t = Py_BuildValue("(is#s#d)", (int)h[2], (const char *)body, (Py_ssize_t)ml,
                                    (const char *)body + ml, (Py_ssize_t)n,
                                    (double)sec + (double)ns / 1e9);
        if (!t) { /* undecodable bytes: replace rather than lose the line */
            PyErr_Clear();
            PyObject *mod = PyUnicode_DecodeUTF8((const char *)body, (Py_ssize_t)ml, "replace");
            PyObject *msg = PyUnicode_DecodeUTF8((const char *)body + ml, (Py_ssize_t)n,
                                                 "replace");
            t = mod && msg ? Py_BuildValue("(iOOd)", (int)h[2], mod, msg,
                                           (double)sec + (double)ns / 1e9)
                           : NULL;
            Py_XDECREF(mod);
            Py_XDECREF(msg);
        }
        if (!t || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(t);
    }
    unsigned long dropped = atomic_exchange(&log_dropped, 0);
    PyObject *res = Py_BuildValue("(Ok)", list, dropped);
    Py_DECREF(list);
    return res;
}

/* set_log_level(n): the C core's process level (0 debug .. 4 off);
 * get_log_level() -> n. */
static PyObject *mod_set_log_level(PyObject *m, PyObject *arg)
{
    long lv = PyLong_AsLong(arg);
    if (lv == -1 && PyErr_Occurred())
        return NULL;
    if (lv < KVP_LOG_DEBUG || lv > KVP_LOG_OFF) {
        PyErr_SetString(PyExc_ValueError, "log level: 0 (debug) .. 4 (off)");
        return NULL;
    }
    kvp_log_set_level((int)lv);
    Py_RETURN_NONE;
}

static PyObject *mod_get_log_level(PyObject *m, PyObject *unused)
{
    return PyLong_FromLong(kvp_log_get_level());
}

/* ============================================================== module */

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvp_strerror((int)code));
}

static PyObject *mod_err_name(PyObject *m, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvp_err_name((int)code));
}

static PyMethodDef mod_methods[] = {
    {"strerror", mod_strerror, METH_O, "strerror(code) -> str"},
    {"err_name", mod_err_name, METH_O, "err_name(code) -> str, e.g. 'OBJECT_NOT_FOUND'"},
    {"_log_start", mod_log_start, METH_NOARGS, "routes the core's log lines to the log pipe"},
    {"_log_wait", mod_log_wait, METH_O, "_log_wait(timeout_ms) -> bool (GIL released)"},
    {"_log_drain", mod_log_drain, METH_NOARGS, "_log_drain() -> (records, dropped)"},
    {"set_log_level", mod_set_log_level, METH_O, "set_log_level(0 debug .. 4 off)"},
    {"get_log_level", mod_get_log_level, METH_NOARGS, "get_log_level() -> 0 debug .. 4 off"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "kvpool._native", "kvpool's C client (include/kvpool.h).", -1,
    mod_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&ClientType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    OpenError = PyErr_NewException("kvpool._native.OpenError", NULL, NULL);
    PyObject *codes = PyDict_New();
    if (!OpenError || !codes || PyModule_AddObjectRef(m, "OpenError", OpenError) < 0 ||
        PyModule_AddObjectRef(m, "Client", (PyObject *)&ClientType) < 0)
        goto fail;
#define KVP__PY_CODE(name, num, msg)                                                             \
    do {                                                                                         \
        PyObject *v = PyLong_FromLong(num);                                                      \
        if (!v || PyDict_SetItemString(codes, #name, v) < 0) {                                   \
            Py_XDECREF(v);                                                                       \
            goto fail;                                                                           \
        }                                                                                        \
        Py_DECREF(v);                                                                            \
    } while (0);
    KVP_ERRNO_MAP(KVP__PY_CODE)
#undef KVP__PY_CODE
    if (PyModule_AddObject(m, "codes", codes) < 0)
        goto fail;
    codes = NULL;
    if (PyModule_AddStringConstant(m, "version", kvp_version()) < 0 ||
        PyModule_AddIntConstant(m, "PUT_HARD_PIN", KVP_PUT_HARD_PIN) < 0 ||
        PyModule_AddIntConstant(m, "PUT_REPLACE", KVP_PUT_REPLACE) < 0 ||
        PyModule_AddIntConstant(m, "PUT_SOFT_PIN", KVP_PUT_SOFT_PIN) < 0 ||
        PyModule_AddIntConstant(m, "PUT_SOFT_UNPIN", KVP_PUT_SOFT_UNPIN) < 0 ||
        PyModule_AddIntConstant(m, "DEVICE_MEMORY", 1) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_PARENT", KVP_BLOCK_PARENT) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_NONE", KVP_BLOCK_NONE) < 0 ||
        PyModule_AddIntConstant(m, "TIER_DRAM", KVP_TIER_DRAM) < 0 ||
        PyModule_AddIntConstant(m, "TIER_DISK", KVP_TIER_DISK) < 0 ||
        kvp_py_conn_init(m, OpenError) < 0 || kvp_py_xq_init(m) < 0)
        goto fail;
    return m;
fail:
    Py_XDECREF(codes);
    Py_DECREF(m);
    return NULL;
}
