"""A Slurm batch script that gives a job exactly the GPUs BandPilot chose, as Slurm 22.05 honours it.

What Slurm honours (measured on Slurm 22.05 with cons_tres):

- **Nodes and per-node GPU counts.** One job asks for the same GPU count on every node
  (``--gres=gpu:C``); ``--distribution=arbitrary`` with a ``SLURM_HOSTFILE`` at submission does *not*
  carry per-node counts into the GPU allocation (a 5+3 request was granted 7+1). Uneven counts
  therefore use a **heterogeneous job**: one component per node (``--nodes=1 --nodelist=NODE
  --ntasks=C --gres=...``), separated by ``#SBATCH hetjob``. Components start together; Slurm
  22.05 starts heterogeneous jobs from the backfill scheduler only (``bf_interval`` sets how soon).
- **GPU indices.** With one gres ``Type=`` per GPU index (``bandpilot slurm conf --gpu-type
  index``) a component names its exact GPUs (``--gres=gpu:h100_0:1,gpu:h100_3:1``) and
  Slurm grants exactly those; untyped requests (``--gpus=N``) still match any of them. Without
  per-index types the indices are Slurm's choice (it follows ``Links=`` in gres.conf).
- **Rank map.** Within one job, ``SLURM_HOSTFILE`` + ``--distribution=arbitrary`` at ``srun`` puts
  task i on line i's node, so ``SLURM_PROCID`` is BandPilot's rank. Across heterogeneous components
  ``srun`` refuses an arbitrary distribution; ``srun --het-group=0-N`` numbers tasks component by
  component (components are ordered by their first rank, so the numbering matches whenever each
  node's ranks are one contiguous run).
- **Per-task devices.** Slurm sets ``CUDA_VISIBLE_DEVICES`` itself after the batch script ran (an
  ``export`` there is overwritten), but a **task prolog** (``SLURM_TASK_PROLOG``) runs in each
  task's environment after that and its ``export NAME=value`` lines reach the task. The prolog here
  sets ``RANK`` (BandPilot's, also for interleaved maps), ``LOCAL_RANK``, ``WORLD_SIZE`` and the
  node's devices in rank order (``CUDA_VISIBLE_DEVICES``; local rank i uses the i-th), but only when
  Slurm granted those devices; otherwise it keeps Slurm's and prints why.

The script defines ``srun`` as a shell function (exported, so child bash scripts see it too) that
adds ``--het-group`` for a heterogeneous job; the prolog and hostfile are written next to the job
(``$SLURM_SUBMIT_DIR``, which every node must see, as for ``--output``) and removed at exit.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

MASTER_PORT = 29500

#: the task prolog (bash; Slurm applies the ``export`` lines it prints and shows ``print`` lines)
TASK_PROLOG = r"""#!/bin/bash
# BandPilot task prolog: this task's rank, local rank and GPUs from the job's rank map.
node=$SLURMD_NODENAME
lid=${SLURM_LOCALID:-0}
IFS=, read -ra map <<< "$BANDPILOT_RANKS"
ranks=(); devs=()
for r in "${!map[@]}"; do
  if [ "${map[$r]%:*}" = "$node" ]; then ranks+=("$r"); devs+=("${map[$r]##*:}"); fi
done
echo "export WORLD_SIZE=${#map[@]}"
echo "export LOCAL_RANK=$lid"
if [ "$lid" -lt "${#ranks[@]}" ]; then
  echo "export RANK=${ranks[$lid]}"
  echo "export BANDPILOT_RANK=${ranks[$lid]}"
fi
granted=",${CUDA_VISIBLE_DEVICES:-},"
ok=1
for d in "${devs[@]}"; do case "$granted" in *",$d,"*) ;; *) ok=0 ;; esac; done
if [ "${#devs[@]}" -gt 0 ] && [ "$ok" = 1 ]; then
  (IFS=,; echo "export CUDA_VISIBLE_DEVICES=${devs[*]}")
  [ "$lid" -lt "${#devs[@]}" ] && echo "export BANDPILOT_GPU=${devs[$lid]}"
elif [ "${#devs[@]}" -gt 0 ]; then
  (IFS=,; echo "print bandpilot: $node was granted GPUs ${CUDA_VISIBLE_DEVICES:-none}, not BandPilot's ${devs[*]}: keeping Slurm's")
