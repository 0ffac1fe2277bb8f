"""``bandpilot queue ...``, ``bandpilot cluster ...`` and ``bandpilot dispatch``.

Thin wrappers over :mod:`bandpilot.queue`. Every command takes ``--store URL`` (default
``$BANDPILOT_STORE`` or ``sqlite:///<project>/.bandpilot/queue.db``); ``cluster init`` records the
cluster spec in the store so later commands need no ``--cluster``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from bandpilot.cli.main import app
from bandpilot.topology.cluster import resolve_spec
from bandpilot.errors import RequestError

queue_app = typer.Typer(help="Submit, list, release and cancel GPU requests.", no_args_is_help=True)
cluster_app = typer.Typer(help="The queue's cluster: init, drain/undrain hardware, state, fragmentation.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")
app.add_typer(cluster_app, name="cluster")

STORE_OPT = typer.Option(None, "--store", envvar="BANDPILOT_STORE", help="Store URL (sqlite:///FILE, a file path or postgresql://...).")
JSON_OPT = typer.Option(False, "--json", help="Print JSON.")


def _store(url: Optional[str], *, create: bool = False):
    from bandpilot.cli.common import cli_store

    return cli_store(url, create=create)


def _echo_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, default=str))


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(x: Optional[float], nd: int = 1) -> str:
    return "" if x is None else f"{x:.{nd}f}"


def load_dispatcher(uri: str):
    """The promoted model as a dispatcher (tests replace this to inject a model)."""
    from bandpilot.dispatch.dispatcher import Dispatcher

    return Dispatcher.load(uri)




# ------------------------------------------------------------------------------------------
# queue
# ------------------------------------------------------------------------------------------
@queue_app.command("submit")
def submit_cmd(
    file: Optional[str] = typer.Argument(None, help="JSONL file of requests ('-' = stdin); omit to use the flags."),
    partial: bool = typer.Option(False, "--partial", help="Import the valid lines even if some are bad."),
    req_id: Optional[str] = typer.Option(None, "--id", help="Request id (default: generated)."),
    k: Optional[int] = typer.Option(None, "--k", "-k", help="GPUs wanted (all or nothing)."),
    tenant: str = typer.Option("default", "--tenant", "-t", help="Tenant the request belongs to."),
    priority: int = typer.Option(0, "--priority", "-p", help="Higher goes first under the priority policy."),
    utility: Optional[float] = typer.Option(None, "--utility", "-u", help="Job utility score (utility policy)."),
    single_host: bool = typer.Option(False, "--single-host", help="All GPUs on one host."),
    single_domain: bool = typer.Option(False, "--single-domain", help="All GPUs in one domain (rack)."),
    whole_domains: bool = typer.Option(False, "--whole-domains", help="Only wholly free domains (Slurm --exclusive=topo)."),
    segment: Optional[int] = typer.Option(None, "--segment", help="GPUs per segment kept in one NVLink domain (divides k)."),
    allowed_hosts: Optional[str] = typer.Option(None, "--allowed-hosts", help="Comma-separated host names."),
    allowed_gpus: Optional[str] = typer.Option(None, "--allowed-gpus", help="Comma-separated GPU ids."),
    min_gbps: Optional[float] = typer.Option(None, "--min-gbps", help="Minimum predicted bandwidth (GB/s)."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Expected run time limit in seconds (Slurm --time), for planning."),
    comm_fraction: Optional[float] = typer.Option(None, "--comm-fraction", help="Share of the run time in collectives [0, 1]."),
    preemptible: bool = typer.Option(False, "--preemptible", help="May be checkpointed and requeued."),
    checkpoint_s: Optional[float] = typer.Option(None, "--checkpoint-s", help="Cost of one checkpoint + restart, seconds."),
    min_k: Optional[int] = typer.Option(None, "--min-k", help="Elastic: the fewest GPUs the job can run on (default k)."),
    max_k: Optional[int] = typer.Option(None, "--max-k", help="Elastic: the most GPUs the job can use (default k)."),
    k_step: Optional[int] = typer.Option(None, "--k-step", help="Elastic: sizes are min-k plus multiples of this."),
    scaling: Optional[float] = typer.Option(None, "--scaling", help="Elastic: compute scaling efficiency per doubling "
                                            "of GPUs in (0, 1]; growth is priced by it (default: perfect, 1)."),
    shape: Optional[str] = typer.Option(None, "--shape", help="Parallelism shape tp=T,pp=P,dp=D[,ep=E][,model=PRESET] "
                                        "(k = tp*pp*dp; --k may be left out); placed per axis, rank map stored."),
    traffic: Optional[str] = typer.Option(None, "--traffic", help="With --shape: bytes per step per GPU per axis, "
                                          "e.g. tp=4GiB,dp=1.5e9 (default: the shape's preset model)."),
    compute_ms: Optional[float] = typer.Option(None, "--compute-ms", help="With --shape: compute time per step (ms)."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Queue requests from a JSONL file (one object per line) or from the flags."""
    from bandpilot import queue as q

    from bandpilot.cli.common import shape_flags

    shp = shape_flags(shape, traffic, compute_ms)  # one-line errors for a bad --shape / --traffic
    flags_used = k is not None or req_id is not None or min_k is not None or max_k is not None or shp is not None
    if file is not None and flags_used:
        raise RequestError("give either a JSONL file or --k/--id/--shape flags, not both")
    if file is None and k is None and shp is None:
        raise RequestError("nothing to submit: give a JSONL file, --k or --shape")
    if shp is not None and k is None:
        k = shp.k  # the shape fixes k; an explicit --k is checked against it (Request.from_dict)
    if file is not None:
        requests, errors, labels = _read_jsonl(file)
    else:
        cons = _flag_constraints(single_host, single_domain, whole_domains, segment, allowed_hosts, allowed_gpus, min_gbps)
        doc: dict[str, Any] = {"id": req_id or q.new_request_id(), "k": k, "tenant": tenant, "priority": priority}
        extra = (("utility", utility), ("time_limit_s", time_limit), ("comm_fraction", comm_fraction),
                 ("checkpoint_s", checkpoint_s), ("min_k", min_k), ("max_k", max_k), ("k_step", k_step),
                 ("scaling", scaling), ("preemptible", preemptible or None), ("constraints", cons or None),
                 ("shape", shp.to_dict() if shp is not None else None))
        doc.update({key: v for key, v in extra if v is not None})
        requests, errors, labels = [q.Request.from_dict(doc, "flags")], [], ["flags"]
    st = _store(store)
    try:
        rep = q.submit(st, requests, partial=partial, errors=errors, labels=labels)
    except q.SubmitError as exc:
        if len(exc.errors) > 1:  # the error line names the first; list them all
            for e in exc.errors:
                typer.echo(f"invalid: {e}", err=True)
        raise
    for e in rep.errors:
        typer.echo(f"skipped: {e}", err=True)
    if as_json:
        _echo_json(rep.to_dict())
    else:
        skipped = f", {len(rep.errors)} skipped" if rep.errors else ""
        ids = f": {', '.join(rep.submitted)}" if len(rep.submitted) <= 5 else ""
        typer.echo(f"submitted {len(rep.submitted)} request(s){skipped}{ids}")


