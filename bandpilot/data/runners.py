"""How is a measurement run? The command lines of a planned measurement and the runners that turn
it into nccl-tests stdout.

Both runners produce nccl-tests stdout that goes through :func:`bandpilot.topology.nccl_log.parse` and the same
checks as :func:`bandpilot.data.ingest.ingest` (device table vs plan), so emulated and real profiling
cannot drift apart:

* ``emulator`` - writes logs with :func:`bandpilot.topology.nccl_format.format_log` from the cluster's fabric
  (``Fabric.measure`` noise), several message sizes, a realistic device table and NCCL INFO noise;
* ``ssh`` - runs the real command lines (``ssh <host> CUDA_VISIBLE_DEVICES=... all_gather_perf``
  for one host, ``mpirun ... all_gather_perf_mpi`` across hosts) and captures stdout.
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import subprocess
from typing import Any, Callable, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec
from bandpilot.errors import BandPilotError, SpecError
from bandpilot.data.planning import PlannedMeasurement

RUNNERS = ("emulator", "ssh")
_DENSE_CELLS = 1 << 22  # host-mask cells per vectorised pass of the emulator (32 MB of int64)


# ----------------------------------------------------------------------------------------------
# command lines


def _size_arg(n: int) -> str:
    for unit, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _local_indices(m: PlannedMeasurement, spec: ClusterSpec, host: str) -> list[int]:
    h = spec.host_index[host]
    mask = m.mask(h)  # not m.masks[h]: that builds the dense per-host tuple
    return [i for i in range(spec.hosts[h].n_gpus) if mask >> i & 1]


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
        n_hosts = self.spec.n_hosts
        step = max(1, _DENSE_CELLS // max(n_hosts, 1))  # dense rows per pass: memory stays bounded
        for rep, group in by_repeat.items():
            truth, meas = [], []
            for at in range(0, len(group), step):
                part = group[at : at + step]
                masks = np.zeros((len(part), n_hosts), dtype=np.int64)
                for i, m in enumerate(part):
                    masks[i, list(m.used)] = m.used_masks
                truth += self.fabric.bandwidth_masks(masks).tolist()
                meas += self.fabric.measure(masks, repeat=rep).tolist()
            out.update({m.id: (float(t), float(v)) for m, t, v in zip(group, truth, meas)})
        return out

    def prepare(self, ms: Sequence[PlannedMeasurement]) -> None:
        """Compute every planned value in one vectorised pass (run() calls this before executing)."""
        self._values.update(self._measure(ms))

    def _devices(self, m: PlannedMeasurement) -> list[Any]:
        from bandpilot.topology.nccl_log import NcclDevice

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
        from bandpilot.topology.nccl_format import busbw_factor, make_row, time_for
        from bandpilot.topology.nccl_log import NcclMeasure

        n = m.n_gpus
        coll = m.collective
        gather = _canon(coll) in ("allgather", "reducescatter", "alltoall")
        redop = "sum" if _canon(coll) in ("allreduce", "reduce", "reducescatter") else "none"
        truth, measured = self._values.pop(m.id) if m.id in self._values else self._measure([m])[m.id]
        noise = float(getattr(self.fabric, "noise", 0.0))
        g = lambda s: s / (s + _HALF_SIZE)  # noqa: E731
        rows = []
        for size in m.sizes:
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
        from bandpilot.topology.nccl_format import format_log

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
