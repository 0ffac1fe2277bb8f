"""What should be measured? The measurement plan of a cluster: every GPU subset of every host and a
stratified sample of cross-host allocations, each with the message sizes its run sweeps.

Why this shape: stage 1 of the model is a lookup, so every subset (2^g - 1) of every host is
measured; the cross-host network only needs a sparse sample, stratified by the number of hosts and
the per-host count pattern (what the network term depends on), with random GPU subsets inside the
hosts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec
from bandpilot.errors import SpecError

RAW_DIR = "raw"
_ENUM_LIMIT = 20000  # enumerate count patterns of a host level up to this many, sample beyond


@dataclass(frozen=True)
class PlannedMeasurement:
    """One nccl-tests run: an allocation (per-host masks in spec host order) and its sizes."""

    id: str
    masks: tuple[int, ...]
    gpus: tuple[str, ...]
    hosts: tuple[str, ...]  # hosts used, in spec order
    counts: tuple[int, ...]  # GPUs per used host
    collective: str
    bytes: int  # the message size the dataset keeps
    sizes: tuple[int, ...]  # sizes the run sweeps (a factor-2 ladder containing ``bytes``)
    stratum: str  # "1h:3" or "3h:4+2+1" (hosts, sorted count pattern)
    repeat: int = 0

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def cross_host(self) -> bool:
        return len(self.hosts) >= 2

    @property
    def log(self) -> str:
        return f"{RAW_DIR}/{self.id}.log"

    def entry(self, status: str, **extra: Any) -> dict[str, Any]:
        """The manifest line for this measurement."""
        return {
            "id": self.id,
            "gpus": list(self.gpus),
            "hosts": list(self.hosts),
            "counts": list(self.counts),
            "stratum": self.stratum,
            "collective": self.collective,
            "bytes": self.bytes,
            "sizes": list(self.sizes),
            "repeat": self.repeat,
            "log": self.log,
            "status": status,
            **extra,
        }


# ----------------------------------------------------------------------------------------------
# planning


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _idx_str(mask: int, n: int) -> str:
    idx = [i for i in range(n) if mask >> i & 1]
    return "".join(map(str, idx)) if n <= 10 else ".".join(map(str, idx))


def planned_measurement(
    spec: ClusterSpec, masks: Sequence[int], sizes: tuple[int, ...], stratum: str, repeat: int,
    used: Sequence[int] | None = None,
) -> PlannedMeasurement:
    if not isinstance(masks, tuple):  # plan() passes tuples of ints already
        masks = tuple(int(m) for m in masks)
    if used is None:
        used = [h for h, m in enumerate(masks) if m]
    parts = [f"{safe(spec.hosts[h].name)}-{_idx_str(masks[h], spec.hosts[h].n_gpus)}" for h in used]
    ident = parts[0] if len(parts) == 1 else "x-" + "+".join(parts)
    if len(ident) > 120:
        digest = hashlib.sha1(json.dumps(masks).encode()).hexdigest()[:12]
        ident = f"x-{len(used)}h-{sum(bin(masks[h]).count('1') for h in used)}g-{digest}"
    if repeat:
        ident += f"@r{repeat}"
    gpus = tuple(f"{spec.hosts[h].name}:{i}" for h in used for i in range(spec.hosts[h].n_gpus) if masks[h] >> i & 1)
    return PlannedMeasurement(
        id=ident,
        masks=masks,
        gpus=gpus,
        hosts=tuple(spec.hosts[h].name for h in used),
        counts=tuple(bin(masks[h]).count("1") for h in used),
        collective=spec.collective,
        bytes=spec.message_bytes,
        sizes=sizes,
        stratum=stratum,
        repeat=repeat,
    )


def default_sizes(message_bytes: int) -> tuple[int, ...]:
    """The kept size and its factor-2 neighbours (what ``-b x/2 -e 2x -f 2`` sweeps)."""
    if message_bytes % 2:
        return (message_bytes,)
    return (message_bytes // 2, message_bytes, message_bytes * 2)


def check_sizes(sizes: Iterable[int] | None, message_bytes: int) -> tuple[int, ...]:
    if sizes is None:
        return default_sizes(message_bytes)
    out = tuple(sorted({int(s) for s in sizes}))
    if not out or any(s <= 0 for s in out):
        raise SpecError(f"sizes must be positive byte counts, got {list(sizes)}")
    if message_bytes not in out:
        raise SpecError(f"sizes {list(out)} must include the cluster's message size {message_bytes}")
    if any(b != 2 * a for a, b in zip(out, out[1:])):
        raise SpecError(f"sizes {list(out)} must be a factor-2 ladder (nccl-tests -b/-e/-f 2)")
    return out


def _patterns(k: int, sizes_desc: list[int]) -> list[tuple[int, ...]] | None:
    """Feasible sorted count patterns on ``k`` hosts, or None when there are too many to list."""
    g = sizes_desc[0]
    if math.comb(k + g - 1, g - 1) > _ENUM_LIMIT:
        return None
    out = []
    for combo in itertools.combinations_with_replacement(range(g, 0, -1), k):
        if all(c <= s for c, s in zip(combo, sizes_desc)):  # combo is non-increasing
            out.append(combo)
    return out


def _assign(pattern: Sequence[int], spec: ClusterSpec, rng: np.random.Generator) -> np.ndarray | None:
    """Random hosts and random GPU subsets realising a count pattern (largest count first)."""
    order = rng.permutation(spec.n_hosts)
    free = list(order)
    masks = np.zeros(spec.n_hosts, dtype=np.int64)
    for c in sorted(pattern, reverse=True):
        for j, h in enumerate(free):
            if spec.hosts[h].n_gpus >= c:
                idx = rng.choice(spec.hosts[h].n_gpus, size=c, replace=False)
                masks[h] = int(sum(1 << int(i) for i in idx))
                free.pop(j)
                break
        else:
            return None
    return masks


def plan(
    spec: ClusterSpec,
    *,
    cross_host_samples: int = 200,
    seed: int = 0,
    sizes: Iterable[int] | None = None,
    repeats: int = 1,
    intra: bool = True,
) -> list[PlannedMeasurement]:
    """All 2^g - 1 subsets of every host, then a stratified sample of cross-host allocations.

    The sample is spread evenly over the number of hosts (2..H); within a level, over the sorted
    count patterns (distinct patterns first, then more draws of random patterns), each realised on
    random hosts with random GPU subsets. Deterministic for a given ``seed``; no allocation twice.
    """
    if cross_host_samples < 0:
        raise SpecError(f"cross_host_samples must be >= 0, got {cross_host_samples}")
    if repeats < 1:
        raise SpecError(f"repeats must be >= 1, got {repeats}")
    sz = check_sizes(sizes, spec.message_bytes)
    base: list[tuple[tuple[int, ...], str, tuple[int, ...] | None]] = []
    if intra:
        zeros = (0,) * spec.n_hosts
        for h, host in enumerate(spec.hosts):
            for mask in range(1, 1 << host.n_gpus):
                base.append((zeros[:h] + (mask,) + zeros[h + 1 :], f"1h:{bin(mask).count('1')}", (h,)))
    base += _CrossSample(spec, np.random.default_rng(seed)).draw(cross_host_samples)
    return [planned_measurement(spec, masks, sz, stratum, r, used) for masks, stratum, used in base for r in range(repeats)]


class _CrossSample:
    """The stratified cross-host sample of :func:`plan`: even over the number of hosts, then over
    each level's count patterns, each realised on random hosts and GPUs; no allocation twice."""

    def __init__(self, spec: ClusterSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self.rows: list[tuple[tuple[int, ...], str, None]] = []
        self.seen: set[tuple[int, ...]] = set()
        self.exhausted: set[tuple[int, ...]] = set()  # patterns with no new allocation left (as far as we can tell)
        self.levels = list(range(2, spec.n_hosts + 1))
        sizes_desc = sorted((h.n_gpus for h in spec.hosts), reverse=True)
        self.level_patterns = {k: _patterns(k, sizes_desc[:k]) for k in self.levels}

    def random_pattern(self, k: int) -> tuple[int, ...]:
        hosts = self.rng.choice(self.spec.n_hosts, size=k, replace=False)
        return tuple(sorted((int(self.rng.integers(1, self.spec.hosts[h].n_gpus + 1)) for h in hosts), reverse=True))

    def add(self, k: int, pat: tuple[int, ...]) -> bool:
        if pat in self.exhausted:
            return False
        for _attempt in range(30):
            masks = _assign(pat, self.spec, self.rng)
            if masks is None:
                break
            key = tuple(int(x) for x in masks)
            if key not in self.seen:
                self.seen.add(key)
                self.rows.append((key, f"{k}h:" + "+".join(map(str, pat)), None))
                return True
        self.exhausted.add(pat)
        return False

    def draw(self, n: int) -> list[tuple[tuple[int, ...], str, None]]:
        levels, n_levels = self.levels, len(self.levels)
        for li, k in enumerate(levels):
            quota = (li + 1) * n // n_levels - li * n // n_levels if n_levels else 0
            if quota <= 0:
                continue
            pats = self.level_patterns[k]
            if pats is not None:
                if not pats:
                    continue
                chosen: list[tuple[int, ...]] = []
                full, rem = divmod(quota, len(pats))
                chosen += [p for p in pats for _ in range(full)]
                chosen += [pats[i] for i in sorted(self.rng.choice(len(pats), size=rem, replace=False))]
            else:
                chosen = [self.random_pattern(k) for _ in range(quota)]
            for pat in chosen:
                self.add(k, pat)
        # Small strata run out of distinct allocations (e.g. 4+4 on two 4-GPU hosts): top up the
        # sample from random strata so it reaches the requested size whenever the cluster allows it.
        misses = 0
        while levels and len(self.seen) < n and misses < 200:
            k = levels[int(self.rng.integers(len(levels)))]
            pats = self.level_patterns[k]
            if pats is not None and not pats:
                misses += 1
                continue
            ok = self.add(k, pats[int(self.rng.integers(len(pats)))] if pats is not None else self.random_pattern(k))
            misses = 0 if ok else misses + 1
        return self.rows


def planned(spec: ClusterSpec, masks: Sequence[int], stratum: str, repeat: int = 0) -> PlannedMeasurement:
    """One measurement of an arbitrary allocation (probes, checks) with the spec's default sizes."""
    return planned_measurement(spec, tuple(int(m) for m in masks), default_sizes(spec.message_bytes), stratum, repeat)