def _read_jsonl(file: str) -> tuple[list[Any], list[str], list[str]]:
    """Requests, per-line errors and ``file:line`` labels of a JSONL file (``-`` = stdin)."""
    from bandpilot import queue as q

    if file == "-":
        parsed = q.parse_jsonl(sys.stdin.read().splitlines(), name="<stdin>")
    else:
        parsed = q.parse_jsonl(Path(file))
    name = "<stdin>" if file == "-" else file
    return parsed.requests, parsed.errors, [f"{name}:{n}" for n in parsed.lines]


def _flag_constraints(single_host: bool, single_domain: bool, whole_domains: bool, segment: Optional[int],
                      allowed_hosts: Optional[str], allowed_gpus: Optional[str], min_gbps: Optional[float]) -> dict[str, Any]:
    """The constraints object the submit flags describe (only what was given: stored JSON stays minimal)."""
    cons: dict[str, Any] = {}
    if single_host:
        cons["single_host"] = True
    if single_domain:
        cons["single_domain"] = True
    if allowed_hosts:
        cons["allowed_hosts"] = [h.strip() for h in allowed_hosts.split(",") if h.strip()]
    if allowed_gpus:
        cons["allowed_gpus"] = [g.strip() for g in allowed_gpus.split(",") if g.strip()]
    if min_gbps is not None:
        cons["min_gbps"] = min_gbps
    if whole_domains:
        cons["whole_domains"] = True
    if segment is not None:
        cons["segment"] = segment
    return cons


