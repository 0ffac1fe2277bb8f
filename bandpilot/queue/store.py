"""Where does the queue live? :class:`Store` opens a SQLite or PostgreSQL database, migrates it,
runs its transactions and row locks, records the cluster and loads the state the dispatcher sees."""

from __future__ import annotations

import hashlib
import json
import re
import time
import zlib
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import sqlalchemy as sa
import yaml
from sqlalchemy import event

from bandpilot.config import ENV_NAMES, project_root, settings
from bandpilot.dispatch.state import Job, State
from bandpilot.errors import BandPilotError
from bandpilot.queue import schema as _schema  # MIGRATIONS read via the module: tests append a step
from bandpilot.queue.clock import now
from bandpilot.queue.rows import plain_rows
from bandpilot.queue.schema import T_AUDIT, T_CLUSTER, T_GPUS, T_JOBS, T_SCHEMA, schema_version
from bandpilot.topology.cluster import ClusterSpec, spec_from_dict

STORE_ENV = ENV_NAMES["store"]

#: The change being audited in this thread/task (set by :func:`bandpilot.queue.audit.audited`): the
#: first write transaction inserts its audit row before it commits, so a change and its audit
#: record land together or not at all.
AUDIT_CONTEXT: ContextVar[dict[str, Any] | None] = ContextVar("bandpilot_audit", default=None)

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

#: Parsed cluster specs by the SHA-256 of their stored text (a few entries: the stores of one
#: process hold one or two clusters). A 25,002-tray spec takes ~1 s to rebuild; every Store the
#: simulator, the API or a benchmark opens on it reuses the first.
_SPEC_CACHE: dict[str, tuple[ClusterSpec, dict[str, tuple[int, int]]]] = {}
_SPEC_CACHE_MAX = 4


def _spec_text(doc: dict[str, Any]) -> str:
    """The stored form of a spec: JSON (a YAML subset; parsed ~50x faster than YAML in pure
    Python, which took minutes at 100,008 GPUs)."""
    return json.dumps(doc, separators=(",", ":"))


def _parse_spec_text(text: str, source: str) -> ClusterSpec:
    """Stored spec text -> spec. Stores written before specs were stored as JSON hold YAML."""
    try:
        doc = json.loads(text)
    except ValueError:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        doc = yaml.load(text, Loader=loader)  # a safe loader
    return spec_from_dict(doc, source=source)


def _cached_spec(text: str, source: str) -> tuple[ClusterSpec, dict[str, tuple[int, int]]]:
    key = hashlib.sha256(text.encode()).hexdigest()
    hit = _SPEC_CACHE.get(key)
    if hit is None:
        spec = _parse_spec_text(text, source)
        hit = (spec, {g: spec.parse_gpu(g) for g in spec.gpu_ids})
        while len(_SPEC_CACHE) >= _SPEC_CACHE_MAX:
            _SPEC_CACHE.pop(next(iter(_SPEC_CACHE)))
        _SPEC_CACHE[key] = hit
    return hit


class StoreError(BandPilotError):
    """The queue database cannot be opened, is not initialised, is busy (``store_busy``) or is from
    a newer version."""

    code = "store_error"


def default_store_url(root: Path | None = None) -> str:
    """``$BANDPILOT_STORE`` or ``sqlite:///<project>/.bandpilot/queue.db``."""
    env = settings().store
    if env:
        return env
    root = root or project_root()
    return f"sqlite:///{root / '.bandpilot' / 'queue.db'}"


