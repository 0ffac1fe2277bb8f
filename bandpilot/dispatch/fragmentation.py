"""How fragmented are the domains? Metrics over a free mask, the same for the batch queue, the
benchmarks and the CLI (``bandpilot cluster fragmentation``).

On rack-scale systems the NVLink domain is the unit of gang placement (a gang that fits a domain
stays in one), so what free capacity is worth depends on where it is:

* ``largest_placeable`` - the largest gang that can be placed inside one domain now (max free GPUs
  of a domain); a larger gang spans domains and pays the cliff;
* ``stranded_gpus`` - free GPUs in partly used domains: they cannot serve a domain-sized gang
  (seed: "a domain with 6 of 72 GPUs busy has 66 GPUs useless to any job needing more than 66");
* ``stranded_tray_gpus`` - free GPUs on partly used trays (hosts): under the one-IMEX-domain-per-tray
  rule they can only join a job already on that tray's domain;
* ``whole_free_domains`` and per-domain occupancy.

Units are NVLink domains when the spec declares them, else the ``domain`` labels (hosts without a
label form one implicit domain).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, popcount
from bandpilot.topology.domains import domain_index


def fragmentation_metrics(spec: ClusterSpec, free: np.ndarray) -> dict[str, Any]:
    """Domain fragmentation of a free mask vector (see the module docstring)."""
    f = popcount(np.asarray(free, dtype=np.int64))
    dom, names = domain_index(spec.hosts)
    n = len(names)
    dfree = np.bincount(dom, weights=f, minlength=n).astype(np.int64)
    dsize = np.bincount(dom, weights=spec.gpus_per_host, minlength=n).astype(np.int64)
    partial = (dfree > 0) & (dfree < dsize)
    tray_partial = (f > 0) & (f < spec.gpus_per_host)
    return {
        "free": int(f.sum()),
        "stranded_gpus": int(dfree[partial].sum()),
        "stranded_tray_gpus": int(f[tray_partial].sum()),
        "largest_placeable": int(dfree.max(initial=0)),
        "whole_free_domains": int((dfree == dsize).sum()),
        "domains": [
            {"domain": name or "(none)", "gpus": int(dsize[i]), "free": int(dfree[i]),
             "occupancy": round(1.0 - dfree[i] / dsize[i], 4) if dsize[i] else 0.0}
            for i, name in enumerate(names)
        ],
    }
