"""How does an allocation become network input? Padded per-host tokens (paper Sec. IV-B).

A cross-host allocation is one *token per host it uses*; each token carries the host's exact
stage-1 (intra-host) bandwidth for the chosen GPUs, the GPU count there, the NIC bandwidth those
GPUs can drive, the GPU type and the rack domain. The naive ablation gets GPU-id tokens instead.
"""

from __future__ import annotations

import numpy as np
import torch

from bandpilot.topology.cluster import ClusterSpec


# ------------------------------------------------------------------------------------------
# Raw inputs (numpy, vectorised): padded per-host tokens of the cross-host rows.
def host_arrays(spec: ClusterSpec) -> dict[str, np.ndarray]:
    """Static per-host inputs: GPU-type index, nominal rail GB/s, rails, domain index, GPU offset."""
    types = {t: i for i, t in enumerate(spec.gpu_types)}
    doms: dict[str, int] = {}
    for h in spec.hosts:
        doms.setdefault(h.domain or "", len(doms))
    rails = spec.emulator.get("rails") or {}
    return {
        "gtype": np.array([types[h.gpu] for h in spec.hosts], dtype=np.int64),
        "rail": np.full(spec.n_hosts, spec.nic_gbps / 8.0),
        "rails": np.array([int(rails.get(h.gpu, spec.rails_per_host)) for h in spec.hosts], dtype=np.float64),
        "domain": np.array([doms[h.domain or ""] for h in spec.hosts], dtype=np.int64),
        "offset": np.concatenate([[0], np.cumsum(spec.gpus_per_host)[:-1]]).astype(np.int64),
    }


SPEED_DEADBAND = 0.05  # log: a host must be > ~5 % off the median of its kind to count as slow/fast


def host_speed(stage1: np.ndarray, gtype: np.ndarray, full: np.ndarray) -> np.ndarray:
    """Per host, log of its whole-host stage-1 bandwidth over the median of its GPU type: ~0 for healthy
    hosts of one kind, clearly negative for a uniformly slow one (which stage 1 alone, far above the
    network, would not reveal across hosts)."""
    s = stage1[np.arange(stage1.shape[0]), full]
    out = np.zeros(s.size)
    for g in np.unique(gtype):
        hit = (gtype == g) & (s > 0)
        if hit.any():
            out[hit] = np.log(s[hit] / np.median(s[hit]))
    # Healthy hosts of one kind differ by measurement noise (~1 % on the real H100 tables): not a signal.
    return np.where(np.abs(out) < SPEED_DEADBAND, 0.0, out)