class Store:
    """The queue database. ``Store(url)`` opens (and migrates) it; ``url`` defaults to
    :func:`default_store_url`. On PostgreSQL, ``schema`` puts every table in that schema
    (created if missing) - tests use one per run. ``create=False`` opens only an existing queue
    store (read-only tools must not leave empty databases wherever they are pointed)."""

    def __init__(self, url: str | None = None, *, schema: str | None = None, timeout: float = 120.0,
                 pool_size: int | None = None, create: bool = True) -> None:
        self.url = url or default_store_url()
        try:
            u = sa.engine.make_url(self.url)
        except sa.exc.ArgumentError:
            raise StoreError(f"invalid store URL {self.url!r}: use sqlite:///FILE or postgresql://...") from None
        self.create = create
        self.backend = u.get_backend_name()
        self.schema = schema
        self.timeout = float(timeout)
        self.pool_size = pool_size  # PostgreSQL connections kept open (SQLAlchemy's default 5 + 10 overflow)
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
        #: the active jobs of the last load_state, reused while unchanged (see load_state)
        self._jobs: dict[str, Job] = {}
        #: the open connection of a writes_together block (per thread / task)
        self._together: ContextVar[sa.Connection | None] = ContextVar(f"bp_together_{id(self)}", default=None)
        self.migrate()

    # -- engines --------------------------------------------------------------------------
    def _sqlite_engine(self, u: sa.URL) -> sa.Engine:
        if self.schema:
            raise StoreError("schema= is for PostgreSQL stores only")
        db = u.database
        kwargs: dict[str, Any] = {"connect_args": {"timeout": self.timeout}}
        if db and db != ":memory:" and not self.create and not Path(db).expanduser().is_file():
            raise StoreError(self._missing(f"no queue store at {Path(db).expanduser().resolve()}"))
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
        pool = {} if not self.pool_size else {"pool_size": int(self.pool_size), "max_overflow": int(self.pool_size)}
        engine = sa.create_engine(u, connect_args=connect_args, **pool)
        _ping_when_idle(engine, IDLE_PING_S)
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
        """A write transaction (BEGIN IMMEDIATE on SQLite); commits on success, rolls back on error.
        Inside :meth:`writes_together` it is a savepoint of that block's transaction instead."""
        outer = self._together.get()
        try:
            if outer is not None:
                with outer.begin_nested():  # all or nothing, as on its own; committed with the block
                    yield outer
                    _audit(outer)
            else:
                with self.engine.connect() as conn:
                    with conn.begin():
                        yield conn
                        _audit(conn)
        except sa.exc.OperationalError as exc:
            msg = _dberr(exc)
            if "locked" in msg or "busy" in msg:
                raise StoreError(f"store {self.safe_url} is busy: another writer held it for over {self.timeout:g}s",
                                 code="store_busy") from None
            raise StoreError(f"store {self.safe_url}: {msg}") from None

    @contextmanager
    def writes_together(self) -> Iterator[None]:
        """Every :meth:`write` in the block (this thread / task) runs in ONE transaction, each as a
        savepoint: one commit instead of one per write (a simulation writes arrivals, estimates,
        entropy reports and releases before every batch). An error inside a write undoes that write
        as before and leaves the block's transaction to the caller's handling; :meth:`read` in the
        block does not see the block's writes before it ends."""
        if self._together.get() is not None:
            yield
            return
        with self.write() as conn:
            token = self._together.set(conn)
            try:
                yield
            finally:
                self._together.reset(token)

    @contextmanager
    def read(self, *, snapshot: bool = True) -> Iterator[sa.Connection]:
        """A read-only snapshot (deferred on SQLite, REPEATABLE READ on PostgreSQL). ``snapshot=False``
        is for a single statement, which is consistent on its own: on PostgreSQL it runs in autocommit,
        saving the BEGIN and COMMIT round trips (a third of a one-query API call's database time)."""
        try:
            with self.engine.connect() as conn:
                opts: dict[str, Any] = {"bp_readonly": True}
                if self.backend == "postgresql":
                    opts["isolation_level"] = "REPEATABLE READ" if snapshot else "AUTOCOMMIT"
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
        done = self._applied()
        cur = max(done, default=0)
        if cur == 0 and not self.create:
            raise StoreError(self._missing(f"{self.safe_url} is not a BandPilot queue store"))
        if cur > target:
            raise StoreError(f"store {self.safe_url} has schema v{cur}, newer than this BandPilot (v{target}); upgrade BandPilot")
        if cur == target and all(v in done for v, _, _ in _schema.MIGRATIONS):
            return cur
        with self.write() as conn:
            if self.backend == "postgresql":
                key = zlib.crc32(f"bandpilot-queue:{self.schema or 'public'}".encode()) & 0x7FFFFFFF
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            if not sa.inspect(conn).has_table("bp_schema"):
                T_SCHEMA.create(conn, checkfirst=True)
            # re-read under the lock (another process may have won); apply every migration not
            # recorded yet, in order - version numbers may have gaps filled by later merges
            done = set(conn.execute(sa.select(T_SCHEMA.c.version)).scalars())
            for version, name, fn in _schema.MIGRATIONS:
                if version not in done:
                    fn(conn)
                    conn.execute(sa.insert(T_SCHEMA).values(version=version, name=name, applied_at=now()))
            cur = self.current_version(conn)
        return cur

    def _missing(self, what: str) -> str:
        return f"{what}: create it with `bandpilot cluster init --cluster SPEC --store {self.safe_url}`"

    def _applied(self) -> set[int]:
        """The migrations recorded, in one query (every process start opens a store: the API's
        start-up is a target); empty for a database without ``bp_schema``."""
        try:
            with self.read(snapshot=False) as conn:
                return set(conn.execute(_VERSIONS).scalars())
        except sa.exc.ProgrammingError as exc:  # PostgreSQL: undefined table
            if getattr(exc.orig, "pgcode", None) == "42P01":
                return set()
            raise StoreError(f"cannot open store {self.safe_url}: {_dberr(exc)}") from None
        except StoreError as exc:  # SQLite's missing table arrives as an OperationalError -> StoreError
            if "no such table: bp_schema" in str(exc):
                return set()
            raise
        except sa.exc.DBAPIError as exc:
            raise StoreError(f"cannot open store {self.safe_url}: {_dberr(exc)}") from None

    # -- cluster --------------------------------------------------------------------------
    def init_cluster(self, spec: ClusterSpec, *, force: bool = False) -> bool:
        """Record ``spec`` and create one free row per GPU. Idempotent for the same cluster; a
        different cluster needs ``force`` and no active jobs. Returns True when something changed."""
        spec_yaml = _spec_text(spec.to_dict())  # the column keeps its name: old stores hold YAML
        # What later commands rebuild must be the same cluster (parsed once, then cached).
        rebuilt, _ = _cached_spec(spec_yaml, "<store spec>")
        fp = rebuilt.fingerprint()
        ts = now()
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
                        name=spec.name, fingerprint=fp, n_gpus=spec.n_gpus, spec_yaml=spec_yaml, updated_at=ts
                    )
                )
            else:
                conn.execute(
                    sa.insert(T_CLUSTER).values(
                        id=1, name=spec.name, fingerprint=fp, n_gpus=spec.n_gpus, spec_yaml=spec_yaml,
                        created_at=ts, updated_at=ts,
                    )
                )
            rows = []
            for pos, gid in enumerate(rebuilt.gpu_ids):
                h, i = rebuilt.parse_gpu(gid)
                host = rebuilt.hosts[h]
                rows.append(
                    {"id": gid, "pos": pos, "host": host.name, "idx": i, "domain": host.domain,
                     "state": "free", "job_id": None, "drain_pending": False, "note": None, "updated_at": ts}
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
            spec, loc = _cached_spec(row.spec_yaml, f"{self.safe_url} cluster")
            self._spec = spec
            self._fingerprint = row.fingerprint
            self._gpu_loc = loc
            self._jobs = {}  # masks of another spec's GPU locations
        return self._spec

    @property
    def loaded_spec(self) -> ClusterSpec | None:
        """The spec if already read (no query); None before the first use of :attr:`spec`."""
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
        # masks accumulate as Python ints (a numpy scalar op per GPU was most of this per batch)
        free_of: dict[int, int] = {}
        owned: dict[str, list[str]] = {}
        for gid, state, job in plain_rows(conn, _GPU_STATE_STMT):  # one fetchall of plain tuples
            if state == "free":
                h, i = loc[gid]
                free_of[h] = free_of.get(h, 0) | (1 << i)
            elif state == "busy":
                owned.setdefault(job, []).append(gid)
        free = np.zeros(spec.n_hosts, dtype=np.int64)
        if free_of:
            free[list(free_of)] = list(free_of.values())
        # An unchanged active job (same GPUs and demand) is the same Job object as last time: states
        # share job objects, so the dispatcher's per-job caches (hosts, contention) stay warm
        # across batches instead of being rebuilt for every running job each batch.
        jobs, kept = [], {}
        for jid, demand in plain_rows(conn, _ACTIVE_JOBS_STMT):
            gpus = tuple(owned.get(jid, ()))
            old = self._jobs.get(jid)
            if old is not None and old.gpus == gpus and old.demand_gbps == float(demand) and old.mask.shape[0] == spec.n_hosts:
                job = old
            else:
                per_host: dict[int, int] = {}
                for g in gpus:
                    h, i = loc[g]
                    per_host[h] = per_host.get(h, 0) | (1 << i)
                mask = np.zeros(spec.n_hosts, dtype=np.int64)
                if per_host:
                    mask[list(per_host)] = list(per_host.values())
                job = Job(jid, gpus, float(demand), mask)
            kept[jid] = job
            jobs.append(job)
        self._jobs = kept
        return State(spec, free, tuple(jobs))


_GPU_STATE_STMT = sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.job_id).order_by(T_GPUS.c.pos)
_ACTIVE_JOBS_STMT = (
    sa.select(T_JOBS.c.id, T_JOBS.c.demand_gbps).where(T_JOBS.c.status == "active").order_by(T_JOBS.c.started_at, T_JOBS.c.id)
)


