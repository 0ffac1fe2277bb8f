"""What BandPilot 0.1 (the flat layout) wrote still works after the move to stage packages:
a saved model directory, the pyfunc wrapper MLflow pickled into every registered version, a
queue store mid-life, and the public names of ``import bandpilot``.

The artifacts are written by the 0.1 code itself, taken from git history (nothing generated is
committed); the tests skip where the clone lacks that history (a shallow clone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parents[1]
LEGACY_COMMIT = "5e0607d10fc0272d2706d72085459bda15896d2d"  # the last commit of the 0.1 flat layout


@pytest.fixture(scope="module")
def legacy(tmp_path_factory) -> Path:
    """Artifacts written by BandPilot 0.1, run from its own source tree."""
    have = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{LEGACY_COMMIT}^{{commit}}"], capture_output=True)
    if have.returncode != 0:
        pytest.skip("the 0.1 commit is not in this clone's history (shallow clone)")
    tmp = tmp_path_factory.mktemp("legacy")
    src, out = tmp / "src", tmp / "out"
    src.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", LEGACY_COMMIT, "bandpilot", "params"],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDPILOT_", "PYTHONPATH"))}
    env.update(PYTHONPATH=str(src), BANDPILOT_HOME=str(tmp), MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}",
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "legacy_writer.py"), str(out)], cwd=src, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_public_api_names():
    import bandpilot

    for name in ("Dispatcher", "Selection", "Surrogate", "ClusterSpec", "load_cluster", "State",
                 "make_fabric", "TraceFabric", "EmulatorFabric"):
        assert getattr(bandpilot, name).__name__ == name
    with pytest.raises(AttributeError):
        bandpilot.NoSuchThing  # noqa: B018


@pytest.mark.slow
def test_legacy_model_directory_loads_and_predicts_the_same(legacy):
    from bandpilot import Dispatcher, Surrogate

    want = json.loads((legacy / "model_predictions.json").read_text())
    sur = Surrogate.load(legacy / "model")
    got = sur.predict(want["allocations"])
    np.testing.assert_allclose(got, want["busbw"], rtol=1e-5)
    sel = Dispatcher(sur).select(4, {"free": [f"{h.name}:{i}" for h in sur.spec.hosts for i in range(h.n_gpus)], "jobs": []})
    assert len(sel.gpus) == 4


@pytest.mark.slow
def test_legacy_pickled_pyfunc_wrapper_still_unpickles_and_serves(legacy):
    import cloudpickle

    model = cloudpickle.loads((legacy / "python_model.pkl").read_bytes())
    model.load_context(SimpleNamespace(artifacts={"surrogate": str(legacy / "model")}))
    want = json.loads((legacy / "model_predictions.json").read_text())
    np.testing.assert_allclose(model.predict(None, want["allocations"]), want["busbw"], rtol=1e-5)


@pytest.mark.slow
def test_legacy_queue_store_opens_reports_and_runs(legacy, tmp_path):
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot import queue as q
    from bandpilot import scheduling as sched

    db = tmp_path / "queue.db"
    shutil.copy(legacy / "queue.db", db)
    store = q.open_store(f"sqlite:///{db}")
    want = json.loads((legacy / "queue_status.json").read_text())
    got = q.status(store)
    for key in ("cluster", "requests", "deferral_reasons", "gpus", "tenants"):
        assert got[key] == want[key], key
    assert q.check_invariants(store) == []
    # the store keeps working: release a job, run a batch that places the deferred 12-GPU request
    q.release(store, "job-3")
    report = sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test"))
    assert [o.status for o in report.outcomes] == ["assigned"]
    assert q.check_invariants(store) == []
    assert "h100-3:7" not in report.outcomes[0].gpus  # the drained GPU stays out
