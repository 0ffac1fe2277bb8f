"""How does the queue schedule? One frozen :class:`SchedulerProfile` says it, for every caller: the
live queue (``bandpilot dispatch``), the API's batch loop, the Prefect dispatch flow and the simulator
take a profile and nothing else (like Kubernetes' KubeSchedulerConfiguration profiles, or Slurm's
SchedulerParameters: few, validated once when loaded, documented in one place).

A profile names the plug-in at each extension point of a batch, in the order the batch asks them:

* **QueueSort** ``queue_sort`` - the order pending requests are tried in (:mod:`~bandpilot.scheduling.policies`):
  ``fifo``, ``priority``, ``sjf``, ``utility`` (per-tenant GPU quotas by job utility), ``hrrn``, or a
  plug-in added with :func:`~bandpilot.scheduling.policies.register_queue_sort`.
* **Score** ``placement`` and ``locality`` - the dispatcher strategy that places a request
  (:mod:`bandpilot.dispatch.strategies`; ``compact`` is Slurm's: ``block`` on clusters with NVLink
  domains, ``topo`` otherwise) and, for model-guided placement, the lifetime locality margin: a
  placement on fewer hosts wins unless spreading is predicted to gain more than this relative bandwidth.
* **PostFilter** ``backfill`` / ``reservations`` and ``preempt`` - what happens when a request does
  not fit (:mod:`~bandpilot.scheduling.reservations`): ``greedy`` (every request takes what fits now),
  ``easy`` (the first blocked gang gets a reservation nothing may delay) or ``conservative`` (the first
  ``reservations`` blocked gangs do); with ``preempt`` a starving or higher-priority gang may evict
  preemptible jobs (:mod:`~bandpilot.scheduling.preemption`), asked before the reservations.
* **Permit** ``start_or_wait`` - a gang that could start now waits for a nearby job end when a better
  placement saves more than the wait costs, or for a one-host placement when it fits one host
  (:mod:`~bandpilot.scheduling.startwait`; needs reservations to hold its GPUs).

The named profiles: ``recommended`` (what the queue runs unless told otherwise; measured in
``docs/experiments/scheduler-profiles.md``), ``slurm-like`` (FIFO, EASY backfill, compact placement:
what a Slurm site runs) and ``fifo-greedy`` (FIFO, greedy backfill, compact placement). A YAML file
(:func:`load_profile`) starts from one of them (``base``, default ``recommended``) and overrides fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from bandpilot.errors import BandPilotError
from bandpilot.scheduling.policies import queue_sorts
from bandpilot.scheduling.reservations import BACKFILL_MODES
#: The placement that stands for Slurm's own (``select/cons_tres`` packing, ``topology/block`` on
#: clusters with NVLink domains): resolved against the cluster by :meth:`SchedulerProfile.algorithm_for`.
COMPACT = "compact"
#: The deepest reservation list a profile may ask for (Maui's RESERVATIONDEPTH).
MAX_RESERVATIONS = 1024


class ProfileError(BandPilotError):
    """A scheduler profile that cannot run as written (unknown value, contradictory fields)."""


@dataclass(frozen=True)
class SchedulerProfile:
    """The plug-ins of each extension point and their arguments (module docstring). Build one with
    :func:`get_profile` or ``dataclasses.replace`` on a named one; :meth:`check` runs on creation."""

    name: str
    queue_sort: str = "fifo"
    backfill: str = "greedy"
    reservations: int = 1  # blocked gangs that get a reservation under ``conservative`` (easy: 1)
    preempt: bool = False
    start_or_wait: bool = False
    placement: str = "bandpilot"
    locality: float = 0.0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Each field a known value and no contradiction between them (a one-line :class:`ProfileError`)."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ProfileError(f"name must be a non-empty string, got {self.name!r}")
        _one_of("queue_sort", self.queue_sort, queue_sorts())
        _one_of("backfill", self.backfill, BACKFILL_MODES)
        _one_of("placement", self.placement, placements())
        if isinstance(self.reservations, bool) or not isinstance(self.reservations, int) \
                or not 1 <= self.reservations <= MAX_RESERVATIONS:
            raise ProfileError(f"reservations must be an integer in [1, {MAX_RESERVATIONS}], got {self.reservations!r}")
        if self.reservations != 1 and self.backfill != "conservative":
            raise ProfileError(f"reservations: {self.reservations} needs backfill: conservative "
                               f"({self.backfill} reserves for {'no gang' if self.backfill == 'greedy' else 'one gang'})")
        for flag in ("preempt", "start_or_wait"):
            if not isinstance(getattr(self, flag), bool):
                raise ProfileError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.start_or_wait and self.backfill == "greedy":
            raise ProfileError("start_or_wait needs backfill: easy or conservative (a waiting gang holds its GPUs "
                               "with a reservation; greedy backfill keeps none)")
        loc = self.locality
        if isinstance(loc, bool) or not isinstance(loc, (int, float)) or not (math.isfinite(loc) and 0.0 <= loc < 1.0):
            raise ProfileError(f"locality must be a number in [0, 1), got {loc!r}")
        if loc and not _model_guided(self.placement):
            raise ProfileError(f"locality: {loc:g} applies to model-guided placement only, not placement: {self.placement}")

    def algorithm_for(self, spec: Any) -> str:
        """The dispatcher strategy on the cluster ``spec`` (``compact``: ``block`` on NVLink domains, else ``topo``)."""
        if self.placement != COMPACT:
            return self.placement
        return "block" if getattr(spec, "nvlink_domains", False) else "topo"

    def describe(self) -> str:
        """One line: ``hrrn + bandpilot (locality 0.5) + conservative 2 + start-or-wait``."""
        backfill = f"conservative {self.reservations}" if self.backfill == "conservative" else self.backfill
        loc = f" (locality {self.locality:g})" if self.locality else ""
        extra = "".join(s for s, on in ((" + preempt", self.preempt), (" + start-or-wait", self.start_or_wait)) if on)
        return f"{self.queue_sort} + {self.placement}{loc} + {backfill}{extra}"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def placements() -> tuple[str, ...]:
    """Every placement a profile may name: the registered dispatcher strategies and ``compact``."""
    from bandpilot.dispatch import strategies

    return (*strategies.names(), COMPACT)


def _model_guided(placement: str) -> bool:
    from bandpilot.dispatch import strategies

    return placement != COMPACT and strategies.get(placement).kind == strategies.MODEL_GUIDED


def _one_of(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ProfileError(f"{field}: unknown value {value!r}: use one of {', '.join(allowed)}")


RECOMMENDED = SchedulerProfile("recommended", queue_sort="hrrn", backfill="conservative", reservations=2,
                               start_or_wait=True, placement="bandpilot", locality=0.5)
SLURM_LIKE = SchedulerProfile("slurm-like", queue_sort="fifo", backfill="easy", placement=COMPACT)
FIFO_GREEDY = SchedulerProfile("fifo-greedy", queue_sort="fifo", backfill="greedy", placement=COMPACT)
PROFILES: dict[str, SchedulerProfile] = {p.name: p for p in (RECOMMENDED, SLURM_LIKE, FIFO_GREEDY)}
#: The fields a YAML profile may set (``name`` defaults to the file's stem).
_KEYS = {f.name for f in fields(SchedulerProfile)} | {"base"}


def get_profile(name: str | SchedulerProfile) -> SchedulerProfile:
    """A named profile, or one loaded from a YAML file (a path ending in ``.yaml`` / ``.yml``)."""
    if isinstance(name, SchedulerProfile):
        return name
    if name in PROFILES:
        return PROFILES[name]
    if str(name).endswith((".yaml", ".yml")):
        return load_profile(Path(name))
    raise ProfileError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)} or a profile YAML file")


def load_profile(path: Path) -> SchedulerProfile:
    """The profile a YAML file describes: a mapping of the fields above, on top of ``base``."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"profile {path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"profile {path}: not valid YAML{where}") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"profile {path}: expected a mapping of profile fields, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise ProfileError(f"profile {path}: unknown field {unknown[0]!r}: use {', '.join(sorted(_KEYS))}")
    base_name = doc.pop("base", RECOMMENDED.name)
    if base_name not in PROFILES:
        raise ProfileError(f"profile {path}: field 'base': unknown profile {base_name!r}: use one of {', '.join(PROFILES)}")
    doc.setdefault("name", path.stem)
    try:
        return replace(PROFILES[base_name], **doc)
    except ProfileError as exc:
        raise ProfileError(f"profile {path}: {exc}") from None
