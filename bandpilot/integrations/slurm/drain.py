"""Draining nodes in Slurm from BandPilot's ``verify`` verdicts, and resuming them after a
passing re-check.

A node ``verify`` finds degraded or failed is drained (``State=DRAIN``) with a reason that starts
with :data:`REASON_PREFIX` and says what was found; running jobs finish, no new job lands there.
A later verdict of ``healthy`` resumes it (``State=RESUME``) - only when the drain is BandPilot's
own (its reason starts with the prefix): a node an operator drained for another reason stays
drained. Slurm drains whole nodes, so one slow GPU or link takes its node out; the reason names it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from bandpilot.integrations.slurm.commands import SlurmError, run
from bandpilot.integrations.slurm.state import NodeInfo, parse_nodes

REASON_PREFIX = "bandpilot verify:"
VERDICT_STATUSES = ("healthy", "degraded", "failed")


def _nodes(names: Sequence[str], env: Mapping[str, str] | None) -> dict[str, NodeInfo]:
    """The named nodes as Slurm sees them; :class:`SlurmError` naming any Slurm does not know."""
    known = parse_nodes(run(["scontrol", "-o", "show", "node"], env=env))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SlurmError(f"node {unknown[0]!r} is not known to Slurm (it has {len(known)} nodes)"
                         + (f" and {len(unknown) - 1} more unknown" if len(unknown) > 1 else ""), code="not_found")
    return known


def drain(nodes: Sequence[str], reason: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Drain ``nodes`` with ``reason`` (checked first: an unknown node changes nothing)."""
    if not reason.strip():
        raise SlurmError("a drain needs a reason (Slurm shows it in sinfo -R)", code="invalid_request")
    if not nodes:
        return []
    _nodes(nodes, env)
    run(["scontrol", "update", f"NodeName={','.join(nodes)}", "State=DRAIN", f"Reason={reason.strip()}"], env=env)
    return list(nodes)


def undrain(nodes: Sequence[str], env: Mapping[str, str] | None = None, only_ours: bool = False) -> list[str]:
    """Resume the drained ones among ``nodes`` (``only_ours``: only BandPilot's own drains);
    returns the nodes resumed. Nodes that are not drained are left as they are."""
    if not nodes:
        return []
    known = _nodes(nodes, env)
    todo = [n for n in nodes if _drained(known[n]) and (not only_ours or known[n].reason.startswith(REASON_PREFIX))]
    if todo:
        run(["scontrol", "update", f"NodeName={','.join(todo)}", "State=RESUME"], env=env)
    return todo


def _drained(info: NodeInfo) -> bool:
    return bool({"DRAIN", "DRAINED", "DRAINING"} & set(info.states))


def read_verdicts(path: str | Path) -> dict[str, dict[str, Any]]:
    """Host verdicts ``{host: {"status", "gpus", "links", "ratio"}}`` from a ``bandpilot verify
    --json`` report (``{"hosts": {...}}``, or a ``--pairwise`` one: ``{"nodes": {...}, "links":
    [...]}``, whose slow NIC rails become the links named); ``-`` reads standard input. One-line
    errors naming the file."""
    p = Path(path)
    try:
        doc = json.loads(sys.stdin.read() if str(path) == "-" else p.read_text())
    except FileNotFoundError:
        raise SlurmError(f"verify report not found: {p}", code="invalid_request") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SlurmError(f"{p}: invalid JSON ({getattr(exc, 'msg', exc)})", code="invalid_request") from None
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), dict) and "hosts" not in doc:
        doc = {"hosts": {n: {"status": v.get("status"), "gpus": [],
                             "links": [f"{n}:nic-rail{r}" for r in v.get("rails") or []],
                             "ratio": v.get("ratio", 0.0)} if isinstance(v, dict) else v
                         for n, v in doc["nodes"].items()}}
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    if not isinstance(hosts, dict):
        raise SlurmError(f"{p}: not a verify report (no 'hosts' object; write one with bandpilot verify --json)",
                         code="invalid_request")
    for host, v in hosts.items():
        if not isinstance(v, dict) or v.get("status") not in VERDICT_STATUSES:
            got = v.get("status") if isinstance(v, dict) else v
            raise SlurmError(f"{p}: hosts.{host}.status must be one of {', '.join(VERDICT_STATUSES)}, got {got!r}",
                             code="invalid_request")
        ratio = v.get("ratio", 0.0)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise SlurmError(f"{p}: hosts.{host}.ratio must be a number, got {ratio!r}", code="invalid_request")
    return hosts


def verdict_reason(v: Mapping[str, Any]) -> str:
    """``bandpilot verify: degraded (h100-1:3), measured/expected 0.62``."""
    what = ", ".join(list(v.get("links") or []) or list(v.get("gpus") or []) or ["host"])
    return f"{REASON_PREFIX} {v['status']} ({what}), measured/expected {float(v.get('ratio', 0.0)):.2f}"


def apply_verdicts(verdicts: Mapping[str, Mapping[str, Any]], env: Mapping[str, str] | None = None,
                   dry_run: bool = False) -> dict[str, list[str]]:
    """Drain every host found degraded or failed, resume every healthy host BandPilot had drained.
    Every host is checked against Slurm before anything changes (an unknown one: nothing changes)."""
    names = list(verdicts)
    known = _nodes(names, env)
    out: dict[str, list[str]] = {"drained": [], "resumed": [], "unchanged": []}
    for host, v in verdicts.items():
        info = known[host]
        if v["status"] != "healthy":
            reason = verdict_reason(v)
            if not dry_run:
                run(["scontrol", "update", f"NodeName={host}", "State=DRAIN", f"Reason={reason}"], env=env)
            out["drained"].append(host)
        elif _drained(info) and info.reason.startswith(REASON_PREFIX):
            if not dry_run:
                run(["scontrol", "update", f"NodeName={host}", "State=RESUME"], env=env)
            out["resumed"].append(host)
        else:
            out["unchanged"].append(host)
    return out
