"""Running Slurm's client commands: one place that turns a missing binary, a controller that does
not answer or a refused command into a one-line :class:`SlurmError`, and reads the Slurm version."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Sequence

from bandpilot.errors import BandPilotError

#: seconds a client command may take; slurmctld answers in milliseconds when it is up, and a
#: controller that is down makes the clients retry for MessageTimeout (10 s by default)
TIMEOUT = 30.0


class SlurmError(BandPilotError):
    """Slurm is not installed, does not answer, or refused a command (its message included)."""

    code = "slurm_error"


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(os.environ)
    if env:
        out.update(env)
    return out


def run(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT,
        input: str | None = None) -> str:
    """stdout of a Slurm command; :class:`SlurmError` naming the command and Slurm's own message
    when it is missing, times out or exits non-zero."""
    exe = args[0]
    full = _env(env)
    if shutil.which(exe, path=full.get("PATH")) is None:
        raise SlurmError(f"Slurm command {exe!r} not found on PATH: install Slurm's client "
                         "(Debian: apt-get install slurm-client) or run where Slurm is installed",
                         code="slurm_unavailable")
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, env=full, timeout=timeout, input=input)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{_cmd(args)}: Slurm did not answer within {timeout:g} s",
                         code="slurm_unavailable") from None
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").splitlines()
        text = " ".join(line.strip() for line in msg[-2:])
        code = "slurm_unavailable" if _UNREACHABLE.search(text) else "slurm_error"
        raise SlurmError(f"{_cmd(args)}: {text}", code=code)
    return proc.stdout


def _cmd(args: Sequence[str]) -> str:
    """The command as typed, for messages (long arguments cut)."""
    return " ".join(a if len(a) <= 40 else a[:37] + "..." for a in args)


_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Connection refused|Socket timed out|"
                          r"Zero Bytes were transmitted|Communication connection failure", re.I)


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.micro}"

    @property
    def has_block(self) -> bool:
        """``topology/block`` (and ``--segment``) arrived in Slurm 23.11."""
        return (self.major, self.minor) >= (23, 11)


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> Version:
    """``slurm-wlm 22.05.8`` / ``slurm 23.11.4`` -> :class:`Version`."""
    m = _VERSION.search(text)
    if not m:
        raise SlurmError(f"cannot read a Slurm version from {text.strip()[:80]!r}")
    return Version(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def slurm_version(env: Mapping[str, str] | None = None) -> Version:
    """The installed Slurm's version: ``scontrol --version``, which needs a configuration source,
    else ``slurmctld -V`` / ``slurmd -V`` (a controller host, or one with no slurm.conf yet)."""
    first: SlurmError | None = None
    for args in (["scontrol", "--version"], ["slurmctld", "-V"], ["slurmd", "-V"]):
        try:
            return parse_version(run(args, env=_with_sbin(env)))
        except SlurmError as exc:
            first = first or exc
    assert first is not None
    raise first


def _with_sbin(env: Mapping[str, str] | None) -> dict[str, str]:
    """The daemons live in /usr/sbin, often not on a user's PATH."""
    full = _env(env)
    path = full.get("PATH", "")
    if "/usr/sbin" not in path.split(":"):
        full["PATH"] = path + ":/usr/sbin:/sbin" if path else "/usr/sbin:/sbin"
    return full


def installed_version(env: Mapping[str, str] | None = None) -> Version | None:
    """The installed Slurm's version, or None where no Slurm is installed."""
    try:
        return slurm_version(env)
    except SlurmError:
        return None