fi
"""


@dataclass(frozen=True)
class Component:
    """One node of the job: its GPU indices in rank order, and the gres type of each index where
    the node declares one type per index (None: untyped counts)."""

    node: str
    gpus: tuple[int, ...]
    types: Mapping[int, str] | None = None

    def gres(self) -> str:
        if self.types is None:
            return f"gpu:{len(self.gpus)}"
        return ",".join(f"gpu:{self.types[i]}:1" for i in sorted(self.gpus))


def components(ranks: Sequence[str], types: Mapping[str, Mapping[int, str]] | None = None) -> list[Component]:
    """Per-node components in order of each node's first rank (``ranks``: ``node:index`` in rank
    order); ``types`` maps node -> index -> gres type for nodes with one type per index."""
    per: dict[str, list[int]] = {}
    for g in ranks:
        node, _, idx = g.rpartition(":")
        per.setdefault(node, []).append(int(idx))
    out = []
    for node, idxs in per.items():
        t = (types or {}).get(node)
        out.append(Component(node, tuple(idxs), dict(t) if t and all(i in t for i in idxs) else None))
    return out


def single_job(comps: Sequence[Component]) -> bool:
    """True when one (non-heterogeneous) job asks for exactly these GPUs: one node, or the same
    count on every node and either untyped or the same index set everywhere."""
    if len(comps) == 1:
        return True
    first = comps[0]
    if any(len(c.gpus) != len(first.gpus) for c in comps):
        return False
    if all(c.types is None for c in comps):
        return True
    return all(c.types is not None and c.gres() == first.gres() for c in comps)


def sbatch_header(comps: Sequence[Component], extra: Sequence[str] = ()) -> list[str]:
    """The ``#SBATCH`` lines: one job, or one heterogeneous component per node; ``extra`` (the
    user's own sbatch options) goes on every component."""
    more = (" " + shlex.join(extra)) if extra else ""
    k = sum(len(c.gpus) for c in comps)
    if single_job(comps):
        c0 = comps[0]
        nodes = ",".join(c.node for c in comps)
        return [f"#SBATCH --nodes={len(comps)} --nodelist={nodes} --ntasks={k} "
                f"--ntasks-per-node={len(c0.gpus)} --gres={c0.gres()}{more}"]
    lines: list[str] = []
    for i, c in enumerate(comps):
        if i:
            lines.append("#SBATCH hetjob")
        lines.append(f"#SBATCH --nodes=1 --nodelist={c.node} --ntasks={len(c.gpus)} --gres={c.gres()}{more}")
    return lines


def batch_script(ranks: Sequence[str], body: str | None = None, *, types: Mapping[str, Mapping[int, str]] | None = None,
                 extra: Sequence[str] = (), job: str = "", port: int = MASTER_PORT) -> str:
    """A complete batch script (``#!/bin/bash`` first) for the rank map ``ranks``; ``body`` (a bash
    script without its ``#!`` line) follows the set-up, else a commented ``srun`` line."""
    comps = components(ranks, types)
    single = single_job(comps)
    tag = f" for {job}" if job else ""
    lines = ["#!/bin/bash", *sbatch_header(comps, extra),
             f"# BandPilot's placement{tag}: {len(ranks)} GPUs on {len(comps)} node{'' if len(comps) == 1 else 's'}"
             + ("" if single else " (one heterogeneous component per node: per-node counts differ or indices are pinned)")]
    lines += [f"#   {c.node}: GPUs {','.join(map(str, c.gpus))} (rank order)" for c in comps]
    lines += [
        f"export BANDPILOT_RANKS={','.join(ranks)}",
        f"export MASTER_ADDR={comps[0].node} MASTER_PORT={port} WORLD_SIZE={len(ranks)}",
        '_bp=${SLURM_SUBMIT_DIR:-$PWD}/.bandpilot-$SLURM_JOB_ID',
        "trap 'rm -f \"$_bp\".prolog \"$_bp\".hosts' EXIT",
        "# each task's RANK, LOCAL_RANK and CUDA_VISIBLE_DEVICES (rank order) come from this task prolog",
        "cat > \"$_bp\".prolog <<'BANDPILOT_PROLOG'",
        TASK_PROLOG.rstrip("\n"),
        "BANDPILOT_PROLOG",
        'chmod +x "$_bp".prolog',
        'export SLURM_TASK_PROLOG="$_bp".prolog',
    ]
    if single:
        lines += ["# the rank map: task i runs on line i's node (srun --distribution=arbitrary)",
                  "cat > \"$_bp\".hosts <<'BANDPILOT_HOSTS'", *[g.rpartition(":")[0] for g in ranks], "BANDPILOT_HOSTS",
                  'export SLURM_HOSTFILE="$_bp".hosts SLURM_DISTRIBUTION=arbitrary']
    else:
        lines += ["# srun spans every component; tasks are numbered component by component, RANK follows the map",
                  f'srun() {{ case " $* " in *" --het-group"*) command srun "$@" ;; '
                  f'*) command srun --het-group=0-{len(comps) - 1} "$@" ;; esac; }}',
                  "export -f srun"]
    lines.append(body.rstrip("\n") if body is not None else f"srun --ntasks={len(ranks)} YOUR_PROGRAM")
    return "\n".join(lines) + "\n"
