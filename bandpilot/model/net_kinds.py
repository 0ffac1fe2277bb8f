"""The net kinds a surrogate can be built from, by name (``params`` and saved models say ``kind``).

One registry that imports every kind: the kinds live in their own modules (``networks``,
``domain_net``), and a registry those modules filled on import left ``build_net`` not knowing
``domain`` when only ``networks`` had been imported. A new kind is a builder added to ``NET_KINDS``.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from bandpilot.errors import ModelError
from bandpilot.model.domain_net import build_domain_net
from bandpilot.model.networks import HierarchicalEnsemble, HierarchicalNet, NaiveNet
from bandpilot.topology.cluster import ClusterSpec


def build_hierarchical_net(spec: ClusterSpec, **cfg: Any) -> nn.Module:
    cfg.setdefault("n_types", len(spec.gpu_types))
    cfg.setdefault("max_gpus", int(spec.gpus_per_host.max()))
    members = int(cfg.pop("members", 1) or 1)
    if members > 1:
        return HierarchicalEnsemble(members=members, **cfg)
    return HierarchicalNet(**cfg)


def build_naive_net(spec: ClusterSpec, **cfg: Any) -> nn.Module:
    cfg.setdefault("n_gpus", spec.n_gpus)
    return NaiveNet(**cfg)


#: kind -> builder(spec, **config)
NET_KINDS: dict[str, Callable[..., nn.Module]] = {
    "hierarchical": build_hierarchical_net,
    "domain": build_domain_net,
    "naive": build_naive_net,
}


def build_net(kind: str, spec: ClusterSpec, **cfg: Any) -> nn.Module:
    if kind not in NET_KINDS:
        raise ModelError(f"unknown model kind {kind!r}: expected one of {', '.join(map(repr, NET_KINDS))}")
    return NET_KINDS[kind](spec, **cfg)
