"""GPU request queue: a transactional store, admission policies and the batch run.

Tenants submit gang (all-or-nothing) GPU requests; :func:`run_batch` assigns the pending ones with a
:class:`~bandpilot.dispatch.dispatcher.Dispatcher` (the promoted model). Everything lives in one database
through SQLAlchemy 2.0 Core - a SQLite file by default (WAL), any PostgreSQL URL at scale:

========================  ==================================================================
``bp_schema``             applied migrations (ordered functions in :data:`MIGRATIONS`)
``bp_cluster``            the cluster spec (``spec.to_dict()`` as YAML) recorded by ``cluster init``
``bp_requests``           every request and its status: pending / assigned / rejected / released
                          / cancelled, with the last deferral reason
``bp_assignments``        what a batch decided for a request (GPUs, predictions, model version)
``bp_jobs``               active and finished jobs (one per assigned request, same id)
``bp_gpus``               one row per GPU: free / busy (``job_id``) / unavailable, drain flag
``bp_batches``            one row per batch run (an unfinished row marks an interrupted run)
========================  ==================================================================

Safety rests on three layers, so no single one has to be perfect:

1. *The schema.* A GPU row holds at most one ``job_id`` and a CHECK ties ``busy`` to it, so a GPU
   cannot be in two jobs; ``bp_assignments`` is keyed by request id, so a request cannot be
   assigned twice.
2. *Compare-and-set writes.* Assigning flips the request ``pending -> assigned`` and the GPUs
   ``free -> busy`` with guarded ``UPDATE ... WHERE status/state = ...`` and checks the row counts;
   a mismatch rolls back that request's savepoint.
3. *Locks.* A write transaction is ``BEGIN IMMEDIATE`` on SQLite (the pysqlite event-hook recipe,
   so two batch runs serialise) and takes ``SELECT ... FOR UPDATE`` row locks on the GPU rows on
   PostgreSQL, always in id order so writers cannot deadlock.

A batch is one transaction by default (``commit="batch"``): a crash (even ``kill -9``) leaves every
request untouched; ``commit="request"`` commits each request on its own, so a crash leaves each
request either untouched or fully assigned and a long batch never blocks other writers for long.

Policies order the pending requests: ``fifo`` (submit time), ``priority`` (higher first, then FIFO)
and ``utility`` (higher job utility first; when the queued demand exceeds the free GPUs, each
tenant gets a GPU quota proportional to its requests' utility, seed 001 eq. 31, and requests over
their tenant's quota only get what is left after everyone within quota). Every request in the
order is tried (backfill): one that does not fit is deferred with its reason and a later, smaller
one may still be placed.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import time
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import sqlalchemy as sa
import yaml
from sqlalchemy import event

from bandpilot.topology.cluster import ClusterSpec, popcount, spec_from_dict
from bandpilot.config import project_root
from bandpilot.errors import BandPilotError, ModelError, RequestError, SpecError, StateError
from bandpilot.dispatch.state import Job, State

POLICIES = ("fifo", "priority", "utility")
COMMIT_MODES = ("batch", "request")
REQUEST_STATUSES = ("pending", "assigned", "rejected", "released", "cancelled")
GPU_STATES = ("free", "busy", "unavailable")
#: Deferral / rejection reasons (the dispatcher's PlacementError reasons plus the queue's own).
REASONS = ("insufficient_gpus", "constraint_unmet", "invalid_request", "dispatcher_error", "conflict")
#: Test hook: seconds to sleep after each request of a batch (lets a test ``kill -9`` mid-batch).
SLEEP_ENV = "BANDPILOT_TEST_BATCH_SLEEP"
STORE_ENV = "BANDPILOT_STORE"

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$")
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class StoreError(BandPilotError):
    """The queue database cannot be opened, is not initialised, is busy or is from a newer version."""


# ------------------------------------------------------------------------------------------
# Schema
# ------------------------------------------------------------------------------------------
metadata = sa.MetaData()

T_SCHEMA = sa.Table(
    "bp_schema",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.Double, nullable=False),
)
T_CLUSTER = sa.Table(
    "bp_cluster",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("n_gpus", sa.Integer, nullable=False),
    sa.Column("spec_yaml", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.CheckConstraint("id = 1", name="ck_bp_cluster_single"),
)
T_REQ = sa.Table(
    "bp_requests",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(200), nullable=False, unique=True),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("k", sa.Integer, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("utility", sa.Double, nullable=True),
    sa.Column("constraints", sa.Text, nullable=True),
    sa.Column("submitted_at", sa.Double, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=True),
    sa.Column("detail", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_batch", sa.Integer, nullable=True),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.CheckConstraint("k > 0", name="ck_bp_requests_k"),
    sa.CheckConstraint(
        "status IN ('pending','assigned','rejected','released','cancelled')", name="ck_bp_requests_status"
    ),
    sa.Index("ix_bp_requests_status_order", "status", "submitted_at", "seq"),
)
T_ASSIGN = sa.Table(
    "bp_assignments",
    metadata,
    sa.Column("request_id", sa.String(200), sa.ForeignKey("bp_requests.id"), primary_key=True),
    sa.Column("batch_id", sa.Integer, nullable=True),
    sa.Column("gpus", sa.Text, nullable=False),
    sa.Column("predicted_gbps", sa.Double, nullable=True),
    sa.Column("standalone_gbps", sa.Double, nullable=True),
    sa.Column("algorithm", sa.String(64), nullable=True),
    sa.Column("model_uri", sa.Text, nullable=True),
    sa.Column("model_version", sa.String(200), nullable=True),
    sa.Column("search_ms", sa.Double, nullable=True),
    sa.Column("evaluations", sa.Integer, nullable=True),
    sa.Column("assigned_at", sa.Double, nullable=False),
)
T_JOBS = sa.Table(
    "bp_jobs",
    metadata,
    sa.Column("id", sa.String(200), sa.ForeignKey("bp_requests.id"), primary_key=True),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("k", sa.Integer, nullable=False),
    sa.Column("demand_gbps", sa.Double, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("ended_at", sa.Double, nullable=True),
    sa.CheckConstraint("status IN ('active','released')", name="ck_bp_jobs_status"),
    sa.Index("ix_bp_jobs_status", "status"),
)
T_GPUS = sa.Table(
    "bp_gpus",
    metadata,
    sa.Column("id", sa.String(220), primary_key=True),
    sa.Column("pos", sa.Integer, nullable=False),
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("domain", sa.String(200), nullable=True),
    sa.Column("state", sa.String(12), nullable=False),
    sa.Column("job_id", sa.String(200), sa.ForeignKey("bp_jobs.id"), nullable=True),
    sa.Column("drain_pending", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.CheckConstraint("state IN ('free','busy','unavailable')", name="ck_bp_gpus_state"),
    # The structural guarantee: busy <=> owned by exactly one job.
    sa.CheckConstraint(
        "(state = 'busy' AND job_id IS NOT NULL) OR (state <> 'busy' AND job_id IS NULL)", name="ck_bp_gpus_owner"
    ),
    sa.Index("ix_bp_gpus_job", "job_id"),
)
T_BATCH = sa.Table(
    "bp_batches",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("policy", sa.String(16), nullable=False),
    sa.Column("commit_mode", sa.String(16), nullable=False),
    sa.Column("model_uri", sa.Text, nullable=True),
    sa.Column("model_version", sa.String(200), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("finished_at", sa.Double, nullable=True),
    sa.Column("n_considered", sa.Integer, nullable=True),
    sa.Column("n_assigned", sa.Integer, nullable=True),
    sa.Column("n_deferred", sa.Integer, nullable=True),
    sa.Column("n_rejected", sa.Integer, nullable=True),
)

_V1_TABLES = [T_SCHEMA, T_CLUSTER, T_REQ, T_ASSIGN, T_JOBS, T_GPUS, T_BATCH]


def _m1_initial(conn: sa.Connection) -> None:
    # When the schema changes, freeze the v1 table definitions here and add an ALTER step
    # (e.g. via :func:`alembic_ops`) instead of editing the tables above in place.
    metadata.create_all(conn, tables=_V1_TABLES[1:], checkfirst=True)


def alembic_ops(conn: sa.Connection):
    """Alembic's portable DDL operations bound to ``conn`` (``op.add_column``, ``op.batch_alter_table``
    for SQLite, ...), for migration functions; no Alembic env or script directory is needed."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    return Operations(MigrationContext.configure(conn))


#: Ordered migrations ``(version, name, function(connection))``; append, never edit.
MIGRATIONS: list[tuple[int, str, Callable[[sa.Connection], None]]] = [
    (1, "initial schema", _m1_initial),
]


def schema_version() -> int:
    return MIGRATIONS[-1][0]


# ------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------
def _now() -> float:
    return time.time()


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")


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


def format_gpus(gpus: Sequence[str]) -> str:
    """Compact GPU list: ``h100-0:0-3,5 h100-1:0-7``."""
    by_host: dict[str, list[int]] = {}
    for g in gpus:
        h, _, i = g.rpartition(":")
        by_host.setdefault(h, []).append(int(i) if i.isdigit() else -1)
    parts = []
    for h, idx in by_host.items():
        idx.sort()
        runs: list[str] = []
        start = prev = idx[0]
        for i in idx[1:] + [None]:  # type: ignore[list-item]
            if i is not None and i == prev + 1:
                prev = i
                continue
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            if i is not None:
                start = prev = i
        parts.append(f"{h}:{','.join(runs)}")
    return " ".join(parts)


