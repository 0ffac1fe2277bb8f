"""Profiling: plan nccl-tests runs for a cluster, execute them, keep the logs, build the dataset.

Why this shape: stage 1 of the model is a lookup, so every subset (2^g - 1) of every host is
measured; the cross-host network only needs a sparse sample, stratified by the number of hosts and
the per-host count pattern (what the network term depends on), with random GPU subsets inside the
hosts. Runs are resumable: each log is written atomically and ``manifest.jsonl`` records what is
done, so an interrupted profile continues where it stopped, and a deleted log is re-measured.

Both runners produce nccl-tests stdout that goes through :func:`bandpilot.topology.nccl.parse` and the same
checks as :func:`bandpilot.data.dataset.ingest` (device table vs plan), so emulated and real profiling
cannot drift apart:

* ``emulator`` - writes logs with :func:`bandpilot.topology.nccl.format_log` from the cluster's fabric
  (``Fabric.measure`` noise), several message sizes, a realistic device table and NCCL INFO noise;
* ``ssh`` - runs the real command lines (``ssh <host> CUDA_VISIBLE_DEVICES=... all_gather_perf``
  for one host, ``mpirun ... all_gather_perf_mpi`` across hosts) and captures stdout.

Layout under ``out_dir``::

    data/<cluster>/cluster.yaml          self-contained spec
    data/<cluster>/manifest.jsonl        one JSON line per planned measurement (status: planned/done/failed)
    data/<cluster>/raw/<id>.log          nccl-tests stdout per measurement
    data/<cluster>/measurements.parquet  the dataset (:func:`bandpilot.data.dataset.ingest`)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec
from bandpilot.data.dataset import (
    MANIFEST_FILE,
    SPEC_FILE,
    IngestReport,
    check_log,
    ingest,
    read_manifest,
    remember_checked_log,
)
from bandpilot.errors import BandPilotError, DataError, SpecError

RUNNERS = ("emulator", "ssh")
RAW_DIR = "raw"
_ENUM_LIMIT = 20000  # enumerate count patterns of a host level up to this many, sample beyond


@dataclass(frozen=True)
class PlannedMeasurement:
    """One nccl-tests run: an allocation (per-host masks in spec host order) and its sizes."""

    id: str
    masks: tuple[int, ...]
    gpus: tuple[str, ...]
    hosts: tuple[str, ...]  # hosts used, in spec order
    counts: tuple[int, ...]  # GPUs per used host
    collective: str
    bytes: int  # the message size the dataset keeps
    sizes: tuple[int, ...]  # sizes the run sweeps (a factor-2 ladder containing ``bytes``)
    stratum: str  # "1h:3" or "3h:4+2+1" (hosts, sorted count pattern)
    repeat: int = 0

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def cross_host(self) -> bool:
        return len(self.hosts) >= 2

    @property
    def log(self) -> str:
        return f"{RAW_DIR}/{self.id}.log"

    def entry(self, status: str, **extra: Any) -> dict[str, Any]:
        """The manifest line for this measurement."""
        return {
            "id": self.id,
            "gpus": list(self.gpus),
            "hosts": list(self.hosts),
            "counts": list(self.counts),
            "stratum": self.stratum,
            "collective": self.collective,
            "bytes": self.bytes,
            "sizes": list(self.sizes),
            "repeat": self.repeat,
            "log": self.log,
            "status": status,
            **extra,
        }


# ----------------------------------------------------------------------------------------------
# planning


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _idx_str(mask: int, n: int) -> str:
    idx = [i for i in range(n) if mask >> i & 1]
    return "".join(map(str, idx)) if n <= 10 else ".".join(map(str, idx))


def _measurement(
    spec: ClusterSpec, masks: Sequence[int], sizes: tuple[int, ...], stratum: str, repeat: int,
    used: Sequence[int] | None = None,
) -> PlannedMeasurement:
    if not isinstance(masks, tuple):  # plan() passes tuples of ints already
        masks = tuple(int(m) for m in masks)
    if used is None:
        used = [h for h, m in enumerate(masks) if m]
    parts = [f"{_safe(spec.hosts[h].name)}-{_idx_str(masks[h], spec.hosts[h].n_gpus)}" for h in used]
    ident = parts[0] if len(parts) == 1 else "x-" + "+".join(parts)
    if len(ident) > 120:
        digest = hashlib.sha1(json.dumps(masks).encode()).hexdigest()[:12]
        ident = f"x-{len(used)}h-{sum(bin(masks[h]).count('1') for h in used)}g-{digest}"
    if repeat:
        ident += f"@r{repeat}"
    gpus = tuple(f"{spec.hosts[h].name}:{i}" for h in used for i in range(spec.hosts[h].n_gpus) if masks[h] >> i & 1)
    return PlannedMeasurement(
        id=ident,
        masks=masks,
        gpus=gpus,
        hosts=tuple(spec.hosts[h].name for h in used),
        counts=tuple(bin(masks[h]).count("1") for h in used),
        collective=spec.collective,
        bytes=spec.message_bytes,
        sizes=sizes,
        stratum=stratum,
        repeat=repeat,
    )


def default_sizes(message_bytes: int) -> tuple[int, ...]:
    """The kept size and its factor-2 neighbours (what ``-b x/2 -e 2x -f 2`` sweeps)."""
    if message_bytes % 2:
        return (message_bytes,)
    return (message_bytes // 2, message_bytes, message_bytes * 2)


def _check_sizes(sizes: Iterable[int] | None, message_bytes: int) -> tuple[int, ...]:
    if sizes is None:
        return default_sizes(message_bytes)
    out = tuple(sorted({int(s) for s in sizes}))
    if not out or any(s <= 0 for s in out):
        raise SpecError(f"sizes must be positive byte counts, got {list(sizes)}")
    if message_bytes not in out:
        raise SpecError(f"sizes {list(out)} must include the cluster's message size {message_bytes}")
    if any(b != 2 * a for a, b in zip(out, out[1:])):
        raise SpecError(f"sizes {list(out)} must be a factor-2 ladder (nccl-tests -b/-e/-f 2)")
    return out


def _patterns(k: int, sizes_desc: list[int]) -> list[tuple[int, ...]] | None:
    """Feasible sorted count patterns on ``k`` hosts, or None when there are too many to list."""
    g = sizes_desc[0]
    if math.comb(k + g - 1, g - 1) > _ENUM_LIMIT:
        return None
    out = []
    for combo in itertools.combinations_with_replacement(range(g, 0, -1), k):
        if all(c <= s for c, s in zip(combo, sizes_desc)):  # combo is non-increasing
            out.append(combo)
    return out


def _assign(pattern: Sequence[int], spec: ClusterSpec, rng: np.random.Generator) -> np.ndarray | None:
    """Random hosts and random GPU subsets realising a count pattern (largest count first)."""
    order = rng.permutation(spec.n_hosts)
    free = list(order)
    masks = np.zeros(spec.n_hosts, dtype=np.int64)
    for c in sorted(pattern, reverse=True):
        for j, h in enumerate(free):
            if spec.hosts[h].n_gpus >= c:
                idx = rng.choice(spec.hosts[h].n_gpus, size=c, replace=False)
                masks[h] = int(sum(1 << int(i) for i in idx))
                free.pop(j)
                break
        else:
            return None
    return masks


def plan(
    spec: ClusterSpec,
    *,
    cross_host_samples: int = 200,
    seed: int = 0,
    sizes: Iterable[int] | None = None,
    repeats: int = 1,
    intra: bool = True,
) -> list[PlannedMeasurement]:
    """All 2^g - 1 subsets of every host, then a stratified sample of cross-host allocations.

    The sample is spread evenly over the number of hosts (2..H); within a level, over the sorted
    count patterns (distinct patterns first, then more draws of random patterns), each realised on
    random hosts with random GPU subsets. Deterministic for a given ``seed``; no allocation twice.
    """
    if cross_host_samples < 0:
        raise SpecError(f"cross_host_samples must be >= 0, got {cross_host_samples}")
    if repeats < 1:
        raise SpecError(f"repeats must be >= 1, got {repeats}")
    sz = _check_sizes(sizes, spec.message_bytes)
    out: list[PlannedMeasurement] = []
    base: list[tuple[tuple[int, ...], str, tuple[int, ...] | None]] = []
    if intra:
        zeros = (0,) * spec.n_hosts
        for h, host in enumerate(spec.hosts):
            for mask in range(1, 1 << host.n_gpus):
                base.append((zeros[:h] + (mask,) + zeros[h + 1 :], f"1h:{bin(mask).count('1')}", (h,)))
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, ...]] = set()
    levels = list(range(2, spec.n_hosts + 1))
    sizes_desc = sorted((h.n_gpus for h in spec.hosts), reverse=True)
    n_levels = len(levels)
    level_patterns = {k: _patterns(k, sizes_desc[:k]) for k in levels}

    def random_pattern(k: int) -> tuple[int, ...]:
        hosts = rng.choice(spec.n_hosts, size=k, replace=False)
        return tuple(sorted((int(rng.integers(1, spec.hosts[h].n_gpus + 1)) for h in hosts), reverse=True))

    exhausted: set[tuple[int, ...]] = set()  # patterns with no new allocation left (as far as we can tell)

    def add(k: int, pat: tuple[int, ...]) -> bool:
        if pat in exhausted:
            return False
        for _attempt in range(30):
            masks = _assign(pat, spec, rng)
            if masks is None:
                break
            key = tuple(int(x) for x in masks)
            if key not in seen:
                seen.add(key)
                base.append((key, f"{k}h:" + "+".join(map(str, pat)), None))
                return True
        exhausted.add(pat)
        return False

    for li, k in enumerate(levels):
        quota = (li + 1) * cross_host_samples // n_levels - li * cross_host_samples // n_levels if n_levels else 0
        if quota <= 0:
            continue
        pats = level_patterns[k]
        if pats is not None:
            if not pats:
                continue
            chosen: list[tuple[int, ...]] = []
            full, rem = divmod(quota, len(pats))
            chosen += [p for p in pats for _ in range(full)]
            chosen += [pats[i] for i in sorted(rng.choice(len(pats), size=rem, replace=False))]
        else:
            chosen = [random_pattern(k) for _ in range(quota)]
        for pat in chosen:
            add(k, pat)
    # Small strata run out of distinct allocations (e.g. 4+4 on two 4-GPU hosts): top up the
    # sample from random strata so it reaches the requested size whenever the cluster allows it.
    misses = 0
    while levels and len(seen) < cross_host_samples and misses < 200:
        k = levels[int(rng.integers(len(levels)))]
        pats = level_patterns[k]
        if pats is not None and not pats:
            misses += 1
            continue
        ok = add(k, pats[int(rng.integers(len(pats)))] if pats is not None else random_pattern(k))
        misses = 0 if ok else misses + 1
    for masks, stratum, used in base:
        for r in range(repeats):
            out.append(_measurement(spec, masks, sz, stratum, r, used))
    return out


# ----------------------------------------------------------------------------------------------
# command lines


def _size_arg(n: int) -> str:
    for unit, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _local_indices(m: PlannedMeasurement, spec: ClusterSpec, host: str) -> list[int]:
    h = spec.host_index[host]
    return [i for i in range(spec.hosts[h].n_gpus) if m.masks[h] >> i & 1]


def command_lines(
    measurement: PlannedMeasurement,
    spec: ClusterSpec,
    binary: str | None = None,
    mpirun: str = "mpirun",
    *,
    mpi_suffix: str = "_mpi",
) -> list[str]:
    """The real command line(s) of a measurement.

    One host (run on that host)::

        CUDA_VISIBLE_DEVICES=0,1,3 all_gather_perf -b 8M -e 32M -f 2 -g 3

    Several hosts (run from a launcher; one MPMD app context per host so each gets its own
    ``CUDA_VISIBLE_DEVICES``; nccl-tests picks device = local rank, i.e. the listed GPUs in order)::

        mpirun --tag-output -np 2 -H v100:2 -x CUDA_VISIBLE_DEVICES=0,3 all_gather_perf_mpi -b 8M -e 32M -f 2 -g 1 \\
               : -np 1 -H a800:1 -x CUDA_VISIBLE_DEVICES=5 all_gather_perf_mpi -b 8M -e 32M -f 2 -g 1

    ``binary`` defaults to the measurement's collective (``all_gather_perf``); it may be a path.
    """
    m = measurement
    binary = binary or m.collective
    sweep = f"-b {_size_arg(min(m.sizes))} -e {_size_arg(max(m.sizes))} -f 2"
    if not m.cross_host:
        idx = _local_indices(m, spec, m.hosts[0])
        cvd = ",".join(map(str, idx))
        return [f"CUDA_VISIBLE_DEVICES={cvd} {shlex.quote(binary)} {sweep} -g {len(idx)}"]
    exe = binary if binary.endswith(mpi_suffix) else binary + mpi_suffix
    contexts = []
    for host in m.hosts:
        idx = _local_indices(m, spec, host)
        cvd = ",".join(map(str, idx))
        contexts.append(
            f"-np {len(idx)} -H {shlex.quote(host)}:{len(idx)} -x CUDA_VISIBLE_DEVICES={cvd} "
            f"{shlex.quote(exe)} {sweep} -g 1"
        )
    return [f"{shlex.quote(mpirun)} --tag-output " + " : ".join(contexts)]


# ----------------------------------------------------------------------------------------------
# runners: measurement -> nccl-tests stdout

GPU_NAMES = {
    "H100": "NVIDIA H100 80GB HBM3",
    "A100": "NVIDIA A100-SXM4-80GB",
    "A800": "NVIDIA A800-SXM4-80GB",
    "V100": "Tesla V100-SXM2-32GB",
    "A6000": "NVIDIA RTX A6000",
    "RTX4090": "NVIDIA GeForce RTX 4090",
}
_BUS_IDS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_COPY_GBPS = 1500.0  # one-rank "collective": a local device copy
_HALF_SIZE = float(1 << 20)  # busbw(s) ~ s / (s + s0): latency-bound below s0


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest(), "little")


def _bus_id(i: int) -> str:
    return "0x%02x" % (_BUS_IDS[i] if i < len(_BUS_IDS) else (0x18 + 0x13 * i) % 0xFF)


class EmulatorRunner:
    """Writes what nccl-tests would print for a measurement on the cluster's fabric."""

    def __init__(self, spec: ClusterSpec, fabric: Any | None = None, binary: str | None = None, nccl_version: str = "2.21.5") -> None:
        from bandpilot.fabric.emulator import make_fabric

        self.spec = spec
        self.fabric = fabric if fabric is not None else make_fabric(spec)
        self.binary = binary
        self.nccl_version = nccl_version
        self._values: dict[str, tuple[float, float]] = {}

    def _measure(self, ms: Sequence[PlannedMeasurement]) -> dict[str, tuple[float, float]]:
        """``(truth, Fabric.measure)`` at the kept size, vectorised over measurements."""
        out: dict[str, tuple[float, float]] = {}
        by_repeat: dict[int, list[PlannedMeasurement]] = {}
        for m in ms:
            by_repeat.setdefault(m.repeat, []).append(m)
        for rep, group in by_repeat.items():
            masks = np.array([m.masks for m in group], dtype=np.int64)
            truth = self.fabric.bandwidth_masks(masks)
            meas = self.fabric.measure(masks, repeat=rep)
            out.update({m.id: (float(t), float(v)) for m, t, v in zip(group, truth, meas)})
        return out

    def prepare(self, ms: Sequence[PlannedMeasurement]) -> None:
        """Compute every planned value in one vectorised pass (run() calls this before executing)."""
        self._values.update(self._measure(ms))

    def _devices(self, m: PlannedMeasurement) -> list[Any]:
        from bandpilot.topology.nccl import NcclDevice

        devices = []
        rank = 0
        for host in m.hosts:
            gpu = self.spec.hosts[self.spec.host_index[host]].gpu
            for local, phys in enumerate(_local_indices(m, self.spec, host)):
                # One process with -g k on a single host; one process per rank under mpirun.
                pid = 1000 + _h(m.id, host if not m.cross_host else rank) % 90000
                devices.append(NcclDevice(rank, host, pid, local, _bus_id(phys), GPU_NAMES.get(gpu, f"NVIDIA {gpu}")))
                rank += 1
        return devices

    def _rows(self, m: PlannedMeasurement) -> list[Any]:
        from bandpilot.topology.nccl import NcclMeasure, busbw_factor, make_row, time_for

        n = m.n_gpus
        coll = m.collective
        gather = _canon(coll) in ("allgather", "reducescatter", "alltoall")
        redop = "sum" if _canon(coll) in ("allreduce", "reduce", "reducescatter") else "none"
        truth, measured = self._values.pop(m.id, None) or self._measure([m])[m.id]
        noise = float(getattr(self.fabric, "noise", 0.0))
        g = lambda s: s / (s + _HALF_SIZE)  # noqa: E731
        rows = []
        for i, size in enumerate(m.sizes):
            count = size // 4
            shown = (count // n) * n * 4 if gather else count * 4  # nccl-tests rounds to whole ranks
            if size == m.bytes:
                bw = measured  # exactly Fabric.measure: the value the dataset keeps
            else:  # neighbouring sizes: the latency curve plus independent seeded noise
                u1 = (_h(m.id, size, "u1") % 1_000_000 + 0.5) / 1_000_000
                u2 = (_h(m.id, size, "u2") % 1_000_000) / 1_000_000
                z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2)
                bw = truth * g(size) / g(m.bytes) * math.exp(noise * z)
            factor = busbw_factor(coll, n)
            if n < 2 or factor == 0 or bw <= 0:
                t = shown / (_COPY_GBPS * 1e3)
                rows.append(make_row(shown, count, "float", redop, -1, t, shown / (t * 1e3), 0.0))
            else:
                t = time_for(shown, bw, coll, n)
                # in-place differs from out-of-place by a little run-to-run jitter
                bw_in = bw * (1.0 + 0.01 * ((_h(m.id, size, "in") % 2001) / 1000.0 - 1.0))
                t_in = time_for(shown, bw_in, coll, n)
                inplace = NcclMeasure(t_in, bw_in / factor, bw_in, 0)
                rows.append(make_row(shown, count, "float", redop, -1, t, bw / factor, bw, in_place=inplace))
        return rows

    def _noise(self, m: PlannedMeasurement, devices: list[Any]) -> list[tuple[int, str]]:
        """NCCL_DEBUG=INFO lines as ``(rank, text)``."""
        out: list[tuple[int, str]] = []
        for d in devices:
            hi = self.spec.host_index[d.host]
            pre = f"{d.host}:{d.pid}:{d.pid} [{d.device}] NCCL INFO"
            if d.rank == 0 or (m.cross_host and d.device == 0):
                out.append((d.rank, f"{pre} Bootstrap : Using eth0:10.0.{hi}.{10 + hi}<0>"))
                out.append((d.rank, f"{pre} NET/Plugin: No plugin found (libnccl-net.so), using internal implementation"))
            if m.cross_host:
                rails = ", ".join(f"[{j}]mlx5_{j}:1/IB" for j in range(min(2, self.spec.rails_per_host)))
                out.append((d.rank, f"{pre} NET/IB : Using {rails} ; OOB eth0:10.0.{hi}.{10 + hi}<0>"))
            comm = "0x%012x" % (_h(m.id, "comm", d.rank) & 0xFFFFFFFFFFFF)
            out.append((d.rank, f"{pre} comm {comm} rank {d.rank} nranks {len(devices)} cudaDev {d.device} "
                                f"busId {d.bus_id[2:]}000 commId 0x{_h(m.id) & 0xFFFFFFFFFFFF:x} - Init COMPLETE"))
        return out

    def __call__(self, m: PlannedMeasurement) -> str:
        from bandpilot.topology.nccl import format_log

        devices = self._devices(m)
        binary = os.path.basename(self.binary or m.collective)
        if m.cross_host and not binary.endswith("_mpi"):
            binary += "_mpi"
        text = format_log(self._rows(m), devices, binary, in_place=True, nccl_version=self.nccl_version, tag_output=False)
        lines = text.split("\n")
        at = next((i + 1 for i, s in enumerate(lines) if s.startswith("NCCL version")), 0)
        noise = self._noise(m, devices)
        tagged = m.cross_host
        main = [(0, s) for s in lines]
        merged = main[:at] + noise + main[at:]
        if tagged:
            # mpirun --tag-output: every line carries [jobid,rank]<stream>:, stderr interleaved.
            out = [f"[1,{r}]<stdout>:{s}" if s else "" for r, s in merged]
            out.insert(at, "[1,1]<stderr>:Warning: Permanently added the ED25519 host key to the list of known hosts.")
        else:
            out = [s for _, s in merged]
        return "\n".join(out)