@queue_app.command("status")
def status_cmd(store: Optional[str] = STORE_OPT, as_json: bool = JSON_OPT) -> None:
    """Request counts, GPU pool, tenants and the last batch."""
    from bandpilot import queue as q

    s = q.status(_store(store))
    if as_json:
        _echo_json(s)
        return
    r, g = s["requests"], s["gpus"]
    typer.echo(f"cluster {s['cluster']}  store {s['store']}")
    typer.echo("requests: " + "  ".join(f"{k} {v}" for k, v in r.items()))
    if s["deferral_reasons"]:
        typer.echo("pending because: " + "  ".join(f"{k} {v}" for k, v in s["deferral_reasons"].items()))
    typer.echo(
        f"gpus: total {g['total']}  free {g['free']}  busy {g['busy']}  unavailable {g['unavailable']}"
        + (f"  drain-pending {g['drain_pending']}" if g["drain_pending"] else "")
    )
    for t, v in sorted(s["tenants"].items()):
        typer.echo(f"tenant {t}: {v['jobs']} job(s), {v['gpus']} GPU(s)")
    b = s["last_batch"]
    if b:
        state = "INTERRUPTED" if b["interrupted"] else f"assigned {b['assigned']} deferred {b['deferred']} rejected {b['rejected']}"
        typer.echo(f"last batch #{b['id']} ({b['policy']}, model {b['model_version']}) at {b['started']}: {state}")
    for r in s.get("reservations", []):
        typer.echo(f"reservation {r['request_id']} ({r['mode']}): {q.describe_reservation(r)}")


