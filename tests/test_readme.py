"""Every code block of the README runs (issue 26): ``python`` and ``bash`` blocks are executed, as a
new user would paste them, in a temp project whose registry holds a tiny ``bandpilot-h100@champion``
(no ``setup_env``, no MLflow variables: the library and the CLI must find the project's store
themselves). ``text`` blocks are output, diagrams and layouts. A block that cannot run here says
why in the markup just above it (``<!-- readme-test: not run - REASON -->``); that list is kept short
and checked here."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_model import make_project, register_champion

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NOT_RUN = re.compile(r"<!--\s*readme-test:\s*not run\s*-\s*(?P<why>.+?)\s*-->")
LANGS = {"python", "bash", "text"}


def blocks(text: str | None = None) -> list[dict]:
    """Fenced blocks: line, lang, code, and the reason it is not run (None: it runs)."""
    lines = (text if text is not None else README.read_text()).splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start, lang = i, lines[i][3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            before = next((lines[b] for b in range(start - 1, -1, -1) if lines[b].strip()), "")
            m = NOT_RUN.search(before)
            out.append({"line": start + 1, "lang": lang, "code": "\n".join(lines[i + 1:j]) + "\n",
                        "not_run": m.group("why") if m else None})
            i = j + 1
        else:
            i += 1
    return out


def runnable(lang: str) -> list[dict]:
    return [b for b in blocks() if b["lang"] == lang and b["not_run"] is None]


def test_every_block_is_tagged_and_every_code_block_runs_or_says_why():
    bs = blocks()
    assert bs, "no code blocks found"
    untagged = [b["line"] for b in bs if b["lang"] not in LANGS]
    assert not untagged, f"README.md lines {untagged}: tag each block python, bash (run by this test) or text"
    skipped = [(b["line"], b["code"].split()[0:2]) for b in bs if b["not_run"]]
    assert [s[1] for s in skipped] == [["make", "run"]], skipped  # the main job and the whole suite only
    assert runnable("python") and len(runnable("bash")) >= 2


def test_the_block_parser_sees_tags_and_reasons():
    doc = "x\n<!-- readme-test: not run - too slow -->\n```bash\nmake run\n```\n\n```\nplain\n```\n"
    got = blocks(doc)
    assert [(b["lang"], b["not_run"], b["code"]) for b in got] == [("bash", "too slow", "make run\n"), ("", None, "plain\n")]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    home = make_project(tmp_path_factory.mktemp("readme"))
    register_champion(home, "h100")
    return home


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "BANDPILOT_HOME", "BANDPILOT_STORE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: f"line{b['line']}")
def test_python_blocks_run_in_the_checkout(project, block):
    script = project / f"readme_{block['line']}.py"
    script.write_text(block["code"])
    before = set(project.rglob("*.db"))
    r = _run([sys.executable, str(script)], project)
    assert r.returncode == 0, f"README.md:{block['line']}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and r.stdout.strip()
    assert set(project.rglob("*.db")) == before, "the example created a store"  # e.g. ./mlflow.db


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("bash"), ids=lambda b: f"line{b['line']}")
def test_bash_blocks_run_in_the_checkout(project, block):
    code = block["code"].replace("8000", str(_port()))  # the documented port may be taken on a shared machine
    r = _run(["bash", "-e", "-o", "pipefail", "-c", code], project)
    assert r.returncode == 0, f"README.md:{block['line']}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
    assert not (project / "mlflow.db").exists()