def _canon(collective: str) -> str:
    name = os.path.basename(collective)
    name = name[:-4] if name.endswith("_mpi") else name
    name = name[:-5] if name.endswith("_perf") else name
    return name.replace("_", "")


class RunFailed(BandPilotError):
    """A measurement run failed (non-zero exit, timeout, unusable output)."""


class SshRunner:
    """Runs the real command lines: ``ssh <host> <line>`` for one host, ``mpirun`` locally across hosts."""

    def __init__(self, spec: ClusterSpec, *, binary: str | None = None, mpirun: str = "mpirun",
                 ssh: Sequence[str] = ("ssh", "-o", "BatchMode=yes"), timeout: float = 900.0) -> None:
        self.spec = spec
        self.binary = binary
        self.mpirun = mpirun
        self.ssh = tuple(ssh)
        self.timeout = timeout

    def __call__(self, m: PlannedMeasurement) -> str:
        out = []
        for line in command_lines(m, self.spec, self.binary, self.mpirun):
            argv = [*self.ssh, m.hosts[0], line] if not m.cross_host else shlex.split(line)
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
            except subprocess.TimeoutExpired:
                raise RunFailed(f"{m.id}: timed out after {self.timeout:.0f} s: {line}") from None
            except OSError as exc:
                raise RunFailed(f"{m.id}: cannot run {argv[0]!r}: {exc.strerror}") from None
            out.append(proc.stdout)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or [""]
                raise RunFailed(f"{m.id}: exit status {proc.returncode}: {tail[0][:200]}")
        return "".join(out)


