"""Non-local moves of a shaped placement: whole TP groups or whole hosts' ranks to other spare GPUs.

:mod:`bandpilot.dispatch.search.shape_refine`'s moves change one or two ranks at a time, so a pick
whose TP group sits on a contended host, or whose ranks on one host would run faster on an idle
host elsewhere, needs several moves in a row, each of which may be slower on its own. Two moves do
it in one step:

* **relocate**: TP group ``g`` moves to ``tp`` spare GPUs of another unit (the unit's fullest spare
  host first, so the group stays inside a host / tray when one has room);
* **evacuate**: every rank on host ``a`` moves to the spare GPUs of host ``b`` (``b`` has room for all
  of them; lowest GPU ids first). The GPU set changes host by host, the rank order is kept.

With the TP rule in force (every TP group of the start inside one unit) moves that break it are
dropped. Moves are listed as index pairs and at most ``cap`` (a seeded sample) are built.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement, host_aligned, unit_gpus, group_ranks
from bandpilot.dispatch.search.shape_delta import MoveScorer
from bandpilot.dispatch.search.shape_refine import best_move, tp_aligned
from bandpilot.dispatch.shape import Shape
from bandpilot.topology.cluster import ClusterSpec, popcount

#: Destinations per move kind (see :func:`_per_rack`).
TARGETS = 4
#: Model rows per round of :func:`refine_nonlocal` (about 2 per group per candidate), and in all.
ROUND_ROWS = 1500
ROWS = 6000
#: Rounds at most, and the fewest candidates a round scores (large jobs: more than the row share).
#: Measured (``python -m benchmarks shape``, h100-128 idle + busy, one state set, true step time below
#: blind; no pass 8.3 %): 20,000 rows, random sample 10.8 %, p50 74 ms (load 4); 6,000 rows in
#: priority order, 8 a round 10.8 %, p50 43 ms; 16 a round 11.5 %, p50 49 ms (load 5.7).
ROUNDS = 8
MIN_ROUND = 16
#: Score each round's moves by the groups they touch (:mod:`bandpilot.dispatch.search.shape_delta`,
#: the same figures as a full re-score); False re-scores every moved placement in full.
INCREMENTAL = True
#: Count :data:`ROWS` in the rows the incremental scorer sends (a move re-scores only the groups it
#: touches: 11-16 % of a full re-score's rows on a busy tp=8,pp=4,dp=8 case), not in full
#: re-scores (then the budget stopped k = 256 climbs after 3 rounds). Measured (h100-128, 2 busy + 1
#: frag states; 5 %-noise guide, true step time): the tuning case busy tp=8,pp=4,dp=8 1,651 -> 1,533 ms;
#: 4 held-out state sets every case identical, 7 more 8 cases faster (up to -2.9 %), none slower;
#: CPU per select p50 7.9 -> 8.0 ms, p99 25.7 -> 25.4 ms. False: the full re-score count (before).
COUNT_SENT = True


def _racks(spec: ClusterSpec) -> np.ndarray:
    """Rack (the host's ``domain``, else the host) per host, numbered in host order."""
    names = [h.domain or h.name for h in spec.hosts]
    ids = {d: i for i, d in enumerate(dict.fromkeys(names))}
    return np.array([ids[d] for d in names], dtype=np.int64)


def _per_rack(cands: np.ndarray, rack_of: np.ndarray, on_rack: np.ndarray, targets: int | None) -> np.ndarray:
    """With ``targets``: at most ``targets`` destinations, alternately the next best overall (the
    given order) and the best of the next rack (racks holding more of the job's ranks first). The
    free hosts of one rack often look alike (all clean, all empty) while racks differ (a DP group
    inside one rack or over two), so the list reaches other racks early."""
    if targets is None or not cands.size:
        return cands
    _, first = np.unique(rack_of, return_index=True)
    first = np.sort(first)
    by_rack = first[np.argsort(-on_rack[rack_of[first]], kind="stable")]
    both = np.empty(2 * by_rack.size, dtype=np.int64)
    both[0::2], both[1::2] = np.arange(by_rack.size), by_rack
    both = np.concatenate([both, np.arange(by_rack.size, cands.size)])  # (more overall, when racks run out)
    _, at = np.unique(both, return_index=True)
    return cands[both[np.sort(at)][:targets]]


def nonlocal_moves(spec: ClusterSpec, p: Placement, free: np.ndarray, shape: Shape, cap: int | None = None,
                   rng: np.random.Generator | None = None, targets: int | None = None,
                   exposed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours ``(hosts, idx)``, ``(M, k)`` each: relocations and evacuations. With ``targets``,
    only ``targets`` destinations of each kind are tried - the best of each rack (hosts / units no
    cross-host tenant touches (``exposed``) first, then the most spare GPUs, then locality order),
    racks holding more of the job's ranks first - and at most
    ``cap`` moves in priority order (best destinations first, the most promising sources first);
    without, a seeded sample of ``cap``."""
    unit = spec.units[0]
    k, tp = shape.k, shape.tp
    h0, i0 = p.hosts, p.idx
    used = np.zeros_like(free)
    np.bitwise_or.at(used, h0, np.int64(1) << i0)
    spare = free & ~used
    n_sp = popcount(spare)
    exposed = np.zeros(spec.n_hosts, dtype=bool) if exposed is None else exposed
    U = int(unit.max()) + 1
    by_unit = np.argsort(unit, kind="stable")
    # unit u's hosts: by_unit[start[u]:start[u + 1]] (sliced only for the units used: np.split of
    # all 128 was a quarter of this function's CPU)
    start = np.concatenate([[0], np.cumsum(np.bincount(unit, minlength=U))])
    # relocate: one target slot per unit with room for a TP group (fullest spare host first)
    room_u = np.bincount(unit, weights=n_sp, minlength=U)
    exp_u = np.bincount(unit, weights=exposed.astype(float), minlength=U)
    rack = _racks(spec)
    on_rack = np.bincount(rack[h0], minlength=int(rack.max()) + 1)  # the job's ranks per rack
    units = np.flatnonzero(room_u >= tp)
    units = units[np.lexsort((units, -room_u[units], exp_u[units] > 0))]
    units = _per_rack(units, rack[by_unit[start[units]]], on_rack, targets)
    slots = {int(u): host_aligned(unit_gpus(spec, spare, by_unit[start[u]:start[u + 1]]), tp)[:tp] for u in units}
    # (its own unit too: a group over two trays of a domain may fit one tray's spare GPUs)
    G = k // tp
    gh = h0.reshape(G, tp)
    # groups first that span hosts or sit on a host a cross-host tenant touches (they gain most)
    g_order = np.lexsort((np.arange(G), ~exposed[gh].any(axis=1), (gh == gh[:, :1]).all(axis=1)))
    rel = [[(0, int(g), int(u)) for g in g_order] for u in slots]
    # evacuate: host a (the job's) -> host b (spare room for all of a's ranks); exposed hosts and
    # hosts holding few of the job's ranks first (they set the cross-host groups' count patterns)
    job_hosts, cnt = np.unique(h0, return_counts=True)
    src = np.lexsort((job_hosts, cnt, ~exposed[job_hosts]))
    order = np.lexsort((np.arange(spec.n_hosts), -n_sp, exposed))
    eva: list[list[tuple[int, int, int]]] = [[] for _ in range(targets or spec.n_hosts)]
    shared: dict[int, list[int]] = {}  # destinations per rank count, for sources not among them
    for a, c in zip(job_hosts[src].tolist(), cnt[src].tolist()):
        mine = bool(n_sp[a] >= c)  # (a source with room for its own ranks: its own list)
        if mine or c not in shared:
            dest = order[(n_sp[order] >= c) & (order != a)]
            dest = _per_rack(dest, rack[dest], on_rack, targets).tolist()
            if not mine:
                shared[c] = dest
        for r, b in enumerate(dest if mine else shared[c]):
            eva[r].append((1, a, b))
    # priority order: each destination rank in turn, evacuations and relocations interleaved
    kinds = []
    for r in range(max(len(rel), len(eva))):
        a_, b_ = (eva[r] if r < len(eva) else []), (rel[r] if r < len(rel) else [])
        kinds += [x for pair in zip(a_, b_) for x in pair] + a_[len(b_):] + b_[len(a_):]
    if cap is not None and len(kinds) > cap:
        if targets is not None:  # the first ``cap`` in priority order
            kinds = kinds[:cap]
        else:
            rng = rng if rng is not None else np.random.default_rng(0)
            kinds = [kinds[j] for j in np.sort(rng.choice(len(kinds), size=cap, replace=False))]
    if not kinds:
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.int64)
    H, Ix = _build(spec, h0, i0, spare, tp, np.array(kinds, dtype=np.int64).reshape(-1, 3), slots)
    if bool(tp_aligned(h0[None, :], unit, tp)[0]):  # the TP rule: keep every TP group inside its unit
        ok = tp_aligned(H, unit, tp)
        H, Ix = H[ok], Ix[ok]
    return H, Ix


def _build(spec: ClusterSpec, h0: np.ndarray, i0: np.ndarray, spare: np.ndarray, tp: int, kinds: np.ndarray,
           slots: dict[int, list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    """The moved placements ``(H, Ix)`` of ``kinds`` rows ``(kind, x, y)``: relocate TP group ``x``
    to unit ``y``'s slot, or evacuate host ``x``'s ranks to host ``y``'s spare GPUs (lowest ids
    first, in rank order), as whole-array assignments."""
    H, Ix = np.tile(h0, (kinds.shape[0], 1)), np.tile(i0, (kinds.shape[0], 1))
    rel = np.flatnonzero(kinds[:, 0] == 0)
    if rel.size:
        us = np.array(list(slots), dtype=np.int64)
        tab = np.array([slots[int(u)] for u in us], dtype=np.int64).reshape(us.size, tp, 2)
        row = np.zeros(int(us.max()) + 1, dtype=np.int64)
        row[us] = np.arange(us.size)
        t = tab[row[kinds[rel, 2]]]
        cols = kinds[rel, 1][:, None] * tp + np.arange(tp)
        H[rel[:, None], cols], Ix[rel[:, None], cols] = t[:, :, 0], t[:, :, 1]
    ev = np.flatnonzero(kinds[:, 0] == 1)
    if ev.size:
        bits = np.arange(int(spec.gpus_per_host.max()))
        # each host's spare GPU ids, lowest first (padding past its spare count is never read)
        on = (spare[:, None] >> bits) & 1 == 1
        spare_ids = np.take_along_axis(np.broadcast_to(bits, on.shape), np.argsort(~on, axis=1, kind="stable"), 1)
        hit = h0[None, :] == kinds[ev, 1][:, None]  # (E, k): the source host's ranks
        nth = np.cumsum(hit, axis=1) - 1  # each such rank's place among them
        e, r = np.nonzero(hit)
        H[ev[e], r] = kinds[ev[e], 2]
        Ix[ev[e], r] = spare_ids[kinds[ev[e], 2], nth[e, r]]
    return H, Ix


def refine_nonlocal(pred: ContentionPredictor, shape: Shape, best: Placement, free: np.ndarray,
                    seed: int = 0) -> Placement:
    """Best-improvement climbing over non-local moves (``best`` is scored): each round scores the
    first moves in priority order (:func:`nonlocal_moves` with :data:`TARGETS` destinations, up to
    :data:`ROUND_ROWS` model rows) and keeps the fastest if predicted faster; at most
    :data:`ROUNDS` rounds, no round started past :data:`ROWS` rows."""
    rows_each = 2 * sum(g.shape[0] for g in group_ranks(shape).values())
    cap = max(ROUND_ROWS // max(rows_each, 1), MIN_ROUND)
    rows = 0
    rng = np.random.default_rng(seed)
    scorer: MoveScorer | None = None
    for _ in range(ROUNDS):
        if rows >= ROWS:
            break
        H, Ix = nonlocal_moves(pred.spec, best, free, shape, cap, rng, TARGETS, pred.exposed)
        if not H.shape[0]:
            break
        label = best.label.split("+moved")[0] + "+moved"
        if INCREMENTAL:  # the winner's scorer is the next round's base
            base = scorer if scorer is not None else MoveScorer(pred, shape, best)
            scorer = base.best_move(H, Ix, label)
            top = None if scorer is None else scorer.placement
            rows += base.rows_sent if COUNT_SENT else H.shape[0] * rows_each
        else:
            top = best_move(pred, shape, best, H, Ix, label=label)
            rows += H.shape[0] * rows_each
        if top is None:
            break
        best = top
    return best
