"""The dispatcher: given free GPUs, running jobs and ``k``, return the ``k`` GPUs with the highest
contention-aware bandwidth ``B̂(S, τ)`` (paper Sec. III, IV-C, IV-D).

    from bandpilot.dispatch.dispatcher import Dispatcher
    d = Dispatcher(model)                       # a Surrogate, or a fabric (perfect predictor)
    sel = d.select(8, state)                    # algorithm="bandpilot"
    sel.gpus, sel.predicted_gbps, sel.to_dict()

``model`` is any object with ``spec``, ``stage1`` and ``predict_masks`` (see
:mod:`bandpilot.dispatch.contention`). Algorithms:

===========  ================================================================================
bandpilot    count-vector search when tractable, else EHA + PTS + local search (:mod:`~bandpilot.dispatch.search`)
eha, pts     the paper's two search components on their own
topo         Slurm-like compactness (fewest hosts, best fit, best link classes)
block        Slurm topology/block-like: best-fit block (NVLink domain), then compact
default      proximity: host order, then NUMA/index order
random       ``k`` free GPUs at random (seeded: same seed + same request -> same answer)
ideal        ``bandpilot`` guided by the true fabric (``fabric=``): Ideal-BP
exact        true optimum by enumeration (``fabric=``); raises if intractable
===========  ================================================================================

Constraints (batch queue): ``single_host`` (all ``k`` GPUs on one host), ``allowed_hosts``
(only these hosts), ``min_gbps`` (reject results predicted below it), and for domains
``single_domain`` (one domain), ``whole_domains`` (only wholly free domains) and ``segment``
(NVLink-domain clusters: every domain's share a multiple of it, so each segment stays in one
domain; it must divide ``k``). Like a Kubernetes scheduler, hosts are filtered first (free mask
restricted), then candidates are scored.

Errors are :class:`PlacementError` with ``reason``: ``insufficient_gpus`` (k > free GPUs),
``constraint_unmet`` (feasible after filtering < k, no single host fits, below ``min_gbps``) and
``invalid_request`` (bad k, malformed state, unknown algorithm/constraint, exact intractable).
"""

from __future__ import annotations

import copy

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bandpilot.dispatch.baselines import block_select, default_select, random_select, topo_select
from bandpilot.topology.cluster import ClusterSpec, popcount
from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.errors import ModelError, PlacementError, SpecError, StateError
from bandpilot.dispatch.search import (
    IntractableError,
    SearchContext,
    bandpilot,
    domain_exact,
    eha,
    exact,
    pts,
    single_host,
)
from bandpilot.dispatch.state import State

__all__ = ["ALGORITHMS", "Constraints", "Dispatcher", "IntractableError", "PlacementError", "Selection"]

MODEL_ALGORITHMS = ("bandpilot", "eha", "pts")
BASELINES = ("topo", "default", "random", "block")
ORACLES = ("ideal", "exact")
ALGORITHMS = MODEL_ALGORITHMS + BASELINES + ORACLES


@dataclass
class Selection:
    """The chosen GPUs and what the model thinks of them."""

    gpus: list[str]
    predicted_gbps: float  # B̂(S, τ) under the model (ideal/exact: the true value)
    standalone_gbps: float  # B̂(S)
    algorithm: str
    search_ms: float
    evaluations: int  # rows passed to predict_masks
    k: int = 0
    mask: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False, compare=False)
    #: with a shape: ranks (GPU per rank, Megatron order), per-axis GB/s, step time (shaped.placement_dict)
    placement: dict[str, Any] | None = None

    @property
    def ranks(self) -> list[str] | None:
        return None if self.placement is None else list(self.placement["ranks"])

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(g.rpartition(":")[0] for g in self.gpus))

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": list(self.gpus),
            "k": self.k,
            "hosts": self.hosts,
            "predicted_gbps": round(float(self.predicted_gbps), 6),
            "standalone_gbps": round(float(self.standalone_gbps), 6),
            "algorithm": self.algorithm,
            "search_ms": round(float(self.search_ms), 3),
            "evaluations": int(self.evaluations),
            **(self.placement or {}),
        }


