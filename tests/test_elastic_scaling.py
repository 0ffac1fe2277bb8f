"""A request's declared compute scaling efficiency (issue 22 follow-up): request -> store (v11) ->
the elastic growth pricing, so a job that scales badly is grown less."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot.errors import RequestError
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "params" / "clusters" / "h100.yaml"


def new_store(tmp_path, name: str = "q.db") -> q.Store:
    s = q.Store(f"sqlite:///{tmp_path / name}")
    s.init_cluster(load_cluster(H100))
    return s


# -- request and validation -------------------------------------------------------------------
def test_scaling_parses_round_trips_and_defaults_to_undeclared():
    r = q.Request.from_dict({"id": "e1", "k": 8, "min_k": 2, "max_k": 16, "scaling": 0.7})
    assert r.scaling == 0.7 and q.Request.from_dict(r.to_dict()) == r
    assert q.Request.from_dict({"id": "e2", "k": 8, "scaling": 1}).scaling == 1.0
    plain = q.Request.from_dict({"id": "f1", "k": 8})
    assert plain.scaling is None and "scaling" not in plain.to_dict()


@pytest.mark.parametrize("bad", [0, -0.5, 1.01, "0.9", True, math.nan, math.inf])
def test_bad_scaling_is_one_line_error(bad):
    with pytest.raises(RequestError) as ei:
        q.Request.from_dict({"id": "e1", "k": 8, "scaling": bad}, "f.jsonl:3")
    text = str(ei.value)
    assert text.startswith("f.jsonl:3") and "'scaling' must be a number in (0, 1]" in text and "\n" not in text


def test_jsonl_bad_scaling_names_the_line():
    got = q.parse_jsonl('{"id": "a", "k": 2, "scaling": 0.8}\n{"id": "b", "k": 2, "scaling": 2}\n', "r.jsonl")
    assert [r.scaling for r in got.requests] == [0.8]
    assert len(got.errors) == 1 and got.errors[0].startswith("r.jsonl:2") and "'scaling'" in got.errors[0]


def test_cli_submit_scaling(tmp_path, capsys):
    from bandpilot.cli.main import main

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    new_store(tmp_path, "cli.db").close()
    assert main(["queue", "submit", "--id", "e1", "--k", "4", "--max-k", "8", "--scaling", "0.75", "--store", url]) == 0
    capsys.readouterr()
    assert main(["queue", "submit", "--id", "e2", "--k", "4", "--scaling", "1.5", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "'scaling' must be a number in (0, 1], got 1.5" in err and len(err.strip().splitlines()) == 1
    s = q.Store(url)
    try:
        assert q.list_requests(s, request_id="e1")[0]["scaling"] == 0.75
        assert not q.list_requests(s, request_id="e2")
    finally:
        s.close()


def test_api_body_scaling(tmp_path):
    from fastapi.testclient import TestClient

    from bandpilot.api import create_app

    s = new_store(tmp_path)
    try:
        tok, _ = q.create_token(s, "alice")
        h = {"Authorization": f"Bearer {tok}"}
        with TestClient(create_app(s, sample_s=None)) as c:
            assert c.post("/v1/requests", json={"id": "e1", "k": 4, "max_k": 8, "scaling": 0.6}, headers=h).status_code == 201
            assert c.get("/v1/requests/e1", headers=h).json()["scaling"] == 0.6
            for v in (0, 1.2):
                bad = c.post("/v1/requests", json={"id": "e2", "k": 4, "scaling": v}, headers=h)
                assert bad.status_code == 422 and "scaling" in bad.json()["error"] and "\n" not in bad.json()["error"]
    finally:
        s.close()


# -- store migration --------------------------------------------------------------------------
def _downgrade_to_v10(conn) -> None:
    conn.execute(sa.text("ALTER TABLE bp_requests DROP COLUMN scaling"))
    conn.execute(sa.text("DELETE FROM bp_schema WHERE version = 11"))


def test_migration_11_upgrades_a_v10_store(tmp_path):
    """A store written before v11 opens, gains the nullable column; its rows read as undeclared."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = new_store(tmp_path, "old.db")
    q.submit(s, [{"id": "a", "k": 2, "min_k": 1, "max_k": 4}])
    s.close()
    eng = sa.create_engine(url)
    with eng.begin() as conn:
        _downgrade_to_v10(conn)
        assert "scaling" not in {c["name"] for c in sa.inspect(conn).get_columns("bp_requests")}
    eng.dispose()
    s = q.Store(url)
    try:
        assert s.migrate() == q.schema_version() >= 11
        q.submit(s, [{"id": "b", "k": 4, "max_k": 8, "scaling": 0.8}])
        rows = {r["id"]: r for r in q.list_requests(s)}
        assert rows["a"]["scaling"] is None and rows["a"]["max_k"] == 4 and rows["b"]["scaling"] == 0.8
        from bandpilot.scheduling.batch import load_pending

        with s.read() as conn:
            pend = {p.req.id: p.req for p in load_pending(conn)[0]}
        assert pend["a"].scaling is None and pend["b"].scaling == 0.8
    finally:
        s.close()


