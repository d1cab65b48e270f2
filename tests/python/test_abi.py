"""The C ABI the Python layer freezes: libkvpool.so exports exactly the
functions the public headers mark KVP_API, and the extension exports only its
init function (the core inside it is hidden)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import kvpool

ROOT = Path(__file__).resolve().parents[2]


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}


def declared() -> set[str]:
    names: set[str] = set()
    for h in ("kvpool.h", "kvpool_connector.h"):
        text = (ROOT / "include" / h).read_text()
        names |= set(re.findall(r"^KVP_API [^(;]*?\**\b(kvp_\w+)\(", text, re.M))
    return names


@pytest.fixture(scope="module")
def nm() -> None:
    if not shutil.which("nm"):
        pytest.skip("nm (binutils) is not installed")


def test_libkvpool_exports_only_the_public_api(nm: None) -> None:
    lib = ROOT / "build" / "libkvpool.so"
    if not lib.exists():
        pytest.skip("build/libkvpool.so not built (make)")
    want = declared()
    assert len(want) > 40
    assert exported(lib) == want


def test_extension_exports_only_its_init(nm: None) -> None:
    so = Path(kvpool._native.__file__)
    assert exported(so) == {"PyInit__native"}


def test_public_structs_carry_their_size() -> None:
    h = (ROOT / "include" / "kvpool.h").read_text()
    assert re.search(r"typedef struct kvp_put_opts \{\s*size_t struct_size;", h)
    c = (ROOT / "include" / "kvpool_connector.h").read_text()
    assert re.search(r"typedef struct kvp_conn_config \{\s*size_t struct_size;", c)
