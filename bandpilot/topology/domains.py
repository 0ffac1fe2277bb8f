"""Which trays share a multi-node NVLink domain? The domain level between host and cluster
(NVL72-class racks: compute trays joined by NVLink switches, domains joined by NIC rails), its
validation, the per-host domain index the fabric and the search use, and the Slurm
``topology/block`` export (one block per NVLink domain).

A spec declares NVLink domains in one of two ways (hosts are *trays* here):

* compact: ``host_groups[i].nvlink_domain_size: 18`` - consecutive trays of the group form
  domains ``<prefix>nvl0``, ``<prefix>nvl1``, ...;
* explicit: a top-level ``nvlink_domains`` list whose entries are either a domain name already
  used as a host ``domain:`` label, or ``{name, hosts: [tray, ...]}``.

A domain must hold trays of one GPU type and one tray size, and a tray belongs to one domain
(its IMEX daemon serves one domain). This module works on plain host records (``name``, ``gpu``,
``n_gpus``, ``domain``) so :mod:`bandpilot.topology.cluster` can call it without a cycle.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import numpy as np

from bandpilot.errors import SpecError

Where = Callable[[tuple], str]  # spec key path -> "file:line: key" for error messages


def resolve_nvlink_domains(
    doc: dict, hosts: list, group_domains: dict[str, tuple], where: Where
) -> tuple[list, tuple[str, ...]]:
    """Apply ``nvlink_domains`` to ``hosts`` and validate every NVLink domain.

    ``group_domains`` maps domain names made by ``nvlink_domain_size`` to the ``host_groups`` key
    that made them. Returns the (possibly relabelled) hosts and the NVLink domain names in order.
    """
    names: dict[str, tuple] = dict(group_domains)  # domain -> key path that declared it
    raw = doc.get("nvlink_domains")
    if raw is not None:
        if not isinstance(raw, list):
            raise SpecError(f"{where(('nvlink_domains',))}: must be a list of domain names or {{name, hosts}} mappings")
        index = {h.name: i for i, h in enumerate(hosts)}
        labelled = {h.domain for h in hosts}  # one pass, not one per listed domain (1,389 x 25,002)
        owner: dict[str, tuple[str, tuple]] = {}  # tray -> (domain, key) from an explicit list
        for i, entry in enumerate(raw):
            key = ("nvlink_domains", i)
            name: Any
            if isinstance(entry, str):
                name, members = entry, None
            elif isinstance(entry, dict):
                unknown = sorted(set(entry) - {"name", "hosts"})
                if unknown:
                    raise SpecError(f"{where(key)}: unknown keys {unknown} (known: name, hosts)")
                name, members = entry.get("name"), entry.get("hosts")
                if members is not None and (not isinstance(members, list) or not members):
                    raise SpecError(f"{where(key)}: hosts must be a non-empty list of tray names")
            else:
                raise SpecError(f"{where(key)}: an entry must be a domain name or a {{name, hosts}} mapping")
            if not isinstance(name, str) or not name or ":" in name:
                raise SpecError(f"{where(key)}: domain name {name!r} must be a non-empty string without ':'")
            if name in names:
                raise SpecError(f"{where(key)}: NVLink domain {name!r} is declared twice (also at {where(names[name])})")
            names[name] = key
            if members is None:
                if name not in labelled:
                    raise SpecError(f"{where(key)}: no host has domain {name!r}; list its trays under hosts")
                continue
            for j, tray in enumerate(members):
                tkey = key + ("hosts", j)
                if tray not in index:
                    raise SpecError(f"{where(tkey)}: unknown tray {tray!r} in NVLink domain {name!r}")
                if tray in owner:
                    other, okey = owner[tray]
                    raise SpecError(
                        f"{where(tkey)}: tray {tray!r} is in two NVLink domains: {other!r} ({where(okey)}) and {name!r}"
                    )
                h = hosts[index[tray]]
                if h.domain is not None and h.domain != name:
                    raise SpecError(
                        f"{where(tkey)}: tray {tray!r} is labelled domain {h.domain!r} but listed in NVLink domain {name!r}"
                    )
                owner[tray] = (name, tkey)
                hosts[index[tray]] = dataclasses.replace(h, domain=name)
                labelled.add(name)
    by_domain: dict[str | None, list[Any]] = {}
    for h in hosts:  # one pass, not one scan per domain: 1,389 domains x 25,002 trays at 100k GPUs
        by_domain.setdefault(h.domain, []).append(h)
    for name, key in names.items():
        members = by_domain.get(name, [])
        gpus = sorted({h.gpu for h in members})
        if len(gpus) > 1:
            eg = [next(h.name for h in members if h.gpu == g) for g in gpus]
            raise SpecError(
                f"{where(key)}: NVLink domain {name!r} mixes GPU types {gpus} (trays {eg}); a domain holds one GPU type"
            )
        sizes = sorted({h.n_gpus for h in members})
        if len(sizes) > 1:
            eg = [next(h.name for h in members if h.n_gpus == s) for s in sizes]
            raise SpecError(
                f"{where(key)}: NVLink domain {name!r} mixes tray sizes {sizes} GPUs (trays {eg}); a domain holds one tray size"
            )
    return hosts, tuple(names)


def domain_index(hosts: Sequence[Any]) -> tuple[np.ndarray, list[str | None]]:
    """Domain index per host (hosts without a domain share one implicit domain) and the names."""
    names: dict[str | None, int] = {}
    ids = np.array([names.setdefault(h.domain, len(names)) for h in hosts], dtype=np.int64)
    return ids, list(names)


def nvlink_units(hosts: Sequence[Any], nvlink: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Scale-out unit per host - its NVLink domain, or the host itself outside one - and whether
    the unit is an NVLink domain. Traffic between units rides NIC rails; inside a unit, NVLink."""
    nv = set(nvlink)
    keys: dict[Any, int] = {}
    unit = np.array(
        [keys.setdefault(("nvl", h.domain) if h.domain in nv else ("host", i), len(keys)) for i, h in enumerate(hosts)],
        dtype=np.int64,
    )
    is_nvl = np.zeros(len(keys), dtype=bool)
    for k, u in keys.items():
        is_nvl[u] = k[0] == "nvl"
    return unit, is_nvl


