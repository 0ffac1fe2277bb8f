"""How the built-in strategies run (registered by name in :mod:`bandpilot.dispatch.strategies`):
the model-guided searches under the constraints, the oracles and the baselines, each a function of
one :class:`Job`."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from bandpilot.dispatch import search
from bandpilot.dispatch.baselines import block_select, default_select, random_select, topo_select
from bandpilot.dispatch.constraints import Constraints
from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.model import BandwidthModel
from bandpilot.dispatch.search import Found, SearchContext, single_host
from bandpilot.dispatch.state import State
from bandpilot.topology.cluster import popcount

__all__ = ["Job", "bandpilot", "block", "default", "eha", "exact", "pts", "random", "searched", "topo"]


@dataclass
class Job:
    """One placement problem as a strategy sees it."""

    guide: BandwidthModel  # the model (oracles: the true fabric)
    state: State
    free: np.ndarray  # free GPUs left by the constraints (per-host masks)
    k: int
    constraints: Constraints
    predictor: ContentionPredictor
    domains: np.ndarray  # domain index per host
    seed: int = 0
    tie: float | None = None  # NVLink-domain search: fragmentation decides within this margin
    locality: float = 0.0  # a candidate on fewer hosts wins unless spreading gains more than this

    def context(self, free: np.ndarray | None = None) -> SearchContext:
        return SearchContext(self.guide, self.state, self.free if free is None else free, self.k,
                             predictor=self.predictor, segment=self.constraints.segment, tie=self.tie,
                             locality=self.locality)

    def rng(self) -> np.random.Generator:
        """Seeded by the seed, ``k`` and the free GPUs: the same request gets the same draw."""
        key = zlib.crc32(self.state.free.astype("<i8").tobytes())
        return np.random.default_rng([self.seed & 0xFFFFFFFF, self.k, key])


def searched(search: Callable[[SearchContext], Found]) -> Callable[[Job], Found]:
    """A model-guided search under the constraints: ``single_host`` searches one host at a time;
    ``single_domain`` on a cluster without NVLink domains runs one search per domain that can hold
    ``k`` and keeps the best (NVLink-domain searches keep one domain themselves)."""

    def one(job: Job, free: np.ndarray) -> Found:
        ctx = job.context(free)
        return single_host(ctx) if job.constraints.single_host else search(ctx)

    def run(job: Job) -> Found:
        if not (job.constraints.single_domain and not job.state.spec.nvlink_domains):
            return one(job, job.free)
        best = None
        for d in np.unique(job.domains[popcount(job.free) > 0]):
            sub = np.where(job.domains == d, job.free, 0)
            if int(popcount(sub).sum()) < job.k:
                continue
            got = one(job, sub)
            if best is None or got.value > best.value:
                best = got
        assert best is not None  # the filter left only domains that fit
        return best

    return run


def _exact(ctx: SearchContext) -> Found:
    return search.domain_exact(ctx) if ctx.spec.nvlink_domains else search.exact(ctx)


def _first_fitting_host(free: np.ndarray, k: int, pick: int | None = None) -> np.ndarray:
    fits = np.flatnonzero(popcount(free) >= k)
    h = int(fits[0 if pick is None else pick % fits.size])
    return np.where(np.arange(free.size) == h, free, 0)


def _random(job: Job) -> np.ndarray:
    rng, free = job.rng(), job.free
    if job.constraints.single_host:
        fits = np.flatnonzero(popcount(free) >= job.k)
        free = _first_fitting_host(free, job.k, int(rng.integers(fits.size)))
    return random_select(job.state.spec, free, job.k, rng)


def _default(job: Job) -> np.ndarray:
    free = _first_fitting_host(job.free, job.k) if job.constraints.single_host else job.free
    return default_select(job.state.spec, free, job.k)




def _topo(job: Job) -> np.ndarray:
    return topo_select(job.state.spec, job.free, job.k)


def _block(job: Job) -> np.ndarray:
    return block_select(job.state.spec, job.free, job.k, job.constraints.segment)


def one_domain(run: Callable[[Job], np.ndarray | Found]) -> Callable[[Job], np.ndarray | Found]:
    """``single_domain`` for a strategy that does not keep to one domain by itself: when its
    answer spans domains, run it once per domain that can hold ``k``; the best prediction wins.
    (An answer already inside one domain is returned as it is.)"""

    def value(job: Job, got: np.ndarray | Found) -> float:
        return got.value if isinstance(got, Found) else float(job.predictor.predict(np.asarray(got)[None, :]).value[0])

    def wrapped(job: Job) -> np.ndarray | Found:
        got = run(job)
        mask = got.mask if isinstance(got, Found) else np.asarray(got)
        if not job.constraints.single_domain or np.unique(job.domains[mask != 0]).size <= 1:
            return got
        best, best_v = None, -np.inf
        for d in np.unique(job.domains[popcount(job.free) > 0]):
            sub = np.where(job.domains == d, job.free, 0)
            if int(popcount(sub).sum()) >= job.k:
                cand = run(replace(job, free=sub))
                if value(job, cand) > best_v:
                    best, best_v = cand, value(job, cand)
        assert best is not None  # the filter left only domains that fit
        return best

    return wrapped


bandpilot = one_domain(searched(search.bandpilot))  # ``ideal`` too, guided by the true fabric
eha = one_domain(searched(search.eha))
pts = one_domain(searched(search.pts))
exact = one_domain(searched(_exact))
random = one_domain(_random)
default = one_domain(_default)
topo = one_domain(_topo)
block = one_domain(_block)
