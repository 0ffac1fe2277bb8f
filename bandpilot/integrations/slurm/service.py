"""Site-wide placement: a small HTTP endpoint that Slurm's ``job_submit.lua`` asks for the nodes and
per-node GPU counts of a plain ``sbatch --gpus=N`` job, and the Lua script itself.

Why a long-running endpoint with a cached state: slurmctld runs ``job_submit`` while it holds its
locks, so a ``scontrol`` call from inside it (directly or through BandPilot) waits for the very
call that runs it (measured on 22.05: the submission times out). The endpoint therefore reads Slurm
on its own thread every ``refresh`` seconds and answers from the last read, holding the GPUs of
its recent answers back until a read shows them busy (or ``hold`` seconds pass), so two jobs
submitted within one refresh do not get the same GPUs.

Answer (``GET /place?gpus=N``, ``text/plain``), one ``key=value`` per line, what the Lua applies:
``req_nodes``, ``min_nodes``/``max_nodes``, ``tres_per_node`` (with ``tres_per_job`` emptied) when one
job can ask for exactly BandPilot's counts (one node, or the same count on every node; with
per-index gres types also the indices, when they are the same on every node), else only the nodes
(Slurm 22.05 cannot split one job's GPUs unevenly; ``bandpilot slurm submit`` can) and a ``note``.
Any failure is an HTTP error; the Lua then leaves the job to Slurm.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping
from urllib.parse import parse_qs, urlparse

from bandpilot.errors import BandPilotError
from bandpilot.integrations.slurm.submit import Live, rank_map, read_live
from bandpilot.queue.launch_slurm import components, single_job
from bandpilot.topology.cluster import ClusterSpec


def answer(ranks: list[str], types: Mapping[str, Mapping[int, str]]) -> dict[str, str]:
    """What the Lua sets on the job for the rank map ``ranks`` (module docstring)."""
    comps = components(ranks, types)
    nodes = [c.node for c in comps]
    out = {"req_nodes": ",".join(nodes), "min_nodes": str(len(nodes)), "max_nodes": str(len(nodes)),
           "gpus": ",".join(ranks)}
    if single_job(comps):
        out["tres_per_node"] = ",".join("gres:" + g for g in comps[0].gres().split(","))
        out["tres_per_job"] = ""
        out["exact"] = "indices" if comps[0].types is not None else "counts"
    else:
        counts = "+".join(str(len(c.gpus)) for c in comps)
        out["exact"] = "nodes"
        out["note"] = (f"uneven split {counts}: per-node counts are Slurm's (one Slurm job cannot ask for uneven "
                       "counts; bandpilot slurm submit can)")
    return out


@dataclass
class Placer:
    """The endpoint's state: a dispatcher, the last Slurm read, and its recent answers."""

    dispatcher: Any
    spec: ClusterSpec
    env: Mapping[str, str] | None = None
    refresh: float = 1.0
    hold: float = 30.0
    live: Live | None = None
    error: str = ""
    held: list[tuple[float, list[str]]] = field(default_factory=list)
    answers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        try:
            live = read_live(self.spec, self.env)
        except BandPilotError as exc:
            with self.lock:
                self.error = str(exc)
            return
        now = time.monotonic()
        free = set(live.snapshot.state.free_gpus)
        with self.lock:
            self.live, self.error = live, ""
            # an answer stays held until Slurm shows its GPUs busy (the job started) or it expires
            self.held = [(t, g) for t, g in self.held if t > now and any(x in free for x in g)]

    def place(self, k: int) -> dict[str, str]:
        with self.lock:
            live, held = self.live, [g for t, g in self.held if t > time.monotonic()]
        if live is None:
            raise BandPilotError(f"no state read from Slurm yet{': ' + self.error if self.error else ''}")
        state = live.snapshot.state
        for i, gpus in enumerate(held):
            still = [g for g in gpus if g in set(state.free_gpus)]
            if still:
                state = state.with_job(f"held-{i}", still, 0.0)
        sel = self.dispatcher.select(k, state)
        ranks = rank_map(sel)
        out = answer(ranks, live.types)
        out["predicted_gbps"] = f"{sel.predicted_gbps:.2f}"
        with self.lock:
            self.held.append((time.monotonic() + self.hold, ranks))
            self.answers.append(out)
        return out


