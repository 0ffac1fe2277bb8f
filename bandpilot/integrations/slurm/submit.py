"""Submitting a job to Slurm on the GPUs BandPilot picks: read live state from Slurm, place with the
dispatcher, submit one batch script that asks for exactly those nodes, per-node counts and (where
the nodes declare one gres type per GPU index) indices, then read back what Slurm granted.

How the request is expressed, and what Slurm 22.05 honours, is in
:mod:`bandpilot.queue.launch_slurm`. The script goes to ``sbatch`` in one call, so a job is either
wholly submitted or not at all (heterogeneous components included).
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from bandpilot.errors import RequestError
from bandpilot.integrations.slurm.commands import SlurmError, run
from bandpilot.integrations.slurm.state import Snapshot, build_state, parse_jobs, parse_nodes
from bandpilot.queue.launch_slurm import batch_script, components, single_job
from bandpilot.topology.cluster import ClusterSpec

#: sbatch options BandPilot sets itself (a user's would contradict the placement)
OWNED = ("-N", "--nodes", "-w", "--nodelist", "-n", "--ntasks", "--ntasks-per-node", "--gres", "-G", "--gpus",
         "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket", "-x", "--exclude", "-m", "--distribution",
         "--het-group", "-F", "--nodefile", "--wrap", "--exclusive")
_TYPED = re.compile(r"gpu:([^:(,]+):(\d+)")
_INDEX = re.compile(r"(\d+)$")
_NODE = re.compile(r"(?<![A-Za-z_])NodeName=(\S+)")
_GRES = re.compile(r"(?<![A-Za-z_])Gres=(\S+)")
_SOCKETS = re.compile(r"\(S:[^)]*\)")


def node_types(node_text: str) -> dict[str, dict[int, str]]:
    """``scontrol -o show node -d`` -> node -> GPU index -> gres type, for nodes that declare one
    type per index (types ending in the index, each count 1, covering 0..n-1: ``h100_3``)."""
    out: dict[str, dict[int, str]] = {}
    for line in node_text.splitlines():
        name, gres = _NODE.search(line), _GRES.search(line)
        if not name or not gres:
            continue
        pairs = _TYPED.findall(_SOCKETS.sub("", gres.group(1)))
        idx: dict[int, str] = {}
        for t, c in pairs:
            m = _INDEX.search(t)
            if c != "1" or not m or int(m.group(1)) in idx:
                idx = {}
                break
            idx[int(m.group(1))] = t
        if idx and sorted(idx) == list(range(len(idx))):
            out[name.group(1)] = idx
    return out


@dataclass
class Live:
    """One read of Slurm: the dispatcher's state, the per-index gres types, and how long it took."""

    snapshot: Snapshot
    types: dict[str, dict[int, str]]
    read_ms: float


def read_live(spec: ClusterSpec, env: Mapping[str, str] | None = None) -> Live:
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    # both reads at once (each is a client process and a round trip); a GPU either read calls busy
    # stays busy (state.build_state), so their order does not matter
    with ThreadPoolExecutor(2) as pool:
        jobs_read = pool.submit(run, ["scontrol", "-o", "show", "job", "-d"], env=env)
        node_text = run(["scontrol", "-o", "show", "node", "-d"], env=env)
        job_text = jobs_read.result()
    nodes = parse_nodes(node_text)
    if not set(nodes) & set(spec.host_index):
        raise SlurmError(f"Slurm knows none of cluster {spec.name}'s hosts ({', '.join(spec.host_names[:3])}...); "
                         f"its nodes are {', '.join(list(nodes)[:5]) or 'none'}", code="not_found")
    snap = build_state(spec, nodes, parse_jobs(job_text))
    return Live(snap, node_types(node_text), (time.perf_counter() - t0) * 1e3)


def place(dispatcher: Any, live: Live, k: int, *, shape: Any = None, constraints: Mapping[str, Any] | None = None,
          algorithm: str | None = None):
    """The dispatcher's selection on the live state; ``rank_map`` gives its ranks."""
    allowed = (constraints or {}).get("allowed_hosts")
    if allowed:
        spec = live.snapshot.state.spec
        unknown = [h for h in allowed if h not in spec.host_index or h in live.snapshot.missing]
        if unknown:
            raise RequestError(f"node {unknown[0]!r} is not a node of cluster {spec.name} that Slurm knows")
    return dispatcher.select(k, live.snapshot.state, algorithm, constraints=constraints, shape=shape)


