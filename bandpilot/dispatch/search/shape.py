"""Shape-aware placement: put each parallelism axis on the fabric tier it needs, score by step time.

A placement is a rank -> GPU map in Megatron order (``rank = t + tp * (d + dp * p)``). Its groups:

* **TP**: the ``tp`` ranks of one (stage, replica); **EP**: ``ep`` consecutive ranks of one stage;
* **DP**: the ``dp`` ranks of one (stage, TP rank);
* **PP**: the two TP groups on either side of a stage boundary of one replica (their ``tp``
  point-to-point sends run side by side, so the pair's bandwidth is the boundary's).

Predicted step time = compute + sum over axes of ``bytes / bandwidth`` of the axis, where the axis's
bandwidth is that of its slowest group: all groups of one axis run at once, so each group is priced
by the contention rule of :mod:`bandpilot.dispatch.contention` with the cluster's tenants AND its own
sibling groups as co-tenants. Sibling capacity is the super allocation of the group with every
spanning sibling's GPUs on the group's hosts (one row per group instead of one per pair); sibling
demand is their standalone bandwidth. Single-host groups are never contended (as in the predictor)
and read the stage-1 table without a model call. Every row of every candidate goes into ONE model
call (de-duplicated).

Search: a TP group fits a *unit* (the host, or the NVLink domain on rack-scale clusters) when the
unit has ``tp`` free GPUs. Candidate GPU sets are built from several unit orders (fullest first,
best fit, least exposed to cross-host tenants, rack-compact, the segment baseline's block cut, and
the sets the compact baseline and, optionally, the bandwidth-only search chose; on busy clusters the
exposure-aware orders of :mod:`bandpilot.dispatch.search.shape_exposure` and whole stages per rack,
also with consecutive stages in different racks); each set is cut into TP groups unit by unit (leftovers form spanning
groups only when the aligned room runs out), and the groups are laid out two ways: DP-inner (a
unit's groups are DP replicas of one stage, PP crosses units) and PP-inner (a unit's groups are
consecutive stages, DP crosses). Units are visited in locality order, so PP stages land on
neighbouring hosts / domains. When a candidate's rows exceed :data:`ROW_BUDGET`, candidates are first
screened on a sample of each axis's spanning groups and only the best :data:`FINALISTS` are scored
in full (near-exact with a budget); otherwise every candidate is scored exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape_exposure import (balance_stages, counts_least_demand, host_tenants, paired,
                                                      unit_tenants)
from bandpilot.dispatch.search.shape_units import count_vectors, counts_greedy
from bandpilot.dispatch.shape import Shape
from bandpilot.topology.cluster import ClusterSpec, popcount

#: Rows (model evaluations) above which candidates are screened on sampled groups first.
ROW_BUDGET = 1500
#: Spanning groups sampled per axis in the screening pass.
SAMPLE = 16
#: Candidates scored in full after screening.
FINALISTS = 2
#: Spanning TP groups of the clean orders from the units with the least tenant demand first (else:
#: clean units first, then any exposed one; the pairing of halves: fullest pools first).
LEAST_COST = True


@dataclass
class Placement:
    """Ranks (GPU per rank, Megatron order) and the predicted per-axis figures."""

    hosts: np.ndarray  # (k,) host index per rank
    idx: np.ndarray  # (k,) GPU index inside the host per rank
    axis_gbps: dict[str, float] = field(default_factory=dict)
    comm_ms: dict[str, float] = field(default_factory=dict)
    compute_ms: float = 0.0
    step_ms: float = 0.0
    label: str = ""
    #: Set by a full :func:`score`: ``(pred, shape, figures)``, ``figures()`` the per-group figures of
    #: every axis (``shape_delta.MoveScorer``'s base, so a refinement round does not score it again).
    groups: tuple[Any, Shape, Callable[[], dict[str, dict[str, np.ndarray]]]] | None = field(
        default=None, repr=False, compare=False)

    def mask(self, n_hosts: int) -> np.ndarray:
        out = np.zeros(n_hosts, dtype=np.int64)
        np.bitwise_or.at(out, self.hosts, np.int64(1) << self.idx)
        return out

    def gpus(self, spec: ClusterSpec) -> list[str]:
        return [f"{spec.hosts[h].name}:{i}" for h, i in zip(self.hosts.tolist(), self.idx.tolist())]


# ---- groups ----------------------------------------------------------------------------------
def group_ranks(shape: Shape) -> dict[str, np.ndarray]:
    """Rank indices of every group of every active axis: ``axis -> (n_groups, size)``."""
    r = np.arange(shape.k).reshape(shape.pp, shape.dp, shape.tp)
    out: dict[str, np.ndarray] = {}
    if shape.tp > 1:
        out["tp"] = r.reshape(-1, shape.tp)
    if shape.dp > 1:
        out["dp"] = r.transpose(0, 2, 1).reshape(-1, shape.dp)
    if shape.pp > 1:
        out["pp"] = np.concatenate([r[:-1], r[1:]], axis=2).transpose(1, 0, 2).reshape(-1, 2 * shape.tp)
    if shape.ep > 1:
        out["ep"] = r.reshape(shape.pp, -1).reshape(-1, shape.ep)
    return out


def group_masks(hosts: np.ndarray, idx: np.ndarray, ranks: np.ndarray, n_hosts: int) -> np.ndarray:
    """Per-host masks of every group of every candidate: ``hosts``/``idx`` ``(C, k)``, ``ranks``
    ``(n, s)`` -> ``(C, n, n_hosts)``. A rank's bit is unique within its group, so the masks are sums
    (one bincount instead of an unbuffered bitwise_or.at)."""
    C, (n, s) = hosts.shape[0], ranks.shape
    if idx.size and int(idx.max()) >= 52:  # beyond float64's exact integers: or the bits one by one
        out = np.zeros((C * n, n_hosts), dtype=np.int64)
        r = np.repeat(np.arange(C * n), s)
        np.bitwise_or.at(out, (r, hosts[:, ranks].ravel()), np.int64(1) << idx[:, ranks].ravel())
        return out.reshape(C, n, n_hosts)
    cell = (np.arange(C * n).reshape(C, n, 1) * n_hosts + hosts[:, ranks]).ravel()
    out = np.bincount(cell, weights=np.ldexp(1.0, idx[:, ranks].ravel()), minlength=C * n * n_hosts)
    return out.astype(np.int64).reshape(C, n, n_hosts)


# ---- scoring ---------------------------------------------------------------------------------
class BatchRows:
    """Rows for one batched model call; hands back a slice handle per request."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.n = 0

    def add(self, rows: np.ndarray) -> slice:
        s = slice(self.n, self.n + rows.shape[0])
        if rows.shape[0]:
            self.parts.append(rows)
            self.n += rows.shape[0]
        return s

    def run(self, pred: ContentionPredictor) -> np.ndarray:
        if not self.parts:
            return np.zeros(0)
        return pred.raw(np.concatenate(self.parts))


