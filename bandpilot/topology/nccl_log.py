"""What did an nccl-tests run measure? Parse its stdout log (``all_reduce_perf``,
``all_gather_perf_mpi``, ...) into rows, the device table and a verdict.

The parser is driven by the column header that nccl-tests prints (``#  size  count  type  redop
root  time  algbw  busbw  #wrong ...``), so it copes with the layouts of the last years of
nccl-tests/rccl-tests: two column groups (out-of-place + in-place) or one, with or without the
``redop``/``root`` columns, the legacy ``error`` column, ``#bitdiff``/per-iteration/timestamp
extras, ``N/A`` in ``#wrong`` (``-c 0``), ``mpirun --tag-output`` / ``srun --label`` prefixes and
interleaved NCCL INFO/WARN and stderr noise (even when it splits a data row in two).

One text is one run. Verdict failures (``#wrong`` > 0, ``FAILED``, ``Test failure``, malformed
or truncated rows) raise :class:`NcclParseError` in strict mode and give ``ok=False`` otherwise;
a log without any data row always raises.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from bandpilot.errors import BandPilotError

__all__ = [
    "NcclParseError",
    "NcclMeasure",
    "NcclRow",
    "NcclDevice",
    "NcclResult",
    "parse",
    "norm_collective",
]


class NcclParseError(BandPilotError, ValueError):
    """An nccl-tests log is unusable or reports a failure: ``<source>:<line>: <what is wrong>``."""


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


@dataclass(frozen=True)
class NcclDevice:
    """One line of the ``# Using devices`` table (``pid`` is None in logs that omit it)."""

    rank: int
    host: str
    pid: int | None
    device: int
    bus_id: str
    name: str


@dataclass(frozen=True)
class NcclResult:
    """A parsed log. ``problems`` lists every verdict failure (empty exactly when ``ok``)."""

    rows: tuple[NcclRow, ...]
    devices: tuple[NcclDevice, ...]
    collective: str | None
    avg_busbw: float | None
    out_of_bounds: int | None
    ok: bool
    source: str
    problems: tuple[str, ...] = ()

    @property
    def nranks(self) -> int | None:
        """Number of ranks from the device table (None when the log has no table)."""
        return len(self.devices) if self.devices else None

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(r.size for r in self.rows)

    def busbw_at(self, size_bytes: int) -> float:
        """Out-of-place busbw (GB/s) at exactly ``size_bytes`` (first row of that size)."""
        for row in self.rows:
            if row.size == size_bytes:
                return row.out_of_place.busbw
        have = f"{self.rows[0].size}..{self.rows[-1].size} ({len(self.rows)} rows)" if self.rows else "none"
        raise NcclParseError(f"{_clean(self.source)}: no data row with size {size_bytes} bytes (have {have})")


# ----------------------------------------------------------------------------------------------
# parsing

_A = re.ASCII
_TAG_RE = re.compile(r"\[\d+,\d+\]<(stdout|stderr)>:", _A)  # mpirun --tag-output
_LABEL_RE = re.compile(r"\s*\d+:\s", _A)  # srun --label
_NCCL_LINE_RE = re.compile(r"\S+:\d+:\d+ \[\d+\] NCCL ", _A)
# An NCCL log line that cut into a data row: hostnames start with a letter, the row ends in digits.
_NCCL_MID_RE = re.compile(r"[A-Za-z][\w.\-]*:\d+:\d+ \[\d+\] NCCL ", _A)
# A data row starts with its integer size, then a number (the count; a malformed one is reported,
# "2 more processes ..." is noise); a lone integer is a row cut after its size. The strict form
# (two integers) tells a new row from the second half of a row cut by an NCCL line.
_ROW_START_RE = re.compile(r"[0-9]+(?:\s+[-+.0-9]|\s*$)", _A)
_ROW_START_STRICT_RE = re.compile(r"[0-9]+\s+[0-9]+(?:\s|$)", _A)
_INT_RE = re.compile(r"[+-]?[0-9]+", _A)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", _A)
_NONFINITE_RE = re.compile(r"[+-]?(?:nan|inf|infinity)(?:\(\w*\))?", re.ASCII | re.IGNORECASE)
_DEVICE_RE = re.compile(
    r"#\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?(?:\s+Pid\s+(\d+))?\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*?)\s*$",
    _A,
)
_OOB_RE = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)", _A)
_AVG_RE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S*)", _A)
_STARTING_RE = re.compile(r"#\s*Collective test (?:starting|concluded)\s*:\s*(\S+)", _A)
_BINARY_RE = re.compile(r"(?:^|[\s/])([a-z][a-z0-9_]*_perf(?:_mpi)?)(?=\s|$)", _A)
_FAIL_RE = re.compile(r"\bFAILED\b|\bTest (?:NCCL |CUDA |HIP )?failure\b|\bCuda failure\b|\bTest timeout\b", _A)