def rank_map(sel: Any) -> list[str]:
    """GPU ids in rank order: a shaped selection's ranks, else the GPUs in host order."""
    return list(sel.ranks) if sel.ranks else list(sel.gpus)


def _opt_name(word: str) -> str:
    return word.split("=", 1)[0]


def check_options(opts: Sequence[str], where: str) -> None:
    """Refuse sbatch options that would contradict BandPilot's placement, naming the first."""
    for w in opts:
        name = _opt_name(w)
        if name in OWNED or (name.startswith("-") and not name.startswith("--") and len(name) > 2
                             and name[:2] in {"-N", "-w", "-n", "-G", "-x", "-m"}):
            raise RequestError(f"{where}: sbatch option {name} is BandPilot's to set (it places the job); drop it")
        if w.strip() == "hetjob":
            raise RequestError(f"{where}: '#SBATCH hetjob' is BandPilot's to set (one component per node)")


def read_script(path: str | Path) -> tuple[str, list[str]]:
    """A bash batch script's body (without its ``#!`` line) and the options of its ``#SBATCH``
    lines (those before the first command, as sbatch reads them)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise RequestError(f"batch script {p}: {exc.strerror or exc}") from None
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise RequestError(f"{p}:1: a batch script starts with #! (e.g. #!/bin/bash)")
    interp = lines[0][2:].split()
    shell = Path(interp[0]).name if interp else ""
    if shell == "env" and len(interp) > 1:
        shell = interp[1]
    if shell not in ("bash", "sh"):
        raise RequestError(f"{p}:1: BandPilot wraps bash scripts (its srun sets the rank map); {lines[0]!r} is not bash")
    opts: list[str] = []
    for n, line in enumerate(lines[1:], start=2):
        s = line.strip()
        if s.startswith("#SBATCH"):
            words = shlex.split(s[len("#SBATCH"):].split(" #")[0])
            check_options(words, f"{p}:{n}")
            opts.extend(words)
        elif s and not s.startswith("#"):
            break
    body = "\n".join(ln for ln in lines[1:] if not ln.strip().startswith("#SBATCH"))
    return body, opts


@dataclass
class Grant:
    """What Slurm granted a job: node -> GPU indices (sorted), once every component runs."""

    job_id: str
    state: str
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    reason: str = ""
    #: the job ids of its components (one for an ordinary job)
    ids: tuple[str, ...] = ()

    @property
    def gpu_ids(self) -> list[str]:
        return [f"{n}:{i}" for n, idx in self.gpus.items() for i in idx]


_STATE = re.compile(r"(?<![A-Za-z_])JobState=(\S+)")
_REASON = re.compile(r"(?<![A-Za-z_])Reason=(\S+)")
ENDED = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "PREEMPTED")


def read_grant(job_id: str, env: Mapping[str, str] | None = None) -> Grant:
    """The job's state and, when all its components hold GPUs, the granted indices per node."""
    text = run(["scontrol", "-o", "show", "job", "-d", job_id], env=env)
    states = _STATE.findall(text)
    reasons = [r for r in _REASON.findall(text) if r != "None"]
    state = next((s for s in states if s != "RUNNING"), states[0] if states else "UNKNOWN")
    ids = tuple(re.findall(r"(?<![A-Za-z_])JobId=(\d+)", text))
    g = Grant(job_id, state, reason=reasons[0] if reasons else "", ids=ids)
    held = parse_jobs(text)
    if states and all(s == "RUNNING" or s == "COMPLETING" or s == "COMPLETED" for s in states):
        for j in held:
            for node, idx in j.gpus.items():
                g.gpus[node] = tuple(sorted(set(g.gpus.get(node, ())) | set(idx)))
    return g


def wait_grant(job_id: str, env: Mapping[str, str] | None, timeout: float, poll: float = 0.2) -> Grant:
    """Poll until the job's GPUs are granted, it ended, or ``timeout`` seconds passed."""
    end = time.monotonic() + timeout
    while True:
        g = read_grant(job_id, env)
        if g.gpus or g.state in ENDED or time.monotonic() >= end:
            return g
        time.sleep(poll)


