"""A registered model's directory read straight from the project's SQLite MLflow registry.

Why: importing MLflow and opening its SQLAlchemy store took about 2.5 s of a 3.3 s ``bandpilot select``
(4.6 of 10.5 s on a busy machine, ``python -X importtime``), for three indexed reads. In the common
case - a SQLite registry on this disk, artifacts on the local file system, nobody having configured
MLflow in this process - :func:`lookup` answers those reads with :mod:`sqlite3` on a read-only
connection, and a missing registry, model, alias or version gets MLflow's answer at once. Anything
else (a tracking server, PostgreSQL, remote artifacts, workspaces, a schema it does not know)
returns ``None`` and the caller asks MLflow (:mod:`bandpilot.model.artifacts`).
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from bandpilot.errors import ModelError

URI_PATTERN = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>[^/]+))?/?$")
_WORKSPACE = "default"  # MLflow's workspace when workspaces are off (its DEFAULT_WORKSPACE_NAME)
_DELETED = "Deleted_Internal"  # MLflow's stage of a deleted version (STAGE_DELETED_INTERNAL)


def no_registry_message(db: Path) -> str:
    return (f"no MLflow registry at {db.absolute()} (train a model first, e.g. `make run`, or set "
            "MLFLOW_TRACKING_URI / BANDPILOT_HOME to where the models are)")


def registry_uri() -> str:
    """The registry a lookup reads, chosen as :func:`bandpilot.model.artifacts.find_registry` does
    from the environment: ``$MLFLOW_REGISTRY_URI``, else ``$MLFLOW_TRACKING_URI``, else the project's."""
    from bandpilot.config import default_tracking_uri

    return os.environ.get("MLFLOW_REGISTRY_URI") or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def model_path(uri: str) -> Path:
    """The directory of a model given by path (``file://`` or plain), or the error naming the forms."""
    p = Path(str(uri).removeprefix("file://"))
    if not p.exists():
        raise ModelError(f"model not found: {uri} (expected models:/NAME@alias, models:/NAME/VERSION, runs:/ID/model or a path)")
    return p


def lookup(uri: str) -> tuple[Path, str, str] | None:
    """``models:/NAME@alias`` or ``models:/NAME/VERSION`` -> (local directory, name, version), or
    ``None`` when only MLflow can answer. Raises :class:`ModelError` for what is not there."""
    m = URI_PATTERN.match(str(uri))
    if m is None or (m.group("alias") is None and m.group("version") is None):
        return None
    if "mlflow" in sys.modules or os.environ.get("MLFLOW_WORKSPACE") or os.environ.get("MLFLOW_ENABLE_WORKSPACES", "").lower() in ("true", "1"):
        return None  # URIs may have been set in-process; workspaces: let MLflow choose
    reg = registry_uri()
    if not reg.startswith("sqlite:///") or "?" in reg:
        return None
    db = Path(reg.removeprefix("sqlite:///")).expanduser()
    if str(db) in ("", ":memory:"):
        return None
    if not db.is_file():
        raise ModelError(f"{uri}: {no_registry_message(db)}")
    name, alias, version = m.group("name"), m.group("alias"), m.group("version")
    if version is not None and not version.isdigit():
        return None  # MLflow's own message for a malformed version
    try:
        found = _read(db, reg, name, alias, version)
    except sqlite3.Error:
        return None  # locked, or another schema: MLflow knows
    if found is None:
        return None
    if isinstance(found, str):
        raise ModelError(found)
    version, location = found
    path = _local(location)
    if path is None or not path.is_dir():
        return None  # remote artifacts: MLflow downloads them
    return path, name, version


def _read(db: Path, reg: str, name: str, alias: str | None, version: str | None) -> tuple[str, str] | str | None:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        q = lambda sql, *args: con.execute(sql, (*args, _WORKSPACE)).fetchone()  # noqa: E731
        if q("select 1 from registered_models where name = ? and workspace = ?", name) is None:
            return f"no registered model {name!r} in {reg}"
        if alias is not None:
            row = q("select version from registered_model_aliases where name = ? and alias = ? and workspace = ?", name, alias)
            if row is None:
                return f"model {name!r} has no alias {alias!r}"
            version = str(row[0])
        row = q("select storage_location, source from model_versions where name = ? and version = ? "
                f"and current_stage != '{_DELETED}' and workspace = ?", name, int(version or 0))
        if row is None:
            return f"model {name!r} has no version {version!r}"
        return str(version), row[0] or row[1] or ""
    finally:
        con.close()


def _local(location: str) -> Path | None:
    if location.startswith("file://"):
        return Path(unquote(urlparse(location).path))
    if location and "://" not in location and not location.startswith(("models:", "runs:")):
        return Path(location)
    return None
