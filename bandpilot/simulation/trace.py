"""What does a workload trace look like? The CSV ``id,submit_s,k,tenant,compute_s,comm_fraction``
plus optional ``priority,utility,time_limit_s,preemptible,checkpoint_s,checkpoint_every_s`` columns,
parsed all-or-nothing. ``time_limit_s`` is what the user told the queue (it may be far off
``compute_s``, as real estimates are); ``preemptible`` is ``0/1``/``true/false``; ``checkpoint_s`` the
cost of one checkpoint + restart and ``checkpoint_every_s`` its period (preemptible jobs only).

``submit_s`` is seconds from the start of the trace (sorted, non-negative), ``compute_s`` the job's
run time on an uncontended best placement, ``comm_fraction`` the share of that time spent in
collectives (``f`` of the runtime model). Every problem is reported as ``file:line: ...``; one bad
line means nothing is simulated.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from bandpilot.errors import BandPilotError
from bandpilot.io import write_text_atomic

REQUIRED = ("id", "submit_s", "k", "tenant", "compute_s", "comm_fraction")
OPTIONAL = ("priority", "utility", "time_limit_s", "preemptible", "checkpoint_s", "checkpoint_every_s")
#: Elastic columns: the size range, epochs (resizes happen at their boundaries) and the
#: compute scaling efficiency per doubling of GPUs (1 = perfectly linear).
ELASTIC = ("min_k", "max_k", "epochs", "scaling", "k_step")
OPTIONAL = OPTIONAL + ELASTIC
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$")


class TraceError(BandPilotError):
    """The trace is malformed; ``errors`` lists every problem (``file:line: ...``)."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"{self.errors[0]}{more}; nothing simulated")


@dataclass(frozen=True)
class TraceJob:
    id: str
    submit_s: float
    k: int
    tenant: str
    compute_s: float
    comm_fraction: float
    priority: int = 0
    utility: float | None = None
    time_limit_s: float | None = None
    preemptible: bool = False
    checkpoint_s: float | None = None
    checkpoint_every_s: float | None = None
    min_k: int | None = None
    max_k: int | None = None
    epochs: int | None = None
    scaling: float | None = None
    k_step: int | None = None


def _num(text: str, what: str, where: str, errs: list[str]) -> float | None:
    try:
        v = float(text)
    except ValueError:
        errs.append(f"{where}: {what} {text!r} is not a number")
        return None
    if not math.isfinite(v):
        errs.append(f"{where}: {what} {text!r} is not finite")
        return None
    return v


def parse_trace(source: str | Path | Iterable[str], *, n_gpus: int | None = None, name: str | None = None) -> list[TraceJob]:
    """Parse and check a trace; ``n_gpus`` (the cluster size) rejects jobs that can never fit.
    Raises :class:`TraceError` listing every bad line."""
    text, name = _trace_text(source, name)
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    errs: list[str] = []
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    last_t, last_line = -math.inf, 0
    for row in reader:
        lineno = reader.line_num
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in row]
        where = f"{name}:{lineno}"
        if header is None:
            header = _check_header(cells, where)
            continue
        if len(cells) != len(header):
            errs.append(f"{where}: {len(cells)} fields, the header has {len(header)}")
            continue
        doc = dict(zip(header, cells))
        n_err = len(errs)
        jid = doc["id"]
        if not _ID_RE.match(jid):
            errs.append(f"{where}: id {jid!r} must be 1-200 letters, digits or ._:@/+-")
        elif jid in seen:
            errs.append(f"{where}: duplicate id {jid!r} (first on line {seen[jid]})")
        t = _num(doc["submit_s"], "submit_s", where, errs)
        if t is not None:
            if t < 0:
                errs.append(f"{where}: submit_s {doc['submit_s']} is negative")
            elif t < last_t:
                errs.append(f"{where}: submit_s {doc['submit_s']} is before line {last_line}'s {last_t:g} (times must be sorted)")
        k, tenant, c, f, prio, util = _job_cells(doc, where, errs, n_gpus)
        rt = _runtime_cells(doc, where, errs)
        rt.update(_elastic_cells(doc, k, n_gpus, where, errs))
        if len(errs) == n_err:
            seen[jid] = lineno
            last_t, last_line = float(t), lineno  # type: ignore[arg-type]
            jobs.append(TraceJob(jid, float(t), int(k), tenant, float(c), float(f), prio, util, **rt))  # type: ignore[arg-type]
        elif t is not None and t >= last_t and t >= 0:
            last_t, last_line = t, lineno
    if header is None:
        errs.append(f"{name}: empty trace (no header)")
    elif not jobs and not errs:
        errs.append(f"{name}: the trace has no jobs")
    if errs:
        raise TraceError(errs)
    return jobs


def _trace_text(source: str | Path | Iterable[str], name: str | None) -> tuple[str, str]:
    """A trace's text and the name its errors use: a file path, the CSV text itself, or lines."""
    if isinstance(source, (str, Path)) and not (isinstance(source, str) and "\n" in source):
        p = Path(source)
        if not p.is_file():
            raise TraceError([f"trace file not found: {source}"])
        return p.read_text(), name or str(source)
    text = source if isinstance(source, str) else "\n".join(source)
    return text, name or "<trace>"


def _check_header(cells: list[str], where: str) -> list[str]:
    missing = [c for c in REQUIRED if c not in cells]
    unknown = [c for c in cells if c not in REQUIRED + OPTIONAL]
    dup = sorted({c for c in cells if cells.count(c) > 1})
    if missing or unknown or dup:
        what = (f"missing column(s) {', '.join(missing)}" if missing else
                f"unknown column {unknown[0]!r}" if unknown else f"column {dup[0]!r} twice")
        raise TraceError([f"{where}: header: {what} (expected {','.join(REQUIRED)}[,{','.join(OPTIONAL)}])"])
    return cells


