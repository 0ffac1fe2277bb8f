"""Where a stored model lives: a registry or run URI (``models:/NAME@alias``, ``models:/NAME/3``,
``runs:/ID/...``) resolved to the local, self-contained surrogate directory, without
``mlflow.pyfunc.load_model`` (fast: no Lightning, no environment checks)."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from bandpilot.errors import ModelError
from bandpilot.model.local_registry import URI_PATTERN, no_registry_message

_URI = URI_PATTERN


def one_line(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or str(exc)
    return " ".join(str(msg).split())[:200]


def mlflow_client() -> MlflowClient:
    return MlflowClient()


def _require_registry(what: str) -> None:
    """Reading a model must not create an MLflow database: MLflow creates (and announces) an empty
    one on first connect, wherever the tracking URI points - e.g. in a per-user directory when a
    command runs outside the checkout."""
    reg = mlflow.get_registry_uri()
    if not reg.startswith("sqlite:///"):
        return
    path = Path(reg.removeprefix("sqlite:///").split("?")[0]).expanduser()
    if str(path) not in ("", ":memory:") and not path.is_file():
        raise ModelError(f"{what}: no MLflow registry at {path.resolve()} (nothing trained there yet): run `make run` "
                         "or `bandpilot train`, or point MLFLOW_TRACKING_URI (or BANDPILOT_HOME) at an existing one")


def find_registry() -> str:
    """The tracking/registry URI a registry or run URI resolves against, found like the CLI does.

    Why: a library caller (``Dispatcher.load``, ``Surrogate.load``) has not run
    :func:`bandpilot.config.setup_env`, and MLflow's own default (``sqlite:///mlflow.db`` in the
    current directory) is an empty store it creates on the spot. A URI set by the caller
    (``mlflow.set_tracking_uri``, ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI``) wins; else the
    project's store (:func:`bandpilot.config.default_tracking_uri`), which must already exist:
    nothing is created by a lookup."""
    from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

    from bandpilot.config import default_tracking_uri

    explicit = is_tracking_uri_set() or bool(os.environ.get("MLFLOW_REGISTRY_URI"))
    uri = mlflow.get_registry_uri() if explicit else default_tracking_uri()
    if uri.startswith("sqlite:///"):  # MLflow would create an empty store on the first query
        db = Path(uri.removeprefix("sqlite:///")).expanduser()
        if not db.is_file():
            raise ModelError(no_registry_message(db))
    if not explicit:
        mlflow.set_tracking_uri(uri)
    return uri


def resolve(uri: str) -> tuple[str | None, str | None, str | None]:
    """``models:/NAME@alias`` | ``models:/NAME/VERSION`` | ``runs:/ID/...`` -> (name, version, run_id)."""
    uri = str(uri)
    if uri.startswith(("models:/", "runs:/")):
        try:
            find_registry()
        except ModelError as exc:  # name what the caller asked for, not only where we looked
            raise ModelError(f"{uri}: {exc}") from None
    m = _URI.match(uri)
    if m:
        name, alias, version = m.group("name"), m.group("alias"), m.group("version")
        _require_registry(f"no registered model {name!r}")
        client = mlflow_client()
        if alias is None and version is None:
            raise ModelError(f"model URI {uri!r} names no version or alias (use models:/{name}@champion or models:/{name}/1)")
        try:
            client.get_registered_model(name)
        except MlflowException:
            raise ModelError(f"no registered model {name!r} in {mlflow.get_registry_uri()}") from None
        try:
            mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
        except MlflowException:
            what = f"alias {alias!r}" if alias else f"version {version!r}"
            raise ModelError(f"model {name!r} has no {what}") from None
        return name, str(mv.version), mv.run_id
    if uri.startswith("runs:/"):
        parts = uri.removeprefix("runs:/").split("/", 1)
        if not parts[0]:
            raise ModelError(f"malformed run URI {uri!r}: expected runs:/<run id>/model")
        _require_registry(f"no MLflow run {parts[0]!r}")
        try:
            mlflow_client().get_run(parts[0])
        except MlflowException:
            raise ModelError(f"no MLflow run {parts[0]!r}") from None
        return None, None, parts[0]
    return None, None, None


def fetch_model_dir(uri: str) -> tuple[Path, str | None, str | None]:
    """Local directory holding the surrogate artifact of a registry/run URI, plus (name, version)."""
    name, version, run_id = resolve(uri)
    client = mlflow_client()
    if name is not None and version is not None:
        src = client.get_model_version_download_uri(name, version)
        local = _local_path(src)
        if local is not None and local.exists():
            return local, name, version
        try:
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}")), name, version
        except MlflowException as exc:
            raise ModelError(f"cannot download model {name!r} version {version}: {one_line(exc)}") from None
    try:
        path = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    except (MlflowException, OSError) as exc:
        raise ModelError(f"cannot fetch model {uri!r}: {one_line(exc)}") from None
    return path, None, None


def _local_path(uri: str) -> Path | None:
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    if "://" not in uri and not uri.startswith(("models:", "runs:")):
        return Path(uri)
    return None
