"""The same scripted workload (mooncake_workload.py) against kvpool.mooncake and
against the REAL Mooncake wheel (mooncake-transfer-engine-non-cuda 0.3.13.post1,
run in a private network namespace by mooncake_real.py): the return values and
bytes of every step must be equal, except the deliberate differences below."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest

import kvpool_procs
import mooncake_real
import mooncake_workload
from kvpool.mooncake import MooncakeDistributedStore

# step -> (what kvpool answers, why it differs from Mooncake on purpose)
DELIBERATE: dict[str, tuple[Any, str]] = {
    "put_too_big_for_local_buffer": (
        0, "kvpool has no client staging buffer: a value larger than local_buffer_size is "
           "stored (Mooncake refuses it with -600)"),
    "is_exist_too_big": (1, "follows from the step above: the value was stored"),
    "remove_leased": (
        0, "kvpool's reads hold their lease only while bytes move and is_exist / get_size "
           "take none, so a key just read can be removed (Mooncake: -706 until its "
           "10 s lease expires)"),
    "remove_leased_force": (-704, "follows: the key was already removed by the step above"),
    "batch_remove_mixed": ([0, -704], "no lingering read lease (see remove_leased)"),
    "batch_remove_mixed_force": ([-704, -704], "follows: removed by the step above"),
    "remove_all": (
        None, "no lingering read leases: remove_all without force removes every key that "
              "was read (Mooncake skips them, 0); the count is whatever the workload left"),
    "remove_all_force": (0, "follows: remove_all already removed everything"),
}


@pytest.fixture(scope="module")
def real_records() -> list[Any]:
    recs, why = mooncake_real.run_real_mooncake_workload(timeout_s=90.0)
    if recs is None:
        pytest.skip(f"real Mooncake unavailable: {why}")
    return recs


@pytest.fixture(scope="module")
def kvpool_records() -> Iterator[list[Any]]:
    m = kvpool_procs.master("--lease-ttl", "30s", "--client-ttl", "60s")
    try:
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 256 << 20, 64 << 20, "tcp", "", m.addr) == 0
        recs = mooncake_workload.run(s, np.zeros(8 << 20, dtype=np.uint8))
        assert s.close() == 0
        yield recs
    finally:
        m.stop()


def test_same_steps(real_records: list[Any], kvpool_records: list[Any]) -> None:
    assert [r[0] for r in kvpool_records] == [r[0] for r in real_records]
    assert len(real_records) > 100


def test_same_results_except_deliberate(real_records: list[Any],
                                        kvpool_records: list[Any]) -> None:
    diffs = []
    for (step, theirs), (_, ours) in zip(real_records, kvpool_records):
        if step in DELIBERATE:
            want, _why = DELIBERATE[step]
            if want is not None and ours != want:
                diffs.append(f"{step}: kvpool {ours!r}, expected (deliberate) {want!r}")
            continue
        if ours != theirs:
            diffs.append(f"{step}: Mooncake {theirs!r}, kvpool {ours!r}")
    assert diffs == [], "\n".join(diffs)


def test_deliberate_differences_still_differ(real_records: list[Any]) -> None:
    """Each listed difference is real: Mooncake still answers otherwise."""
    theirs = dict((r[0], r[1]) for r in real_records)
    for step, (ours, _why) in DELIBERATE.items():
        assert step in theirs, step
        if ours is not None:
            assert theirs[step] != ours, f"{step} no longer differs: drop it from DELIBERATE"


def test_kvpool_alone_never_raises(kvpool_records: list[Any]) -> None:
    """Runs without the wheel too: no step of the workload raised, except
    where Mooncake raises too (a str value is not a buffer)."""
    raised = [r[0] for r in kvpool_records if isinstance(r[1], dict) and "raises" in r[1]]
    assert raised == [r[0] for r in kvpool_records if r[0] == "put_str_value"]
