"""Which net reads domain tokens? :class:`DomainNet`, the hierarchical net one level up.

Its tokens are NVLink domains (:mod:`~bandpilot.model.domain_tokens`): ``cnt`` is a domain's GPU
count, ``rails`` the NIC rails its trays drive and ``intra`` its in-domain (stage 1.5) value, so
the physics prior of :class:`~bandpilot.model.networks.HierarchicalNet` - NIC bottleneck over
units, switch cap by units, ``min`` with the in-domain values - is the scale-out model with the
domain as the unit, as NVL72 racks talk over their NIC rails. One more token feature: the trays
a domain's share spans (the prior does not see it; the residual may).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bandpilot.errors import ModelError
from bandpilot.model.networks import HierarchicalNet
from bandpilot.topology.cluster import ClusterSpec


class DomainNet(HierarchicalNet):
    kind = "domain"
    #: tokens are domains, not hosts: the host-level canonical memo keys do not describe its input
    #: (the surrogate memoises exact rows instead)
    token_symmetric = False
    extra_tokens = 1

    def _extra_token_features(self, t: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [torch.log(t["trays"].clamp_min(1.0))]

    def _domain_mates(self, dom: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """A row's tokens are distinct domains (:meth:`DomainView.pack`): each valid token's only
        mate is itself - the same counts as the host net's (b, t, t) comparison, which was ~4 % of
        a forward over rows of 30-80 domain tokens."""
        return (~pad).to(torch.int64)


def max_unit_gpus(spec: ClusterSpec) -> int:
    """GPUs of the largest scale-out unit (NVLink domain or lone host): the token count's scale."""
    unit, _ = spec.units
    return int(np.bincount(unit, weights=spec.gpus_per_host).max())


def build_domain_net(spec: ClusterSpec, **cfg: Any) -> DomainNet:
    if not spec.nvlink_domains:
        raise ModelError(f"model 'domain' needs a cluster with NVLink domains; {spec.name!r} has none (use 'hierarchical')")
    if int(cfg.pop("members", 1) or 1) > 1:
        raise ModelError("model 'domain' is a single net (members must be 1)")
    cfg.setdefault("n_types", len(spec.gpu_types))
    cfg.setdefault("max_gpus", max_unit_gpus(spec))
    return DomainNet(**cfg)