def default_store_url(root: Path | None = None) -> str:
    """``$BANDPILOT_STORE`` or ``sqlite:///<project>/.bandpilot/queue.db``."""
    env = os.environ.get(STORE_ENV)
    if env:
        return env
    root = root or project_root()
    return f"sqlite:///{root / '.bandpilot' / 'queue.db'}"


# ------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------
_CONSTRAINT_KEYS = ("single_host", "single_domain", "allowed_hosts", "allowed_gpus", "min_gbps")
_REQUEST_KEYS = ("id", "k", "tenant", "priority", "utility", "submitted", "submitted_at", "constraints")


@dataclass(frozen=True)
class Constraints:
    """Placement constraints of a request. ``single_domain`` and ``allowed_gpus`` are applied by the
    queue (one dispatcher call per candidate domain, best prediction wins / free GPUs outside the
    list hidden from the dispatcher); the rest are passed to :meth:`Dispatcher.select`. Hosts
    without a ``domain`` form one implicit domain, so ``single_domain`` on a cluster without
    domains only requires ``k`` to fit the cluster."""

    single_host: bool = False
    single_domain: bool = False
    allowed_hosts: tuple[str, ...] | None = None
    allowed_gpus: tuple[str, ...] | None = None
    min_gbps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.single_host:
            out["single_host"] = True
        if self.single_domain:
            out["single_domain"] = True
        if self.allowed_hosts is not None:
            out["allowed_hosts"] = list(self.allowed_hosts)
        if self.allowed_gpus is not None:
            out["allowed_gpus"] = list(self.allowed_gpus)
        if self.min_gbps is not None:
            out["min_gbps"] = self.min_gbps
        return out

    @cached_property
    def key(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "constraints") -> "Constraints":
        if doc is None:
            return cls()
        if not isinstance(doc, Mapping):
            raise RequestError(f"{where}: 'constraints' must be an object")
        unknown = sorted(set(doc) - set(_CONSTRAINT_KEYS))
        if unknown:
            raise RequestError(f"{where}: unknown constraint {unknown[0]!r} (known: {', '.join(_CONSTRAINT_KEYS)})")
        flags = {}
        for key in ("single_host", "single_domain"):
            v = doc.get(key, False)
            if not isinstance(v, bool):
                raise RequestError(f"{where}: constraint {key!r} must be true or false, got {v!r}")
            flags[key] = v
        lists: dict[str, tuple[str, ...] | None] = {}
        for key in ("allowed_hosts", "allowed_gpus"):
            v = doc.get(key)
            if v is None:
                lists[key] = None
                continue
            if isinstance(v, str):
                v = [x for x in v.split(",") if x.strip()]
            if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() for x in v):
                raise RequestError(f"{where}: constraint {key!r} must be a non-empty list of names")
            vals = [x.strip() for x in v]
            if len(set(vals)) != len(vals):
                dup = next(x for x in vals if vals.count(x) > 1)
                raise RequestError(f"{where}: constraint {key!r} lists {dup!r} twice")
            lists[key] = tuple(vals)
        mg = doc.get("min_gbps")
        if mg is not None:
            if isinstance(mg, bool) or not isinstance(mg, (int, float)) or not math.isfinite(mg) or mg <= 0:
                raise RequestError(f"{where}: constraint 'min_gbps' must be a positive number, got {mg!r}")
            mg = float(mg)
        return cls(flags["single_host"], flags["single_domain"], lists["allowed_hosts"], lists["allowed_gpus"], mg)


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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "k": self.k, "tenant": self.tenant, "priority": self.priority}
        if self.utility is not None:
            out["utility"] = self.utility
        if self.submitted_at is not None:
            out["submitted"] = iso(self.submitted_at)
        c = self.constraints.to_dict()
        if c:
            out["constraints"] = c
        return out

    @classmethod
    def from_dict(cls, doc: Any, where: str = "request") -> "Request":
        """Validate the shape of one request (cluster-independent checks; see :func:`validate_request`)."""
        if not isinstance(doc, Mapping):
            raise RequestError(f"{where}: a request must be a JSON object")
        unknown = sorted(set(doc) - set(_REQUEST_KEYS))
        if unknown:
            hint = " (constraints go under 'constraints')" if unknown[0] in _CONSTRAINT_KEYS else ""
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
        return cls(rid, k, tenant.strip(), prio, util, sub_t, cons)


def _coerce(req: Request | Mapping[str, Any], where: str) -> Request:
    return req if isinstance(req, Request) else Request.from_dict(req, where)


def validate_request(req: Request, spec: ClusterSpec, where: str = "") -> None:
    """Cluster-dependent checks: ``k`` fits the cluster, constraint names exist, the constraints
    leave at least ``k`` GPUs even on an idle cluster. Raises :class:`RequestError`."""
    loc = f"{where}: " if where else ""
    w = f"{loc}request {req.id!r}"
    if req.k > spec.n_gpus:
        raise RequestError(f"{w}: k={req.k} exceeds the cluster size ({spec.n_gpus} GPUs in {spec.name!r})")
    c = req.constraints
    hosts = range(spec.n_hosts)
    if c.allowed_hosts is not None:
        idx = []
        for h in c.allowed_hosts:
            if h not in spec.host_index:
                hint = " (GPU ids go in allowed_gpus)" if ":" in h else ""
                raise RequestError(f"{w}: unknown host {h!r} in allowed_hosts{hint}")
            idx.append(spec.host_index[h])
        hosts = idx
    per_host = np.zeros(spec.n_hosts, dtype=np.int64)
    per_host[list(hosts)] = spec.gpus_per_host[list(hosts)]
    if c.allowed_gpus is not None:
        try:
            mask = spec.to_mask(c.allowed_gpus, f"request {req.id!r} allowed_gpus")
        except SpecError as exc:
            raise RequestError(f"{loc}{exc}") from None
        counts = popcount(mask)
        per_host = np.minimum(per_host, counts) if c.allowed_hosts is not None else counts
        if c.allowed_hosts is not None:
            outside = [g for g in c.allowed_gpus if g.rpartition(":")[0] not in set(c.allowed_hosts)]
            if outside:
                raise RequestError(f"{w}: allowed_gpus {outside[0]!r} is not on an allowed host")
    total = int(per_host.sum())
    if total < req.k:
        raise RequestError(f"{w}: k={req.k} but the constraints allow only {total} GPUs")
    if c.single_host and int(per_host.max()) < req.k:
        raise RequestError(f"{w}: k={req.k} cannot fit on a single host (largest allowed host has {int(per_host.max())})")
    if c.single_domain:
        dom = _domain_ids(spec)[0]
        best = int(np.bincount(dom, weights=per_host).max())
        if best < req.k:
            raise RequestError(f"{w}: k={req.k} cannot fit in a single domain (largest allowed has {best} GPUs)")


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


# ------------------------------------------------------------------------------------------
# Store
# ------------------------------------------------------------------------------------------
def _domain_ids(spec: ClusterSpec) -> tuple[np.ndarray, list[str | None]]:
    """Domain index per host; hosts without a domain share one implicit domain (as the emulator does)."""
    names: dict[str | None, int] = {}
    ids = np.array([names.setdefault(h.domain, len(names)) for h in spec.hosts], dtype=np.int64)
    return ids, list(names)