def _sampled(spans: np.ndarray, single: np.ndarray, sample: int | None) -> np.ndarray:
    """Groups scored per candidate ``(C, n)``: all, or (screening) at most ``sample`` spanning and
    ``sample`` in-domain multi-tray groups, each spread evenly over the candidate's groups of that
    kind, and one single-host group (identical hosts: one speaks for all)."""
    if sample is None:
        return np.ones(spans.shape, dtype=bool)
    sel = np.zeros(spans.shape, dtype=bool)
    j = np.arange(sample)
    for kind in (spans, ~spans & ~single, single):
        rank = np.cumsum(kind, axis=1) - 1  # a group's index among the candidate's groups of its kind
        cnt = kind.sum(axis=1)[:, None]
        take = min(sample, 1) if kind is single else sample
        # rank == floor(j * (cnt - 1) / (take - 1)) for some j < take: np.linspace's spread
        pos = (j[None, :take] * (cnt - 1)) // max(take - 1, 1)
        hit = (rank[:, :, None] == pos[:, None, :]).any(axis=2) | (cnt <= take)
        sel |= kind & hit
    return sel


def _plan_axis(pred: ContentionPredictor, M3: np.ndarray, rows: BatchRows, sample: int | None) -> dict[str, Any]:
    """Rows one axis's groups need, for all candidates at once (``M3``: ``(C, n, hosts)``)."""
    C, n, H = M3.shape
    used3 = M3 != 0
    single3 = used3.sum(axis=2) == 1
    spans3 = pred._spans(M3.reshape(C * n, H)).reshape(C, n)
    sel3 = _sampled(spans3, single3, sample)
    ci, gi = np.nonzero(sel3)
    M, used, single = M3[ci, gi], used3[ci, gi], single3[ci, gi]
    plan: dict[str, Any] = {"C": C, "M3": M3, "ci": ci, "gi": gi, "single": single, "spans": spans3[ci, gi],
                            "spans3": spans3, "miss3": spans3 & ~sel3}
    h = np.argmax(used, axis=1)
    plan["stage1"] = pred.model.stage1[h[single], M[single, h[single]]]
    plan["solo"] = rows.add(M[~single])
    cont = pred.contenders(M)
    ri, ji = np.nonzero(cont)
    plan["cont"], plan["ri"] = cont, ri
    plan["tenant"] = rows.add(M[ri] | pred.job_masks[ji])
    # siblings: the candidate's other spanning groups that share a host with this one (the job's
    # hosts only: the incidence product stays small)
    inc = used3[:, :, M3.any(axis=(0, 1))].astype(np.float32)
    share3 = (inc @ inc.transpose(0, 2, 1) > 0.5) & spans3[:, :, None] & spans3[:, None, :]
    share3[:, np.arange(n), np.arange(n)] = False
    share = share3[ci, gi]
    has = share.any(axis=1)
    union = np.bitwise_or.reduce(np.where(spans3[:, :, None], M3, 0), axis=1)  # (C, hosts)
    plan["share"], plan["has"] = share, has
    plan["sib"] = rows.add(np.where(used[has], union[ci[has]], 0) | M[has])
    return plan


