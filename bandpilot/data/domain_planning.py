"""What should be measured on a cluster of multi-node NVLink domains? A plan that scales to rack-scale
systems, in three stages:

* **stage 1, per tray**: every GPU subset of every tray (what :func:`~bandpilot.data.planning.plan`
  measures per host) - it also verifies each tray, the seed's "measure, don't trust labels";
* **stage 1.5, inside a domain**: count patterns over trays (the multiset of per-tray counts, >= 2
  trays) - the in-domain value depends on nothing else, so identical domains (same GPU type, tray
  topology and tray count) *share* their patterns: each pattern is measured once, on one domain of
  the class (rotating, so every domain is exercised), not once per domain;
* **stage 2, across domains**: a sample stratified by the number of domains on a geometric ladder
  (:func:`domain_levels`) with the domain classes taking turns, log-uniform per-domain counts (what
  the scale-out term depends on; its NIC bottleneck is the smallest share), each domain's part on
  random trays.

Stages 1.5 and 2 - what the learned model needs - are a function of the domain *classes* (and the
log of the domain count), not of the number of domains; stage 1 is 2^g - 1 runs on every tray, run
concurrently (one run per tray at a time), so its wall time is 2^g - 1 rounds at any size.

Strata: ``1h:3`` (one tray), ``1d:4+4+2`` (one domain, per-tray counts), ``2d:36+12`` (domains,
per-domain counts).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from bandpilot.data.planning import PlannedMeasurement, check_sizes, plan, planned_measurement
from bandpilot.errors import SpecError
from bandpilot.topology.cluster import ClusterSpec


def partitions(t: int, parts: int, most: int) -> list[tuple[int, ...]]:
    """Partitions of ``t`` into 2..``parts`` parts of at most ``most`` (descending tuples)."""
    out: list[tuple[int, ...]] = []

    def rec(left: int, cap: int, acc: tuple[int, ...]) -> None:
        if left == 0:
            if len(acc) >= 2:
                out.append(acc)
            return
        if len(acc) == parts:
            return
        for v in range(min(cap, left), 0, -1):
            if v * (parts - len(acc)) < left:
                break
            rec(left - v, v, acc + (v,))

    rec(t, most, ())
    return out


def domain_classes(spec: ClusterSpec) -> dict[tuple, list[int]]:
    """NVLink domains grouped by (GPU type, tray topology, trays): domains of a class are identical."""
    unit, is_nvl = spec.units
    out: dict[tuple, list[int]] = {}
    for u in np.flatnonzero(is_nvl):
        hs = np.flatnonzero(unit == u)
        h0 = spec.hosts[int(hs[0])]
        key = (h0.gpu, h0.topology, hs.size)
        out.setdefault(key, []).append(int(u))
    return out


def domain_levels(n_domains: int) -> list[int]:
    """How many domains the cross-domain samples span: 2, 3, 4, 6, 9, 13, 19, ... (x 1.5) below ``n_domains``
    (and ``n_domains`` itself). Why a ladder: a domain-token model reads the number of domains
    through ``1 / (domains - 1)`` and ``log(domains)``, which change little between neighbours
    far out, so the strata - and the sample a fixed budget spreads over them - grow with the log of
    the domain count, not with it (every level from 2 to 1,389 would leave most levels empty)."""
    out: list[int] = []
    m = 2
    while m < n_domains:
        out.append(m)
        m = m + m // 2 if m >= 4 else m + 1
    return out + [n_domains] if n_domains >= 2 else out


def _pick_domains(classes: list[list[int]], m: int, i: int, rng: np.random.Generator) -> list[int]:
    """``m`` distinct domains whose classes take turns (from class ``i mod C``): every class and
    mix of classes is sampled, whatever the number of domains per class."""
    left = [list(rng.permutation(c)) for c in classes]
    out: list[int] = []
    j = i
    while len(out) < m:
        c = left[j % len(left)]
        if c:
            out.append(int(c.pop()))
        j += 1
    return out


def _random_subset(n: int, c: int, rng: np.random.Generator) -> int:
    return int(sum(1 << int(i) for i in rng.choice(n, size=c, replace=False)))


def plan_domains(
    spec: ClusterSpec,
    *,
    domain_samples: int = 300,
    cross_domain_samples: int = 200,
    seed: int = 0,
    sizes: Iterable[int] | None = None,
    repeats: int = 1,
    intra: bool = True,
) -> list[PlannedMeasurement]:
    """The three-stage plan (see the module docstring). ``domain_samples`` caps stage 1.5 per domain
    class (spread evenly over the GPU count, every pattern when they fit); deterministic per seed."""
    if not spec.nvlink_domains:
        raise SpecError(f"cluster {spec.name!r} has no NVLink domains; use the host-level plan")
    if domain_samples < 0 or cross_domain_samples < 0:
        raise SpecError("domain_samples and cross_domain_samples must be >= 0")
    sz = check_sizes(sizes, spec.message_bytes)
    rng = np.random.default_rng(seed)
    out = plan(spec, cross_host_samples=0, seed=seed, sizes=sz, repeats=repeats, intra=intra)
    unit, _ = spec.units
    seen: set[tuple[int, ...]] = set()

    def emit(masks: np.ndarray, stratum: str) -> None:
        key = tuple(int(x) for x in masks)
        if key in seen:
            return
        seen.add(key)
        for r in range(repeats):
            out.append(planned_measurement(spec, key, sz, stratum, r))

    def place(u: int, counts: tuple[int, ...], masks: np.ndarray) -> None:
        hs = np.flatnonzero(unit == u)
        pick = rng.choice(hs, size=len(counts), replace=False)
        for h, c in zip(pick, counts):
            masks[h] = _random_subset(spec.hosts[int(h)].n_gpus, c, rng)

    # stage 1.5: in-domain count patterns, once per class of identical domains
    for (_, topo, trays), members in domain_classes(spec).items():
        by_t = [partitions(t, trays, topo.n) for t in range(2, trays * topo.n + 1)]
        total = sum(len(p) for p in by_t)
        chosen: list[tuple[int, ...]] = []
        if total <= domain_samples:
            chosen = [p for ps in by_t for p in ps]
        else:  # even over the GPU count t, random patterns within
            for i, ps in enumerate(by_t):
                quota = (i + 1) * domain_samples // len(by_t) - i * domain_samples // len(by_t)
                idx = rng.choice(len(ps), size=min(quota, len(ps)), replace=False) if ps else []
                chosen += [ps[int(j)] for j in sorted(idx)]
        for i, pat in enumerate(chosen):
            masks = np.zeros(spec.n_hosts, dtype=np.int64)
            place(members[i % len(members)], pat, masks)
            emit(masks, "1d:" + "+".join(map(str, pat)))
    # stage 2: across domains, stratified by how many domains (a geometric ladder) and by class
    classes = [members for members in domain_classes(spec).values()]
    levels = domain_levels(sum(len(c) for c in classes))
    size = {u: int(spec.gpus_per_host[unit == u].sum()) for c in classes for u in c}
    for li, m in enumerate(levels):
        quota = (li + 1) * cross_domain_samples // len(levels) - li * cross_domain_samples // len(levels)
        for i in range(quota):
            pick = _pick_domains(classes, m, i, rng)
            # log-uniform shares: the NIC bottleneck is the smallest share, so small shares next to
            # large ones (1 GPU beside 60) are sampled as often as balanced large ones
            per = [int(min(size[u], np.exp(rng.uniform(0.0, np.log(size[u] + 1))))) for u in pick]
            masks = np.zeros(spec.n_hosts, dtype=np.int64)
            for u, t in zip(pick, per):
                trays = np.flatnonzero(unit == u)
                g = int(spec.gpus_per_host[trays[0]])
                n = int(rng.integers(-(-t // g), min(t, trays.size) + 1))  # trays used
                counts = np.full(n, t // n)
                counts[: t % n] += 1
                place(u, tuple(int(c) for c in counts), masks)
            emit(masks, f"{m}d:" + "+".join(map(str, sorted(per, reverse=True))))
    return out
