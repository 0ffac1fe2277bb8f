"""What did an nccl-tests run measure? Parse its stdout log (``all_reduce_perf``,
``all_gather_perf_mpi``, ...) into rows, the device table and a verdict.

The parser is driven by the column header that nccl-tests prints (see
:mod:`bandpilot.topology.nccl_rows`), so it copes with the layouts of the last years of
nccl-tests/rccl-tests: two column groups (out-of-place + in-place) or one, with or without the
``redop``/``root`` columns, the legacy ``error`` column, ``#bitdiff``/per-iteration/timestamp
extras, ``N/A`` fields (``-c 0``, in-place ``#wrong``), ``mpirun --tag-output`` / ``srun --label``
prefixes and interleaved NCCL INFO/WARN and stderr noise (even when it splits a data row in two).

One log may hold several runs: wrapper scripts run all_reduce, all_gather, alltoall, ... back to
back into one file, each with its own ``# Collective test starting/concluded`` block (or, in older
versions, its own ``# nThread`` header). :func:`parse_all` returns every run; :func:`parse` returns
one - the collective asked for, or the only one - and refuses to guess when there are several.
Within a run, a data row printed twice (a ``tee`` artefact) is kept once.

Verdict failures (``#wrong`` > 0, ``FAILED``, ``Test failure``, malformed or truncated rows) raise
:class:`NcclParseError` in strict mode and give ``ok=False`` otherwise; a run without any data row
always raises.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bandpilot.errors import BandPilotError
from bandpilot.topology.nccl_rows import (
    INFERRED,
    Layout,
    NcclMeasure,
    NcclRow,
    RowError,
    layout_from_header,
    parse_row,
    snip,
)

__all__ = [
    "NcclParseError",
    "NcclMeasure",
    "NcclRow",
    "NcclDevice",
    "NcclResult",
    "parse",
    "parse_all",
    "norm_collective",
    "same_collective",
]


class NcclParseError(BandPilotError, ValueError):
    """An nccl-tests log is unusable or reports a failure: ``<source>:<line>: <what is wrong>``."""


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
    """One parsed run. ``problems`` lists every verdict failure (empty exactly when ``ok``);
    ``line`` is where the run starts in its log, ``duplicates`` the repeated data rows dropped."""

    rows: tuple[NcclRow, ...]
    devices: tuple[NcclDevice, ...]
    collective: str | None
    avg_busbw: float | None
    out_of_bounds: int | None
    ok: bool
    source: str
    problems: tuple[str, ...] = ()
    line: int = 1
    duplicates: int = 0

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
# lines

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
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", _A)
_DEVICE_RE = re.compile(
    r"#\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?(?:\s+Pid\s+(\d+))?\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*?)\s*$",
    _A,
)
_OOB_RE = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)", _A)
_AVG_RE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S*)", _A)
_STARTING_RE = re.compile(r"#\s*Collective test (starting|concluded)\s*:\s*(\S+)", _A)
_NTHREAD_RE = re.compile(r"#\s*nThread\s", _A)
_BINARY_RE = re.compile(r"(?:^|[\s/])([a-z][a-z0-9_]*_perf(?:_mpi)?)(?=\s|$)", _A)
_FAIL_RE = re.compile(r"\bFAILED\b|\bTest (?:NCCL |CUDA |HIP )?failure\b|\bCuda failure\b|\bTest timeout\b", _A)
_GROUP_LABELS = ("out-of-place", "in-place")


def _strip(raw: str) -> str | None:
    """The printed text of a log line without mpirun/srun prefixes; None for an mpirun stderr line."""
    line = raw
    if line[:1] == "[":
        m = _TAG_RE.match(line)
        if m is not None:
            if m.group(1) == "stderr":
                return None
            line = line[m.end() :]
    m = _LABEL_RE.match(line)
    if m is not None:
        line = line[m.end() :]
    return line.strip()


def _is_header(s: str) -> bool:
    tokens = s[1:].split()
    return bool(tokens) and tokens[0] == "size" and "busbw" in tokens


def _clean(source: str) -> str:
    return snip(str(source), 200) or "<string>"


def norm_collective(name: str) -> str:
    """``/opt/build/all_gather_perf_mpi`` -> ``all_gather_perf`` (MPI and plain builds compare equal)."""
    name = name.rsplit("/", 1)[-1]
    return name[:-4] if name.endswith("_mpi") else name


def _key(name: str) -> str:
    name = norm_collective(name.strip().lower())
    return name.removesuffix("_perf").replace("_", "").replace("-", "")


def same_collective(a: str, b: str) -> bool:
    """``all_reduce``, ``all_reduce_perf`` and ``/x/all_reduce_perf_mpi`` name the same collective."""
    return _key(a) == _key(b)


# ----------------------------------------------------------------------------------------------
# splitting a log into runs


def _is_preamble(s: str | None) -> bool:
    """Lines that may precede a run's start marker (version banner, command line, MPI and NCCL noise):
    anything but data rows, failures and the lines that close or describe a run."""
    if s is None or not s:
        return True
    if s[0] == "#":
        return not (_AVG_RE.match(s) or _OOB_RE.match(s) or _STARTING_RE.match(s) or _is_header(s)
                    or "Rank" in s[:16] or _FAIL_RE.search(s))
    return _ROW_START_RE.match(s) is None and _FAIL_RE.search(s) is None


def _start_kind(s: str) -> str | None:
    m = _STARTING_RE.match(s)
    if m is not None:
        return "marker" if m.group(1) == "starting" else None
    if _NTHREAD_RE.match(s):
        return "nthread"
    return "header" if _is_header(s) else None


# What a run must already have seen for each kind of line to open the next run: a marker opens a
# new run after anything, a "# nThread" line after anything but the marker that precedes it, a
# column header only after data rows (a header repeated before any row is the same run).
_OPENS_AFTER = {"marker": {"marker", "nthread", "header", "rows"}, "nthread": {"nthread", "header", "rows"},
                "header": {"rows"}}


def _run_starts(stripped: list[str | None]) -> list[int]:
    """0-based line indices where runs start; a run takes the preamble lines just before its first
    start line (version banner, command line), so they name its collective."""
    starts = [0]
    seen: set[str] = set()
    for i, s in enumerate(stripped):
        if not s:
            continue
        if s[0] != "#":
            if "rows" not in seen and _ROW_START_STRICT_RE.match(s):
                seen.add("rows")
            continue
        kind = _start_kind(s)
        if kind is None:
            continue
        if seen & _OPENS_AFTER[kind]:
            j = i
            while j - 1 > starts[-1] and _is_preamble(stripped[j - 1]):
                j -= 1
            starts.append(j)
            seen = set()
        seen.add(kind)
    return starts


# ----------------------------------------------------------------------------------------------
# reading one run


class _Run:
    """The state of one run while its lines are read (one method per kind of line)."""

    def __init__(self, src: str, first_line: int) -> None:
        self.src = src
        self.first_line = first_line
        self.rows: list[NcclRow] = []
        self.keys: set[tuple] = set()
        self.duplicates = 0
        self.devices: list[NcclDevice] = []
        self.problems: list[tuple[int, str]] = []
        self.layout: Layout | None = None
        self.header_line: int | None = None
        self.collective: str | None = None
        self.explicit = False  # collective named by a "Collective test" line, not a command line
        self.avg: float | None = None
        self.avg_seen = False
        self.oob: int | None = None
        self.pending: tuple[str, int] | None = None  # data row cut by an NCCL log line
        self.last_row: tuple[int, int, int, int] | None = None  # (line, nfields, need, problem index or -1)

    def problem(self, ln: int, what: str) -> None:
        self.problems.append((ln, f"{self.src}:{ln}: {what}"))

    def feed(self, ln: int, s: str) -> None:
        """One stripped, non-empty, non-stderr line."""
        if s[0] == "#":
            self.flush()
            self.comment(ln, s)
        elif _NCCL_LINE_RE.match(s):
            return  # NCCL INFO/WARN/TRACE noise; may arrive between the halves of a cut row
        elif self.pending is not None and _ROW_START_STRICT_RE.match(s) is None:
            body, pln = self.pending
            self.pending = None
            self.row(body + " " + s, pln)
        elif _ROW_START_RE.match(s):
            self.flush()
            self.row(s, ln)
        elif _FAIL_RE.search(s):
            self.problem(ln, f"failure reported: {snip(s)}")
        elif not self.explicit and self.collective is None:
            bm = _BINARY_RE.search(s)
            if bm is not None:
                self.collective = norm_collective(bm.group(1))

    def comment(self, ln: int, s: str) -> None:
        if "Rank" in s[:16]:
            dm = _DEVICE_RE.match(s)
            if dm is not None:
                pid = dm.group(2)
                self.devices.append(NcclDevice(int(dm.group(1)), dm.group(3), int(pid) if pid is not None else None,
                                               int(dm.group(4)), dm.group(5), dm.group(6)))
                return
        if _is_header(s):
            new = layout_from_header(s[1:].split(), ln)
            if new is not None:
                self.layout, self.header_line = new, ln
            return
        flagged = False
        if (m := _OOB_RE.match(s)) is not None:
            self.oob = int(m.group(1))
            if self.oob > 0:
                self.problem(ln, f"{self.oob} out-of-bounds values: {snip(s)}")
                flagged = True
        elif (m := _AVG_RE.match(s)) is not None:
            self.avg_seen = True
            tok = m.group(1)
            if _FLOAT_RE.fullmatch(tok) and math.isfinite(float(tok)):
                self.avg = float(tok)
        elif (m := _STARTING_RE.match(s)) is not None and not self.explicit:
            self.collective, self.explicit = norm_collective(m.group(2)), True
        if not flagged and _FAIL_RE.search(s):
            self.problem(ln, f"failure reported: {snip(s)}")

    def row(self, body: str, ln: int) -> None:
        m = _NCCL_MID_RE.search(body) if "NCCL" in body else None
        if m is not None and m.start() > 0:
            body = body[: m.start()]
            if self.layout is None or len(body.split()) < self.layout.nfields:
                self.pending = (body, ln)  # the rest of the row follows the NCCL line
                return
        tokens = body.split()
        lay = self.layout or INFERRED.get(len(tokens))
        if lay is None:
            return  # digits without any column header: not nccl-tests output
        try:
            row = parse_row(tokens, lay)
        except RowError as exc:
            self.problem(ln, f"{exc}: {snip(body)}")
            self.last_row = (ln, len(tokens), lay.nfields, len(self.problems) - 1)
            return
        self.last_row = (ln, len(tokens), lay.nfields, -1)
        key = (row.size, row.type, row.redop, row.root)
        if key in self.keys:  # nccl-tests prints each (size, type, op, root) once: a repeat is an artefact
            self.duplicates += 1
            return
        self.keys.add(key)
        self.rows.append(row)
        for gi, meas in enumerate(row.groups):
            if meas.wrong:
                label = _GROUP_LABELS[gi] if gi < len(_GROUP_LABELS) else f"group {gi + 1}"
                self.problem(ln, f"{meas.wrong} wrong elements ({label}) at size {row.size}: data validation failed")

    def flush(self) -> None:
        if self.pending is not None:
            body, pln = self.pending
            self.pending = None
            self.row(body + " ", pln)

    def finish(self, last_line: int) -> tuple[NcclResult, str | None]:
        """The run and, when it has no data row, why (the error it raises even when not strict)."""
        self.flush()
        if self.last_row is not None and not self.avg_seen:
            lln, nf, need, pi = self.last_row
            if pi >= 0 and nf < need:
                self.problems[pi] = (lln, f"{self.src}:{lln}: truncated log: last data row has {nf} of {need} "
                                          "fields and there is no '# Avg bus bandwidth' line")
        self.problems.sort(key=lambda p: p[0])
        fatal = None
        if not self.rows:
            if self.problems:
                fatal = self.problems[0][1]
            elif self.header_line is not None:
                fatal = f"{self.src}:{self.header_line}: column header but no data rows follow"
            else:
                n = last_line - self.first_line + 1
                fatal = f"{self.src}:{last_line}: no nccl-tests data rows found in {n} lines"
        res = NcclResult(rows=tuple(self.rows), devices=tuple(self.devices), collective=self.collective,
                         avg_busbw=self.avg, out_of_bounds=self.oob, ok=not self.problems and fatal is None,
                         source=self.src, problems=tuple(p[1] for p in self.problems) or ((fatal,) if fatal else ()),
                         line=self.first_line, duplicates=self.duplicates)
        return res, fatal


def _verdict(res: NcclResult, fatal: str | None, strict: bool) -> NcclResult:
    if fatal is not None:
        raise NcclParseError(fatal)
    if strict and res.problems:
        more = f" (+{len(res.problems) - 1} more problems)" if len(res.problems) > 1 else ""
        raise NcclParseError(res.problems[0] + more)
    return res


# ----------------------------------------------------------------------------------------------
# public entry points


def _read_runs(text: str, source: str) -> list[tuple[NcclResult, str | None]]:
    src = _clean(source)
    if not text.strip():
        raise NcclParseError(f"{src}:1: empty log (no nccl-tests output)")
    stripped = [_strip(raw) for raw in text.split("\n")]
    starts = _run_starts(stripped)
    out = []
    for a, b in zip(starts, starts[1:] + [len(stripped)]):
        run = _Run(src, a + 1)
        for i in range(a, b):
            s = stripped[i]
            if s:
                run.feed(i + 1, s)
        out.append(run.finish(b))
    return out


def parse_all(text: str, source: str = "<string>", *, strict: bool = True, keep_empty: bool = False) -> list[NcclResult]:
    """Every run of a log, in order. Strict: the first run with a problem raises. Not strict: runs
    with problems come back with ``ok=False`` (a run without data rows has ``rows == ()``).
    ``keep_empty`` (not strict): a log whose every run lacks data rows - a test that crashed before
    its first result - comes back too instead of raising, each run saying why in ``problems``."""
    runs = _read_runs(text, source)
    if keep_empty and not strict:
        return [res for res, _ in runs]
    if len(runs) == 1 or strict:
        return [_verdict(res, fatal, strict) for res, fatal in runs]
    if all(fatal is not None for _, fatal in runs):
        raise NcclParseError(runs[0][1] or "")
    return [res for res, _ in runs]


def _names(runs: list[tuple[NcclResult, str | None]]) -> str:
    return ", ".join(r.collective or "unnamed" for r, _ in runs)


def parse(text: str, source: str = "<string>", *, strict: bool = True, collective: str | None = None) -> NcclResult:
    """One run of a log: the run of ``collective`` (``all_gather``, ``all_gather_perf_mpi``, ...) or,
    without it, the only run; a log with several runs and no collective named is an error, as is a
    log without a run of the collective asked for. Noise is tolerated; see the module docstring."""
    runs = _read_runs(text, source)
    src = _clean(source)
    if collective is None:
        if len(runs) > 1:
            raise NcclParseError(f"{src}:{runs[1][0].line}: log holds {len(runs)} runs ({_names(runs)}); "
                                 "name the collective to read one")
        return _verdict(*runs[0], strict)
    want = norm_collective(collective.strip())
    hits = [r for r in runs if r[0].collective is not None and same_collective(r[0].collective, want)]
    if not hits and len(runs) == 1 and runs[0][0].collective is None:
        hits = runs  # a bare log does not say what it ran: it cannot contradict the caller
    if not hits:
        if len(runs) == 1:
            raise NcclParseError(f"{src}:{runs[0][0].line}: log is {runs[0][0].collective}, not {want}")
        raise NcclParseError(f"{src}:1: no {want} run among the {len(runs)} runs of the log ({_names(runs)})")
    if len(hits) > 1:
        raise NcclParseError(f"{src}:{hits[1][0].line}: log holds {len(hits)} runs of {hits[0][0].collective}; "
                             "read them with parse_all")
    return _verdict(*hits[0], strict)