@dataclass(frozen=True)
class Constraints:
    single_host: bool = False
    allowed_hosts: tuple[str, ...] | None = None
    min_gbps: float | None = None
    single_domain: bool = False
    whole_domains: bool = False
    segment: int | None = None

    KEYS = ("single_host", "allowed_hosts", "min_gbps", "single_domain", "whole_domains", "segment")

    @classmethod
    def parse(cls, value: Any) -> Constraints:
        if value is None:
            return cls()
        if isinstance(value, Constraints):
            return value
        if not isinstance(value, Mapping):
            value = {k: getattr(value, k) for k in cls.KEYS if hasattr(value, k)}
        unknown = set(value) - set(cls.KEYS)
        if unknown:
            raise PlacementError("invalid_request", f"unknown constraints {sorted(unknown)}; known: {list(cls.KEYS)}")
        sh = value.get("single_host", False)
        if sh is None:
            sh = False
        if not isinstance(sh, bool):
            raise PlacementError("invalid_request", f"constraint single_host must be true/false, got {sh!r}")
        ah = value.get("allowed_hosts")
        if ah is not None:
            if isinstance(ah, str) or not all(isinstance(x, str) for x in ah):
                raise PlacementError("invalid_request", "constraint allowed_hosts must be a list of host names")
            ah = tuple(ah)
        mg = value.get("min_gbps")
        if mg is not None:
            if isinstance(mg, bool) or not isinstance(mg, (int, float)) or not np.isfinite(mg) or mg < 0:
                raise PlacementError("invalid_request", f"constraint min_gbps must be a finite number >= 0, got {mg!r}")
            mg = float(mg)
        flags = {}
        for key in ("single_domain", "whole_domains"):
            v = value.get(key, False)
            if v is None:
                v = False
            if not isinstance(v, bool):
                raise PlacementError("invalid_request", f"constraint {key} must be true/false, got {v!r}")
            flags[key] = v
        seg = value.get("segment")
        if seg is not None and (isinstance(seg, bool) or not isinstance(seg, (int, np.integer)) or seg < 1):
            raise PlacementError("invalid_request", f"constraint segment must be a positive integer (GPUs), got {seg!r}")
        return cls(sh, ah, mg, flags["single_domain"], flags["whole_domains"], None if seg is None else int(seg))


def _check_model(model: Any, what: str = "model") -> ClusterSpec:
    for attr in ("spec", "stage1", "predict_masks"):
        if not hasattr(model, attr):
            raise ModelError(f"{what} {type(model).__name__} has no {attr!r} (need spec, stage1, predict_masks)")
    spec = model.spec
    if not isinstance(spec, ClusterSpec):
        raise ModelError(f"{what}.spec is not a ClusterSpec")
    shape = np.shape(model.stage1)
    need = 1 << int(spec.gpus_per_host.max())
    if len(shape) != 2 or shape[0] != spec.n_hosts or shape[1] < need:
        raise ModelError(f"{what}.stage1 has shape {shape}, expected ({spec.n_hosts}, {need})")
    return spec