def _axis_values(pred: ContentionPredictor, plan: dict[str, Any], vals: np.ndarray) -> np.ndarray:
    """Each candidate's axis bandwidth: its slowest scored group under the contention rule."""
    C, ci, gi, single, spans = plan["C"], plan["ci"], plan["gi"], plan["single"], plan["spans"]
    solo = np.zeros(ci.size)
    solo[single] = plan["stage1"]
    solo[~single] = vals[plan["solo"]]
    cap = np.full(ci.size, np.inf)
    if plan["ri"].size:
        np.minimum.at(cap, plan["ri"], vals[plan["tenant"]])
    has = plan["has"]
    plan["tcap"] = cap.copy()  # (the per-group figures a full score keeps: see :func:`_figures`)
    cap[has] = np.minimum(cap[has], vals[plan["sib"]])
    # siblings' demand: their standalone bandwidth; a screened candidate's unscored spanning groups
    # take the mean of its scored ones
    sib = np.zeros(plan["spans3"].shape)
    sib[ci[spans], gi[spans]] = solo[spans]
    n_sp = np.bincount(ci[spans], minlength=C)
    mean = np.bincount(ci[spans], weights=solo[spans], minlength=C) / np.maximum(n_sp, 1)
    miss = plan["miss3"]
    sib[miss] = np.broadcast_to(mean[:, None], miss.shape)[miss]
    plan["tdem"] = plan["cont"].astype(float) @ pred.job_demand
    demand = solo + plan["tdem"] + (plan["share"] * sib[ci]).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        shared = np.where(demand > 0, solo / demand * cap, 0.0)
    value = np.where(demand <= cap, solo, shared)
    plan["solo_v"], plan["value"] = solo, value
    out = np.full(C, np.inf)
    np.minimum.at(out, ci, value)
    return out


def score(pred: ContentionPredictor, shape: Shape, cands: list[Placement], sample: int | None = None) -> None:
    """Fill each candidate's per-axis GB/s, comm time and step time (one model call for all;
    every axis's groups of every candidate are planned as one batch)."""
    if not cands:
        return
    vol, compute = shape.volumes()
    granks = {a: g for a, g in group_ranks(shape).items() if a in vol}
    hosts, idx = np.stack([c.hosts for c in cands]), np.stack([c.idx for c in cands])
    rows = BatchRows()
    plans = {a: _plan_axis(pred, group_masks(hosts, idx, g, pred.spec.n_hosts), rows, sample) for a, g in granks.items()}
    vals = rows.run(pred)
    bw = {a: _axis_values(pred, p, vals) for a, p in plans.items()}
    for i, c in enumerate(cands):
        c.compute_ms = compute
        c.axis_gbps = {a: float(bw[a][i]) for a in plans}
        c.comm_ms = {a: vol[a] / (v * 1e9) * 1e3 if v > 0 else float("inf") for a, v in c.axis_gbps.items()}
        c.step_ms = compute + sum(c.comm_ms.values())
        # every group scored: its figures can be a refinement round's base (not a screening's)
        c.groups = None if sample is not None else (
            pred, shape, lambda i=i: {a: _figures(p, vals, i) for a, p in plans.items()})


