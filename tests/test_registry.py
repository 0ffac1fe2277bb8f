"""MLflow registry round trip on a temp SQLite store, and the train/finetune CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bandpilot.topology.cluster import load_cluster
from bandpilot.data.dataset import load_dataset, save_dataset
from bandpilot.errors import ModelError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.model.surrogate import Surrogate
from bandpilot.data.synthetic import fabric_dataset, random_cross_masks
from bandpilot.model.train import train

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 6, "layers": 1, "hidden": 16, "heads": 2, "prior_steps": 40, "n_train": 120, "threads": 1,
        "split": "random", "replay_size": 64}


@pytest.fixture(scope="module")
def het():
    return EmulatorFabric(load_cluster(ROOT / "params/clusters/het4mix.yaml"))


@pytest.fixture(scope="module")
def ds_dir(het, tmp_path_factory):
    d = tmp_path_factory.mktemp("reg") / "ds"
    save_dataset(fabric_dataset(het, n_cross=250, seed=3), d)
    return d


@pytest.fixture
def store(tmp_path, monkeypatch):
    from bandpilot.model import registry

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    registry.tracking_setup()
    return uri


@pytest.mark.slow
def test_register_load_by_alias_reproduces_predictions(ds_dir, het, store):
    import mlflow

    from bandpilot.model import registry

    res = train(load_dataset(ds_dir), TINY)
    mv = registry.log_and_register(res, alias="champion")
    name = "bandpilot-het4mix"
    assert mv.name == name and str(mv.version) == "1"
    assert "MAPE" in mv.description and "R2" in mv.description and "het4mix" in mv.description
    assert mv.tags["dataset_hash"] == res.data["dataset_hash"]
    assert registry.get_alias(name, "champion") == "1"
    assert registry.get_alias(name, "challenger") is None
    from bandpilot.model.artifacts import resolve

    assert resolve(f"models:/{name}@champion") == (name, "1", mv.run_id)
    from bandpilot.config import model_uri

    # the URI every command dispatches with by default names what registration wrote
    assert resolve(model_uri(res.surrogate.spec.name)) == (name, "1", mv.run_id)

    masks = random_cross_masks(het.spec, 300, seed=11)
    want = res.surrogate.predict_masks(masks)
    for uri in (f"models:/{name}@champion", f"models:/{name}/1", f"runs:/{mv.run_id}/model"):
        sur = Surrogate.load(uri)
        np.testing.assert_array_equal(sur.predict_masks(masks), want)
        assert sur.uri == uri
    sur = Surrogate.load(f"models:/{name}@champion")
    assert sur.model_version == "1" and sur.name == name

    run = mlflow.get_run(mv.run_id)
    assert run.data.tags["bandpilot.dataset_hash"] == res.data["dataset_hash"]
    assert "test_mape" in run.data.metrics and "epoch_train_loss" in run.data.metrics
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(mv.run_id, "plots")}
    assert {"plots/pred_vs_measured.png", "plots/residuals.png"} <= arts

    # pyfunc flavour works too (the MLflow-native way in)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow nags about predict() type hints
        pyf = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    allocs = [",".join(het.spec.from_mask(m)) for m in masks[:5]]
    import pandas as pd

    np.testing.assert_array_equal(pyf.predict(pd.DataFrame({"gpus": allocs})), want[:5])

    registry.describe(name, "1", "reviewed by ops")
    registry.set_tags(name, "1", {"reviewed": "yes"})
    registry.set_alias(name, "challenger", "1")
    assert registry.get_alias(name, "challenger") == "1"


@pytest.mark.slow
def test_unknown_alias_version_model_are_model_errors(store):
    from bandpilot.model import registry

    for uri, pat in (("models:/bandpilot-none@champion", "no registered model"),
                     ("models:/bandpilot-none/1", "no registered model"),
                     ("models:/bandpilot-none", "no version or alias"),
                     ("runs:/0123456789abcdef/model", "no MLflow run")):
        with pytest.raises(ModelError, match=pat) as ei:
            Surrogate.load(uri)
        assert "\n" not in str(ei.value)
    with pytest.raises(ModelError):
        registry.describe("bandpilot-none", "1", "x")


@pytest.mark.slow
def test_cli_train_and_finetune_register_versions(ds_dir, het, store, tmp_path, capsys):
    import mlflow

    from bandpilot.cli.main import main

    params = tmp_path / "train.yaml"
    params.write_text("train:\n" + "".join(f"  {k}: {v}\n" for k, v in TINY.items()))
    rc = main(["train", "--data", str(ds_dir), "--params", str(params), "--alias", "champion", "--epochs", "4"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "run id" in out and "models:/bandpilot-het4mix/1" in out and "test_mape" in out
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("bandpilot-het4mix", "champion").version) == "1"

    new_dir = tmp_path / "new"
    save_dataset(fabric_dataset(het, n_cross=60, seed=8), new_dir)
    rc = main(["finetune", "--model", "models:/bandpilot-het4mix@champion", "--data", str(new_dir),
               "--params", str(params), "--epochs", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "models:/bandpilot-het4mix/2" in out
    v2 = client.get_model_version("bandpilot-het4mix", "2")
    assert "Fine-tuned from models:/bandpilot-het4mix@champion" in v2.description

    # Bad input: one error line, exit 2, nothing new registered.
    rc = main(["finetune", "--model", "models:/bandpilot-het4mix@nope", "--data", str(new_dir), "--params", str(params)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and err.count("\n") == 1 and "nope" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = main(["train", "--data", str(empty), "--params", str(params)])
    assert rc == 2 and "no dataset" in capsys.readouterr().err
    assert len(client.search_model_versions("name='bandpilot-het4mix'")) == 2
