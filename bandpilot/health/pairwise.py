"""Which nodes and node pairs are slow? Model-free verification from pairwise sweeps.

Each (collective, GPUs per node, repeat) of a sweep is a node x node matrix of busbw. In log space a
healthy fabric is additive - ``log B[i,j] = mu + a_i + a_j`` - so a median polish (Tukey) gives
every node its effect ``a_i`` and every link its residual, robustly: a slow node pulls down all its
links (a low ``a_i``, normal residuals), a slow link only its own cell (a normal ``a_i``, a low
residual). Both are compared with their peers (median/MAD, with a floor ``min_drop`` so a quiet
fabric does not flag 3 % dips). One matrix can be fooled by a transient dip, so a fault is called
only when ``agree`` matrices at the same GPU count (other collectives or repeats of the same runs)
show it; when isolated dips are so frequent that some link would be confirmed by chance (more than
``alpha`` expected), a link must also agree across GPU counts. A node slow only from ``k`` GPUs per
node up points at the NIC rails the smaller runs did not use.

With a model (``expected``), ``log(measured / expected)`` replaces ``log(measured)``: structure the
model knows (racks, oversubscribed uplinks) stops looking like faults, and a whole cluster below its
model shows in the node ratios.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from math import comb
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bandpilot.health.pair_status import PairProblem, SweepStatus, sweep_status
from bandpilot.health.sweeps import PairRun, Sweep

FAILED_RATIO = 0.1  # below a tenth of its peers: failed, not degraded (and a crashed run is 0)
MAD_SIGMA = 1.4826


@dataclass
class Matrix:
    """One sweep matrix and what the peer comparison found in it."""

    collective: str
    gpn: int
    repeat: int
    values: np.ndarray  # busbw, NaN where the pair was not measured
    node_ratio: np.ndarray = field(default=None)  # type: ignore[assignment]
    link_ratio: np.ndarray = field(default=None)  # type: ignore[assignment]
    node_low: np.ndarray = field(default=None)  # type: ignore[assignment]
    link_low: np.ndarray = field(default=None)  # type: ignore[assignment]

    @property
    def label(self) -> str:
        return f"{self.collective} x{self.gpn}" + (f" #{self.repeat + 1}" if self.repeat else "")


@dataclass
class NodeVerdict:
    node: str
    status: str = "healthy"  # healthy | degraded | failed
    ratio: float = 1.0  # node effect vs peers (median over the matrices that flag it, else all)
    fault: str = "none"  # none | node | rails | partial (slow at some GPU counts only)
    gpn: list[int] = field(default_factory=list)  # GPUs per node at which it is slow
    rails: list[int] = field(default_factory=list)  # NIC rails that can explain it (fault == rails)
    evidence: int = 0  # matrices that flag it
    matrices: int = 0  # matrices it is in
    failed_peers: tuple[int, int] | None = None  # (peers its pairs failed with, peers) when that makes it failed

    def to_json(self) -> dict[str, Any]:
        out = {"status": self.status, "ratio": round(self.ratio, 4), "fault": self.fault, "gpus_per_node": self.gpn,
               "rails": self.rails, "evidence": f"{self.evidence}/{self.matrices}"}
        if self.failed_peers is not None:
            out["failed_peers"] = f"{self.failed_peers[0]}/{self.failed_peers[1]}"
        return out


@dataclass
class LinkVerdict:
    nodes: tuple[str, str]
    status: str = "healthy"
    ratio: float = 1.0  # the link vs what its two nodes predict
    gpn: list[int] = field(default_factory=list)
    evidence: int = 0
    matrices: int = 0
    problems: list[PairProblem] = field(default_factory=list)  # expected runs without a result

    @property
    def evidence_text(self) -> str:
        """``1/2`` (matrices that flag it), then the runs without a result: ``1/2; sendrecv x8: crashed``."""
        counts = Counter(p.short for p in self.problems)
        runs = [k if c == 1 else f"{k} ({c} runs)" for k, c in counts.items()]
        return "; ".join([f"{self.evidence}/{self.matrices}", *runs])

    def to_json(self) -> dict[str, Any]:
        out = {"nodes": list(self.nodes), "status": self.status,
               "ratio": round(self.ratio, 4) if np.isfinite(self.ratio) else None, "evidence": self.evidence_text}
        if self.problems:
            out["problems"] = [p.to_json() for p in self.problems]
        return out


# ----------------------------------------------------------------------------------------------
# one matrix


def _polish(logv: np.ndarray, iters: int = 6) -> tuple[float, np.ndarray, np.ndarray]:
    """Median polish of a symmetric matrix with NaN holes: ``(mu, node effects, residuals)``."""
    n = logv.shape[0]
    if not np.isfinite(logv).any():
        return 0.0, np.zeros(n), np.full_like(logv, np.nan)
    mu = float(np.nanmedian(logv))
    a = np.zeros(n)
    for _ in range(iters):
        res = logv - mu - a[:, None] - a[None, :]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a node without any measured pair
            step = np.nan_to_num(np.nanmedian(res, axis=1))
        a += step
        c = float(np.median(a))
        a -= c
        mu += 2 * c
    res = logv - mu - a[:, None] - a[None, :]
    return mu, a, res


def _threshold(x: np.ndarray, z: float, min_drop: float) -> float:
    """How far below its peers a value must be: ``z`` robust sigmas, at least ``min_drop``."""
    x = x[np.isfinite(x)]
    mad = MAD_SIGMA * float(np.median(np.abs(x - np.median(x)))) if x.size else 0.0
    return max(z * mad, -np.log1p(-min_drop))


def analyze_matrix(m: Matrix, *, z: float = 5.0, min_drop: float = 0.15, expected: np.ndarray | None = None) -> Matrix:
    """Fill ``m``'s node/link ratios and low flags (a crashed run, busbw 0, counts as very low)."""
    v = m.values.astype(float)
    measured = np.isfinite(v)
    typical = float(np.nanmedian(np.where(v > 0, v, np.nan))) if (v > 0).any() else 1.0
    floor = typical * FAILED_RATIO * 1e-2
    logv = np.where(measured, np.log(np.maximum(np.nan_to_num(v), floor)), np.nan)
    if expected is not None:
        logv = logv - np.log(np.maximum(expected, 1e-12))
    mu, a, res = _polish(logv)
    has = measured.any(axis=1)
    suspect = measured & (res < -_threshold(res[np.triu(measured, 1)], z, min_drop))
    if suspect.any():  # polish again without the suspect cells: a slow link must not bias its nodes
        mu, a, _ = _polish(np.where(suspect, np.nan, logv))
        res = logv - mu - a[:, None] - a[None, :]
    m.node_ratio = np.where(has, np.exp(a), np.nan)
    m.link_ratio = np.where(measured, np.exp(res), np.nan)
    node_t = _threshold(a[has], z, min_drop)
    link_t = _threshold(res[np.triu(measured, 1)], z, min_drop)
    m.node_low = has & (a < -node_t)
    m.link_low = measured & (res < -link_t)
    return m


