"""Pairwise node sweeps: every node pair runs a collective at 1, 2, 4, 8 GPUs per node - the way
operators validate a cluster. Read such logs (any file layout: node names, GPUs per node and the
collective come from each run's own output), or emulate them with injected faults.

A sweep log is whatever the operator's wrapper wrote - usually one file per pair and GPU count
holding several collectives back to back (``nccl_N2_G8_node1_node2.log``); every run in every file
is read with :func:`bandpilot.topology.nccl_log.parse_all`. A run is a pair measurement when its
``# Using devices`` table lists exactly two hosts with the same number of ranks each; a run that died
before printing the table (or an empty log) is attributed by its file's other runs or by the
wrappers' file name. Runs without a result - crashed, cut short, wrong data, empty - are kept as
failures, never dropped: a crashed pair is the strongest signal a sweep gives.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from bandpilot.errors import DataError
from bandpilot.topology.nccl_log import NcclParseError, NcclResult, norm_collective, parse_all
from bandpilot.topology.nccl_rows import snip

SUFFIXES = (".log", ".out", ".txt")
GPN = (1, 2, 4, 8)
COLLECTIVES = ("alltoall_perf", "sendrecv_perf")


@dataclass(frozen=True)
class PairRun:
    """One run of a pair: ``busbw`` (GB/s) at the sweep's message size, or, when the run gave no
    result, ``failure`` (what went wrong, in a word) and ``detail`` (the log's own words)."""

    collective: str  # "" when a failed log does not say which collective it ran
    gpn: int  # GPUs per node
    nodes: tuple[str, str]  # sorted
    busbw: float
    repeat: int = 0
    source: str = ""
    failure: str = ""  # "" | crashed | truncated | wrong data | unreadable | no output | empty log | other sizes
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


# A run that finished cleanly but never reached the sweep's message size is absent, not failed.
ABSENT = frozenset({"other sizes"})
# A log whose launcher (mpirun, srun) reported a dead rank: no run of its own, but a run of the log
# that left no result failed to start rather than went missing.
LAUNCHER = "launcher error"


@dataclass
class Sweep:
    """Pair runs read from a directory: ``runs`` with a result, ``failures`` without one (crashed,
    truncated, empty logs ...), and what could not be attributed to a pair (``skipped``)."""

    runs: list[PairRun]
    skipped: list[str] = field(default_factory=list)
    files: int = 0
    sizes: dict[tuple[str, int], int] = field(default_factory=dict)  # message size used per (collective, gpn)
    failures: list[PairRun] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        """Node names in natural order (node-2 before node-10), failed runs' nodes included."""
        return sorted({n for r in (*self.runs, *self.failures) for n in r.nodes}, key=natural)


def natural(name: str) -> list:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def _pair_of(res: NcclResult) -> tuple[tuple[str, str], int] | None:
    per_host = Counter(d.host for d in res.devices)
    if len(per_host) != 2 or len(set(per_host.values())) != 1:
        return None
    a, b = sorted(per_host)
    return (a, b), next(iter(per_host.values()))


# What sweep wrappers name their logs: nccl_N2_G8_node1_node2.log (a "_debug" suffix allowed).
_NAME_RE = re.compile(r"(?:^|_)N2_G(\d+)_(.+?)(?:_debug)?$")
# Launcher lines that say a rank died (mpirun, prterun, srun); quoted as evidence of a failed run.
_LAUNCHER_RE = re.compile(r"MPI_ABORT was invoked|mpirun noticed that|prterun (?:noticed|has exited)|"
                          r"srun: error: .*(?:Exited|Killed|signal|CANCELLED)|exited on signal|"
                          r"DUE TO TIME LIMIT|Segmentation fault", re.IGNORECASE)


def _pair_from_name(path: Path, known: set[str]) -> tuple[tuple[str, str], int] | None:
    """(pair, GPUs per node) from a sweep wrapper's file name; node names holding ``_`` are split
    where both halves are nodes seen in the sweep."""
    m = _NAME_RE.search(path.stem)
    if m is None:
        return None
    rest = m.group(2).split("_")
    cuts = [("_".join(rest[:i]), "_".join(rest[i:])) for i in range(1, len(rest))]
    if len(cuts) > 1:
        cuts = [c for c in cuts if c[0] in known and c[1] in known]
    if len(cuts) != 1 or cuts[0][0] == cuts[0][1]:
        return None
    a, b = sorted(cuts[0])
    return (a, b), int(m.group(1))


_SAID_RE = re.compile(r"Test (?:NCCL |CUDA |HIP )?failure|Cuda failure|Test timeout")


def _said(lines: list[str], start: int, end: int) -> str:
    """The failure line a crashed run (lines ``start..end-1``, 1-based) printed first, whole
    (``host: Test NCCL failure file:line 'why / detail'``)."""
    return next((snip(ln, 200) for ln in lines[start - 1:end - 1] if _SAID_RE.search(ln)), "")


def _failure(res: NcclResult) -> str:
    """What went wrong in a run with problems, in a word."""
    text = " ".join(res.problems)
    if "wrong elements" in text or "out-of-bounds" in text:
        return "wrong data"
    if "failure reported" in text or "column header but no data rows" in text:
        return "crashed"
    if "truncated" in text:
        return "truncated"
    if "no nccl-tests data rows" in text:
        return "no output"
    return "unreadable"


def _value(res: NcclResult, target: int, nranks: int) -> float | None:
    """Out-of-place busbw at ``target`` bytes; nccl-tests rounds sizes down per rank (16-byte
    chunks since 2.17), so the row just below the target counts."""
    near = [r for r in res.rows if 0 <= target - r.size < 16 * max(nranks, 1)]
    if not near:
        return None
    return max(near, key=lambda r: r.size).out_of_place.busbw


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise DataError(f"{directory}: not a directory of sweep logs")
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)