def _scatter_tokens(used: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Row/column of every used host and its token slot (rows keep host order)."""
    rows, cols = np.nonzero(used)
    n_used = used.sum(axis=1)
    start = np.concatenate([[0], np.cumsum(n_used)[:-1]])
    slot = np.arange(rows.size) - np.repeat(start, n_used)
    return rows, cols, slot, int(n_used.max()) if n_used.size else 0


def host_tokens(masks: np.ndarray, counts: np.ndarray, stage1: np.ndarray, hosts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Padded host tokens for cross-host rows: ``cnt, intra, rail, rails`` (float), ``gtype``, ``dom``
    (int), ``pad`` (bool, True = padding) of shape ``(n, T)`` plus ``xdom`` (n,) (spans > 1 domain)."""
    n = masks.shape[0]
    used = counts > 0
    rows, cols, slot, t = _scatter_tokens(used)
    t = max(t, 1)
    out = {
        "cnt": np.zeros((n, t)),
        "intra": np.zeros((n, t)),
        "rail": np.ones((n, t)),
        "rails": np.ones((n, t)),
        "gtype": np.zeros((n, t), dtype=np.int64),
        "dom": np.zeros((n, t), dtype=np.int64),
        "pad": np.ones((n, t), dtype=bool),
        "speed": np.zeros((n, t)),
    }
    out["cnt"][rows, slot] = counts[rows, cols]
    out["intra"][rows, slot] = stage1[cols, masks[rows, cols]]
    out["rail"][rows, slot] = hosts["rail"][cols]
    out["rails"][rows, slot] = hosts["rails"][cols]
    out["gtype"][rows, slot] = hosts["gtype"][cols] + 1  # 0 = padding
    out["dom"][rows, slot] = hosts["domain"][cols]
    out["pad"][rows, slot] = False
    if "speed" in hosts:
        out["speed"][rows, slot] = hosts["speed"][cols]
    dmax = np.where(out["pad"], -1, out["dom"]).max(axis=1)
    dmin = np.where(out["pad"], np.iinfo(np.int64).max, out["dom"]).min(axis=1)
    out["xdom"] = (dmax != dmin).astype(np.float64)
    return out


def grouped_host_tokens(masks: np.ndarray, groups: tuple[np.ndarray, ...], stage1: np.ndarray,
                        hosts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`host_tokens` with each row's indistinguishable tokens merged (``groups``:
    :meth:`~bandpilot.model.canonical.PatternKeys.groups` of ``masks``): one token per group,
    plus ``mult`` (its size; 0 = padding) and ``mates`` (its domain-mate count in the whole row),
    which stand in for the domain labels. A row over 128 alike hosts is a handful of tokens."""
    n = masks.shape[0]
    r, c, size, mates = groups
    n_used = np.bincount(r, minlength=n)
    slot = np.arange(r.size) - np.repeat(np.concatenate([[0], np.cumsum(n_used)[:-1]]), n_used)
    t = max(int(n_used.max(initial=0)), 1)
    m = masks[r, c]
    out = {"cnt": np.zeros((n, t)), "intra": np.zeros((n, t)), "rail": np.ones((n, t)), "rails": np.ones((n, t)),
           "gtype": np.zeros((n, t), dtype=np.int64), "pad": np.ones((n, t), dtype=bool), "speed": np.zeros((n, t)),
           "mult": np.zeros((n, t)), "mates": np.zeros((n, t))}
    out["cnt"][r, slot] = np.bitwise_count(m)
    out["intra"][r, slot] = stage1[c, m]
    out["rail"][r, slot] = hosts["rail"][c]
    out["rails"][r, slot] = hosts["rails"][c]
    out["gtype"][r, slot] = hosts["gtype"][c] + 1  # 0 = padding
    out["pad"][r, slot] = False
    if "speed" in hosts:
        out["speed"][r, slot] = hosts["speed"][c]
    out["mult"][r, slot] = size
    out["mates"][r, slot] = mates
    # spans > 1 domain: some token's domain holds fewer than all of the row's tokens
    n_tok = np.bincount(r, weights=size, minlength=n)
    out["xdom"] = (np.where(out["pad"], np.inf, out["mates"]).min(axis=1) < n_tok).astype(np.float64)
    return out


def gpu_tokens(masks: np.ndarray, hosts: dict[str, np.ndarray], max_gpus: int) -> dict[str, np.ndarray]:
    """Padded GPU-id tokens (naive ablation): ``gid`` (n, K) with 0 = padding, ``pad``."""
    n, h = masks.shape
    bits = ((masks[:, :, None] >> np.arange(max_gpus)[None, None, :]) & 1).astype(bool)
    flat = bits.reshape(n, h * max_gpus)
    rows, cols, slot, k = _scatter_tokens(flat)
    k = max(k, 1)
    gid = np.zeros((n, k), dtype=np.int64)
    host = cols // max_gpus
    gid[rows, slot] = hosts["offset"][host] + cols % max_gpus + 1
    return {"gid": gid, "pad": gid == 0}


def to_torch(tokens: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in tokens.items():
        if v.dtype == bool:
            out[k] = torch.from_numpy(v)
        elif v.dtype.kind in "iu":
            out[k] = torch.from_numpy(v.astype(np.int64, copy=False))
        else:
            out[k] = torch.from_numpy(v.astype(np.float32))
    return out
