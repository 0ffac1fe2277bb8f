"""What is a valid request? Gang requests and their placement constraints: shape checks, cluster
checks and JSONL parsing.

Constraints are :class:`bandpilot.dispatch.constraints.Constraints` (one type from the API body
to the GPUs). Tenants submit gang (all-or-nothing) GPU requests; :func:`~bandpilot.scheduling.batch.run_batch` assigns
the pending ones with a :class:`~bandpilot.dispatch.dispatcher.Dispatcher` (the promoted model).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping


from bandpilot.dispatch.constraints import Constraints, constraint_keys
from bandpilot.dispatch.shape import Shape
from bandpilot.errors import RequestError
from bandpilot.queue.clock import iso
from bandpilot.topology.cluster import ClusterSpec

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$")
#: Run-time and preemption fields (schema v6): planning hints, never trusted for correctness.
RUNTIME_KEYS = ("time_limit_s", "comm_fraction", "preemptible", "checkpoint_s", "checkpoint_every_s")
#: Elastic range (schema v9): a data-parallel job may run on any size min_k, min_k + step, ..., max_k.
ELASTIC_KEYS = ("min_k", "max_k", "k_step")
#: Declared compute scaling efficiency per doubling of GPUs (schema v11): how the elastic pricing
#: values a growth; None = perfect scaling (1.0), the pricing's assumption before it was declarable.
SCALING_KEYS = ("scaling",)
_REQUEST_KEYS = (("id", "k", "tenant", "priority", "utility", "submitted", "submitted_at", "constraints", "shape")
                 + RUNTIME_KEYS + ELASTIC_KEYS + SCALING_KEYS)


def _parse_time(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise RequestError(f"{where}: 'submitted' must be an ISO time or epoch seconds")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise RequestError(f"{where}: 'submitted' {value!r} is not a valid epoch time")
        return float(value)
    if isinstance(value, str):
        try:
            t = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise RequestError(f"{where}: 'submitted' {value!r} is not an ISO 8601 time") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        return t.timestamp()
    raise RequestError(f"{where}: 'submitted' must be an ISO time or epoch seconds")


@dataclass(frozen=True)
class Request:
    """One gang request: ``k`` GPUs at once or nothing."""

    id: str
    k: int
    tenant: str = "default"
    priority: int = 0
    utility: float | None = None
    submitted_at: float | None = None  # epoch seconds; None = the submit time
    constraints: Constraints = field(default_factory=Constraints)
    #: What a Slurm user writes with ``--time``: planning (reservations, backfill) uses it as the
    #: expected run time; nothing ends a job at it.
    time_limit_s: float | None = None
    #: Share of the run time spent in collectives (the demand model scales co-tenant pressure by it).
    comm_fraction: float | None = None
    preemptible: bool = False
    checkpoint_s: float | None = None  # one checkpoint + restart, seconds
    checkpoint_every_s: float | None = None
    #: parallelism shape (schema v8): the batch places each axis and stores the rank map
    shape: Shape | None = None
    #: Elastic range: the job starts at ``k`` when it can and the queue may resize it within
    #: ``[min_k, max_k]`` in steps of ``k_step`` at epoch boundaries; None = fixed at ``k``.
    min_k: int | None = None
    max_k: int | None = None
    k_step: int | None = None
    #: compute efficiency per doubling of GPUs in (0, 1] (1 = linear); None = not declared (priced as 1)
    scaling: float | None = None

    @property
    def lo(self) -> int:
        return self.k if self.min_k is None else self.min_k

    @property
    def hi(self) -> int:
        return self.k if self.max_k is None else self.max_k

    @property
    def step(self) -> int:
        return self.k_step or 1

    @property
    def elastic(self) -> bool:
        return self.lo < self.hi

    def sizes(self) -> list[int]:
        """Every size the job may run at, smallest first."""
        return list(range(self.lo, self.hi + 1, self.step))

    def runtime_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in RUNTIME_KEYS + ELASTIC_KEYS + SCALING_KEYS:
            v = getattr(self, key)
            if v is not None and v is not False:
                out[key] = v
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "k": self.k, "tenant": self.tenant, "priority": self.priority}
        if self.utility is not None:
            out["utility"] = self.utility
        out.update(self.runtime_dict())
        if self.submitted_at is not None:
            out["submitted"] = iso(self.submitted_at)
        c = self.constraints.to_dict()
        if c:
            out["constraints"] = c
        if self.shape is not None:
            out["shape"] = self.shape.to_dict()
        return out

    @classmethod
    def from_dict(cls, doc: Any, where: str = "request") -> "Request":
        """Validate the shape of one request (cluster-independent checks; see :func:`validate_request`)."""
        if not isinstance(doc, Mapping):
            raise RequestError(f"{where}: a request must be a JSON object")
        unknown = sorted(set(doc) - set(_REQUEST_KEYS))
        if unknown:
            hint = " (constraints go under 'constraints')" if unknown[0] in constraint_keys() else ""
            raise RequestError(f"{where}: unknown key {unknown[0]!r}{hint}")
        rid = doc.get("id")
        if not isinstance(rid, str) or not _ID_RE.match(rid):
            raise RequestError(
                f"{where}: 'id' must be a string of 1-200 letters, digits or ._:@/+- (got {rid!r})"
            )
        where = f"{where} (request {rid!r})"
        if "k" not in doc:
            raise RequestError(f"{where}: missing 'k' (number of GPUs)")
        k = doc["k"]
        if isinstance(k, bool) or not isinstance(k, int):
            if isinstance(k, float) and k.is_integer():
                k = int(k)
            else:
                raise RequestError(f"{where}: 'k' must be an integer, got {k!r}")
        if k <= 0:
            raise RequestError(f"{where}: 'k' must be >= 1, got {k}")
        tenant = doc.get("tenant", "default")
        if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 200:
            raise RequestError(f"{where}: 'tenant' must be a non-empty string")
        prio = doc.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise RequestError(f"{where}: 'priority' must be an integer, got {prio!r}")
        util = doc.get("utility")
        if util is not None:
            if isinstance(util, bool) or not isinstance(util, (int, float)) or not math.isfinite(util) or util < 0:
                raise RequestError(f"{where}: 'utility' must be a finite number >= 0, got {util!r}")
            util = float(util)
        sub = doc.get("submitted", doc.get("submitted_at"))
        sub_t = _parse_time(sub, where) if sub is not None else None
        cons = Constraints.from_dict(doc.get("constraints"), where)
        shape = None
        if doc.get("shape") is not None:
            try:
                shape = Shape.parse(doc["shape"], "'shape'")
                shape.check_k(k)
            except RequestError as exc:
                raise RequestError(f"{where}: {exc}") from None
        return cls(rid, k, tenant.strip(), prio, util, sub_t, cons, **_runtime_fields(doc, where), shape=shape,
                   **_elastic_fields(doc, k, where), scaling=_positive(doc, "scaling", where, upper=1.0))


def _elastic_fields(doc: Mapping[str, Any], k: int, where: str) -> dict[str, Any]:
    """``min_k <= k <= max_k``, each size reachable from ``min_k`` in steps of ``k_step``."""
    out: dict[str, int | None] = {}
    for key in ELASTIC_KEYS:
        v = doc.get(key)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise RequestError(f"{where}: {key!r} must be an integer >= 1, got {v!r}")
        out[key] = v
    lo = k if out["min_k"] is None else out["min_k"]
    hi = k if out["max_k"] is None else out["max_k"]
    step = out["k_step"] or 1
    if lo > k:
        raise RequestError(f"{where}: 'min_k' {lo} is above k={k}")
    if hi < k:
        raise RequestError(f"{where}: 'max_k' {hi} is below k={k}")
    if (k - lo) % step or (hi - lo) % step:
        raise RequestError(f"{where}: k={k} and max_k={hi} must be min_k={lo} plus a multiple of k_step={step}")
    return out


def _positive(doc: Mapping[str, Any], key: str, where: str, upper: float | None = None) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0 or (upper is not None and v > upper):
        rng = f"in (0, {upper:g}]" if upper is not None else "> 0"
        raise RequestError(f"{where}: {key!r} must be a number {rng}, got {v!r}")
    return float(v)


def _runtime_fields(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time_limit_s": _positive(doc, "time_limit_s", where),
        "checkpoint_s": _positive(doc, "checkpoint_s", where),
        "checkpoint_every_s": _positive(doc, "checkpoint_every_s", where),
    }
    f = doc.get("comm_fraction")
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 <= f <= 1):
        raise RequestError(f"{where}: 'comm_fraction' must be a number in [0, 1], got {f!r}")
    out["comm_fraction"] = None if f is None else float(f)
    pre = doc.get("preemptible", False)
    if not isinstance(pre, bool):
        raise RequestError(f"{where}: 'preemptible' must be true or false, got {pre!r}")
    out["preemptible"] = pre
    if not pre and (out["checkpoint_s"] is not None or out["checkpoint_every_s"] is not None):
        raise RequestError(f"{where}: 'checkpoint_s' / 'checkpoint_every_s' need 'preemptible': true")
    return out


def coerce(req: Request | Mapping[str, Any], where: str) -> Request:
    return req if isinstance(req, Request) else Request.from_dict(req, where)


def validate_request(req: Request, spec: ClusterSpec, where: str = "") -> None:
    """Cluster-dependent checks (:meth:`Constraints.validate`): ``k`` fits the cluster, constraint
    names exist, the constraints leave at least ``k`` GPUs even on an idle cluster. Raises
    :class:`RequestError` (a ``PlacementError`` with reason ``invalid_request``)."""
    req.constraints.validate(spec, req.k, f"request {req.id!r}", f"{where}: " if where else "")
    w = f"{where + ': ' if where else ''}request {req.id!r}"
    if req.hi > spec.n_gpus:
        raise RequestError(f"{w}: max_k={req.hi} exceeds the cluster size ({spec.n_gpus} GPUs in {spec.name!r})")
    if req.shape is not None and req.elastic:
        raise RequestError(f"{w}: a 'shape' fixes k={req.k}; it cannot be combined with an elastic min_k/max_k range")
    seg = req.constraints.segment
    if seg is not None and req.elastic and (req.lo % seg or req.step % seg):
        raise RequestError(f"{w}: segment {seg} must divide min_k={req.lo} and k_step={req.step}")


@dataclass
class ParsedRequests:
    requests: list[Request]
    errors: list[str]  # one line each, "<file>:<line>: ..."
    lines: list[int] = field(default_factory=list)  # source line of each request


def parse_jsonl(source: str | Path | Iterable[str], name: str | None = None) -> ParsedRequests:
    """Parse JSONL requests (one object per line; blank lines and ``#`` comments skipped).

    Returns every valid request and one error per bad line (invalid JSON, bad shape, an id repeated
    in the file) - the caller decides between all-or-nothing and ``partial``.
    """
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and not source.lstrip().startswith("{")):
        p = Path(source)
        if not p.is_file():
            raise RequestError(f"request file not found: {source}")
        name = name or str(source)
        lines: Iterable[str] = p.read_text().splitlines()
    elif isinstance(source, str):
        lines = source.splitlines()
    else:
        lines = source
    name = name or "<requests>"
    out = ParsedRequests([], [])
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{name}:{lineno}"
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            out.errors.append(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})")
            continue
        try:
            req = Request.from_dict(doc, where)
        except RequestError as exc:
            out.errors.append(str(exc))
            continue
        if req.id in seen:
            out.errors.append(f"{where}: duplicate request id {req.id!r} (first on line {seen[req.id]})")
            continue
        seen[req.id] = lineno
        out.requests.append(req)
        out.lines.append(lineno)
    return out


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:12]}"
