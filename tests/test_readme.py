"""The README is a user's page: short, for the three users (scheduled retraining, registry review, batch queue
assignment), telling where the command line is, with no run conditions or experiment log (those live in
``docs/``). Every code block runs (``tests/doc_blocks.py`` says how); a block that cannot run here says why in
the markup just above it, and that list is kept short and checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_blocks import LANGS, ROOT, bad_cli_uses, blocks, cli_commands, make_doc_project, run_bash, run_python

README = ROOT / "README.md"
TEXT = README.read_text()
NOT_RUN_FIRST_WORDS = [["make", "run"], ["mlflow", "ui"], ["prefect", "server"],
                       ["bandpilot", "slurm"], ["bandpilot", "slurm"], ["bandpilot", "slurm"]]  # the suite, servers, a Slurm cluster


def runnable(lang: str) -> list[dict]:
    return [b for b in blocks(TEXT) if b["lang"] == lang and b["not_run"] is None]


def test_every_block_is_tagged_and_every_code_block_runs_or_says_why():
    bs = blocks(TEXT)
    assert bs, "no code blocks found"
    untagged = [b["line"] for b in bs if b["lang"] not in LANGS]
    assert not untagged, f"README.md lines {untagged}: tag each block python, bash (run by the tests), text, yaml or json"
    skipped = [b["code"].split()[0:2] for b in bs if b["not_run"]]
    assert skipped == NOT_RUN_FIRST_WORDS, skipped  # the main job and the whole suite, Slurm, and two servers only
    assert runnable("python") and len(runnable("bash")) >= 3


def test_the_block_parser_sees_tags_and_reasons():
    doc = "x\n<!-- readme-test: not run - too slow -->\n```bash\nmake run\n```\n\n```\nplain\n```\n"
    got = blocks(doc)
    assert [(b["lang"], b["not_run"], b["code"]) for b in got] == [("bash", "too slow", "make run\n"), ("", None, "plain\n")]
    indented = "1. step\n\n    ```bash\n    echo hi\n    ```\n"
    assert [(b["lang"], b["code"]) for b in blocks(indented)] == [("bash", "echo hi\n")]


def test_the_readme_is_short_and_a_user_page():
    lines = TEXT.splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    long = [i + 1 for i, ln in enumerate(lines) if len(ln) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"
    for name, pattern in {
        "an issue number": r"\bissues? #?\d+",
        "a UTC time": r"\bUTC\b",
        "a machine load": r"\bload (average )?\d|\bload ~?\d",
        "a date": r"\b20\d\d-\d\d-\d\d\b",
        "an experiment round": r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) round\b",
        "an author's path": r"/work/|/home/\w+/",
    }.items():
        hits = [i + 1 for i, ln in enumerate(lines) if re.search(pattern, ln, flags=re.I)]
        assert not hits, f"README.md lines {hits} carry {name}"


def test_the_readme_says_where_the_command_line_is_before_using_it():
    where = TEXT.index("source .venv/bin/activate")
    assert ".venv/bin/bandpilot" in TEXT and ".venv/bin/dvc" in TEXT and ".venv/bin/mlflow" in TEXT
    first_use = min(TEXT.index(b["code"]) for b in blocks(TEXT)
                    if b["lang"] == "bash" and "bandpilot " in b["code"] and "source .venv" not in b["code"])
    assert where < first_use, "the README uses bandpilot before saying where it is"
    setup = TEXT.index("make test")
    assert setup < where, "the two set-up commands come first"


def test_the_readme_serves_its_three_users_and_links_the_docs():
    heads = re.findall(r"^## (.+)$", TEXT, flags=re.M)
    for want in ("batch queue assignment", "MLflow registry review", "scheduled retraining flows", "Slurm",
                 "REST API", "Scaling out", "Documentation"):
        assert any(want.lower() in h.lower() for h in heads), (want, heads)
    links = re.findall(r"\]\((docs/[^)#]+)", TEXT)
    assert len(links) >= 10
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_the_readme_names_only_commands_that_exist():
    bad = bad_cli_uses(TEXT, cli_commands())
    assert not bad, f"README.md names commands bandpilot does not have: {bad}"
    assert bad_cli_uses("`bandpilot api serve`", cli_commands()) == ["bandpilot api serve"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_doc_project(tmp_path_factory.mktemp("readme"))


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: f"line{b['line']}")
def test_python_blocks_run_in_the_checkout(project: Path, block):
    run_python(block, project, f"README.md:{block['line']}")


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("bash"), ids=lambda b: f"line{b['line']}")
def test_bash_blocks_run_in_the_checkout(project: Path, block):
    run_bash(block, project, f"README.md:{block['line']}")
