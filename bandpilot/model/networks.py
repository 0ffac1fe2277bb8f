"""What maps host tokens to log bandwidth? The stage-2 networks (paper Sec. IV-B).

A physics prior in log space - ``min(smooth_min(NIC bottleneck, switch cap(#hosts)), intra
bandwidth of hosts with >= 2 GPUs)`` with a handful of learnable constants - gives a first guess;
a permutation-invariant Transformer encoder (no positional encoding) with attention pooling and
an MLP head predicts a log-space residual on the network term. Feature scaling lives in buffers,
so a state dict alone reproduces predictions.

:class:`NaiveNet` is the Table III ablation: a Transformer over raw GPU ids (learned id
embedding), without stage-1 features or the prior.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn


#: Defaults of the emulator's network model; the prior starts from them and learns its own.
PRIOR_INIT = {"efficiency": 0.77, "switch_base": 1.1, "switch_peer": 1.8, "count_gain": 0.08,
              "sharpness": 12.0, "cross_domain": 0.5, "imbalance": 0.15}

N_TOKEN_FEATURES = 8
N_GLOBAL_FEATURES = 11
BROADCAST_ATTENTION_MAX_TOKENS = 8
RESID_BOUND = 1.0  # artifacts without ``resid_bound`` in their config: the residual corrects by at most e^±1
NET_BOUND_MARGIN = 0.1  # log: a row measured > ~10 % below its stage-1 bound is network-bound
HEADROOM_CAP = 0.5  # log headroom of stage-1 over the network beyond which intra cannot matter


def _weighted_median(x: torch.Tensor, w: torch.Tensor) -> float:
    order = torch.argsort(x)
    cw = torch.cumsum(w[order].double(), 0)
    i = int(torch.searchsorted(cw, 0.5 * cw[-1]))
    return float(x[order][min(i, x.numel() - 1)])


def _inv_softplus(y: float) -> float:
    return float(y + math.log(-math.expm1(-y)))


# ------------------------------------------------------------------------------------------
class AttentionPool(nn.Module):
    """Softmax-weighted sum over the valid tokens (a learned scoring vector)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.score = nn.Linear(d, 1)

    def forward(self, h: torch.Tensor, pad: torch.Tensor, log_mult: torch.Tensor | None = None) -> torch.Tensor:
        """``log_mult``: log of each token's multiplicity (merged identical tokens weigh that many)."""
        s = self.score(h).squeeze(-1)
        s = (s if log_mult is None else s + log_mult).masked_fill(pad, -1e9)
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
            # scaled and masked in place: the same floats without two (b, heads, t, t) temporaries
            # (rows of 30-80 domain tokens at 10,008 GPUs); autograd keeps neither product
            scores = (qh @ kh.transpose(-1, -2)).mul_(dh**-0.5).add_(bias[:, None, None, :])
            att = torch.softmax(scores, dim=-1)
            ctx = (att @ vh).transpose(1, 2)
        x = x + self.drop(self.out(ctx.reshape(b, t, d)))
        return x + self.drop(self.ff(self.norm2(x)))


