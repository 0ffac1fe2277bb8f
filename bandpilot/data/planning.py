"""What should be measured? The measurement plan of a cluster: every GPU subset of every host and a
stratified sample of cross-host allocations, each with the message sizes its run sweeps.

Why this shape: stage 1 of the model is a lookup, so every subset (2^g - 1) of every host is
measured; the cross-host network only needs a sparse sample, stratified by the number of hosts and
the per-host count pattern (what the network term depends on), with random GPU subsets inside the
hosts.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec
from bandpilot.errors import SpecError

RAW_DIR = "raw"
_ENUM_LIMIT = 20000  # enumerate count patterns of a host level up to this many, sample beyond


@dataclass(frozen=True, slots=True)
class PlannedMeasurement:
    """One nccl-tests run: an allocation (the GPU masks of the hosts it uses) and its sizes.

    Why sparse: a run uses a handful of hosts (one per stage-1 run), and a dense per-host tuple made a
    plan of 25,002 trays hold 375,030 tuples of 25,002 entries (quadratic; it ran out of memory).
    ``masks`` still gives the dense per-host tuple for the callers that want one row of a matrix.
    """

    id: str
    used: tuple[int, ...]  # spec indices of the hosts used, ascending
    used_masks: tuple[int, ...]  # their GPU masks (non-zero)
    n_hosts: int  # hosts in the spec (the length of ``masks``)
    hosts: tuple[str, ...]  # hosts used, in spec order
    collective: str
    bytes: int  # the message size the dataset keeps
    sizes: tuple[int, ...]  # sizes the run sweeps (a factor-2 ladder containing ``bytes``)
    stratum: str  # "1h:3" or "3h:4+2+1" (hosts, sorted count pattern)
    repeat: int = 0

    @property
    def masks(self) -> tuple[int, ...]:
        """Per-host masks in spec host order (dense: O(hosts) per call)."""
        out = [0] * self.n_hosts
        for h, m in zip(self.used, self.used_masks):
            out[h] = m
        return tuple(out)

    def mask(self, h: int) -> int:
        """The GPU mask of spec host ``h`` (0 when unused)."""
        i = bisect.bisect_left(self.used, h)
        return self.used_masks[i] if i < len(self.used) and self.used[i] == h else 0

    @property
    def counts(self) -> tuple[int, ...]:  # GPUs per used host
        return tuple(m.bit_count() for m in self.used_masks)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(f"{name}:{i}" for name, m in zip(self.hosts, self.used_masks) for i in range(m.bit_length()) if m >> i & 1)

    @property
    def n_gpus(self) -> int:
        return sum(self.counts)

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
    """A measurement from dense per-host ``masks`` (``used``: the hosts to read, default the non-zero ones)."""
    if used is None:
        used = [h for h, m in enumerate(masks) if m]
    return sparse_measurement(spec, tuple(int(h) for h in used), tuple(int(masks[h]) for h in used), sizes, stratum, repeat)


def sparse_measurement(
    spec: ClusterSpec, used: tuple[int, ...], used_masks: tuple[int, ...], sizes: tuple[int, ...], stratum: str, repeat: int,
) -> PlannedMeasurement:
    """A measurement from the hosts it uses (ascending spec indices) and their masks: O(hosts used)."""
    hosts = spec.hosts
    ident = _ident(spec, used, used_masks)
    if repeat:
        ident += f"@r{repeat}"
    return PlannedMeasurement(
        id=ident,
        used=used,
        used_masks=used_masks,
        n_hosts=spec.n_hosts,
        hosts=tuple(hosts[h].name for h in used),
        collective=spec.collective,
        bytes=spec.message_bytes,
        sizes=sizes,
        stratum=_intern(stratum),
        repeat=repeat,
    )


def _ident(spec: ClusterSpec, used: Sequence[int], used_masks: Sequence[int]) -> str:
    """``host-idx`` for one host, ``x-host-idx+host-idx...`` for several, or a digest of the masks
    once that passes 120 characters (the parts are listed only up to that point)."""
    hosts = spec.hosts
    parts: list[str] = []
    length = 1  # "x-" + "+".join(parts) is 1 + the parts' lengths + 1 each
    for h, m in zip(used, used_masks):
        parts.append(f"{safe(hosts[h].name)}-{_idx_str(m, hosts[h].n_gpus)}")
        length += len(parts[-1]) + 1
        if length > 120 and len(used) > 1:
            break
    ident = parts[0] if len(used) == 1 else "x-" + "+".join(parts)
    if len(ident) <= 120:
        return ident
    digest = _dense_digest(used, used_masks, spec.n_hosts)
    return f"x-{len(used)}h-{sum(m.bit_count() for m in used_masks)}g-{digest}"


def _dense_digest(used: Sequence[int], used_masks: Sequence[int], n_hosts: int) -> str:
    """``sha1(json.dumps(dense masks))[:12]`` - the ids earlier plans wrote - fed run by run, so a
    long row costs its used hosts plus hashing, not a dense list of every host."""
    h = hashlib.sha1(b"[")
    nxt = 0
    for host, m in zip(used, used_masks):
        if host > nxt:
            h.update(b"0, " * (host - nxt))
        h.update(f"{m}, ".encode() if host < n_hosts - 1 else str(m).encode())
        nxt = host + 1
    if nxt < n_hosts:
        h.update(b"0, " * (n_hosts - nxt - 1) + b"0")
    h.update(b"]")
    return h.hexdigest()[:12]


def _intern(stratum: str) -> str:
    """One string object per stratum: 375,030 stage-1 runs share 4 strata ("1h:1".."1h:4")."""
    return sys.intern(stratum)


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
    out: list[PlannedMeasurement] = []
    if intra:
        out += _stage1(spec, sz, repeats)
    if cross_host_samples:  # nothing to draw: skip the per-level pattern tables
        for key, stratum in _CrossSample(spec, np.random.default_rng(seed)).draw(cross_host_samples):
            out += [planned_measurement(spec, key, sz, stratum, r) for r in range(repeats)]
    return out


def _stage1(spec: ClusterSpec, sizes: tuple[int, ...], repeats: int) -> list[PlannedMeasurement]:
    """Every GPU subset of every host, one host per run. Built sparse - a plan of 25,002 trays was
    375,030 dense tuples of 25,002 masks - with what repeats across hosts made once: the index
    strings, strata and one-element tuples per GPU count, the name per host."""
    by_g: dict[int, list[tuple[tuple[int, ...], str, str]]] = {}
    out: list[PlannedMeasurement] = []
    for h, host in enumerate(spec.hosts):
        g = host.n_gpus
        if g not in by_g:
            by_g[g] = [((m,), _idx_str(m, g), _intern(f"1h:{m.bit_count()}")) for m in range(1, 1 << g)]
        used, names, prefix = (h,), (host.name,), safe(host.name) + "-"
        for masks, idx, stratum in by_g[g]:
            ident = prefix + idx
            if len(ident) > 120:  # the rare long name: the general path (a digest id)
                out += [sparse_measurement(spec, used, masks, sizes, stratum, r) for r in range(repeats)]
                continue
            for r in range(repeats):
                out.append(PlannedMeasurement(ident + (f"@r{r}" if r else ""), used, masks, spec.n_hosts, names,
                                              spec.collective, spec.message_bytes, sizes, stratum, r))
    return out


class _CrossSample:
    """The stratified cross-host sample of :func:`plan`: even over the number of hosts, then over
    each level's count patterns, each realised on random hosts and GPUs; no allocation twice."""

    def __init__(self, spec: ClusterSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self.rows: list[tuple[tuple[int, ...], str]] = []
        self.seen: set[tuple[int, ...]] = set()
        self.exhausted: set[tuple[int, ...]] = set()  # patterns with no new allocation left (as far as we can tell)
        self.levels = list(range(2, spec.n_hosts + 1))
        self.sizes_desc = sorted((h.n_gpus for h in spec.hosts), reverse=True)
        self._patterns: dict[int, list[tuple[int, ...]] | None] = {}

    def level_patterns(self, k: int) -> list[tuple[int, ...]] | None:
        """Level ``k``'s count patterns, listed when a level is first drawn from (not for all H levels)."""
        if k not in self._patterns:
            self._patterns[k] = _patterns(k, self.sizes_desc[:k])
        return self._patterns[k]

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
                self.rows.append((key, f"{k}h:" + "+".join(map(str, pat))))
                return True
        self.exhausted.add(pat)
        return False

    def draw(self, n: int) -> list[tuple[tuple[int, ...], str]]:
        levels, n_levels = self.levels, len(self.levels)
        for li, k in enumerate(levels):
            quota = (li + 1) * n // n_levels - li * n // n_levels if n_levels else 0
            if quota <= 0:
                continue
            pats = self.level_patterns(k)
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
            pats = self.level_patterns(k)
            if pats is not None and not pats:
                misses += 1
                continue
            ok = self.add(k, pats[int(self.rng.integers(len(pats)))] if pats is not None else self.random_pattern(k))
            misses = 0 if ok else misses + 1
        return self.rows


def planned(spec: ClusterSpec, masks: Sequence[int], stratum: str, repeat: int = 0) -> PlannedMeasurement:
    """One measurement of an arbitrary allocation (probes, checks) with the spec's default sizes."""
    return planned_measurement(spec, masks, default_sizes(spec.message_bytes), stratum, repeat)
