"""The rack and tenant lemmas of the certified step-time bound (:mod:`benchmarks.shape_bound`).

Each is an inequality the truth (emulator, contention rule, step-time score) satisfies for EVERY
placement, under a case split the caller minimises over:

* **Rack lemma** (units = hosts, >= 2 racks, hosts alike): an axis whose groups all stay in one
  rack makes the components of its union with the ``in`` axes rack-local; when those cannot pack
  into the racks' free GPUs, some group of another axis crosses racks, and pays the cross-rack
  network row; the groups on exactly its hosts (``same_hosts``) share its capacity row.
* **Tenant lemmas** (tenants known): when the job has more ranks than the clean hosts' free GPUs,
  ``need`` of them sit on exposed hosts; each such rank's spanning group pays the demand of every
  contending tenant there, against at most the tenants' super-allocation capacity, shared with
  the other groups of its axis on that host. Over a set of exposed hosts with ``need`` free GPUs,
  the axis gets at most a threshold of the per-host bounds.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from bandpilot.topology.cluster import popcount

IN, MIX, SPAN = "in", "mix", "span"
FabricBounds = Any  # benchmarks.shape_bound.FabricBounds (no import cycle)
_Structure = Any  # benchmarks.shape_bound._Structure


def tenant_hosts(b, free: np.ndarray, truth) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per host with free GPUs that contending tenants touch: its free GPUs, their summed
    demand ``D`` (all of them contend with any spanning group there) and ``C``, the least over
    them of an upper bound on the super allocation ``B(S u S_j)`` of any ``S``: its hosts include
    ``H_j`` (so >= |H_j| hosts, peers term at most ``peer / (|H_j| - 1)``, crossing racks when
    ``H_j`` does), its smallest count is at most ``m_j = min over H_j of (tenant's + free)``;
    the imbalance and stage-1 terms only lower it and are dropped."""
    pf = popcount(free)
    net, fab = b.fab.net, b.fab
    rail, rails = float(np.max(fab._rail_gbps)), int(np.max(fab._rails))
    jm = truth.job_masks
    hit = (jm != 0) & (pf > 0)[None, :]
    hosts = np.flatnonzero(hit.any(axis=0))
    C, D = np.full(hosts.size, np.inf), np.zeros(hosts.size)
    for j in range(jm.shape[0]):
        hj = np.flatnonzero(jm[j])
        m = int((popcount(jm[j, hj]) + pf[hj]).min())
        sw = rail * (net["switch_base"] + net["switch_peer"] / max(hj.size - 1, 1)) * (1 + net["count_gain"] * np.log(m))
        if np.unique(fab._domain[hj]).size > 1:
            sw *= net["cross_domain_factor"]
        nic = rail * min(m, rails)
        p = net["sharpness"]
        cj = (nic ** -p + sw ** -p) ** (-1 / p)
        at = np.isin(hosts, hj)
        C[at] = np.minimum(C[at], cj)
        D[at] += float(truth.job_demand[j])
    return pf[hosts], D, C


#: Intervals the exposed ranks in spanning groups of the one ``mix`` axis in ``A`` are split into.
SPLITS = 32


def exposed_sets(fb: FabricBounds, st: dict[str, str], k: int) -> list[tuple[frozenset[str], tuple[int, int] | None]]:
    """The tenant case split (units = hosts, tenants known, ``k`` > the clean hosts' free GPUs, so
    ``need = k - clean_free`` ranks sit on exposed hosts): the ``mix`` axes ``A`` of which some
    exposed rank's group spans, over every choice (for the others every exposed rank's group lies in
    its host); when ``A`` is one axis, also how many exposed ranks its spanning groups hold, as
    intervals ``[lo, hi]`` covering ``1..need``."""
    if fb.tenant is None or k <= fb.clean_free:
        return [(frozenset(), None)]
    need = k - fb.clean_free
    mix = [a for a in st if st[a] == MIX]
    out: list[tuple[frozenset[str], tuple[int, int] | None]] = []
    for r in range(len(mix) + 1):
        for A in itertools.combinations(mix, r):
            if len(A) != 1:
                out.append((frozenset(A), None))
                continue
            cuts = np.unique(np.linspace(1, need, min(need, SPLITS) + 1).round().astype(int))
            lo = [1] + (cuts[1:-1] + 0).tolist() if cuts.size > 2 else [1]
            hi = cuts[1:-1].tolist() + [need] if cuts.size > 2 else [need]
            out += [(frozenset(A), (int(a), int(b))) for a, b in zip(lo, hi)]
    return out


