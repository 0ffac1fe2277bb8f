"""How would nccl-tests print this run? Write its stdout log, with bus-bandwidth factors and times
consistent with what nccl-tests computes.

Why a writer next to the parser: the emulator writes logs with :func:`format_log` and real runs
are captured from stdout, and both go through :func:`bandpilot.topology.nccl_log.parse`, so the
emulated and the real measurement paths cannot drift apart.
"""

from __future__ import annotations

from typing import Iterable

from bandpilot.topology.nccl_log import NcclDevice, NcclMeasure, NcclRow, norm_collective

__all__ = [
    "format_log",
    "make_row",
    "busbw_factor",
    "time_for",
]


def _canon(collective: str) -> str:
    name = norm_collective(collective.strip().lower())
    if name.endswith("_perf"):
        name = name[:-5]
    return name.replace("_", "").replace("-", "")


_SAME = {"broadcast", "reduce", "sendrecv"}
_N1_N = {"allgather", "reducescatter", "alltoall", "gather", "scatter", "hypercube"}


def busbw_factor(collective: str, nranks: int) -> float:
    """busbw/algbw as nccl-tests computes it (see its PERFORMANCE.md), e.g. 2(n-1)/n for all_reduce."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    name = _canon(collective)
    if name == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if name in _N1_N:
        return (nranks - 1) / nranks
    if name in _SAME:
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def time_for(size: int, busbw: float, collective: str, nranks: int) -> float:
    """Time (us) at which ``size`` bytes reach ``busbw`` GB/s, so time/algbw/busbw stay consistent."""
    factor = busbw_factor(collective, nranks)
    if busbw <= 0 or factor <= 0:
        raise ValueError(f"cannot derive a time from busbw={busbw} with bus factor {factor}")
    algbw = busbw / factor
    return size / (algbw * 1e3)  # algbw[GB/s] = size / 1e9 / t[s]


def make_row(
    size: int,
    count: int,
    type_: str,
    redop: str,
    root: int,
    time_us: float,
    algbw: float,
    busbw: float,
    *,
    wrong: int | None = 0,
    in_place: NcclMeasure | None = None,
) -> NcclRow:
    """Convenience constructor: one out-of-place measure, optionally an in-place one."""
    out = NcclMeasure(float(time_us), float(algbw), float(busbw), wrong)
    groups = (out,) if in_place is None else (out, in_place)
    return NcclRow(int(size), int(count), type_, redop or "none", int(root), groups)


def _fmt_time(t: float) -> str:
    """Like nccl-tests' getFloatStr: as many decimals as fit in 7 characters."""
    for fmt in ("%7.2f", "%7.1f", "%7.0f"):
        s = fmt % t
        if len(s) <= 7:
            return s
    return "%7.1e" % t


def _fmt_measure(m: NcclMeasure) -> str:
    """``  %7s  %6.2f  %6.2f  %6g`` as in nccl-tests, ``    N/A`` when validation is off."""
    wrong = "    N/A" if m.wrong is None else "  %6d" % m.wrong
    return "  %7s  %6.2f  %6.2f" % (_fmt_time(m.time_us), m.algbw, m.busbw) + wrong


def _version_code(version: str) -> int:
    try:
        major, minor, patch = (int(p) for p in version.split(".")[:3])
    except ValueError:
        return 0
    return major * 10000 + minor * 100 + patch


def _check_token(value: str, what: str) -> None:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{what} must be a non-empty token without whitespace, got {value!r}")


def format_log(
    rows: Iterable[NcclRow],
    devices: Iterable[NcclDevice],
    collective: str = "all_gather_perf",
    *,
    in_place: bool = True,
    nccl_version: str = "2.21.5",
    tag_output: bool = False,
) -> str:
    """Write the stdout of an nccl-tests run (layout of nccl-tests 2.14+) that :func:`parse` reads back."""
    rows = list(rows)
    devices = list(devices)
    if not rows:
        raise ValueError("format_log needs at least one row")
    binary = collective.rsplit("/", 1)[-1]
    if not (binary.endswith("_perf") or binary.endswith("_perf_mpi")):
        binary += "_perf"
    code = _version_code(nccl_version)
    sizes = [r.size for r in rows]
    out = [
        f"# nccl-tests version 2.14.1 nccl-headers={code} nccl-library={code}",
        f"# Collective test starting: {binary}",
        f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) "
        "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for d in devices:
        _check_token(d.host, "host")
        if "]" in d.bus_id or "\n" in d.bus_id or "\n" in d.name:
            raise ValueError(f"bus_id/name not printable in a device line: {d.bus_id!r} {d.name!r}")
        pid = "" if d.pid is None else " Pid %6d" % d.pid
        out.append(("#  Rank %2d Group %2d%s on %10s device %2d [%s] %s" % (
            d.rank, 0, pid, d.host, d.device, d.bus_id, d.name)).rstrip())
    out.append(f"NCCL version {nccl_version}+cuda12.4")
    out.append("#")
    head = "# %10s  %12s  %8s  %6s  %6s" % ("", "", "", "", "")
    names = "# %10s  %12s  %8s  %6s  %6s" % ("size", "count", "type", "redop", "root")
    units = "# %10s  %12s  %8s  %6s  %6s" % ("(B)", "(elements)", "", "", "")
    labels = ["out-of-place", "in-place"] if in_place else ["out-of-place"]
    head += "           " + "                       ".join(labels)
    for _ in labels:
        names += "  %7s  %6s  %6s  %6s" % ("time", "algbw", "busbw", "#wrong")
        units += "  %7s  %6s  %6s  %6s" % ("(us)", "(GB/s)", "(GB/s)", "")
    out += [head, names, units.rstrip()]
    bws: list[float] = []
    errors = 0
    for r in rows:
        _check_token(r.type, "type")
        _check_token(r.redop, "redop")
        groups = [r.groups[0]]
        if in_place:
            groups.append(r.groups[1] if len(r.groups) > 1 else r.groups[0])
        line = "%12li  %12li  %8s  %6s  %6i" % (r.size, r.count, r.type, r.redop, r.root)
        for m in groups:
            line += _fmt_measure(m)
            bws.append(m.busbw)
            errors += 1 if m.wrong else 0
        out.append(line)
    avg = sum(bws) / len(bws)
    out += [
        "# Out of bounds values : %d %s" % (errors, "FAILED" if errors else "OK"),
        "# Avg bus bandwidth    : %g " % avg,
        "#",
        f"# Collective test concluded: {binary}",
        "#",
        "",
    ]
    if tag_output:
        out = ["[1,0]<stdout>:" + line for line in out]
    return "\n".join(out) + "\n"
