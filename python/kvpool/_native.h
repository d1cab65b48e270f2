/*
 * _native.h -- what the two halves of kvpool._native share: _native.c (the
 * store client, include/kvpool.h), _conn.c (the engine connector,
 * include/kvpool_connector.h) and _xq.c (the asynchronous transfer queue).
 */
#ifndef KVPOOL_PY_NATIVE_H
#define KVPOOL_PY_NATIVE_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* 1 when [p, p+len) lies in readable and writable mappings of this process
 * (/proc/self/maps), else 0. Called without the GIL. */
int kvp_py_range_mapped_rw(uintptr_t p, size_t len);

/* Adds ConnSched, ConnRequest, ConnWorker and ConnError to module m; 0 or -1
 * with a Python exception set. open_error: the module's OpenError. */
int kvp_py_conn_init(PyObject *m, PyObject *open_error);

/* The store client of a kvpool._native.Client (o must be one: the caller
 * checks with kvp_py_is_client), for _xq.c. */
int kvp_py_is_client(PyObject *o);
struct kvp_client *kvp_py_client_of(PyObject *o);
/* A call on the Client o from any thread, GIL or not (what every method of
 * _native.c does around its C call): enter returns 0, or KVP_ECLOSED once
 * the client is closed; close waits for every call entered to leave. */
int kvp_py_client_enter(void *o);
void kvp_py_client_leave(void *o);

/* Adds XferQueue (the asynchronous transfer queue, src/client/xq.h) to
 * module m; 0 or -1 with a Python exception set. */
int kvp_py_xq_init(PyObject *m);

#endif
