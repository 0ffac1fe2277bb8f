"""The dispatcher: given free GPUs, running jobs and ``k``, return the ``k`` GPUs with the highest
contention-aware bandwidth ``B̂(S, τ)`` (paper Sec. III, IV-C, IV-D).

    from bandpilot.dispatch.dispatcher import Dispatcher
    d = Dispatcher(model)                       # a Surrogate, or a fabric (perfect predictor)
    sel = d.select(8, state)                    # algorithm="bandpilot"
    sel.gpus, sel.predicted_gbps, sel.to_dict()

``model`` is a :class:`~bandpilot.dispatch.model.BandwidthModel` (``spec``, ``stage1``,
``predict_masks``). Algorithms are the strategies registered in :mod:`bandpilot.dispatch.strategies`
(``bandpilot``, ``eha``, ``pts``; the baselines ``topo``, ``default``, ``random``, ``block``; the
oracles ``ideal`` and ``exact``, which need ``fabric=``): ``select`` looks the name up there.

Constraints are :class:`~bandpilot.dispatch.constraints.Constraints` (or their JSON object):
``single_host``, ``single_domain``, ``allowed_hosts``, ``allowed_gpus``, ``min_gbps`` (reject
results predicted below it), ``whole_domains`` and ``segment``. Like a Kubernetes scheduler, the
free GPUs are filtered first (:meth:`Constraints.filter`), then candidates are scored, and the
result is checked against the same constraints (:meth:`Constraints.check_selection`).

Errors are :class:`PlacementError` with ``reason``: ``insufficient_gpus`` (k > free GPUs),
``constraint_unmet`` (feasible after filtering < k, no single host fits, below ``min_gbps``) and
``invalid_request`` (bad k, malformed state, unknown algorithm/constraint, exact intractable).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from bandpilot.dispatch import strategies
from bandpilot.dispatch.builtin_strategies import Job
from bandpilot.dispatch.constraints import Constraints
from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.model import BandwidthModel, check_model
from bandpilot.dispatch.search import Found, IntractableError
from bandpilot.dispatch.state import State
from bandpilot.dispatch.threads import one_blas_thread
from bandpilot.errors import ModelError, PlacementError, SpecError, StateError
from bandpilot.topology.cluster import popcount
from bandpilot.topology.domains import domain_index

__all__ = ["ALGORITHMS", "Constraints", "Dispatcher", "IntractableError", "PlacementError", "Selection"]

#: Every registered strategy (:mod:`bandpilot.dispatch.strategies`) at import, grouped by kind.
MODEL_ALGORITHMS = strategies.names(strategies.MODEL_GUIDED)
BASELINES = strategies.names(strategies.BASELINE)
ORACLES = strategies.names(strategies.ORACLE)
ALGORITHMS = strategies.names()


def _bandwidth_only(job: Job) -> np.ndarray:
    """The plain bandwidth search's pick for ``job`` (the shaped search's bandwidth-only candidate)."""
    return strategies.get("bandpilot").run(job).mask


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


class Dispatcher:
    """Contention-aware GPU dispatcher guided by one bandwidth model."""

    def __init__(self, model: BandwidthModel, seed: int = 0, frag_tie: float | None = None,
                 locality: float = 0.0, pricing: str = "now") -> None:
        self.spec = check_model(model)
        self.model = model
        self.seed = int(seed)
        #: NVLink-domain clusters: relative bandwidth margin within which the least fragmenting
        #: candidate wins (None: :data:`bandpilot.dispatch.search.domains.DOMAIN_TIE`)
        self.frag_tie = frag_tie
        if not (0.0 <= locality < 1.0):
            raise ValueError(f"locality must be in [0, 1), got {locality!r}")
        #: relative predicted-bandwidth gain below which a placement on fewer hosts is preferred
        self.locality = float(locality)
        #: how model-guided searches value a candidate (strategies.register_pricing: now | lifetime)
        self.pricing = pricing
        strategies.pricing(pricing)
        self._domains = domain_index(self.spec.hosts)[0]
        #: shaped requests: also seed the shape search with the bandwidth-only set (its GPU-id-order
        #: rank map competes too, so the pick is never predicted slower than bandwidth-only). None
        #: (default): when that search is cheap (:func:`bandpilot.dispatch.shaped.bandwidth_seed_cheap`:
        #: small clusters, a job inside one NVLink domain); True: always (h100-128: 3-25x the shape
        #: search's CPU); False: never
        self.shape_bandwidth_seed: bool | None = None
        #: shaped requests: refinement passes run on the shape search's pick, in order (names in
        #: :data:`bandpilot.dispatch.shaped.REFINERS`: ``local`` swaps, ``nonlocal`` group / host moves,
        #: ``repair`` spanning TP groups re-paired, ``rail`` re-deal inside units); None:
        #: :func:`bandpilot.dispatch.shaped.default_refiners` (``local`` + ``nonlocal`` + ``repair`` where
        #: units are hosts, ``local`` + ``rail`` on NVLink-domain clusters)
        self.shape_refiners: tuple[str, ...] | None = None

    def with_locality(self, locality: float) -> "Dispatcher":
        """The same dispatcher (model, caches) scoring with another locality margin."""
        if locality == self.locality:
            return self
        if not (0.0 <= locality < 1.0):
            raise ValueError(f"locality must be in [0, 1), got {locality!r}")
        other = copy.copy(self)
        other.locality = float(locality)
        return other

    def with_pricing(self, pricing: str) -> "Dispatcher":
        """The same dispatcher (model, caches) valuing candidates with another registered pricing."""
        if pricing == self.pricing:
            return self
        strategies.pricing(pricing)  # an unknown name fails here, in one line
        other = copy.copy(self)
        other.pricing = pricing
        return other

    @classmethod
    def load(cls, model_uri: str, seed: int = 0) -> Dispatcher:
        """A dispatcher for a stored surrogate (``models:/name@alias``, ``runs:/...``, a path)."""
        from bandpilot.model.local_registry import lookup, model_path

        # A missing model, alias or path is said before torch starts (seconds).
        uri = str(model_uri)
        located = None
        if uri.startswith(("models:/", "runs:/")):
            located = lookup(uri)
        else:
            model_path(uri)  # raises for a path that holds no model
        from bandpilot.model.surrogate import Surrogate  # lazy: pulls in torch

        return cls(Surrogate.load(model_uri, located=located), seed=seed)

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
        cons.check_names(self.spec, k)
        feas = cons.filter(self.spec, state.free, k, self._domains)
        if feas.n < k:
            raise PlacementError(
                "constraint_unmet",
                f"only {feas.n} of {state.n_free} free GPUs satisfy {' and '.join(cons.names())}; {k} requested",
            )
        return feas.free

    def _oracle(self, fabric: BandwidthModel | None, algorithm: str) -> BandwidthModel:
        guide = fabric
        if guide is None:
            from bandpilot.fabric.base import Fabric

            if isinstance(self.model, Fabric):
                guide = self.model
            else:
                raise PlacementError("invalid_request", f"algorithm {algorithm!r} needs fabric= (the true bandwidth)")
        try:
            spec = check_model(guide, "fabric")
        except ModelError as exc:
            raise PlacementError("invalid_request", str(exc)) from None
        if spec is not self.spec and spec.fingerprint() != self.spec.fingerprint():
            raise PlacementError("invalid_request", f"fabric is for cluster {spec.name!r}, the model for {self.spec.name!r}")
        return guide

    # ------------------------------------------------------------------------------------
    def select(
        self,
        k: int,
        state: State | Mapping[str, Any],
        algorithm: str | None = None,
        *,
        fabric: BandwidthModel | None = None,
        constraints: Constraints | Mapping[str, Any] | None = None,
        shape: Any = None,
    ) -> Selection:
        """The ``k`` GPUs ``algorithm`` picks under ``state``; see the module docstring. With a
        ``shape`` (:class:`bandpilot.dispatch.shape.Shape` or its text / mapping) the result also
        carries the rank map and per-axis figures (:mod:`bandpilot.dispatch.shaped`)."""
        t0 = time.perf_counter()
        if shape is not None:
            return self._select_shaped(k, state, algorithm or "shape", constraints, shape, t0)
        algorithm = algorithm or "bandpilot"
        strategy = strategies.get(algorithm)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise PlacementError("invalid_request", f"k must be a positive integer, got {k!r}")
        k = int(k)
        if k <= 0:
            raise PlacementError("invalid_request", f"k must be a positive integer, got {k}")
        st = self._state(state)
        cons = Constraints.parse(constraints)
        guide = self._oracle(fabric, algorithm) if strategy.kind == strategies.ORACLE else self.model
        if k > st.n_free:
            n = st.spec.n_gpus
            raise PlacementError("insufficient_gpus", f"{k} GPUs requested but cluster {st.spec.name} has {n} GPUs" if k > n
                                 else f"{k} GPUs requested but only {st.n_free} of the cluster's {n} GPUs are free")
        free = self._filter(st, k, cons)
        pred = ContentionPredictor(guide, st)
        if strategy.kind == strategies.MODEL_GUIDED and self.pricing != "now":
            score = strategies.pricing(self.pricing)(guide, st)
        else:
            score = pred
        got = strategy.run(Job(guide, st, free, k, cons, score, self._domains, self.seed, self.frag_tie, self.locality))
        if isinstance(got, Found) and score is pred:
            mask, value, solo = got.mask, got.value, got.standalone
        else:  # a baseline's mask (or a lifetime price): the model predicts it against the jobs running now
            mask = got.mask if isinstance(got, Found) else got
            p = pred.predict(np.asarray(mask)[None, :])
            value, solo = float(p.value[0]), float(p.standalone[0])

        mask = np.asarray(mask, dtype=np.int64)
        gpus = self.spec.from_mask(mask)
        bad = cons.check_selection(self.spec, gpus, free, k, self._domains, mask)
        if bad:  # never hand out a busy GPU
            raise AssertionError(f"{algorithm} produced an invalid allocation {gpus}: {bad}")
        if cons.min_gbps is not None and value < cons.min_gbps:
            raise PlacementError(
                "constraint_unmet",
                f"best {algorithm} allocation for k={k} is predicted at {value:.1f} GB/s, below min_gbps={cons.min_gbps:g}",
            )
        return Selection(
            gpus=gpus,
            predicted_gbps=value,
            standalone_gbps=solo,
            algorithm=algorithm,
            search_ms=(time.perf_counter() - t0) * 1e3,
            evaluations=pred.evaluations + (score.evaluations if score is not pred else 0),
            k=k,
            mask=mask,
        )

    def _select_shaped(self, k: Any, state: Any, algorithm: str, constraints: Any, shape: Any, t0: float) -> Selection:
        from bandpilot.dispatch.shape import Shape
        from bandpilot.dispatch.shaped import bandwidth_seed_cheap, default_refiners, placement_dict, shaped_select

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
            seed_job = Job(self.model, st, sub, shp.k, Constraints(single_host=cons.single_host), pred, self._domains,
                           self.seed, self.frag_tie, self.locality)
            rule = self.shape_bandwidth_seed
            with one_blas_thread():  # small numpy products: a 2-thread pool spins on a busy machine
                got, _ = shaped_select(self.spec, sub, shp, algorithm, pred,
                                       partial(_bandwidth_only, seed_job),
                                       partial(bandwidth_seed_cheap, self.spec, seed_job.free, seed_job.context) if rule is None else rule,
                                       default_refiners(self.spec) if self.shape_refiners is None else self.shape_refiners)
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

    def predict(self, gpus: list[str], state: State | Mapping[str, Any]) -> dict[str, Any]:
        """``B̂(S, τ)`` breakdown of a given allocation under the model (what-if / debugging)."""
        st = self._state(state)
        try:
            mask = self.spec.to_mask(gpus, "allocation")
        except SpecError as exc:
            raise PlacementError("invalid_request", str(exc)) from None
        return ContentionPredictor(self.model, st).explain(mask)