def make_runner(runner: str | Callable[[PlannedMeasurement], str], spec: ClusterSpec, **kwargs: Any) -> Callable[[PlannedMeasurement], str]:
    if callable(runner):
        return runner
    if runner == "emulator":
        return EmulatorRunner(spec, binary=kwargs.get("binary"))
    if runner == "ssh":
        return SshRunner(spec, binary=kwargs.get("binary"), mpirun=kwargs.get("mpirun", "mpirun"))
    raise SpecError(f"unknown runner {runner!r}; expected one of {RUNNERS}")


# ----------------------------------------------------------------------------------------------
# execution


@dataclass
class ProfileReport:
    cluster: str
    dataset_dir: Path
    planned: int
    measured: int  # run in this invocation
    skipped: int  # already measured (resume)
    failed: int
    elapsed: float
    ingest: IngestReport | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)  # (id, error), first few
    dvc_md5: str | None = None

    def summary(self) -> str:
        s = (
            f"{self.cluster}: {self.planned} planned, {self.measured} measured, {self.skipped} already done, "
            f"{self.failed} failed in {self.elapsed:.1f} s"
        )
        if self.ingest is not None:
            s += f"\n{self.ingest.summary()}"
        if self.dvc_md5:
            s += f"\ndvc: data tracked as {self.dvc_md5}"
        for ident, err in self.failures[:5]:
            s += f"\nfailed {ident}: {err}"
        return s

    __str__ = summary


