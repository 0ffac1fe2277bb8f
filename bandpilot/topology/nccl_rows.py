"""How is one data row of an nccl-tests log laid out? The column header that nccl-tests prints
(``#  size  count  type  redop  root  time  algbw  busbw  #wrong ...``) becomes a :class:`Layout`
that converts each data row into an :class:`NcclRow`.

Split from :mod:`bandpilot.topology.nccl_log` (which reads whole logs and splits them into runs)
because the row level is the hot loop and has its own vocabulary: columns, converters, layouts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["NcclMeasure", "NcclRow", "RowError", "Layout", "INFERRED", "layout_from_header", "parse_row", "snip"]

_A = re.ASCII
_INT_RE = re.compile(r"[+-]?[0-9]+", _A)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", _A)
_NONFINITE_RE = re.compile(r"[+-]?(?:nan|inf|infinity)(?:\(\w*\))?", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True)
class NcclMeasure:
    """One column group of a data row; ``wrong`` is None when validation was off (``N/A``)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None = 0


@dataclass(frozen=True)
class NcclRow:
    """One message size; ``groups`` is out-of-place first, then in-place when the log has it."""

    size: int
    count: int
    type: str
    redop: str
    root: int
    groups: tuple[NcclMeasure, ...]

    @property
    def out_of_place(self) -> NcclMeasure:
        return self.groups[0]

    @property
    def in_place(self) -> NcclMeasure | None:
        return self.groups[1] if len(self.groups) > 1 else None


class RowError(Exception):
    """A data row is malformed; the message has no location yet."""


def _num(tok: str, col: str) -> float:
    """A finite, non-negative decimal number; the fast path is plain ``float`` (hot loop)."""
    try:
        val = float(tok)
        if val >= 0 and math.isfinite(val) and tok.isascii() and "_" not in tok:
            return val
    except ValueError:
        pass
    if _FLOAT_RE.fullmatch(tok) is None:
        if _NONFINITE_RE.fullmatch(tok):
            raise RowError(f"{col} is {tok} (NaN/inf) in data row")
        raise RowError(f"non-numeric {col} value {snip(tok, 20)!r} in data row")
    if not math.isfinite(float(tok)):
        raise RowError(f"{col} value {snip(tok, 20)} overflows in data row")
    raise RowError(f"negative {col} value {tok} in data row")


def _int(tok: str, col: str) -> int:
    if tok.isdigit() and tok.isascii():
        return int(tok)
    if _INT_RE.fullmatch(tok) is None:
        raise RowError(f"non-integer {col} value {snip(tok, 20)!r} in data row")
    raise RowError(f"negative {col} value {tok} in data row")


def _root(tok: str, col: str) -> int:
    return -1 if tok == "-1" else _int(tok, col)


def _wrong(tok: str, col: str) -> int | None:
    if tok == "N/A":
        return None
    if tok.isdigit() and tok.isascii():
        return int(tok)
    val = _num(tok, col)  # "%6g" prints 1e+06
    if val != int(val):
        raise RowError(f"non-integer {col} value {tok} in data row")
    return int(val)


def _measured(tok: str, col: str) -> float | None:
    """time/algbw/busbw; ``N/A`` where a fork or an unsupported in-place variant measured nothing."""
    return None if tok == "N/A" else _num(tok, col)


def _other(tok: str, col: str) -> float | None:
    """Columns we do not keep (legacy ``error``, ``#bitdiff``, ``i_min`` ...): numbers or N/A."""
    return None if tok == "N/A" else _num(tok, col)


def _text(tok: str, col: str) -> str:
    return tok


_Conv = Callable[[str, str], Any]
_PREFIX_CONV: dict[str, _Conv] = {"size": _int, "count": _int, "root": _root}
_GROUP_CONV: dict[str, _Conv] = {"time": _measured, "cputime": _measured, "algbw": _measured, "busbw": _measured}
_TIME_COLS = frozenset({"time", "cputime"})
_WRONG_COLS = frozenset({"#wrong", "wrong", "#errors"})
_GROUP_LABELS = ("out-of-place", "in-place")


