"""scripts/plots on the committed results (bench/results): every PNG is
written and is a real PNG of the size asked for; results that lack a series,
a file or valid JSON give a message naming it, never a traceback."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "plots"
RESULTS = ROOT / "bench" / "results"
PNGS = ("store_throughput.png", "python_throughput.png", "ssd_tier_hit_rate.png",
        "sim_timeline.png")

pytestmark = pytest.mark.skipif(shutil.which("gnuplot") is None,
                                reason="gnuplot not installed (scripts/install-deps: gnuplot-nox)")


def run(results: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--results", str(results), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk; asserts the PNG signature."""
    data = path.read_bytes()
    assert len(data) > 33, f"{path}: {len(data)} bytes"
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, f"{path}: first chunk {kind!r}"
    return struct.unpack(">II", data[16:24])


def copy_results(tmp: Path) -> Path:
    d = tmp / "results"
    shutil.copytree(RESULTS, d)
    return d


def test_every_plot_from_the_committed_results(tmp_path: Path) -> None:
    r = run(RESULTS, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for name in PNGS:
        w, h = png_size(tmp_path / "out" / name)
        assert (w, h) == (900, 500), (name, w, h)
    assert not list((tmp_path / "out").glob("*.part"))


def test_a_missing_series_is_named_not_a_traceback(tmp_path: Path) -> None:
    res = copy_results(tmp_path)
    store = json.loads((res / "store.json").read_text())
    store["results"] = [x for x in store["results"] if x["system"] != "kvpool_tcp"]
    (res / "store.json").write_text(json.dumps(store))
    sim = json.loads((res / "sim.json").read_text())
    del sim["sim_sampled"]["timeline"]
    (res / "sim.json").write_text(json.dumps(sim))
    r = run(res, tmp_path / "out")
    assert "Traceback" not in r.stderr
    assert r.returncode == 0, r.stderr  # drawn without them
    assert "store.json: no kvpool_tcp results" in r.stderr
    assert "sim.json: the sim_sampled run has no timeline" in r.stderr
    for name in PNGS:
        png_size(tmp_path / "out" / name)


def test_a_file_without_its_data_is_named_and_the_others_drawn(tmp_path: Path) -> None:
    res = copy_results(tmp_path)
    (res / "sim_tier.json").unlink()
    (res / "python.json").write_text("{\"bench\": \"python\", \"results\": [")
    sim = json.loads((res / "sim.json").read_text())
    for k in ("sim", "sim_sampled"):
        del sim[k]["timeline"]
    (res / "sim.json").write_text(json.dumps(sim))
    r = run(res, tmp_path / "out")
    assert "Traceback" not in r.stderr
    assert r.returncode == 1
    assert "ssd_tier_hit_rate.png not written" in r.stderr and "sim_tier.json: no such file" in r.stderr
    assert "python_throughput.png not written" in r.stderr and "not valid JSON" in r.stderr
    assert "sim_timeline.png not written" in r.stderr and "no run with a timeline" in r.stderr
    png_size(tmp_path / "out" / "store_throughput.png")
    for name in ("python_throughput.png", "ssd_tier_hit_rate.png", "sim_timeline.png"):
        assert not (tmp_path / "out" / name).exists()
