"""Fit the emulator's parameters to a measurement directory.

``calibrate(dir)`` reads ``cluster.yaml`` + its intra tables (and the inter table when there is
one) and fits, per GPU type, the ring model's link-class capacities, PCIe port / uplink /
inter-socket capacities, host cap, hop penalty and per-rank-count efficiency (see
:class:`bandpilot.fabric.rings.RingModel`), and the network's rail efficiency, switch cap and count
terms. The result carries the fitted parameters, accuracy figures per table (per-pattern MAPE,
Spearman, max error) and :meth:`CalibrationResult.to_yaml`, an ``emulator:`` block for a spec.

How: a closed-form start from the 2-GPU pairs (each pair class's bandwidth, PCIe staging
detected from locality), then a bounded coordinate (pattern) search in log space minimising
``RMS log error + 0.5 * (1 - Spearman)`` per table. Deterministic; seconds per GPU type.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import yaml

from bandpilot.topology.cluster import ClusterSpec, Topology, load_cluster, popcount
from bandpilot.fabric.tables import intra_lookup, read_inter_table, read_intra_table
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.fabric.rings import ring_model, switch_group_of

#: weight of the rank term in the objective (the dispatcher needs the ordering most)
RANK_WEIGHT = 0.5
_INTRA_EVALS = 450
_NET_EVALS = 800


@dataclass(frozen=True)
class TableFit:
    """Accuracy of the fitted emulator on one measured table."""

    table: str  # path relative to the measurement directory
    kind: str  # "intra" or "inter"
    host: str | None
    gpu: str | None
    patterns: int  # subsets (intra) or count patterns (inter) compared
    mape: float  # mean absolute percentage error over patterns (mean of repeats), in %
    spearman: float
    max_error: float  # largest absolute percentage error, in %
    rmsle: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CalibrationResult:
    cluster: str
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    network: dict[str, float] | None = None
    tables: list[TableFit] = field(default_factory=list)
    seconds: float = 0.0

    def emulator(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.gpus:
            out["gpus"] = self.gpus
        if self.network is not None:
            out["network"] = self.network
        return out

    def to_yaml(self) -> str:
        """The fitted parameters as an ``emulator:`` block, ready to paste into a cluster spec."""
        head = f"# fitted by `bandpilot calibrate` on {self.cluster}\n"
        for t in self.tables:
            head += f"#   {t.table}: MAPE {t.mape:.1f}%, Spearman {t.spearman:.3f}\n"
        return head + yaml.safe_dump({"emulator": _plain(self.emulator())}, sort_keys=False, default_flow_style=None, width=100)

    def table(self, name: str) -> TableFit:
        for t in self.tables:
            if t.table == name or Path(t.table).name == name or t.host == name:
                return t
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "emulator": _plain(self.emulator()),
            "tables": [t.as_dict() for t in self.tables],
            "seconds": self.seconds,
        }


# ------------------------------------------------------------------------------------------
def calibrate(source: str | Path | ClusterSpec, *, gpu_types: Iterable[str] | None = None) -> CalibrationResult:
    """Fit emulator parameters to a measurement directory (or its ``cluster.yaml``, or a loaded spec)."""
    t0 = time.perf_counter()
    spec = source if isinstance(source, ClusterSpec) else load_cluster(source)
    base = spec.path.parent if spec.path is not None else Path.cwd()
    wanted = set(gpu_types) if gpu_types is not None else None
    if wanted is not None:
        unknown = wanted - set(spec.gpu_types)
        if unknown:
            raise SpecError(f"cluster {spec.name!r} has no GPU type(s) {sorted(unknown)} (it has {list(spec.gpu_types)})")
    result = CalibrationResult(spec.name)

    by_type: dict[str, list[tuple[str, str, Topology, np.ndarray]]] = {}
    intra: dict[int, np.ndarray] = {}
    for i, h in enumerate(spec.hosts):
        if h.intra is None:
            continue
        intra[i] = intra_lookup(read_intra_table(h.intra, h.n_gpus), h.n_gpus, str(h.intra))
        if wanted is None or h.gpu in wanted:
            by_type.setdefault(h.gpu, []).append((_rel(h.intra, base), h.name, h.topology, intra[i]))
    if not by_type and spec.inter is None:
        raise DataError(f"cluster {spec.name!r}: no intra tables{' of ' + str(sorted(wanted)) if wanted else ''} and no inter table to calibrate against")
    for gpu in sorted(by_type):
        params, fits = _fit_gpu(gpu, by_type[gpu])
        result.gpus[gpu] = params
        result.tables.extend(fits)
    if spec.inter is not None and wanted is None:
        params, fit = _fit_network(spec, _rel(spec.inter.table, base), intra, base)
        result.network = params
        result.tables.append(fit)
    result.seconds = time.perf_counter() - t0
    return result


# ------------------------------------------------------------------------------------------
# Metrics
def _rank(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def spearman(pred: np.ndarray, truth: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); 0 when either side is constant."""
    a, b = _rank(np.asarray(pred, float)), _rank(np.asarray(truth, float))
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


