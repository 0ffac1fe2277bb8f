"""Is a host healthy, and if not, which GPU, GPU pair or NIC rail? The verdict from measured/expected.

Every run is compared with the model's expectation (stage-1 table inside a host, the surrogate across
hosts); a run is *low* when ``log(measured / expected)`` is below its tolerance. Per host the decoder
tries every single-fault explanation - none, one GPU, one GPU pair, one NIC rail, the whole host - and
keeps the one whose predicted low runs disagree least with the observed ones (ties: the simpler one);
an NVLink fault need not show on cross-host runs, where the network may be the bottleneck anyway.
It works on any set of runs: the probe plan, or a whole measurement directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, popcount

FAILED_RATIO = 0.1  # a run below a tenth of its expectation is a failure (GPU gone, run crashed)
SIMPLICITY = {"none": 0, "gpu": 1, "rail": 2, "pair": 3, "host": 4}


@dataclass
class Tolerance:
    """Log-space tolerances: ``z`` noise sigmas (repeat noise), plus the model's error across hosts."""

    sigma: float = 0.02
    z: float = 4.0
    floor: float = 0.05
    cross_error: float = 0.05

    def of(self, cross: np.ndarray) -> np.ndarray:
        base = max(self.z * self.sigma, self.floor)
        return np.where(cross, base + self.cross_error, base)

    def to_dict(self) -> dict[str, float]:
        return {"sigma": self.sigma, "z": self.z, "floor": self.floor, "cross_error": self.cross_error}


@dataclass
class HostVerdict:
    host: str
    status: str  # healthy | degraded | failed
    gpus: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ratio: float = 1.0
    fault: str = "none"  # none | gpu | pair | rail | host
    runs: int = 0
    low_runs: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "gpus": self.gpus, "links": self.links, "ratio": round(self.ratio, 4)}


def _candidates(n: int) -> list[tuple[str, tuple[int, ...]]]:
    out: list[tuple[str, tuple[int, ...]]] = [("none", ())]
    out += [("gpu", (g,)) for g in range(n)]
    out += [("rail", (r,)) for r in range(n)]
    out += [("pair", (a, b)) for a in range(n) for b in range(a + 1, n)]
    out.append(("host", ()))
    return out


def _predicted(kind: str, args: tuple[int, ...], m: np.ndarray, cross: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(runs the fault must pull down, runs it may pull down) among the runs touching this host.

    An NVLink fault lowers stage 1, so a cross-host run feels it only where stage 1 is the bottleneck
    (``min`` rule): on those runs it *may* show. Every other run must be as expected."""
    none = np.zeros(m.shape, dtype=bool)
    if kind == "none":
        return none, none
    if kind == "host":
        return np.ones(m.shape, dtype=bool), none
    if kind == "rail":
        return cross & ((m >> args[0]) & 1).astype(bool), none
    bits = sum(1 << a for a in args)
    touched = (m & bits) == bits
    return touched & ~cross, touched & cross


def _decode(spec: ClusterSpec, h: int, masks: np.ndarray, cross: np.ndarray, low: np.ndarray, ratio: np.ndarray,
            explained: np.ndarray) -> HostVerdict:
    """The best single-fault explanation of one host's runs (``explained`` runs count as normal)."""
    host = spec.hosts[h]
    rows = np.flatnonzero(masks[:, h] != 0)
    if rows.size == 0:
        return HostVerdict(host.name, "healthy")
    m, c, obs = masks[rows, h], cross[rows], low[rows] & ~explained[rows]
    best = None
    for kind, args in _candidates(host.n_gpus):
        must, may = _predicted(kind, args, m, c)
        if kind != "none" and not must.any():
            continue
        score = (int((must & ~obs).sum() + (obs & ~must & ~may).sum()), SIMPLICITY[kind])
        if best is None or score < best[0]:
            best = (score, kind, args, must)
    _, kind, args, pred = best  # type: ignore[misc]
    v = HostVerdict(host.name, "healthy", runs=int(rows.size), low_runs=int(obs.sum()))
    if kind == "none":
        v.ratio = float(np.median(ratio[rows]))  # healthy: the typical run (a neighbour's fault may pull some down)
        return v
    r = float(np.median(ratio[rows][pred]))
    v.ratio, v.fault = r, kind
    v.status = "failed" if r < FAILED_RATIO else "degraded"
    name = host.name
    if kind == "gpu":
        v.gpus = [f"{name}:{args[0]}"]
    elif kind == "pair":
        v.gpus = [f"{name}:{args[0]}", f"{name}:{args[1]}"]
        v.links = [f"{name}:{args[0]}-{name}:{args[1]}"]
    elif kind == "rail":
        v.links = [f"{name}:nic-rail{args[0]}"]
    else:
        v.links = [name]
    return v


def diagnose(spec: ClusterSpec, masks: np.ndarray, measured: np.ndarray, expected: np.ndarray,
             tol: Tolerance, hosts: list[str] | None = None) -> dict[str, HostVerdict]:
    """Verdict per host from runs (per-host masks, measured and expected busbw)."""
    masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
    measured = np.asarray(measured, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    ok = expected > 0
    ratio = np.where(ok, measured / np.where(ok, expected, 1.0), 1.0)
    cross = (popcount(masks) > 0).sum(axis=1) >= 2
    low = np.log(np.maximum(ratio, 1e-9)) < -tol.of(cross)
    chosen = [h for h, host in enumerate(spec.hosts) if not hosts or host.name in hosts]
    out = {spec.hosts[h].name: _decode(spec, h, masks, cross, low, ratio, np.zeros(len(low), bool)) for h in chosen}
    # Second pass: a cross-host run pulled down by a fault already found at its other end (a slow
    # host, a rail, a GPU) is explained: it is no evidence against this host.
    by_host = {}
    for h in chosen:
        v = out[spec.hosts[h].name]
        if v.fault == "host":
            by_host[h] = cross & (masks[:, h] != 0)
        elif v.fault == "rail":
            r = int(v.links[0].rsplit("nic-rail", 1)[1])
            by_host[h] = cross & (((masks[:, h] >> r) & 1) != 0)
        elif v.fault in ("gpu", "pair"):  # a missing or slow GPU drags its cross-host runs down too
            bits = sum(1 << int(g.rsplit(":", 1)[1]) for g in v.gpus)
            by_host[h] = cross & ((masks[:, h] & bits) == bits)
    if by_host:
        for h in chosen:
            if out[spec.hosts[h].name].fault not in ("none", "rail"):
                continue
            others = np.zeros(len(low), dtype=bool)
            for o, e in by_host.items():
                if o != h:
                    others |= e
            if others.any():
                out[spec.hosts[h].name] = _decode(spec, h, masks, cross, low, ratio, others)
    return out
