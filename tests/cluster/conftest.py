"""Fixtures of the cross-host fault tests: a cluster (etcd, masters, storage
nodes, a verifying client load) on hosts made of network namespaces, torn
down -- every process killed, every namespace deleted -- however the test
ends. Needs root, iproute2 and etcd; skips with the reason otherwise."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))

import cluster as cl  # noqa: E402


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # pytest then runs the finalizers: no namespace is left


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _sigterm)
    if not cl.unavailable():
        cl.nethosts.sweep_stale()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., cl.Cluster]]:
    """make_cluster(masters=2, nodes=2): a Cluster with its hosts made, nothing
    started; destroyed at the end of the test whatever happened."""
    why = cl.unavailable()
    if why:
        pytest.skip(why)
    made: list[cl.Cluster] = []

    def make(**kw) -> cl.Cluster:
        c = cl.Cluster(tmp_path, **kw)
        made.append(c)
        c.create()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.destroy()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The recovery times and loss counts the tests measured, also when
    they passed (pytest shows a passing test's output only with -s)."""
    import test_faults
    if test_faults.PRINT:
        terminalreporter.section("cluster measurements")
        for line in test_faults.PRINT:
            terminalreporter.write_line(line)
