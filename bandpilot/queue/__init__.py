"""Stage 5b, the durable request queue (SQLite/PostgreSQL): schema and store, intake, lifecycle
(release/drain), audit, API tokens, telemetry, invariant checks and read-only views. It records what
happened; deciding what runs where is :mod:`bandpilot.scheduling`, the layer above it."""

from bandpilot.queue.audit import audit_log, audited
from bandpilot.queue.clock import iso
from bandpilot.queue.gpu_health import apply_verdicts, health
from bandpilot.queue.intake import SubmitError, SubmitReport, cancel, submit
from bandpilot.queue.launch import FORMATS, assignment, render
from bandpilot.queue.learning import DEFAULT_LAMBDA, entropy_history, entropy_utility, report_entropy, set_estimates
from bandpilot.queue.invariants import check_invariants
from bandpilot.queue.lifecycle import drain, release, release_many, resolve_targets, undrain
from bandpilot.queue.requests import Constraints, ParsedRequests, Request, new_request_id, parse_jsonl, validate_request
from bandpilot.queue.schema import (
    GPU_STATES,
    MIGRATIONS,
    REASONS,
    REQUEST_STATUSES,
    T_ASSIGN,
    T_BATCH,
    T_CLUSTER,
    T_GPUS,
    T_JOBS,
    T_REQ,
    T_SCHEMA,
    alembic_ops,
    metadata,
    schema_version,
)
from bandpilot.queue.store import STORE_ENV, Store, StoreError, default_store_url, open_store
from bandpilot.queue.telemetry import drift, record_observations
from bandpilot.queue.api_tokens import Principal, authenticate, create_token, list_tokens, revoke
from bandpilot.queue.views import (
    current_state,
    describe_reservation,
    export_state,
    format_gpus,
    fragmentation,
    fragmentation_history,
    gpu_grid,
    list_requests,
    nothing_to_place,
    recent_batches,
    reservations_in,
    sample_fragmentation,
    status,
)

__all__ = [
    # requests
    "Constraints", "ParsedRequests", "Request", "new_request_id", "parse_jsonl", "validate_request",
    # store and schema
    "GPU_STATES", "MIGRATIONS", "REASONS", "REQUEST_STATUSES", "STORE_ENV", "Store", "StoreError",
    "T_ASSIGN", "T_BATCH", "T_CLUSTER", "T_GPUS", "T_JOBS", "T_REQ", "T_SCHEMA",
    "alembic_ops", "default_store_url", "metadata", "open_store", "schema_version",
    # intake
    "SubmitError", "SubmitReport", "cancel", "submit",
    # lifecycle
    "drain", "release", "release_many", "resolve_targets", "undrain",
    # launcher input
    "FORMATS", "assignment", "render",
    # verify verdicts
    "apply_verdicts", "health",
    # entropy-guided utility and run-time estimates
    "DEFAULT_LAMBDA", "entropy_history", "entropy_utility", "report_entropy", "set_estimates",
    # telemetry and drift
    "drift", "record_observations",
    # API tokens and audit
    "Principal", "audit_log", "audited", "authenticate", "create_token", "list_tokens", "revoke",
    # views and checks
    "check_invariants", "current_state", "describe_reservation", "export_state", "format_gpus", "fragmentation", "fragmentation_history", "gpu_grid", "iso",
    "list_requests", "nothing_to_place", "recent_batches", "reservations_in", "sample_fragmentation", "status",
]