def tenant_bound(fb: FabricBounds, x: _Structure, st: dict[str, str], groups: dict[str, np.ndarray], a: str,
                  solo: float, cap: float, ex: frozenset[str], split: tuple[int, int] | None = None) -> float:
    """The tenant lemmas for axis ``a`` (not ``in``); ``solo``: a bound on its spanning groups'
    standalone values (the lemmas increase with it). ``span``: every exposed rank's ``a``-group spans
    beside the tenants; the groups on exactly its hosts (``same_hosts``) and, when another axis's
    group of that rank lies in the host (an ``in`` axis, or a ``mix`` axis not in ``ex``), every
    ``a``-group meeting that group share the host: ``n`` of them. ``mix`` in ``ex``: some exposed
    rank's ``a``-group spans (the best exposed host); ``mix`` not in ``ex``: none does, so the
    exposed ranks fit the in-host ``a``-groups' room there (else this case is impossible: 0).
    ``split = (lo, hi)``: the one axis ``b`` in ``ex`` has ``lo..hi`` exposed ranks in spanning
    groups, so ``b`` gets the lemma over ``lo`` of them and an all-spanning ``a`` counts the
    ``a``-groups meeting an in-host ``b``-group on hosts holding ``need - hi`` exposed ranks."""
    k = int(x.lab.size)
    need = k - fb.clean_free
    size = groups[a].shape[1]
    out = np.inf
    if st[a] == SPAN and need > 0 and fb.tenant is not None:
        n = x.same_hosts(a)
        for b in groups:
            if b != a and (st[b] == IN or (st[b] == MIX and b not in ex)):
                n = max(n, x.in_group(a, b, True))
        out = tenant_hosts_cap(fb, solo, cap, need, n)
        if split is not None and need - split[1] > 0:
            (b,) = ex
            n = max(n, x.in_group(a, b, True))
            out = min(out, tenant_hosts_cap(fb, solo, cap, need - split[1], n))
    elif st[a] == MIX and fb.tenant is not None and need > 0:
        in_room = int((fb.tenant[0] // size * size).sum())  # exposed ranks in-host a-groups can hold
        if a not in ex:
            return 0.0 if need > in_room else out
        lo = max(1, need - in_room, split[0] if split is not None else 1)
        out = tenant_hosts_cap(fb, solo, cap, lo, 1)
    return out


def cross_sets(fb: FabricBounds, x: _Structure, st: dict[str, str], groups: dict[str, np.ndarray], k: int,
                comps: dict[tuple[str, ...], np.ndarray], components: Callable) -> list[frozenset[str]]:
    """The rack lemma (units = hosts, >= 2 racks): the axes ``C`` of which some group crosses
    racks, over every choice the placement can make. The other axes ``L`` have every group inside
    one rack, so each component of their union lies in one rack, built of whole ``in``-components
    (one host each); when those cannot pack into the racks' free GPUs, that choice is impossible.
    ``in`` axes never cross. Without the lemma: only ``C`` empty (nothing assumed)."""
    if fb.rack is None:
        return [frozenset()]
    free_axes = [a for a in groups if st[a] != IN]
    out = []
    for r in range(len(free_axes) + 1):
        for C in itertools.combinations(free_axes, r):
            L = tuple(a for a in groups if a not in C)
            if L not in comps:
                comps[L] = np.bincount(np.unique(components(k, [groups[a] for a in L]), return_inverse=True)[1])
            if racks_pack(fb, x.size, comps[L]):
                out.append(frozenset(C))
    return out


def racks_pack(fb: FabricBounds, s_size: np.ndarray, l_size: np.ndarray) -> bool:
    """Can components of sizes ``l_size`` (each whole in one rack) made of ``in``-components of
    sizes ``s_size`` (each whole in one host) fit the free GPUs? Exact count when the sizes are
    uniform (the rank grid's are): a host holds ``free // s`` of them, a rack ``slots // (l / s)``;
    otherwise assumed to fit (no constraint)."""
    if s_size.min() != s_size.max() or l_size.min() != l_size.max() or l_size[0] % s_size[0]:
        return True
    slots = np.bincount(fb.rack, weights=fb.unit_free // int(s_size[0])).astype(np.int64)
    return int((slots // (int(l_size[0]) // int(s_size[0]))).sum()) >= l_size.size


def tenant_hosts_cap(fb: FabricBounds, solo: float, cap: float, need: int, n: int) -> float:
    """The per-host tenant lemma: the job puts ``need`` (``k - clean_free`` for an all-spanning
    axis) ranks of spanning groups on exposed hosts, so on a set ``U`` of them with that many free
    GPUs. At ``h`` in ``U`` the rank's group and the ``n - 1``
    others on exactly its hosts (``_Structure.same_hosts``) all span, so each has demand >=
    ``D_h + sum of the n solos`` and capacity <= ``C' = C_h``, and with ``n >= 2`` (siblings share
    the host, so the capacity has the siblings' union row in it, job GPUs only) ``<= cap`` too - not
    with ``n = 1``: a super allocation holds the tenant's GPUs, beyond any free-GPU row; ``value <= solo * C' /
    demand`` always, so their sum is <= ``C' * sum solo / (D_h + sum solo)`` and the slowest gets
    ``E_h <= min(solo, C' * solo / (D_h + n * solo))`` (increasing in the solos, each <= ``solo``).
    The axis gets at most ``min over U of E_h`` <= the largest ``t`` with ``sum of free over
    {E_h >= t}`` >= the ranks to place."""
    if fb.tenant is None or not fb.tenant[0].size:
        return np.inf
    free, D, C = fb.tenant
    E = np.minimum(solo, (np.minimum(cap, C) if n >= 2 else C) * solo / (D + n * solo))
    order = np.argsort(-E, kind="stable")
    got = np.cumsum(free[order])
    i = int(np.searchsorted(got, need))  # first prefix with enough free GPUs
    return float(E[order[i]]) if i < got.size else 0.0