def _figures(plan: dict[str, Any], vals: np.ndarray, i: int) -> dict[str, np.ndarray]:
    """Candidate ``i``'s per-group figures of one fully scored axis, as ``shape_delta.MoveScorer``
    keeps its base's (every group is scored, so candidate ``i``'s entries are its groups in order)."""
    at = plan["ci"] == i
    M, spans = plan["M3"][i], plan["spans3"][i]
    has = plan["has"][at]
    union = np.bitwise_or.reduce(np.where(spans[:, None], M, 0), axis=0)
    sibval = np.full(has.size, np.inf)
    sibval[has] = vals[plan["sib"]][at[plan["has"]]]  # (sibling rows: the has-groups', in order)
    return {"M": M, "spans": spans.copy(), "value": plan["value"][at], "solo": plan["solo_v"][at],
            "tcap": plan["tcap"][at], "tdem": plan["tdem"][at], "has": has,
            "sibrow": np.where(M != 0, union, 0) | M, "sibval": sibval}


# ---- candidates ------------------------------------------------------------------------------
def unit_gpus(spec: ClusterSpec, free: np.ndarray, members: np.ndarray,
               exposed: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Free GPUs of a unit: fullest hosts first (TP groups stay inside a tray when they can);
    with ``exposed``, hosts no cross-host tenant touches before the others."""
    f = popcount(free[members])
    keys = (members, -f) if exposed is None else (members, -f, exposed[members])
    order = members[np.lexsort(keys)]
    i = np.arange(int(spec.gpus_per_host[order].max()) if order.size else 0)
    r, c = np.nonzero((free[order, None] >> i) & 1)  # row-major: hosts in order, GPUs by index
    return list(zip(order[r].tolist(), c.tolist()))


def _take(spec: ClusterSpec, free: np.ndarray, units: list[np.ndarray], order: np.ndarray, shape: Shape,
          n_groups: np.ndarray, exposed: np.ndarray | None = None,
          rack: np.ndarray | None = None, cost: np.ndarray | None = None) -> list[list[tuple[int, int]]]:
    """TP groups: ``n_groups[u]`` aligned groups per unit in ``order``, then spanning groups from
    the leftover GPUs (locality order) until there are ``pp * dp``; with ``rack`` (rack per unit),
    spanning groups are first two halves on two units of one rack (a 4+4 TP group in a rack runs at
    3.5x a 7+1 one on the H100 fabric), see :func:`shape_exposure.paired`."""
    tp, G = shape.tp, shape.pp * shape.dp
    groups: list[list[tuple[int, int]]] = []
    left: dict[int, list[tuple[int, int]]] = {}
    need = G - int(n_groups.sum())  # spanning groups: only then do the leftovers matter
    enough = need * tp * (1 if rack is None else 2)  # pairing halves wants more units to choose from
    n_left = 0
    for u in order:
        n = int(n_groups[u])
        if n == 0 and (need <= 0 or n_left >= enough):
            continue
        g = host_aligned(unit_gpus(spec, free, units[u], exposed), tp)
        groups += [g[j * tp:(j + 1) * tp] for j in range(n)]
        left[int(u)] = g[n * tp:]
        n_left += len(g) - n * tp
    if len(groups) < G and rack is not None:
        groups += paired(left, rack, G - len(groups), tp, cost)
    if len(groups) < G:
        rest = [x for u in left for x in left[u]]
        extra = [rest[j * tp:(j + 1) * tp] for j in range((G - len(groups)))]
        groups += [e for e in extra if len(e) == tp]
    return groups[:G] if len(groups) >= G else []


def host_aligned(gpus: list[tuple[int, int]], tp: int) -> list[tuple[int, int]]:
    """The unit's GPUs reordered so that consecutive ``tp``-slices stay inside one host (tray) where
    a host has room: each host's whole TP groups first (hosts in the given order), then the
    remainders. (An NVL72 TP=4 group on one tray runs at 493 GB/s, over two trays at 413.)"""
    whole: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    i = 0
    while i < len(gpus):
        j = i
        while j < len(gpus) and gpus[j][0] == gpus[i][0]:
            j += 1
        cut = i + (j - i) // tp * tp
        whole += gpus[i:cut]
        rest += gpus[cut:j]
        i = j
    return whole + rest


def _alternate(groups: list[list[tuple[int, int]]], shape: Shape, rack_of_host: np.ndarray) -> list[list[tuple[int, int]]] | None:
    """Whole stages (DP-inner: ``dp`` consecutive groups) reordered so that consecutive stages sit in
    different racks where they can (the rack with the most stages left first, never the previous
    one while another has stages left). A PP group across racks (half the bandwidth) whose
    neighbours inside a rack are its siblings pays their full in-rack demand: on the H100 fabric a
    tp=8 boundary runs at 79 / 5 GB/s between in-rack neighbours, at 79 / 3 when every boundary
    crosses. None when the stages are not each inside one rack or all in one."""
    P, D = shape.pp, shape.dp
    stages = [groups[p * D:(p + 1) * D] for p in range(P)]
    racks = [{int(rack_of_host[h]) for g in st_ for h, _ in g} for st_ in stages]
    if P < 3 or any(len(r) != 1 for r in racks) or len(set.union(*racks)) < 2:
        return None
    left: dict[int, list[int]] = {}
    for p, r in enumerate(racks):
        left.setdefault(next(iter(r)), []).append(p)
    order, prev = [], -1
    while left:
        r = max(left, key=lambda r: (r != prev, len(left[r]), -r))
        order.append(left[r].pop(0))
        prev = r
        if not left[r]:
            del left[r]
    return None if order == list(range(P)) else [g for p in order for g in stages[p]]


def _layouts(groups: list[list[tuple[int, int]]], shape: Shape, label: str) -> list[Placement]:
    """DP-inner (groups in order are replicas of a stage) and PP-inner (consecutive stages)."""
    arr = np.array(groups, dtype=np.int64).reshape(shape.pp * shape.dp, shape.tp, 2)
    out = [Placement(arr[..., 0].ravel(), arr[..., 1].ravel(), label=f"{label}/dp-inner")]
    if shape.pp > 1 and shape.dp > 1:
        g = np.arange(shape.pp * shape.dp).reshape(shape.dp, shape.pp).T.ravel()  # (p, d) -> d * pp + p
        out.append(Placement(arr[g, :, 0].ravel(), arr[g, :, 1].ravel(), label=f"{label}/pp-inner"))
    return out


def candidates(spec: ClusterSpec, free: np.ndarray, shape: Shape, pred: ContentionPredictor,
               seeds: dict[str, np.ndarray]) -> list[Placement]:
    """Candidate placements (see the module docstring); ``seeds`` are whole GPU sets to re-lay out."""
    unit, _ = spec.units
    U = int(unit.max()) + 1
    by_unit = np.argsort(unit, kind="stable")
    units = np.split(by_unit, np.flatnonzero(np.diff(unit[by_unit])) + 1)
    rack = {d: i for i, d in enumerate(dict.fromkeys(h.domain or h.name for h in spec.hosts))}
    rack_of_unit = np.array([rack[spec.hosts[int(m[0])].domain or spec.hosts[int(m[0])].name] for m in units])
    rack_of_host = rack_of_unit[unit]
    loc = np.arange(U)  # units are numbered in host order: neighbours in the spec are neighbours here
    G = shape.pp * shape.dp

    def cap_of(fr: np.ndarray) -> np.ndarray:
        return np.bincount(unit, weights=popcount(fr), minlength=U).astype(np.int64) // shape.tp

    free_u = np.bincount(unit, weights=popcount(free), minlength=U)
    clean1 = cap_of(np.where(pred.exposed, 0, free))
    counts = count_vectors(cap_of(free), clean1, unit, pred.exposed, rack_of_unit, shape, free_u)
    # (where units are hosts: on NVLink-domain clusters these orders changed no pick, 2-4 ms CPU)
    touch_h = host_tenants(pred) if pred.n_jobs and not spec.nvlink_domains else None
    least = None if touch_h is None else counts_least_demand(
        cap_of(free), np.minimum(clean1, cap_of(free)), unit_tenants(touch_h, unit, U), pred.job_demand, G)
    if least is not None:  # (clean room short of the job: which exposed units, and which stages)
        counts["clean-least-demand"] = least
    out: list[Placement] = []
    seen: set[bytes] = set()
    done: set[tuple[bytes, bool]] = set()
    exposed_u = np.bincount(unit, weights=pred.exposed.astype(np.int64), minlength=U)
    expo_u = np.bincount(unit, weights=pred.host_exposure, minlength=U)  # tenant demand per unit
    least_cost = LEAST_COST

    def emit(label: str, fr: np.ndarray, n: np.ndarray, paired: bool = False) -> None:
        clean = label.startswith("clean")
        if fr is free and (n.tobytes(), clean, paired) in done:  # several unit orders often agree
            return
        done.add((n.tobytes(), clean, paired))
        used = np.flatnonzero(n)
        rest = np.flatnonzero(n == 0)  # locality order, unused last
        if clean:  # spanning groups' leftovers from the least exposed, fullest units first
            rest = rest[np.lexsort((rest, -free_u[rest], expo_u[rest] if least_cost else exposed_u[rest]))]
        groups = _take(spec, fr, units, np.concatenate([used, rest]), shape, n, pred.exposed if clean else None,
                       rack_of_unit if paired else None, expo_u if least_cost and clean else None)
        lays = _layouts(groups, shape, label + ("+paired" if paired else "")) if groups else []
        spread = None if touch_h is None or not groups or not clean else \
            balance_stages(groups, touch_h, pred.job_demand, shape)
        if spread is not None:
            lays.append(_layouts(spread, shape, label + "+stages")[0])
        alt = _alternate(groups, shape, rack_of_host) if groups and label.startswith("rack-stages") else None
        if alt is not None:
            lays.append(_layouts(alt, shape, label + "+alternate")[0])
        for p in lays:
            key = np.stack([p.hosts, p.idx]).tobytes()
            if key not in seen:
                seen.add(key)
                out.append(p)

    for label, n in counts.items():
        emit(label, free, n)
        if n.sum() < G and shape.tp % 2 == 0:  # spanning TP groups: also as rack-local halves
            emit(label, free, n, paired=True)
    for label, m in seeds.items():
        c = cap_of(m)
        emit(label, m, np.minimum(c, counts_greedy(c, np.lexsort((loc, -c)), G)))
    return out


def shape_search(pred: ContentionPredictor, free: np.ndarray, shape: Shape,
                 seeds: dict[str, np.ndarray] | None = None, fixed: list[Placement] | None = None,
                 refine: Callable[[ContentionPredictor, Shape, Placement, np.ndarray], Placement] | None = None,
                 ) -> tuple[Placement, int]:
    """The candidate with the lowest predicted step time, and how many candidates were scored.
    ``fixed`` rank maps (e.g. a baseline's) compete as they are, so the result is never predicted
    slower than them."""
    fixed = list(fixed or [])
    # a candidate equal to a fixed rank map (the block cut's DP-inner layout often is the segment
    # baseline's GPU-id order) is scored once, as the fixed one (always scored in full)
    keys = {np.stack([f.hosts, f.idx]).tobytes() for f in fixed}
    cands = [c for c in candidates(pred.spec, free, shape, pred, seeds or {})
             if np.stack([c.hosts, c.idx]).tobytes() not in keys] + fixed
    if not cands:
        raise ValueError("no candidate placement")  # callers check k <= free first
    # TP (and EP within it) inside one unit whenever there is room: a rule, not a score trade-off
    unit = pred.spec.units[0]
    aligned = [c for c in cands if bool((unit[c.hosts].reshape(-1, shape.tp) == unit[c.hosts[::shape.tp]][:, None]).all())]
    cands = aligned or cands
    fixed = [c for c in fixed if any(c is a for a in cands)]
    rows_each = sum(g.shape[0] for g in group_ranks(shape).values()) * 2
    if rows_each * len(cands) > ROW_BUDGET and len(cands) > FINALISTS:
        score(pred, shape, cands, sample=SAMPLE)
        keep = sorted(cands, key=lambda c: c.step_ms)[:FINALISTS]
        cands = keep + [c for c in fixed if all(c is not x for x in keep)]
    score(pred, shape, cands)
    best = min(cands, key=lambda c: (c.step_ms, c.label))
    if refine is not None:
        best = refine(pred, shape, best, free)
    return best, len(cands)


def rank_order(spec: ClusterSpec, mask: np.ndarray) -> Placement:
    """A GPU set with ranks in GPU-id order (how a topology-blind launcher numbers them)."""
    hosts, idx = [], []
    for h in np.flatnonzero(mask):
        for i in range(int(spec.gpus_per_host[h])):
            if int(mask[h]) >> i & 1:
                hosts.append(int(h))
                idx.append(i)
    return Placement(np.array(hosts, dtype=np.int64), np.array(idx, dtype=np.int64))


def from_ranks(spec: ClusterSpec, ranks: list[str]) -> Placement:
    """A placement from GPU ids in rank order (to re-score a rank map on another model, e.g. the truth)."""
    at = [spec.parse_gpu(g, "ranks") for g in ranks]
    return Placement(np.array([h for h, _ in at], dtype=np.int64), np.array([i for _, i in at], dtype=np.int64))
