"""The C core's log lines in a Python process are `logging` records
(kvpool/_log.py): on loggers "kvpool.<module>" with the matching level, so
logging's configuration, logger levels and pytest's caplog apply; the
configuration's log_level and kvpool.set_log_level filter at the C side.

Most checks run a short program in a subprocess (its stderr is what a user
would see) against a real `kvpool master`; its embedded client hosts a
64 MiB segment, whose node logs INFO lines while it starts and mounts."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

import kvpool
import kvpool_procs

# what the C core writes to stderr without the bridge: "2026-...Z I node: ..."
C_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [DIWE] \w+: ", re.M)
FMT = "PYLOG|%(name)s|%(levelname)s|%(message)s"

PROLOGUE = f"""
import logging, sys
logging.basicConfig(level=logging.DEBUG, format={FMT!r})
import kvpool
addr = sys.argv[1]
def open_client(**extra):
    return kvpool.Client(dict({{"master": addr, "mode": "embedded",
                                "global_segment_size": "64MiB"}}, **extra))
"""


def run(master: kvpool_procs.Proc, body: str, env_extra: dict | None = None) -> str:
    """Runs PROLOGUE + body with the master's address; returns its stderr."""
    env = dict(os.environ, PYTHONPATH=str(kvpool_procs.ROOT / "python"))
    env.pop("KVPOOL_LOG_LEVEL", None)
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", PROLOGUE + body, master.addr],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return r.stderr


def records(stderr: str, level: str | None = None) -> list[str]:
    """The PYLOG lines (of one level)."""
    return [ln for ln in stderr.splitlines()
            if ln.startswith("PYLOG|") and (level is None or ln.split("|")[2] == level)]


def test_c_lines_are_logging_records(master: kvpool_procs.Proc) -> None:
    err = run(master, """
c = open_client()
c.put("k", b"v")
assert c.get("k") == b"v"
c.close()
""")
    assert not C_LINE.search(err), err  # no raw C line: every one went through logging
    info = records(err, "INFO")
    assert any(ln.startswith("PYLOG|kvpool.node|INFO|segment ") and "mounted at master" in ln
               for ln in info), err
    assert {ln.split("|")[1] for ln in info} >= {"kvpool.node", "kvpool.segserver"}, err


def test_kvpool_logger_level_silences_info(master: kvpool_procs.Proc) -> None:
    err = run(master, """
logging.getLogger("kvpool").setLevel(logging.ERROR)
c = open_client()
c.put("k2", b"v")
c.close()
logging.getLogger("other").info("python's own INFO still shows")
""")
    assert not C_LINE.search(err), err
    assert records(err) == ["PYLOG|other|INFO|python's own INFO still shows"], err


def test_config_log_level_filters_at_the_c_side(master: kvpool_procs.Proc) -> None:
    err = run(master, """
import kvpool._native as n
c = open_client(log_level="error")
assert n.get_log_level() == 3, n.get_log_level()
c.put("k3", b"v")
c.close()
""")
    assert not C_LINE.search(err), err
    assert records(err) == [], err


def test_env_beats_config(master: kvpool_procs.Proc) -> None:
    err = run(master, """
c = open_client(log_level="debug")
c.close()
""", {"KVPOOL_LOG_LEVEL": "error"})
    assert records(err) == [] and not C_LINE.search(err), err


def test_set_log_level_sets_both_filters(master: kvpool_procs.Proc) -> None:
    err = run(master, """
import kvpool._native as n
kvpool.set_log_level("error")
assert logging.getLogger("kvpool").level == logging.ERROR
assert n.get_log_level() == 3
c = open_client()          # no log_level: the level stays
c.close()
kvpool.set_log_level(logging.INFO)
assert n.get_log_level() == 1
c = open_client()
c.close()
try:
    kvpool.set_log_level("loud")
except ValueError as e:
    print("REFUSED", e, file=sys.stderr)
""")
    assert not C_LINE.search(err), err
    # only the second client's lines
    assert [ln for ln in records(err, "INFO") if "mounted at master" in ln], err
    assert len([ln for ln in records(err, "INFO") if " served on " in ln]) == 1, err
    assert "REFUSED log level 'loud'" in err


