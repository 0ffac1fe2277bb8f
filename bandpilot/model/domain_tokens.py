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
from bandpilot.model.canonical import mix_lanes
from bandpilot.fabric.units import unit_index
from bandpilot.model.domain_patterns import DomainPatterns
from bandpilot.topology.cluster import ClusterSpec


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

    def _live(self, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Units some row touches, their hosts (unit by unit) and each unit's start among them: a
        search's rows touch a few of the units (a 4,096-GPU batch: ~60 of 139 domains), and every
        other unit's features are 0 in every row."""
        ix = self.ix
        lu = np.flatnonzero(ix.any(masks.any(axis=0)[None, :])[0])
        cols = np.concatenate([ix.members[u] for u in lu]) if lu.size else np.zeros(0, dtype=np.int64)
        return lu, cols, np.r_[0, np.cumsum(ix.n_members[lu])[:-1]].astype(np.int64)

    def _units(self, masks: np.ndarray) -> dict[str, np.ndarray]:
        """(n, U) per-unit GPU count, trays used, rails driven, in-domain value (0: one GPU)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n, U = masks.shape[0], self.ix.U
        lu, cols, starts = self._live(masks)
        sub = masks[:, cols]
        counts = np.bitwise_count(sub).astype(np.int64)
        used = counts > 0

        def per_unit(x: np.ndarray, how=np.add, fill: float = 0) -> np.ndarray:
            out = np.full((n, U), fill, dtype=x.dtype)
            if lu.size:
                out[:, lu] = how.reduceat(x, starts, axis=1)
            return out

        ucnt = per_unit(counts)
        trays = per_unit(used.astype(np.int64))
        urails = per_unit(np.minimum(counts, self.rails[cols][None, :]))
        s1 = self.stage1[cols[None, :], sub]
        cap = per_unit(np.where(counts >= 2, s1, np.inf), np.minimum, np.inf)
        intra = np.where(ucnt >= 2, cap, 0.0)
        multi = (trays >= 2) & (self.u_cls[None, :] >= 0)
        if multi.any():
            r, u = np.nonzero(multi)
            hist = np.stack([per_unit((counts == c).astype(np.int64))[r, u] for c in range(1, self.max_gpus + 1)], axis=1)
            intra[r, u] = np.minimum(self.patterns.part_values(self.u_cls[u], hist), cap[r, u])
        speed = per_unit(np.where(used, self.speed[cols][None, :], np.inf), np.minimum, np.inf)
        return {"cnt": ucnt, "trays": trays, "rails": urails, "intra": intra, "speed": speed}

    def inside(self, masks: np.ndarray) -> np.ndarray:
        """Rows on >= 2 trays of one NVLink domain (stage 1.5 predicts them)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        on = self.ix.any(masks)
        one = on.sum(axis=1) == 1
        u = on.argmax(axis=1)
        return one & (self.u_cls[u] >= 0) & ((masks != 0).sum(axis=1) >= 2)

    def inside_values(self, masks: np.ndarray) -> np.ndarray:
        """Values of :meth:`inside` rows: the one domain's in-domain value (row sums, no per-unit
        reductions: a row holds one domain, and a search asks about thousands of such rows)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        if masks.shape[0] == 0:
            return np.zeros(0)
        counts = np.bitwise_count(masks).astype(np.int64)
        hist = np.stack([(counts == c).sum(axis=1) for c in range(1, self.max_gpus + 1)], axis=1)
        s1 = self.stage1[np.arange(masks.shape[1])[None, :], masks]
        cap = np.where(counts >= 2, s1, np.inf).min(axis=1)
        cls = self.u_cls[self.ix.unit[np.argmax(counts > 0, axis=1)]]
        return np.minimum(self.patterns.part_values(cls, hist), cap)

    def keys(self, masks: np.ndarray) -> np.ndarray:
        """(n,) 16-byte memo keys of rows over >= 2 units: rows whose domain tokens agree up to order
        share one (the net reads nothing else: no positional encoding, domains compared only for
        equality), so a search's many tray choices of one per-domain pattern are one forward row."""
        z = self._units(masks)
        used = z["cnt"] > 0
        n, u = used.shape
        feats = np.stack([z["cnt"], z["trays"], z["rails"], z["intra"], np.where(used, z["speed"], 0.0),
                          np.broadcast_to(self.u_rail, (n, u)), np.broadcast_to(self.u_gtype.astype(np.float64), (n, u))],
                         axis=-1)
        return mix_lanes(np.ascontiguousarray(feats).view(np.uint64), used)

    def tokens(self, masks: np.ndarray) -> dict[str, np.ndarray]:
        """Padded unit tokens of rows over >= 2 units (``pad`` True = padding), as ``host_tokens``."""
        z = self._units(masks)
        used = z["cnt"] > 0
        rows, cols = np.nonzero(used)
        n_used = used.sum(axis=1)
        start = np.concatenate([[0], np.cumsum(n_used)[:-1]])
        slot = np.arange(rows.size) - np.repeat(start, n_used)
        n, t = used.shape[0], max(int(n_used.max()) if n_used.size else 0, 1)
        out = {k: np.zeros((n, t)) for k in ("cnt", "intra", "speed", "trays")}
        out |= {"rail": np.ones((n, t)), "rails": np.ones((n, t)), "pad": np.ones((n, t), dtype=bool),
                "gtype": np.zeros((n, t), dtype=np.int64), "dom": np.zeros((n, t), dtype=np.int64)}
        for k in ("cnt", "intra", "trays", "rails", "speed"):
            out[k][rows, slot] = z[k][rows, cols]
        out["rail"][rows, slot] = self.u_rail[cols]
        out["gtype"][rows, slot] = self.u_gtype[cols] + 1  # 0 = padding
        out["dom"][rows, slot] = cols
        out["pad"][rows, slot] = False
        out["xdom"] = (n_used > 1).astype(np.float64)
        return out
