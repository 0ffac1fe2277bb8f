"""DVC helpers: version the measurement data (``data/``) next to the code.

Why a thin wrapper: the CLI (``bandpilot profile``) and the flows need the same three steps -
make sure a DVC repo with a usable default remote exists, ``dvc add`` the data directory, push -
and the same quiet defaults (no analytics, autostage). ``data.dvc`` at the repo top tracks the
whole ``data/`` directory, so one md5 (``<hash>.dir``) names one version of all measurements.

The default remote is a local directory ``<root>/.dvc-remote`` (git-ignored), written to the repo
config as a path relative to ``.dvc/`` so clones resolve it too. A remote configured by the
operator (any level: repo, local, global) is left alone.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from bandpilot.errors import BandPilotError, DataError

DEFAULT_REMOTE = "local"
REMOTE_DIR = ".dvc-remote"


def _quiet() -> None:
    if not os.environ.get("DVC_NO_ANALYTICS"):
        os.environ["DVC_NO_ANALYTICS"] = "1"


def _git_toplevel(root: Path) -> Path | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else None


GIT_MODES = ("stage", "leave", "commit")


def _check_git_mode(git: str) -> None:
    if git not in GIT_MODES:
        raise DataError(f"unknown git mode {git!r}: use one of {', '.join(GIT_MODES)}")


def ensure_repo(root: str | Path, *, git: str = "stage") -> Path:
    """Make ``root`` a DVC repo (``dvc init`` if needed) with autostage, no analytics and a default remote.

    Inside a git work tree the repo uses git (``--subdir`` below the top level); elsewhere it is
    initialised with ``--no-scm``. Idempotent. ``git="leave"`` never touches the git index.
    """
    _check_git_mode(git)
    _quiet()
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        if not (root / ".dvc").is_dir():
            top = _git_toplevel(root)
            log = logging.getLogger("dvc")
            level = log.level
            log.setLevel(logging.WARNING)  # no "Initialized DVC repository ..." chatter
            try:
                if top is None:
                    Repo.init(str(root), no_scm=True)
                else:
                    Repo.init(str(root), subdir=top != root)
                    if git == "leave":  # dvc init stages its own files: unstage them, they are new
                        made = [str(root / ".dvc" / ".gitignore"), str(root / ".dvc" / "config"), str(root / ".dvcignore")]
                        subprocess.run(["git", "-C", str(top), "reset", "-q", "--", *made],
                                       capture_output=True, timeout=60, check=False)
            finally:
                log.setLevel(level)
        repo = Repo(str(root))
        try:
            core = repo.config["core"]
            if core.get("autostage") is not True or core.get("analytics") is not False:
                with repo.config.edit("repo") as conf:
                    conf["core"]["autostage"] = True
                    conf["core"]["analytics"] = False
            if not repo.config["core"].get("remote"):
                from dvc.config_schema import RelPath

                with repo.config.edit("repo") as conf:
                    # RelPath: stored relative to .dvc/ ("../.dvc-remote"), so clones find it too
                    conf["remote"][DEFAULT_REMOTE] = {"url": RelPath(str(root / REMOTE_DIR))}
                    conf["core"]["remote"] = DEFAULT_REMOTE
                (root / REMOTE_DIR).mkdir(exist_ok=True)
            if git != "leave" and not repo.config["core"].get("no_scm") and repo.scm.root_dir:
                from scmrepo.git import Git

                if isinstance(repo.scm, Git):
                    # keep the local remote out of git and stage the config like autostage would
                    if (root / REMOTE_DIR).is_dir():
                        repo.scm_context.ignore(str(root / REMOTE_DIR))
                    repo.scm_context.track_file(str(root / ".dvc" / "config"))
                    repo.scm_context.track_changed_files()
        finally:
            repo.close()
    except DvcException as exc:
        raise BandPilotError(f"{root}: DVC setup failed: {exc}") from None
    return root


def _dvc_file(path: Path) -> Path:
    return path.parent / (path.name + ".dvc")


def read_md5(dvc_file: str | Path) -> str:
    """The md5 recorded for the single output of a ``.dvc`` file (``<hex>.dir`` for a directory)."""
    p = Path(dvc_file)
    try:
        doc = yaml.safe_load(p.read_text())
        return str(doc["outs"][0]["md5"])
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):
        raise DataError(f"{p}: not a DVC file with a tracked output") from None


def track(path: str | Path, root: str | Path, *, git: str = "stage") -> str:
    """``dvc add`` ``path`` (relative to ``root`` or absolute) and return its md5.

    Unchanged data gives an unchanged ``.dvc`` file (the same md5), so tracking twice makes no
    new version. ``git`` says what happens to the ``.dvc`` file in a git work tree:

    - ``stage`` (interactive default): ``core.autostage`` stages it and ``.gitignore``;
    - ``leave`` (scheduled runs): the git index is not touched, only the working tree changes;
    - ``commit``: stage and commit just those files, with a message naming the dataset version
      (nothing is committed when the version did not change; other staged changes are left staged).
    """
    _check_git_mode(git)
    root = ensure_repo(root, git=git)
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    p = Path(path)
    p = (root / p) if not p.is_absolute() else p
    p = p.resolve()
    if not p.exists():
        raise DataError(f"cannot track {p}: not found")
    try:
        p.relative_to(root)
    except ValueError:
        raise DataError(f"cannot track {p}: outside the DVC repo {root}") from None
    cwd = os.getcwd()
    try:
        os.chdir(root)  # dvc resolves targets and writes .gitignore relative to the working dir
        with Repo(str(root)) as repo:
            if git == "leave":
                repo.scm_context.autostage = False
                repo.scm_context.quiet = True  # no "To track the changes with git, run" hint
            repo.add(os.path.relpath(p, root))
    except DvcException as exc:
        raise BandPilotError(f"dvc add {p} failed: {exc}") from None
    finally:
        os.chdir(cwd)
    md5 = read_md5(_dvc_file(p))
    if git == "commit":
        setup = [root / ".dvc" / "config", root / ".dvc" / ".gitignore", root / ".dvcignore"]  # first version: DVC's own files
        _commit(root, [_dvc_file(p), p.parent / ".gitignore", *setup], f"data: dataset version {md5} ({p.name})")
    return md5


def _commit(root: Path, files: list[Path], message: str) -> bool:
    """Commit only ``files`` (those that exist); False when they did not change."""
    top = _git_toplevel(root)
    if top is None:
        return False
    paths = [str(f) for f in files if f.exists()]

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True, timeout=60, check=False)

    ident: list[str] = []
    if not git("config", "user.email").stdout.strip():  # a service account may have no identity
        ident = ["-c", "user.name=BandPilot", "-c", "user.email=bandpilot@localhost"]
    git("add", "--", *paths)
    if git("diff", "--cached", "--quiet", "--", *paths).returncode == 0:
        return False
    out = git(*ident, "commit", "--quiet", "--only", "-m", message, "--", *paths)
    if out.returncode != 0:
        raise BandPilotError(f"git commit of {', '.join(paths)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return True


def commit_stages(root: str | Path, stages: list[str], *, git: str = "leave") -> None:
    """``dvc commit`` ``stages`` of ``root/dvc.yaml``: their outputs into the cache and the hashes of
    their deps, params and outputs into ``dvc.lock`` - for outputs written by the flow that does the
    stages' work, so ``dvc status`` is clean and ``dvc repro`` skips them until something changes.
    ``git="leave"`` does not stage anything; ``commit`` commits ``dvc.lock`` and the metrics files."""
    _check_git_mode(git)
    _quiet()
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    root = Path(root).resolve()
    cwd = os.getcwd()
    log = logging.getLogger("dvc")
    level = log.level
    log.setLevel(logging.WARNING)  # no "Updating lock file" lines in the main job's output
    try:
        os.chdir(root)  # dvc resolves stage paths and writes .gitignore relative to the working dir
        with Repo(str(root)) as repo:
            if git == "leave":
                repo.scm_context.autostage = False
                repo.scm_context.quiet = True
            metrics: list[Path] = []
            for stage in stages:
                repo.commit(stage, force=True)  # force: the outputs are known to come from these deps
                for st in repo.stage.collect(stage):
                    metrics += [Path(o.fs_path) for o in st.outs if getattr(o, "metric", False)]
    except DvcException as exc:
        raise BandPilotError(f"dvc commit {' '.join(stages)} in {root} failed: {exc}") from None
    finally:
        os.chdir(cwd)
        log.setLevel(level)
    if git == "commit":
        _commit(root, [root / "dvc.lock", root / ".gitignore", *metrics], f"pipeline: {', '.join(stages)} recorded in dvc.lock")


def push(root: str | Path, targets: list[str] | None = None) -> int:
    """``dvc push`` to the default remote; returns the number of files transferred."""
    _quiet()
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    root = Path(root).resolve()
    cwd = os.getcwd()
    try:
        os.chdir(root)
        with Repo(str(root)) as repo:
            return int(repo.push(targets=targets) or 0)
    except DvcException as exc:
        raise BandPilotError(f"dvc push in {root} failed: {exc}") from None
    finally:
        os.chdir(cwd)


def _repo_root(start: Path) -> Path | None:
    for d in [start, *start.parents]:
        if (d / ".dvc").is_dir():
            return d
    return None


def _cache_dir(root: Path) -> Path:
    """Cache location from ``.dvc/config`` (``cache.dir``) or the default ``.dvc/cache``."""
    for name in ("config.local", "config"):
        cfg = root / ".dvc" / name
        if cfg.is_file():
            for raw in cfg.read_text().splitlines():
                key, _, val = raw.strip().partition("=")
                if key.strip() == "dir" and val.strip():
                    d = Path(val.strip())
                    return d if d.is_absolute() else (root / ".dvc" / d).resolve()
    return root / ".dvc" / "cache"


def tracked_md5(file: str | Path, content_md5: str) -> str | None:
    """DVC md5 of the tracked output containing ``file``, if its recorded content of ``file``
    equals ``content_md5`` (so the version is current); None when untracked or stale."""
    f = Path(file).resolve()
    root = _repo_root(f.parent)
    if root is None:
        return None
    for out in [f, *f.parents]:
        dvc_file = _dvc_file(out)
        if dvc_file.is_file():
            try:
                md5 = read_md5(dvc_file)
            except DataError:
                return None
            if out == f:
                return md5 if md5 == content_md5 else None
            if not md5.endswith(".dir"):
                return None
            listing = _cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]
            try:
                entries: Any = json.loads(listing.read_text())
            except (OSError, ValueError):
                return None
            rel = f.relative_to(out).as_posix()
            for e in entries or []:
                if isinstance(e, dict) and e.get("relpath") == rel:
                    return md5 if e.get("md5") == content_md5 else None
            return None
        if out == root:
            break
    return None