def _parse_files(files: list[Path], skipped: list[str]) -> list[tuple[Path, str, list[NcclResult]]]:
    out = []
    for p in files:
        text = p.read_text(errors="replace")
        runs: list[NcclResult] = []
        if text.strip():
            try:
                runs = parse_all(text, str(p), strict=False, keep_empty=True)
            except NcclParseError as exc:
                skipped.append(str(exc))
        out.append((p, text, runs))
    return out


def _attribute(parsed, skipped: list[str]) -> tuple[list[tuple[NcclResult, tuple[str, str], int, str]], list[PairRun]]:
    """Runs with their pair: from the run's device table, else (a test that died before printing
    it, an empty log) from the file's other runs or its name. Failed runs become ``PairRun`` failures."""
    known = {d.host for _, _, runs in parsed for r in runs for d in r.devices}
    found, failed = [], []
    for p, text, runs in parsed:
        pairs = {pr for r in runs if (pr := _pair_of(r)) is not None}
        fallback = next(iter(pairs)) if len(pairs) == 1 else _pair_from_name(p, known)
        lines = text.split("\n")  # numbered as the parser numbers them
        launcher = next((snip(ln, 160) for ln in lines if _LAUNCHER_RE.search(ln)), "")
        if not runs:
            if fallback is None:
                skipped.append(f"{p}:1: empty log, and its name does not say which pair it was for")
            else:
                failed.append(PairRun("", fallback[1], fallback[0], 0.0, 0, f"{p}:1", "empty log", launcher or "empty log"))
            continue
        before = len(failed)
        ends = [r.line for r in runs[1:]] + [len(lines) + 1]
        for res, end in zip(runs, ends):
            pair = _pair_of(res)
            if pair is None and (res.devices or fallback is None):
                skipped.append(f"{p}:{res.line}: not a node pair ({len({d.host for d in res.devices})} hosts)")
                continue
            pair = pair or fallback
            coll = norm_collective(res.collective or "")
            if res.ok and res.rows:
                if not coll:
                    skipped.append(f"{p}:{res.line}: the run does not name its collective")
                else:
                    found.append((res, pair[0], pair[1], f"{p}:{res.line}"))
                continue
            kind = _failure(res)
            said = _said(lines, res.line, end) if kind == "crashed" else ""
            first = said or (snip(res.problems[0].split(": ", 1)[-1], 200) if res.problems else "")
            detail = "; ".join(x for x in (first, launcher) if x)
            failed.append(PairRun(coll, pair[1], pair[0], 0.0, 0, f"{p}:{res.line}", kind, detail))
        if launcher and fallback is not None and len(failed) == before:
            failed.append(PairRun("", fallback[1], fallback[0], 0.0, 0, str(p), LAUNCHER, launcher))
    return found, failed


