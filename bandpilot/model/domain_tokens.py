"""How does an allocation on a rack-scale cluster become network input? One token per NVLink domain.

On NVL72-class clusters the unit that talks over NIC rails is the NVLink domain, not the tray: a
cross-domain row's bandwidth depends on each domain's share (GPU count, trays, the NIC rails those
trays drive) and on what each share gets *inside* its domain - stage 1.5
(:mod:`~bandpilot.model.domain_patterns`) for a share over several trays, stage 1 for a share on
one tray. So the domain stage sits between host and cluster: per-tray stage 1 -> per-domain
stage 1.5 -> a cluster-level net over domain tokens. A host outside every NVLink domain is its
own unit (its token is the host token). Why not host tokens: a 144-GPU row is 36 trays but 2-16
domains; attention over up to 256 padded tray tokens made one epoch on 885 rows 12.7 s (a
5,205-row `bandpilot train` did not finish in 58 minutes), and a host-level prior has no term
for the NVLink path a tray's share rides inside its domain.

:class:`DomainView` computes, vectorised over rows: which rows stay inside one domain (their value
is the domain token's own in-domain value), and the padded unit tokens of the others in the
layout of :func:`~bandpilot.model.tokens.host_tokens` (``cnt`` = the domain's GPUs, ``rails`` =
rails its trays drive, ``intra`` = its in-domain value) plus ``trays``.
"""

from __future__ import annotations

import numpy as np

from bandpilot.errors import ModelError
from bandpilot.model.canonical import mix_lanes, mix_tokens
from bandpilot.fabric.units import unit_index
from bandpilot.model.domain_patterns import DomainPatterns
from bandpilot.topology.cluster import ClusterSpec, ranges

#: Rows from which :meth:`DomainView._units` reduces only the blocks that differ from the first row.
DELTA_FROM = 32
#: Share of (row, unit) blocks differing from the first row above which every row is reduced whole
#: (unrelated rows: the delta path is slower there, as for the emulator's ``unit_delta``).
DELTA_MAX_CHANGED = 0.25

#: :meth:`DomainView.live_units` of some rows: the units they touch and (n, L) per-unit features.
Features = tuple[np.ndarray, dict[str, np.ndarray]]


def take_rows(feats: Features, idx: np.ndarray) -> Features:
    """The features of rows ``idx`` (the same units: untouched ones add no token)."""
    return feats[0], {k: v[idx] for k, v in feats[1].items()}


