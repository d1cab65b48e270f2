"""The code blocks of a Markdown document that are marked to be run by a test.

A marked block is a fenced block whose fence line follows, on the line just
above it, an HTML comment naming it:

    <!-- test: NAME [KEY=VALUE ...] -->
    ```bash
    kvpool serve &
    ```

The comment is invisible on a rendered page; NAME is unique in the file (a
second block of the same name is an error, so a copy-paste cannot hide one),
KEY=VALUE pairs are the block's attributes (what the test needs to know, such
as which host of a recipe runs it). Tests take the text verbatim. A block that
cannot run in a test says why instead, so that no block is left undecided:

    <!-- no-test: needs a GPU and a model -->"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MARK = re.compile(r"^<!--\s*test:\s*(\S+)((?:\s+[\w.-]+=\S+)*)\s*-->\s*$")
_FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
_SKIP = re.compile(r"^<!--\s*no-test:\s*\S.*-->\s*$")


@dataclass(frozen=True)
class Block:
    name: str
    lang: str
    text: str
    line: int  # 1-based line of the first line of the block's text
    attrs: dict[str, str] = field(default_factory=dict)


def blocks(path: str | Path) -> dict[str, Block]:
    """Every marked block of the file at path (relative: to the repository root), by name."""
    p = Path(path)
    if not p.is_absolute():
        p = ROOT / p
    lines = p.read_text().splitlines()
    out: dict[str, Block] = {}
    i = 0
    while i < len(lines):
        m = _MARK.match(lines[i].strip())
        if not m:
            i += 1
            continue
        name = m.group(1)
        attrs = dict(kv.split("=", 1) for kv in m.group(2).split())
        f = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not f:
            raise ValueError(f"{p.name}:{i + 1}: marker {name!r} is not followed by a fence")
        if name in out:
            raise ValueError(f"{p.name}:{i + 1}: a second block named {name!r}")
        fence, lang = f.group(1), f.group(2)
        j = i + 2
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        if j == len(lines):
            raise ValueError(f"{p.name}:{i + 2}: block {name!r} is never closed")
        out[name] = Block(name, lang, "\n".join(lines[i + 2 : j]) + "\n", i + 3, attrs)
        i = j + 1
    return out


def undecided(path: str | Path) -> list[int]:
    """Lines of the opening fences that are neither marked to run nor say why not."""
    p = Path(path)
    if not p.is_absolute():
        p = ROOT / p
    lines = p.read_text().splitlines()
    out, i, prev = [], 0, ""
    while i < len(lines):
        f = _FENCE.match(lines[i])
        if f:
            if not (_MARK.match(prev.strip()) or _SKIP.match(prev.strip())):
                out.append(i + 1)
            j = i + 1
            while j < len(lines) and lines[j].strip() != f.group(1):
                j += 1
            i, prev = j + 1, ""
            continue
        prev = lines[i]
        i += 1
    return out