class Dispatcher:
    """Contention-aware GPU dispatcher guided by one bandwidth model."""

    def __init__(self, model: Any, seed: int = 0, frag_tie: float | None = None, locality: float = 0.0) -> None:
        self.spec = _check_model(model)
        self.model = model
        self.seed = int(seed)
        #: NVLink-domain clusters: relative bandwidth margin within which the least fragmenting
        #: candidate wins (None: :data:`bandpilot.dispatch.search.domains.DOMAIN_TIE`)
        self.frag_tie = frag_tie
        if not (0.0 <= locality < 1.0):
            raise ValueError(f"locality must be in [0, 1), got {locality!r}")
        #: relative predicted-bandwidth gain below which a placement on fewer hosts is preferred
        self.locality = float(locality)
        from bandpilot.topology.domains import domain_index

        self._domains = domain_index(self.spec.hosts)[0]
        #: shaped requests: also seed the shape search with the bandwidth-only set (better step
        #: times on busy clusters, at the cost of one bandwidth-only search per select)
        self.shape_bandwidth_seed = True

    def with_locality(self, locality: float) -> "Dispatcher":
        """The same dispatcher (model, caches) scoring with another locality margin."""
        if locality == self.locality:
            return self
        if not (0.0 <= locality < 1.0):
            raise ValueError(f"locality must be in [0, 1), got {locality!r}")
        other = copy.copy(self)
        other.locality = float(locality)
        return other

    @classmethod
    def load(cls, model_uri: str, seed: int = 0) -> Dispatcher:
        """A dispatcher for a stored surrogate (``models:/name@alias``, ``runs:/...``, a path)."""
        from bandpilot.model.surrogate import Surrogate  # lazy: pulls in torch

        return cls(Surrogate.load(model_uri), seed=seed)

    # ------------------------------------------------------------------------------------
    def _state(self, state: State | Mapping[str, Any]) -> State:
        if isinstance(state, State):
            if state.spec is not self.spec and state.spec.fingerprint() != self.spec.fingerprint():
                raise PlacementError(
                    "invalid_request",
                    f"state is for cluster {state.spec.name!r}, the model for {self.spec.name!r}",
                )
            return state
        try:
            return State.from_dict(self.spec, state)
        except StateError as exc:
            raise PlacementError("invalid_request", f"invalid state: {exc}") from None

    def _filter(self, state: State, k: int, cons: Constraints) -> np.ndarray:
        free = state.free.copy()
        if cons.allowed_hosts is not None:
            unknown = [h for h in cons.allowed_hosts if h not in self.spec.host_index]
            if unknown:
                raise PlacementError("invalid_request", f"allowed_hosts names unknown hosts {unknown[:3]}")
            keep = np.zeros(self.spec.n_hosts, dtype=bool)
            keep[[self.spec.host_index[h] for h in cons.allowed_hosts]] = True
            free = np.where(keep, free, 0)
        if cons.single_host:
            fits = popcount(free) >= k
            free = np.where(fits, free, 0)
        if cons.segment is not None:
            if not self.spec.nvlink_domains:
                raise PlacementError("invalid_request", f"constraint segment needs NVLink domains; cluster {self.spec.name!r} has none")
            if k % cons.segment:
                raise PlacementError("invalid_request", f"segment {cons.segment} does not divide k={k}")
        if cons.whole_domains or cons.single_domain:
            dom = self._domains
            per = np.bincount(dom, weights=popcount(free), minlength=int(dom.max()) + 1)
            if cons.whole_domains:  # every GPU of the domain free (and allowed)
                size = np.bincount(dom, weights=self.spec.gpus_per_host, minlength=per.size)
                free = np.where((per == size)[dom], free, 0)
                per = np.where(per == size, per, 0)
            if cons.single_domain:
                free = np.where((per >= k)[dom], free, 0)
        n = int(popcount(free).sum())
        if n < k:
            what = []
            if cons.allowed_hosts is not None:
                what.append(f"allowed_hosts ({len(cons.allowed_hosts)} hosts)")
            if cons.single_host:
                what.append("single_host")
            if cons.whole_domains:
                what.append("whole_domains")
            if cons.single_domain:
                what.append("single_domain")
            raise PlacementError(
                "constraint_unmet",
                f"only {n} of {state.n_free} free GPUs satisfy {' and '.join(what)}; {k} requested",
            )
        return free

    def _oracle(self, fabric: Any, algorithm: str) -> Any:
        guide = fabric
        if guide is None:
            from bandpilot.fabric.base import Fabric

            if isinstance(self.model, Fabric):
                guide = self.model
            else:
                raise PlacementError("invalid_request", f"algorithm {algorithm!r} needs fabric= (the true bandwidth)")
        try:
            spec = _check_model(guide, "fabric")
        except ModelError as exc:
            raise PlacementError("invalid_request", str(exc)) from None
        if spec is not self.spec and spec.fingerprint() != self.spec.fingerprint():
            raise PlacementError("invalid_request", f"fabric is for cluster {spec.name!r}, the model for {self.spec.name!r}")
        return guide

    def _rng(self, k: int, state: State) -> np.random.Generator:
        key = zlib.crc32(state.free.astype("<i8").tobytes())
        return np.random.default_rng([self.seed & 0xFFFFFFFF, k, key])

    # ------------------------------------------------------------------------------------
    def select(
        self,
        k: int,
        state: State | Mapping[str, Any],
        algorithm: str | None = None,
        *,
        fabric: Any = None,
        constraints: Any = None,
        shape: Any = None,
    ) -> Selection:
        """The ``k`` GPUs ``algorithm`` picks under ``state``; see the module docstring. With a
        ``shape`` (:class:`bandpilot.dispatch.shape.Shape` or its text / mapping) the result also
        carries the rank map and per-axis figures (:mod:`bandpilot.dispatch.shaped`)."""
        t0 = time.perf_counter()
        if shape is not None:
            return self._select_shaped(k, state, algorithm or "shape", constraints, shape, t0)
        algorithm = algorithm or "bandpilot"
        if algorithm not in ALGORITHMS:
            raise PlacementError("invalid_request", f"unknown algorithm {algorithm!r}; choose from {list(ALGORITHMS)}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise PlacementError("invalid_request", f"k must be a positive integer, got {k!r}")
        k = int(k)
        if k <= 0:
            raise PlacementError("invalid_request", f"k must be a positive integer, got {k}")
        st = self._state(state)
        cons = Constraints.parse(constraints)
        guide = self._oracle(fabric, algorithm) if algorithm in ORACLES else self.model
        if k > st.n_free:
            n = st.spec.n_gpus
            raise PlacementError("insufficient_gpus", f"{k} GPUs requested but cluster {st.spec.name} has {n} GPUs" if k > n
                                 else f"{k} GPUs requested but only {st.n_free} of the cluster's {n} GPUs are free")
        free = self._filter(st, k, cons)
        pred = ContentionPredictor(guide, st)

        if algorithm in BASELINES:
            if algorithm == "random":
                rng = self._rng(k, st)
                if cons.single_host:
                    fits = np.flatnonzero(popcount(free) >= k)
                    h = int(fits[rng.integers(fits.size)])
                    free = np.where(np.arange(free.size) == h, free, 0)
                mask = random_select(self.spec, free, k, rng)
            elif algorithm == "default":
                if cons.single_host:  # first host (in order) that fits
                    h = int(np.flatnonzero(popcount(free) >= k)[0])
                    free = np.where(np.arange(free.size) == h, free, 0)
                mask = default_select(self.spec, free, k)
            elif algorithm == "block":
                mask = block_select(self.spec, free, k, cons.segment)
            else:
                mask = topo_select(self.spec, free, k)
            p = pred.predict(mask[None, :])
            value, solo = float(p.value[0]), float(p.standalone[0])
        else:
            got = self._search(algorithm, guide, st, free, k, pred, cons)
            mask, value, solo = got.mask, got.value, got.standalone

        mask = np.asarray(mask, dtype=np.int64)
        if np.any(mask & ~free) or int(popcount(mask).sum()) != k:  # never hand out a busy GPU
            raise AssertionError(f"{algorithm} produced an invalid allocation {self.spec.from_mask(mask)}")
        if cons.single_domain and np.unique(self._domains[mask != 0]).size != 1:
            raise AssertionError(f"{algorithm} spread a single_domain request over several domains")
        if cons.min_gbps is not None and value < cons.min_gbps:
            raise PlacementError(
                "constraint_unmet",
                f"best {algorithm} allocation for k={k} is predicted at {value:.1f} GB/s, below min_gbps={cons.min_gbps:g}",
            )
        return Selection(
            gpus=self.spec.from_mask(mask),
            predicted_gbps=value,
            standalone_gbps=solo,
            algorithm=algorithm,
            search_ms=(time.perf_counter() - t0) * 1e3,
            evaluations=pred.evaluations,
            k=k,
            mask=mask,
        )

    def _select_shaped(self, k: Any, state: Any, algorithm: str, constraints: Any, shape: Any, t0: float) -> Selection:
        from bandpilot.dispatch.shape import Shape
        from bandpilot.dispatch.shaped import placement_dict, shaped_select

        shp = Shape.parse(shape)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise PlacementError("invalid_request", f"k must be a positive integer, got {k!r}")
        shp.check_k(int(k))
        st = self._state(state)
        cons = Constraints.parse(constraints)
        if shp.k > st.n_free:
            raise PlacementError("insufficient_gpus", f"{shp.k} GPUs requested but only {st.n_free} are free")
        if cons.segment is not None:
            raise PlacementError("invalid_request", "constraint segment does not combine with a shape: the shape's "
                                 "TP groups are the segments")
        free = self._filter(st, shp.k, cons)
        pred = ContentionPredictor(self.model, st)
        # single_host / single_domain: one shaped search per host / domain that fits, the fastest wins
        label = np.arange(self.spec.n_hosts) if cons.single_host else self._domains if cons.single_domain else None
        parts = [free] if label is None else [np.where(label == u, free, 0) for u in np.unique(label[popcount(free) > 0])]
        place = None
        for sub in parts:
            if int(popcount(sub).sum()) < shp.k:
                continue
            got, _ = shaped_select(self.spec, sub, shp, algorithm, pred,
                                   lambda sub=sub: self._search("bandpilot", self.model, st, sub, shp.k, pred,
                                                                Constraints(cons.single_host)).mask,
                                   self.shape_bandwidth_seed)
            if place is None or got.step_ms < place.step_ms:
                place = got
        assert place is not None  # _filter left at least one part that fits
        mask = place.mask(self.spec.n_hosts)
        if np.any(mask & ~free) or int(popcount(mask).sum()) != shp.k or len(set(zip(place.hosts, place.idx))) != shp.k:
            raise AssertionError(f"{algorithm} produced an invalid shaped allocation")
        p = pred.predict(mask[None, :])
        value, solo = float(p.value[0]), float(p.standalone[0])
        if cons.min_gbps is not None and value < cons.min_gbps:
            raise PlacementError("constraint_unmet", f"best {algorithm} allocation for k={shp.k} is predicted at "
                                 f"{value:.1f} GB/s, below min_gbps={cons.min_gbps:g}")
        return Selection(gpus=self.spec.from_mask(mask), predicted_gbps=value, standalone_gbps=solo, algorithm=algorithm,
                         search_ms=(time.perf_counter() - t0) * 1e3, evaluations=pred.evaluations, k=shp.k, mask=mask,
                         placement=placement_dict(place, self.spec, shp))

    def _search(self, algorithm: str, guide: Any, st: State, free: np.ndarray, k: int,
                pred: ContentionPredictor, cons: Constraints) -> Any:
        if cons.single_domain and not self.spec.nvlink_domains:
            # plain clusters: one search per domain label that can hold k, the best wins
            best = None
            for d in np.unique(self._domains[popcount(free) > 0]):
                sub = np.where(self._domains == d, free, 0)
                if int(popcount(sub).sum()) < k:
                    continue
                got = self._search(algorithm, guide, st, sub, k, pred, Constraints(cons.single_host))
                if best is None or got.value > best.value:
                    best = got
            assert best is not None  # _filter left only domains that fit
            return best
        ctx = SearchContext(guide, st, free, k, predictor=pred)
        ctx.segment = cons.segment
        ctx.tie = self.frag_tie
        ctx.locality = self.locality
        if cons.single_host:
            return single_host(ctx)
        if algorithm in ("bandpilot", "ideal"):
            return bandpilot(ctx)
        if algorithm == "eha":
            return eha(ctx)
        if algorithm == "pts":
            return pts(ctx)
        return domain_exact(ctx) if self.spec.nvlink_domains else exact(ctx)

    def predict(self, gpus: list[str], state: State | Mapping[str, Any]) -> dict[str, Any]:
        """``B̂(S, τ)`` breakdown of a given allocation under the model (what-if / debugging)."""
        st = self._state(state)
        try:
            mask = self.spec.to_mask(gpus, "allocation")
        except SpecError as exc:
            raise PlacementError("invalid_request", str(exc)) from None
        return ContentionPredictor(self.model, st).explain(mask)
