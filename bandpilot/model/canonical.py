"""Which cross-host rows does the network see as the same input? Canonical pattern keys.

The hierarchical net reads an allocation as an unordered set of host tokens (count, stage-1 value
of the chosen GPUs, NIC rail, rails, GPU type, host speed) plus, per token, how many of the row's
tokens share its domain (``same_dom``) and whether the row spans domains (``xdom``, which those
counts decide); it has no positional encoding and reads domain labels nowhere else. So two rows
whose tokens agree up to a reordering of hosts, each token with the same number of domain mates,
get the same prediction - on a cluster of alike hosts, "4 GPUs on one host and 4 on another in the
same rack" is ONE input whichever hosts and rack it is, and so is "tokens a, b in one rack and c, d
in another" whichever of them pair up. A scheduler asks about such rows decision after decision
(128 hosts of one kind: thousands of distinct rows, a few dozen distinct patterns; super allocations
of a candidate with a job spread over every rack differ mostly in how their tokens pair up).

:class:`PatternKeys` maps rows to a 128-bit key of that canonical form: every (host, mask) gets
the id of its token (built once per stage-1 table), each token's id is joined with its domain-mate
count, and a row is the wrapping sum of 64-bit mixes of those (order-free), in two independent
lanes. A wrong merge needs a 128-bit collision of additive splitmix hashes (~2^-64 per pair of
distinct patterns among the ~1e6 a memo holds).
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))


def _mix(x: np.ndarray, seed: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``x + seed`` (uint64, wrapping)."""
    with np.errstate(over="ignore"):  # in place: a search hashes ~50,000 tokens a call
        z = x.astype(np.uint64) + seed
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
        return z


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
        self.n_hosts = n_h

    def _codes(self, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Row, host, token code (token id joined with its domain-mate count) and domain-mate
        count of every used (row, host), rows ascending."""
        r, c = np.nonzero(masks)  # row-major: r ascending
        tok = self.token[c, masks[r, c]]
        # each token's domain-group size: what same_dom reads (and xdom: a size below the row's tokens)
        _, g_inv, g_cnt = np.unique(r * self.n_dom + self.domain[c], return_inverse=True, return_counts=True)
        mates = g_cnt[g_inv.ravel()]
        return r, c, tok * (self.n_hosts + 1) + mates, mates

    def groups(self, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tokens of each row the net cannot tell apart, merged: per group its row (ascending),
        one host of it, its size and its tokens' domain-mate count. Identical tokens of one row
        have identical states through a token-symmetric net, so a group of m is one token whose
        attention weight is m times one's (:class:`~bandpilot.model.networks.HierarchicalNet`)."""
        r, c, code, mates = self._codes(masks)
        _, first, size = np.unique(r * (int(code.max(initial=0)) + 1) + code, return_index=True, return_counts=True)
        return r[first], c[first], size, mates[first]

    def keys(self, masks: np.ndarray) -> np.ndarray:
        """(n,) 16-byte void keys; rows whose tokens agree up to host order, each token with the
        number of the row's tokens in its domain, share a key (see the module docstring)."""
        n = masks.shape[0]
        out = np.zeros((n, 2), dtype=np.uint64)
        if not masks.any():
            return np.ascontiguousarray(out).view(np.dtype((np.void, 16))).ravel()
        r, _, code, _ = self._codes(masks)
        row_starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        for lane, seed in enumerate(_SEEDS):
            out[r[row_starts], lane] = np.add.reduceat(_mix(code, seed), row_starts)
        return np.ascontiguousarray(out).view(np.dtype((np.void, 16))).ravel()


def mix_tokens(feats: np.ndarray) -> np.ndarray:
    """(..., 2) uint64: each token's chain of splitmix mixes of its ``feats`` (..., f) uint64
    feature bits, in the two lanes of :func:`mix_lanes`."""
    out = np.empty((*feats.shape[:-1], 2), dtype=np.uint64)
    for lane, seed in enumerate(_SEEDS):
        h = _mix(feats[..., 0], seed)
        for f in range(1, feats.shape[-1]):
            h = _mix(h ^ feats[..., f], seed)
        out[..., lane] = h
    return out


def mix_lanes(feats: np.ndarray, used: np.ndarray) -> np.ndarray:
    """(n,) 16-byte order-free keys of rows of tokens: ``feats`` (n, t, f) uint64 feature bits,
    ``used`` (n, t) which tokens count; each token is a chain of splitmix mixes of its features,
    a row the wrapping sum of its tokens' mixes, in two independent lanes."""
    h = np.where(used[..., None], mix_tokens(feats), np.uint64(0))
    with np.errstate(over="ignore"):
        out = h.sum(axis=1, dtype=np.uint64)
    return np.ascontiguousarray(out).view(np.dtype((np.void, 16))).ravel()
