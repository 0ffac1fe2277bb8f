"""Bandwidth surrogate ``B̂(S)``: stage-1 lookup + a learned stage-2 model over hosts.

Paper Sec. IV-B. A cross-host allocation is one *token per host it uses*; each token carries the
host's exact stage-1 (intra-host) bandwidth for the chosen GPUs, the GPU count there, the NIC
bandwidth those GPUs can drive, the GPU type and the rack domain. A physics prior in log space -
``min(smooth_min(NIC bottleneck, switch cap(#hosts)), intra bandwidth of hosts with >= 2 GPUs)``
with a handful of learnable constants - gives a first guess; a permutation-invariant Transformer
encoder (no positional encoding) with attention pooling and an MLP head predicts a log-space
residual on the network term. Single-host allocations never reach the network: they are the
stage-1 table, exactly.

Everything the model needs at inference - stage-1 tables, the cluster spec, feature scaling
(buffers of the torch module) and weights - lives in one directory written by
:meth:`Surrogate.save`, which is also the artifact inside the MLflow model. This module imports
torch but never Lightning or MLflow at import time (MLflow only when a registry URI is loaded).

:class:`NaiveNet` is the Table III ablation: a Transformer over raw GPU ids (learned id
embedding), without stage-1 features or the prior.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bandpilot.topology.cluster import ClusterSpec, spec_from_dict
from bandpilot.errors import BandPilotError, ModelError

FORMAT_VERSION = 1
CONFIG_FILE = "surrogate.json"
WEIGHTS_FILE = "weights.pt"
STAGE1_FILE = "stage1.npy"
REPLAY_FILE = "replay.npz"

#: Defaults of the emulator's network model; the prior starts from them and learns its own.
PRIOR_INIT = {"efficiency": 0.77, "switch_base": 1.1, "switch_peer": 1.8, "count_gain": 0.08,
              "sharpness": 12.0, "cross_domain": 0.5, "imbalance": 0.15}

N_TOKEN_FEATURES = 8
N_GLOBAL_FEATURES = 11
BROADCAST_ATTENTION_MAX_TOKENS = 8
RESID_BOUND = 1.0  # the learned residual corrects the prior by at most e^±1
HEADROOM_CAP = 0.5  # log headroom of stage-1 over the network beyond which intra cannot matter


def _inv_softplus(y: float) -> float:
    return float(y + math.log(-math.expm1(-y)))


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
    }
    out["cnt"][rows, slot] = counts[rows, cols]
    out["intra"][rows, slot] = stage1[cols, masks[rows, cols]]
    out["rail"][rows, slot] = hosts["rail"][cols]
    out["rails"][rows, slot] = hosts["rails"][cols]
    out["gtype"][rows, slot] = hosts["gtype"][cols] + 1  # 0 = padding
    out["dom"][rows, slot] = hosts["domain"][cols]
    out["pad"][rows, slot] = False
    dmax = np.where(out["pad"], -1, out["dom"]).max(axis=1)
    dmin = np.where(out["pad"], np.iinfo(np.int64).max, out["dom"]).min(axis=1)
    out["xdom"] = (dmax != dmin).astype(np.float64)
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


# ------------------------------------------------------------------------------------------
class AttentionPool(nn.Module):
    """Softmax-weighted sum over the valid tokens (a learned scoring vector)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.score = nn.Linear(d, 1)

    def forward(self, h: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        s = self.score(h).squeeze(-1).masked_fill(pad, -1e9)
        w = torch.softmax(s, dim=1).unsqueeze(-1)
        return (w * h).sum(dim=1)


def _mlp(d_in: int, hidden: int, layers: int, dropout: float) -> nn.Sequential:
    mods: list[nn.Module] = []
    d = d_in
    for _ in range(max(layers - 1, 0)):
        mods += [nn.Linear(d, hidden), nn.GELU()]
        if dropout:
            mods.append(nn.Dropout(dropout))
        d = hidden
    last = nn.Linear(d, 1)
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)
    mods.append(last)
    return nn.Sequential(*mods)


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder layer with plain-matmul attention.

    Why not ``nn.TransformerEncoderLayer``: on CPU its fused SDPA kernels cost milliseconds per
    call for a handful of tokens (backward especially); explicit matmuls are 10x faster here.
    """

    def __init__(self, d: int, heads: int, ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``bias``: (b, t) additive key mask (0 or -1e9)."""
        b, t, d = x.shape
        dh = d // self.heads
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, dh)
        q, k, v = qkv.unbind(2)  # (b, t, heads, dh) views
        if t <= BROADCAST_ATTENTION_MAX_TOKENS:
            # Few tokens (hosts): broadcast products beat batched tiny GEMMs by ~5x on CPU.
            scores = (q.unsqueeze(2) * k.unsqueeze(1)).sum(-1) * (dh**-0.5) + bias[:, None, :, None]
            att = torch.softmax(scores, dim=2)  # (b, t_query, t_key, heads)
            ctx = (att.unsqueeze(-1) * v.unsqueeze(1)).sum(2)  # (b, t, heads, dh)
        else:
            qh, kh, vh = (z.transpose(1, 2) for z in (q, k, v))
            att = torch.softmax(qh @ kh.transpose(-1, -2) * (dh**-0.5) + bias[:, None, None, :], dim=-1)
            ctx = (att @ vh).transpose(1, 2)
        x = x + self.drop(self.out(ctx.reshape(b, t, d)))
        return x + self.drop(self.ff(self.norm2(x)))


