"""Every code block of the documentation site (``docs/**/*.md``) runs as the README's do
(``tests/doc_blocks.py``): ``python`` and ``bash`` blocks in a temp project with a tiny registered champion,
or the markup above the block says why not. The site's pages are all in the nav and every command they
name exists; ``mkdocs build --strict`` itself runs in ``make test``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from doc_blocks import LANGS, ROOT, RUN_LANGS, bad_cli_uses, blocks, cli_commands, make_doc_project, run_bash, run_python

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md"))
#: blocks the README shares word for word: tests/test_readme.py runs them once
README_CODE = {b["code"] for b in blocks((ROOT / "README.md").read_text()) if b["not_run"] is None}


def _all_blocks() -> list[tuple[str, dict]]:
    return [(str(p.relative_to(ROOT)), b) for p in PAGES for b in blocks(p.read_text())]


def _runnable(lang: str) -> list[tuple[str, dict]]:
    return [(where, b) for where, b in _all_blocks()
            if b["lang"] == lang and b["not_run"] is None and b["code"] not in README_CODE]


def _mkdocs_config() -> dict:
    class _Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python/name tags (e.g. emoji functions)
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return [p for v in node for p in _nav_pages(v)]


def test_every_docs_block_is_tagged_and_code_runs_or_says_why():
    found = _all_blocks()
    assert found, "no code blocks in docs/"
    untagged = [f"{w}:{b['line']}" for w, b in found if b["lang"] not in LANGS]
    assert not untagged, f"tag each block python, bash (run by the tests), text, yaml or json: {untagged}"
    not_run = [(w, b["line"], b["not_run"]) for w, b in found if b["lang"] in RUN_LANGS and b["not_run"]]
    assert all(len(why) >= 10 for _, _, why in not_run), not_run  # a reason, not a placeholder
    assert _runnable("python") and _runnable("bash")


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = _nav_pages(_mkdocs_config()["nav"])
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert not [n for n in nav if n not in pages], "nav names a missing page"
    assert not sorted(pages - set(nav)), "a page of docs/ is not in the nav"


def test_the_site_builds_offline_in_make_test():
    cfg = _mkdocs_config()
    assert cfg["theme"]["font"] is False, "Material would fetch Google Fonts"
    plugins = [next(iter(p)) if isinstance(p, dict) else p for p in cfg["plugins"]]
    assert not {"social", "privacy", "optimize"} & set(plugins), "a plugin that downloads at build time"
    make = (ROOT / "Makefile").read_text()
    for target in ("test", "test-fast"):
        recipe = make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        head, *body = recipe.splitlines()
        lines = [ln.strip() for ln in body]
        assert " lint " in head + " " and "mkdocs build --strict" in lines[0], (target, head, lines)
    lint = make.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "lint-imports" in lint, lint
    assert "/site/" in (ROOT / ".gitignore").read_text().split()


def test_the_docs_name_only_commands_that_exist():
    commands = cli_commands()
    bad = {str(p.relative_to(ROOT)): b for p in PAGES if (b := bad_cli_uses(p.read_text(), commands))}
    assert not bad, f"pages naming commands bandpilot does not have: {bad}"


def test_the_docs_carry_no_issue_numbers_in_headings():
    heads = [(str(p.relative_to(ROOT)), ln) for p in PAGES for ln in p.read_text().splitlines()
             if ln.startswith("#") and re.search(r"\bissues? \d+", ln, flags=re.I)]
    assert not heads, heads


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_doc_project(tmp_path_factory.mktemp("docs"))


@pytest.mark.slow
@pytest.mark.parametrize("item", _runnable("python") + _runnable("bash"), ids=lambda i: f"{i[0]}:{i[1]['line']}")
def test_code_blocks_of_the_docs_run(project: Path, item):
    where, block = item
    runner = run_python if block["lang"] == "python" else run_bash
    runner(block, project, f"{where}:{block['line']}")