class Store:
    """The queue database. ``Store(url)`` opens (and migrates) it; ``url`` defaults to
    :func:`default_store_url`. On PostgreSQL, ``schema`` puts every table in that schema
    (created if missing) - tests use one per run."""

    def __init__(self, url: str | None = None, *, schema: str | None = None, timeout: float = 120.0) -> None:
        self.url = url or default_store_url()
        try:
            u = sa.engine.make_url(self.url)
        except sa.exc.ArgumentError:
            raise StoreError(f"invalid store URL {self.url!r}") from None
        self.backend = u.get_backend_name()
        self.schema = schema
        self.timeout = float(timeout)
        self.safe_url = u.render_as_string(hide_password=True)
        if self.backend == "sqlite":
            self.engine = self._sqlite_engine(u)
        elif self.backend == "postgresql":
            self.engine = self._pg_engine(u)
        else:
            raise StoreError(f"unsupported store URL {self.safe_url!r}: use sqlite:///FILE or postgresql://...")
        self._spec: ClusterSpec | None = None
        self._fingerprint: str | None = None
        self._gpu_loc: dict[str, tuple[int, int]] = {}
        self.migrate()

    # -- engines --------------------------------------------------------------------------
    def _sqlite_engine(self, u: sa.URL) -> sa.Engine:
        if self.schema:
            raise StoreError("schema= is for PostgreSQL stores only")
        db = u.database
        kwargs: dict[str, Any] = {"connect_args": {"timeout": self.timeout}}
        if db and db != ":memory:":
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        else:
            kwargs["poolclass"] = sa.pool.StaticPool
            kwargs["connect_args"]["check_same_thread"] = False
        engine = sa.create_engine(u, **kwargs)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _rec):  # pragma: no cover - exercised by every test
            # Take transaction control away from pysqlite so the "begin" hook below decides.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            # Writers take the database write lock up front (no lock upgrade deadlocks between two
            # batch runs); readers use a deferred transaction, which never blocks writers in WAL.
            mode = "DEFERRED" if conn.get_execution_options().get("bp_readonly") else "IMMEDIATE"
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine

    def _pg_engine(self, u: sa.URL) -> sa.Engine:
        connect_args: dict[str, Any] = {"connect_timeout": 5}
        if self.schema:
            if not _SCHEMA_RE.match(self.schema):
                raise StoreError(f"invalid schema name {self.schema!r}")
            connect_args["options"] = f"-csearch_path={self.schema}"
        engine = sa.create_engine(u, connect_args=connect_args, pool_pre_ping=True)
        if self.schema:
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            except sa.exc.IntegrityError:  # two processes creating it at once
                pass
            except sa.exc.OperationalError as exc:
                raise StoreError(f"cannot open store {self.safe_url}: {_dberr(exc)}") from None
        return engine

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.safe_url!r}{', schema=' + repr(self.schema) if self.schema else ''})"

    # -- transactions ---------------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[sa.Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite); commits on success, rolls back on error."""
        try:
            with self.engine.connect() as conn:
                with conn.begin():
                    yield conn
        except sa.exc.OperationalError as exc:
            msg = _dberr(exc)
            if "locked" in msg or "busy" in msg:
                raise StoreError(f"store {self.safe_url} is busy: another writer held it for over {self.timeout:g}s") from None
            raise StoreError(f"store {self.safe_url}: {msg}") from None

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        """A read-only snapshot (deferred on SQLite, REPEATABLE READ on PostgreSQL)."""
        try:
            with self.engine.connect() as conn:
                opts: dict[str, Any] = {"bp_readonly": True}
                if self.backend == "postgresql":
                    opts["isolation_level"] = "REPEATABLE READ"
                conn.execution_options(**opts)
                with conn.begin():
                    yield conn
        except sa.exc.OperationalError as exc:
            raise StoreError(f"store {self.safe_url}: {_dberr(exc)}") from None

    def lock_gpus(self, conn: sa.Connection, ids: Sequence[str] | None = None) -> None:
        """Row-lock GPU rows (all, or ``ids``) in id order; a no-op on SQLite (BEGIN IMMEDIATE)."""
        if self.backend != "postgresql":
            return
        q = sa.select(T_GPUS.c.id).order_by(T_GPUS.c.id).with_for_update()
        if ids is not None:
            q = q.where(T_GPUS.c.id.in_(list(ids)))
        conn.execute(q).all()

    # -- migrations -----------------------------------------------------------------------
    def current_version(self, conn: sa.Connection) -> int:
        if not sa.inspect(conn).has_table("bp_schema"):
            return 0
        v = conn.execute(sa.select(sa.func.max(T_SCHEMA.c.version))).scalar()
        return int(v or 0)

    def migrate(self) -> int:
        """Apply pending migrations in order, each recorded in ``bp_schema``; returns the version."""
        target = schema_version()
        try:
            with self.read() as conn:
                cur = self.current_version(conn)
        except StoreError:
            raise
        except sa.exc.DBAPIError as exc:
            raise StoreError(f"cannot open store {self.safe_url}: {_dberr(exc)}") from None
        if cur > target:
            raise StoreError(f"store {self.safe_url} has schema v{cur}, newer than this BandPilot (v{target}); upgrade BandPilot")
        if cur == target:
            return cur
        with self.write() as conn:
            if self.backend == "postgresql":
                key = zlib.crc32(f"bandpilot-queue:{self.schema or 'public'}".encode()) & 0x7FFFFFFF
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            if not sa.inspect(conn).has_table("bp_schema"):
                T_SCHEMA.create(conn, checkfirst=True)
            cur = self.current_version(conn)  # re-read under the lock: another process may have won
            for version, name, fn in MIGRATIONS:
                if version > cur:
                    fn(conn)
                    conn.execute(sa.insert(T_SCHEMA).values(version=version, name=name, applied_at=_now()))
                    cur = version
        return cur

    # -- cluster --------------------------------------------------------------------------
    def init_cluster(self, spec: ClusterSpec, *, force: bool = False) -> bool:
        """Record ``spec`` and create one free row per GPU. Idempotent for the same cluster; a
        different cluster needs ``force`` and no active jobs. Returns True when something changed."""
        doc = spec.to_dict()
        spec_yaml = yaml.safe_dump(doc, sort_keys=False)
        # What later commands rebuild must be the same cluster.
        rebuilt = spec_from_dict(yaml.safe_load(spec_yaml), source="<store spec>")
        fp = rebuilt.fingerprint()
        now = _now()
        with self.write() as conn:
            row = conn.execute(sa.select(T_CLUSTER).with_for_update()).first()
            if row is not None and row.fingerprint == fp:
                return False
            if row is not None:
                if not force:
                    raise StoreError(
                        f"store {self.safe_url} already holds cluster {row.name!r} ({row.n_gpus} GPUs); "
                        f"use --force to replace it with {spec.name!r} or use another store"
                    )
                active = conn.execute(
                    sa.select(sa.func.count()).select_from(T_JOBS).where(T_JOBS.c.status == "active")
                ).scalar()
                if active:
                    raise StoreError(f"cannot replace cluster {row.name!r}: {active} jobs are still active; release them first")
                self.lock_gpus(conn)
                conn.execute(sa.delete(T_GPUS))
                conn.execute(
                    sa.update(T_CLUSTER).values(
                        name=spec.name, fingerprint=fp, n_gpus=spec.n_gpus, spec_yaml=spec_yaml, updated_at=now
                    )
                )
            else:
                conn.execute(
                    sa.insert(T_CLUSTER).values(
                        id=1, name=spec.name, fingerprint=fp, n_gpus=spec.n_gpus, spec_yaml=spec_yaml,
                        created_at=now, updated_at=now,
                    )
                )
            rows = []
            for pos, gid in enumerate(rebuilt.gpu_ids):
                h, i = rebuilt.parse_gpu(gid)
                host = rebuilt.hosts[h]
                rows.append(
                    {"id": gid, "pos": pos, "host": host.name, "idx": i, "domain": host.domain,
                     "state": "free", "job_id": None, "drain_pending": False, "note": None, "updated_at": now}
                )
            conn.execute(sa.insert(T_GPUS), rows)
        self._spec = None
        return True

    def refresh(self) -> None:
        """Re-read the spec on next use if the stored cluster changed (one small query)."""
        if self._spec is None:
            return
        with self.read() as conn:
            fp = conn.execute(sa.select(T_CLUSTER.c.fingerprint)).scalar()
        if fp != self._fingerprint:
            self._spec = None

    @property
    def spec(self) -> ClusterSpec:
        """The cluster recorded by :meth:`init_cluster`."""
        if self._spec is None:
            with self.read() as conn:
                row = conn.execute(sa.select(T_CLUSTER)).first()
            if row is None:
                raise StoreError(
                    f"store {self.safe_url} has no cluster yet: run `bandpilot cluster init --cluster SPEC`"
                )
            spec = spec_from_dict(yaml.safe_load(row.spec_yaml), source=f"{self.safe_url} cluster")
            self._spec = spec
            self._fingerprint = row.fingerprint
            self._gpu_loc = {g: spec.parse_gpu(g) for g in spec.gpu_ids}
        return self._spec

    @property
    def initialized(self) -> bool:
        with self.read() as conn:
            return conn.execute(sa.select(T_CLUSTER.c.id)).first() is not None

    # -- state ----------------------------------------------------------------------------
    def load_state(self, conn: sa.Connection, spec: ClusterSpec | None = None) -> State:
        """The cluster state as the dispatcher sees it (free GPUs, active jobs with demand).
        ``spec`` may be an equal spec object (same fingerprint), e.g. the model's."""
        spec = spec or self.spec
        self.spec  # noqa: B018 - fills the GPU location cache
        loc = self._gpu_loc
        free = np.zeros(spec.n_hosts, dtype=np.int64)
        owned: dict[str, list[str]] = {}
        for gid, state, job in conn.execute(_GPU_STATE_STMT):
            if state == "free":
                h, i = loc[gid]
                free[h] |= np.int64(1) << i
            elif state == "busy":
                owned.setdefault(job, []).append(gid)
        jobs = []
        for jid, demand in conn.execute(_ACTIVE_JOBS_STMT):
            gpus = owned.get(jid, [])
            mask = np.zeros(spec.n_hosts, dtype=np.int64)
            for g in gpus:
                h, i = loc[g]
                mask[h] |= np.int64(1) << i
            jobs.append(Job(jid, tuple(gpus), float(demand), mask))
        return State(spec, free, tuple(jobs))


_GPU_STATE_STMT = sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.job_id).order_by(T_GPUS.c.pos)
_ACTIVE_JOBS_STMT = (
    sa.select(T_JOBS.c.id, T_JOBS.c.demand_gbps).where(T_JOBS.c.status == "active").order_by(T_JOBS.c.started_at, T_JOBS.c.id)
)


def _dberr(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split())


def open_store(url: str | None = None, **kwargs: Any) -> Store:
    return Store(url, **kwargs)