class _RowError(Exception):
    """Internal: a data row is malformed; the message has no location yet."""


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
            raise _RowError(f"{col} is {tok} (NaN/inf) in data row")
        raise _RowError(f"non-numeric {col} value {_snip(tok, 20)!r} in data row")
    if not math.isfinite(float(tok)):
        raise _RowError(f"{col} value {_snip(tok, 20)} overflows in data row")
    raise _RowError(f"negative {col} value {tok} in data row")


def _int(tok: str, col: str) -> int:
    if tok.isdigit() and tok.isascii():
        return int(tok)
    if _INT_RE.fullmatch(tok) is None:
        raise _RowError(f"non-integer {col} value {_snip(tok, 20)!r} in data row")
    raise _RowError(f"negative {col} value {tok} in data row")


def _root(tok: str, col: str) -> int:
    return -1 if tok == "-1" else _int(tok, col)


def _wrong(tok: str, col: str) -> int | None:
    if tok == "N/A":
        return None
    if tok.isdigit() and tok.isascii():
        return int(tok)
    val = _num(tok, col)  # "%6g" prints 1e+06
    if val != int(val):
        raise _RowError(f"non-integer {col} value {tok} in data row")
    return int(val)


def _other(tok: str, col: str) -> float | None:
    """Columns we do not keep (legacy ``error``, ``#bitdiff``, ``i_min`` ...): numbers or N/A."""
    return None if tok == "N/A" else _num(tok, col)


def _text(tok: str, col: str) -> str:
    return tok


_Conv = Callable[[str, str], Any]
_PREFIX_CONV: dict[str, _Conv] = {"size": _int, "count": _int, "root": _root}
_GROUP_CONV: dict[str, _Conv] = {"time": _num, "cputime": _num, "algbw": _num, "busbw": _num}
_TIME_COLS = frozenset({"time", "cputime"})
_WRONG_COLS = frozenset({"#wrong", "wrong", "#errors"})
_GROUP_LABELS = ("out-of-place", "in-place")


