"""How does a launcher start a job on the GPUs it was given? Assignments as launcher input.

``json`` (everything), ``slurm`` (a complete batch script: :mod:`bandpilot.queue.launch_slurm`),
``hostfile`` (MPI, one line per host with its slots), ``env`` (shell lines), ``torchrun`` (one
command per node) and ``k8s`` (pod annotations and the node selector term for the hosts; the node
affinity is enforced, the device indices are advisory and the output says so).

Every format carries the **rank map**: ``ranks`` (GPU ids in rank order; a shaped request's
Megatron order, else the GPUs in host order). Nodes are numbered in order of their first rank (node
rank 0 is ``MASTER_ADDR``), each node's ``CUDA_VISIBLE_DEVICES`` lists its GPUs in rank order (local
rank i -> the i-th listed device), the hostfile lists nodes in that order. When a node's ranks are not
one contiguous run, block launchers (torchrun, ``mpirun`` with a hostfile) cannot reproduce the map
and ``torchrun`` says so; the ``slurm`` script carries it (``SLURM_HOSTFILE`` or a task prolog).
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

FORMATS = ("json", "slurm", "hostfile", "env", "torchrun", "k8s")
MASTER_PORT = 29500
#: said in the k8s output itself: Kubernetes has no mechanism that pins device indices
ADVISORY_K8S = ("node affinity is enforced; the device indices are advisory: Kubernetes' GPU device plugin "
                "chooses which devices a pod gets (request bandpilot.io/gpu-count.NODE as nvidia.com/gpu in the "
                "pod on NODE) and nothing reads bandpilot.io/devices.*")


def assignment(store: Store, job_id: str) -> dict[str, Any]:
    """The assignment of a request: its GPUs grouped per host, in the cluster's host order."""
    with store.read() as conn:
        r = conn.execute(sa.select(T_REQ, T_ASSIGN).join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id, isouter=True)
                         .where(T_REQ.c.id == job_id)).mappings().first()
        gen = current_generations(conn, [job_id]).get(job_id, 0)
    if r is None:
        raise StateError(f"no request {job_id!r} in the store", code="not_found")
    if not r["gpus"]:
        raise StateError(f"request {job_id!r} is {r['status']}: it has no GPUs assigned")
    gpus = json.loads(r["gpus"])
    order = store.spec.host_index
    hosts: dict[str, list[int]] = {}
    for g in gpus:
        h, _, i = g.rpartition(":")
        hosts.setdefault(h, []).append(int(i))
    hosts = {h: sorted(v) for h, v in sorted(hosts.items(), key=lambda kv: order.get(kv[0], 0))}
    ranks = json.loads(r["ranks"]) if r.get("ranks") else None
    if ranks:  # a shaped request: nodes in order of their first rank, devices in rank order
        hosts = {}
        for g in ranks:
            h, _, i = g.rpartition(":")
            hosts.setdefault(h, []).append(int(i))
    extra = {"ranks": ranks or [f"{h}:{i}" for h, v in hosts.items() for i in v]}
    if r.get("shape"):
        extra["shape"] = json.loads(r["shape"])
    if r.get("placement"):
        extra.update(json.loads(r["placement"]))
    # k is the current generation's size (an elastic job's requested k may differ)
    return {**extra, "id": r["id"], "tenant": r["tenant"], "status": r["status"], "k": len(gpus), "gpus": gpus, "hosts": hosts,
            "predicted_gbps": r["predicted_gbps"], "model_version": r["model_version"], "assigned": iso(r["assigned_at"]),
            "generation": gen, **elastic_doc(r)}


def render(a: dict[str, Any], fmt: str) -> str:
    if fmt not in FORMATS:
        raise RequestError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    hosts = a["hosts"]
    ranks = a.get("ranks") or [f"{h}:{i}" for h, v in hosts.items() for i in v]
    cvd = {h: ",".join(map(str, v)) for h, v in hosts.items()}
    master = next(iter(hosts))
    runs = [h for j, h in enumerate(g.rpartition(":")[0] for g in ranks) if j == 0 or ranks[j - 1].rpartition(":")[0] != h]
    blocks = len(runs) == len(hosts)  # every node's ranks form one contiguous run
    if fmt == "json":
        return json.dumps(a, indent=2)
    if fmt == "hostfile":
        return "\n".join(f"{h} slots={len(v)}" for h, v in hosts.items())
    if fmt == "env":
        lines = [f"BANDPILOT_JOB={a['id']}", f"BANDPILOT_HOSTS={','.join(hosts)}", f"BANDPILOT_NGPUS={len(a['gpus'])}",
                 f"BANDPILOT_RANKS={','.join(ranks)}", f"MASTER_ADDR={master}", f"MASTER_PORT={MASTER_PORT}",
                 f"NNODES={len(hosts)}"]
        lines += [f"CUDA_VISIBLE_DEVICES_{_envname(h)}={v}" for h, v in cvd.items()]
        lines += [f"NODE_RANK_{_envname(h)}={n}" for n, h in enumerate(hosts)]
        return "\n".join(lines)
    if fmt == "slurm":  # a complete batch script: exact nodes, per-node counts, rank map, per-task devices
        from bandpilot.queue.launch_slurm import batch_script

        return batch_script(ranks, job=str(a["id"]), port=MASTER_PORT).rstrip("\n")
    if fmt == "torchrun":
        lines = [f"# job {a['id']}: {len(hosts)} nodes, {len(ranks)} ranks; run line i on node i"]
        if not blocks:
            lines.append("# WARNING: a node's ranks are not contiguous; torchrun numbers them in blocks, so this map"
                         " differs from the rank map: launch with the slurm format instead")
        lines += [f"{h}: CUDA_VISIBLE_DEVICES={cvd[h]} torchrun --nnodes={len(hosts)} --nproc-per-node={len(v)} "
                  f"--node-rank={n} --master-addr={master} --master-port={MASTER_PORT} YOUR_SCRIPT"
                  for n, (h, v) in enumerate(hosts.items())]
        return "\n".join(lines)
    # k8s: one annotation per host with its device indices, and a node affinity term for the hosts
    ann = {"bandpilot.io/job": a["id"], "bandpilot.io/gpus": ",".join(a["gpus"]),
           "bandpilot.io/ranks": ",".join(ranks), "bandpilot.io/master-addr": master}
    ann.update({f"bandpilot.io/devices.{h}": v for h, v in cvd.items()})
    ann.update({f"bandpilot.io/node-rank.{h}": str(n) for n, h in enumerate(hosts)})
    ann.update({f"bandpilot.io/gpu-count.{h}": str(len(v)) for h, v in hosts.items()})
    ann["bandpilot.io/advisory"] = ADVISORY_K8S
    doc = {"metadata": {"annotations": ann},
           "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
               {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(hosts)}]}]}}}}}
    return json.dumps(doc, indent=2)


def _envname(host: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in host)