# ------------------------------------------------------------------------------------------
# Submit / cancel
# ------------------------------------------------------------------------------------------
@dataclass
class SubmitReport:
    submitted: list[str]
    errors: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"submitted": len(self.submitted), "ids": self.submitted, "errors": self.errors}


class SubmitError(RequestError):
    """Some requests are invalid and nothing was submitted; ``errors`` lists every problem."""

    def __init__(self, errors: Sequence[str], n_valid: int) -> None:
        self.errors = list(errors)
        self.n_valid = n_valid
        more = f"{len(self.errors)} invalid request(s), first: " if len(self.errors) > 1 else ""
        hint = f" (submit with partial / --partial to queue the {n_valid} valid ones)" if n_valid else ""
        super().__init__(f"{more}{self.errors[0]}; nothing submitted{hint}")


def submit(
    store: Store,
    requests: Iterable[Request | Mapping[str, Any]],
    *,
    partial: bool = False,
    errors: Sequence[str] = (),
    labels: Sequence[str] | None = None,
) -> SubmitReport:
    """Queue requests in one transaction.

    Each is validated against the store's cluster (:func:`validate_request`); a bad one, an id
    repeated or already in the store, or any ``errors`` passed in from parsing make the call raise
    :class:`SubmitError` with nothing queued - unless ``partial``, which queues the valid ones and
    reports the rest. ``labels`` (e.g. ``file:line``) prefix each request's error messages.
    """
    spec = store.spec
    errs = list(errors)
    good: list[Request] = []
    where: dict[str, str] = {}
    for n, item in enumerate(requests):
        w = labels[n] if labels is not None else f"request[{n}]"
        try:
            req = _coerce(item, w)
            validate_request(req, spec, w)
        except RequestError as exc:
            errs.append(str(exc))
            continue
        if req.id in where:
            errs.append(f"{w}: duplicate request id {req.id!r} (also at {where[req.id]})")
            continue
        where[req.id] = w
        good.append(req)
    now = _now()
    with store.write() as conn:
        existing: set[str] = set()
        ids = [r.id for r in good]
        for i in range(0, len(ids), 500):
            existing.update(conn.execute(sa.select(T_REQ.c.id).where(T_REQ.c.id.in_(ids[i : i + 500]))).scalars())
        if existing:
            errs.extend(f"{where[rid]}: request id {rid!r} already exists in the store" for rid in ids if rid in existing)
            good = [r for r in good if r.id not in existing]
        if errs and not partial:
            raise SubmitError(errs, len(good))
        rows = [
            {
                "id": r.id, "tenant": r.tenant, "k": r.k, "priority": r.priority, "utility": r.utility,
                "constraints": r.constraints.key if r.constraints.to_dict() else None,
                "submitted_at": r.submitted_at if r.submitted_at is not None else now,
                "status": "pending", "reason": None, "detail": None, "attempts": 0, "last_batch": None,
                "updated_at": now,
            }
            for r in good
        ]
        if rows:
            try:
                conn.execute(sa.insert(T_REQ), rows)
            except sa.exc.IntegrityError:
                raise RequestError("a request id was submitted concurrently by another process; nothing submitted") from None
    return SubmitReport([r.id for r in good], errs)


def cancel(store: Store, request_id: str) -> None:
    """Withdraw a pending request (an assigned one must be released instead)."""
    with store.write() as conn:
        r = conn.execute(
            sa.update(T_REQ)
            .where(T_REQ.c.id == request_id, T_REQ.c.status == "pending")
            .values(status="cancelled", updated_at=_now())
        )
        if r.rowcount == 1:
            return
        st = conn.execute(sa.select(T_REQ.c.status).where(T_REQ.c.id == request_id)).scalar()
    if st is None:
        raise RequestError(f"no request {request_id!r}")
    hint = "; release the job instead" if st == "assigned" else ""
    raise RequestError(f"request {request_id!r} is {st}, not pending{hint}")


# ------------------------------------------------------------------------------------------
# Policies
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Pending:
    req: Request
    seq: int
    submitted_at: float


@lru_cache(maxsize=4096)
def _stored_constraints(text: str | None) -> Constraints:
    return Constraints.from_dict(json.loads(text)) if text else Constraints()


_PENDING_COLS = (T_REQ.c.seq, T_REQ.c.id, T_REQ.c.k, T_REQ.c.tenant, T_REQ.c.priority, T_REQ.c.utility,
                 T_REQ.c.submitted_at, T_REQ.c.constraints, T_REQ.c.reason, T_REQ.c.detail)
_PENDING_STMT = sa.select(*_PENDING_COLS).where(T_REQ.c.status == "pending").order_by(T_REQ.c.submitted_at, T_REQ.c.seq)
_pending_cache: dict[tuple, "_Pending"] = {}


def _row_to_pending(row: tuple) -> _Pending:
    p = _pending_cache.get(row)
    if p is None:
        seq, rid, k, tenant, prio, util, sub, cons = row
        req = Request(rid, int(k), tenant, int(prio), util, float(sub), _stored_constraints(cons))
        p = _Pending(req, int(seq), float(sub))
        if len(_pending_cache) > 200_000:
            _pending_cache.clear()
        _pending_cache[row] = p  # keyed by the whole row: an edited row is parsed afresh
    return p


def utility_prior(pending: Sequence[_Pending]) -> float:
    """Utility of a request that gives none: the mean of those that do (1.0 if none do) - a
    neutral prior, as the seed's scheduler falls back to a default for jobs without a score."""
    known = [p.req.utility for p in pending if p.req.utility is not None]
    return float(np.mean(known)) if known else 1.0


def order_pending(pending: Sequence[_Pending], policy: str) -> list[_Pending]:
    """Admission order: ``fifo`` (submit time, then arrival), ``priority`` (higher first, then
    FIFO), ``utility`` (higher job utility first, then priority, then FIFO)."""
    if policy == "fifo":
        return sorted(pending, key=lambda p: (p.submitted_at, p.seq))
    if policy == "priority":
        return sorted(pending, key=lambda p: (-p.req.priority, p.submitted_at, p.seq))
    if policy == "utility":
        prior = utility_prior(pending)
        return sorted(
            pending,
            key=lambda p: (-(p.req.utility if p.req.utility is not None else prior), -p.req.priority, p.submitted_at, p.seq),
        )
    raise RequestError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")


def utility_quotas(pending: Sequence[_Pending], n_free: int) -> dict[str, int] | None:
    """Per-tenant GPU quotas proportional to utility when requests compete (seed 001, eq. 31).

    Each request's share of the free GPUs is ``F * U_j / sum U``; a tenant's quota is the sum over
    its requests, made integer by largest remainders so quotas add up to ``F`` exactly. ``None``
    when the queued demand fits in the free GPUs (no competition, no quotas).
    """
    if not pending or sum(p.req.k for p in pending) <= n_free:
        return None
    prior = utility_prior(pending)
    stake: dict[str, float] = {}
    for p in pending:
        u = p.req.utility if p.req.utility is not None else prior
        stake[p.req.tenant] = stake.get(p.req.tenant, 0.0) + u
    total = sum(stake.values())
    if total <= 0:
        stake = {t: 1.0 for t in stake}
        total = float(len(stake))
    exact = {t: n_free * s / total for t, s in stake.items()}
    quota = {t: math.floor(x) for t, x in exact.items()}
    left = n_free - sum(quota.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - quota[t]), -stake[t], t))[:left]:
        quota[t] += 1
    return quota


# ------------------------------------------------------------------------------------------
# Batch run
# ------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a batch did with one request."""

    request_id: str
    tenant: str
    k: int
    status: str  # assigned | deferred | rejected | skipped (taken by a concurrent run)
    reason: str | None = None
    detail: str | None = None
    gpus: list[str] = field(default_factory=list)
    predicted_gbps: float | None = None
    standalone_gbps: float | None = None
    algorithm: str | None = None
    model_version: str | None = None
    search_ms: float | None = None
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "tenant": self.tenant, "k": self.k, "status": self.status,
            "reason": self.reason, "detail": self.detail, "gpus": self.gpus,
            "predicted_gbps": self.predicted_gbps, "standalone_gbps": self.standalone_gbps,
            "algorithm": self.algorithm, "model_version": self.model_version, "search_ms": self.search_ms,
            "time": iso(self.at),
        }


@dataclass
class BatchReport:
    batch_id: int | None
    policy: str
    commit: str
    model_uri: str | None
    model_version: str | None
    started_at: float
    finished_at: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    quotas: dict[str, int] | None = None
    pending_before: int = 0

    def by_status(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def assigned(self) -> list[Outcome]:
        return self.by_status("assigned")

    @property
    def deferred(self) -> list[Outcome]:
        return self.by_status("deferred")

    @property
    def rejected(self) -> list[Outcome]:
        return self.by_status("rejected")

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("assigned", "deferred", "rejected", "skipped")}
        for o in self.outcomes:
            out[o.status] = out.get(o.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id, "policy": self.policy, "commit": self.commit,
            "model_uri": self.model_uri, "model_version": self.model_version,
            "started": iso(self.started_at), "duration_s": round(self.duration_s, 4),
            "pending_before": self.pending_before, "counts": self.counts(), "quotas": self.quotas,
            "outcomes": [o.to_dict() for o in self.outcomes],
        }


