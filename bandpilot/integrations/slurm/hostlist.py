"""Slurm hostlist expressions (``h100-[0-3,7]``, ``rack[1-2]-n[01-04]``) expanded in Python, so a
state read costs two Slurm calls, not one ``scontrol show hostnames`` per job."""

from __future__ import annotations

import re

from bandpilot.integrations.slurm.commands import SlurmError

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top(expr: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p]


def _range(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        lo, _, hi = item.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise SlurmError(f"cannot read the hostlist {expr!r}: bad range {item!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for n in range(int(lo), int(hi or lo) + 1):
            out.append(f"{n:0{width}d}")
    return out


def expand(expr: str) -> list[str]:
    """Node names of a hostlist expression, in order (``(null)`` and empty: none)."""
    expr = expr.strip()
    if not expr or expr == "(null)":
        return []
    names: list[str] = []
    for part in _split_top(expr):
        m = _BRACKET.search(part)
        if not m:
            names.append(part)
            continue
        head, tail = part[: m.start()], part[m.end():]
        for mid in _range(m.group(1), expr):
            names.extend(expand(head + mid + tail))
    return names


def expand_indices(text: str) -> list[int]:
    """GPU indices of a gres IDX list: ``0-2,5`` -> [0, 1, 2, 5] (``N/A``: none)."""
    text = text.strip()
    if not text or text == "N/A":
        return []
    return [int(x) for x in _range(text, text)]
