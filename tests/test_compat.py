"""What BandPilot 0.1 (the flat layout) wrote still works after the move to stage packages:
a saved model directory, the pyfunc wrapper MLflow pickled into every registered version, a
queue store mid-life, and the public names of ``import bandpilot``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

FIX = Path(__file__).resolve().parent / "fixtures" / "legacy-0.1"
ROOT = Path(__file__).resolve().parents[1]


def test_public_api_names():
    import bandpilot

    for name in ("Dispatcher", "Selection", "Surrogate", "ClusterSpec", "load_cluster", "State",
                 "make_fabric", "TraceFabric", "EmulatorFabric"):
        assert getattr(bandpilot, name).__name__ == name
    with pytest.raises(AttributeError):
        bandpilot.NoSuchThing  # noqa: B018


def test_legacy_model_directory_loads_and_predicts_the_same():
    from bandpilot import Dispatcher, Surrogate

    want = json.loads((FIX / "model_predictions.json").read_text())
    sur = Surrogate.load(FIX / "model")
    got = sur.predict(want["allocations"])
    np.testing.assert_allclose(got, want["busbw"], rtol=1e-5)
    sel = Dispatcher(sur).select(4, {"free": [f"{h.name}:{i}" for h in sur.spec.hosts for i in range(h.n_gpus)], "jobs": []})
    assert len(sel.gpus) == 4


def test_legacy_pickled_pyfunc_wrapper_still_unpickles_and_serves():
    import cloudpickle

    model = cloudpickle.loads((FIX / "python_model.pkl").read_bytes())
    model.load_context(SimpleNamespace(artifacts={"surrogate": str(FIX / "model")}))
    want = json.loads((FIX / "model_predictions.json").read_text())
    np.testing.assert_allclose(model.predict(None, want["allocations"]), want["busbw"], rtol=1e-5)


def test_legacy_queue_store_opens_reports_and_runs(tmp_path):
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot import queue as q

    db = tmp_path / "queue.db"
    shutil.copy(FIX / "queue.db", db)
    store = q.open_store(f"sqlite:///{db}")
    want = json.loads((FIX / "queue_status.json").read_text())
    got = q.status(store)
    for key in ("cluster", "requests", "deferral_reasons", "gpus", "tenants"):
        assert got[key] == want[key], key
    assert q.check_invariants(store) == []
    # the store keeps working: release a job, run a batch that places the deferred 12-GPU request
    q.release(store, "job-3")
    report = q.run_batch(store, Dispatcher(make_fabric(store.spec)))
    assert [o.status for o in report.outcomes] == ["assigned"]
    assert q.check_invariants(store) == []
    assert "h100-3:7" not in report.outcomes[0].gpus  # the drained GPU stays out