class _Deferred(Exception):
    def __init__(self, status: str, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


class _Conflict(Exception):
    pass


def _placement_error_type() -> type[BaseException]:
    try:
        from bandpilot.dispatch.dispatcher import PlacementError

        return PlacementError
    except ImportError:  # pragma: no cover - the dispatcher module is part of the package
        return RequestError


def model_version_of(dispatcher: Any) -> str | None:
    """Best-effort model version label of a dispatcher (registry version, else URI, else class)."""
    for obj in (dispatcher, getattr(dispatcher, "model", None)):
        if obj is None:
            continue
        for attr in ("model_version", "version"):
            v = getattr(obj, attr, None)
            if v is not None and not callable(v):
                return str(v)
    for attr in ("model_uri", "uri"):
        v = getattr(dispatcher, attr, None)
        if isinstance(v, str):
            return v
    model = getattr(dispatcher, "model", None)
    return type(model).__name__ if model is not None else None


def check_model(store: Store, dispatcher: Any) -> None:
    """The model must describe the store's cluster (same hosts, GPU types, topologies)."""
    spec = store.spec
    mspec = getattr(getattr(dispatcher, "model", None), "spec", None)
    if mspec is None:
        raise ModelError("the dispatcher's model has no cluster spec")
    if mspec.fingerprint() != spec.fingerprint():
        raise ModelError(
            f"the model was built for cluster {mspec.name!r} ({mspec.n_gpus} GPUs, fingerprint {mspec.fingerprint()}), "
            f"but the store holds {spec.name!r} ({spec.n_gpus} GPUs, fingerprint {spec.fingerprint()})"
        )


class _Placer:
    """Tries one request against an in-memory state with the dispatcher; never writes."""

    def __init__(self, spec: ClusterSpec, dispatcher: Any, algorithm: str) -> None:
        self.spec = spec
        self.dispatcher = dispatcher
        self.algorithm = algorithm
        self.state: State | None = None
        self._n_free = 0
        self.dom_ids, self.dom_names = _domain_ids(spec)
        self._allowed: dict[str, np.ndarray | None] = {}
        self._fail: dict[tuple[int, str], tuple[str, str]] = {}
        self._never: dict[tuple[int, str], str | None] = {}
        self._valid: set[tuple[int, str]] = set()
        self.PlacementError = _placement_error_type()

    def set_state(self, state: State) -> None:
        if self.state is not None and np.any(state.free & ~self.state.free):
            self._fail.clear()  # GPUs came back (another process released): earlier failures are stale
        self.state = state
        self._n_free = state.n_free

    def allowed_mask(self, c: Constraints) -> np.ndarray | None:
        key = c.key
        if key not in self._allowed:
            mask = None
            if c.allowed_hosts is not None:
                mask = np.zeros(self.spec.n_hosts, dtype=np.int64)
                for h in c.allowed_hosts:
                    i = self.spec.host_index[h]
                    mask[i] = self.spec.full_masks[i]
            if c.allowed_gpus is not None:
                g = self.spec.to_mask(c.allowed_gpus)
                mask = g if mask is None else (mask & g)
            self._allowed[key] = mask
        return self._allowed[key]

    def quick_deferral(self, req: Request, version: str | None) -> "Outcome | None":
        """Per-request commits: a request that cannot fit even the last state seen (GPUs only
        leave the pool within our run) is deferred without opening a transaction."""
        st = self.state
        if st is not None and self._n_free < req.k and (req.k, req.constraints.key) in self._valid:
            return Outcome(req.id, req.tenant, req.k, "deferred", "insufficient_gpus",
                           f"needs {req.k} GPUs, fewer are free", model_version=version, at=_now())
        return None

    def place(self, req: Request) -> Any:
        """A validated Selection, or raise :class:`_Deferred`."""
        st = self.state
        assert st is not None
        k, c = req.k, req.constraints
        vkey = (k, c.key)
        if vkey not in self._valid:
            try:
                validate_request(req, self.spec)
            except RequestError as exc:
                raise _Deferred("rejected", "invalid_request", str(exc)) from None
            self._valid.add(vkey)
        n_free = st.n_free
        if n_free < k:
            raise _Deferred("deferred", "insufficient_gpus", f"needs {k} GPUs, fewer are free")
        allowed = self.allowed_mask(c)
        elig = st.free if allowed is None else (st.free & allowed)
        per_host = popcount(elig)
        n_elig = int(per_host.sum())
        if n_elig < k:
            raise _Deferred("deferred", "constraint_unmet", f"needs {k} GPUs among the allowed ones, fewer of them are free")
        if c.single_host and int(per_host.max()) < k:
            raise _Deferred(
                "deferred", "constraint_unmet", f"needs {k} GPUs on one host, no allowed host has that many free"
            )
        per_dom = np.bincount(self.dom_ids, weights=per_host, minlength=len(self.dom_names)).astype(np.int64)
        if c.single_domain and int(per_dom.max()) < k:
            raise _Deferred(
                "deferred", "constraint_unmet", f"needs {k} GPUs in one domain, no domain has that many free"
            )
        key = (k, c.key)
        if key in self._fail:
            reason, detail = self._fail[key]
            raise _Deferred("deferred", reason, detail)
        try:
            sel = self._select(req, st, elig, per_dom)
        except _Deferred as d:
            if d.status == "deferred" and d.reason == "constraint_unmet" and c.min_gbps is not None:
                never = self._never_satisfiable(req)
                if never:
                    raise _Deferred("rejected", "constraint_unmet", never) from None
            if d.status == "deferred" and d.reason in ("insufficient_gpus", "constraint_unmet"):
                self._fail[key] = (d.reason, d.detail)
            raise
        self._check_selection(req, sel, elig)
        return sel

    def _select(self, req: Request, st: State, elig: np.ndarray, per_dom: np.ndarray) -> Any:
        c = req.constraints
        view = st
        if c.allowed_gpus is not None:
            # Hide free GPUs outside the list: hidden free GPUs carry no traffic, so contention is unchanged.
            view = State(st.spec, elig.copy(), st.jobs)
        if not c.single_domain:
            return self._call(req, view, list(c.allowed_hosts) if c.allowed_hosts is not None else None)
        best, last = None, None
        for d in np.argsort(-per_dom, kind="stable"):
            if per_dom[d] < req.k:
                break
            hosts = [self.spec.hosts[h].name for h in np.flatnonzero(self.dom_ids == d)]
            if c.allowed_hosts is not None:
                hosts = [h for h in hosts if h in set(c.allowed_hosts)]
            try:
                sel = self._call(req, view, hosts)
            except _Deferred as d_err:
                if d_err.status == "rejected":
                    raise
                last = d_err
                continue
            if best is None or float(sel.predicted_gbps) > float(best.predicted_gbps):
                best = sel
        if best is None:
            raise last or _Deferred("deferred", "constraint_unmet", f"no domain can host {req.k} GPUs")
        return best

    def _call(self, req: Request, view: State, allowed_hosts: list[str] | None) -> Any:
        c = req.constraints
        cons: dict[str, Any] = {}
        if c.single_host:
            cons["single_host"] = True
        if allowed_hosts is not None:
            cons["allowed_hosts"] = allowed_hosts
        if c.min_gbps is not None:
            cons["min_gbps"] = c.min_gbps
        try:
            return self.dispatcher.select(req.k, view, algorithm=self.algorithm, constraints=cons)
        except self.PlacementError as exc:
            reason = getattr(exc, "reason", None) or "invalid_request"
            status = "rejected" if reason == "invalid_request" else "deferred"
            raise _Deferred(status, reason, str(exc)) from None
        except ModelError:
            raise
        except BandPilotError as exc:
            raise _Deferred("deferred", "dispatcher_error", f"{type(exc).__name__}: {exc}") from None

    def _never_satisfiable(self, req: Request) -> str | None:
        """A min_gbps that even an idle cluster cannot meet will never be met: reject, don't starve."""
        key = (req.k, req.constraints.key)
        if key not in self._never:
            idle = State.idle(self.spec)
            elig = idle.free if self.allowed_mask(req.constraints) is None else idle.free & self.allowed_mask(req.constraints)
            per_dom = np.bincount(self.dom_ids, weights=popcount(elig), minlength=len(self.dom_names)).astype(np.int64)
            try:
                self._select(req, idle, elig, per_dom)
                self._never[key] = None
            except _Deferred as d:
                self._never[key] = (
                    f"min_gbps {req.constraints.min_gbps:g} is unreachable for k={req.k} even on an idle cluster ({d.detail})"
                    if d.reason == "constraint_unmet" else None
                )
        return self._never[key]

    def _check_selection(self, req: Request, sel: Any, elig: np.ndarray) -> None:
        gpus = list(getattr(sel, "gpus", []) or [])
        bad = None
        if len(gpus) != req.k or len(set(gpus)) != len(gpus):
            bad = f"returned {len(gpus)} GPUs ({len(set(gpus))} distinct) for k={req.k}"
        else:
            try:
                mask = self.spec.to_mask(gpus)
            except SpecError as exc:
                mask, bad = None, str(exc)
            if mask is not None:
                if np.any(mask & ~elig):
                    bad = f"returned GPUs that are not free or not allowed: {self.spec.from_mask(mask & ~elig)[:4]}"
                elif req.constraints.single_host and int((mask != 0).sum()) != 1:
                    bad = "returned GPUs on several hosts for a single_host request"
                elif req.constraints.single_domain and len(set(self.dom_ids[mask != 0].tolist())) != 1:
                    bad = "returned GPUs in several domains for a single_domain request"
        if bad:
            raise _Deferred("deferred", "dispatcher_error", f"dispatcher {bad}")

    def commit_to_state(self, req: Request, gpus: list[str], demand: float) -> None:
        assert self.state is not None
        self.state = self.state.with_job(req.id, gpus, demand)
        self._n_free = self.state.n_free


_ASSIGN_REQ = (
    sa.update(T_REQ)
    .where(T_REQ.c.id == sa.bindparam("b_id"), T_REQ.c.status == "pending")
    .values(status="assigned", reason=None, detail=None, attempts=T_REQ.c.attempts + 1,
            last_batch=sa.bindparam("b_batch"), updated_at=sa.bindparam("b_now"))
)
_TAKE_GPUS = (
    sa.update(T_GPUS)
    .where(T_GPUS.c.id.in_(sa.bindparam("b_gpus", expanding=True)), T_GPUS.c.state == "free")
    .values(state="busy", job_id=sa.bindparam("b_job"), updated_at=sa.bindparam("b_now"))
)
_INS_JOB = sa.insert(T_JOBS)
_INS_ASSIGN = sa.insert(T_ASSIGN)


def _write_assignment(
    conn: sa.Connection, req: Request, sel: Any, batch_id: int | None, now: float,
    model_uri: str | None, model_version: str | None, algorithm: str,
) -> str:
    """Assign inside a savepoint: 'assigned', 'skipped' (no longer pending) or raise _Conflict.
    Order matters: request CAS first (nothing touched if it lost), the job row before the GPUs
    that reference it, then the GPU CAS whose row count must equal k."""
    gpus = list(sel.gpus)
    with conn.begin_nested():
        if conn.execute(_ASSIGN_REQ, {"b_id": req.id, "b_batch": batch_id, "b_now": now}).rowcount != 1:
            return "skipped"
        standalone = float(getattr(sel, "standalone_gbps", None) or 0.0)
        conn.execute(_INS_JOB, {"id": req.id, "tenant": req.tenant, "k": req.k, "demand_gbps": standalone,
                                "status": "active", "started_at": now, "ended_at": None})
        n = conn.execute(_TAKE_GPUS, {"b_gpus": gpus, "b_job": req.id, "b_now": now}).rowcount
        if n != len(gpus):
            raise _Conflict(f"only {n} of {len(gpus)} GPUs were still free")
        conn.execute(_INS_ASSIGN, {
            "request_id": req.id, "batch_id": batch_id, "gpus": json.dumps(gpus),
            "predicted_gbps": _f(getattr(sel, "predicted_gbps", None)), "standalone_gbps": standalone,
            "algorithm": str(getattr(sel, "algorithm", None) or algorithm), "model_uri": model_uri,
            "model_version": model_version, "search_ms": _f(getattr(sel, "search_ms", None)),
            "evaluations": _i(getattr(sel, "evaluations", None)), "assigned_at": now,
        })
    return "assigned"


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _i(v: Any) -> int | None:
    return None if v is None else int(v)


_TOUCH_ALL = (
    sa.update(T_REQ)
    .where(T_REQ.c.status == "pending", T_REQ.c.seq <= sa.bindparam("b_max"))
    .values(attempts=T_REQ.c.attempts + 1, last_batch=sa.bindparam("b_batch"), updated_at=sa.bindparam("b_now"))
)
_TOUCH_IDS = (
    sa.update(T_REQ)
    .where(T_REQ.c.id.in_(sa.bindparam("b_ids", expanding=True)), T_REQ.c.status == "pending")
    .values(attempts=T_REQ.c.attempts + 1, last_batch=sa.bindparam("b_batch"), updated_at=sa.bindparam("b_now"))
)
_NOTE = (
    sa.update(T_REQ)
    .where(T_REQ.c.id == sa.bindparam("b_id"), T_REQ.c.status == "pending")
    .values(status=sa.bindparam("b_status"), reason=sa.bindparam("b_reason"), detail=sa.bindparam("b_detail"))
)


def _chunks(seq: list[str], n: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


@dataclass
class _Plan:
    queue: list["_Pending"]
    quotas: dict[str, int] | None
    notes: dict[str, tuple[str | None, str | None]]  # stored (reason, detail) per pending id
    max_seq: int
    whole: bool  # every pending request (as of the snapshot) is in the queue


def _flush_outcomes(conn: sa.Connection, outs: list[Outcome], batch_id: int | None, plan: _Plan) -> None:
    """Record deferrals and rejections on the request rows, set-based so a long queue costs a few
    statements per batch: one ``attempts + 1`` over every request tried and left pending, then a
    note (reason, detail) only where it changed. Every statement is guarded by ``status = 'pending'``
    so a concurrent assignment is never undone."""
    outs = [o for o in outs if o.status in ("deferred", "rejected")]
    if not outs:
        return
    now = _now()
    if plan.whole:
        conn.execute(_TOUCH_ALL, {"b_max": plan.max_seq, "b_batch": batch_id, "b_now": now})
    else:
        for ids in _chunks([o.request_id for o in outs]):
            conn.execute(_TOUCH_IDS, {"b_ids": ids, "b_batch": batch_id, "b_now": now})
    rows = [
        {"b_id": o.request_id, "b_status": "rejected" if o.status == "rejected" else "pending",
         "b_reason": o.reason, "b_detail": o.detail}
        for o in outs
        if o.status == "rejected" or plan.notes.get(o.request_id) != (o.reason, o.detail)
    ]
    if rows:
        conn.execute(_NOTE, rows)


def _load_pending(conn: sa.Connection) -> tuple[list[_Pending], dict[str, tuple[str | None, str | None]]]:
    """Pending requests (parsed once per process and row version) and their stored notes."""
    out, notes = [], {}
    for r in conn.execute(_PENDING_STMT):
        t = tuple(r)
        out.append(_row_to_pending(t[:8]))
        notes[t[1]] = (t[8], t[9])
    return out, notes


def run_batch(
    store: Store,
    dispatcher: Any,
    policy: str = "fifo",
    limit: int | None = None,
    *,
    commit: str = "batch",
    algorithm: str = "bandpilot",
    model_uri: str | None = None,
) -> BatchReport:
    """Assign pending requests with ``dispatcher``, in ``policy`` order.

    Each request is tried once (twice for a utility request held back by its tenant's quota): an
    assigned one becomes an active job whose demand is its predicted standalone bandwidth, so later
    requests see its contention; one that cannot be placed now is deferred with the reason and
    retried next batch; an invalid one is rejected. ``limit`` caps the requests considered.
    ``commit="batch"`` is one transaction; ``"request"`` one per request (state re-read each time).
    """
    if policy not in POLICIES:
        raise RequestError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    if commit not in COMMIT_MODES:
        raise RequestError(f"unknown commit mode {commit!r}: use one of {', '.join(COMMIT_MODES)}")
    if limit is not None and limit < 1:
        raise RequestError(f"limit must be >= 1, got {limit}")
    store.refresh()
    check_model(store, dispatcher)
    version = model_version_of(dispatcher)
    uri = model_uri or getattr(dispatcher, "model_uri", None) or getattr(getattr(dispatcher, "model", None), "uri", None)
    mspec = dispatcher.model.spec  # same fingerprint as the store's; states built on it skip re-hashing
    sleep = float(os.environ.get(SLEEP_ENV, "0") or 0)
    placer = _Placer(mspec, dispatcher, algorithm)
    report = BatchReport(None, policy, commit, uri, version, _now())

    def new_batch(conn: sa.Connection) -> int:
        return int(
            conn.execute(
                sa.insert(T_BATCH)
                .values(policy=policy, commit_mode=commit, model_uri=uri, model_version=version, pid=os.getpid(), started_at=report.started_at)
                .returning(T_BATCH.c.id)
            ).scalar_one()
        )

    def plan(loaded: tuple[list[_Pending], dict], state: State) -> _Plan:
        pending, notes = loaded
        report.pending_before = len(pending)
        queue = order_pending(pending, policy)
        whole = limit is None or limit >= len(queue)
        if not whole:
            queue = queue[:limit]
        quotas = utility_quotas(queue, state.n_free) if policy == "utility" else None
        report.quotas = quotas
        return _Plan(queue, quotas, notes, max((p.seq for p in pending), default=0), whole)

    def attempt(conn: sa.Connection, p: _Pending, batch_id: int) -> Outcome:
        req = p.req
        now = _now()
        out = Outcome(req.id, req.tenant, req.k, "deferred", model_version=version, at=now)
        try:
            sel = placer.place(req)
        except _Deferred as d:
            out.status, out.reason, out.detail = d.status, d.reason, d.detail
            return out
        try:
            res = _write_assignment(conn, req, sel, batch_id, now, uri, version, algorithm)
        except _Conflict as exc:
            out.reason, out.detail = "conflict", f"GPUs changed under the batch: {exc}"
            placer.set_state(store.load_state(conn, mspec))
            return out
        if res == "skipped":
            out.status, out.detail = "skipped", "no longer pending (taken or cancelled by another process)"
            return out
        gpus = list(sel.gpus)
        placer.commit_to_state(req, gpus, float(getattr(sel, "standalone_gbps", None) or 0.0))
        out.status = "assigned"
        out.gpus = gpus
        out.predicted_gbps = _f(sel.predicted_gbps)
        out.standalone_gbps = _f(getattr(sel, "standalone_gbps", None))
        out.algorithm = str(getattr(sel, "algorithm", None) or algorithm)
        out.search_ms = _f(getattr(sel, "search_ms", None))
        return out

    def run(conn_for: Callable[[], Any], pl: _Plan, batch_id: int) -> list[Outcome]:
        queue, quotas = pl.queue, pl.quotas
        used: dict[str, int] = {}
        held: list[_Pending] = []
        to_flush: list[Outcome] = []

        def one(p: _Pending, second_pass: bool) -> None:
            o = placer.quick_deferral(p.req, version)
            if o is None:
                with conn_for() as conn:
                    o = attempt(conn, p, batch_id)
            if o.status in ("deferred", "rejected"):
                if second_pass and o.status == "deferred":
                    o.detail = f"{o.detail}; held back by its tenant's utility quota"
                to_flush.append(o)
            elif o.status == "assigned":
                used[p.req.tenant] = used.get(p.req.tenant, 0) + p.req.k
            report.outcomes.append(o)
            if sleep:
                time.sleep(sleep)

        for p in queue:
            if quotas is not None and used.get(p.req.tenant, 0) + p.req.k > quotas.get(p.req.tenant, 0):
                held.append(p)  # over its tenant's quota: only gets GPUs nobody within quota took
                continue
            one(p, False)
        for p in held:
            one(p, True)
        return to_flush

    if commit == "batch":
        with store.write() as conn:
            store.lock_gpus(conn)
            state = store.load_state(conn, mspec)
            placer.set_state(state)
            pl = plan(_load_pending(conn), state)
            batch_id = new_batch(conn)
            report.batch_id = batch_id

            @contextmanager
            def same_conn() -> Iterator[sa.Connection]:
                yield conn

            to_flush = run(same_conn, pl, batch_id)
            _flush_outcomes(conn, to_flush, batch_id, pl)
            report.finished_at = _now()
            _finish_batch(conn, batch_id, report)
    else:
        with store.write() as conn:
            batch_id = new_batch(conn)
        report.batch_id = batch_id
        with store.read() as conn:
            state = store.load_state(conn, mspec)
            pl = plan(_load_pending(conn), state)

        @contextmanager
        def fresh_conn() -> Iterator[sa.Connection]:
            with store.write() as conn:
                store.lock_gpus(conn)
                placer.set_state(store.load_state(conn, mspec))
                yield conn

        placer.set_state(state)
        to_flush = run(fresh_conn, pl, batch_id)
        report.finished_at = _now()
        with store.write() as conn:  # deferral notes are informational: one write at the end
            _flush_outcomes(conn, to_flush, batch_id, pl)
            _finish_batch(conn, batch_id, report)
    return report


def _finish_batch(conn: sa.Connection, batch_id: int, report: BatchReport) -> None:
    c = report.counts()
    conn.execute(
        sa.update(T_BATCH)
        .where(T_BATCH.c.id == batch_id)
        .values(
            finished_at=report.finished_at, n_considered=len(report.outcomes), n_assigned=c["assigned"],
            n_deferred=c["deferred"], n_rejected=c["rejected"],
        )
    )


# ------------------------------------------------------------------------------------------
# Lifecycle: release, drain, undrain
# ------------------------------------------------------------------------------------------
_REL_JOB = (
    sa.update(T_JOBS)
    .where(T_JOBS.c.id == sa.bindparam("b_id"), T_JOBS.c.status == "active")
    .values(status="released", ended_at=sa.bindparam("b_now"))
)
_REL_GPUS_SEL = (
    sa.select(T_GPUS.c.id, T_GPUS.c.drain_pending)
    .where(T_GPUS.c.job_id == sa.bindparam("b_id"))
    .order_by(T_GPUS.c.id)
    .with_for_update()
)
_REL_GPUS = (
    sa.update(T_GPUS)
    .where(T_GPUS.c.job_id == sa.bindparam("b_id"))
    .values(
        state=sa.case((T_GPUS.c.drain_pending, "unavailable"), else_="free"),
        job_id=None, drain_pending=False, updated_at=sa.bindparam("b_now"),
    )
)
_REL_REQ = (
    sa.update(T_REQ)
    .where(T_REQ.c.id == sa.bindparam("b_id"), T_REQ.c.status == "assigned")
    .values(status="released", updated_at=sa.bindparam("b_now"))
)


def release(store: Store, job_id: str) -> dict[str, Any]:
    """End a job: its GPUs return to the free pool (or become unavailable if drained meanwhile)."""
    return release_many(store, [job_id])[0]


def release_many(store: Store, job_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Release several jobs in one transaction (all or none: an unknown or finished job aborts)."""
    now = _now()
    out = []
    with store.write() as conn:
        for job_id in job_ids:
            p = {"b_id": job_id, "b_now": now}
            if conn.execute(_REL_JOB, p).rowcount != 1:
                st = conn.execute(sa.select(T_JOBS.c.status).where(T_JOBS.c.id == job_id)).scalar()
                if st is None:
                    req = conn.execute(sa.select(T_REQ.c.status).where(T_REQ.c.id == job_id)).scalar()
                    hint = f" (request {job_id!r} is {req})" if req else ""
                    raise StateError(f"no active job {job_id!r}{hint}")
                raise StateError(f"job {job_id!r} was already released")
            rows = conn.execute(_REL_GPUS_SEL, p).all()  # row locks on PostgreSQL
            conn.execute(_REL_GPUS, p)
            conn.execute(_REL_REQ, p)
            out.append({"job": job_id, "freed": [g for g, d in rows if not d], "unavailable": [g for g, d in rows if d]})
    return out


def resolve_targets(spec: ClusterSpec, target: str) -> list[str]:
    """A GPU id, a host name or a domain name -> GPU ids."""
    if ":" in target:
        try:
            spec.parse_gpu(target)
        except SpecError as exc:
            raise StateError(str(exc)) from None
        return [target]
    if target in spec.host_index:
        h = spec.hosts[spec.host_index[target]]
        return [f"{h.name}:{i}" for i in range(h.n_gpus)]
    dom = [h for h in spec.hosts if h.domain == target]
    if dom:
        return [f"{h.name}:{i}" for h in dom for i in range(h.n_gpus)]
    raise StateError(f"unknown GPU, host or domain {target!r} in cluster {spec.name!r}")


def drain(store: Store, target: str, reason: str | None = None) -> dict[str, list[str]]:
    """Take a GPU, host or domain out of the free pool. Free GPUs become unavailable now; busy ones
    stay with their job and become unavailable when it is released."""
    ids = resolve_targets(store.spec, target)
    now = _now()
    with store.write() as conn:
        store.lock_gpus(conn, ids)
        rows = conn.execute(sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.drain_pending).where(T_GPUS.c.id.in_(ids))).all()
        now_off = [g for g, s, _ in rows if s == "free"]
        later = [g for g, s, d in rows if s == "busy" and not d]
        already = [g for g, s, d in rows if s == "unavailable" or (s == "busy" and d)]
        if now_off:
            conn.execute(
                sa.update(T_GPUS).where(T_GPUS.c.id.in_(now_off), T_GPUS.c.state == "free")
                .values(state="unavailable", note=reason, updated_at=now)
            )
        if later:
            conn.execute(
                sa.update(T_GPUS).where(T_GPUS.c.id.in_(later), T_GPUS.c.state == "busy")
                .values(drain_pending=True, note=reason, updated_at=now)
            )
    order = {g: i for i, g in enumerate(ids)}
    key = order.__getitem__
    return {"drained": sorted(now_off, key=key), "pending": sorted(later, key=key), "already": sorted(already, key=key)}


def undrain(store: Store, target: str) -> dict[str, list[str]]:
    """Return drained hardware to the free pool (and cancel pending drains of busy GPUs)."""
    ids = resolve_targets(store.spec, target)
    now = _now()
    with store.write() as conn:
        store.lock_gpus(conn, ids)
        rows = conn.execute(sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.drain_pending).where(T_GPUS.c.id.in_(ids))).all()
        back = [g for g, s, _ in rows if s == "unavailable"]
        kept = [g for g, s, d in rows if s == "busy" and d]
        if back:
            conn.execute(
                sa.update(T_GPUS).where(T_GPUS.c.id.in_(back), T_GPUS.c.state == "unavailable")
                .values(state="free", note=None, updated_at=now)
            )
        if kept:
            conn.execute(sa.update(T_GPUS).where(T_GPUS.c.id.in_(kept)).values(drain_pending=False, note=None, updated_at=now))
    order = {g: i for i, g in enumerate(ids)}
    return {"undrained": sorted(back, key=order.__getitem__), "cancelled": sorted(kept, key=order.__getitem__)}


# ------------------------------------------------------------------------------------------
# Views: state export, status, listing, fragmentation, invariants
# ------------------------------------------------------------------------------------------
def current_state(store: Store) -> State:
    with store.read() as conn:
        return store.load_state(conn)


def export_state(store: Store) -> dict[str, Any]:
    """The cluster state in the dispatcher's JSON format (``{"free": [...], "jobs": [...]}``)."""
    return current_state(store).to_dict()


def status(store: Store) -> dict[str, Any]:
    spec = store.spec
    with store.read() as conn:
        req_counts = dict(conn.execute(sa.select(T_REQ.c.status, sa.func.count()).group_by(T_REQ.c.status)).all())
        gpu_counts = dict(conn.execute(sa.select(T_GPUS.c.state, sa.func.count()).group_by(T_GPUS.c.state)).all())
        pending_drain = conn.execute(
            sa.select(sa.func.count()).select_from(T_GPUS).where(T_GPUS.c.drain_pending.is_(True))
        ).scalar()
        reasons = dict(
            conn.execute(
                sa.select(T_REQ.c.reason, sa.func.count()).where(T_REQ.c.status == "pending", T_REQ.c.reason.is_not(None)).group_by(T_REQ.c.reason)
            ).all()
        )
        last = conn.execute(sa.select(T_BATCH).order_by(T_BATCH.c.id.desc()).limit(1)).first()
        tenants = conn.execute(
            sa.select(T_JOBS.c.tenant, sa.func.count(), sa.func.sum(T_JOBS.c.k)).where(T_JOBS.c.status == "active").group_by(T_JOBS.c.tenant)
        ).all()
    return {
        "cluster": spec.name,
        "store": store.safe_url,
        "requests": {s: int(req_counts.get(s, 0)) for s in REQUEST_STATUSES},
        "deferral_reasons": {str(k): int(v) for k, v in reasons.items()},
        "gpus": {"total": spec.n_gpus, **{s: int(gpu_counts.get(s, 0)) for s in GPU_STATES}, "drain_pending": int(pending_drain or 0)},
        "tenants": {t: {"jobs": int(n), "gpus": int(g or 0)} for t, n, g in tenants},
        "last_batch": None
        if last is None
        else {
            "id": last.id, "policy": last.policy, "model_version": last.model_version, "started": iso(last.started_at),
            "finished": iso(last.finished_at), "interrupted": last.finished_at is None,
            "assigned": last.n_assigned, "deferred": last.n_deferred, "rejected": last.n_rejected,
        },
    }


def list_requests(
    store: Store, status: str | None = None, tenant: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    if status is not None and status not in REQUEST_STATUSES:
        raise RequestError(f"unknown status {status!r}: use one of {', '.join(REQUEST_STATUSES)}")
    q = sa.select(T_REQ, T_ASSIGN).join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id, isouter=True).order_by(T_REQ.c.seq)
    if status:
        q = q.where(T_REQ.c.status == status)
    if tenant:
        q = q.where(T_REQ.c.tenant == tenant)
    if limit:
        q = q.limit(limit)
    out = []
    with store.read() as conn:
        for r in conn.execute(q).mappings():
            out.append(
                {
                    "id": r["id"], "tenant": r["tenant"], "k": r["k"], "priority": r["priority"], "utility": r["utility"],
                    "constraints": json.loads(r["constraints"]) if r["constraints"] else {},
                    "submitted": iso(r["submitted_at"]), "status": r["status"], "reason": r["reason"],
                    "detail": r["detail"], "attempts": r["attempts"],
                    "gpus": json.loads(r["gpus"]) if r["gpus"] else [],
                    "predicted_gbps": r["predicted_gbps"], "standalone_gbps": r["standalone_gbps"],
                    "algorithm": r["algorithm"], "model_version": r["model_version"], "assigned": iso(r["assigned_at"]),
                }
            )
    return out


def fragmentation(store: Store) -> dict[str, Any]:
    """Where the free GPUs are and what they can still serve.

    A host's free GPUs are *stranded* when the host is partly busy or unavailable (they cannot serve
    a whole-host request); likewise per domain. ``largest_placeable`` is the biggest gang request
    that fits now: anywhere, on one host, in one domain.
    """
    spec = store.spec
    with store.read() as conn:
        rows = conn.execute(sa.select(T_GPUS.c.host, T_GPUS.c.state, T_GPUS.c.drain_pending)).all()
    per: dict[str, dict[str, int]] = {h.name: {"free": 0, "busy": 0, "unavailable": 0, "drain_pending": 0} for h in spec.hosts}
    for host, st, dp in rows:
        per[host][st] += 1
        per[host]["drain_pending"] += int(bool(dp))
    hosts = []
    for h in spec.hosts:
        c = per[h.name]
        stranded = c["free"] if c["free"] < h.n_gpus else 0
        hosts.append({"host": h.name, "domain": h.domain, "gpus": h.n_gpus, **c, "stranded": stranded})
    free = sum(x["free"] for x in hosts)
    largest_host = max((x["free"] for x in hosts), default=0)
    out: dict[str, Any] = {
        "cluster": spec.name,
        "gpus": spec.n_gpus,
        "free": free,
        "busy": sum(x["busy"] for x in hosts),
        "unavailable": sum(x["unavailable"] for x in hosts),
        "stranded": sum(x["stranded"] for x in hosts),
        "whole_free_hosts": sum(1 for x in hosts if x["free"] == x["gpus"]),
        "largest_placeable": {"any": free, "single_host": largest_host},
        # Share of free GPUs stranded on partly used hosts: 0 = every free GPU is on a wholly free host.
        "fragmentation": round(sum(x["stranded"] for x in hosts) / free, 4) if free else 0.0,
        "hosts": hosts,
    }
    if any(h.domain for h in spec.hosts):
        doms: dict[str, dict[str, Any]] = {}
        for x in hosts:
            name = x["domain"] or "(none)"
            d = doms.setdefault(name, {"domain": name, "hosts": 0, "gpus": 0, "free": 0, "busy": 0, "unavailable": 0, "largest_single_host": 0})
            d["hosts"] += 1
            for key in ("gpus", "free", "busy", "unavailable"):
                d[key] += x[key]
            d["largest_single_host"] = max(d["largest_single_host"], x["free"])
        for d in doms.values():
            d["stranded"] = d["free"] if d["free"] < d["gpus"] else 0
        out["domains"] = list(doms.values())
        out["largest_placeable"]["single_domain"] = max((d["free"] for d in doms.values()), default=0)
        out["whole_free_domains"] = sum(1 for d in doms.values() if d["free"] == d["gpus"])
    return out


def check_invariants(store: Store) -> list[str]:
    """Every cross-table invariant the queue promises; returns the violations (empty = consistent)."""
    spec = store.spec
    bad: list[str] = []
    with store.read() as conn:
        gpus = conn.execute(sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.job_id, T_GPUS.c.drain_pending)).all()
        jobs = {r.id: r for r in conn.execute(sa.select(T_JOBS)).all()}
        reqs = {r.id: r for r in conn.execute(sa.select(T_REQ)).all()}
        assigns = {r.request_id: r for r in conn.execute(sa.select(T_ASSIGN)).all()}
        state = store.load_state(conn)
    if sorted(g.id for g in gpus) != sorted(spec.gpu_ids):
        bad.append("GPU rows do not match the cluster spec")
    held: dict[str, set[str]] = {}
    for g in gpus:
        if (g.state == "busy") != (g.job_id is not None):
            bad.append(f"GPU {g.id} is {g.state} with job {g.job_id!r}")
        if g.job_id is not None:
            held.setdefault(g.job_id, set()).add(g.id)
            j = jobs.get(g.job_id)
            if j is None or j.status != "active":
                bad.append(f"GPU {g.id} is held by job {g.job_id!r} which is not active")
        if g.drain_pending and g.state != "busy":
            bad.append(f"GPU {g.id} has a pending drain but is {g.state}")
    owner: dict[str, str] = {}
    for rid, a in assigns.items():
        r = reqs.get(rid)
        if r is None or r.status not in ("assigned", "released"):
            bad.append(f"assignment for request {rid!r} whose status is {getattr(r, 'status', None)!r}")
        j = jobs.get(rid)
        if j is None:
            bad.append(f"assigned request {rid!r} has no job")
            continue
        ag = json.loads(a.gpus)
        if len(ag) != j.k or len(set(ag)) != j.k:
            bad.append(f"job {rid!r} was assigned {len(ag)} GPUs for k={j.k}")
        if j.status == "active":
            if set(ag) != held.get(rid, set()):
                bad.append(f"active job {rid!r} holds {sorted(held.get(rid, set()))} but was assigned {ag}")
            for gid in ag:
                if gid in owner:
                    bad.append(f"GPU {gid} is assigned to active jobs {owner[gid]!r} and {rid!r}")
                owner[gid] = rid
    for rid, r in reqs.items():
        if r.status in ("assigned", "released") and rid not in assigns:
            bad.append(f"request {rid!r} is {r.status} without an assignment")
        if r.status in ("pending", "rejected", "cancelled") and (rid in assigns or rid in jobs):
            bad.append(f"request {rid!r} is {r.status} but has an assignment/job")
        if r.status == "assigned" and getattr(jobs.get(rid), "status", None) != "active":
            bad.append(f"request {rid!r} is assigned but its job is not active")
        if r.status == "released" and getattr(jobs.get(rid), "status", None) != "released":
            bad.append(f"request {rid!r} is released but its job is still active")
    try:
        State.from_dict(spec, state.to_dict(), "exported state")
    except StateError as exc:
        bad.append(f"exported state is invalid: {exc}")
    return bad