def sbatch(script: str, env: Mapping[str, str] | None = None) -> str:
    """Submit ``script`` on stdin in one call; the job id (Slurm's error message when refused)."""
    out = run(["sbatch", "--parsable"], env=env, input=script).strip()
    jid = out.split(";")[0].strip()
    if not jid.isdigit():
        raise SlurmError(f"sbatch answered {out[:80]!r}, not a job id")
    return jid


@dataclass
class Submission:
    job_id: str
    ranks: list[str]
    script: str
    predicted_gbps: float
    single_job: bool
    indices_pinned: bool  # every node names its exact GPUs (per-index gres types)
    state_ms: float
    place_ms: float
    grant: Grant | None = None
    granted_gbps: float | None = None

    def verdict(self) -> dict[str, bool]:
        """Do the granted nodes, per-node counts and indices equal the request's?"""
        if self.grant is None or not self.grant.gpus:
            return {}
        want: dict[str, set[int]] = {}
        for g in self.ranks:
            n, _, i = g.rpartition(":")
            want.setdefault(n, set()).add(int(i))
        got = {n: set(v) for n, v in self.grant.gpus.items()}
        return {"nodes": set(want) == set(got),
                "counts": {n: len(v) for n, v in want.items()} == {n: len(v) for n, v in got.items()},
                "indices": want == got}


def submit(dispatcher: Any, spec: ClusterSpec, k: int, body: str, *, options: Sequence[str] = (), shape: Any = None,
           constraints: Mapping[str, Any] | None = None, algorithm: str | None = None,
           env: Mapping[str, str] | None = None, wait: float = 60.0, dry_run: bool = False) -> Submission:
    """Read, place, submit, read back (module docstring). ``wait`` bounds the wait for the grant."""
    check_options(options, "sbatch options")
    live = read_live(spec, env)
    t0 = time.perf_counter()
    sel = place(dispatcher, live, k, shape=shape, constraints=constraints, algorithm=algorithm)
    place_ms = (time.perf_counter() - t0) * 1e3
    ranks = rank_map(sel)
    comps = components(ranks, live.types)
    script = batch_script(ranks, body, types=live.types, extra=options)
    sub = Submission("", ranks, script, float(sel.predicted_gbps), single_job(comps),
                     all(c.types is not None for c in comps), live.read_ms, place_ms)
    if dry_run:
        return sub
    sub.job_id = sbatch(script, env)
    if wait > 0:
        try:
            sub.grant = wait_grant(sub.job_id, env, wait)
        except SlurmError as exc:  # the job is in Slurm: say which, so it is never lost track of
            raise SlurmError(f"job {sub.job_id} was submitted, but reading its grant failed: {exc}",
                             code=exc.code) from None
        if sub.grant.gpus:
            known = [g for g in sub.grant.gpu_ids if g.rpartition(":")[0] in spec.host_index]
            if known:
                sub.granted_gbps = float(dispatcher.predict(known, live.snapshot.state)["predicted_gbps"])
    return sub


def requested_ranks(job_id: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The rank map a BandPilot-submitted job asked for (``BANDPILOT_RANKS`` in its batch script)."""
    text = run(["scontrol", "write", "batch_script", job_id, "-"], env=env)
    m = re.search(r"^export BANDPILOT_RANKS=(\S+)$", text, re.M)
    if not m:
        raise RequestError(f"job {job_id} was not submitted by BandPilot: its batch script sets no BANDPILOT_RANKS")
    return m.group(1).split(",")


def check(dispatcher: Any, spec: ClusterSpec, job_id: str, env: Mapping[str, str] | None = None) -> Submission:
    """A submitted job's request next to its grant, both predicted on today's state without the job."""
    if not job_id.isdigit():
        raise RequestError(f"job id {job_id!r} must be a number")
    ranks = requested_ranks(job_id, env)
    grant = read_grant(job_id, env)
    live = read_live(spec, env)
    state = live.snapshot.state
    for jid in grant.ids:
        if any(j.id == jid for j in state.jobs):
            state = state.without_job(jid)
    known = [g for g in grant.gpu_ids if g.rpartition(":")[0] in spec.host_index]
    comps = components(ranks, live.types)
    sub = Submission(job_id, ranks, "", float(dispatcher.predict(ranks, state)["predicted_gbps"]), single_job(comps),
                     all(c.types is not None for c in comps), live.read_ms, 0.0, grant)
    if known:
        sub.granted_gbps = float(dispatcher.predict(known, state)["predicted_gbps"])
    return sub
