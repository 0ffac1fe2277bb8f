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


#: Numeric variables: (type, default, smallest allowed). Checked where they are read, so a bad
#: API setting stops `api serve` with the variable's name but not every other command.
_NUMBERS: dict[str, tuple[type, float | None, float]] = {
    "api_threads": (int, 12, 1),  # BANDPILOT_API_THREADS
    "api_async_db": (int, 1, 0),  # BANDPILOT_API_ASYNC_DB (1: hot calls over asyncpg on PostgreSQL; 0: threads)
    "api_max_pending": (int, 100, 0),  # BANDPILOT_API_MAX_PENDING (pending requests per tenant)
    "api_max_pending_gpus": (int, None, 0),  # BANDPILOT_API_MAX_PENDING_GPUS (their GPUs together; unset: no cap)
    "dispatch_s": (float, 10.0, 0.0),  # BANDPILOT_DISPATCH_S (`api serve`: seconds between batches, 0 = off)
}


@dataclass(frozen=True)
class Settings:
    """Every ``BANDPILOT_*`` variable the library reads, parsed and checked in one place.

    The table of names, defaults and meanings is in the README ("Scaling out"). Fields are ``None``
    where the variable is unset and the default depends on the project (e.g. the store)."""

    home: Path | None = None  # BANDPILOT_HOME
    store: str | None = None  # BANDPILOT_STORE
    experiment: str | None = None  # BANDPILOT_EXPERIMENT
    mp_start: str | None = None  # BANDPILOT_MP_START
    task_runner: str | None = None  # BANDPILOT_TASK_RUNNER
    api_config: str | None = None  # BANDPILOT_API_CONFIG (set by `api serve` for its workers)
    data: Path | None = None  # BANDPILOT_DATA (benchmarks: the shared measurement tables)
    progress: str | None = None  # BANDPILOT_PROGRESS: bars | lines | off (default: bars on a terminal)
    numbers: tuple[tuple[str, str], ...] = ()  # raw text of the set numeric variables (see _NUMBERS)

    @property
    def api_threads(self) -> int:
        return int(self._number("api_threads"))  # type: ignore[arg-type]

    @property
    def api_async_db(self) -> bool:
        return bool(self._number("api_async_db"))

    @property
    def api_max_pending(self) -> int:
        return int(self._number("api_max_pending"))  # type: ignore[arg-type]

    @property
    def api_max_pending_gpus(self) -> int | None:
        v = self._number("api_max_pending_gpus")
        return None if v is None else int(v)

    @property
    def dispatch_s(self) -> float:
        return float(self._number("dispatch_s"))  # type: ignore[arg-type]

    def _number(self, key: str) -> float | None:
        kind, default, least = _NUMBERS[key]
        text = dict(self.numbers).get(key)
        if text is None:
            return default
        try:
            value = kind(text)
        except ValueError:
            raise SpecError(f"${ENV_NAMES[key]}: expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not value >= least:  # NaN fails too
            raise SpecError(f"${ENV_NAMES[key]}: must be at least {least:g}, got {text!r}")
        return value


#: Setting -> variable name; the only place the names are spelled.
ENV_NAMES = {name: "BANDPILOT_" + name.upper() for name in [*(f.name for f in fields(Settings) if f.name != "numbers"), *_NUMBERS]}


def settings() -> Settings:
    """The ``BANDPILOT_*`` settings of this process.

    Parsed once per distinct set of values (cached on the raw strings), so a test's
    ``monkeypatch.setenv`` or a parent that sets a variable before starting a flow is seen without
    a cache reset; a bad number fails with the variable's name where it is read."""
    return _parse(tuple(os.environ.get(v) or None for v in ENV_NAMES.values()))


@lru_cache(maxsize=32)
def _parse(raw: tuple[str | None, ...]) -> Settings:
    env = {k: v for k, v in zip(ENV_NAMES, raw) if v is not None}
    out: dict[str, object] = {k: v for k, v in env.items() if k not in _NUMBERS}
    for key in ("home", "data"):
        if key in out:
            out[key] = Path(str(out[key])).expanduser().resolve()
    for key in ("task_runner", "progress"):
        if key in out:
            out[key] = str(out[key]).strip().lower()
    out["numbers"] = tuple((k, v.strip()) for k, v in env.items() if k in _NUMBERS)
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


def model_name(cluster: str) -> str:
    """The registered name of ``cluster``'s bandwidth model: one name per cluster, so a registry
    serves several clusters and a promotion never crosses them."""
    return f"bandpilot-{cluster}"


def model_uri(cluster: str, alias: str = "champion") -> str:
    """The registry URI of ``cluster``'s model under ``alias``; the default ``champion`` is the
    version the promotion gate last accepted, which every command dispatches with unless told."""
    return f"models:/{model_name(cluster)}@{alias}"


def default_tracking_uri(root: Path | None = None) -> str:
    """MLflow on SQLite under ``mlruns/`` (the plain folder store is deprecated in MLflow 3)."""
    root = root or project_root()
    return f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"


def default_artifact_root(root: Path | None = None) -> str:
    root = root or project_root()
    return (root / "mlruns" / "artifacts").as_uri()


#: Whether :func:`setup_env` makes the local store directories when its caller does not say: the CLI
#: says no for a command line that only asks for help, and the flows package (imported to list its
#: commands) then creates nothing either.
_create_dirs = True


def setup_env(root: Path | None = None, threads: int | None = None, *, create: bool | None = None) -> dict[str, str]:
    """Fill in quiet/offline defaults; returns what was set. Idempotent. With ``create`` the local
    store directories are made too; an explicit ``create`` is also the default of later calls."""
    global _create_dirs
    if create is None:
        create = _create_dirs
    _create_dirs = create
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
    if not create:
        return setby
    if "MLFLOW_TRACKING_URI" in setby:  # the local default store lives under the project
        (root / "mlruns").mkdir(parents=True, exist_ok=True)
    for key in ("PREFECT_HOME", "DVC_SITE_CACHE_DIR"):
        # Prefect's server cannot create its SQLite file in a missing directory.
        Path(os.environ[key]).expanduser().mkdir(parents=True, exist_ok=True)
    return setby
