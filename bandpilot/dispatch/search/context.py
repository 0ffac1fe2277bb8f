"""What is a candidate allocation worth, and which per-host subsets are worth trying? The per-request
:class:`SearchContext` every algorithm shares, its result type :class:`Found` and :class:`IntractableError`.

Everything here rests on the hierarchy of the bandwidth model (paper Sec. IV-B): a cross-host
allocation's bandwidth depends on the per-host GPU counts and - monotonically, through ``min`` -
on each host's stage-1 (intra-host) value. So for a given per-host count vector ``c`` the best
allocation takes, on every host, the free subset of size ``c_h`` with the best stage-1 value,
which is computed once per request from ``model.stage1`` and the free mask
(:attr:`SearchContext.best_mask`). The search space collapses from ``C(|A|, k)`` subsets to the
count vectors ``{c : Σc = k, 0 <= c_h <= free_h}``, and further: hosts with identical free
best-tables (and GPU type, domain, and no contention exposure) are interchangeable, so only sorted
count multisets per equivalence class need evaluating (:meth:`SearchContext.count_vectors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bandpilot.dispatch.contention import COLUMNS_FROM, ContentionPredictor, Prediction, unique_rows
from bandpilot.dispatch.model import BandwidthModel
from bandpilot.dispatch.search.partitions import class_codes, pareto_options, partition_counts, partitions
from bandpilot.dispatch.state import State
from bandpilot.errors import PlacementError
from bandpilot.topology.cluster import popcount

_REL_TIE = 1e-9
#: Super allocations above which a batch is scored standalone first (``predict_best``): only the
#: candidates that can still win (or tie) get every super allocation, so the choice is the one the
#: whole batch would give. The drain of a 10,000-job simulation on 128 hosts sent every PTS step's
#: and local-search move's super allocations - dozens of jobs spanning most hosts, each row new to
#: the prediction memo - to the net (``python -m benchmarks simulate``).
PRUNE_PAIRS = 64


class IntractableError(PlacementError):
    """Exact search refused: the candidate space is too large (reason ``invalid_request``)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_request", message)


@dataclass
class Found:
    """A search result: one allocation with its predicted contention-aware and standalone value."""

    mask: np.ndarray
    value: float
    standalone: float
    evaluated: int = 0  # candidates considered (informational)



@dataclass
class _Class:
    hosts: np.ndarray  # member hosts (index order)
    f: int  # free GPUs of each member
    exposed: bool