def matrices(runs: list[PairRun], nodes: list[str]) -> list[Matrix]:
    """One matrix per (collective, GPUs per node, repeat); a pair measured twice in one keeps the lower.
    Runs without a result (``failure``) stay out: they are counted, not compared."""
    at = {n: i for i, n in enumerate(nodes)}
    out: dict[tuple[str, int, int], Matrix] = {}
    for r in runs:
        if not r.ok:
            continue
        key = (r.collective, r.gpn, r.repeat)
        if key not in out:
            out[key] = Matrix(r.collective, r.gpn, r.repeat, np.full((len(nodes), len(nodes)), np.nan))
        i, j = at[r.nodes[0]], at[r.nodes[1]]
        old = out[key].values[i, j]
        out[key].values[i, j] = out[key].values[j, i] = r.busbw if np.isnan(old) else min(old, r.busbw)
    return [out[k] for k in sorted(out)]


# ----------------------------------------------------------------------------------------------
# verdicts across matrices


def _status(ratio: float) -> str:
    return "failed" if ratio < FAILED_RATIO else "degraded"


def _rail_fault(slow: list[int], seen: list[int]) -> tuple[str, list[int]]:
    """Runs at ``k`` GPUs per node use GPUs (and NIC rails) ``0..k-1``: a node slow from ``k0`` up
    but fine below has a slow rail among those the smaller runs did not use."""
    if slow == seen:
        return "node", []
    k0 = min(slow)
    if slow != [g for g in seen if g >= k0]:
        return "partial", []
    below = max(g for g in seen if g < k0)
    return "rails", list(range(below, k0))


