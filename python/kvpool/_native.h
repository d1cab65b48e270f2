/*
 * _native.h -- what the two halves of kvpool._native share: _native.c (the
 * store client, include/kvpool.h) and _conn.c (the engine connector,
 * include/kvpool_connector.h).
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

#endif