class Encoder(nn.Module):
    """A stack of :class:`EncoderBlock`; padded tokens are masked out as keys (permutation-invariant)."""

    def __init__(self, d: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderBlock(d, heads, 2 * d, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros(pad.shape, dtype=x.dtype).masked_fill(pad, -1e9)
        for layer in self.layers:
            x = layer(x, bias)
        return self.norm(x)


def _encoder(d: int, heads: int, layers: int, dropout: float) -> Encoder:
    return Encoder(d, heads, layers, dropout)


class HierarchicalNet(nn.Module):
    """Stage 2: physics prior (learnable constants) + Transformer residual over host tokens.

    ``forward(tokens)`` returns log bandwidth (GB/s) of each cross-host row. Feature scaling is
    kept in buffers (``tok_mean``/``tok_std``/``glob_mean``/``glob_std``) set by :meth:`fit_scaling`,
    so the state dict alone reproduces predictions.
    """

    kind = "hierarchical"

    def __init__(self, n_types: int, max_gpus: int, hidden: int = 32, layers: int = 6, heads: int = 4,
                 head_layers: int = 3, dropout: float = 0.0, min_intra: bool = True,
                 use_transformer: bool = True, imbalance: bool = False, **_: Any) -> None:
        super().__init__()
        self.config = dict(n_types=n_types, max_gpus=max_gpus, hidden=hidden, layers=layers, heads=heads,
                           head_layers=head_layers, dropout=dropout, min_intra=min_intra,
                           use_transformer=use_transformer)
        if imbalance:  # only when set, so configs/state dicts of older artifacts load unchanged
            self.config["imbalance"] = True
        self.max_gpus = max_gpus
        self.min_intra = min_intra
        self.use_transformer = use_transformer
        p = PRIOR_INIT
        self.log_eff = nn.Parameter(torch.tensor(math.log(p["efficiency"])))
        self.sw_base = nn.Parameter(torch.tensor(_inv_softplus(p["switch_base"])))
        self.sw_peer = nn.Parameter(torch.tensor(_inv_softplus(p["switch_peer"])))
        self.cnt_gain = nn.Parameter(torch.tensor(_inv_softplus(p["count_gain"])))
        self.sharp = nn.Parameter(torch.tensor(_inv_softplus(p["sharpness"] - 1.0)))
        self.log_xdom = nn.Parameter(torch.tensor(math.log(p["cross_domain"])))
        # Switch cap shrinks with count imbalance on >= 3 hosts: cap / (1 + imb * (mean/min count - 1)).
        self.imb = nn.Parameter(torch.tensor(_inv_softplus(p["imbalance"]))) if imbalance else None
        self.register_buffer("tok_mean", torch.zeros(N_TOKEN_FEATURES))
        self.register_buffer("tok_std", torch.ones(N_TOKEN_FEATURES))
        self.register_buffer("glob_mean", torch.zeros(N_GLOBAL_FEATURES))
        self.register_buffer("glob_std", torch.ones(N_GLOBAL_FEATURES))
        self.embed = nn.Linear(N_TOKEN_FEATURES, hidden)
        self.type_embed = nn.Embedding(n_types + 1, hidden)
        self.glob_embed = nn.Linear(N_GLOBAL_FEATURES, hidden)
        self.encoder = _encoder(hidden, heads, layers, dropout) if use_transformer and layers > 0 else None
        self.pool = AttentionPool(hidden)
        self.head = _mlp(2 * hidden, hidden, head_layers, dropout)

    # -- physics prior ---------------------------------------------------------------------
    def prior_params(self) -> dict[str, float]:
        f = lambda x: nn.functional.softplus(x.detach())  # noqa: E731
        return {
            "efficiency": float(self.log_eff.detach().exp()),
            "switch_base": float(f(self.sw_base)),
            "switch_peer": float(f(self.sw_peer)),
            "count_gain": float(f(self.cnt_gain)),
            "sharpness": float(1.0 + f(self.sharp)),
            "cross_domain": float(self.log_xdom.detach().exp()),
            **({"imbalance": float(f(self.imb))} if self.imb is not None else {}),
        }

    def _terms(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        f = nn.functional.softplus
        pad, cnt = t["pad"], t["cnt"]
        eff = self.log_eff.exp()
        log_nic_h = torch.log(torch.minimum(cnt, t["rails"]).clamp_min(1.0) * t["rail"]) + self.log_eff
        log_nic = log_nic_h.masked_fill(pad, float("inf")).amin(dim=1)
        n_hosts = (~pad).sum(dim=1).to(cnt.dtype)
        min_cnt = cnt.masked_fill(pad, float("inf")).amin(dim=1).clamp_min(1.0)
        rail_unit = t["rail"].masked_fill(pad, float("inf")).amin(dim=1) * eff
        peers = (n_hosts - 1.0).clamp_min(1.0)
        cap = rail_unit * (f(self.sw_base) + f(self.sw_peer) / peers) * (1.0 + f(self.cnt_gain) * torch.log(min_cnt))
        if self.imb is not None:
            mean_cnt = cnt.masked_fill(pad, 0.0).sum(dim=1) / n_hosts.clamp_min(1.0)
            cap = cap / (1.0 + f(self.imb) * (n_hosts >= 3).to(cnt.dtype) * (mean_cnt / min_cnt - 1.0))
        log_cap = torch.log(cap) + t["xdom"] * self.log_xdom
        p = 1.0 + f(self.sharp)
        log_net = -torch.logsumexp(torch.stack([-p * log_nic, -p * log_cap]), dim=0) / p
        big = cnt >= 2
        log_intra = torch.log(t["intra"].clamp_min(1e-6))
        log_intra_min = log_intra.masked_fill(pad | ~big, float("inf")).amin(dim=1)
        has_intra = torch.isfinite(log_intra_min)
        return {"log_nic_h": log_nic_h, "log_nic": log_nic, "log_cap": log_cap, "log_net": log_net,
                "log_intra": log_intra, "log_intra_min": log_intra_min, "has_intra": has_intra,
                "n_hosts": n_hosts, "min_cnt": min_cnt, "big": big}

    def _features(self, t: dict[str, torch.Tensor], z: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token and global features (detached from the prior's parameters)."""
        pad, cnt, big = t["pad"], t["cnt"], z["big"]
        zero = torch.zeros_like(cnt)
        log_net = z["log_net"].detach()
        log_nic_h = z["log_nic_h"].detach()
        log_nic = z["log_nic"].detach()
        # Stage-1 bandwidth as headroom over the network estimate: far above it, intra is irrelevant.
        headroom = torch.where(big, (z["log_intra"] - log_net.unsqueeze(1)).clamp(-3.0, HEADROOM_CAP), zero)
        n_valid = (~pad).sum(dim=1, keepdim=True).clamp_min(1)
        same_dom = ((t["dom"].unsqueeze(2) == t["dom"].unsqueeze(1)) & ~pad.unsqueeze(1)).sum(dim=2) / n_valid
        min_cnt = z["min_cnt"]
        is_min = (cnt == min_cnt.unsqueeze(1)) & ~pad
        tok = torch.stack(
            [
                cnt / self.max_gpus,
                torch.log(cnt.clamp_min(1.0)),
                big.to(cnt.dtype),
                headroom,
                log_nic_h - log_nic.unsqueeze(1),
                is_min.to(cnt.dtype),
                same_dom,
                (cnt % 2 == 1).to(cnt.dtype),
            ],
            dim=-1,
        ).masked_fill(pad.unsqueeze(-1), 0.0)
        tot = cnt.masked_fill(pad, 0.0).sum(dim=1)
        max_cnt = cnt.masked_fill(pad, 0.0).amax(dim=1)
        second = cnt.masked_fill(pad | is_min, float("inf")).amin(dim=1)
        second = torch.where(torch.isfinite(second), second, min_cnt)
        lim = torch.where(z["has_intra"], z["log_intra_min"] - log_net, torch.full_like(tot, HEADROOM_CAP))
        glob = torch.stack(
            [
                log_net,
                log_nic - log_net,
                lim.clamp(-3.0, HEADROOM_CAP),
                1.0 / (z["n_hosts"] - 1.0).clamp_min(1.0),
                torch.log(z["n_hosts"]),
                torch.log(tot.clamp_min(1.0)),
                torch.log(min_cnt),
                torch.log(second / min_cnt),
                is_min.sum(dim=1) / z["n_hosts"],
                torch.log(max_cnt.clamp_min(1.0) / min_cnt),
                t["xdom"],
            ],
            dim=-1,
        )
        return tok, glob

    def prior_log(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log bandwidth of the physics prior alone (no learned residual)."""
        z = self._terms(t)
        return torch.minimum(z["log_net"], z["log_intra_min"]) if self.min_intra else z["log_net"]

    def prior_parameters(self) -> list[nn.Parameter]:
        extra = [self.imb] if self.imb is not None else []
        return [self.log_eff, self.sw_base, self.sw_peer, self.cnt_gain, self.sharp, self.log_xdom, *extra]

    def raw_features(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._features(t, self._terms(t))

    @torch.no_grad()
    def fit_scaling(self, t: dict[str, torch.Tensor]) -> None:
        tok, glob = self.raw_features(t)
        valid = ~t["pad"]
        v = tok[valid]
        self.tok_mean.copy_(v.mean(dim=0))
        self.tok_std.copy_(v.std(dim=0, unbiased=False).clamp_min(1e-3))
        self.glob_mean.copy_(glob.mean(dim=0))
        self.glob_std.copy_(glob.std(dim=0, unbiased=False).clamp_min(1e-3))

    def forward(self, t: dict[str, torch.Tensor], return_parts: bool = False) -> torch.Tensor:
        z = self._terms(t)
        tok, glob = self._features(t, z)
        tok = (tok - self.tok_mean) / self.tok_std
        glob = (glob - self.glob_mean) / self.glob_std
        pad = t["pad"]
        g = self.glob_embed(glob)
        h = self.embed(tok) + self.type_embed(t["gtype"]) + g.unsqueeze(1)
        if self.encoder is not None:
            h = self.encoder(h, pad)
        pooled = self.pool(h, pad)
        raw = self.head(torch.cat([pooled, g], dim=-1)).squeeze(-1)
        resid = RESID_BOUND * torch.tanh(raw / RESID_BOUND)
        log_net = z["log_net"] + resid
        out = torch.minimum(log_net, z["log_intra_min"]) if self.min_intra else log_net
        if return_parts:
            return out, z["log_net"], resid  # type: ignore[return-value]
        return out


class NaiveNet(nn.Module):
    """Ablation (paper Table III): Transformer over GPU-id tokens, no stage-1 features, no prior."""

    kind = "naive"

    def __init__(self, n_gpus: int, hidden: int = 32, layers: int = 6, heads: int = 4, head_layers: int = 3,
                 dropout: float = 0.0, **_: Any) -> None:
        super().__init__()
        self.config = dict(n_gpus=n_gpus, hidden=hidden, layers=layers, heads=heads, head_layers=head_layers,
                           dropout=dropout)
        self.embed = nn.Embedding(n_gpus + 1, hidden, padding_idx=0)
        self.encoder = _encoder(hidden, heads, layers, dropout) if layers > 0 else None
        self.pool = AttentionPool(hidden)
        self.head = _mlp(hidden, hidden, head_layers, dropout)
        self.register_buffer("out_mean", torch.zeros(()))

    @torch.no_grad()
    def fit_scaling(self, t: dict[str, torch.Tensor], log_y: torch.Tensor | None = None) -> None:
        if log_y is not None and log_y.numel():
            self.out_mean.copy_(log_y.mean())

    def forward(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        pad = t["pad"]
        h = self.embed(t["gid"])
        if self.encoder is not None:
            h = self.encoder(h, pad)
        return self.head(self.pool(h, pad)).squeeze(-1) + self.out_mean


class HierarchicalEnsemble(nn.Module):
    """``members`` independently initialised :class:`HierarchicalNet` s averaged in log space.

    Trained jointly (each member on its own loss, see :meth:`member_outputs`); the average of a few
    members cuts the variance of one small net on a few hundred rows. ``config["members"]`` > 1
    selects it when an artifact is loaded; artifacts without the key are a single net.
    """

    kind = "hierarchical"

    def __init__(self, members: int = 3, **cfg: Any) -> None:
        super().__init__()
        self.members = nn.ModuleList(HierarchicalNet(**cfg) for _ in range(members))
        self.config = {**self.members[0].config, "members": members}
        self.min_intra = self.members[0].min_intra

    def member_outputs(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """(members, n) log bandwidth of every member."""
        return torch.stack([m(t) for m in self.members])

    def forward(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        # Members run one after another: a torch.func.vmap over stacked weights measured slower on CPU
        # at these sizes (1000 rows, 3 members: 50 vs 33 ms), so predict cost grows ~linearly with members.
        return self.member_outputs(t).mean(dim=0)

    def prior_log(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([m.prior_log(t) for m in self.members]).mean(dim=0)

    def prior_parameters(self) -> list[nn.Parameter]:
        return [q for m in self.members for q in m.prior_parameters()]

    def prior_params(self) -> dict[str, float]:
        ps = [m.prior_params() for m in self.members]
        return {k: float(np.mean([q[k] for q in ps])) for k in ps[0]}

    @torch.no_grad()
    def fit_scaling(self, t: dict[str, torch.Tensor]) -> None:
        for m in self.members:
            m.fit_scaling(t)


def build_net(kind: str, spec: ClusterSpec, **cfg: Any) -> nn.Module:
    if kind == "hierarchical":
        cfg.setdefault("n_types", len(spec.gpu_types))
        cfg.setdefault("max_gpus", int(spec.gpus_per_host.max()))
        members = int(cfg.pop("members", 1) or 1)
        if members > 1:
            return HierarchicalEnsemble(members=members, **cfg)
        return HierarchicalNet(**cfg)
    if kind == "naive":
        cfg.setdefault("n_gpus", spec.n_gpus)
        return NaiveNet(**cfg)
    raise ModelError(f"unknown model kind {kind!r}: expected 'hierarchical' or 'naive'")


# ------------------------------------------------------------------------------------------
class Surrogate:
    """A trained ``B̂(S)``: ``predict`` / ``predict_masks`` (the dispatcher's hot path), save/load."""

    def __init__(self, spec: ClusterSpec, stage1: np.ndarray, net: nn.Module, *, kind: str = "hierarchical",
                 meta: dict[str, Any] | None = None, replay: tuple[np.ndarray, np.ndarray] | None = None,
                 uri: str | None = None, name: str | None = None, model_version: str | None = None) -> None:
        stage1 = np.asarray(stage1, dtype=np.float64)
        width = 1 << int(spec.gpus_per_host.max())
        if stage1.shape != (spec.n_hosts, width):
            raise ModelError(f"stage-1 tables have shape {stage1.shape}, cluster {spec.name!r} needs {(spec.n_hosts, width)}")
        self.spec = spec
        self.stage1 = stage1
        self.net = net.eval()
        self.kind = kind
        self.meta = dict(meta or {})
        self.replay = replay
        self.uri = uri
        self.name = name or f"bandpilot-{spec.name}"
        self.model_version = model_version
        self._hosts = host_arrays(spec)
        self._max_gpus = int(spec.gpus_per_host.max())
        self._full = spec.full_masks

    def __repr__(self) -> str:
        return f"Surrogate({self.kind}, cluster={self.spec.name!r}, uri={self.uri!r}, version={self.model_version!r})"

    # -- features --------------------------------------------------------------------------
    def tokens(self, masks: np.ndarray) -> dict[str, np.ndarray]:
        """Raw padded tokens for (cross-host) mask rows, as the net consumes them."""
        masks = np.asarray(masks, dtype=np.int64)
        if self.kind == "naive":
            return gpu_tokens(masks, self._hosts, self._max_gpus)
        return host_tokens(masks, np.bitwise_count(masks).astype(np.int64), self.stage1, self._hosts)

    def _check_masks(self, masks: Any) -> np.ndarray:
        try:
            masks = np.asarray(masks, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ModelError("masks must be an integer array of per-host bitmasks") from None
        if masks.ndim == 1 and masks.size == self.spec.n_hosts:
            masks = masks[None, :]
        if masks.ndim != 2 or masks.shape[1] != self.spec.n_hosts:
            raise ModelError(f"masks have shape {masks.shape}; the model of {self.spec.name!r} needs (n, {self.spec.n_hosts})")
        bad = (masks < 0) | ((masks & ~self._full[None, :]) != 0)
        if bad.any():
            r, h = (int(x[0]) for x in np.nonzero(bad))
            raise ModelError(f"mask row {r} sets GPUs host {self.spec.hosts[h].name!r} does not have ({int(masks[r, h])})")
        return masks

    # -- inference -------------------------------------------------------------------------
    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        """``B̂`` for rows of per-host masks: <= 1 GPU -> 0, one host -> stage 1, else the model."""
        masks = self._check_masks(masks)
        counts = np.bitwise_count(masks)
        used = counts > 0
        n_used = used.sum(axis=1)
        out = np.zeros(masks.shape[0])
        single = n_used == 1
        if single.any():
            out[single] = self.stage1[np.arange(self.spec.n_hosts)[None, :], masks[single]].sum(axis=1)
        cross = np.flatnonzero(n_used >= 2)
        if cross.size:
            out[cross] = self._predict_cross(masks[cross])
        return out

    def _predict_cross(self, masks: np.ndarray) -> np.ndarray:
        if self.kind == "hierarchical" and masks.shape[0] > 64:
            # Identical (count, intra) rows predict identically: dedupe before the forward pass.
            counts = np.bitwise_count(masks).astype(np.int64)
            intra = self.stage1[np.arange(self.spec.n_hosts)[None, :], masks]
            key = np.ascontiguousarray(np.concatenate([counts.astype(np.float64), intra], axis=1))
            keyv = key.view(np.dtype((np.void, key.dtype.itemsize * key.shape[1]))).ravel()
            _, first, inverse = np.unique(keyv, return_index=True, return_inverse=True)
            if first.size < masks.shape[0] * 0.8:
                return self._forward(masks[first])[inverse.ravel()]
        return self._forward(masks)

    def _forward(self, masks: np.ndarray, chunk: int = 8192) -> np.ndarray:
        out = np.empty(masks.shape[0])
        with torch.inference_mode():
            for s in range(0, masks.shape[0], chunk):
                t = to_torch(self.tokens(masks[s : s + chunk]))
                out[s : s + chunk] = torch.exp(self.net(t)).double().numpy()
        return out

    def predict(self, allocations: Sequence[Sequence[str]]) -> np.ndarray:
        """``B̂`` for allocations given as GPU-id lists (``"host:idx"``)."""
        if isinstance(allocations, (str, bytes)):
            raise ModelError("predict takes a list of allocations (lists of GPU ids), not a string")
        try:
            masks = self.spec.to_masks([list(a) for a in allocations])
        except BandPilotError as exc:
            raise ModelError(f"model {self.name!r}: {exc}") from None
        except TypeError:
            raise ModelError("predict takes a list of allocations (lists of GPU ids)") from None
        return self.predict_masks(masks)

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the self-contained model directory (config + spec JSON, weights, stage-1, replay)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "net": self.net.config,
            "spec": self.spec.to_dict(),
            "fingerprint": self.spec.fingerprint(),
            "name": self.name,
            "meta": self.meta,
        }
        (path / CONFIG_FILE).write_text(json.dumps(cfg, indent=1, default=_json_default))
        torch.save({k: v.detach().cpu() for k, v in self.net.state_dict().items()}, path / WEIGHTS_FILE)
        np.save(path / STAGE1_FILE, self.stage1)
        if self.replay is not None:
            np.savez_compressed(path / REPLAY_FILE, masks=self.replay[0], busbw=self.replay[1])
        return path

    @classmethod
    def load_dir(cls, path: str | Path, *, uri: str | None = None, name: str | None = None,
                 model_version: str | None = None) -> "Surrogate":
        path = Path(path)
        cfg_p = path / CONFIG_FILE
        if not cfg_p.is_file():
            nested = sorted(path.glob(f"**/{CONFIG_FILE}"))
            if not nested:
                raise ModelError(f"no BandPilot surrogate at {path} (missing {CONFIG_FILE})")
            cfg_p = nested[0]
            path = cfg_p.parent
        try:
            cfg = json.loads(cfg_p.read_text())
            if cfg.get("format_version") != FORMAT_VERSION:
                raise ModelError(f"{cfg_p}: unsupported model format {cfg.get('format_version')!r}")
            spec = spec_from_dict(cfg["spec"], source=str(cfg_p))
            net = build_net(cfg["kind"], spec, **cfg["net"])
            state = torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True)
            net.load_state_dict(state)
            stage1 = np.load(path / STAGE1_FILE)
        except BandPilotError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError) as exc:
            raise ModelError(f"{path}: corrupt surrogate artifact ({exc.__class__.__name__}: {str(exc)[:120]})") from None
        replay = None
        if (path / REPLAY_FILE).is_file():
            with np.load(path / REPLAY_FILE) as z:
                replay = (z["masks"].astype(np.int64), z["busbw"].astype(np.float64))
        return cls(spec, stage1, net, kind=cfg["kind"], meta=cfg.get("meta") or {}, replay=replay,
                   uri=uri or str(path), name=name or cfg.get("name"), model_version=model_version)

    @classmethod
    def load(cls, uri: str | Path) -> "Surrogate":
        """Load from ``models:/NAME@alias``, ``models:/NAME/VERSION``, ``runs:/ID/model`` or a local path."""
        s = str(uri)
        if s.startswith(("models:/", "runs:/")):
            from bandpilot.model.artifacts import fetch_model_dir  # imports mlflow only for registry URIs

            t0 = time.perf_counter()
            local, name, version = fetch_model_dir(s)
            sur = cls.load_dir(local, uri=s, name=name, model_version=version)
            sur.meta.setdefault("load_seconds", time.perf_counter() - t0)
            return sur
        p = Path(s.removeprefix("file://"))
        if not p.exists():
            raise ModelError(f"model not found: {s} (expected models:/NAME@alias, models:/NAME/VERSION, runs:/ID/model or a path)")
        return cls.load_dir(p, uri=s)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
