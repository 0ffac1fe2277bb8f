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

from bandpilot.data.draws import choices, pick_with_subsets
from bandpilot.data.planning import PlannedMeasurement, check_sizes, plan, sparse_measurement
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


def domain_trays(spec: ClusterSpec) -> list[np.ndarray]:
    """The trays (ascending spec indices) of every scale-out unit, by unit: one grouping pass, not
    a scan of every tray per domain (that was domains x trays: 35 M tests at 1,389 domains)."""
    unit, _ = spec.units
    order = np.argsort(unit, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(unit[order])) + 1)


def domain_classes(spec: ClusterSpec, trays: list[np.ndarray] | None = None) -> dict[tuple, list[int]]:
    """NVLink domains grouped by (GPU type, tray topology, trays): domains of a class are identical."""
    _, is_nvl = spec.units
    trays = domain_trays(spec) if trays is None else trays
    out: dict[tuple, list[int]] = {}
    for u in np.flatnonzero(is_nvl):
        hs = trays[int(u)]
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


def _place(rng: np.random.Generator, trays: np.ndarray, n_gpus: np.ndarray, even: bool,
           counts: tuple[int, ...], masks: dict[int, int]) -> None:
    """Random trays of one domain with ``counts`` GPUs each, as {tray: GPU mask} into ``masks``."""
    if even:
        idx, subs = pick_with_subsets(rng, trays.size, int(n_gpus[trays[0]]), counts)
        pick = [int(trays[i]) for i in idx]
    else:
        (idx,) = choices(rng, [(trays.size, len(counts))])
        pick = [int(trays[i]) for i in idx]
        subs = [sum(1 << i for i in sub) for sub in choices(rng, [(int(n_gpus[h]), c) for h, c in zip(pick, counts)])]
    for h, sub in zip(pick, subs):
        masks[h] = sub


def _domain_patterns(gpus_per_tray: int, trays: int, samples: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """Stage 1.5's in-domain count patterns of one domain class: all of them when they fit in
    ``samples``, else spread evenly over the GPU count t with random patterns within."""
    by_t = [partitions(t, trays, gpus_per_tray) for t in range(2, trays * gpus_per_tray + 1)]
    if sum(len(p) for p in by_t) <= samples:
        return [p for ps in by_t for p in ps]
    chosen: list[tuple[int, ...]] = []
    for i, ps in enumerate(by_t):
        quota = (i + 1) * samples // len(by_t) - i * samples // len(by_t)
        idx = rng.choice(len(ps), size=min(quota, len(ps)), replace=False) if ps else np.empty(0, dtype=np.int64)
        chosen += [ps[int(j)] for j in sorted(idx)]
    return chosen


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
    trays_of = domain_trays(spec)
    n_gpus = spec.gpus_per_host
    seen: set[tuple[tuple[int, int], ...]] = set()

    # Rows are built sparse ({tray: mask}): a cross-domain row touches its domains' trays, not every
    # tray of the cluster, so stages 1.5 and 2 cost what they emit.
    def emit(masks: dict[int, int], stratum: str) -> None:
        key = tuple(sorted(masks.items()))
        if key in seen:
            return
        seen.add(key)
        used, used_masks = tuple(h for h, _ in key), tuple(m for _, m in key)
        for r in range(repeats):
            out.append(sparse_measurement(spec, used, used_masks, sz, stratum, r))

    # Whether a unit's trays all have the same GPU count: then its tray pick and the subsets on
    # the picked trays are one batch of draws (the subsets' bounds are known before the pick).
    even = {u: bool((n_gpus[t] == n_gpus[t[0]]).all()) for u, t in enumerate(trays_of)}

    def place(u: int, counts: tuple[int, ...], masks: dict[int, int]) -> None:
        _place(rng, trays_of[u], n_gpus, even[u], counts, masks)

    # stage 1.5: in-domain count patterns, once per class of identical domains
    classes = domain_classes(spec, trays_of)
    for (_, topo, trays), members in classes.items():
        chosen = _domain_patterns(topo.n, trays, domain_samples, rng)
        for i, pat in enumerate(chosen):
            masks: dict[int, int] = {}
            place(members[i % len(members)], pat, masks)
            emit(masks, "1d:" + "+".join(map(str, pat)))
    # stage 2: across domains, stratified by how many domains (a geometric ladder) and by class
    groups = list(classes.values())
    levels = domain_levels(sum(len(c) for c in groups))
    size = {u: int(n_gpus[trays_of[u]].sum()) for c in groups for u in c}
    for li, m in enumerate(levels):
        quota = (li + 1) * cross_domain_samples // len(levels) - li * cross_domain_samples // len(levels)
        for i in range(quota):
            pick = _pick_domains(groups, m, i, rng)
            # log-uniform shares: the NIC bottleneck is the smallest share, so small shares next to
            # large ones (1 GPU beside 60) are sampled as often as balanced large ones
            # (one vectorised draw: the same doubles, in the same order, as one call per domain)
            sizes_ = np.array([size[u] for u in pick], dtype=np.float64)
            per = np.minimum(sizes_, np.exp(rng.uniform(0.0, np.log(sizes_ + 1)))).astype(np.int64).tolist()
            masks = {}
            for u, t in zip(pick, per):
                trays = trays_of[u]
                g = int(n_gpus[trays[0]])
                n = int(rng.integers(-(-t // g), min(t, trays.size) + 1))  # trays used
                counts = [t // n + (j < t % n) for j in range(n)]
                place(u, tuple(counts), masks)
            emit(masks, f"{m}d:" + "+".join(map(str, sorted(per, reverse=True))))
    return out