@queue_app.command("list")
def list_cmd(
    status: Optional[str] = typer.Option(None, "--status", "-s", help="pending|assigned|rejected|released|cancelled"),
    tenant: Optional[str] = typer.Option(None, "--tenant", "-t", help="Only this tenant's requests."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=1, help="At most this many rows."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """List requests (oldest first) with their assignment or last deferral reason."""
    from bandpilot import queue as q

    rows = q.list_requests(_store(store), status=status, tenant=tenant, limit=limit)
    if as_json:
        _echo_json(rows)
        return
    out = [
        [r["id"], r["tenant"], r["k"], r["priority"], _fmt(r["utility"], 2), r["status"],
         q.format_gpus(r["gpus"]) if r["gpus"] else
         (f"reserved: {q.describe_reservation(r['reservation'])}" if r.get("reservation") else (r["reason"] or "")),
         _fmt(r["predicted_gbps"]), r["model_version"] or ""]
        for r in rows
    ]
    typer.echo(_table(out, ["id", "tenant", "k", "prio", "util", "status", "gpus / reason", "pred GB/s", "model"]))


@queue_app.command("release")
def release_cmd(
    jobs: List[str] = typer.Argument(..., help="Job (= request) ids."),
    measured_gbps: Optional[float] = typer.Option(None, "--measured-gbps",
                                                  help="Bandwidth the job saw (one job): stored next to its prediction."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """End jobs: their GPUs go back to the free pool (drained ones become unavailable)."""
    from bandpilot import queue as q
    from bandpilot.errors import RequestError

    if measured_gbps is not None and len(jobs) != 1:
        raise RequestError("--measured-gbps reports one job's bandwidth: release that job on its own")
    st = _store(store)
    res = q.release_many(st, jobs, None if measured_gbps is None else {jobs[0]: measured_gbps})
    if as_json:
        _echo_json(res)
        return
    for r in res:
        extra = f", {len(r['unavailable'])} drained" if r["unavailable"] else ""
        typer.echo(f"released {r['job']}: {len(r['freed'])} GPU(s) free{extra}")


@queue_app.command("show")
def show_cmd(
    job: str = typer.Argument(..., help="Job (= request) id."),
    fmt: str = typer.Option("json", "--format", "-f", help="json | slurm | hostfile | env | k8s"),
    store: Optional[str] = STORE_OPT,
) -> None:
    """A job's GPUs as launcher input: Slurm nodelist + CUDA_VISIBLE_DEVICES, MPI hostfile, env, k8s."""
    from bandpilot import queue as q

    if fmt not in q.FORMATS:  # before opening the store: a typo costs nothing
        from bandpilot.errors import RequestError

        raise RequestError(f"unknown format {fmt!r}: use one of {', '.join(q.FORMATS)}")
    typer.echo(q.render(q.assignment(_store(store), job), fmt))


@queue_app.command("rebalance")
def rebalance_cmd(
    jobs: Optional[List[str]] = typer.Argument(None, help="Running elastic jobs at an epoch boundary (default: all of them)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model URI (default models:/bandpilot-<cluster>@champion)."),
    policy: str = typer.Option("utility", "--policy", help="Admission order of the pending queue: fifo | priority | sjf | utility | hrrn"),
    algorithm: str = typer.Option("bandpilot", "--algorithm", help="Dispatcher strategy for admissions."),
    demand: str = typer.Option("full", "--demand", help="Co-tenant pressure stored for resized and new jobs: full | comm."),
    blind_growth: bool = typer.Option(False, "--blind-growth", help="Grow/shrink by GPU id, ignoring predicted bandwidth (baseline)."),
    growth_pricing: str = typer.Option("welfare", "--growth-pricing", help="welfare (growths and admission sizes priced by their total effect on the job and its NIC co-tenants) | self (the job's own epoch time only; baseline)."),
    scaling_pricing: str = typer.Option("declared", "--scaling-pricing", help="declared (a growth's compute share priced by the request's declared scaling; undeclared: perfect) | perfect (every job as perfect; the pricing before)."),
    current_share: bool = typer.Option(False, "--current-share/--declared-share", help="Default declared (the declared collective share read as the share now). --current-share: a growth is priced from the job's collective share at its current size, derived from the declared share at its requested k."),
    fill_idle: bool = typer.Option(False, "--fill-idle/--no-fill-idle", help="Default off. Elastic: GPUs still free after the round when no request waits are offered to the jobs at a boundary, shortest remaining work first, each growth priced as any (with the srpt rules, running jobs keep their size when nothing waits)."),
    relocate: bool = typer.Option(True, "--relocate/--no-relocate", help="Default on. A resize may move the job onto a fresh placement, priced like a growth."),
    admission: str = typer.Option("fit-k", "--admission", help="fit-k (admit while the requested k of every admitted job fits) | min-k (while min_k fits, then every job that fits) | idle (the entropy-guided scheduling paper's rule: while its k fits the GPUs idle now) | srpt (by estimated remaining work; only jobs with more remaining yield to min_k) | srpt-suspend (shortest remaining work first, each claiming 2 x min_k up to a host; a running job left without GPUs is suspended to 0 at its epoch boundary and resumes later) | srpt-host (the same, running jobs keep min_k) | hesrpt-suspend (heSRPT shares by rank in remaining work, up to a host each; a running job whose share is below min_k is suspended) | srpt-marginal (srpt-suspend with each claim sized by marginal gain on the job's priced speed curve: the size minimising t(k)(1 + m k / G), m the jobs waiting behind it) | srpt-fill (srpt-suspend; GPUs the round leaves free while requests wait go to them, shortest remaining work first, each at the largest size up to its claim that fits one host)."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Epoch-boundary round (entropy-guided quotas): resize elastic jobs by utility and admit pending ones, one transaction."""
    from bandpilot import scheduling as sched
    from bandpilot.scheduling.elastic import rebalance

    if policy not in sched.POLICIES:
        raise RequestError(f"unknown policy {policy!r}: use one of {', '.join(sched.POLICIES)}")
    if demand not in sched.DEMAND_MODELS:
        raise RequestError(f"unknown demand model {demand!r}: use one of {', '.join(sched.DEMAND_MODELS)}")
    st = _store(store)
    from bandpilot.config import model_uri
    uri = model or model_uri(st.spec.name)
    dispatcher = load_dispatcher(uri)  # ModelError before anything is touched
    rep = rebalance(st, dispatcher, at_boundary=jobs or None, blind=blind_growth, algorithm=algorithm, demand=demand,
                    policy=policy, pricing=growth_pricing, admission=admission, scaling=scaling_pricing,
                    relocate=relocate, current_share=current_share, fill_idle=fill_idle)
    doc = {"quotas": rep.quotas, "resized": rep.resized, "admitted": rep.admitted, "waiting": rep.waiting,
           "suspended": rep.suspended}
    if as_json:
        _echo_json(doc)
        return
    for r in rep.resized:
        typer.echo(f"{r['job']}: {r['previous_k']} -> {r['k']} GPUs (generation {r['generation']})")
    for rid in rep.suspended:
        typer.echo(f"{rid}: suspended (0 GPUs until it resumes)")
    for rid, gpus in rep.admitted.items():
        typer.echo(f"{rid}: started on {len(gpus)} GPUs")
    typer.echo(f"{len(rep.resized)} resized, {len(rep.suspended)} suspended, {len(rep.admitted)} admitted, "
               f"{len(rep.waiting)} waiting")


@queue_app.command("cancel")
def cancel_cmd(requests: List[str] = typer.Argument(..., help="Pending request ids."), store: Optional[str] = STORE_OPT) -> None:
    """Withdraw pending requests."""
    from bandpilot import queue as q

    st = _store(store)
    for r in requests:
        q.cancel(st, r)
        typer.echo(f"cancelled {r}")


# ------------------------------------------------------------------------------------------
# cluster
# ------------------------------------------------------------------------------------------
@cluster_app.command("init")
def init_cmd(
    cluster: str = typer.Option(..., "--cluster", "-c", help="Cluster spec (YAML file or name in params/clusters)."),
    force: bool = typer.Option(False, "--force", help="Replace a different cluster (no active jobs allowed)."),
    store: Optional[str] = STORE_OPT,
) -> None:
    """Record the cluster in the store; every GPU starts free."""
    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster(resolve_spec(cluster))
    st = _store(store, create=True)  # the one command that makes a store
    changed = st.init_cluster(spec, force=force)
    verb = "initialised" if changed else "already initialised with"
    typer.echo(f"{verb} cluster {spec.name} ({spec.n_hosts} hosts, {spec.n_gpus} GPUs) in {st.safe_url}")


@cluster_app.command("drain")
def drain_cmd(
    targets: List[str] = typer.Argument(..., help="GPU ids, host names or domain names."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (kept with the GPU rows)."),
    store: Optional[str] = STORE_OPT,
) -> None:
    """Take hardware out of the free pool; busy GPUs follow when their job is released."""
    from bandpilot import queue as q

    st = _store(store)
    for t in targets:
        r = q.drain(st, t, reason)
        typer.echo(f"drain {t}: {len(r['drained'])} now unavailable, {len(r['pending'])} on release, {len(r['already'])} already")


@cluster_app.command("undrain")
def undrain_cmd(
    targets: List[str] = typer.Argument(..., help="GPU ids, host names or domain names."),
    store: Optional[str] = STORE_OPT,
) -> None:
    """Return drained hardware to the free pool."""
    from bandpilot import queue as q

    st = _store(store)
    for t in targets:
        r = q.undrain(st, t)
        typer.echo(f"undrain {t}: {len(r['undrained'])} back in the pool, {len(r['cancelled'])} pending drains cancelled")


@cluster_app.command("state")
def state_cmd(store: Optional[str] = STORE_OPT, as_json: bool = JSON_OPT) -> None:
    """Free GPUs and running jobs; with --json, the state file `select --state` reads."""
    from bandpilot import queue as q

    doc = q.export_state(_store(store))
    if as_json:
        _echo_json(doc)
        return
    typer.echo(f"free ({len(doc['free'])}): {q.format_gpus(doc['free'])}")
    for j in doc["jobs"]:
        typer.echo(f"job {j['id']}: {q.format_gpus(j['gpus'])}  demand {j['demand_gbps']:.1f} GB/s")


@cluster_app.command("fragmentation")
def fragmentation_cmd(store: Optional[str] = STORE_OPT, as_json: bool = JSON_OPT) -> None:
    """Free GPUs stranded per host (and domain) and the largest request that still fits."""
    from bandpilot import queue as q

    f = q.fragmentation(_store(store))
    if as_json:
        _echo_json(f)
        return
    lp = f["largest_placeable"]
    typer.echo(
        f"{f['cluster']}: {f['free']} free / {f['busy']} busy / {f['unavailable']} unavailable of {f['gpus']}; "
        f"stranded {f['stranded']}; fragmentation {f['fragmentation']:.2f}"
    )
    typer.echo("largest placeable: " + "  ".join(f"{k} {v}" for k, v in lp.items()))
    rows = [[h["host"], h["domain"] or "", h["gpus"], h["free"], h["busy"], h["unavailable"], h["stranded"]] for h in f["hosts"]]
    typer.echo(_table(rows, ["host", "domain", "gpus", "free", "busy", "unavail", "stranded"]))
    if "domains" in f:
        rows = [[d["domain"], d["hosts"], d["gpus"], d["free"], d["busy"], d["unavailable"], d["stranded"], d["largest_single_host"]] for d in f["domains"]]
        typer.echo(_table(rows, ["domain", "hosts", "gpus", "free", "busy", "unavail", "stranded", "max/host"]))


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------
@app.command("dispatch")
def dispatch_cmd(
    batch: bool = typer.Option(True, "--batch", hidden=True),  # once required; batch is the only mode
    profile: str = typer.Option("recommended", "--profile", "-p", help="Scheduler profile: recommended | slurm-like (FIFO, EASY backfill, compact placement) | fifo-greedy (FIFO, greedy backfill, compact), or a profile YAML file (docs/guide/profiles.md)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model URI (default models:/bandpilot-<cluster>@champion)."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=1, help="Consider at most this many requests."),
    commit: str = typer.Option("batch", "--commit", help="batch (one transaction) | request (one per request)"),
    demand: str = typer.Option("full", "--demand", help="Co-tenant pressure stored for new jobs: full | comm (scaled by the request's comm_fraction)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Summary line only."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Run one batch: assign pending requests with the promoted model, as the scheduler profile says."""
    from bandpilot import queue as q
    from bandpilot import scheduling as sched

    prof = sched.get_profile(profile)  # a bad profile: one line, before the store or the model is touched
    if commit not in sched.COMMIT_MODES:
        raise RequestError(f"unknown commit mode {commit!r}: use one of {', '.join(sched.COMMIT_MODES)}")
    if demand not in sched.DEMAND_MODELS:
        raise RequestError(f"unknown demand model {demand!r}: use one of {', '.join(sched.DEMAND_MODELS)}")
    st = _store(store)
    idle = q.nothing_to_place(st)
    if idle is not None:  # the every-minute schedule: no model load, no torch import
        if as_json:
            _echo_json({"batch_id": None, "skipped": idle})
        else:
            typer.echo(f"no batch: {idle}")
        return
    from bandpilot.config import model_uri
    uri = model or model_uri(st.spec.name)
    dispatcher = load_dispatcher(uri)  # ModelError before anything is touched
    rep = sched.run_batch(st, dispatcher, prof, limit, commit=commit, model_uri=uri, demand=demand)
    if as_json:
        _echo_json(rep.to_dict())
        return
    c = rep.counts()
    if not quiet and rep.outcomes:
        rows = [
            [o.request_id, o.tenant, o.k, o.status, q.format_gpus(o.gpus) if o.gpus else (o.reason or ""),
             _fmt(o.predicted_gbps), o.algorithm or "", o.model_version or "", q.iso(o.at)]
            for o in rep.outcomes
        ]
        typer.echo(_table(rows, ["request", "tenant", "k", "status", "gpus / reason", "pred GB/s", "algorithm", "model", "time"]))
    typer.echo(
        f"batch #{rep.batch_id} ({rep.policy}, model {rep.model_version}): {c['assigned']} assigned, "
        f"{c['deferred']} deferred, {c['rejected']} rejected"
        + (f", {c['skipped']} taken by another run" if c["skipped"] else "")
        + f" of {rep.pending_before} pending in {rep.duration_s:.2f}s"
    )
    for r in rep.reservations:
        typer.echo(f"reservation {r['request_id']}: {q.describe_reservation(r)}")
    for pl in rep.preempted:
        typer.echo(f"preempted: {pl['detail']}")
