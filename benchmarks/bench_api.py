"""API load benchmark: concurrent tenants submitting and listing against a live ``bandpilot api``.

    python -m benchmarks.bench_api                                  # 200 clients, 60 s, PostgreSQL
    python -m benchmarks.bench_api --clients 50 --duration 20 --store sqlite:///tmp/q.db
    python -m benchmarks.bench_api --startup 3                     # start-up to serving only

Each client is one tenant with its own token; it starts at a random point of the first ``--think``
seconds, then loops { submit a request; list its pending requests (100 at most); sleep
``--think`` s, jittered x0.5-1.5 }. The server is the real CLI (`bandpilot api`, uvicorn)
in its own process on a fresh PostgreSQL schema (or the given store), the clients share an asyncio
loop in this process. Reported: requests, throughput, p50/p95/p99 latency per call, 5xx, and the
loss check - every acknowledged submit is stored exactly once and nothing unacknowledged beyond the
calls cut off at the end. Target: no 5xx, p99 <= 200 ms, zero lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bandpilot import queue as q  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432/test"


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process and its live descendants (uvicorn workers) used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK") + sum(_cpu_s(int(k)) for k in kids)


def _postgres_cpu_s() -> float:
    """CPU seconds used so far by every PostgreSQL process on this machine (other users' queries
    included: an upper bound for the benchmark's share)."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() not in ("postgres", "postmaster"):
                continue
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    return total


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _client(http, base: str, token: str, tenant: str, stop_at: float, think: float, lat: dict, acked: list,
                  errors: list) -> None:
    import aiohttp

    h = {"Authorization": f"Bearer {token}"}
    n = 0
    await asyncio.sleep(think * np.random.random())  # clients join over the first think time, not all at t=0
    while time.monotonic() < stop_at:
        rid = f"{tenant}-{n}"
        n += 1
        for kind, method, url, body in (("submit", "POST", f"{base}/v1/requests", {"id": rid, "k": 1 + n % 4}),
                                        ("list", "GET", f"{base}/v1/requests?status=pending&limit=100", None)):
            t0 = time.perf_counter()
            try:
                async with http.request(method, url, json=body, headers=h) as r:
                    text = await r.text()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                errors.append(f"{kind}: {type(exc).__name__}")
                continue
            lat[kind].append(time.perf_counter() - t0)
            if status >= 500:
                errors.append(f"{kind}: HTTP {status} {text[:80]}")
            elif kind == "submit":
                if status == 201:
                    acked.append(f"{tenant}:{rid}")  # a tenant's ids are stored under its name
                else:
                    errors.append(f"submit: HTTP {status} {text[:80]}")
        await asyncio.sleep(think * (0.5 + np.random.random()))  # jittered: clients do not march in step


async def _run(base: str, tokens: list[tuple[str, str]], duration: float, think: float):
    # aiohttp (already installed with MLflow) costs the load generator less CPU than httpx: on 2 shared
    # cores the clients must not starve the server they measure.
    import aiohttp

    lat: dict[str, list[float]] = {"submit": [], "list": []}
    acked: list[str] = []
    errors: list[str] = []
    conn = aiohttp.TCPConnector(limit=len(tokens) + 10)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as http:
        stop_at = time.monotonic() + duration
        await asyncio.gather(*(_client(http, base, tok, ten, stop_at, think, lat, acked, errors) for ten, tok in tokens))
    return lat, acked, errors


def _start(store_url: str, dispatch_s: float = 0.0, workers: int = 1) -> tuple[subprocess.Popen, str, float]:
    """Spawn `bandpilot api` on ``store_url``; returns the process, its base URL and the seconds
    from spawning it until ``/healthz`` answered 200."""
    import httpx

    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bandpilot", "api", "--store", store_url, "--port", str(port),
                             "--sample-s", "0", "--dispatch-s", str(dispatch_s), "--workers", str(workers)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base, time.perf_counter() - t0
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.perf_counter() - t0 > 60:
            proc.kill()
            raise RuntimeError(f"API did not start: {proc.stderr.read()[-500:]}")
        time.sleep(0.05)


def startup(runs: int) -> int:
    """Start-up to serving on SQLite and PostgreSQL (a fresh store each), ``runs`` times each, alternating."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        stores = {"SQLite": q.Store(f"sqlite:///{tmp}/q.db")}
        schema = f"bpbench_{uuid.uuid4().hex[:8]}"
        try:
            stores["PostgreSQL"] = q.Store(PG, schema=schema)
        except q.StoreError as exc:
            print(f"no PostgreSQL ({exc}): SQLite only", file=sys.stderr)
        times: dict[str, list[float]] = {k: [] for k in stores}
        loads = []
        for s in stores.values():
            s.init_cluster(load_cluster(ROOT / "params/clusters/h100-128.yaml"))
        for _ in range(runs):
            for name, s in stores.items():
                url = s.url if name == "SQLite" else f"{PG}?options=-csearch_path%3D{schema}"
                proc, _, dt = _start(url)
                proc.terminate()
                proc.wait(15)
                times[name].append(dt)
                loads.append(os.getloadavg()[0])
        for s in stores.values():
            s.close()
        if "PostgreSQL" in stores:
            with sa.create_engine(PG).begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(f"Start-up to serving (`bandpilot api` spawned until /healthz answers), load {min(loads):.1f}-{max(loads):.1f}:")
    for name, v in times.items():
        ok = max(v) <= 5.0
        print(f"- {name}: {', '.join(f'{x:.2f}' for x in v)} s (median {float(np.median(v)):.2f} s); "
              f"target <= 5 s: {'met' if ok else 'MISSED'} in {sum(x <= 5.0 for x in v)}/{len(v)} runs")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--think", type=float, default=1.0, help="mean pause between a client's rounds, s")
    ap.add_argument("--workers", type=int, default=1, help="API server processes")
    ap.add_argument("--dispatch-s", type=float, default=0.0,
                    help="the API's batch loop period (default 0: off - no model here; it measures the request path)")
    ap.add_argument("--store", default=None, help=f"store URL (default: a fresh schema on {PG})")
    ap.add_argument("--startup", type=int, default=0, metavar="N",
                    help="measure only start-up to serving, N runs each on SQLite and PostgreSQL")
    args = ap.parse_args()
    if args.startup:
        return startup(args.startup)

    schema = None
    url = args.store
    if url is None:
        url, schema = PG, f"bpbench_{uuid.uuid4().hex[:8]}"
        try:
            sa.create_engine(PG, connect_args={"connect_timeout": 2}).connect().close()
        except Exception as exc:
            print(f"error: no PostgreSQL at {PG} ({type(exc).__name__}); pass --store", file=sys.stderr)
            return 2
    store = q.Store(url, schema=schema)
    store.init_cluster(load_cluster(ROOT / "params/clusters/h100-128.yaml"))
    tokens = [(f"t{i:03d}", q.create_token(store, f"t{i:03d}")[0]) for i in range(args.clients)]
    server_url = url if schema is None else f"{url}?options=-csearch_path%3D{schema}"
    try:
        proc, base, _ = _start(server_url, args.dispatch_s, args.workers)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        time.sleep(3.0 if args.workers > 1 else 0.0)  # the first worker answered; let the others start
        t0, cpu0, pg0, me0 = time.perf_counter(), _cpu_s(proc.pid), _postgres_cpu_s(), time.process_time()
        lat, acked, errors = asyncio.run(_run(base, tokens, args.duration, args.think))
        wall, cpu = time.perf_counter() - t0, _cpu_s(proc.pid) - cpu0
        pg_cpu, client_cpu = _postgres_cpu_s() - pg0, time.process_time() - me0
    finally:
        proc.terminate()
        proc.wait(15)
    with store.read() as conn:
        ids = list(conn.execute(sa.select(q.T_REQ.c.id)).scalars())
    stored, acked_set = set(ids), set(acked)
    lost = sorted(acked_set - stored)
    dup = len(ids) - len(stored) + (len(acked) - len(acked_set))
    unacked = len(stored - acked_set)
    n = sum(len(v) for v in lat.values())
    print(f"API load: {args.clients} clients x {args.duration:.0f} s, think {args.think} s, store "
          f"{'PostgreSQL' if url.startswith('postgresql') else 'SQLite'}, {args.workers} uvicorn process(es); {platform.machine()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n")
    print("| call | requests | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for kind, v in lat.items():
        a = np.array(v) * 1000
        print(f"| {kind} | {len(a)} | {np.median(a):.1f} | {np.percentile(a, 95):.1f} | {np.percentile(a, 99):.1f} | {a.max():.1f} |")
    allv = np.concatenate([np.array(v) for v in lat.values()]) * 1000
    p99 = float(np.percentile(allv, 99))
    n5xx = sum(1 for e in errors if "HTTP 5" in e)
    print(f"\n{n} requests in {wall:.1f} s = {n / wall:.0f} req/s; p99 over all {p99:.1f} ms; 5xx: {n5xx}; "
          f"other errors: {len(errors) - n5xx}; acknowledged submits {len(acked)}, stored {len(ids)}, "
          f"lost {len(lost)}, duplicated {dup}, stored but cut off unanswered {unacked}")
    print(f"server CPU {cpu:.1f} s = {cpu / max(n, 1) * 1000:.2f} ms per request (the load-independent cost; "
          f"latency on a shared machine also depends on what else runs); the clients "
          f"{client_cpu / max(n, 1) * 1000:.2f} ms, PostgreSQL {pg_cpu / max(n, 1) * 1000:.2f} ms per request "
          f"(every postgres process: other users included); server process at {cpu / wall:.0%} of one core")
    ok = n5xx == 0 and p99 <= 200 and not lost and dup == 0
    print(f"target (no 5xx, p99 <= 200 ms, nothing lost or duplicated): {'met' if ok else 'MISSED'}")
    if schema:
        store.close()
        eng = sa.create_engine(PG)
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    sys.exit(main())