class Encoder(nn.Module):
    """A stack of :class:`EncoderBlock`; padded tokens are masked out as keys (permutation-invariant)."""

    def __init__(self, d: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderBlock(d, heads, 2 * d, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, pad: torch.Tensor, log_mult: torch.Tensor | None = None) -> torch.Tensor:
        """``log_mult``: as a key, a token merged from m identical ones gets m times one's attention."""
        bias = (torch.zeros(pad.shape, dtype=x.dtype) if log_mult is None else log_mult).masked_fill(pad, -1e9)
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
    #: the output does not depend on the order of the host tokens (no positional encoding,
    #: attention pooling) and sees domain labels only as each token's domain-mate count (``same_dom``)
    #: and whether the row spans domains (``xdom``): the prediction memo may key rows by their
    #: canonical pattern (bandpilot.model.canonical)
    token_symmetric = True
    #: token features a subclass appends (:meth:`_extra_token_features`): its tokens carry more than a host's
    extra_tokens = 0

    def __init__(self, n_types: int, max_gpus: int, hidden: int = 32, layers: int = 6, heads: int = 4,
                 head_layers: int = 3, dropout: float = 0.0, min_intra: bool = True,
                 use_transformer: bool = True, imbalance: bool = False, resid_bound: float = RESID_BOUND,
                 host_speed: bool = False, **_: Any) -> None:
        super().__init__()
        self.config = dict(n_types=n_types, max_gpus=max_gpus, hidden=hidden, layers=layers, heads=heads,
                           head_layers=head_layers, dropout=dropout, min_intra=min_intra,
                           use_transformer=use_transformer)
        if imbalance:  # only when set, so configs/state dicts of older artifacts load unchanged
            self.config["imbalance"] = True
        self.max_gpus = max_gpus
        self.min_intra = min_intra
        self.use_transformer = use_transformer
        # How far (log space) the learned residual may move the prior; kept in the config only when it
        # differs from the old fixed bound, so older artifacts load and predict unchanged.
        self.resid_bound = float(resid_bound)
        # A per-host speed token (and a slower host slowing the prior's NIC term); off for older artifacts.
        self.host_speed = bool(host_speed)
        if self.host_speed:
            self.config["host_speed"] = True
        n_tok = N_TOKEN_FEATURES + (1 if self.host_speed else 0) + self.extra_tokens
        if self.resid_bound != RESID_BOUND:
            self.config["resid_bound"] = self.resid_bound
        p = PRIOR_INIT
        self.log_eff = nn.Parameter(torch.tensor(math.log(p["efficiency"])))
        self.sw_base = nn.Parameter(torch.tensor(_inv_softplus(p["switch_base"])))
        self.sw_peer = nn.Parameter(torch.tensor(_inv_softplus(p["switch_peer"])))
        self.cnt_gain = nn.Parameter(torch.tensor(_inv_softplus(p["count_gain"])))
        self.sharp = nn.Parameter(torch.tensor(_inv_softplus(p["sharpness"] - 1.0)))
        self.log_xdom = nn.Parameter(torch.tensor(math.log(p["cross_domain"])))
        # Switch cap shrinks with count imbalance on >= 3 hosts: cap / (1 + imb * (mean/min count - 1)).
        self.imb = nn.Parameter(torch.tensor(_inv_softplus(p["imbalance"]))) if imbalance else None
        self.register_buffer("tok_mean", torch.zeros(n_tok))
        self.register_buffer("tok_std", torch.ones(n_tok))
        self.register_buffer("glob_mean", torch.zeros(N_GLOBAL_FEATURES))
        self.register_buffer("glob_std", torch.ones(N_GLOBAL_FEATURES))
        self.embed = nn.Linear(n_tok, hidden)
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
        pad, cnt = t["pad"], t["cnt"]
        log_nic_h, big, log_intra = self._token_terms(t)
        mult = t.get("mult")  # merged identical tokens (tokens.grouped_host_tokens): counts weigh by it
        n_hosts = (~pad).sum(dim=1).to(cnt.dtype) if mult is None else mult.sum(dim=1)
        rows = {
            "log_nic": log_nic_h.masked_fill(pad, float("inf")).amin(dim=1),
            "n_hosts": n_hosts,
            "min_cnt": cnt.masked_fill(pad, float("inf")).amin(dim=1).clamp_min(1.0),
            "rail_min": t["rail"].masked_fill(pad, float("inf")).amin(dim=1),
            "sum_cnt": (cnt.masked_fill(pad, 0.0) if mult is None else cnt * mult).sum(dim=1),
            "xdom": t["xdom"],
        }
        log_intra_min = log_intra.masked_fill(pad | ~big, float("inf")).amin(dim=1)
        return {"log_nic_h": log_nic_h, **self._row_terms(rows), "log_intra": log_intra, "log_intra_min": log_intra_min,
                "has_intra": torch.isfinite(log_intra_min), "n_hosts": n_hosts, "min_cnt": rows["min_cnt"], "big": big}

    def _token_terms(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prior's per-token values: NIC log bandwidth, ``cnt >= 2``, log stage-1 bandwidth."""
        cnt = t["cnt"]
        log_nic_h = torch.log(torch.minimum(cnt, t["rails"]).clamp_min(1.0) * t["rail"]) + self.log_eff
        if self.host_speed:
            log_nic_h = log_nic_h + t["speed"].clamp(max=0.0)
        return log_nic_h, cnt >= 2, torch.log(t["intra"].clamp_min(1e-6))

    def _row_terms(self, r: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The prior's per-row network terms from its token reductions ``r`` (:meth:`_terms`'
        ``rows``), apart so a caller that reduces tokens its own way (incrementally:
        :meth:`prior_log_rows`) combines them with the same operations."""
        f = nn.functional.softplus
        eff = self.log_eff.exp()
        n_hosts, min_cnt = r["n_hosts"], r["min_cnt"]
        rail_unit = r["rail_min"] * eff
        peers = (n_hosts - 1.0).clamp_min(1.0)
        cap = rail_unit * (f(self.sw_base) + f(self.sw_peer) / peers) * (1.0 + f(self.cnt_gain) * torch.log(min_cnt))
        if self.imb is not None:
            mean_cnt = r["sum_cnt"] / n_hosts.clamp_min(1.0)
            cap = cap / (1.0 + f(self.imb) * (n_hosts >= 3).to(min_cnt.dtype) * (mean_cnt / min_cnt - 1.0))
        log_cap = torch.log(cap) + r["xdom"] * self.log_xdom
        p = 1.0 + f(self.sharp)
        log_net = -torch.logsumexp(torch.stack([-p * r["log_nic"], -p * log_cap]), dim=0) / p
        return {"log_nic": r["log_nic"], "log_cap": log_cap, "log_net": log_net}

    def _features(self, t: dict[str, torch.Tensor], z: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token and global features (detached from the prior's parameters)."""
        pad, cnt, big = t["pad"], t["cnt"], z["big"]
        zero = torch.zeros_like(cnt)
        log_net = z["log_net"].detach()
        log_nic_h = z["log_nic_h"].detach()
        log_nic = z["log_nic"].detach()
        # Stage-1 bandwidth as headroom over the network estimate: far above it, intra is irrelevant.
        headroom = torch.where(big, (z["log_intra"] - log_net.unsqueeze(1)).clamp(-3.0, HEADROOM_CAP), zero)
        mult = t.get("mult")
        if mult is None:
            n_valid = (~pad).sum(dim=1, keepdim=True).clamp_min(1)
            same_dom = self._domain_mates(t["dom"], pad) / n_valid
        else:  # merged tokens: their domain-mate counts in the whole row come with them
            same_dom = t["mates"] / mult.sum(dim=1, keepdim=True).clamp_min(1.0)
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
                *([t["speed"]] if self.host_speed else []),
                *self._extra_token_features(t),
            ],
            dim=-1,
        ).masked_fill(pad.unsqueeze(-1), 0.0)
        tot = (cnt.masked_fill(pad, 0.0) if mult is None else cnt * mult).sum(dim=1)
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
                (is_min.sum(dim=1) if mult is None else (is_min * mult).sum(dim=1)) / z["n_hosts"],
                torch.log(max_cnt.clamp_min(1.0) / min_cnt),
                t["xdom"],
            ],
            dim=-1,
        )
        return tok, glob

    def _extra_token_features(self, t: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return []

    def _domain_mates(self, dom: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """(b, t) int64: per token the valid tokens of its row in its domain (itself included;
        padding's count is masked out of the features)."""
        return ((dom.unsqueeze(2) == dom.unsqueeze(1)) & ~pad.unsqueeze(1)).sum(dim=2)

    def prior_log(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log bandwidth of the physics prior alone (no learned residual)."""
        z = self._terms(t)
        return torch.minimum(z["log_net"], z["log_intra_min"]) if self.min_intra else z["log_net"]

    def prior_log_rows(self, tokens: dict[str, torch.Tensor], reduce: Any) -> torch.Tensor:
        """:meth:`prior_log` of rows of ``tokens`` (one row of every distinct token) that a caller
        reduces: ``reduce.min(values, eligible)``, ``reduce.rows`` (the per-row token count,
        per-row sums of ``cnt``, the token ``rail`` minimum, ``xdom``) - the same operations on the
        same reductions, so the same floats when the reductions are exact (mins; integer sums)."""
        log_nic_h, big, log_intra = self._token_terms(tokens)
        rows = {**reduce.rows, "log_nic": reduce.min(log_nic_h[0], None)}
        log_net = self._row_terms(rows)["log_net"]
        return torch.minimum(log_net, reduce.min(log_intra[0], big[0])) if self.min_intra else log_net

    @torch.no_grad()
    def calibrate_prior(self, t: dict[str, torch.Tensor], log_y: torch.Tensor, w: torch.Tensor | None = None) -> float:
        """Fit the prior's overall network scale (``log_eff``) to measurements in closed form.

        The rows that tell the network's scale are the ones measured clearly below the stage-1 bound
        of their hosts (or with no host of >= 2 GPUs): there the min rule says the network decided.
        Which rows those are depends on the data alone, and ``rail`` enters the network term only as
        ``rail * efficiency``, so whatever NIC speed a spec declares, the efficiency becomes the same
        weighted median of ``log y - log net`` (robust to outlier runs). With no such row the declared
        constants stay. Returns the shift of ``log_eff``.
        """
        w = torch.ones_like(log_y) if w is None else w
        z = self._terms(t)
        rows = log_y < z["log_intra_min"] - NET_BOUND_MARGIN
        if not bool(rows.any()):
            return 0.0  # the measurements never show the network binding: nothing to fit it to
        d = _weighted_median((log_y - z["log_net"])[rows], w[rows])
        self.log_eff += d
        return d

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
        log_mult = torch.log(t["mult"]) if "mult" in t else None
        if self.encoder is not None:
            h = self.encoder(h, pad, log_mult)
        pooled = self.pool(h, pad, log_mult)
        raw = self.head(torch.cat([pooled, g], dim=-1)).squeeze(-1)
        resid = self.resid_bound * torch.tanh(raw / self.resid_bound)
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
    token_symmetric = True  # every member is (HierarchicalNet.token_symmetric)

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

    def prior_log_rows(self, tokens: dict[str, torch.Tensor], reduce: Any) -> torch.Tensor:
        return torch.stack([m.prior_log_rows(tokens, reduce) for m in self.members]).mean(dim=0)

    def prior_parameters(self) -> list[nn.Parameter]:
        return [q for m in self.members for q in m.prior_parameters()]

    @torch.no_grad()
    def calibrate_prior(self, t: dict[str, torch.Tensor], log_y: torch.Tensor, w: torch.Tensor | None = None) -> float:
        return float(np.mean([m.calibrate_prior(t, log_y, w) for m in self.members]))

    def prior_params(self) -> dict[str, float]:
        ps = [m.prior_params() for m in self.members]
        return {k: float(np.mean([q[k] for q in ps])) for k in ps[0]}

    @torch.no_grad()
    def fit_scaling(self, t: dict[str, torch.Tensor]) -> None:
        for m in self.members:
            m.fit_scaling(t)