class _Handler(BaseHTTPRequestHandler):
    placer: Placer

    def do_GET(self) -> None:
        url = urlparse(self.path)
        try:
            if url.path != "/place":
                raise BandPilotError(f"unknown path {url.path}: use /place?gpus=N")
            raw = parse_qs(url.query).get("gpus", [""])[0]
            if not raw.isdigit() or int(raw) < 1:
                raise BandPilotError(f"gpus={raw!r}: a positive integer is needed")
            body, status = "".join(f"{k}={v}\n" for k, v in self.placer.place(int(raw)).items()), 200
        except BandPilotError as exc:
            body, status = f"error={exc}\n", 409
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: slurmctld's log has the outcome
        pass


class Service:
    """The HTTP endpoint on ``host:port`` and its refresh thread; ``start``/``stop``, or ``serve``."""

    def __init__(self, placer: Placer, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.placer = placer
        handler = type("Handler", (_Handler,), {"placer": placer})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def _refresh(self) -> None:
        while not self._stop.is_set():
            self.placer.read()
            self._stop.wait(self.placer.refresh)

    def start(self) -> "Service":
        self.placer.read()
        for target in (self._refresh, self.httpd.serve_forever):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait(self) -> None:
        """Block until :meth:`stop` (from another thread) or KeyboardInterrupt."""
        while not self._stop.wait(3600):
            pass

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=10)


LUA = r"""-- job_submit.lua written by `bandpilot slurm lua`: a plain `sbatch --gpus=N` job (no node count,
-- nodelist or per-node/per-task GPU request of its own) gets the nodes and per-node GPUs BandPilot
-- picks. BandPilot answers from its endpoint within a time limit; when it does not (stopped, slow,
-- an error) the job is left to Slurm's own choice and the reason is logged. A job is never rejected.
local URL = "@URL@"
local TIMEOUT = @TIMEOUT@
local CURL = "@CURL@"
local NO_VAL = 4294967294

local function plain_gpus(job)
  if job.tres_per_job == nil or job.tres_per_node ~= nil or job.tres_per_task ~= nil then return nil end
  if job.req_nodes ~= nil or (job.min_nodes ~= nil and job.min_nodes < NO_VAL) then return nil end
  return tonumber(string.match(job.tres_per_job, "^gres:gpu:(%d+)$"))
end

local function ask(n)
  local cmd = string.format("%s -s -f --max-time %s '%s/place?gpus=%d' 2>&1", CURL, TIMEOUT, URL, n)
  local p = io.popen(cmd)
  if p == nil then return nil, "cannot run curl" end
  local out = p:read("*a")
  p:close()
  local reply = {}
  for key, value in string.gmatch(out or "", "([%w_]+)=([^\n]*)") do reply[key] = value end
  if reply.req_nodes == nil then
    return nil, "no answer within " .. TIMEOUT .. " s (" .. string.gsub(out or "", "%s+", " ") .. ")"
  end
  return reply, nil
end

local function place(job)
  local n = plain_gpus(job)
  if n == nil then return end
  local reply, err = ask(n)
  if reply == nil then
    slurm.log_info("bandpilot: job %s (--gpus=%d): %s; Slurm chooses", tostring(job.name), n, err)
    return
  end
  local min_nodes, max_nodes = tonumber(reply.min_nodes), tonumber(reply.max_nodes)
  if min_nodes == nil or max_nodes == nil then
    slurm.log_info("bandpilot: job %s (--gpus=%d): incomplete answer; Slurm chooses", tostring(job.name), n)
    return
  end
  job.req_nodes = reply.req_nodes
  job.min_nodes = min_nodes
  job.max_nodes = max_nodes
  if reply.tres_per_node ~= nil then
    job.tres_per_node = reply.tres_per_node
    job.tres_per_job = reply.tres_per_job
  end
  slurm.log_info("bandpilot: job %s (--gpus=%d) -> %s (exact %s, %s GB/s predicted)%s", tostring(job.name), n,
                 reply.gpus or reply.req_nodes, reply.exact or "?", reply.predicted_gbps or "?",
                 reply.note and ("; " .. reply.note) or "")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(place, job_desc)
  if not ok then slurm.log_info("bandpilot: %s; Slurm chooses", tostring(err)) end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""


def lua_script(url: str, timeout: float = 1.0, curl: str = "/usr/bin/curl") -> str:
    """The ``job_submit.lua`` text for an endpoint at ``url`` (no trailing slash)."""
    if not url.startswith(("http://", "https://")) or "'" in url:
        raise BandPilotError(f"endpoint URL {url!r} must start with http:// or https://")
    if not 0 < timeout <= 10:
        raise BandPilotError(f"timeout {timeout:g} s: give 0 < seconds <= 10 (slurmctld waits for it)")
    return LUA.replace("@URL@", url.rstrip("/")).replace("@TIMEOUT@", f"{timeout:g}").replace("@CURL@", curl)
