"""A real Slurm cluster on this machine for tests and benchmarks: a private ``munged``, ``slurmctld``
and one ``slurmd -N NAME`` per node of a BandPilot cluster spec, configured with the files
``bandpilot slurm conf`` generates (so every start is also a test that Slurm accepts them).

Stable interface (tests and benchmarks build on it)::

    from harness import SlurmCluster, ensure_slurm      # tests/slurm on sys.path (conftest)
    # or: from tests.slurm.harness import SlurmCluster  # from the repo root (benchmarks)

    reason = ensure_slurm()            # None, or why Slurm cannot be had here (skip with it)
    with SlurmCluster(tmp_dir, spec) as c:   # spec: ClusterSpec or a spec path; >= 1 node
        c.env          # environment for Slurm's clients (SLURM_CONF, PATH, ...)
        c.conf_dir     # slurm.conf, slurm.bandpilot.conf, gres.conf, topology.conf (add job_submit.lua here)
        c.nodes        # node names (the spec's host names, in order)
        c.run(["sinfo"])                 # CompletedProcess (text); check=True raises with Slurm's output
        jid = c.hold({"h100-0": 3}, seconds=600)   # a sleeping job holding GPUs; c.wait_running(jid)
        c.cancel_all(); c.reconfigure()

Options: ``topology`` (tree | block | auto), ``gpu_type`` (gres ``Type=`` template, e.g.
``"{gpu}_{index}"``), ``extra_conf`` (more slurm.conf lines, e.g. ``JobSubmitPlugins=lua``).
Every port is free when chosen and every path is under the work dir, so clusters of parallel test
runs never meet. :meth:`SlurmCluster.stop` ends every process it started by pid, also after a
failed start; an ``atexit`` hook does it if the caller never gets there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "squeue")
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
SBIN = "/usr/sbin:/sbin"


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + SBIN)


def ensure_slurm() -> str | None:
    """None when Slurm's daemons and clients are installed (installing Debian's packages with
    apt-get when missing and possible), else the reason they cannot be had."""
    if all(_which(d) for d in DAEMONS):
        return None
    if os.environ.get("APT") == "no" or os.environ.get("BANDPILOT_NO_APT"):
        return "Slurm is not installed and APT=no / BANDPILOT_NO_APT declines installing it"
    apt = shutil.which("apt-get")
    if apt is None:
        return "Slurm is not installed and there is no apt-get to install it"
    cmd = [apt] if os.geteuid() == 0 else (["sudo", "-n", apt] if shutil.which("sudo") else None)
    if cmd is None:
        return "Slurm is not installed and apt-get needs root"
    print(f"installing {' '.join(PACKAGES)} with apt-get: the Slurm integration tests run against real "
          "Slurm daemons", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = cmd + ["install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    ok = subprocess.run(install, env=env, capture_output=True).returncode == 0
    if not ok:
        subprocess.run(cmd + ["update", "-q"], env=env, capture_output=True)
        ok = subprocess.run(install, env=env, capture_output=True).returncode == 0
    if not ok or not all(_which(d) for d in DAEMONS):
        return f"apt-get could not install {' '.join(PACKAGES)}"
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free right now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmStartError(RuntimeError):
    pass


class SlurmCluster:
    """One Slurm cluster of the spec's hosts on this machine (module docstring: the interface)."""

    def __init__(self, workdir: str | Path, spec: Any = "params/clusters/h100.yaml", *, topology: str = "tree",
                 gpu_type: str | None = None, extra_conf: str = "", cpus_per_gpu: int = 2,
                 start_timeout: float = 90.0) -> None:
        from bandpilot.topology.cluster import ClusterSpec, load_cluster

        self.spec = spec if isinstance(spec, ClusterSpec) else load_cluster(spec)
        self.work = Path(workdir).resolve()
        self.conf_dir = self.work / "etc"
        self.nodes: list[str] = list(self.spec.host_names)
        self.topology = topology
        self.gpu_type = gpu_type
        self.extra_conf = extra_conf
        self.cpus_per_gpu = cpus_per_gpu
        self.start_timeout = start_timeout
        self.procs: list[subprocess.Popen] = []
        self.ctld_port, *self.node_ports = free_ports(1 + len(self.nodes))
        self.munge_socket = self.work / "munge" / "munge.sock"
        path = os.environ.get("PATH", "/usr/bin:/bin")
        self.env: dict[str, str] = dict(os.environ, SLURM_CONF=str(self.conf_dir / "slurm.conf"),
                                        PATH=path if "/usr/sbin" in path else path + ":" + SBIN)
        # a client in the caller's environment must not carry another job's context
        for k in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if k != "SLURM_CONF":
                del self.env[k]

    # ---- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, attempts: int = 2) -> "SlurmCluster":
        """Start the daemons and wait until every node is idle. A port chosen free can be taken
        before a daemon binds it (other clusters and clients on this machine): a failed start is
        stopped and retried once on fresh ports and a fresh state directory."""
        for attempt in range(attempts):
            try:
                return self._start()
            except SlurmStartError:
                if attempt + 1 == attempts:
                    raise
                self.ctld_port, *self.node_ports = free_ports(1 + len(self.nodes))
                for sub in ("state", "spool", "munge"):
                    shutil.rmtree(self.work / sub, ignore_errors=True)
        return self

    def _start(self) -> "SlurmCluster":
        atexit.register(self.stop)
        try:
            self._write_files()
            self._start_munge()
            self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            self._wait(lambda: self.run(["scontrol", "ping"], check=False, timeout=10).returncode == 0,
                       "slurmctld to answer scontrol ping")
            for name in self.nodes:
                self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name])
            self._wait(self._all_idle, f"{len(self.nodes)} nodes idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel every job, then end every process started here by pid: slurmd first (their
        slurmstepd go with them), then slurmctld, then munged."""
        if not self.procs:
            return
        if any(p.poll() is None for p in self.procs if p.args[0] == "slurmctld"):
            self.cancel_all(wait=5.0)
        for p in sorted(self.procs, key=lambda p: {"slurmd": 0, "slurmctld": 1}.get(p.args[0], 2)):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)
        for p in self.procs:
            for fh in (p.stdout, p.stderr):
                if fh:
                    fh.close()
        self.procs = []
        atexit.unregister(self.stop)

    # ---- clients ------------------------------------------------------------------------------
    def run(self, cmd: Sequence[str] | str, check: bool = True, timeout: float = 60.0,
            env: Mapping[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
        """A command in the cluster's environment (a string runs in ``sh -c``); ``check`` raises
        with its output when it fails."""
        full = dict(self.env, **(env or {}))
        proc = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, env=full,
                              timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"{cmd!r} exited {proc.returncode}: {proc.stderr.strip()} {proc.stdout.strip()}")
        return proc

    def hold(self, gpus: Mapping[str, int], seconds: int = 600, gres_type: str | None = None) -> str:
        """Submit a job that sleeps holding ``gpus[node]`` GPUs on each node; returns its job id."""
        nodes = list(gpus)
        counts = set(gpus.values())
        t = f"{gres_type}:" if gres_type else ""
        if len(counts) == 1:  # one component: the same count everywhere
            args = ["sbatch", "--parsable", "-N", str(len(nodes)), "-w", ",".join(nodes), f"--gres=gpu:{t}{counts.pop()}",
                    "-o", "/dev/null", "--wrap", f"sleep {seconds}"]
        else:  # uneven counts: one heterogeneous component per node
            args = ["sbatch", "--parsable", "-o", "/dev/null"]
            for i, n in enumerate(nodes):
                if i:
                    args.append(":")
                args += ["-N", "1", "-w", n, f"--gres=gpu:{t}{gpus[n]}"]
            args += ["--wrap", f"sleep {seconds}"]
        return self.run(args).stdout.strip().split(";")[0]

    def wait_running(self, job_id: str, timeout: float = 60.0) -> None:
        def running() -> bool:
            out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.split()
            return bool(out) and all(s == "RUNNING" for s in out)

        self._wait(running, f"job {job_id} running", timeout)

    def job_ids(self) -> list[str]:
        return self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()

    def cancel_all(self, wait: float = 30.0) -> None:
        """Cancel every job of this cluster and wait until squeue lists none."""
        ids = self.job_ids()
        if ids:
            self.run(["scancel", *ids], check=False)
            try:
                self._wait(lambda: not self.job_ids(), "every job gone", wait)
            except SlurmStartError:
                pass

    def reconfigure(self) -> None:
        """Make slurmctld and the slurmd re-read the configuration files (after editing them)."""
        self.run(["scontrol", "reconfigure"])

    def log(self, name: str = "slurmctld") -> str:
        p = self.work / "log" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    # ---- internals ----------------------------------------------------------------------------
    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return set(self.nodes) <= set(states) and all(states[n] == "idle" for n in self.nodes)

    def _wait(self, ok: Any, what: str, timeout: float | None = None) -> None:
        end = time.monotonic() + (timeout or self.start_timeout)
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise SlurmStartError(f"{p.args[0]} exited {p.returncode} while waiting for {what}: "
                                          f"{self._tail(p)}")
            if ok():
                return
            if time.monotonic() > end:
                raise SlurmStartError(f"timed out waiting for {what}; slurmctld log: {self.log()[-1500:]}")
            time.sleep(0.2)

    def _tail(self, p: subprocess.Popen) -> str:
        name = getattr(p, "bp_name", p.args[0])
        log = self.log(name) or (self.work / "log" / f"{name}.out").read_text(errors="replace")
        return log[-1500:]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(self.work / "log" / f"{name}.out", "w")
        p = subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        p.bp_name = name  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def _start_munge(self) -> None:
        d = self.work / "munge"
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munge.seed'}",
                               f"--log-file={self.work / 'log' / 'munged.log'}"])
        self._wait(self.munge_socket.exists, "munged's socket", 30)

    def _write_files(self) -> None:
        from bandpilot.fabric.emulator import make_fabric
        from bandpilot.integrations.slurm.commands import installed_version
        from bandpilot.integrations.slurm.config import FRAGMENT, ConfOptions, write_conf
        from bandpilot.integrations.slurm.topology import choose_plugin, topology_conf

        for sub in ("etc", "state", "spool", "log", "dev", "munge"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        (self.work / "munge").chmod(0o700)
        n_max = int(self.spec.gpus_per_host.max())
        for i in range(n_max):  # character devices standing in for /dev/nvidiaN (the /dev/null pair)
            dev = self.work / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        opts = ConfOptions(cpus_per_gpu=self.cpus_per_gpu, memory_mb_per_gpu=1000,
                           device_template=str(self.work / "dev" / "nvidia{index}"), gpu_type=self.gpu_type,
                           partition="bandpilot", default_partition=True,
                           node_extra={n: f"NodeHostname=localhost Port={p}" for n, p in zip(self.nodes, self.node_ports)})
        plugin = choose_plugin(self.spec, self.topology, installed_version(self.env))
        write_conf(self.conf_dir, self.spec, make_fabric(self.spec), topology_conf(self.spec, plugin), plugin, opts)
        w, log = self.work, self.work / "log"
        base = f"""# test cluster: everything this machine-local cluster needs around BandPilot's generated fragment
ClusterName=bp{os.getpid()}x{self.ctld_port}
SlurmctldHost=localhost
SlurmctldPort={self.ctld_port}
SlurmdPort={self.node_ports[0]}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={w / 'state'}
SlurmdSpoolDir={w / 'spool'}/%n
SlurmctldPidFile={w / 'state'}/slurmctld.pid
SlurmdPidFile={w / 'spool'}/slurmd-%n.pid
SlurmctldLogFile={log}/slurmctld.log
SlurmdLogFile={log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=2
# hetjobs (uneven per-node GPU counts) start only from the backfill scheduler: every 2 s here, not 30
SchedulerParameters=bf_interval=2
InactiveLimit=0
{self.extra_conf}
Include {self.conf_dir / FRAGMENT}
"""
        (self.conf_dir / "slurm.conf").write_text(base)
        (self.conf_dir / "slurm.conf").chmod(0o644)
