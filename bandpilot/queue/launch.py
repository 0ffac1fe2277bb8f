"""How does a launcher start a job on the GPUs it was given? Assignments as launcher input.

``json`` (everything), ``slurm`` (``--nodelist`` and a per-node ``CUDA_VISIBLE_DEVICES``), ``hostfile``
(MPI, one line per host with its slots), ``env`` (shell lines) and ``k8s`` (pod annotations and the
node selector term for the hosts).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from bandpilot.errors import RequestError, StateError
from bandpilot.queue.clock import iso
from bandpilot.queue.generations import current_generations, elastic_doc
from bandpilot.queue.schema import T_ASSIGN, T_REQ
from bandpilot.queue.store import Store

FORMATS = ("json", "slurm", "hostfile", "env", "k8s")


def assignment(store: Store, job_id: str) -> dict[str, Any]:
    """The assignment of a request: its GPUs grouped per host, in the cluster's host order."""
    with store.read() as conn:
        r = conn.execute(sa.select(T_REQ, T_ASSIGN).join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id, isouter=True)
                         .where(T_REQ.c.id == job_id)).mappings().first()
        gen = current_generations(conn, [job_id]).get(job_id, 0)
    if r is None:
        raise StateError(f"no request {job_id!r} in the store")
    if not r["gpus"]:
        raise StateError(f"request {job_id!r} is {r['status']}: it has no GPUs assigned")
    gpus = json.loads(r["gpus"])
    order = store.spec.host_index
    hosts: dict[str, list[int]] = {}
    for g in gpus:
        h, _, i = g.rpartition(":")
        hosts.setdefault(h, []).append(int(i))
    hosts = {h: sorted(v) for h, v in sorted(hosts.items(), key=lambda kv: order.get(kv[0], 0))}
    # k is the current generation's size (an elastic job's requested k may differ)
    return {"id": r["id"], "tenant": r["tenant"], "status": r["status"], "k": len(gpus), "gpus": gpus, "hosts": hosts,
            "predicted_gbps": r["predicted_gbps"], "model_version": r["model_version"], "assigned": iso(r["assigned_at"]),
            "generation": gen, **elastic_doc(r)}


def render(a: dict[str, Any], fmt: str) -> str:
    if fmt not in FORMATS:
        raise RequestError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    hosts = a["hosts"]
    cvd = {h: ",".join(map(str, v)) for h, v in hosts.items()}
    if fmt == "json":
        return json.dumps(a, indent=2)
    if fmt == "hostfile":
        return "\n".join(f"{h} slots={len(v)}" for h, v in hosts.items())
    if fmt == "env":
        lines = [f"BANDPILOT_JOB={a['id']}", f"BANDPILOT_HOSTS={','.join(hosts)}", f"BANDPILOT_NGPUS={len(a['gpus'])}"]
        lines += [f"CUDA_VISIBLE_DEVICES_{_envname(h)}={v}" for h, v in cvd.items()]
        return "\n".join(lines)
    if fmt == "slurm":
        lines = [f"#SBATCH --nodelist={','.join(hosts)}", f"#SBATCH --nodes={len(hosts)}", f"#SBATCH --ntasks={len(a['gpus'])}",
                 "# each node sees only its assigned GPUs:", 'case "$SLURMD_NODENAME" in']
        lines += [f"  {h}) export CUDA_VISIBLE_DEVICES={v} ;;" for h, v in cvd.items()]
        lines.append("esac")
        return "\n".join(lines)
    # k8s: one annotation per host with its device indices, and a node affinity term for the hosts
    ann = {"bandpilot.io/job": a["id"], "bandpilot.io/gpus": ",".join(a["gpus"])}
    ann.update({f"bandpilot.io/devices.{h}": v for h, v in cvd.items()})
    doc = {"metadata": {"annotations": ann},
           "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
               {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(hosts)}]}]}}}}}
    return json.dumps(doc, indent=2)


def _envname(host: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in host)