def _metrics(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float, float, float]:
    rel = np.abs(pred - truth) / truth
    rmsle = float(np.sqrt(np.mean((np.log(pred) - np.log(truth)) ** 2)))
    return float(rel.mean() * 100), spearman(pred, truth), float(rel.max() * 100), rmsle


def _objective(pred: np.ndarray, truth: np.ndarray, truth_rank: np.ndarray) -> float:
    if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
        return math.inf
    rmsle = math.sqrt(float(np.mean((np.log(pred) - np.log(truth)) ** 2)))
    a = _rank(pred)
    a = a - a.mean()
    b = truth_rank - truth_rank.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    rho = float((a * b).sum() / den) if den > 0 else 0.0
    return rmsle + RANK_WEIGHT * (1.0 - rho)


def _pattern_search(obj: Callable[[np.ndarray], float], x0: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                    *, step: float = 0.4, min_step: float = 0.01, max_evals: int = 600) -> tuple[np.ndarray, float]:
    """Bounded coordinate search (Hooke-Jeeves style, with acceleration along a good direction)."""
    x = np.clip(x0.astype(float), lo, hi)
    f = obj(x)
    evals = 1
    while step >= min_step and evals < max_evals:
        improved = False
        for i in range(x.size):
            for d in (1.0, -1.0):
                y = x.copy()
                y[i] = min(max(y[i] + d * step, lo[i]), hi[i])
                if y[i] == x[i]:
                    continue
                fy = obj(y)
                evals += 1
                if fy < f - 1e-12:
                    x, f, improved = y, fy, True
                    while evals < max_evals:  # keep going while it pays
                        z = x.copy()
                        z[i] = min(max(z[i] + d * step, lo[i]), hi[i])
                        if z[i] == x[i]:
                            break
                        fz = obj(z)
                        evals += 1
                        if fz >= f - 1e-12:
                            break
                        x, f = z, fz
                    break
        if not improved:
            step /= 2.0
    return x, f


# ------------------------------------------------------------------------------------------
# Intra-host: one GPU type, one or more host tables
def _pair_stats(topo: Topology, table: np.ndarray) -> dict[str, list[float]]:
    """2-GPU bandwidths by link class (NV per link), and non-NVLink pairs split by PCIe switch group."""
    grp = switch_group_of(topo)
    out: dict[str, list[float]] = {"same": [], "cross": []}
    for i in range(topo.n):
        for j in range(i + 1, topo.n):
            v = float(table[(1 << i) | (1 << j)])
            cls = topo.links[i][j]
            if cls == "NV":
                out.setdefault("NV", []).append(v / max(topo.nvlinks[i][j], 1))
                continue
            out.setdefault(cls, []).append(v)
            out["same" if grp[i] == grp[j] else "cross"].append(v)
    return out