@dataclass(frozen=True)
class _Layout:
    """Columns announced by the header: leading fields, then one tuple of names per group.

    ``__post_init__`` precomputes a converter per token and the token index of every kept field,
    because this runs once per header while :func:`_parse_row` runs once per data row.
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
_INFERRED = {
    13: _Layout(_PREFIX5, (_GROUP4, _GROUP4), 0, None),
    9: _Layout(_PREFIX5, (_GROUP4,), 0, None),
}


def _layout_from_header(tokens: list[str], line: int) -> _Layout | None:
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
    return _Layout(tuple(prefix), tuple(tuple(g) for g in groups), tail, line)


def _parse_row(tokens: list[str], layout: _Layout) -> NcclRow:
    need = layout.nfields
    if len(tokens) != need:
        if len(tokens) < need:
            raise _RowError(f"truncated data row: {len(tokens)} of {need} fields")
        raise _RowError(f"data row has {len(tokens)} fields, column header expects {need}")
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
    groups = tuple(
        NcclMeasure(vals[t], vals[a], vals[b], vals[w] if w is not None else None)
        for t, a, b, w in layout.slots
    )
    return NcclRow(vals[0], count, type_, redop, root, groups)


def _snip(s: str, n: int = 80) -> str:
    """One printable line of at most ``n`` characters, for quoting log text in messages."""
    s = " ".join("".join(c if c.isprintable() else " " for c in s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _clean(source: str) -> str:
    return _snip(str(source), 200) or "<string>"


def norm_collective(name: str) -> str:
    """``/opt/build/all_gather_perf_mpi`` -> ``all_gather_perf`` (MPI and plain builds compare equal)."""
    name = name.rsplit("/", 1)[-1]
    return name[:-4] if name.endswith("_mpi") else name


def parse(text: str, source: str = "<string>", *, strict: bool = True) -> NcclResult:
    """Parse one nccl-tests run from its stdout (noise tolerated); see the module docstring."""
    src = _clean(source)
    lines = text.split("\n")
    if not text.strip():
        raise NcclParseError(f"{src}:1: empty log (no nccl-tests output)")

    rows: list[NcclRow] = []
    devices: list[NcclDevice] = []
    problems: list[tuple[int, str]] = []
    layout: _Layout | None = None
    header_line: int | None = None
    collective: str | None = None
    collective_explicit = False
    avg: float | None = None
    avg_seen = False
    oob: int | None = None
    pending: tuple[str, int] | None = None  # data row cut by an NCCL log line
    last_row: tuple[int, int, int, int] | None = None  # (line, nfields, need, problem index or -1)

    def handle_row(body: str, ln: int) -> None:
        nonlocal pending, last_row
        m = _NCCL_MID_RE.search(body) if "NCCL" in body else None
        if m is not None and m.start() > 0:
            body = body[: m.start()]
            if layout is None or len(body.split()) < layout.nfields:
                pending = (body, ln)  # the rest of the row follows the NCCL line
                return
        tokens = body.split()
        lay = layout
        if lay is None:
            lay = _INFERRED.get(len(tokens))
            if lay is None:
                return  # digits without any column header: not nccl-tests output
        try:
            row = _parse_row(tokens, lay)
        except _RowError as exc:
            problems.append((ln, f"{src}:{ln}: {exc}: {_snip(body)}"))
            last_row = (ln, len(tokens), lay.nfields, len(problems) - 1)
            return
        rows.append(row)
        last_row = (ln, len(tokens), lay.nfields, -1)
        for gi, meas in enumerate(row.groups):
            if meas.wrong:
                label = _GROUP_LABELS[gi] if gi < len(_GROUP_LABELS) else f"group {gi + 1}"
                problems.append(
                    (ln, f"{src}:{ln}: {meas.wrong} wrong elements ({label}) at size {row.size}: data validation failed")
                )

    def flush_pending() -> None:
        nonlocal pending
        if pending is not None:
            body, pln = pending
            pending = None
            handle_row(body + " ", pln)

    for ln, raw in enumerate(lines, 1):
        line = raw
        if line[:1] == "[":
            m = _TAG_RE.match(line)
            if m is not None:
                if m.group(1) == "stderr":
                    continue
                line = line[m.end() :]
        m = _LABEL_RE.match(line)
        if m is not None:
            line = line[m.end() :]
        s = line.strip()
        if not s:
            continue
        if s[0] == "#":
            flush_pending()
            flagged = False
            if "Rank" in s[:16]:
                dm = _DEVICE_RE.match(s)
                if dm is not None:
                    pid = dm.group(2)
                    devices.append(
                        NcclDevice(
                            int(dm.group(1)), dm.group(3), int(pid) if pid is not None else None,
                            int(dm.group(4)), dm.group(5), dm.group(6),
                        )
                    )
                    continue
            tokens = s[1:].split()
            if tokens and tokens[0] == "size" and "busbw" in tokens:
                new = _layout_from_header(tokens, ln)
                if new is not None:
                    layout, header_line = new, ln
                continue
            m = _OOB_RE.match(s)
            if m is not None:
                oob = int(m.group(1))
                if oob > 0:
                    problems.append((ln, f"{src}:{ln}: {oob} out-of-bounds values: {_snip(s)}"))
                    flagged = True
            else:
                m = _AVG_RE.match(s)
                if m is not None:
                    avg_seen = True
                    tok = m.group(1)
                    if _FLOAT_RE.fullmatch(tok) and math.isfinite(float(tok)):
                        avg = float(tok)
                else:
                    m = _STARTING_RE.match(s)
                    if m is not None and not collective_explicit:
                        collective, collective_explicit = norm_collective(m.group(1)), True
            if not flagged and _FAIL_RE.search(s):
                problems.append((ln, f"{src}:{ln}: failure reported: {_snip(s)}"))
            continue
        if _NCCL_LINE_RE.match(s):
            continue  # NCCL INFO/WARN/TRACE noise; may arrive between the halves of a cut row
        if pending is not None and _ROW_START_STRICT_RE.match(s) is None:
            body, pln = pending
            pending = None
            handle_row(body + " " + s, pln)
            continue
        if _ROW_START_RE.match(s):
            flush_pending()
            handle_row(s, ln)
            continue
        if _FAIL_RE.search(s):
            problems.append((ln, f"{src}:{ln}: failure reported: {_snip(s)}"))
        elif not collective_explicit and collective is None:
            bm = _BINARY_RE.search(s)
            if bm is not None:
                collective = norm_collective(bm.group(1))
    flush_pending()

    if last_row is not None and not avg_seen:
        lln, nf, need, pi = last_row
        if pi >= 0 and nf < need:
            problems[pi] = (
                lln,
                f"{src}:{lln}: truncated log: last data row has {nf} of {need} fields "
                "and there is no '# Avg bus bandwidth' line",
            )

    if not rows:
        if problems:
            raise NcclParseError(min(problems)[1])
        if header_line is not None:
            raise NcclParseError(f"{src}:{header_line}: column header but no data rows follow")
        raise NcclParseError(f"{src}:{len(lines)}: no nccl-tests data rows found in {len(lines)} lines")
    problems.sort(key=lambda p: p[0])
    if strict and problems:
        more = f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise NcclParseError(problems[0][1] + more)
    return NcclResult(
        rows=tuple(rows),
        devices=tuple(devices),
        collective=collective,
        avg_busbw=avg,
        out_of_bounds=oob,
        ok=not problems,
        source=src,
        problems=tuple(p[1] for p in problems),
    )
