"""The C core's log lines as ``logging`` records.

Every line the C core writes in a Python process (client, embedded node,
master, connector; any thread) becomes a record on the logger
``kvpool.<module>`` ("kvpool.client", "kvpool.node", "kvpool.segserver", ...,
children of ``kvpool``) with the matching level, instead of a raw stderr
line. So ``logging.getLogger("kvpool").setLevel(logging.ERROR)``, handlers
and pytest's caplog work on them like on any Python library's records.

How (kvpool/_native.c, "log bridge", and docs/ARCHITECTURE.md): C threads
never call into Python (they may hold C mutexes a Python thread waits on
while holding the GIL); they write each line as one small record into a
non-blocking pipe. A daemon thread here waits on the pipe without the GIL
and emits the records; ``flush()`` does the same from the calling thread
and runs when a Client closes and at interpreter exit, so no line of a
short program is lost. A full pipe drops lines; the count is reported as a
WARNING record on ``kvpool``.

Two filters apply: the C level (config ``log_level``, $KVPOOL_LOG_LEVEL,
``kvpool.set_log_level``) decides which lines are written at all, and the
Python loggers' levels and handlers decide which records are shown.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Union

from . import _native

LOGGER = logging.getLogger("kvpool")

# C level (common/log.h) -> logging level
_TO_PY = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}
_NAMES = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "warning": logging.WARNING, "error": logging.ERROR, "off": logging.CRITICAL + 10}

# Serialises draining and emitting, so records come out in the order the
# core wrote them whichever thread (reader, flush) emits them. Reentrant: a
# handler may close a Client (which flushes).
_lock = threading.RLock()


def _emit(records: list, dropped: int) -> None:
    for level, module, message, created in records:
        pylevel = _TO_PY.get(level, logging.ERROR)
        logger = logging.getLogger(f"kvpool.{module}") if module else LOGGER
        if not logger.isEnabledFor(pylevel):
            continue
        rec = logger.makeRecord(logger.name, pylevel, "<kvpool C core>", 0, message, None, None)
        # when the core wrote it, not when this thread got to it
        rec.created = created
        rec.msecs = (created - int(created)) * 1000.0
        rec.relativeCreated = (created - logging._startTime) * 1000.0  # type: ignore[attr-defined]
        logger.handle(rec)
    if dropped:
        LOGGER.warning("%d log lines of the C core were dropped (the log pipe was full)", dropped)


def flush() -> None:
    """Emits every line the C core has written so far (any thread may call it)."""
    with _lock:
        while True:
            records, dropped = _native._log_drain()
            if not records and not dropped:
                return
            _emit(records, dropped)


def _reader() -> None:
    while True:
        try:
            if _native._log_wait(-1):
                flush()
        except Exception:  # a broken handler must not end the bridge
            time.sleep(0.1)


def start() -> None:
    """Routes the core's lines into the pipe and starts the reader (once per
    process; a forked child gets its own pipe and thread)."""
    if _native._log_start():
        threading.Thread(target=_reader, name="kvpool-log", daemon=True).start()


def _c_level(level: int) -> int:
    if level <= logging.DEBUG:
        return 0
    if level <= logging.INFO:
        return 1
    if level <= logging.WARNING:
        return 2
    if level <= logging.ERROR:
        return 3
    return 4


def set_log_level(level: Union[int, str]) -> None:
    """Sets both filters at once: the ``kvpool`` logger's level and the C
    core's process level (lines below it are not even formatted). ``level``:
    a ``logging`` level (``logging.ERROR``) or a name ("debug", "info",
    "warn", "error", "off"). Beats $KVPOOL_LOG_LEVEL and the ``log_level`` of
    clients opened before; a client opened later with ``log_level`` sets the
    C level again (the last one wins)."""
    if isinstance(level, str):
        if level.lower() not in _NAMES:
            raise ValueError(f"log level {level!r} (allowed: debug, info, warn, error, off)")
        level = _NAMES[level.lower()]
    elif not isinstance(level, int) or isinstance(level, bool):
        raise TypeError("log level: a logging level (int) or a name")
    LOGGER.setLevel(level)
    _native.set_log_level(_c_level(level))


def _after_fork() -> None:
    # the parent's reader thread may have held the lock: it does not exist here
    global _lock
    _lock = threading.RLock()
    start()


start()
atexit.register(flush)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