def _first_seen(labels: np.ndarray) -> np.ndarray:
    """Relabel so ids count up in order of first appearance."""
    _, first = np.unique(labels, return_index=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[labels]


_HOST_IDS: dict[int, tuple[Any, np.ndarray, np.ndarray]] = {}


def host_ids(spec: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-host integer ids of the GPU type and the domain label (cached per spec)."""
    got = _HOST_IDS.get(id(spec))
    if got is None or got[0] is not spec:
        gpus: dict[str, int] = {}
        doms: dict[Any, int] = {}
        gpu_id = np.array([gpus.setdefault(h.gpu, len(gpus)) for h in spec.hosts], dtype=np.int64)
        dom_id = np.array([doms.setdefault(h.domain, len(doms)) for h in spec.hosts], dtype=np.int64)
        got = (spec, gpu_id, dom_id)
        if len(_HOST_IDS) > 16:
            _HOST_IDS.clear()
        _HOST_IDS[id(spec)] = got
    return got[1], got[2]


#: stage-1 array id -> {(distinct row, free mask, contending masks): [subsets, counts, features,
#: best per count, Pareto sets]} for hosts a contending job touches
_EXPOSED: dict[int, dict[tuple, list]] = {}
_EXPOSED_MAX = 65_536
#: stage-1 array -> (the array, distinct-row id per host, best mask / value per (row, free mask, count))
_TABLES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}


def _subset_tables(stage1: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each distinct stage-1 row and each free mask: the best-stage-1 subset of each size
    (first in mask order on ties, -1 / -inf where none fits) - what a per-select scan of every
    host's subsets computed, built once per model and reused by every search."""
    hit = _TABLES.get(id(stage1))
    if hit is not None and hit[0] is stage1:
        return hit[1], hit[2], hit[3]
    n = 1 << G
    allm = np.arange(n, dtype=np.int64)
    pc = popcount(allm)
    vals = np.ascontiguousarray(stage1[:, :n], dtype=float)
    uniq, srow = unique_rows(vals.view(np.int64))  # bitwise-equal rows (NaN-safe)
    uniq = uniq.view(float)
    R = uniq.shape[0]
    bm = np.full((R, n, G + 1), -1, dtype=np.int64)
    bv = np.full((R, n, G + 1), -np.inf)
    rows = np.arange(R)
    for m in range(n):
        score = np.where(((allm & ~m) == 0)[None, :], uniq, -np.inf)
        for c in range(G + 1):
            sel = np.flatnonzero(pc == c)
            sub = score[:, sel]
            i = sub.argmax(axis=1)
            bm[:, m, c] = sel[i]
            bv[:, m, c] = sub[rows, i]
    bm[~np.isfinite(bv)] = -1
    while len(_TABLES) >= 4:
        _EXPOSED.pop(next(iter(_TABLES)), None)
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[id(stage1)] = (stage1, srow, bm, bv)
    _EXPOSED.pop(id(stage1), None)  # a new array under a recycled id
    return srow, bm, bv


class SearchContext:
    """Per-request precomputation shared by every algorithm.

    ``free`` is the (constraint-filtered) free mask; allocations never leave it.
    """

    def __init__(self, model: BandwidthModel, state: State, free: np.ndarray, k: int,
                 predictor: ContentionPredictor | None = None, *, segment: int | None = None,
                 tie: float | None = None, locality: float = 0.0) -> None:
        self.model = model
        self.state = state
        self.spec = state.spec
        self.k = int(k)
        self.free = np.asarray(free, dtype=np.int64).copy()
        self.H = self.spec.n_hosts
        self.G = int(self.spec.gpus_per_host.max())
        self.pred = predictor if predictor is not None else ContentionPredictor(model, state)
        self.segment = segment  # NVLink-domain search: each domain's share a multiple of it
        self.tie = tie  # NVLink-domain search: fragmentation decides within this margin (None: the default)
        #: lifetime locality: a candidate on fewer hosts wins unless spreading gains more than this
        #: relative predicted bandwidth (a spread job meets more co-tenants over its run)
        self.locality = locality
        stage1 = np.asarray(model.stage1, dtype=float)
        if stage1.ndim != 2 or stage1.shape[0] != self.H or stage1.shape[1] < (1 << self.G):
            raise ValueError(f"model.stage1 has shape {stage1.shape}, expected ({self.H}, {1 << self.G})")
        self.stage1 = stage1
        self.fcount = popcount(self.free)
        self.n_free = int(self.fcount.sum())
        self._options: dict[tuple[int, int], np.ndarray] = {}
        self._exposed_subs: dict[int, list] = {}  # (subs, pcs, feats, counts, best, Pareto sets)
        self._build_tables()
        self._build_classes()

    # -- per-host best subsets ------------------------------------------------------------
    def _build_tables(self) -> None:
        G = self.G
        allm = np.arange(1 << G, dtype=np.int64)
        pc = popcount(allm)
        # Best subset per count of every host: a lookup (distinct stage-1 row, free mask) in a
        # table built once per model (the search used to rescore H x 2^G subsets per select).
        srow, bm_tab, bv_tab = _subset_tables(self.stage1, G)
        free = self.free & ((1 << G) - 1)
        self.best_mask = bm_tab[srow, free]
        self.best_val = bv_tab[srow, free]
        #: per host its (distinct stage-1 row, free mask) pair: ``best_val`` is a function of it
        self.pair = srow * (1 << G) + free
        self.exposed = self.pred.exposed & (self.fcount > 0)
        # Hosts a contending job touches: the subset also sets the stage-1 of the super
        # allocations there, so among the best stage-1 subsets of each size prefer the best
        # union stage-1s (worst, then sum); Exact uses the whole Pareto set (see options()).
        # These depend on (stage-1 row, free mask, contending masks there) only: kept across
        # selects (the running set changes one job at a time), Pareto sets included.
        memo = _EXPOSED.setdefault(id(self.stage1), {})
        for h in np.flatnonzero(self.exposed):
            jm = self.pred.masks_at(int(h))
            key = (int(srow[h]), int(self.free[h]), jm.tobytes())
            ent = memo.get(key)
            if ent is None:
                subs = allm[(allm & ~self.free[h]) == 0]
                pcs = pc[subs]
                feats = np.round(np.column_stack([self.stage1[h, subs], self.stage1[h, subs[:, None] | jm[None, :]]]), 9)
                order = np.lexsort((subs, -feats[:, 1:].sum(axis=1), -feats[:, 1:].min(axis=1), -feats[:, 0], pcs))
                subs, pcs, feats = subs[order], pcs[order], feats[order]
                first = np.flatnonzero(np.r_[True, np.diff(pcs) != 0])
                ent = [subs, pcs, feats, pcs[first], subs[first], None]
                if len(memo) >= _EXPOSED_MAX:
                    memo.clear()
                memo[key] = ent
            self.best_mask[h, ent[3]] = ent[4]
            self._exposed_subs[int(h)] = ent

    def options(self, h: int, c: int) -> np.ndarray:
        """Subsets of size ``c`` worth trying on host ``h``: the best one, or on exposed hosts the
        Pareto set over (stage-1, stage-1 of the union with each contending job's GPUs there)."""
        got = self._options.get((h, c))
        if got is not None:
            return got
        if h not in self._exposed_subs:
            return self.best_mask[h, c : c + 1]
        ent = self._exposed_subs[h]
        if ent[5] is None:
            ent[5] = pareto_options(ent[2], ent[0], ent[1])
        for cc, opts in ent[5].items():
            self._options[(h, cc)] = opts
        return self._options.get((h, c), np.zeros(0, dtype=np.int64))

    def _build_classes(self) -> None:
        # class ids in order of first appearance over the hosts (vectorised: one np.unique over
        # (GPU type, domain, free count, rounded best-subset values) rows)
        hosts = np.flatnonzero(self.fcount > 0)
        cls = np.full(self.H, -1, dtype=np.int64)
        ccls = np.full(self.H, -1, dtype=np.int64)
        scls = np.full(self.H, -1, dtype=np.int64)
        n_keys = n_ckeys = 0
        if hosts.size:
            gpu_id, dom_id = host_ids(self.spec)
            f = self.fcount[hosts]
            vcl = self.value_class(hosts)
            key = getattr(self.pred, "host_key", None)  # a pricing that tells hosts apart (lifetime)
            if key is None:
                # (GPU type, free count, value class) and the domain as one integer each: a 1-D sort
                # instead of hashing 25,002 rows twice (the same classes)
                solo = (gpu_id[hosts] * (self.G + 1) + f) * (int(vcl.max()) + 1) + vcl
                coarse = _first_seen(np.unique(solo * (int(dom_id.max()) + 1) + dom_id[hosts], return_inverse=True)[1].ravel())
                # the same without the domain label: trays alike in any domain (units alike, see domains.py)
                scls[hosts] = _first_seen(np.unique(solo, return_inverse=True)[1].ravel())
            else:
                rows = np.column_stack([gpu_id[hosts], dom_id[hosts], f, vcl, key[hosts]])
                coarse = _first_seen(unique_rows(rows)[1])
                scls[hosts] = _first_seen(unique_rows(np.delete(rows, 1, axis=1))[1])
            ccls[hosts] = coarse
            n_ckeys = int(coarse.max()) + 1
            exp = self.exposed[hosts]
            if exp.any():  # an exposed host is a class of its own
                key = np.where(exp, n_ckeys + np.arange(hosts.size), coarse)
                fine = _first_seen(np.unique(key, return_inverse=True)[1].ravel())
            else:
                fine = coarse
            cls[hosts] = fine
            n_keys = int(fine.max()) + 1
        self.cls = cls  # interchangeable hosts (exact symmetry)
        self.n_classes = n_keys
        self.ccls = ccls  # same standalone behaviour, contention exposure ignored
        self.n_cclasses = n_ckeys
        self.scls = scls  # ccls without the domain label
        #: total demand of the contending jobs touching each host (0: unexposed)
        self.exposure = self.pred.host_exposure

    def value_class(self, hosts: np.ndarray) -> np.ndarray:
        """Per host of ``hosts`` an id equal for hosts whose best-subset values (rounded to 1e-9,
        counts up to their free GPUs) are equal: computed once per distinct (stage-1 row, free
        mask) pair - ~10 on an idle 25,002-tray cluster - not once per host."""
        pairs, inv = np.unique(self.pair[hosts], return_inverse=True)
        rep = np.empty(pairs.size, dtype=np.int64)
        rep[inv.ravel()] = hosts  # any host of each pair: they share their values
        f = self.fcount[rep]
        # values rounded to 1e-9 as integers (np.round(v, 9) is rint(v * 1e9) / 1e9): hashable rows
        vals = np.rint(np.where(np.arange(self.G + 1)[None, :] <= f[:, None], self.best_val[rep], 0.0) * 1e9)
        return unique_rows(np.column_stack([f, vals.astype(np.int64)]))[1][inv.ravel()]

    def classes(self, allowed: np.ndarray | None = None, coarse: bool = False) -> list[_Class]:
        """Host classes with free GPUs. ``coarse``: classes ignore contention exposure (members
        ordered least-exposed first, so enumerated counts land on the least-contended hosts)."""
        if allowed is None:  # every free host: asked by each count and enumeration of a request
            memo = self.__dict__.setdefault("_classes", {})
            got = memo.get(coarse)
            if got is None:
                got = memo[coarse] = self._classes_of(None, coarse)
            return got
        return self._classes_of(allowed, coarse)

    def _classes_of(self, allowed: np.ndarray | None, coarse: bool) -> list[_Class]:
        lab = self.ccls if coarse else self.cls
        ok = lab >= 0 if allowed is None else (lab >= 0) & allowed
        hosts = np.flatnonzero(ok)
        if hosts.size == 0:
            return []
        # one sort for all classes (ascending class id; members by host index, coarse ones
        # least-exposed first) instead of one scan of every host per class
        labs = lab[hosts]
        keys = (hosts, self.exposure[hosts], labs) if coarse else (hosts, labs)
        o = np.lexsort(keys)
        hosts, labs = hosts[o], labs[o]
        cuts = np.flatnonzero(np.r_[True, labs[1:] != labs[:-1]])
        out = []
        for members in np.split(hosts, cuts[1:]):
            h = int(members[0])
            out.append(_Class(members, int(self.fcount[h]), False if coarse else bool(self.exposed[h])))
        return out

    # -- evaluation -----------------------------------------------------------------------
    @property
    def tie_margin(self) -> float:
        """Relative distance below the best value within which :meth:`choose` weighs candidates
        (pruned evaluations score every candidate that close)."""
        # lifetime pricings widen it: their estimates are rough (near_tie)
        return max(_REL_TIE, self.locality, getattr(self.pred, "near_tie", 0.0))

    def evaluate(self, masks: np.ndarray, cols: np.ndarray | None = None, max_pairs: int = 8192) -> Prediction:
        """Contention-aware values of candidates (pruned by the standalone bound in batches of
        more than ``max_pairs`` super allocations: candidates that cannot win come back as
        ``-inf``); ``cols``: rows given on those host columns only."""
        return self.pred.predict_best(masks, max_pairs=max_pairs, cols=cols, margin=self.tie_margin)

    def masks_from_counts(self, counts: np.ndarray) -> np.ndarray:
        counts = np.atleast_2d(counts)
        out = np.zeros(counts.shape, dtype=np.int64)  # a count of 0 is the empty mask
        r, h = np.nonzero(counts)
        out[r, h] = self.best_mask.ravel()[h * (self.G + 1) + counts[r, h]]
        return out

    def choose(self, masks: np.ndarray, value: np.ndarray, cols: np.ndarray | None = None) -> int:
        """Index of the best candidate; near-ties (within :attr:`locality`, or the pricing's ``near_tie``) prefer fewer hosts, then the
        tightest fit (fewest free GPUs on the hosts used, keeping big free blocks intact), then order.
        ``cols``: the rows are given on those host columns only."""
        vmax = float(value.max())
        # a pricing may widen "near-equal" (tie_margin) and bring a queue lookahead that decides among
        # near-equal candidates (lifetime-queue)
        protect = getattr(self.pred, "protect", None) if getattr(self.pred, "lookahead", 0) else None
        near = np.flatnonzero(value >= vmax - self.tie_margin * max(1.0, abs(vmax)))
        if near.size == 1:
            return int(near[0])
        used = masks[near] != 0
        nh = used.sum(axis=1)
        fc = self.fcount if cols is None else self.fcount[cols]
        fit = (used * fc[None, :]).sum(axis=1)
        keys = [near, fit, nh]
        if protect is not None:  # fewer hosts, then what leaves the next gangs their best placement, then fit
            near = near[np.argsort(-value[near], kind="stable")][: getattr(self.pred, "protect_max", near.size)]
            used = masks[near] != 0
            full = masks[near] if cols is None else np.zeros((near.size, self.H), dtype=np.int64)
            if cols is not None:
                full[:, cols] = masks[near]
            fit = (used * fc[None, :]).sum(axis=1)
            keys = [near, fit, -np.round(protect(full, value[near]), 3), used.sum(axis=1)]
        return int(near[np.lexsort(keys)[0]])

    def best_of(self, masks: np.ndarray, max_pairs: int = 8192, cols: np.ndarray | None = None) -> Found | None:
        """Best of candidate rows (``cols``: given on those sorted host columns; the result is a
        full row). Wide clusters evaluate rows on the columns they touch: dense rows of 25,002
        trays made one single-host search on 100,008 GPUs take seconds."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        if masks.shape[0] == 0:
            return None
        if cols is None and masks.shape[1] >= COLUMNS_FROM:
            cols = np.flatnonzero(masks.any(axis=0))
            masks = masks[:, cols]
        p = self.evaluate(masks, cols, max_pairs=max_pairs)
        i = self.choose(masks, p.value, cols)
        if cols is None:
            mask = masks[i].copy()
        else:
            mask = np.zeros(self.H, dtype=np.int64)
            mask[cols] = masks[i]
        return Found(mask, float(p.value[i]), float(p.standalone[i]), masks.shape[0])

    def pick(self, found: list[Found | None]) -> Found:
        found = [f for f in found if f is not None]
        masks = np.array([f.mask for f in found])
        vals = np.array([f.value for f in found])
        best = found[self.choose(masks, vals)]
        best.evaluated = sum(f.evaluated for f in found)
        return best

    def canonical_unique(self, counts: np.ndarray) -> np.ndarray:
        """Indices of count-vector rows that are distinct up to swapping interchangeable hosts."""
        counts = np.atleast_2d(counts)
        if counts.shape[0] <= 1:
            return np.arange(counts.shape[0])
        code = np.where(counts > 0, self.cls[None, :] * (self.G + 1) + counts, -1)
        code = np.sort(code, axis=1)
        void = np.ascontiguousarray(code).view(np.dtype((np.void, 8 * code.shape[1]))).ravel()
        _, idx = np.unique(void, return_index=True)
        return np.sort(idx)

    # -- count vectors --------------------------------------------------------------------
    def _class_poly(self, cl: _Class, pareto: bool) -> np.ndarray:
        k = self.k
        if cl.exposed:
            h = int(cl.hosts[0])
            q = np.zeros(k + 1)
            for c in range(min(cl.f, k) + 1):
                q[c] = len(self.options(h, c)) if pareto else 1.0
            return q
        return np.asarray(partition_counts(len(cl.hosts), cl.f, k))

    def count_vectors(self, allowed: np.ndarray | None = None, pareto: bool = False, coarse: bool = False) -> float:
        """Number of candidates :meth:`enumerate` would produce (after symmetry reduction)."""
        if allowed is None:
            memo = self.__dict__.setdefault("_counts", {})
            got = memo.get((pareto, coarse))
            if got is None:
                got = memo[(pareto, coarse)] = self._count_vectors(None, pareto, coarse)
            return got
        return self._count_vectors(allowed, pareto, coarse)

    def count_bound(self, pareto: bool = False) -> float:
        """An upper bound on :meth:`count_vectors` over every free host without the symmetry
        reduction: per host its counts 0..min(free, k) (with ``pareto``, on exposed hosts its
        options of each count), multiplied. A few host-sized products where the exact count walks
        the classes' partition polynomials: on small clusters the bound already settles whether
        the exhaustive search fits its limit."""
        hosts = np.flatnonzero(self.fcount > 0)
        per = np.minimum(self.fcount[hosts], self.k) + 1.0
        if pareto:
            for i in np.flatnonzero(self.exposed[hosts]).tolist():
                h = int(hosts[i])
                per[i] = sum(len(self.options(h, c)) for c in range(int(per[i])))
        return float(np.prod(per))

    def _count_vectors(self, allowed: np.ndarray | None, pareto: bool, coarse: bool) -> float:
        poly = np.zeros(self.k + 1)
        poly[0] = 1.0
        for cl in self.classes(allowed, coarse):
            poly = np.convolve(poly, self._class_poly(cl, pareto))[: self.k + 1]
        return float(poly[self.k])

    def enumerate(self, allowed: np.ndarray | None = None, pareto: bool = False, coarse: bool = False,
                  cols: np.ndarray | None = None) -> np.ndarray:
        """All symmetry-reduced count vectors with ``Σc = k`` as mask rows ``(N, n_hosts)`` (``cols``:
        ``(N, len(cols))`` rows on those sorted host columns, which hold every allowed host).

        Dynamic programming over host classes on small integer codes (a count, or on exposed
        hosts an index into that host's option list); partial vectors that cannot reach ``k``
        are pruned, so no intermediate table is larger than the result.
        """
        k = self.k
        classes = self.classes(allowed, coarse)
        width = self.H if cols is None else cols.size
        if not classes:
            return np.zeros((0, width), dtype=np.int64)
        menus: dict[int, np.ndarray] = {}
        offsets: dict[int, np.ndarray] = {}
        for cl in classes:
            if cl.exposed and pareto:
                h = int(cl.hosts[0])
                opts = [self.options(h, c) for c in range(cl.f + 1)]
                menus[h] = np.concatenate(opts)
                offsets[h] = np.r_[0, np.cumsum([len(o) for o in opts])]
        caps = [min(len(cl.hosts) * cl.f, k) for cl in classes]
        code_t = np.int16 if self.G <= 8 else np.int32

        def options(i: int, t: int) -> np.ndarray:
            cl = classes[i]
            if not cl.exposed:
                return partitions(t, len(cl.hosts), cl.f).astype(code_t)
            h = int(cl.hosts[0])
            if pareto:
                return np.arange(offsets[h][t], offsets[h][t + 1], dtype=code_t)[:, None]
            return np.array([[t]], dtype=code_t)

        codes = class_codes(caps, k, code_t, options)
        out = np.zeros((0 if codes is None else codes.shape[0], width), dtype=np.int64)
        if codes is None:
            return out
        col = 0
        for cl in classes:
            for h in cl.hosts:
                h = int(h)
                menu = menus.get(h)
                if menu is None:
                    menu = self.best_mask[h]
                out[:, h if cols is None else int(np.searchsorted(cols, h))] = menu[codes[:, col]]
                col += 1
        return out

    # -- misc -----------------------------------------------------------------------------
    def single_host_hosts(self) -> np.ndarray:
        """Hosts that fit ``k``, one per host class (ascending)."""
        fit = np.flatnonzero(self.fcount >= self.k)
        if fit.size == 0:
            return fit
        _, first = np.unique(self.cls[fit], return_index=True)
        return fit[np.sort(first)]

    def single_host_rows(self) -> np.ndarray:
        """Best ``k``-subset of every host that fits ``k`` (one per host class)."""
        hosts = self.single_host_hosts()
        rows = np.zeros((hosts.size, self.H), dtype=np.int64)
        rows[np.arange(hosts.size), hosts] = self.best_mask[hosts, self.k]
        return rows

    def best_single_host(self) -> Found | None:
        """:meth:`best_of` the :meth:`single_host_rows`, given on their own hosts' columns (one
        class per NVLink domain: 1,389 x 25,002 dense rows at 100,008 GPUs)."""
        hosts = self.single_host_hosts()
        if hosts.size == 0:
            return None
        return self.best_of(np.diag(self.best_mask[hosts, self.k]), cols=hosts)

    def host_rank(self) -> np.ndarray:
        """Hosts with free GPUs, most promising first: unexposed, most free, best stage-1."""
        hosts = np.flatnonzero(self.fcount > 0)
        f = self.fcount[hosts]
        top = self.best_val[hosts, f]
        return hosts[np.lexsort((hosts, -top, -f, self.exposed[hosts]))]
