"""Fenced code blocks of the README and of the documentation site, and how the tests run them.

``python`` and ``bash`` blocks are executed as a new user would paste them, in a temp project whose registry
holds a tiny ``bandpilot-h100@champion`` and whose ``.venv`` is this interpreter's virtualenv (no
``setup_env``, no MLflow variables: the library and the CLI must find the project's store themselves).
``text`` blocks are output, diagrams and layouts; ``yaml``/``json`` blocks are file contents. A block that
cannot run says why in the markup just above it (``<!-- readme-test: not run - REASON -->``)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_RUN = re.compile(r"<!--\s*readme-test:\s*not run\s*-\s*(?P<why>.+?)\s*-->")
RUN_LANGS = {"python", "bash"}
LANGS = RUN_LANGS | {"text", "yaml", "json"}


def blocks(text: str) -> list[dict]:
    """Fenced blocks: line, lang, code, and the reason it is not run (None: it runs)."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            start, lang = i, lines[i].strip()[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            before = next((lines[b] for b in range(start - 1, -1, -1) if lines[b].strip()), "")
            m = NOT_RUN.search(before)
            body = [ln[indent:] for ln in lines[i + 1:j]]
            out.append({"line": start + 1, "lang": lang, "code": "\n".join(body) + "\n",
                        "not_run": m.group("why") if m else None})
            i = j + 1
        else:
            i += 1
    return out


def make_doc_project(home: Path) -> Path:
    """A temp project with a tiny registered champion and the checkout's virtualenv at ``.venv``
    (so ``source .venv/bin/activate`` and ``.venv/bin/bandpilot`` work as the README says)."""
    from tiny_model import make_project, register_champion

    make_project(home)
    register_champion(home, "h100")
    (home / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return home


def env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "BANDPILOT_HOME", "BANDPILOT_STORE",
                        "VIRTUAL_ENV", "PREFECT_API_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own group: a background server dies with it
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_python(block: dict, project: Path, where: str) -> None:
    script = project / f"block_{abs(hash(where))}.py"
    script.write_text(block["code"])
    before = set(project.rglob("*.db"))
    r = run([sys.executable, str(script)], project)
    assert r.returncode == 0, f"{where}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and r.stdout.strip(), where
    assert set(project.rglob("*.db")) == before, f"{where}: the example created a store"  # e.g. ./mlflow.db


def run_bash(block: dict, project: Path, where: str) -> None:
    code = block["code"].replace("8000", str(free_port()))  # the documented port may be taken on a shared machine
    r = run(["bash", "-e", "-o", "pipefail", "-c", code], project)
    assert r.returncode == 0, f"{where}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, where
    assert not (project / "mlflow.db").exists(), where


def cli_commands() -> dict[str, set[str] | None]:
    """``bandpilot``'s commands: a group's subcommand names, or None for a command that takes no
    positional argument (so ``bandpilot api serve`` is caught), or an empty set when it takes some."""
    import typer

    from bandpilot.cli import main

    main._load_commands([])
    root = typer.main.get_command(main.app)
    out: dict[str, set[str] | None] = {}
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            out[name] = set(cmd.commands)
        else:
            takes_args = any(p.param_type_name == "argument" for p in cmd.params)
            out[name] = set() if takes_args else None
    return out


CLI_USE = re.compile(r"(?<!from )(?<!import )\bbandpilot ([a-z][a-z-]*)(?: ([a-z][a-z0-9-]*))?")


def bad_cli_uses(text: str, commands: dict[str, set[str] | None]) -> list[str]:
    """``bandpilot X [Y]`` in code (blocks and inline) naming a command or subcommand that does not exist."""
    code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text))
    bad = []
    for m in CLI_USE.finditer(code):
        first, second = m.group(1), m.group(2)
        if first not in commands:
            bad.append(m.group(0))
        elif second and commands[first] is None:
            bad.append(m.group(0))  # an extra argument to a command that takes none
        elif second and commands[first] and second not in commands[first]:
            bad.append(m.group(0))
    return bad
