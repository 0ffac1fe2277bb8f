"""Which pairs did a sweep test, and which gave no result? Expected pairs, failed and missing runs,
and the nodes that failures concentrate on.

A crashed or missing pair is the strongest signal a sweep gives, and the peer comparison cannot see
it (there is no bandwidth to compare), so it is counted here. The sweep implies its own plan: every
pair of its nodes (or of ``nodes``, the operator's list) at every GPUs-per-node count it ran, in every
collective it ran at that count. A node seen only up to ``k`` GPUs per node is taken to have ``k``
GPUs (a note names it): its pairs are not expected at larger counts.

A pair is ``failed`` when one of its runs failed (a test/NCCL failure, a run cut short, wrong data,
an empty log), ``missing`` when some expected run left no result (no log, or a log that stopped at
other sizes), ``measured`` when every expected run has a result. A node is ``failed`` when such pairs
concentrate on it: with 2 peers or more, and with at least half of its peers or, from 3 peers on,
more than chance allows at the rate the pairs without it fail (binomial tail below ``alpha``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from math import exp, lgamma, log, log1p
from typing import Any, Sequence

from bandpilot.health.sweeps import ABSENT, LAUNCHER, PairRun, Sweep, natural


@dataclass(frozen=True)
class PairProblem:
    """One expected run of a pair without a result."""

    collective: str  # "" when a failed log does not say which collective it ran
    gpn: int
    status: str  # failed | missing
    kind: str  # crashed | truncated | wrong data | unreadable | no output | empty log | other sizes | no log
    detail: str = ""
    source: str = ""

    @property
    def short(self) -> str:
        """``sendrecv x8: crashed``."""
        return f"{self.collective.removesuffix('_perf') or 'run'} x{self.gpn}: {self.kind}"

    def to_json(self) -> dict[str, Any]:
        return {"collective": self.collective or None, "gpus_per_node": self.gpn, "status": self.status,
                "what": self.kind, "detail": self.detail, "log": self.source or None}


@dataclass
class PairState:
    nodes: tuple[str, str]
    expected: int  # runs the sweep implies: collectives x GPUs-per-node counts
    measured: int  # of those, runs with a result
    problems: list[PairProblem] = field(default_factory=list)

    @property
    def state(self) -> str:
        """failed | missing | measured."""
        if any(p.status == "failed" for p in self.problems):
            return "failed"
        return "missing" if self.problems else "measured"


@dataclass
class SweepStatus:
    nodes: list[str]  # natural order: the sweep's nodes and the listed ones
    gpn: list[int]
    collectives: dict[int, list[str]]  # per GPUs-per-node count
    pairs: dict[tuple[str, str], PairState]
    node_failures: dict[str, tuple[int, int, str]]  # node -> (bad peers, peers, crashed | missing | no runs)
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """expected = measured + failed + missing (pairs)."""
        states = [p.state for p in self.pairs.values()]
        return {"expected": len(states), "measured": states.count("measured"), "failed": states.count("failed"),
                "missing": states.count("missing")}


def _tail(k: int, m: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(m, p)."""
    p = min(max(p, 1e-12), 1 - 1e-12)
    return sum(exp(lgamma(m + 1) - lgamma(i + 1) - lgamma(m - i + 1) + i * log(p) + (m - i) * log1p(-p))
               for i in range(k, m + 1))


def _problems(pair: tuple[str, str], expected: list[tuple[str, int]], fails: list[PairRun],
              measured: set[tuple[tuple[str, str], str, int]], colls: dict[int, list[str]]) -> PairState:
    problems, covered = [], set()
    launcher = {f.gpn: f for f in fails if f.failure == LAUNCHER}
    for f in fails:
        if f.failure == LAUNCHER:
            continue
        problems.append(PairProblem(f.collective, f.gpn, "missing" if f.failure in ABSENT else "failed", f.failure,
                                    f.detail, f.source))
        covered |= {(c, f.gpn) for c in colls.get(f.gpn, [])} if not f.collective else {(f.collective, f.gpn)}
    got = [(c, g) for c, g in expected if (pair, c, g) in measured]
    for c, g in expected:
        if (c, g) not in got and (c, g) not in covered:
            f = launcher.get(g)
            problems.append(PairProblem(c, g, "failed", "no output", f.detail, f.source) if f is not None
                            else PairProblem(c, g, "missing", "no log"))
    problems.sort(key=lambda p: (p.gpn, p.collective, p.status))
    return PairState(pair, len(expected), len(got), problems)


def _node_failures(names: list[str], pairs: dict[tuple[str, str], PairState], seen: set[str],
                   alpha: float) -> dict[str, tuple[int, int, str]]:
    bad = {p for p, st in pairs.items() if st.state != "measured"}
    out = {}
    for n in names:
        mine = [p for p in pairs if n in p]
        m, k = len(mine), sum(p in bad for p in mine)
        if n not in seen:
            out[n] = (k, m, "no runs")
            continue
        if k < 2:
            continue
        rest = len(pairs) - m
        rate = (len(bad) - k + 0.5) / (rest + 1)  # pairs without this node; never 0
        if 2 * k >= m or (k >= 3 and _tail(k, m, rate) < alpha):
            out[n] = (k, m, "crashed" if any(pairs[p].state == "failed" for p in mine) else "missing")
    return out


def sweep_status(sweep: Sweep, nodes: Sequence[str] | None = None, alpha: float = 1e-3) -> SweepStatus:
    """Expected pairs and what each holds; ``nodes``: every node the sweep was meant to cover."""
    every = [*sweep.runs, *sweep.failures]
    listed = list(dict.fromkeys(nodes or []))
    seen = set(sweep.nodes)
    names = sorted(seen | set(listed), key=natural)
    gpns = sorted({r.gpn for r in every})
    colls = {g: sorted({r.collective for r in every if r.gpn == g and r.collective}) or [""] for g in gpns}
    cap: dict[str, int] = {}
    for r in every:
        for n in r.nodes:
            cap[n] = max(cap.get(n, 0), r.gpn)
    top = max(gpns, default=0)
    notes = []
    short = [n for n in names if n in cap and cap[n] < top]
    if short:
        notes.append(f"{len(short)} node(s) never ran at {top} GPUs per node ({', '.join(short[:6])}"
                     f"{' ...' if len(short) > 6 else ''}): taken to have fewer GPUs, their larger runs are not expected")
    extra = [n for n in names if listed and n not in listed]
    if extra:
        notes.append(f"in the logs but not in the node list: {', '.join(extra[:6])}{' ...' if len(extra) > 6 else ''}")
    order = {n: i for i, n in enumerate(names)}
    key = {nodes: (nodes if order[nodes[0]] < order[nodes[1]] else (nodes[1], nodes[0]))
           for nodes in {r.nodes for r in every}}  # natural order, as the report lists pairs
    measured = {(key[r.nodes], r.collective, r.gpn) for r in sweep.runs}
    fails: dict[tuple[str, str], list[PairRun]] = defaultdict(list)
    for f in sweep.failures:
        fails[key[f.nodes]].append(f)
    pairs = {}
    for pair in combinations(names, 2):
        k = min(cap.get(pair[0], top), cap.get(pair[1], top))
        expected = [(c, g) for g in gpns if g <= k for c in colls[g]]
        if expected or fails.get(pair):
            pairs[pair] = _problems(pair, expected, fails.get(pair, []), measured, colls)
    return SweepStatus(names, gpns, colls, pairs, _node_failures(names, pairs, seen, alpha), notes)