IDLE_PING_S = 10.0
_VERSIONS = sa.select(T_SCHEMA.c.version)
_AUDIT_INSERT = sa.insert(T_AUDIT)  # built once; the values travel as parameters


def _audit(conn: sa.Connection) -> None:
    """The audit row of the request being served (:data:`AUDIT_CONTEXT`), once, in its write."""
    entry = AUDIT_CONTEXT.get()
    if entry is not None and not entry["written"]:
        key = conn.execute(_AUDIT_INSERT, {**entry["row"], "at": now(), "outcome": "ok"}).inserted_primary_key
        assert key is not None  # a single-row INSERT's own key
        entry["written"], entry["id"] = True, key[0]


def _ping_when_idle(engine: sa.Engine, idle_s: float) -> None:
    """Check a pooled connection before use only if it sat idle over ``idle_s`` (a restarted server or
    a dropped connection shows there); SQLAlchemy's ``pool_pre_ping`` pings on every checkout, one
    round trip per transaction. A connection that fails here is replaced (the pool retries)."""

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn, rec):
        rec.info["bp_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, rec, _proxy):
        since = rec.info.pop("bp_idle_since", None)
        if since is None or time.monotonic() - since < idle_s:
            return
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
            dbapi_conn.rollback()  # no transaction left open: the next one may set its isolation level
        except Exception:  # any failure means this connection is gone
            raise sa.exc.DisconnectionError() from None


def _dberr(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split())


def open_store(url: str | None = None, **kwargs: Any) -> Store:
    return Store(url, **kwargs)