def cluster_dir(out_dir: str | Path, spec: ClusterSpec) -> Path:
    return Path(out_dir) / "data" / _safe(spec.name)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


#: Emulated measurements carry a fixed logical timestamp and no duration, so profiling the same
#: spec with the same seed gives byte-identical data (and the same DVC version) on any machine.
EMULATED_TIME = "2026-01-01T00:00:00+00:00"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


class _Manifest:
    """Entries by id in a stable order; rewritten atomically (throttled) as measurements finish."""

    def __init__(self, path: Path, entries: dict[str, dict]) -> None:
        self.path = path
        self.entries = entries
        self._last = 0.0

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        _atomic_write(self.path, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in self.entries.values()))


def _prepare_dir(cdir: Path, spec: ClusterSpec, resume: bool) -> dict[str, dict]:
    """Create the layout, check a resumed directory belongs to this cluster, load its manifest."""
    import yaml

    from bandpilot.topology.cluster import load_cluster

    (cdir / RAW_DIR).mkdir(parents=True, exist_ok=True)
    spec_file = cdir / SPEC_FILE
    if spec_file.is_file() and resume:
        old = load_cluster(spec_file)
        if old.fingerprint() != spec.fingerprint():
            raise DataError(
                f"{spec_file}: {cdir} holds measurements of a different cluster spec "
                f"(hosts/GPUs/topology changed); use another --out or resume=False"
            )
    _atomic_write(spec_file, yaml.safe_dump(spec.to_dict(), sort_keys=False))
    manifest = cdir / MANIFEST_FILE
    if resume and manifest.is_file():
        return {e["id"]: e for _, e in read_manifest(manifest)}
    return {}


