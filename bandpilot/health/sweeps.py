"""Pairwise node sweeps: every node pair runs a collective at 1, 2, 4, 8 GPUs per node - the way
operators validate a cluster. Read such logs (any file layout: node names, GPUs per node and the
collective come from each run's own output), or emulate them with injected faults.

A sweep log is whatever the operator's wrapper wrote - usually one file per pair and GPU count
holding several collectives back to back (``nccl_N2_G8_node1_node2.log``); every run in every file
is read with :func:`bandpilot.topology.nccl_log.parse_all`. A run is a pair measurement when its
``# Using devices`` table lists exactly two hosts with the same number of ranks each.
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

SUFFIXES = (".log", ".out", ".txt")
GPN = (1, 2, 4, 8)
COLLECTIVES = ("alltoall_perf", "sendrecv_perf")


@dataclass(frozen=True)
class PairRun:
    """One measured pair: ``busbw`` (GB/s) at the sweep's message size; 0 when the run failed."""

    collective: str
    gpn: int  # GPUs per node
    nodes: tuple[str, str]  # sorted
    busbw: float
    repeat: int = 0
    source: str = ""


@dataclass
class Sweep:
    """Pair runs read from a directory and what was left out (``skipped``: one line per reason)."""

    runs: list[PairRun]
    skipped: list[str] = field(default_factory=list)
    files: int = 0
    sizes: dict[tuple[str, int], int] = field(default_factory=dict)  # message size used per (collective, gpn)

    @property
    def nodes(self) -> list[str]:
        """Node names in natural order (node-2 before node-10)."""
        return sorted({n for r in self.runs for n in r.nodes}, key=_natural)


def _natural(name: str) -> list:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def _pair_of(res: NcclResult) -> tuple[tuple[str, str], int] | None:
    per_host = Counter(d.host for d in res.devices)
    if len(per_host) != 2 or len(set(per_host.values())) != 1:
        return None
    a, b = sorted(per_host)
    return (a, b), next(iter(per_host.values()))


def _value(res: NcclResult, target: int, nranks: int) -> float | None:
    """Out-of-place busbw at ``target`` bytes; nccl-tests rounds sizes down per rank (16-byte
    chunks since 2.17), so the row just below the target counts. 0 when the run reported a failure."""
    if not res.ok:
        return 0.0
    near = [r for r in res.rows if 0 <= target - r.size < 16 * max(nranks, 1)]
    if not near:
        return None
    return max(near, key=lambda r: r.size).out_of_place.busbw


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise DataError(f"{directory}: not a directory of sweep logs")
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)


def read_sweep(directory: str | Path, message_bytes: int | None = None) -> Sweep:
    """Every pair run of every log under ``directory``. The message size is ``message_bytes`` or,
    per (collective, GPUs per node), the largest size most runs reached."""
    directory = Path(directory)
    found: list[tuple[NcclResult, tuple[str, str], int, str]] = []
    skipped: list[str] = []
    files = _files(directory)
    for p in files:
        try:
            runs = parse_all(p.read_text(errors="replace"), str(p), strict=False)
        except NcclParseError as exc:
            skipped.append(str(exc))
            continue
        for res in runs:
            pair = _pair_of(res)
            if pair is None:
                skipped.append(f"{p}:{res.line}: not a node pair ({len({d.host for d in res.devices})} hosts)")
            elif res.collective is None:
                skipped.append(f"{p}:{res.line}: the run does not name its collective")
            else:
                found.append((res, pair[0], pair[1], str(p)))
    if not found:
        raise DataError(f"{directory}: no pairwise nccl-tests runs in {len(files)} log files"
                        + (f" (first problem: {skipped[0]})" if skipped else ""))
    sizes: dict[tuple[str, int], int] = {}
    for key in {(norm_collective(r.collective or ""), g) for r, _, g, _ in found}:
        tops = Counter(max(r.sizes) for r, _, g, _ in found if r.rows and (norm_collective(r.collective or ""), g) == key)
        sizes[key] = message_bytes or (max(tops.items(), key=lambda kv: (kv[1], kv[0]))[0] if tops else 0)
    out: list[PairRun] = []
    seen: Counter = Counter()
    for res, nodes, gpn, src in found:
        coll = norm_collective(res.collective or "")
        v = _value(res, sizes[(coll, gpn)], 2 * gpn)
        if v is None:
            skipped.append(f"{src}:{res.line}: no row at {sizes[(coll, gpn)]} bytes")
            continue
        key = (coll, gpn, nodes)
        out.append(PairRun(coll, gpn, nodes, float(v), seen[key], f"{src}:{res.line}"))
        seen[key] += 1
    return Sweep(out, skipped, len(files), sizes)


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


def write_sweep_logs(runs: Sequence[PairRun], directory: str | Path, message_bytes: int = 1 << 30,
                     gpu_name: str = "NVIDIA H100 80GB HBM3") -> list[Path]:
    """One nccl-tests log per (pair, GPUs per node) holding every collective and repeat back to back,
    as sweep wrappers write them (``nccl_N2_G{k}_{a}_{b}.log``); busbw at ``message_bytes`` is the
    run's value, smaller sizes follow a latency curve."""
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
                rows.append(make_row(size, size // 4, "float", redop, -1, t, bw / f, bw,
                                     in_place=NcclMeasure(t, bw / f, bw, None)))
            text.append(format_log(rows, devs, r.collective + "_mpi", nccl_version="2.21.5"))
        p = directory / f"nccl_N2_G{k}_{a}_{b}.log"
        write_text_atomic(p, "".join(text))
        paths.append(p)
    return paths