def test_lines_of_a_short_program_are_not_lost(master: kvpool_procs.Proc) -> None:
    # no close(): the client is still open at exit; atexit flushes what it wrote
    err = run(master, """
c = open_client()
c.put("k4", b"v")
print("exiting", file=sys.stderr)
""")
    assert not C_LINE.search(err), err
    before = err.split("exiting")[0]
    assert any("mounted at master" in ln for ln in records(before, "INFO")), err


def test_forked_child_has_its_own_bridge(master: kvpool_procs.Proc) -> None:
    err = run(master, """
import os
pid = os.fork()
if pid == 0:
    c = open_client()
    c.close()
    os._exit(0)
_, st = os.waitpid(pid, 0)
assert st == 0
""")
    assert not C_LINE.search(err), err
    assert any("mounted at master" in ln for ln in records(err, "INFO")), err


def test_caplog_sees_records(master: kvpool_procs.Proc, caplog: pytest.LogCaptureFixture) -> None:
    if os.environ.get("KVPOOL_LOG_LEVEL"):
        pytest.skip("$KVPOOL_LOG_LEVEL set: it beats the configuration's log_level")
    caplog.set_level(logging.INFO, logger="kvpool")
    with kvpool.Client({"master": master.addr, "global_segment_size": "64MiB",
                        "log_level": "info"}) as c:
        c.put("caplog-key", b"value")
    recs = [r for r in caplog.records if r.name == "kvpool.node" and r.levelno == logging.INFO]
    assert any("mounted at master" in r.getMessage() for r in recs), caplog.text
    assert all(r.pathname == "<kvpool C core>" for r in recs)


def test_a_full_pipe_drops_lines_and_says_how_many(master: kvpool_procs.Proc) -> None:
    # The reader is held inside a handler while the core writes far more
    # lines than the pipe holds: the rest are dropped, never blocking the
    # writer, and the count comes out as a WARNING on "kvpool". Lines: a
    # failing open logs a DEBUG line per ignored Mooncake key ("config").
    err = run(master, """
import json, threading, kvpool._log as L, kvpool._native as n
kvpool.set_log_level("debug")
cfg = json.dumps({"device_name": "x", "metadata_server": "y", "rdma_devices": "z",
                  "mode": "bogus"})
def attempt():
    try:
        n.Client(cfg)
    except n.OpenError:
        pass
seen, gate, held = [], threading.Event(), threading.Event()
hold = False
class Gate(logging.Handler):
    def emit(self, r):
        global hold
        if hold:              # the first record after arming: wait for the gate
            hold = False
            held.set()
            gate.wait(60)
        seen.append(r.getMessage())
lg = logging.getLogger("kvpool.config")
lg.propagate = False
lg.addHandler(Gate())
attempt(); L.flush()          # calibrate: lines per attempt
per = len(seen)
assert per >= 1, per
seen.clear()
hold = True
attempt()                     # the reader takes these and is held in emit
assert held.wait(10)
N = 20000
for _ in range(N):
    attempt()
gate.set()
L.flush()
print("PER", per, "SEEN", len(seen), file=sys.stderr)
""")
    m = re.search(r"PER (\d+) SEEN (\d+)", err)
    assert m, err
    per, seen = int(m.group(1)), int(m.group(2))
    d = re.search(r"PYLOG\|kvpool\|WARNING\|(\d+) log lines of the C core were dropped "
                   r"\(the log pipe was full\)", err)
    assert d, err[-2000:]
    dropped = sum(int(x) for x in re.findall(r"(\d+) log lines of the C core were dropped", err))
    assert dropped > 0 and seen + dropped == per * 20001, (per, seen, dropped)