def _confirmed(flagged: list[Matrix], need: int, per_gpn: bool) -> list[int]:
    """GPU counts at which a fault is confirmed: ``need`` flagged matrices at the same count (other
    collectives or repeats of the same runs) or, when each count was measured once, across counts."""
    by = {}
    for m in flagged:
        by[m.gpn] = by.get(m.gpn, 0) + 1
    if per_gpn:
        return sorted(g for g, c in by.items() if c >= need)
    return sorted(by) if len(flagged) >= need else []


def _node_verdicts(ms: list[Matrix], nodes: list[str], need: int, per_gpn: bool) -> dict[str, NodeVerdict]:
    out = {}
    for i, name in enumerate(nodes):
        inside = [m for m in ms if np.isfinite(m.node_ratio[i])]
        flagged = [m for m in inside if m.node_low[i]]
        v = NodeVerdict(name, evidence=len(flagged), matrices=len(inside))
        v.gpn = _confirmed(flagged, need, per_gpn)
        sure = [m for m in flagged if m.gpn in v.gpn]
        v.ratio = float(np.median([m.node_ratio[i] for m in (sure or inside)])) if inside else 1.0
        if v.gpn:
            v.status = _status(v.ratio)
            v.fault, v.rails = _rail_fault(v.gpn, sorted({m.gpn for m in inside}))
        out[name] = v
    return out


def _chance(ms: list[Matrix], links: list[LinkVerdict], need: int) -> tuple[float, float]:
    """(rate of isolated link flags, expected links confirmed by chance): flags outside confirmed
    links are dips; ``need`` of them on one link at one GPU count is a false confirmation."""
    confirmed = {lk.nodes for lk in links if lk.gpn}
    cells = flags = 0
    for m in ms:
        tri = np.triu(np.isfinite(m.link_ratio), 1)
        cells += int(tri.sum())
        flags += int((m.link_low & tri).sum())
    flags -= sum(lk.evidence for lk in links if lk.nodes in confirmed)
    q = max(flags, 0) / cells if cells else 0.0
    per = Counter(m.gpn for m in ms)
    return q, len(links) * sum(comb(c, need) for c in per.values()) * q**need


def _link_verdicts(ms: list[Matrix], nodes: list[str], need: int, per_gpn: bool, counts: int = 1) -> list[LinkVerdict]:
    """``counts``: GPU counts a link must be confirmed at (when it was measured at that many)."""
    out = []
    n = len(nodes)
    for i in range(n):
        for j in range(i + 1, n):
            inside = [m for m in ms if np.isfinite(m.link_ratio[i, j])]
            if not inside:
                continue
            flagged = [m for m in inside if m.link_low[i, j]]
            v = LinkVerdict((nodes[i], nodes[j]), evidence=len(flagged), matrices=len(inside))
            v.gpn = _confirmed(flagged, need, per_gpn)
            if len(v.gpn) < min(counts, len({m.gpn for m in inside})):
                v.gpn = []
            sure = [m for m in flagged if m.gpn in v.gpn]
            v.ratio = float(np.median([m.link_ratio[i, j] for m in (sure or inside)]))
            if v.gpn:
                v.status = _status(v.ratio)
            out.append(v)
    return out


def _merge(nodes: dict[str, NodeVerdict], links: list[LinkVerdict], st: SweepStatus) -> list[LinkVerdict]:
    """Every expected pair once, in node order: a pair with a failed run is ``failed``, one with a
    missing run ``missing`` unless the peer comparison found it slow; a node its failures
    concentrate on is ``failed``."""
    by = {lk.nodes: lk for lk in links}
    out = []
    for pair, ps in st.pairs.items():
        lk = by.pop(pair, None) or LinkVerdict(pair, ratio=float("nan"))
        lk.problems = ps.problems
        if ps.state == "failed":
            lk.status = "failed"
        elif ps.state == "missing" and lk.status == "healthy":
            lk.status = "missing"
        out.append(lk)
    out += by.values()
    for name, (k, m, fault) in st.node_failures.items():
        v = nodes.setdefault(name, NodeVerdict(name))
        v.status, v.fault, v.failed_peers = "failed", fault, (k, m)
    return out


