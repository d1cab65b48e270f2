/*
 * _xq.c -- kvpool._native.XferQueue: the asynchronous transfer queue
 * (src/client/xq.h) over a kvpool._native.Client, for callers that must not
 * wait on transfers (kvpool.vllm_tier).
 *
 *   q = XferQueue(client, threads)
 *   q.submit(job_id, "put" | "get", keys, addrs, size) -> 0 or < 0
 *   q.poll() -> [(job_id, op, [result per key], bytes, seconds)]
 *   q.pending() -> int; q.drain(); q.close()
 *
 * Contracts: every range [addrs[i], addrs[i] + size) must lie in memory
 * registered with the client (checked at submit: KVP_EINVALID_PARAMS, the
 * job is not queued); the caller keeps that memory mapped and, for a put,
 * unchanged until the job was polled or drain() returned. The queue's
 * threads run each job inside a call of the Client (its enter/leave), so
 * closing the client waits for running jobs and fails later ones with
 * KVP_ECLOSED for every key. The queue holds a reference to its client.
 * drain() and close() release the GIL while they wait. close() (also run
 * at deallocation) drains, ends the threads and drops unpolled results.
 */
#include <Python.h>
#include <pthread.h>

#include "_native.h"
#include "client/xq.h"
#include "kvpool.h"

typedef struct {
    PyObject_HEAD
    PyObject *client; /* kvpool._native.Client, strong */
    kvp_xq *q;        /* NULL once closed */
    pthread_mutex_t mu; /* guards q against close racing another thread's call */
    int users;        /* calls using q outside the GIL */
    int init_done;
} XferQueue;

static PyObject *XferQueue_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    XferQueue *self = (XferQueue *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    self->init_done = 1;
    return (PyObject *)self;
}

static int XferQueue_init(XferQueue *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"client", "threads", NULL};
    PyObject *client;
    int threads = 4;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:XferQueue", names, &client, &threads))
        return -1;
    if (!kvp_py_is_client(client)) {
        PyErr_SetString(PyExc_TypeError, "XferQueue(client): a kvpool._native.Client");
        return -1;
    }
    if (self->q) {
        PyErr_SetString(PyExc_RuntimeError, "XferQueue.__init__ may run only once");
        return -1;
    }
    int rc = kvp_py_client_enter(client);
    if (rc == 0) {
        kvp_xq_hooks h = {kvp_py_client_enter, kvp_py_client_leave, client};
        rc = kvp_xq_create(kvp_py_client_of(client), threads, &h, &self->q);
        kvp_py_client_leave(client);
    }
    if (rc) {
        PyErr_Format(PyExc_ValueError, "XferQueue: %s (%d)", kvp_strerror(rc), rc);
        return -1;
    }
    Py_INCREF(client);
    self->client = client;
    return 0;
}

/* The queue for a call (counted in users), or NULL with ValueError (closed). */
static kvp_xq *use(XferQueue *self)
{
    pthread_mutex_lock(&self->mu);
    kvp_xq *q = self->q;
    if (q)
        self->users++;
    pthread_mutex_unlock(&self->mu);
    if (!q)
        PyErr_SetString(PyExc_ValueError, "XferQueue is closed");
    return q;
}

static void unuse(XferQueue *self)
{
    pthread_mutex_lock(&self->mu);
    self->users--;
    pthread_mutex_unlock(&self->mu);
}

/* ------------------------------------------------------------------ submit */

/* Parses keys (str or bytes) and addrs into keys[n] / iovs[n]. 0 or -1. */
static int parse_job(PyObject *keys_t, PyObject *addrs_t, size_t size, const char **keys,
                     kvp_iov *iovs, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys_t, i);
        const char *s = NULL;
        Py_ssize_t len = 0;
        if (PyUnicode_Check(k))
            s = PyUnicode_AsUTF8AndSize(k, &len);
        else if (PyBytes_Check(k) && PyBytes_AsStringAndSize(k, (char **)&s, &len) == 0)
            ;
        else
            PyErr_Format(PyExc_TypeError, "key %zd: str or bytes", i);
        if (!s)
            return -1;
        if ((size_t)len != strlen(s)) {
            PyErr_Format(PyExc_ValueError, "key %zd: contains a NUL byte", i);
            return -1;
        }
        keys[i] = s;
        unsigned long long a = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(addrs_t, i));
        if (PyErr_Occurred())
            return -1;
        if (a == 0 || a > UINTPTR_MAX - size) {
            PyErr_Format(PyExc_ValueError, "address %zd: out of range", i);
            return -1;
        }
        iovs[i] = (kvp_iov){(void *)(uintptr_t)a, size};
    }
    return 0;
}

/* Submits after checking, inside a call of the client, that every range
 * is registered. 0 or < 0. GIL released by the caller. */
static int submit_checked(XferQueue *self, kvp_xq *q, uint64_t id, int op, const char **keys,
                          const kvp_iov *iovs, size_t n)
{
    int rc = kvp_py_client_enter(self->client);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = kvp_client_check_registered(kvp_py_client_of(self->client), &iovs[i], 1);
    kvp_py_client_leave(self->client);
    return rc ? rc : kvp_xq_submit(q, id, op, keys, iovs, n);
}

