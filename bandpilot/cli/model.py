"""``bandpilot train | sweep | finetune``: learn the bandwidth surrogate, log to MLflow, register it.

Thin wrappers over :mod:`bandpilot.model.train`, ``.sweep``, ``.finetune`` and :mod:`bandpilot.model.registry`. Parameters come from
``params/train.yaml`` / ``params/sweep.yaml`` (project root) and are overridden by flags.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer

from bandpilot.cli import common
from bandpilot.cli.main import app
from bandpilot.errors import SpecError


def _params_path(given: Optional[Path], default: str) -> Optional[Path]:
    from bandpilot.config import project_root

    if given is not None:
        return given
    p = project_root() / default
    return p if p.is_file() else None


def _load_yaml(path: Optional[Path], key: str) -> dict[str, Any]:
    import yaml

    if path is None:
        return {}
    if not path.is_file():
        raise SpecError(f"params file not found: {path}")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a mapping")
    return doc.get(key, doc) or {}


def _summary(title: str, rows: list[tuple[str, Any]], metrics: dict[str, float]) -> None:
    from rich.table import Table  # here: every command's start-up would pay for it

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for k, v in rows:
        if v is not None:
            table.add_row(k, str(v))
    for k in ("test_r2", "test_mape", "test_max_err", "test_spearman", "val_mape", "replay_mape_before",
              "replay_mape_after", "test_mape_before", "n_train", "n_test", "train_seconds"):
        v = metrics.get(k)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        if k.startswith("n_"):
            txt = f"{int(v)}"
        elif "mape" in k:
            txt = f"{v:.2f} %"
        elif k == "train_seconds":
            txt = f"{v:.1f} s"
        elif k == "test_max_err":
            txt = f"{v:.2f} GB/s"
        else:
            txt = f"{v:.4f}"
        table.add_row(k, txt)
    common.console.print(table)


def _register(result: Any, name: Optional[str], alias: Optional[str], tracking_uri: Optional[str],
              tags: dict[str, str]) -> tuple[str, Any]:
    import mlflow

    from bandpilot.model import registry

    registry.tracking_setup(tracking_uri)
    with mlflow.start_run(run_name=f"{tags.get('bandpilot.command', 'train')}-{result.surrogate.spec.name}") as run:
        mlflow.set_tags(tags)
        mv = registry.log_and_register(result, name=name, alias=alias, tags={})
    return run.info.run_id, mv


@app.command("train")
def train_cmd(
    data: Path = typer.Option(..., "--data", "-d", help="Dataset directory (measurements.parquet + cluster.yaml)."),
    params: Optional[Path] = typer.Option(None, "--params", help="Training params YAML (default params/train.yaml)."),
    model: Optional[str] = typer.Option(None, help="hierarchical | domain | naive (default: the params file's; "
                                        "domain on clusters with NVLink domains)"),
    n_train: Optional[int] = typer.Option(None, "--n-train", help="Training allocations sampled from the cross-host pool."),
    split: Optional[str] = typer.Option(None, help="Paper protocol instead of the production fit: train on --n-train "
                                        "sampled allocations, test on the rest (random | stratified | pattern | explicit)."),
    folds: Optional[int] = typer.Option(None, "--folds", help="Pattern-grouped cross-validation folds for the metrics (default 5)."),
    holdout: Optional[float] = typer.Option(None, "--holdout", help="Fraction of count patterns kept out as a test set (default 0)."),
    train_data: Optional[Path] = typer.Option(None, "--train-data", help="split=explicit: dataset whose rows are the training set."),
    epochs: Optional[int] = typer.Option(None, help="Training epochs (overrides the params file)."),
    layers: Optional[int] = typer.Option(None, help="Network layers (overrides the params file)."),
    hidden: Optional[int] = typer.Option(None, help="Hidden width (overrides the params file)."),
    lr: Optional[float] = typer.Option(None, help="Learning rate (overrides the params file)."),
    seed: Optional[int] = typer.Option(None, help="Seed of folds, splits and initialisation."),
    threads: Optional[int] = typer.Option(None, help="Torch threads (default: the params file's)."),
    name: Optional[str] = typer.Option(None, help="Registered model name (default bandpilot-<cluster>)."),
    alias: Optional[str] = typer.Option(None, help="Point this alias (e.g. challenger) at the new version."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also save the model directory and plots here."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking/registry URI."),
    register: bool = typer.Option(True, "--register/--no-register", help="Log to MLflow and register the model."),
    metrics_out: Optional[Path] = typer.Option(None, "--metrics-out", help="Also write the test metrics as JSON (DVC metrics file)."),
) -> None:
    """Train the bandwidth surrogate on every measured cross-host allocation (metrics from pattern-grouped
    cross-validation), log the run to MLflow and register the model."""
    from bandpilot.data.dataset import load_dataset
    from bandpilot.model.params import TrainParams

    over = dict(model=model, n_train=n_train, split=split, epochs=epochs, layers=layers, hidden=hidden, lr=lr,
                seed=seed, threads=threads, folds=folds, holdout=holdout,
                train_data=str(train_data) if train_data else None)
    p = TrainParams.load(_params_path(params, "params/train.yaml"), over)
    ds = load_dataset(data)
    if register:  # an unusable store fails now, not after the fit (31 min on the 10,008-GPU profile)
        from bandpilot.model import registry

        registry.tracking_setup(tracking_uri)
    if model is None and p.model == "hierarchical" and ds.spec.nvlink_domains:
        # host tokens cannot express the NVLink path inside a domain (and a row spans up to hundreds of trays)
        p.model = "domain"
        common.console.print(f"[yellow]note:[/] {ds.spec.name} has NVLink domains: training the 'domain' model (domain tokens)")
    if split is not None or train_data is not None:
        from bandpilot.model.train import train

        res = train(ds, p, out_dir=(out / "plots") if out else None)
    else:
        from bandpilot.model.crossval import fit

        res = fit(ds, p, out_dir=(out / "plots") if out else None, progress=lambda m: common.console.print(f"[dim]{m}[/]"))
    for note in res.notes:
        common.console.print(f"[yellow]note:[/] {note}")
    run_id = version = mname = None
    if out:  # saved first: a registry failure must not discard the fit
        res.surrogate.save(out / "model")
    if register:
        run_id, mv = _register(res, name, alias, tracking_uri, {"bandpilot.command": "train"})
        version, mname = mv.version, mv.name
    if metrics_out:
        from bandpilot.io import write_json_atomic

        write_json_atomic(metrics_out, res.metrics)
    _summary(
        f"trained {res.surrogate.kind} surrogate for {ds.spec.name}",
        [("run id", run_id), ("model", f"models:/{mname}/{version}" if mname else None), ("alias", alias),
         ("split", res.data.get("split", p.split)), ("metrics from", res.data.get("metrics_from")), ("dataset", res.data.get("dataset_hash", "")[:16]),
         ("saved", str(out / "model") if out else None)],
        res.metrics,
    )


def _fmt_param(k: str, v: Any) -> str:
    return f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"


@app.command("sweep")
def sweep_cmd(
    data: Path = typer.Option(..., "--data", "-d", help="Dataset directory."),
    params: Optional[Path] = typer.Option(None, "--params", help="Sweep YAML (default params/sweep.yaml)."),
    train_params: Optional[Path] = typer.Option(None, "--train-params", help="Base training params (default params/train.yaml)."),
    n_trials: Optional[int] = typer.Option(None, "--n-trials", help="Trials to run (default: the sweep YAML's, else 20)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds for the whole study."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL (default sqlite:///.bandpilot/optuna.db)."),
    study: Optional[str] = typer.Option(None, "--study", help="Study name (default bandpilot-<cluster>)."),
    epochs: Optional[int] = typer.Option(None, help="Override the base epochs (unless swept)."),
    name: Optional[str] = typer.Option(None, help="Registered model name (default bandpilot-<cluster>)."),
    alias: Optional[str] = typer.Option(None, help="Point this alias (e.g. challenger) at the best model."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking/registry URI."),
) -> None:
    """Optuna TPE + median pruning on validation MAPE; a parent MLflow run with one child per trial;
    the best model is registered."""
    import mlflow

    from bandpilot.model import registry
    from bandpilot.data.dataset import load_dataset
    from bandpilot.model.params import TrainParams
    from bandpilot.model.sweep import sweep

    cfg = _load_yaml(_params_path(params, "params/sweep.yaml"), "sweep")
    base = TrainParams.load(_params_path(train_params, "params/train.yaml"), {"epochs": epochs})
    ds = load_dataset(data)
    registry.tracking_setup(tracking_uri)
    res = sweep(
        ds, base,
        n_trials=int(n_trials if n_trials is not None else cfg.get("n_trials", 20)),
        timeout=timeout if timeout is not None else cfg.get("timeout"),
        storage=storage or cfg.get("storage"),
        study_name=study or cfg.get("study"),
        space=cfg.get("space"),
        val_fraction=float(cfg.get("val_fraction", 0.2)),
        tracking_uri=tracking_uri,
    )
    with mlflow.start_run(run_id=res.parent_run_id):
        mv = registry.log_and_register(res.result, name=name, alias=alias, tags={"optuna.study": res.study_name})
    _summary(
        f"sweep {res.study_name}: {res.n_trials} trials ({res.n_pruned} pruned)",
        [("parent run id", res.parent_run_id), ("model", f"models:/{mv.name}/{mv.version}"), ("alias", alias),
         ("storage", res.storage), ("best val MAPE", f"{res.best_value:.2f} %"),
         ("best params", ", ".join(_fmt_param(k, getattr(res.best_params, k)) for k in (res.trials[0].keys() if res.trials else [])
                                   if k not in ("number", "val_mape", "pruned")))],
        res.result.metrics,
    )


@app.command("finetune")
def finetune_cmd(
    model: str = typer.Option(..., "--model", "-m", help="models:/NAME@alias, models:/NAME/VERSION, runs:/ID/model or a path."),
    data: Path = typer.Option(..., "--data", "-d", help="Dataset directory with the new measurements."),
    params: Optional[Path] = typer.Option(None, "--params", help="Training params YAML (default params/train.yaml)."),
    epochs: Optional[int] = typer.Option(None, help="Fine-tuning epochs."),
    lr: Optional[float] = typer.Option(None, help="Fine-tuning learning rate."),
    seed: Optional[int] = typer.Option(None, help="Seed of the replay sample and initialisation."),
    name: Optional[str] = typer.Option(None, help="Registered name (default: the base model's)."),
    alias: Optional[str] = typer.Option(None, help="Point this alias (e.g. challenger) at the new version."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking/registry URI."),
) -> None:
    """Continue training a registered model on new measurements (replaying stored originals) and
    register the result as a new version."""
    from bandpilot.model import registry
    from bandpilot.data.dataset import load_dataset
    from bandpilot.model.surrogate import Surrogate
    from bandpilot.model.finetune import finetune
    from bandpilot.model.params import TrainParams

    p = TrainParams.load(_params_path(params, "params/train.yaml"), {"finetune_epochs": epochs, "finetune_lr": lr, "seed": seed})
    registry.tracking_setup(tracking_uri)
    base = Surrogate.load(model)
    new = load_dataset(data)
    res = finetune(base, new, p)
    for note in res.notes:
        common.console.print(f"[yellow]note:[/] {note}")
    run_id, mv = _register(res, name or base.name, alias, tracking_uri,
                           {"bandpilot.command": "finetune", "bandpilot.base_model": model})
    _summary(
        f"fine-tuned {model}",
        [("run id", run_id), ("model", f"models:/{mv.name}/{mv.version}"), ("alias", alias),
         ("base version", base.model_version)],
        res.metrics,
    )