def _intra_start(stats: dict[str, list[float]], classes: list[str], kinds: set[str], same: list[float], p2p: bool,
                 top: float, n_eff: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The intra fit's parameters (log space): names, closed-form start from the pair bandwidths,
    and the box the pattern search stays in."""
    pcie_pairs = [v for c in classes if c != "NV" for v in stats[c]]
    names: list[str] = []
    start: list[float] = []
    for c in classes:
        names.append(f"link.{c}")
        start.append(float(np.median(stats[c])))
    if "port" in kinds:
        names.append("pcie")
        start.append(max(pcie_pairs))
    if "up" in kinds:
        names.append("uplink")
        start.append(2 * float(np.median(same)) if (same and not p2p) else 2 * max(pcie_pairs))
    if "sys" in kinds:
        names.append("sys")
        start.append(float(np.median(stats.get("SYS", pcie_pairs))))
    names += ["cap", "sharpness", "hop_penalty"]
    start += [1.2 * top, 8.0, 0.3]
    names += [f"eff{k}" for k in range(3, 3 + n_eff)]
    start += [1.0] * n_eff
    x0 = np.log(np.array(start))
    lo, hi = x0 - math.log(4.0), x0 + math.log(4.0)
    for i, name in enumerate(names):
        if name.startswith("eff"):
            lo[i], hi[i] = math.log(0.5), math.log(1.5)
        elif name == "sharpness":
            lo[i], hi[i] = math.log(2.0), math.log(40.0)
        elif name == "hop_penalty":
            lo[i], hi[i] = math.log(0.01), math.log(3.0)
        elif name == "cap":
            lo[i], hi[i] = math.log(0.8 * top), math.log(3.0 * top)
    return names, x0, lo, hi


def _fit_gpu(gpu: str, tables: list[tuple[str, str, Topology, np.ndarray]]) -> tuple[dict[str, Any], list[TableFit]]:
    topo = tables[0][2]
    if any(t[2] != topo for t in tables):
        raise SpecError(f"hosts of GPU type {gpu!r} have different topologies; calibrate them as separate types")
    if topo.n < 2:
        raise DataError(f"GPU type {gpu!r}: hosts have a single GPU, nothing to calibrate")
    # Pairs: closed-form start. Locality inverted (pairs under one PCIe switch slower than pairs
    # across switches) means no GPU peer-to-peer: traffic is staged through host memory.
    stats: dict[str, list[float]] = {}
    for _, _, _, table in tables:
        for k, v in _pair_stats(topo, table).items():
            stats.setdefault(k, []).extend(v)
    same, cross = stats.pop("same"), stats.pop("cross")
    p2p = not (same and cross and np.median(same) < 0.9 * np.median(cross))
    model = ring_model(topo, p2p)
    truth = np.stack([t[3][model.masks] for t in tables])
    if np.any(truth <= 0):
        raise DataError(f"GPU type {gpu!r}: intra table has non-positive bandwidth for a subset of >= 2 GPUs")
    truth_rank = np.stack([_rank(t) for t in truth])
    classes = sorted(c for c in stats)
    n_eff = min(topo.n, 8) - 2
    names, x0, lo, hi = _intra_start(stats, classes, model.kinds, same, p2p, float(truth.max()), n_eff)

    def unpack(x: np.ndarray, digits: int | None = None) -> dict[str, Any]:
        v = np.exp(x)
        if digits is not None:
            v = np.array([_sig(float(a), digits) for a in v])
        d = dict(zip(names, v.tolist()))
        params: dict[str, Any] = {"link": {c: d[f"link.{c}"] for c in classes}}
        for key in ("pcie", "uplink", "sys"):
            if key in d:
                params[key] = d[key]
        params["p2p"] = p2p
        params["cap"] = d["cap"]
        params["sharpness"] = d["sharpness"]
        params["hop_penalty"] = d["hop_penalty"]
        params["ring_eff"] = [1.0] + [d[f"eff{k}"] for k in range(3, 3 + n_eff)]
        return params

    def obj(x: np.ndarray) -> float:
        pred = model.values(unpack(x))
        return float(np.mean([_objective(pred, truth[i], truth_rank[i]) for i in range(len(tables))]))

    best, _ = _pattern_search(obj, x0, lo, hi, max_evals=_INTRA_EVALS)
    params = unpack(best, digits=4)
    pred = model.values(params)
    fits = []
    for (rel, host, _, _), y in zip(tables, truth):
        mape, rho, mx, rmsle = _metrics(pred, y)
        fits.append(TableFit(rel, "intra", host, gpu, int(y.size), mape, rho, mx, rmsle))
    return params, fits


# ------------------------------------------------------------------------------------------
# Network: the inter table's cross-host rows, per count pattern
_NET_FIT = ("rail_efficiency", "switch_base", "switch_peer", "count_gain", "imbalance", "sharpness")
# A fixed start (not the current defaults), so that re-calibrating reproduces the defaults.
_NET_START = {"rail_efficiency": 0.77, "switch_base": 1.1, "switch_peer": 1.8, "count_gain": 0.08, "imbalance": 0.05, "sharpness": 12.0}


def _fit_network(spec: ClusterSpec, rel: str, intra: dict[int, np.ndarray], base: Path) -> tuple[dict[str, float], TableFit]:
    """Fit the network to the cross-host rows of the inter table, per count pattern.

    A table measured on this cluster (inside its directory, ``scale`` 1) holds end-to-end values,
    so the prediction is ``min(network, measured intra of hosts with >= 2 GPUs)`` when the spec
    combines that way. A table borrowed from another cluster and scaled (the paper's Het-4Mix
    synthesis) is the network term alone.
    """
    assert spec.inter is not None
    n = int(spec.gpus_per_host.max())
    rows = read_inter_table(spec.inter.table, spec.n_hosts, n)
    own = spec.inter.scale == 1.0 and not _rel(spec.inter.table, base).startswith("..")
    end_to_end = own and spec.inter.combine == "min_intra" and len(intra) == spec.n_hosts
    counts_rows, vals, floors = [], [], []
    for r in rows:
        cnt = popcount(np.array(r.masks, dtype=np.int64))
        if (cnt > 0).sum() >= 2:
            counts_rows.append(cnt)
            vals.append(r.busbw * spec.inter.scale)
            floor = math.inf
            if end_to_end:
                for h, m in enumerate(r.masks):
                    if cnt[h] >= 2:
                        floor = min(floor, float(intra[h][m]))
            floors.append(floor)
    floor_a = np.array(floors)
    if not counts_rows:
        raise DataError(f"{spec.inter.table}: no cross-host rows to calibrate the network against")
    counts = np.array(counts_rows)
    vals_a = np.array(vals)
    if np.any(vals_a <= 0):
        raise DataError(f"{spec.inter.table}: non-positive cross-host bandwidth")
    # Patterns: sorted per-host counts; the model is evaluated on every row and averaged alike.
    keys = [tuple(sorted(c.tolist(), reverse=True)) for c in counts]
    uniq = sorted(set(keys))
    index = np.array([uniq.index(k) for k in keys])
    n_pat = len(uniq)
    size = np.bincount(index, minlength=n_pat)
    truth = np.bincount(index, weights=vals_a, minlength=n_pat) / size
    truth_rank = _rank(truth)
    x0 = np.log(np.array([_NET_START[k] for k in _NET_FIT]))
    lo, hi = x0 - math.log(5.0), x0 + math.log(5.0)
    lo[0], hi[0] = math.log(0.2), math.log(1.0)  # rail efficiency: a fraction of the line rate
    lo[4], hi[4] = math.log(1e-3), math.log(2.0)
    lo[5], hi[5] = math.log(2.0), math.log(60.0)
    fixed = {k: v for k, v in network_overrides(spec).items() if k not in _NET_FIT}

    def predict(x: np.ndarray, digits: int | None = None) -> tuple[np.ndarray, dict[str, float]]:
        v = np.exp(x)
        if digits is not None:
            v = np.array([_sig(float(a), digits) for a in v])
        params = {**fixed, **dict(zip(_NET_FIT, v.tolist()))}
        fab = EmulatorFabric(dataclasses.replace(spec, emulator={"network": params}), noise=0.0)
        per_row = np.minimum(fab.network(counts), floor_a)
        return np.bincount(index, weights=per_row, minlength=n_pat) / size, params

    def obj(x: np.ndarray) -> float:
        pred, _ = predict(x)
        if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
            return math.inf
        mape = float(np.mean(np.abs(pred - truth) / truth))
        a = _rank(pred) - (n_pat + 1) / 2.0
        b = truth_rank - truth_rank.mean()
        den = math.sqrt(float((a * a).sum() * (b * b).sum()))
        rho = float((a * b).sum() / den) if den > 0 else 0.0
        return mape + RANK_WEIGHT * (1.0 - rho)

    best, _ = _pattern_search(obj, x0, lo, hi, step=0.5, min_step=0.005, max_evals=_NET_EVALS)
    pred, params = predict(best, digits=4)
    mape, rho, mx, rmsle = _metrics(pred, truth)
    return params, TableFit(rel, "inter", None, None, n_pat, mape, rho, mx, rmsle)


def network_overrides(spec: ClusterSpec) -> dict[str, float]:
    return {k: float(v) for k, v in (spec.emulator.get("network") or {}).items()}


# ------------------------------------------------------------------------------------------
def _sig(x: float, digits: int) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _rel(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        import os

        return os.path.relpath(Path(path).resolve(), base.resolve())
