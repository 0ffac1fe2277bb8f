"""Local, offline, quiet defaults for every tool BandPilot drives.

Why here: Prefect, MLflow and DVC all phone home or pick surprising stores unless told
otherwise. :func:`setup_env` is called by the CLI, the flows and the tests before any of
them is imported, and only fills variables the operator has not set (config over code).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from bandpilot.errors import SpecError

QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GIT_PYTHON_REFRESH": "quiet",
    "TQDM_MININTERVAL": "1",
    # The in-process Prefect API starts in ~5 s on an idle machine but much slower on a busy
    # 2-core one; the default timeout made the main job fail under load.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}


@dataclass(frozen=True)
class Settings:
    """Every ``BANDPILOT_*`` variable the library reads, parsed and checked in one place.

    The table of names, defaults and meanings is in the README ("Configuration"). Fields are
    ``None`` where the variable is unset and the default depends on the project (e.g. the store)."""

    home: Path | None = None  # BANDPILOT_HOME
    store: str | None = None  # BANDPILOT_STORE
    experiment: str | None = None  # BANDPILOT_EXPERIMENT
    mp_start: str | None = None  # BANDPILOT_MP_START
    task_runner: str | None = None  # BANDPILOT_TASK_RUNNER
    api_threads: int = 12  # BANDPILOT_API_THREADS
    api_config: str | None = None  # BANDPILOT_API_CONFIG (set by `api serve` for its workers)
    data: Path | None = None  # BANDPILOT_DATA (benchmarks: the shared measurement tables)


#: Field -> variable name; the only place the names are spelled.
ENV_NAMES = {f.name: "BANDPILOT_" + f.name.upper() for f in fields(Settings)}


def settings() -> Settings:
    """The ``BANDPILOT_*`` settings of this process.

    Parsed once per distinct set of values (cached on the raw strings), so a test's
    ``monkeypatch.setenv`` or a parent that sets a variable before starting a flow is seen without
    a cache reset, and a bad value fails with the variable's name."""
    return _parse(tuple(os.environ.get(v) or None for v in ENV_NAMES.values()))


@lru_cache(maxsize=32)
def _parse(raw: tuple[str | None, ...]) -> Settings:
    env = dict(zip(ENV_NAMES, raw))
    out: dict[str, object] = {k: v for k, v in env.items() if v is not None}
    for key in ("home", "data"):
        if key in out:
            out[key] = Path(str(out[key])).expanduser().resolve()
    for key, kind in (("api_threads", int),):
        if key in out:
            try:
                out[key] = kind(str(out[key]))
            except ValueError:
                raise SpecError(f"${ENV_NAMES[key]}: expected a number, got {env[key]!r}") from None
    if "api_threads" in out and int(out["api_threads"]) < 1:  # type: ignore[call-overload]
        raise SpecError(f"${ENV_NAMES['api_threads']}: must be at least 1, got {env['api_threads']!r}")
    if "task_runner" in out:
        out["task_runner"] = str(out["task_runner"]).lower()
    return Settings(**out)  # type: ignore[arg-type]


# The checkout (or installed tree) this package lives in: shipped params/ are found here too.
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def project_root() -> Path:
    """The project home: ``$BANDPILOT_HOME``, else the BandPilot checkout containing the current
    directory (``params/pipeline.yaml`` + ``dvc.yaml``), else a per-user data directory - never
    whatever directory a command happens to run in (no stray ``mlruns/`` in ``~`` or ``/tmp``)."""
    home = settings().home
    if home is not None:
        return home
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / "params" / "pipeline.yaml").is_file() and (d / "dvc.yaml").is_file():
            return d
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(data).expanduser() / "bandpilot").resolve()


def portable(path: str | Path | None) -> str:
    """``path`` as recorded in shared places (registry descriptions and tags, reports): relative to
    the project home or the checkout when inside one, so a record reads the same on every clone."""
    if path is None:
        return ""
    p = Path(path).expanduser()
    if not p.is_absolute():
        return str(p)
    for base in (project_root(), SOURCE_ROOT):
        try:
            return str(p.resolve().relative_to(base))
        except ValueError:
            continue
    return str(p)


def default_tracking_uri(root: Path | None = None) -> str:
    """MLflow on SQLite under ``mlruns/`` (the plain folder store is deprecated in MLflow 3)."""
    root = root or project_root()
    return f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"


def default_artifact_root(root: Path | None = None) -> str:
    root = root or project_root()
    return (root / "mlruns" / "artifacts").as_uri()


def setup_env(root: Path | None = None, threads: int | None = None) -> dict[str, str]:
    """Fill in quiet/offline defaults; returns what was set. Idempotent."""
    root = root or project_root()
    state = root / ".bandpilot"
    defaults = dict(QUIET_ENV)
    defaults.update(
        {
            "PREFECT_HOME": str(state / "prefect"),
            "DVC_SITE_CACHE_DIR": str(state / "dvc-site-cache"),
            # MLflow's rule: the registry follows the tracking URI unless MLFLOW_REGISTRY_URI is set,
            # so only the tracking default is filled in (a registry default would split the two).
            "MLFLOW_TRACKING_URI": default_tracking_uri(root),
            "OMP_NUM_THREADS": str(threads or min(2, os.cpu_count() or 1)),
        }
    )
    setby: dict[str, str] = {}
    for k, v in defaults.items():
        if not os.environ.get(k):
            os.environ[k] = v
            setby[k] = v
    if "MLFLOW_TRACKING_URI" in setby:  # the local default store lives under the project
        (root / "mlruns").mkdir(parents=True, exist_ok=True)
    for key in ("PREFECT_HOME", "DVC_SITE_CACHE_DIR"):
        # Prefect's server cannot create its SQLite file in a missing directory.
        Path(os.environ[key]).expanduser().mkdir(parents=True, exist_ok=True)
    return setby
