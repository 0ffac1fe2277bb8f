"""Which tables hold the queue, and how does a store reach the current schema?

Everything lives in one database through SQLAlchemy 2.0 Core - a SQLite file by default (WAL), any
PostgreSQL URL at scale:

========================  ==================================================================
``bp_schema``             applied migrations (ordered functions in :data:`MIGRATIONS`)
``bp_cluster``            the cluster spec (``spec.to_dict()`` as YAML) recorded by ``cluster init``
``bp_requests``           every request and its status: pending / assigned / rejected / released
                          / cancelled, with the last deferral reason
``bp_assignments``        what a batch decided for a request (GPUs, predictions, model version)
``bp_jobs``               active and finished jobs (one per assigned request, same id)
``bp_gpus``               one row per GPU: free / busy (``job_id``) / unavailable, drain flag
``bp_batches``            one row per batch run (an unfinished row marks an interrupted run)
``bp_health``             the last verify verdict per host (v2): status, suspects, measured/expected
``bp_observations``       measured bandwidth next to its prediction (v3): job telemetry, verify runs
``bp_tokens``             API bearer tokens (v4): tenant, admin flag, SHA-256 of the secret, revocation
``bp_audit``              who changed what, when (v4): one row per change through the API or CLI
``bp_fragmentation``      fragmentation samples over time (v4): after each batch and from the API
``bp_entropy``            normalized-entropy reports per job and epoch, with the utility derived (v5)
``bp_estimates``          expected run time per request (v5), the key of the ``sjf`` policy
``bp_reservations``       the current reservation of a blocked gang (v6): expected start, GPUs,
                          predicted bandwidth there; recomputed by every batch
``bp_generations``        resizes of elastic jobs (v9): generation n >= 1 of a job, its GPUs, k,
                          epoch and why; generation 0 is the batch's assignment
``bp_holds``              how long a pending request has been held by start-or-wait (v12), over
                          all batches: the bound on its total hold survives a restart
========================  ==================================================================

v8 adds the parallelism ``shape`` of a request and the ``ranks`` / ``placement`` (rank map, per-axis
figures) of its assignment, nullable like v6's fields.

v6 also adds the run-time and preemption fields of a request (``time_limit_s``,
``comm_fraction``, ``preemptible``, ``checkpoint_s``, ``checkpoint_every_s``), all nullable so a
store written before them still opens and its requests read as "not given".
v9 adds the elastic range of a request (``min_k``, ``max_k``, ``k_step``; NULL = the fixed ``k``);
v11 its declared compute ``scaling`` efficiency per doubling (NULL = not declared: priced as perfect).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import sqlalchemy as sa

REQUEST_STATUSES = ("pending", "assigned", "rejected", "released", "cancelled")
GPU_STATES = ("free", "busy", "unavailable")
#: Deferral / rejection reasons (the dispatcher's PlacementError reasons plus the queue's own).
REASONS = ("insufficient_gpus", "constraint_unmet", "invalid_request", "dispatcher_error", "conflict",
           "reserved", "protects_reservation", "preempted")


metadata = sa.MetaData()

#: Request columns added by v6 (name, type): nullable, "not given" when NULL.
V6_REQUEST_COLUMNS: tuple[tuple[str, Any], ...] = (("time_limit_s", sa.Double()), ("comm_fraction", sa.Double()), ("preemptible", sa.Boolean()),
                      ("checkpoint_s", sa.Double()), ("checkpoint_every_s", sa.Double()))
#: Request columns added by v9: the elastic range (NULL: a fixed gang of ``k``).
V9_REQUEST_COLUMNS = (("min_k", sa.Integer()), ("max_k", sa.Integer()), ("k_step", sa.Integer()))
#: Request columns added by v11: the declared compute scaling efficiency (NULL: not declared).
V11_REQUEST_COLUMNS: tuple[tuple[str, Any], ...] = (("scaling", sa.Double()),)


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
    # v6 (added by ALTER on older stores, see _m6_runtime_fields):
    *(sa.Column(name, type_, nullable=True) for name, type_ in V6_REQUEST_COLUMNS),
    # v8 (ALTER on older stores, _m8_shape): the parallelism shape as JSON, NULL = none given
    sa.Column("shape", sa.Text, nullable=True),
    # v9 (added by ALTER on older stores, see _m9_elastic):
    *(sa.Column(name, type_, nullable=True) for name, type_ in V9_REQUEST_COLUMNS),
    # v11 (ALTER on older stores, _m11_scaling)
    *(sa.Column(name, type_, nullable=True) for name, type_ in V11_REQUEST_COLUMNS),
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
    # v8: a shaped request's rank map (GPU ids in rank order) and per-axis figures, as JSON
    sa.Column("ranks", sa.Text, nullable=True),
    sa.Column("placement", sa.Text, nullable=True),
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

T_HEALTH = sa.Table(
    "bp_health",
    metadata,
    sa.Column("host", sa.String(200), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("gpus", sa.Text, nullable=False),  # JSON list of suspect GPU ids
    sa.Column("links", sa.Text, nullable=False),  # JSON list of suspect links
    sa.Column("ratio", sa.Double, nullable=False),
    sa.Column("source", sa.Text, nullable=True),
    sa.Column("verified_at", sa.Double, nullable=False),
    sa.CheckConstraint("status IN ('healthy','degraded','failed')", name="ck_bp_health_status"),
)

T_OBS = sa.Table(
    "bp_observations",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("source", sa.String(16), nullable=False),  # telemetry | verify
    sa.Column("job_id", sa.String(200), nullable=True),
    sa.Column("gpus", sa.Text, nullable=False),  # comma-joined GPU ids
    sa.Column("predicted_gbps", sa.Double, nullable=False),
    sa.Column("measured_gbps", sa.Double, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.CheckConstraint("measured_gbps >= 0 AND predicted_gbps > 0", name="ck_bp_observations_values"),
    sa.Index("ix_bp_observations_at", "at"),
)

T_TOKENS = sa.Table(
    "bp_tokens",
    metadata,
    sa.Column("id", sa.String(16), primary_key=True),  # public part of the token: shown, listed, revoked by
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("admin", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("name", sa.String(200), nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("revoked_at", sa.Double, nullable=True),
)

T_AUDIT = sa.Table(
    "bp_audit",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),  # tenant (token id) or cli:<user>
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("target", sa.Text, nullable=True),
    sa.Column("outcome", sa.String(16), nullable=False),  # ok | denied | error
    sa.Column("detail", sa.Text, nullable=True),
    sa.Index("ix_bp_audit_at", "at"),
)

T_FRAG = sa.Table(
    "bp_fragmentation",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("free", sa.Integer, nullable=False),
    sa.Column("busy", sa.Integer, nullable=False),
    sa.Column("unavailable", sa.Integer, nullable=False),
    sa.Column("stranded", sa.Integer, nullable=False),
    sa.Column("largest_single_host", sa.Integer, nullable=False),
    sa.Column("largest_single_domain", sa.Integer, nullable=True),
    sa.Column("fragmentation", sa.Double, nullable=False),
    sa.Index("ix_bp_fragmentation_at", "at"),
)

T_ENTROPY = sa.Table(
    "bp_entropy",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(200), sa.ForeignKey("bp_requests.id"), nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("entropy", sa.Double, nullable=False),
    sa.Column("utility", sa.Double, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.CheckConstraint("entropy >= 0 AND entropy <= 1", name="ck_bp_entropy_range"),
    sa.Index("ix_bp_entropy_request", "request_id", "epoch"),
)

T_ESTIMATES = sa.Table(
    "bp_estimates",
    metadata,
    sa.Column("request_id", sa.String(200), sa.ForeignKey("bp_requests.id"), primary_key=True),
    sa.Column("expected_s", sa.Double, nullable=False),
    sa.CheckConstraint("expected_s > 0", name="ck_bp_estimates_positive"),
)

T_RESERVE = sa.Table(
    "bp_reservations",
    metadata,
    sa.Column("request_id", sa.String(200), sa.ForeignKey("bp_requests.id"), primary_key=True),
    sa.Column("batch_id", sa.Integer, nullable=True),
    sa.Column("rank", sa.Integer, nullable=False),  # 0 = the first gang in policy order that was blocked
    sa.Column("start_at", sa.Double, nullable=False),  # expected start (epoch seconds)
    sa.Column("gpus", sa.Text, nullable=False),  # JSON list of the reserved GPU ids
    sa.Column("predicted_gbps", sa.Double, nullable=True),
    sa.Column("mode", sa.String(16), nullable=False),  # easy | conservative
    sa.Column("computed_at", sa.Double, nullable=False),
)

#: Start-or-wait's hold time per request (v12, :mod:`bandpilot.scheduling.startwait`): ``held_s`` seconds
#: held as of the batch at ``at``; ``holding``: that batch held it again (the hold lasts until the
#: next batch, which adds the time since ``at``). Rewritten by every batch that runs start-or-wait.
T_HOLDS = sa.Table(
    "bp_holds",
    metadata,
    sa.Column("request_id", sa.String(200), sa.ForeignKey("bp_requests.id"), primary_key=True),
    sa.Column("held_s", sa.Double, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("holding", sa.Boolean, nullable=False),
    sa.CheckConstraint("held_s >= 0", name="ck_bp_holds_held"),
)

#: Resize generations of elastic jobs (v9): generation 0 is the batch's assignment (bp_assignments),
#: each resize appends the next one and rewrites bp_assignments / bp_jobs in the same transaction.
T_GEN = sa.Table(
    "bp_generations",
    metadata,
    sa.Column("request_id", sa.String(200), sa.ForeignKey("bp_requests.id"), primary_key=True),
    sa.Column("generation", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("k", sa.Integer, nullable=False),
    sa.Column("gpus", sa.Text, nullable=False),  # JSON list of the GPU ids of this generation
    sa.Column("previous_k", sa.Integer, nullable=False),
    sa.Column("epoch", sa.Integer, nullable=True),  # the epoch boundary it applies at
    sa.Column("predicted_gbps", sa.Double, nullable=True),
    sa.Column("reason", sa.String(64), nullable=False),  # grow | shrink
    sa.Column("at", sa.Double, nullable=False),
    sa.CheckConstraint("generation >= 1 AND k > 0", name="ck_bp_generations_values"),
)

#: A tenant's pending requests (its limits, :mod:`bandpilot.queue.quotas`) and its own ids (v7).
IX_REQ_TENANT = sa.Index("ix_bp_requests_tenant_status", T_REQ.c.tenant, T_REQ.c.status)

#: The most recent released jobs (learned run times, every batch that plans with estimates): with
#: the status index alone each batch read and sorted every released job in the store's history (v10).
IX_JOBS_ENDED = sa.Index("ix_bp_jobs_status_ended", T_JOBS.c.status, T_JOBS.c.ended_at)

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


def _add_missing_columns(conn: sa.Connection, table: str, columns: Iterable[tuple[str, Any]]) -> None:
    """Add the nullable ``(name, type)`` columns ``table`` lacks: a fresh store got them from the
    table definitions in v1 already, an older one gets them by ALTER."""
    have = {c["name"] for c in sa.inspect(conn).get_columns(table)}
    ops = alembic_ops(conn)
    for name, type_ in columns:
        if name not in have:
            ops.add_column(table, sa.Column(name, type_, nullable=True))


def _m6_runtime_fields(conn: sa.Connection) -> None:
    _add_missing_columns(conn, "bp_requests", V6_REQUEST_COLUMNS)
    T_RESERVE.create(conn, checkfirst=True)


def _m8_shape(conn: sa.Connection) -> None:
    _add_missing_columns(conn, "bp_requests", [("shape", sa.Text)])
    _add_missing_columns(conn, "bp_assignments", [("ranks", sa.Text), ("placement", sa.Text)])


def _m9_elastic(conn: sa.Connection) -> None:
    _add_missing_columns(conn, "bp_requests", V9_REQUEST_COLUMNS)
    T_GEN.create(conn, checkfirst=True)


def _m11_scaling(conn: sa.Connection) -> None:
    # nullable: rows stored before read as "not declared", priced as before (perfect scaling)
    _add_missing_columns(conn, "bp_requests", V11_REQUEST_COLUMNS)


#: Ordered migrations ``(version, name, function(connection))``; append, never edit.
MIGRATIONS: list[tuple[int, str, Callable[[sa.Connection], None]]] = [
    (1, "initial schema", _m1_initial),
    (2, "verify verdicts per host", lambda conn: T_HEALTH.create(conn, checkfirst=True)),
    (3, "observed bandwidth next to predictions", lambda conn: T_OBS.create(conn, checkfirst=True)),
    (4, "API tokens, audit log, fragmentation samples",
     lambda conn: metadata.create_all(conn, tables=[T_TOKENS, T_AUDIT, T_FRAG], checkfirst=True)),
    (5, "entropy reports and run-time estimates",
     lambda conn: metadata.create_all(conn, tables=[T_ENTROPY, T_ESTIMATES], checkfirst=True)),
    (6, "run-time limits, communication fraction, preemptibility; reservations", _m6_runtime_fields),
    (7, "requests by tenant and status (per-tenant limits and ids)",
     lambda conn: IX_REQ_TENANT.create(conn, checkfirst=True)),
    (8, "parallelism shape of a request; rank map of its assignment", _m8_shape),
    (9, "elastic requests (min_k, max_k, k_step) and resize generations", _m9_elastic),
    (10, "released jobs by end time (learned run times)", lambda conn: IX_JOBS_ENDED.create(conn, checkfirst=True)),
    (11, "declared compute scaling efficiency of a request", _m11_scaling),
    (12, "start-or-wait hold time per request", lambda conn: T_HOLDS.create(conn, checkfirst=True)),
]


def schema_version() -> int:
    return MIGRATIONS[-1][0]