@pytest.mark.postgres
def test_pg_migration_11(tmp_path):
    from test_queue_pg import _pg_url

    import uuid

    url = _pg_url()
    if url is None:
        pytest.skip("no PostgreSQL server answers on 127.0.0.1:5432 (database 'test')")
    schema = f"bpq_{uuid.uuid4().hex[:12]}"
    s = q.Store(url, schema=schema)
    try:
        s.init_cluster(load_cluster(H100))
        q.submit(s, [{"id": "a", "k": 2}])
        with s.write() as conn:
            _downgrade_to_v10(conn)
        s.close()
        s = q.Store(url, schema=schema)
        assert s.migrate() == q.schema_version()
        q.submit(s, [{"id": "b", "k": 2, "max_k": 4, "scaling": 0.5}])
        rows = {r["id"]: r for r in q.list_requests(s)}
        assert rows["a"]["scaling"] is None and rows["b"]["scaling"] == 0.5
    finally:
        s.close()
        eng = sa.create_engine(url)
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        eng.dispose()


# -- pricing ----------------------------------------------------------------------------------
def test_grow_ratio_compute_share_follows_the_simulator_model():
    from bandpilot.scheduling.elastic_pricing import grow_ratio
    from bandpilot.simulation.elastic import epoch_time

    assert grow_ratio(0.3, 4, 100.0, 8, 80.0) == grow_ratio(0.3, 4, 100.0, 8, 80.0, 1.0)
    for eta in (1.0, 0.9, 0.6):
        for k0, k1 in ((2, 4), (4, 16), (8, 3)):
            # the same ratio the simulator's runtime model gives (declared k = k0, same bandwidth ratio)
            want = epoch_time(1.0, k0, k1, 0.3, eta, 100.0, 100.0 * 80.0 / 100.0) / epoch_time(1.0, k0, k0, 0.3, eta, 100.0, 100.0)
            assert grow_ratio(0.3, k0, 100.0, k1, 80.0, eta) == pytest.approx(want)


def test_low_efficiency_job_is_not_grown_across_hosts():
    from bandpilot.dispatch.state import State
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.scheduling.elastic import Candidate, _grow_priced, _Round
    from bandpilot.scheduling.elastic_pricing import PRICERS

    spec = load_cluster(H100)
    fab = make_fabric(spec)
    h0 = spec.hosts[0].name
    mine = spec.to_mask([f"{h0}:{i}" for i in range(8)])

    def grown_to(eta, declared=True):
        rnd = _Round(fab, False, "full", {}, {"x": Candidate("x", 8, 1, 16, 1, 1.0, True)}, {"x": 0.3},
                     PRICERS["welfare"], "fit-k", None, {"x": eta}, declared)
        return _grow_priced(rnd, State.idle(spec), "x", mine, 8, 16)[2]

    assert grown_to(None) == 16 and grown_to(1.0) == 16  # 70 % compute, perfect: doubling across the NIC pays
    assert grown_to(0.6) == 8  # at 60 % per doubling the compute gain no longer pays for the NIC
    assert grown_to(0.6, declared=False) == 16  # --scaling-pricing perfect: as before


def _solo(scaling, pricing):
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.simulation.elastic import simulate
    from bandpilot.simulation.engine import SimConfig
    from bandpilot.simulation.trace import TraceJob

    fab = make_fabric(load_cluster(H100))
    jobs = [TraceJob("lo", 0.0, 2, "t", 3600.0, 0.2, 0, min_k=1, max_k=8, epochs=10, scaling=scaling)]
    res = simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), elastic=True, interval_s=60, scaling_pricing=pricing))
    return res.jobs[0]


def test_simulation_grows_a_low_efficiency_job_less():
    """A real elastic simulation: one job (80 % compute, k=2, range 1..8) alone on the cluster.
    Priced as perfect it is given its max_k on one host; priced by its declared 55 % per doubling
    every doubling costs more in its ring collective than it saves in compute (in the simulator's
    model too), so it runs on 1 GPU - and ends sooner, on an eighth of the GPU-hours."""
    perfect = _solo(0.55, "perfect")
    declared = _solo(0.55, "declared")
    assert perfect.status == declared.status == "done"
    assert len(perfect.gpus.split(",")) == 8 and len(declared.gpus.split(",")) == 1
    assert declared.end_s < perfect.end_s and declared.gpu_s < perfect.gpu_s / 4
    # a job that declares nothing, or scales well, is priced as before: its max_k
    assert _solo(None, "declared").gpus == _solo(0.9, "declared").gpus == perfect.gpus