class DomainView:
    """Per-unit features of mask rows for one cluster, stage-1 table and stage-1.5 patterns."""

    def __init__(self, spec: ClusterSpec, stage1: np.ndarray, hosts: dict[str, np.ndarray], patterns: DomainPatterns) -> None:
        if not spec.nvlink_domains:
            raise ModelError(f"cluster {spec.name!r} has no NVLink domains: the domain model needs them")
        self.spec = spec
        self.stage1 = stage1
        self.patterns = patterns
        self.ix = unit_index(spec)
        self.max_gpus = int(spec.gpus_per_host.max())
        self.rails = hosts["rails"]
        self.speed = hosts.get("speed", np.zeros(spec.n_hosts))
        first = np.array([m[0] for m in self.ix.members], dtype=np.int64)
        self.u_gtype = hosts["gtype"][first]
        self.u_rail = np.array([hosts["rail"][m].min() for m in self.ix.members])
        self.u_cls = patterns.classes

    def _live(self, masks: np.ndarray, cols: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Units some row touches, the columns of ``masks`` some row uses grouped unit by unit (their
        positions and hosts) and each unit's start among them. A search's rows touch a few of the
        units (a 4,096-GPU batch: ~60 of 139 domains) and trays; an unused tray adds nothing to a
        unit's sums and minima, so only used columns are read. ``cols``: the host of each column
        (rows given on those columns only; default every host)."""
        pos = np.flatnonzero(masks.any(axis=0))
        hosts = pos if cols is None else np.asarray(cols, dtype=np.int64)[pos]
        u = self.ix.unit[hosts]
        if u.size and not np.all(u[1:] >= u[:-1]):
            order = np.argsort(u, kind="stable")
            pos, hosts, u = pos[order], hosts[order], u[order]
        starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]]) if u.size else np.zeros(0, dtype=np.int64)
        return u[starts], pos, hosts, starts

    def _units(self, masks: np.ndarray, cols: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """(n, U) per-unit GPU count, trays used, rails driven, in-domain value (0: one GPU);
        ``cols``: the rows are given on those host columns only."""
        lu, z = self.live_units(masks, cols)
        n = z["cnt"].shape[0]
        out = {}
        for key, x in z.items():
            full = np.full((n, self.ix.U), np.inf if key == "speed" else 0, dtype=x.dtype)
            full[:, lu] = x
            out[key] = full
        return out

    def live_units(self, masks: np.ndarray, cols: np.ndarray | None = None) -> Features:
        """:meth:`_units` on the units some row touches only: ``(those units, (n, L) features)``.

        A local-search batch is thousands of rows that differ from its first row in two or three
        of the 30-57 domains they span: the first row's per-unit blocks are reduced once and only
        the blocks where a row differs are reduced again (the same sums in the same order, so the
        same values as reducing every row; :data:`DELTA_FROM`, :data:`DELTA_MAX_CHANGED`)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n = masks.shape[0]
        lu, pos, cols, starts = self._live(masks, cols)
        # a batch on the columns it uses (a search's super allocations) needs no copy
        whole = pos.size == masks.shape[1] and bool(np.all(pos[1:] > pos[:-1]))
        sub = masks if whole else masks[:, pos]
        if n >= DELTA_FROM and lu.size:
            diff = np.logical_or.reduceat(sub != sub[0][None, :], starts, axis=1)
            if diff.mean() <= DELTA_MAX_CHANGED:
                return lu, self._delta_features(sub, cols, starts, lu, np.nonzero(diff))
        return lu, self._features(self._block_stats(sub, cols, starts), lu)

    def _features(self, blocks: tuple[np.ndarray, ...], units: np.ndarray) -> dict[str, np.ndarray]:
        """Token features of blocks (:meth:`_block_stats`, (m, L)) of the units ``units`` (L,):
        elementwise in each block's stats, so a block's features do not depend on the others."""
        cnt, trays, rails, cap, speed, hist = blocks
        intra = np.where(cnt >= 2, cap, 0.0)
        multi = (trays >= 2) & (self.u_cls[units][None, :] >= 0)
        if multi.any():
            r, b = np.nonzero(multi)
            intra[r, b] = np.minimum(self.patterns.part_values(self.u_cls[units[b]], hist[r, b]), cap[r, b])
        return {"cnt": cnt, "trays": trays, "rails": rails, "intra": intra, "speed": speed}

    def _block_stats(self, sub: np.ndarray, hosts: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per block (columns ``starts[i]:starts[i+1]`` of ``sub``, on ``hosts``): GPUs, trays used,
        rails driven, smallest stage-1 value of a tray holding >= 2 GPUs, slowest used tray, and
        the tray histogram (trays holding 1..G GPUs)."""
        counts = np.bitwise_count(sub).astype(np.int64)
        used = counts > 0
        red = np.add.reduceat
        s1 = self.stage1[hosts[None, :], sub]
        return (red(counts, starts, axis=1), red(used.astype(np.int64), starts, axis=1),
                red(np.minimum(counts, self.rails[hosts][None, :]), starts, axis=1),
                np.minimum.reduceat(np.where(counts >= 2, s1, np.inf), starts, axis=1),
                np.minimum.reduceat(np.where(used, self.speed[hosts][None, :], np.inf), starts, axis=1),
                np.stack([red((counts == c).astype(np.int64), starts, axis=1) for c in range(1, self.max_gpus + 1)], axis=-1))

    def _delta_features(self, sub: np.ndarray, hosts: np.ndarray, starts: np.ndarray, lu: np.ndarray,
                        changed: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`_features` of every row from the first row's blocks and the ``changed`` (row,
        block) pairs' blocks, reduced as one row segmented block after block (the stage-1.5 values
        too: looked up for ~9,000 changed blocks, not every row's ~35 x 1,000)."""
        n = sub.shape[0]
        out = {k: np.repeat(x, n, axis=0) for k, x in self._features(self._block_stats(sub[:1], hosts, starts), lu).items()}
        r, b = changed
        if r.size:
            lo = starts[b]
            lens = np.r_[starts[1:], sub.shape[1]][b] - lo
            idx = ranges(lo, lens)
            part = self._block_stats(sub[np.repeat(r, lens), idx][None, :], hosts[idx], np.r_[0, np.cumsum(lens)[:-1]])
            for k, got in self._features(part, lu[b]).items():
                out[k][r, b] = got[0]
        return out

    def inside(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """Rows on >= 2 trays of one NVLink domain (stage 1.5 predicts them); ``cols``: the rows
        are given on those host columns only."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        used = masks != 0
        u = self.ix.unit if cols is None else self.ix.unit[np.asarray(cols, dtype=np.int64)]
        lo = np.where(used, u[None, :], self.ix.U).min(axis=1, initial=self.ix.U)
        one = lo == np.where(used, u[None, :], -1).max(axis=1, initial=-1)
        return one & (self.u_cls[np.minimum(lo, self.ix.U - 1)] >= 0) & (used.sum(axis=1) >= 2)

    def inside_of(self, feats: Features) -> np.ndarray:
        """:meth:`inside` of the rows whose :meth:`live_units` are ``feats``: one unit used, of a
        domain class, on >= 2 of its trays (no second pass over the rows' columns)."""
        lu, z = feats
        used = z["cnt"] > 0
        if lu.size == 0:
            return np.zeros(used.shape[0], dtype=bool)
        unit = lu[np.argmax(used, axis=1)]
        return (used.sum(axis=1) == 1) & (self.u_cls[unit] >= 0) & (z["trays"].sum(axis=1) >= 2)

    def inside_values(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """Values of :meth:`inside` rows: the one domain's in-domain value (row sums, no per-unit
        reductions: a row holds one domain, and a search asks about thousands of such rows)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        if masks.shape[0] == 0:
            return np.zeros(0)
        counts = np.bitwise_count(masks).astype(np.int64)
        hist = np.stack([(counts == c).sum(axis=1) for c in range(1, self.max_gpus + 1)], axis=1)
        hosts = np.arange(masks.shape[1]) if cols is None else np.asarray(cols, dtype=np.int64)
        s1 = self.stage1[hosts[None, :], masks]
        cap = np.where(counts >= 2, s1, np.inf).min(axis=1)
        cls = self.u_cls[self.ix.unit[hosts[np.argmax(counts > 0, axis=1)]]]
        return np.minimum(self.patterns.part_values(cls, hist), cap)

    def inside_bound(self, units: np.ndarray, k: int) -> np.ndarray:
        """Per unit an upper bound on :meth:`inside_values` of any row of ``k`` GPUs over >= 2 trays
        of it: the best uncapped part value of every multiset of >= 2 tray counts summing to ``k``
        (feasible on the unit or not; the cap only lowers a value); ``inf`` where the net, not
        stage 1.5, predicts such rows (no domain class), ``-inf`` where no such row exists."""
        units = np.asarray(units, dtype=np.int64)
        G = self.max_gpus
        hists = [np.bincount(p, minlength=G + 1)[1:] for p in _multi_parts(k, G)]
        out = np.full(units.size, -np.inf)
        cls = self.u_cls[units]
        out[cls < 0] = np.inf
        if not hists:
            return out
        H = np.array(hists, dtype=np.int64)
        for c in np.unique(cls[cls >= 0]).tolist():
            out[cls == c] = float(self.patterns.part_values(np.full(H.shape[0], c), H).max())
        return out

    def keys(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """(n,) 16-byte memo keys of rows over >= 2 units: rows whose domain tokens agree up to order
        share one (the net reads nothing else: no positional encoding, domains compared only for
        equality), so a search's many tray choices of one per-domain pattern are one forward row.
        ``cols``: the rows are given on those host columns only."""
        return self.keys_of(*self.live_units(masks, cols))  # order-free: untouched units add nothing

    def keys_of(self, lu: np.ndarray, z: dict[str, np.ndarray]) -> np.ndarray:
        """:meth:`keys` from :meth:`live_units` features (a prediction reduces its rows once for
        the memo keys and the forward's tokens: :meth:`pack`). A batch whose rows differ from its
        first row in few tokens gets the first row's key plus, per row, the mixes of its differing
        tokens minus the first row's there: sums of 64-bit words wrap, so these are the same keys
        (mixing every token of 1,000 rows x ~35 units was most of the keys' time)."""
        used = z["cnt"] > 0
        n = used.shape[0]
        if n >= DELTA_FROM:
            diff = np.zeros(used.shape, dtype=bool)
            for x in z.values():  # compared as bits (-0.0 is not 0.0 to a hash)
                x = x.view(np.uint64) if x.dtype == np.float64 else x
                diff |= x != x[:1]
            if diff.mean() <= DELTA_MAX_CHANGED:
                return self._delta_keys(lu, z, used, np.nonzero(diff))
        return mix_lanes(self._token_bits(lu, z, used, (slice(None), slice(None))), used)

    def _token_bits(self, lu: np.ndarray, z: dict[str, np.ndarray], used: np.ndarray, at: tuple) -> np.ndarray:
        """(..., 7) uint64 feature bits the keys hash, of the tokens ``at`` (an index of the (n, L)
        feature arrays: (rows, columns))."""
        cnt = z["cnt"][at]
        u = np.broadcast_to(np.arange(lu.size)[None, :], used.shape)[at]
        feats = np.stack([cnt, z["trays"][at], z["rails"][at], z["intra"][at], np.where(used[at], z["speed"][at], 0.0),
                          self.u_rail[lu][u], self.u_gtype[lu][u].astype(np.float64)], axis=-1).astype(np.float64, copy=False)
        return np.ascontiguousarray(feats).view(np.uint64)

    def _delta_keys(self, lu: np.ndarray, z: dict[str, np.ndarray], used: np.ndarray,
                    changed: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """:meth:`keys_of` from the first row's tokens and the ``changed`` (row, unit) tokens
        (row-major, as ``np.nonzero`` gives them)."""
        n, width = used.shape
        r, c = changed
        # the first row's tokens and the changed ones, mixed in one pass (numpy calls, not cells,
        # are most of the cost of a few thousand tokens)
        at = (np.r_[np.zeros(width, dtype=np.int64), r], np.r_[np.arange(width), c])
        h = np.where(used[at][:, None], mix_tokens(self._token_bits(lu, z, used, at)), np.uint64(0))
        h0, new = h[:width], h[width:]
        with np.errstate(over="ignore"):
            out = np.repeat(h0.sum(axis=0, dtype=np.uint64)[None, :], n, axis=0)
            if r.size:
                starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
                out[r[starts]] += np.add.reduceat(new - h0[c], starts, axis=0)
        return np.ascontiguousarray(out).view(np.dtype((np.void, 16))).ravel()

    def tokens(self, masks: np.ndarray, cols: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Padded unit tokens of rows over >= 2 units (``pad`` True = padding), as ``host_tokens``;
        ``cols``: the rows are given on those host columns only."""
        return self.pack(*self.live_units(masks, cols))

    def pack(self, lu: np.ndarray, z: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Padded tokens from per-unit features ``z`` ((n, L) arrays over the units ``lu``)."""
        used = z["cnt"] > 0
        rows, live = np.nonzero(used)
        us = lu[live]  # units ascending, as over every unit
        n_used = used.sum(axis=1)
        start = np.concatenate([[0], np.cumsum(n_used)[:-1]])
        slot = np.arange(rows.size) - np.repeat(start, n_used)
        n, t = used.shape[0], max(int(n_used.max()) if n_used.size else 0, 1)
        out = {k: np.zeros((n, t)) for k in ("cnt", "intra", "speed", "trays")}
        out |= {"rail": np.ones((n, t)), "rails": np.ones((n, t)), "pad": np.ones((n, t), dtype=bool),
                "gtype": np.zeros((n, t), dtype=np.int64), "dom": np.zeros((n, t), dtype=np.int64)}
        for k in ("cnt", "intra", "trays", "rails", "speed"):
            out[k][rows, slot] = z[k][rows, live]
        out["rail"][rows, slot] = self.u_rail[us]
        out["gtype"][rows, slot] = self.u_gtype[us] + 1  # 0 = padding
        out["dom"][rows, slot] = us
        out["pad"][rows, slot] = False
        out["xdom"] = (n_used > 1).astype(np.float64)
        return out


def _multi_parts(k: int, G: int) -> list[list[int]]:
    """Partitions of ``k`` into >= 2 parts of at most ``G`` (descending parts)."""
    out: list[list[int]] = []

    def rec(left: int, top: int, acc: list[int]) -> None:
        if left == 0:
            if len(acc) >= 2:
                out.append(acc.copy())
            return
        for c in range(min(top, left), 0, -1):
            acc.append(c)
            rec(left - c, c, acc)
            acc.pop()

    rec(k, G, [])
    return out