def read_sweep(directory: str | Path, message_bytes: int | None = None) -> Sweep:
    """Every pair run of every log under ``directory``. The message size is ``message_bytes`` or,
    per (collective, GPUs per node), the largest size most runs reached. A run without a result
    there is a failure (crashed, cut short, wrong data, empty log) or, when it finished cleanly
    over other sizes, absent; nothing that names a pair is dropped."""
    directory = Path(directory)
    skipped: list[str] = []
    files = _files(directory)
    found, failed = _attribute(_parse_files(files, skipped), skipped)
    if not found and not failed:
        raise DataError(f"{directory}: no pairwise nccl-tests runs in {len(files)} log files"
                        + (f" (first problem: {skipped[0]})" if skipped else ""))
    sizes: dict[tuple[str, int], int] = {}
    for key in {(norm_collective(r.collective or ""), g) for r, _, g, _ in found}:
        tops = Counter(max(r.sizes) for r, _, g, _ in found if (norm_collective(r.collective or ""), g) == key)
        sizes[key] = message_bytes or max(tops.items(), key=lambda kv: (kv[1], kv[0]))[0]
    out: list[PairRun] = []
    seen: Counter = Counter()
    for res, nodes, gpn, src in found:
        coll = norm_collective(res.collective or "")
        target = sizes[(coll, gpn)]
        v = _value(res, target, 2 * gpn)
        if v is None:
            # a run that did not conclude stopped before the size the sweep compares: cut short
            cut = res.avg_busbw is None and res.out_of_bounds is None
            what = (f"cut short at {max(res.sizes)} bytes, before {target}" if cut
                    else f"no row at {target} bytes (ran {min(res.sizes)}..{max(res.sizes)})")
            failed.append(PairRun(coll, gpn, nodes, 0.0, 0, src, "truncated" if cut else "other sizes", what))
            continue
        key = (coll, gpn, nodes)
        out.append(PairRun(coll, gpn, nodes, float(v), seen[key], src))
        seen[key] += 1
    return Sweep(out, skipped, len(files), sizes, failed)


# ----------------------------------------------------------------------------------------------
# emulated sweeps


def emulate_sweep(fabric, hosts: Sequence[str] | None = None, *, gpn: Sequence[int] = GPN,
                  collectives: Sequence[str] = COLLECTIVES, repeats: int = 1, seed: int = 0,
                  glitch: float = 0.0, rng: np.random.Generator | None = None) -> list[PairRun]:
    """Pair runs from a fabric (e.g. :class:`~bandpilot.fabric.faults.FaultyFabric` with injected
    faults): GPUs ``0..k-1`` of both nodes, the fabric's seeded measurement noise, independent per
    collective and repeat. ``glitch``: the chance that a run is transiently slow (x0.5-0.9), the
    one-off dips that a single sweep cannot tell from a fault. The emulator models one busbw per
    allocation, so the collectives differ by their noise only (the comparison is among peers)."""
    spec = fabric.spec
    names = list(hosts) if hosts is not None else list(spec.host_names)
    idx = [spec.host_index[h] for h in names]
    rng = rng if rng is not None else np.random.default_rng(seed)
    pairs = [(i, j) for a, i in enumerate(idx) for j in idx[a + 1:]]
    out: list[PairRun] = []
    for k in gpn:
        ok = [(i, j) for i, j in pairs if spec.hosts[i].n_gpus >= k and spec.hosts[j].n_gpus >= k]
        if not ok:
            continue
        masks = np.zeros((len(ok), spec.n_hosts), dtype=np.int64)
        for r, (i, j) in enumerate(ok):
            masks[r, i] = masks[r, j] = (1 << k) - 1
        for ci, coll in enumerate(collectives):
            for rep in range(repeats):
                vals = np.asarray(fabric.measure(masks, seed=seed, repeat=1000 * k + repeats * ci + rep), dtype=float)
                if glitch > 0:
                    hit = rng.random(len(ok)) < glitch
                    vals = np.where(hit, vals * rng.uniform(0.5, 0.9, len(ok)), vals)
                for (i, j), v in zip(ok, vals):
                    a, b = sorted((spec.hosts[i].name, spec.hosts[j].name))
                    out.append(PairRun(norm_collective(coll), int(k), (a, b), round(float(v), 2), rep))
    return out


