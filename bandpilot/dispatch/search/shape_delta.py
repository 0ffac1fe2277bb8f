"""Incremental scoring of moved placements: re-score only the groups a move touches.

A refinement round scores many neighbours of one placement (the base), and a non-local move
changes one TP group or one host's ranks, yet :func:`bandpilot.dispatch.search.shape.score`
re-plans every group of every axis of every neighbour. Here the base is scored once per round (the
winner's scorer is the next round's base), its per-group figures kept, and a neighbour's group is

* **changed** when its own GPUs changed: new standalone row, contenders and tenant rows;
* **touched** when changed, or (a spanning group) a changed group of its axis sits on one of its
  hosts before or after the move: its sibling set, their standalone bandwidth and its sibling row
  (the axis's spanning GPUs on its hosts) can only change there. (Not the union's bits alone: PP
  groups share a stage's ranks, so a changed sibling may leave the union as it was.) A touched
  group's sibling row goes to the model only if it differs from the base's.

Untouched groups keep the base's value. The new rows of all neighbours and axes go into ONE model
call, and the step time is summed in ``score``'s order, so a neighbour's figure equals its full
re-score exactly (``tests/test_shape_delta.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement, group_masks, BatchRows, group_ranks
from bandpilot.dispatch.shape import Shape

Finish = Callable[[np.ndarray], dict[str, np.ndarray]]


def _wide(M: np.ndarray, cols: np.ndarray, n_hosts: int) -> np.ndarray:
    out = np.zeros((M.shape[0], n_hosts), dtype=np.int64)
    out[:, cols] = M
    return out


def _axis(pred: ContentionPredictor, M3: np.ndarray, cols: np.ndarray, spans3: np.ndarray, changed: np.ndarray,
          touched: np.ndarray, base: dict[str, np.ndarray] | None, rows: BatchRows) -> Finish:
    """Queue the model rows of one axis's changed / touched groups (``M3``: ``(C, n, len(cols))``,
    masks on the host columns ``cols``; rows go to the model full width); the returned function
    turns the model's values into the touched groups' figures (the contention rule of
    ``shape.group_values``, in its order of operations)."""
    C, n, _ = M3.shape
    used3 = M3 != 0
    cc, cg = np.nonzero(changed)
    Mc, usedc = _wide(M3[cc, cg], cols, pred.spec.n_hosts), used3[cc, cg]
    single = usedc.sum(axis=1) == 1
    h = cols[np.argmax(usedc, axis=1)]
    stage1 = pred.model.stage1[h[single], Mc[single, h[single]]]
    s_solo = rows.add(Mc[~single])
    cont = pred.contenders(Mc)
    ri, ji = np.nonzero(cont)
    s_ten = rows.add(Mc[ri] | pred.job_masks[ji])
    tdem_c = cont.astype(float) @ pred.job_demand
    # siblings (as in shape._plan_axis): other spanning groups sharing a host, on the job's hosts
    inc = used3[:, :, M3.any(axis=(0, 1))].astype(np.float32)
    share3 = (inc @ inc.transpose(0, 2, 1) > 0.5) & spans3[:, :, None] & spans3[:, None, :]
    share3[:, np.arange(n), np.arange(n)] = False
    ti, tg = np.nonzero(touched)
    share = share3[ti, tg]
    has = share.any(axis=1)
    union = np.bitwise_or.reduce(np.where(spans3[:, :, None], M3, 0), axis=1)  # (C, hosts)
    sibrow = np.where(used3[ti, tg], union[ti], 0) | M3[ti, tg]
    same = np.zeros(ti.size, dtype=bool)
    if base is not None:
        same = has & base["has"][tg] & (sibrow == base["sibrow"][tg][:, cols]).all(axis=1)
    new = has & ~same
    s_sib = rows.add(_wide(sibrow[new], cols, pred.spec.n_hosts))

    def finish(vals: np.ndarray) -> dict[str, np.ndarray]:
        def per_group(key: str, fill: float) -> np.ndarray:
            return np.full((C, n), fill) if base is None else np.tile(base[key], (C, 1))
        solo3, tcap3, tdem3 = per_group("solo", 0.0), per_group("tcap", np.inf), per_group("tdem", 0.0)
        sc = np.zeros(cc.size)
        sc[single] = stage1
        sc[~single] = vals[s_solo]
        tcap_c = np.full(cc.size, np.inf)
        if ri.size:
            np.minimum.at(tcap_c, ri, vals[s_ten])
        solo3[cc, cg], tcap3[cc, cg], tdem3[cc, cg] = sc, tcap_c, tdem_c
        sibval = np.full(ti.size, np.inf)
        if base is not None:
            sibval[same] = base["sibval"][tg[same]]
        sibval[new] = vals[s_sib]
        solo, cap = solo3[ti, tg], tcap3[ti, tg]
        cap[has] = np.minimum(cap[has], sibval[has])
        sib = np.where(spans3, solo3, 0.0)
        demand = solo + tdem3[ti, tg] + (share * sib[ti]).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            shared = np.where(demand > 0, solo / demand * cap, 0.0)
        return {"value": np.where(demand <= cap, solo, shared), "solo": solo, "tcap": tcap3[ti, tg],
                "tdem": tdem3[ti, tg], "has": has, "sibrow": _wide(sibrow, cols, pred.spec.n_hosts),
                "sibval": sibval}
    return finish


class MoveScorer:
    """The base placement's per-group figures, to score its neighbours by their touched groups."""

    def __init__(self, pred: ContentionPredictor, shape: Shape, base: Placement) -> None:
        """Score ``base`` in full (its figures as :func:`score` fills them) and keep its groups'; a
        base fully scored by :func:`score` with this predictor and shape hands over its groups'
        figures instead (the same numbers: no model call)."""
        self.pred, self.shape, self.placement = pred, shape, base
        self.vol, self.compute = shape.volumes()
        self.granks = {a: g for a, g in group_ranks(shape).items() if a in self.vol}
        self._last: dict[str, Any] | None = None
        #: model rows the last :meth:`step_ms` call sent (a pass's row budget counts these)
        self.rows_sent = 0
        if base.groups is not None and base.groups[0] is pred and base.groups[1] == shape:
            self.base = base.groups[2]()
            self._fill()
            return
        rows = BatchRows()
        pending: dict[str, tuple[np.ndarray, np.ndarray, Finish]] = {}
        cols = np.arange(pred.spec.n_hosts)
        for a, g in self.granks.items():
            M3 = group_masks(base.hosts[None, :], base.idx[None, :], g, pred.spec.n_hosts)
            spans3 = pred._spans(M3[0])[None, :]
            every = np.ones(spans3.shape, dtype=bool)
            pending[a] = (M3[0], spans3[0], _axis(pred, M3, cols, spans3, every, every, None, rows))
        vals = rows.run(pred)
        self.base = {a: {"M": M, "spans": spans, **finish(vals)} for a, (M, spans, finish) in pending.items()}
        self._fill()

    def _fill(self) -> None:
        """The base placement's figures from its groups', as :func:`score` fills them."""
        base = self.placement
        base.compute_ms = self.compute
        base.axis_gbps = {a: float(b["value"].min()) for a, b in self.base.items()}
        base.comm_ms = {a: self.vol[a] / (v * 1e9) * 1e3 if v > 0 else float("inf") for a, v in base.axis_gbps.items()}
        base.step_ms = self.compute + sum(base.comm_ms.values())

    def step_ms(self, H: np.ndarray, Ix: np.ndarray) -> np.ndarray:
        """Predicted step time of each neighbour ``(H[j], Ix[j])``, equal to ``score``'s."""
        C = H.shape[0]
        rows = BatchRows()
        # the hosts the base and its neighbours use: narrow masks (a job's 16-32 of 128 hosts)
        cols = np.unique(np.concatenate([H.ravel(), self.placement.hosts]))
        Hc = np.searchsorted(cols, H)
        pending = {a: self._plan(a, group_masks(Hc, Ix, g, cols.size), cols, rows) for a, g in self.granks.items()}
        vals = rows.run(self.pred)
        self.rows_sent = rows.n
        total = np.zeros(C)
        self._last = {"H": H, "Ix": Ix}
        for a, (ti, tg, keep, finish) in pending.items():
            bw = keep.copy()
            got = finish(vals)
            self._last[a] = (ti, tg, got)
            np.minimum.at(bw, ti, got["value"])
            with np.errstate(divide="ignore"):
                comm = np.where(bw > 0, self.vol[a] / (bw * 1e9) * 1e3, np.inf)
            total = total + comm
        return self.compute + total

    def best_move(self, H: np.ndarray, Ix: np.ndarray, label: str) -> MoveScorer | None:
        """The scorer of the fastest neighbour (scored in full, labelled ``label``) if it is predicted
        faster than the base; None at a local optimum (as ``shape_refine.best_move``)."""
        if not H.shape[0]:
            return None
        step = self.step_ms(H, Ix)
        j = int(np.argmin(step))  # the first of equals, as ``min`` there
        if not step[j] < self.placement.step_ms * (1 - 1e-9):
            return None
        return self.child(j, label)

    def child(self, j: int, label: str) -> MoveScorer:
        """The scorer of neighbour ``j`` of the last :meth:`step_ms` call, from the base's groups and
        the neighbour's touched groups (an untouched group's inputs are the base's, so are its
        figures): no model call."""
        assert self._last is not None
        out = object.__new__(MoveScorer)
        out.pred, out.shape, out.vol, out.compute, out.granks = self.pred, self.shape, self.vol, self.compute, self.granks
        H, Ix = self._last["H"], self._last["Ix"]
        out.placement = Placement(H[j], Ix[j], label=label)
        out.base = {}
        for a, g in self.granks.items():
            ti, tg, got = self._last[a]
            at = ti == j
            b = {k: v.copy() for k, v in self.base[a].items()}
            b["M"] = group_masks(H[j:j + 1], Ix[j:j + 1], g, self.pred.spec.n_hosts)[0]
            b["spans"][tg[at]] = self.pred._spans(b["M"][tg[at]])
            for k, v in got.items():
                b[k][tg[at]] = v[at]
            out.base[a] = b
        out._fill()
        out._last = None
        out.rows_sent = 0
        # the next pass's scorer starts from these figures (read only there: children copy them)
        out.placement.groups = (self.pred, self.shape, lambda: out.base)
        return out

    def _plan(self, a: str, M3: np.ndarray, cols: np.ndarray, rows: BatchRows
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Finish]:
        """Axis ``a``'s touched groups (their neighbour index), each neighbour's slowest untouched
        group, and the touched groups' pending figures."""
        b = self.base[a]
        C, n, _ = M3.shape
        bM = b["M"][:, cols]
        changed = (M3 != bM[None]).any(axis=2)
        spans3 = np.tile(b["spans"], (C, 1))
        ci, gi = np.nonzero(changed)
        spans3[ci, gi] = self.pred._spans(_wide(M3[ci, gi], cols, self.pred.spec.n_hosts))
        used3 = M3 != 0
        # hosts a changed group leaves or enters: the spanning groups there are touched
        hit = (used3 & changed[:, :, None]).any(axis=1) | (changed[:, :, None] & (bM != 0)[None]).any(axis=1)
        touched = changed | (spans3 & (used3 & hit[:, None, :]).any(axis=2))
        keep = np.where(touched, np.inf, b["value"][None]).min(axis=1)
        return *np.nonzero(touched), keep, _axis(self.pred, M3, cols, spans3, changed, touched, b, rows)