# ---- Slurm topology/block export ---------------------------------------------------------------
_NUM = re.compile(r"^(.*?)(\d+)$")


def hostlist(names: Sequence[str]) -> str:
    """Slurm hostlist expression: ``gb200-[0-17]`` for numbered names sharing a prefix, else a
    comma-separated list (runs are compressed per prefix, zero padding kept)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for n in names:
        m = _NUM.match(n)
        if not m:
            plain.append(n)
            order.append(n)
            continue
        pad = len(m.group(2)) if m.group(2).startswith("0") and len(m.group(2)) > 1 else 0
        key = (m.group(1), pad)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(2)))
    parts = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, pad = item
        nums = sorted(set(groups[item]))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{pad}d}")
            continue
        runs = [f"{a:0{pad}d}" if a == b else f"{a:0{pad}d}-{b:0{pad}d}" for a, b in integer_runs(nums)]
        parts.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(parts)


def integer_runs(nums: list[int]) -> list[tuple[int, int]]:
    """Sorted integers as ``(first, last)`` runs of consecutive values: [0,1,2,5] -> [(0,2),(5,5)]."""
    runs: list[tuple[int, int]] = []
    for x in nums:
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return runs


def slurm_tree(spec: Any) -> str:
    """``topology.conf`` for Slurm's ``topology/tree`` plugin (switches), what clusters without
    NVLink domains use: one leaf switch per rack ``domain`` label under a root switch, or - with
    no labels, as in a rail-optimized fabric where every host reaches every rail switch - one
    switch holding every node."""
    racks = list(dict.fromkeys(h.domain for h in spec.hosts if h.domain))
    lines = [
        f"# Slurm topology.conf (topology/tree) for cluster {spec.name}: "
        + (f"one leaf switch per rack domain under {spec.name}-root." if racks else "one switch, every node."),
        "# Generated by `bandpilot cluster topology --format slurm-tree`; set TopologyPlugin=topology/tree.",
    ]
    if not racks:
        lines.append(f"SwitchName={spec.name} Nodes={hostlist([h.name for h in spec.hosts])}")
        return "\n".join(lines) + "\n"
    leaves = {d: [h.name for h in spec.hosts if h.domain == d] for d in racks}
    other = [h.name for h in spec.hosts if not h.domain]
    if other:  # a switch has either nodes or switches: unlabelled hosts get a leaf of their own
        leaves[f"{spec.name}-other"] = other
    for d, hosts in leaves.items():
        lines.append(f"SwitchName={d} Nodes={hostlist(hosts)}")
    lines.append(f"SwitchName={spec.name}-root Switches={','.join(leaves)}")
    return "\n".join(lines) + "\n"


def slurm_topology(spec: Any) -> str:
    """``topology.conf`` for Slurm's ``topology/block`` plugin: one ``BlockName=... Nodes=...`` line
    per domain (NVLink domains when the spec declares them, else its rack ``domain`` labels) and
    ``BlockSizes=`` with the planning base block size (nodes of the smallest block). Raises
    :class:`SpecError` when the spec has no domains or some hosts are in none."""
    nvl = tuple(getattr(spec, "nvlink_domains", ()) or ())
    names = list(nvl) if nvl else list(dict.fromkeys(h.domain for h in spec.hosts if h.domain))
    if not names:
        raise SpecError(f"cluster {spec.name!r} declares no domains: nothing to export as Slurm blocks")
    members = {d: [h.name for h in spec.hosts if h.domain == d] for d in names}
    outside = [h.name for h in spec.hosts if h.domain not in members]
    if outside:
        raise SpecError(
            f"cluster {spec.name!r}: hosts {outside[:3]} are in no {'NVLink ' if nvl else ''}domain; "
            "topology/block needs every node in a block"
        )
    base = min(len(v) for v in members.values())
    kind = "NVLink domain" if nvl else "domain"
    lines = [
        f"# Slurm topology.conf (topology/block) for cluster {spec.name}: one block per {kind}.",
        "# Generated by `bandpilot cluster topology --format slurm`; set TopologyPlugin=topology/block.",
    ]
    for d in names:
        lines.append(f"BlockName={d} Nodes={hostlist(members[d])}")
    lines.append(f"BlockSizes={base}")
    return "\n".join(lines) + "\n"