@dataclass(frozen=True)
class Layout:
    """Columns announced by the header: leading fields, then one tuple of names per group.

    ``__post_init__`` precomputes a converter per token and the token index of every kept field,
    because this runs once per header while :func:`parse_row` runs once per data row.
    """

    prefix: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    tail: int  # trailing tokens (the two-token timestamp of report_timestamps)
    line: int | None  # header line, None when inferred
    plan: tuple[tuple[_Conv, str], ...] = field(init=False, repr=False, compare=False)
    where: dict[str, int] = field(init=False, repr=False, compare=False)
    slots: tuple[tuple[int, int, int, int | None], ...] = field(init=False, repr=False, compare=False)
    nfields: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        plan: list[tuple[_Conv, str]] = []
        where: dict[str, int] = {}
        for col in self.prefix:
            where.setdefault(col if col != "op" else "redop", len(plan))
            plan.append((_PREFIX_CONV.get(col, _text), col))
        slots: list[tuple[int, int, int, int | None]] = []
        for cols in self.groups:
            idx: dict[str, int] = {}
            for col in cols:
                kind = "time" if col in _TIME_COLS else "wrong" if col in _WRONG_COLS else col
                idx.setdefault(kind, len(plan))
                conv: _Conv = _GROUP_CONV.get(col) or (_wrong if kind == "wrong" else _other)
                plan.append((conv, col))
            slots.append((idx["time"], idx["algbw"], idx["busbw"], idx.get("wrong")))
        plan += [(_text, "timestamp")] * self.tail
        object.__setattr__(self, "plan", tuple(plan))
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "slots", tuple(slots))
        object.__setattr__(self, "nfields", len(plan))


_PREFIX5 = ("size", "count", "type", "redop", "root")
_GROUP4 = ("time", "algbw", "busbw", "#wrong")
INFERRED = {
    13: Layout(_PREFIX5, (_GROUP4, _GROUP4), 0, None),
    9: Layout(_PREFIX5, (_GROUP4,), 0, None),
}


def layout_from_header(tokens: list[str], line: int) -> Layout | None:
    """Build a layout from ``# size count ... busbw #wrong ...`` or None if it is not one."""
    prefix: list[str] = []
    groups: list[list[str]] = []
    tail = 0
    for tok in tokens:
        if tok == "timestamp":
            tail += 2  # printed as "%Y-%m-%d %H:%M:%S"
        elif tok in _TIME_COLS:
            groups.append([tok])
        elif groups:
            groups[-1].append(tok)
        else:
            prefix.append(tok)
    if not prefix or prefix[0] != "size" or not groups:
        return None
    if any("algbw" not in g or "busbw" not in g for g in groups):
        return None
    return Layout(tuple(prefix), tuple(tuple(g) for g in groups), tail, line)


def parse_row(tokens: list[str], layout: Layout) -> NcclRow:
    need = layout.nfields
    if len(tokens) != need:
        if len(tokens) < need:
            raise RowError(f"truncated data row: {len(tokens)} of {need} fields")
        raise RowError(f"data row has {len(tokens)} fields, column header expects {need}")
    vals = [conv(tok, col) for (conv, col), tok in zip(layout.plan, tokens)]
    where = layout.where
    i = where.get("count")
    count = vals[i] if i is not None else 0
    i = where.get("type")
    type_ = vals[i] if i is not None else ""
    i = where.get("redop")
    redop = vals[i] if i is not None else "none"
    i = where.get("root")
    root = vals[i] if i is not None else -1
    groups: list[NcclMeasure] = []
    for t, a, b, w in layout.slots:
        if vals[t] is None or vals[a] is None or vals[b] is None:
            if not groups:  # the out-of-place group is the measurement every consumer reads
                raise RowError("out-of-place time/algbw/busbw is N/A in data row")
            break  # an in-place group that measured nothing: the row keeps its out-of-place group
        groups.append(NcclMeasure(vals[t], vals[a], vals[b], vals[w] if w is not None else None))
    return NcclRow(vals[0], count, type_, redop, root, tuple(groups))


def snip(s: str, n: int = 80) -> str:
    """One printable line of at most ``n`` characters, for quoting log text in messages."""
    s = " ".join("".join(c if c.isprintable() else " " for c in s).split())
    return s if len(s) <= n else s[: n - 3] + "..."
