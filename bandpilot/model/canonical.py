"""Which cross-host rows does the network see as the same input? Canonical pattern keys.

The hierarchical net reads an allocation as an unordered set of host tokens (count, stage-1 value
of the chosen GPUs, NIC rail, rails, GPU type, host speed) plus, per token, which other tokens
share its domain; it has no positional encoding and compares domain labels only for equality.
So two rows whose tokens agree up to a reordering of hosts and a renaming of domains get the same
prediction - on a cluster of alike hosts, "4 GPUs on one host and 4 on another in the same rack"
is ONE input whichever hosts and rack it is. A scheduler asks about such rows decision after
decision (128 hosts of one kind: thousands of distinct rows, a few dozen distinct patterns).

:class:`PatternKeys` maps rows to a 128-bit key of that canonical form: every (host, mask) gets
the id of its token (built once per stage-1 table), a domain's tokens are summed as 64-bit
mixes (order-free), and a row's domains are summed as mixes of those (order- and label-free),
in two independent lanes. A wrong merge needs a 128-bit collision of additive splitmix hashes
(~2^-64 per pair of distinct patterns among the ~1e6 a memo holds).
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))


def _mix(x: np.ndarray, seed: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``x + seed`` (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + seed
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


class PatternKeys:
    """Canonical keys of cross-host mask rows for one cluster and one stage-1 table."""

    def __init__(self, stage1: np.ndarray, hosts: dict[str, np.ndarray], max_gpus: int) -> None:
        n_h, width = stage1.shape
        allm = np.arange(width, dtype=np.int64)
        feats = np.stack(
            [
                np.broadcast_to(np.bitwise_count(allm)[None, :].astype(np.float64), (n_h, width)),
                stage1,
                *(np.broadcast_to(hosts[k][:, None].astype(np.float64), (n_h, width))
                  for k in ("gtype", "rail", "rails", "speed") if k in hosts),
            ],
            axis=-1,
        ).reshape(n_h * width, -1)
        # bitwise-equal features = one token id (NaN-safe: compared as bits)
        bits = np.ascontiguousarray(feats).view(np.int64)
        _, inv = np.unique(bits, axis=0, return_inverse=True)
        self.token = inv.reshape(n_h, width).astype(np.int64)
        self.domain = np.asarray(hosts["domain"], dtype=np.int64)
        self.n_dom = int(self.domain.max()) + 1 if self.domain.size else 1

    def keys(self, masks: np.ndarray) -> np.ndarray:
        """(n,) 16-byte void keys; rows equal up to host order and domain names share a key."""
        n = masks.shape[0]
        r, c = np.nonzero(masks)
        tok = self.token[c, masks[r, c]]
        group = r * self.n_dom + self.domain[c]
        order = np.argsort(group, kind="stable")
        group, tok = group[order], tok[order]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if group.size else np.zeros(0, dtype=np.int64)
        g_row = group[starts] // self.n_dom
        row_starts = np.flatnonzero(np.r_[True, g_row[1:] != g_row[:-1]]) if g_row.size else g_row
        out = np.zeros((n, 2), dtype=np.uint64)
        for lane, seed in enumerate(_SEEDS):
            per_dom = np.add.reduceat(_mix(tok, seed), starts) if starts.size else np.zeros(0, dtype=np.uint64)
            per_row = np.add.reduceat(_mix(per_dom, seed ^ _M1), row_starts) if row_starts.size else per_dom
            out[g_row[row_starts], lane] = per_row
        return np.ascontiguousarray(out).view(np.dtype((np.void, 16))).ravel()


def mix_lanes(feats: np.ndarray, used: np.ndarray) -> np.ndarray:
    """(n,) 16-byte order-free keys of rows of tokens: ``feats`` (n, t, f) uint64 feature bits,
    ``used`` (n, t) which tokens count; each token is a chain of splitmix mixes of its features,
    a row the wrapping sum of its tokens' mixes, in two independent lanes."""
    out = np.zeros((feats.shape[0], 2), dtype=np.uint64)
    for lane, seed in enumerate(_SEEDS):
        h = _mix(feats[..., 0], seed)
        for f in range(1, feats.shape[-1]):
            h = _mix(h ^ feats[..., f], seed)
        with np.errstate(over="ignore"):
            out[:, lane] = np.where(used, h, np.uint64(0)).sum(axis=1, dtype=np.uint64)
    return np.ascontiguousarray(out).view(np.dtype((np.void, 16))).ravel()