# How nccl-tests reports a failed NCCL call (NCCLCHECK in common.h, then TESTCHECK up the stack).
_NCCL_FAILURE = ("{host}: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / '\n"
                 " .. {host} pid {pid}: Test failure common.cu:401\n"
                 " .. {host} pid {pid}: Test failure common.cu:588\n"
                 " .. {host} pid {pid}: Test failure {coll}.cu:97\n"
                 " .. {host} pid {pid}: Test failure common.cu:615\n"
                 " .. {host} pid {pid}: Test failure common.cu:1019\n")
WRITABLE_FAILURES = ("crashed", "truncated", "wrong data", "empty log", "no output")


def _failed_log(full: str, r: PairRun, host: str, pid: int) -> str:
    """A run's log as nccl-tests leaves it when the run fails: ``crashed`` - the column header,
    then NCCL's failure report and no row (a peer died or the network dropped); ``truncated`` - the
    job killed in the middle of a row; ``wrong data`` - a row with wrong elements and the FAILED
    verdict; ``no output`` - only the launcher's words (the ranks never started)."""
    lines = full.split("\n")
    head = next(i for i, ln in enumerate(lines) if ln.startswith("#") and "(B)" in ln) + 1
    if r.failure == "crashed":
        coll = r.collective.removesuffix("_perf").replace("_", "")
        return "\n".join(lines[:head]) + "\n" + _NCCL_FAILURE.format(host=host, pid=pid, coll=coll)
    if r.failure == "truncated":
        row = lines[head + 2]
        return "\n".join(lines[:head + 2]) + "\n" + row[: len(row) // 2] + "\n"  # killed mid-row
    if r.failure == "wrong data":
        return full  # written with wrong elements in its last row
    if r.failure == "no output":
        return f"srun: error: {host}: task 0: Exited with exit code 3\n"
    raise ValueError(f"cannot write a {r.failure!r} run; one of {WRITABLE_FAILURES}")


def write_sweep_logs(runs: Sequence[PairRun], directory: str | Path, message_bytes: int = 1 << 30,
                     gpu_name: str = "NVIDIA H100 80GB HBM3") -> list[Path]:
    """One nccl-tests log per (pair, GPUs per node) holding every collective and repeat back to back,
    as sweep wrappers write them (``nccl_N2_G{k}_{a}_{b}.log``); busbw at ``message_bytes`` is the
    run's value, smaller sizes follow a latency curve. A run with a ``failure`` is written the way
    nccl-tests fails (see :func:`_failed_log`); ``empty log`` leaves its pair's whole file empty."""
    from bandpilot.io import write_text_atomic
    from bandpilot.topology.nccl_format import busbw_factor, format_log, make_row, time_for
    from bandpilot.topology.nccl_log import NcclDevice, NcclMeasure

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[tuple[str, str], int], list[PairRun]] = {}
    for r in runs:
        groups.setdefault((r.nodes, r.gpn), []).append(r)
    paths = []
    for ((a, b), k), rs in sorted(groups.items()):
        n = 2 * k
        devs = [NcclDevice(h * k + d, host, 4000 + 17 * h + d, d, f"0000:{0x1b + 0x28 * d:02x}:00", gpu_name)
                for h, host in enumerate((a, b)) for d in range(k)]
        text = []
        for r in rs:
            rows = []
            for size in (message_bytes >> 3, message_bytes >> 2, message_bytes >> 1, message_bytes):
                bw = r.busbw * (size / (size + (1 << 22))) / (message_bytes / (message_bytes + (1 << 22)))
                f = busbw_factor(r.collective, n)
                t = time_for(size, bw, r.collective, n) if bw > 0 else 1e6
                redop = "sum" if r.collective in ("all_reduce_perf", "reduce_scatter_perf") else "none"
                wrong = 3 if r.failure == "wrong data" and size == message_bytes else 0
                rows.append(make_row(size, size // 4, "float", redop, -1, t, bw / f, bw, wrong=wrong,
                                     in_place=NcclMeasure(t, bw / f, bw, None)))
            full = format_log(rows, devs, r.collective + "_mpi", nccl_version="2.21.5")
            if r.failure != "empty log":
                text.append(full if r.ok else _failed_log(full, r, a, devs[0].pid or 0))
        p = directory / f"nccl_N2_G{k}_{a}_{b}.log"
        write_text_atomic(p, "" if any(r.failure == "empty log" for r in rs) else "".join(text))
        paths.append(p)
    return paths