static PyObject *XferQueue_submit(XferQueue *self, PyObject *args)
{
    unsigned long long id;
    const char *opname;
    PyObject *keys, *addrs;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "KsOOn:submit", &id, &opname, &keys, &addrs, &size))
        return NULL;
    int op = strcmp(opname, "put") == 0 ? KVP_XQ_PUT : strcmp(opname, "get") == 0 ? KVP_XQ_GET : 0;
    if (!op || size <= 0) {
        PyErr_SetString(PyExc_ValueError, "submit: op is 'put' or 'get', size > 0");
        return NULL;
    }
    PyObject *kt = PySequence_Tuple(keys);
    PyObject *at = kt ? PySequence_Tuple(addrs) : NULL;
    const char **kv = NULL;
    kvp_iov *iv = NULL;
    PyObject *out = NULL;
    kvp_xq *q = NULL;
    if (!at)
        goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(kt);
    if (n == 0 || PyTuple_GET_SIZE(at) != n) {
        PyErr_Format(PyExc_ValueError, "submit: %zd keys and %zd addresses (at least one)", n,
                     PyTuple_GET_SIZE(at));
        goto done;
    }
    kv = PyMem_Calloc((size_t)n, sizeof *kv);
    iv = PyMem_Calloc((size_t)n, sizeof *iv);
    if (!kv || !iv) {
        PyErr_NoMemory();
        goto done;
    }
    if (parse_job(kt, at, (size_t)size, kv, iv, n) || !(q = use(self)))
        goto done;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = submit_checked(self, q, id, op, kv, iv, (size_t)n);
    Py_END_ALLOW_THREADS
    unuse(self);
    out = PyLong_FromLong(rc);
done:
    PyMem_Free(kv);
    PyMem_Free(iv);
    Py_XDECREF(kt);
    Py_XDECREF(at);
    return out;
}

/* -------------------------------------------------------------- poll, etc. */

/* (id, op, [results], bytes, seconds) of d. */
static PyObject *done_tuple(const kvp_xq_done *d)
{
    PyObject *res = PyList_New((Py_ssize_t)d->n);
    if (!res)
        return NULL;
    for (size_t i = 0; i < d->n; i++) {
        PyObject *v = PyLong_FromLongLong(d->results[i]);
        if (!v) {
            Py_DECREF(res);
            return NULL;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)i, v);
    }
    return Py_BuildValue("(KsNKd)", (unsigned long long)d->id,
                         d->op == KVP_XQ_PUT ? "put" : "get", res, (unsigned long long)d->bytes,
                         d->seconds);
}

static PyObject *XferQueue_poll(XferQueue *self, PyObject *unused)
{
    kvp_xq *q = use(self);
    if (!q)
        return NULL;
    PyObject *out = PyList_New(0);
    kvp_xq_done d[32];
    size_t m;
    do {
        m = kvp_xq_poll(q, d, 32); /* never blocks: the GIL stays */
        for (size_t i = 0; i < m; i++) {
            PyObject *t = out ? done_tuple(&d[i]) : NULL;
            if (!t || PyList_Append(out, t) < 0)
                Py_CLEAR(out);
            Py_XDECREF(t);
            kvp_xq_done_free(&d[i]); /* polled: gone from the queue either way */
        }
    } while (m == 32);
    unuse(self);
    return out;
}

static PyObject *XferQueue_pending(XferQueue *self, PyObject *unused)
{
    kvp_xq *q = use(self);
    if (!q)
        return NULL;
    size_t n = kvp_xq_pending(q);
    unuse(self);
    return PyLong_FromSize_t(n);
}

static PyObject *XferQueue_drain(XferQueue *self, PyObject *unused)
{
    kvp_xq *q = use(self);
    if (!q)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    kvp_xq_drain(q);
    Py_END_ALLOW_THREADS
    unuse(self);
    Py_RETURN_NONE;
}

/* Takes q away (later calls see it closed), waits for calls using it
 * (they drain or submit without the GIL), destroys it. GIL released. */
static void close_queue(XferQueue *self)
{
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    kvp_xq *q = self->q;
    self->q = NULL;
    pthread_mutex_unlock(&self->mu);
    for (;;) { /* users only ever drop now; each is a bounded call */
        pthread_mutex_lock(&self->mu);
        int busy = self->users;
        pthread_mutex_unlock(&self->mu);
        if (!busy)
            break;
        sched_yield();
    }
    kvp_xq_destroy(q);
    Py_END_ALLOW_THREADS
}

static PyObject *XferQueue_close(XferQueue *self, PyObject *unused)
{
    close_queue(self);
    Py_RETURN_NONE;
}

static void XferQueue_dealloc(XferQueue *self)
{
    if (self->init_done) {
        close_queue(self);
        pthread_mutex_destroy(&self->mu);
    }
    Py_XDECREF(self->client);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef XferQueue_methods[] = {
    {"submit", (PyCFunction)XferQueue_submit, METH_VARARGS,
     "submit(job_id, 'put'|'get', keys, addrs, size) -> 0 or a negative code"},
    {"poll", (PyCFunction)XferQueue_poll, METH_NOARGS,
     "poll() -> [(job_id, op, results, bytes, seconds)] of the jobs finished since"},
    {"pending", (PyCFunction)XferQueue_pending, METH_NOARGS,
     "pending() -> jobs submitted and not yet polled"},
    {"drain", (PyCFunction)XferQueue_drain, METH_NOARGS,
     "drain(): waits until no job is queued or running"},
    {"close", (PyCFunction)XferQueue_close, METH_NOARGS,
     "close(): drains, ends the threads, drops unpolled results"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject XferQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._native.XferQueue",
    .tp_basicsize = sizeof(XferQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "XferQueue(client, threads=4): asynchronous puts/gets over registered memory",
    .tp_new = XferQueue_new,
    .tp_init = (initproc)XferQueue_init,
    .tp_dealloc = (destructor)XferQueue_dealloc,
    .tp_methods = XferQueue_methods,
};

int kvp_py_xq_init(PyObject *m)
{
    if (PyType_Ready(&XferQueueType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "XferQueue", (PyObject *)&XferQueueType);
}