@dataclass
class PairwiseReport:
    source: str
    nodes: dict[str, NodeVerdict]
    links: list[LinkVerdict]
    matrices: list[Matrix]
    sweep: Sweep
    need: int
    per_gpn: bool  # agreement at the same GPU count (several collectives or repeats) or across counts
    notes: list[str] = field(default_factory=list)
    status: SweepStatus | None = None  # expected pairs and the runs without a result

    @property
    def healthy(self) -> bool:
        return all(v.status == "healthy" for v in self.nodes.values()) and all(
            lk.status == "healthy" for lk in self.links)

    @property
    def exit_code(self) -> int:
        from bandpilot.health.verify import EXIT_UNHEALTHY

        return 0 if self.healthy else EXIT_UNHEALTHY

    def counts(self) -> dict[str, int]:
        """Pairs: expected = measured + failed + missing (by what their logs hold)."""
        if self.status is None:
            return {"expected": len(self.links), "measured": len(self.links), "failed": 0, "missing": 0}
        return self.status.counts()

    def to_json(self) -> dict[str, Any]:
        return {"pairs": self.counts(), "nodes": {n: v.to_json() for n, v in self.nodes.items()},
                "links": [lk.to_json() for lk in self.links]}

    def host_verdicts(self) -> dict[str, dict[str, Any]]:
        """What ``--gate`` records per host: a slow node drains the host, a slow rail the GPUs that
        drive it; a slow link is recorded on both hosts (``A<->B``) but drains nothing - it is not
        a part of either host, and jobs inside one host never use it."""
        out = {}
        for name, v in self.nodes.items():
            links = [f"{name}:nic-rail{r}" for r in v.rails]
            links += [f"{lk.nodes[0]}<->{lk.nodes[1]}" for lk in self.links if lk.status != "healthy" and name in lk.nodes]
            out[name] = {"status": v.status, "gpus": [], "links": links, "ratio": v.ratio}
        return out

    def markdown(self) -> str:
        from bandpilot.health.pairwise_report import markdown

        return markdown(self)

    def write(self, out: str | Path) -> Path:
        from bandpilot.health.pairwise_report import write

        return write(self, out)


def analyze(sweep: Sweep, *, source: str = "", agree: int = 2, z: float = 5.0, min_drop: float = 0.15,
            alpha: float = 0.01, expect: Callable[[Matrix, list[str]], np.ndarray | None] | None = None,
            nodes: list[str] | None = None) -> PairwiseReport:
    """Verdicts for every node and every expected pair of a sweep. ``expect(matrix, nodes)``: a
    model's busbw per pair (or None for matrices it cannot predict). ``alpha``: the expected number
    of links that transient dips may confirm by chance before a link must also agree across GPU
    counts. ``nodes``: every node the sweep was meant to cover (default: the nodes in its logs)."""
    st = sweep_status(sweep, nodes)
    nodes = st.nodes
    ms = matrices(sweep.runs, nodes)
    notes = list(st.notes)
    per_gpn = max(Counter(m.gpn for m in ms).values(), default=0) >= agree
    need = agree if len(ms) >= agree else max(len(ms), 1)
    if not ms:
        notes.append("no run gave a result: nothing to compare with its peers")
    elif need < agree:
        notes.append(f"only {len(ms)} sweep matrix: faults are called without agreement across collectives or repeats")
    elif not per_gpn:
        notes.append("one collective, no repeats: faults need agreement across GPU counts instead")
    if len(nodes) < 4:
        notes.append(f"{len(nodes)} nodes: with fewer than 4, a slow link and a slow node look alike")
    for m in ms:
        analyze_matrix(m, z=z, min_drop=min_drop, expected=expect(m, nodes) if expect is not None else None)
    links = _link_verdicts(ms, nodes, need, per_gpn)
    if per_gpn:
        q, chance = _chance(ms, links, need)
        if chance > alpha:  # dips are common enough to coincide: a link must also agree across GPU counts
            links = _link_verdicts(ms, nodes, need, per_gpn, counts=2)
            notes.append(f"isolated link dips in {100 * q:.2f} % of the measured pairs (~{chance:.2f} links would be "
                         "confirmed by chance): a link fault needs agreement at two GPU counts")
    verdicts = _node_verdicts(ms, nodes, need, per_gpn)
    links = _merge(verdicts, links, st)
    return PairwiseReport(source, verdicts, links, ms, sweep, need, per_gpn, notes, st)


def report_json(rep: PairwiseReport) -> str:
    return json.dumps(rep.to_json(), indent=1)