def _job_cells(doc: dict[str, str], where: str, errs: list[str], n_gpus: int | None) -> tuple:
    """k, tenant, compute_s, comm_fraction, priority, utility of one row (problems go to ``errs``)."""
    k_txt = doc["k"]
    k = int(k_txt) if re.fullmatch(r"\d+", k_txt) else None
    if k is None or k < 1:
        errs.append(f"{where}: k {k_txt!r} must be an integer >= 1")
    elif n_gpus is not None and k > n_gpus:
        errs.append(f"{where}: k={k} is larger than the cluster ({n_gpus} GPUs)")
    tenant = doc["tenant"]
    if not tenant or len(tenant) > 200:
        errs.append(f"{where}: tenant must be a non-empty name")
    c = _num(doc["compute_s"], "compute_s", where, errs)
    if c is not None and c <= 0:
        errs.append(f"{where}: compute_s {doc['compute_s']} must be > 0")
    f = _num(doc["comm_fraction"], "comm_fraction", where, errs)
    if f is not None and not 0.0 <= f <= 1.0:
        errs.append(f"{where}: comm_fraction {doc['comm_fraction']} is outside [0, 1]")
    prio = 0
    if doc.get("priority", ""):
        if re.fullmatch(r"-?\d+", doc["priority"]):
            prio = int(doc["priority"])
        else:
            errs.append(f"{where}: priority {doc['priority']!r} must be an integer")
    util = None
    if doc.get("utility", ""):
        util = _num(doc["utility"], "utility", where, errs)
        if util is not None and util < 0:
            errs.append(f"{where}: utility {doc['utility']} must be >= 0")
    return k, tenant, c, f, prio, util


def _runtime_cells(doc: dict[str, str], where: str, errs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in ("time_limit_s", "checkpoint_s", "checkpoint_every_s"):
        out[key] = None
        if doc.get(key, ""):
            v = _num(doc[key], key, where, errs)
            if v is not None and v <= 0:
                errs.append(f"{where}: {key} {doc[key]} must be > 0")
            else:
                out[key] = v
    pre = doc.get("preemptible", "").strip().lower()
    if pre not in ("", "0", "1", "true", "false"):
        errs.append(f"{where}: preemptible {doc['preemptible']!r} must be 0/1 or true/false")
    out["preemptible"] = pre in ("1", "true")
    if not out["preemptible"] and (out["checkpoint_s"] is not None or out["checkpoint_every_s"] is not None):
        errs.append(f"{where}: checkpoint_s / checkpoint_every_s need preemptible = 1")
    return out


def _elastic_cells(doc: dict[str, str], k: int | None, n_gpus: int | None, where: str, errs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {"min_k": None, "max_k": None, "epochs": None, "scaling": None, "k_step": None}
    for key in ("min_k", "max_k", "epochs", "k_step"):
        txt = doc.get(key, "")
        if txt:
            if re.fullmatch(r"\d+", txt) and int(txt) >= 1:
                out[key] = int(txt)
            else:
                errs.append(f"{where}: {key} {txt!r} must be an integer >= 1")
    if doc.get("scaling", ""):
        v = _num(doc["scaling"], "scaling", where, errs)
        if v is not None and not 0.0 < v <= 1.0:
            errs.append(f"{where}: scaling {doc['scaling']} must be in (0, 1]")
        elif v is not None:
            out["scaling"] = v
    if k is not None:
        lo, hi = out["min_k"], out["max_k"]
        if lo is not None and lo > k:  # type: ignore[operator]
            errs.append(f"{where}: min_k={lo} is above k={k}")
        if hi is not None and hi < k:  # type: ignore[operator]
            errs.append(f"{where}: max_k={hi} is below k={k}")
        if hi is not None and n_gpus is not None and hi > n_gpus:  # type: ignore[operator]
            errs.append(f"{where}: max_k={hi} is larger than the cluster ({n_gpus} GPUs)")
        step, lo_, hi_ = out["k_step"] or 1, lo if lo is not None else k, hi if hi is not None else k
        if (k - lo_) % step or (hi_ - lo_) % step:  # type: ignore[operator]
            errs.append(f"{where}: k={k} and max_k={hi_} must be min_k={lo_} plus a multiple of k_step={step}")
    return out


def format_trace(jobs: Sequence[TraceJob]) -> str:
    cols = list(REQUIRED) + list(OPTIONAL)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    opt = lambda v, fmt="{:.3f}": "" if v is None else fmt.format(v)  # noqa: E731
    for j in jobs:
        w.writerow([j.id, f"{j.submit_s:.3f}", j.k, j.tenant, f"{j.compute_s:.3f}", f"{j.comm_fraction:.4f}", j.priority,
                    opt(j.utility, "{:.4f}"), opt(j.time_limit_s), int(j.preemptible), opt(j.checkpoint_s),
                    opt(j.checkpoint_every_s), opt(j.min_k, "{}"), opt(j.max_k, "{}"), opt(j.epochs, "{}"),
                    opt(j.scaling, "{:.4f}"), opt(j.k_step, "{}")])
    return buf.getvalue()


def write_trace(jobs: Sequence[TraceJob], path: str | Path) -> Path:
    """Write a trace atomically (temp file + rename), readable as the umask allows."""
    return write_text_atomic(path, format_trace(jobs))
