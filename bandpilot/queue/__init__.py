"""Stage 5b, assignment: the durable request queue (SQLite/PostgreSQL), policies and quotas, batch
runs that call the dispatcher inside one transaction, release/drain, and invariant checks."""
