"""The queue store on PostgreSQL (127.0.0.1:5432, trust auth, database ``test``).

Each test gets its own schema (``bpq_<random>``), dropped afterwards; the whole module skips
cleanly when no server answers. Scenarios are shared with ``test_queue.py``.
"""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.scheduling.profile import SchedulerProfile

from test_queue import (  # pytest puts tests/ on sys.path
    GreedyDispatcher,
    assert_consistent,
    h100,
    new_store,
    reqs,
    scenario_basic,
    scenario_concurrent,
    scenario_kill9,
)

pytestmark = pytest.mark.postgres

PG_HOST = os.environ.get("BANDPILOT_TEST_PG", "127.0.0.1:5432")


def _pg_url() -> str | None:
    for user in ("postgres", "root"):
        url = f"postgresql://{user}@{PG_HOST}/test"
        try:
            eng = sa.create_engine(url, connect_args={"connect_timeout": 2})
            with eng.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            eng.dispose()
            return url
        except Exception:
            continue
    return None


@pytest.fixture(scope="module")
def pg_url() -> str:
    url = _pg_url()
    if url is None:
        pytest.skip(f"no PostgreSQL server answers on {PG_HOST} (database 'test')")
    return url


@pytest.fixture
def schema(pg_url):
    name = f"bpq_{uuid.uuid4().hex[:12]}"
    yield name
    eng = sa.create_engine(pg_url)
    with eng.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    eng.dispose()


@pytest.fixture
def store(pg_url, schema):
    s = new_store(pg_url, h100(), schema=schema)
    yield s
    s.close()


def _schema_url(pg_url: str, schema: str) -> str:
    """The same store addressed by URL alone (libpq ``options``), as the subprocesses use it."""
    return f"{pg_url}?options=-csearch_path%3D{schema}"


def test_pg_schema_isolation_and_migrations(pg_url, schema):
    s = new_store(pg_url, h100(), schema=schema)
    with s.read() as conn:
        assert conn.exec_driver_sql("SELECT current_schema()").scalar() == schema
        assert s.current_version(conn) == q.schema_version()
    again = q.Store(pg_url, schema=schema)
    assert again.spec.fingerprint() == h100().fingerprint()
    by_url = q.Store(_schema_url(pg_url, schema))
    assert by_url.spec.name == "h100"
    for x in (s, again, by_url):
        x.close()


def test_pg_easy_backfill_reservations(store):
    from test_reservations import scenario_easy

    scenario_easy(store, make_fabric(store.spec))


def test_pg_start_or_wait_hold_bound(store):
    from test_startwait import scenario_one_host_bound

    scenario_one_host_bound(store, make_fabric(store.spec))


def test_pg_preemption_in_one_transaction(store):
    from test_preemption import scenario_starving_gang_preempts

    scenario_starving_gang_preempts(store, make_fabric(store.spec))


def test_pg_basic_flow(store):
    scenario_basic(store, Dispatcher(make_fabric(store.spec)))


def test_pg_lifecycle_and_policies(store):
    g = GreedyDispatcher(store.spec)
    q.submit(store, reqs(8, k=4, prefix="a", tenant="A", utility=0.9) + reqs(8, k=4, prefix="b", tenant="B", utility=0.3))
    rep = sched.run_batch(store, g, SchedulerProfile("test", queue_sort="utility"), commit="request")
    assert rep.quotas == {"A": 24, "B": 8} and rep.counts()["assigned"] == 8
    q.drain(store, "h100-0")
    victim = next(o for o in rep.assigned if o.gpus[0].startswith("h100-0:"))
    assert q.release(store, victim.request_id)["unavailable"]
    f = q.fragmentation(store)
    assert f["unavailable"] == 4 and f["free"] == 0
    q.undrain(store, "h100-0")
    assert sched.run_batch(store, g, SchedulerProfile("test", queue_sort="utility")).counts()["assigned"] == 1
    with pytest.raises(q.SubmitError):
        q.submit(store, [{"id": "a0", "k": 1}])
    assert_consistent(store)


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["batch", "request"])
def test_pg_concurrent_batch_processes(store, pg_url, schema, commit):
    scenario_concurrent(store, _schema_url(pg_url, schema), commit)


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["batch", "request"])
def test_pg_kill9_mid_batch(store, pg_url, schema, commit):
    scenario_kill9(store, _schema_url(pg_url, schema), commit)


def test_entropy_reports_and_sjf_on_postgresql(store):
    """Schema v5 on PostgreSQL: entropy reports update the utility all-or-nothing; sjf reads estimates."""
    from bandpilot.errors import RequestError

    q.submit(store, [{"id": f"e{i}", "k": 32, "submitted": 10 + i} for i in range(3)])
    out = q.report_entropy(store, [{"job": "e1", "entropy": 0.9}, {"job": "e1", "entropy": 0.5}])
    assert out[-1]["utility"] == pytest.approx(0.5 * 0.5 + 0.5 * 0.4)
    with pytest.raises(RequestError, match="no job 'nope'"):
        q.report_entropy(store, [{"job": "e0", "entropy": 0.2}, {"job": "nope", "entropy": 0.2}])
    assert q.entropy_history(store, "e0") == []
    q.set_estimates(store, {"e2": 10.0, "e0": 99.0})
    rep = sched.run_batch(store, Dispatcher(make_fabric(h100())), SchedulerProfile("test", queue_sort="sjf"))
    assert rep.assigned[0].request_id == "e2"


def test_pg_a_dropped_idle_connection_is_replaced_not_an_error(pg_url, schema, monkeypatch):
    """No ping on every checkout (a round trip per transaction); a connection idle longer than
    IDLE_PING_S is checked first, so a server restart or a dropped connection costs no failed call."""
    from bandpilot.queue import store as q_store

    monkeypatch.setattr(q_store, "IDLE_PING_S", 0.2)
    s = new_store(pg_url, h100(), schema=schema, pool_size=1)
    try:
        with s.read(snapshot=False) as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        eng = sa.create_engine(pg_url)
        with eng.begin() as conn:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar()
        eng.dispose()
        import time

        time.sleep(0.4)
        assert len(q.list_requests(s)) == 0
        with s.read(snapshot=False) as conn:
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != pid
    finally:
        s.close()


def test_pg_bulk_deferrals_match_eager(pg_url, store):
    """Quick deferrals recorded in bulk write the same rows and report as the eager path (a second
    store in its own schema)."""
    from test_bulk_deferrals import scenario_bulk_matches_eager

    other = f"bpq_{uuid.uuid4().hex[:12]}"
    eager = new_store(pg_url, h100(), schema=other)
    try:
        scenario_bulk_matches_eager(store, eager)
    finally:
        eager.close()
        eng = sa.create_engine(pg_url)
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')
        eng.dispose()


def test_pg_entropy_reports_build_on_the_last_one(store):
    from test_simulation import scenario_entropy_reports_build_on_the_last_one

    scenario_entropy_reports_build_on_the_last_one(store)


def test_pg_writes_together(store):
    from test_writes_together import scenario_writes_together

    scenario_writes_together(store)