def run(
    spec: ClusterSpec,
    out_dir: str | Path,
    *,
    runner: str | Callable[[PlannedMeasurement], str] = "emulator",
    resume: bool = True,
    progress: bool = True,
    jobs: int | None = None,
    cross_host_samples: int = 200,
    seed: int = 0,
    sizes: Iterable[int] | None = None,
    measurements: list[PlannedMeasurement] | None = None,
    binary: str | None = None,
    mpirun: str = "mpirun",
    do_ingest: bool = True,
) -> ProfileReport:
    """Execute the plan into ``<out_dir>/data/<cluster>/`` and ingest it into ``measurements.parquet``.

    ``jobs`` bounds concurrent runs (default: one per host); a run starts only when all its hosts
    are idle, so each host works through its own intra-host list while the others do theirs, and
    cross-host runs take whole hosts. With ``resume`` a measurement whose log exists and is done (or
    valid) is skipped; failed runs are recorded as ``failed`` and retried by the next run.
    """
    t0 = time.perf_counter()
    todo_plan = measurements if measurements is not None else plan(spec, cross_host_samples=cross_host_samples, seed=seed, sizes=sizes)
    execute = make_runner(runner, spec, binary=binary, mpirun=mpirun)
    runner_name = runner if isinstance(runner, str) else getattr(runner, "__name__", type(runner).__name__)
    cdir = cluster_dir(out_dir, spec)
    old = _prepare_dir(cdir, spec, resume)
    entries: dict[str, dict] = {}
    todo: list[PlannedMeasurement] = []
    skipped = 0
    for m in todo_plan:
        if m.id in entries:
            continue  # a plan never repeats an id; be safe with hand-made lists
        prev = old.get(m.id)
        log = cdir / m.log
        if resume and prev is not None and log.is_file():
            if prev.get("status") == "done":
                entries[m.id] = prev
                skipped += 1
                continue
            try:  # a log written just before an interruption: keep it when it is valid
                _, bw = check_log(log.read_text(errors="replace"), log, m.entry("done"), spec)
                entries[m.id] = m.entry("done", busbw=bw, runner=prev.get("runner"), time=_now(), recovered=True)
                skipped += 1
                continue
            except DataError:
                pass
        entries[m.id] = m.entry("planned", command=command_lines(m, spec, binary, mpirun))
        todo.append(m)
    for ident, e in old.items():  # measurements of earlier plans stay (repeats are data too)
        entries.setdefault(ident, e)
    manifest = _Manifest(cdir / MANIFEST_FILE, entries)
    manifest.save(force=True)

    failures: list[tuple[str, str]] = []
    measured = 0
    fingerprint = spec.fingerprint()

    def one(m: PlannedMeasurement) -> tuple[float, float]:
        t = time.perf_counter()
        text = execute(m)
        log = cdir / m.log
        entry = m.entry("done")
        try:
            _, bw = check_log(text, log, entry, spec)
        except DataError:
            _atomic_write(cdir / f"{m.log}.failed", text)  # keep the output for a post-mortem
            raise
        _atomic_write(log, text)
        remember_checked_log(log, entry, spec, bw, fingerprint)
        stale = cdir / f"{m.log}.failed"
        if stale.exists():  # an earlier attempt's post-mortem
            stale.unlink(missing_ok=True)
        return bw, time.perf_counter() - t

    def done(m: PlannedMeasurement, fut: Future | None, value: Any = None, error: BaseException | None = None) -> None:
        nonlocal measured
        if fut is not None:
            error = fut.exception()
            value = None if error is not None else fut.result()
        e = entries[m.id]
        if error is not None:
            if not isinstance(error, BandPilotError):
                raise error
            e.update(status="failed", error=str(error), time=_now(), runner=runner_name)
            failures.append((m.id, str(error)))
        else:
            bw, secs = value
            if runner_name == "emulator":
                e.update(status="done", busbw=round(bw, 4), time=EMULATED_TIME, runner=runner_name)
            else:
                e.update(status="done", busbw=round(bw, 4), time=_now(), runner=runner_name, seconds=round(secs, 4))
            e.pop("error", None)
            measured += 1
        bar.update(1)
        manifest.save()

    prepare = getattr(execute, "prepare", None)
    if callable(prepare) and todo:
        prepare(todo)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=f"profile {spec.name}", unit="run", disable=not progress or not todo,
               file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    try:
        n_jobs = max(1, int(jobs if jobs is not None else spec.n_hosts))
        if n_jobs == 1:
            for m in todo:
                try:
                    val = one(m)
                except BandPilotError as exc:
                    done(m, None, error=exc)
                else:
                    done(m, None, value=val)
        else:
            _schedule(todo, n_jobs, one, done)
    finally:
        bar.close()
        manifest.save(force=True)
    report = ProfileReport(
        cluster=spec.name,
        dataset_dir=cdir,
        planned=len(todo_plan),
        measured=measured,
        skipped=skipped,
        failed=len(failures),
        elapsed=0.0,
        failures=failures,
    )
    if do_ingest and any(e.get("status") == "done" for e in entries.values()):
        report.ingest = ingest(cdir, cdir)
    report.elapsed = time.perf_counter() - t0
    return report


def _schedule(todo: list[PlannedMeasurement], jobs: int, work: Callable, done: Callable) -> None:
    """Run ``work`` on a pool; a measurement starts only when none of its hosts is busy.

    Queues are grouped by host set and served in plan order, so per-host intra lists run
    concurrently and cross-host runs wait for their hosts.
    """
    queues: dict[tuple[str, ...], deque] = {}
    for m in todo:
        queues.setdefault(m.hosts, deque()).append(m)
    busy: set[str] = set()
    running: dict[Future, PlannedMeasurement] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="profile") as pool:
        try:
            while queues or running:
                for key in list(queues):
                    if len(running) >= jobs:
                        break
                    if busy.isdisjoint(key):
                        q = queues[key]
                        m = q.popleft()
                        if not q:
                            del queues[key]
                        busy.update(key)
                        running[pool.submit(work, m)] = m
                if not running:  # pragma: no cover - every queue head is startable when idle
                    raise RuntimeError("scheduler stalled")
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    m = running.pop(fut)
                    busy.difference_update(m.hosts)
                    done(m, fut)
        except BaseException:
            for fut in running:
                fut.cancel()
            raise
