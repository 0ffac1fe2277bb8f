"""The code speaks of the product, not of its history: no issue numbers, benchmark seed numbers or
numbered experiment rounds in the library or the orchestration layer (the experiments log keeps the
history; a measured figure names the benchmark command that reproduces it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bandpilot", "flows")
#: "issue 21", "README issue 22", "issue #7", "Issue 24 item 3"; "seeds 8-15", "seed 001's";
#: "Ninth round" and the like
HISTORY = re.compile(
    r"\bissue\s*#?\d+|\bseeds?\s+\d+|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|thirteenth|fourteenth|fifteenth)\s+round\b",
    re.IGNORECASE,
)
#: Files being rewritten on another branch (the scheduler's profile work); remove each entry when
#: that branch lands. An entry whose file is clean fails the test, so the list only shrinks.
PENDING_REWRITE: frozenset[str] = frozenset()


def history_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) of every history mention in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in HISTORY.finditer(text)]


def test_the_pattern_catches_history_and_spares_product_words():
    text = "x = 1  # README issue 22\n# (issue #7) and Issue 24 item 3\n# the Ninth round: hrrn, seeds 8-15\n"
    assert [(n, w) for n, w in history_mentions(text)] == [
        (1, "issue 22"), (2, "issue #7"), (2, "Issue 24"), (3, "Ninth round"), (3, "seeds 8")]
    assert history_mentions("Seed 001's 50 jobs") == [(1, "Seed 001")]
    assert history_mentions("a refinement round; rounds = 2; round(x, 3); an issue with k; a seed; issues") == []


def test_no_issue_numbers_or_numbered_rounds_in_the_code():
    found: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*")):
            if path.suffix not in (".py", ".html", ".yaml", ".yml") or not path.is_file():
                continue
            hits = history_mentions(path.read_text(encoding="utf-8"))
            if hits:
                found[path.relative_to(ROOT).as_posix()] = [f"line {n}: {w!r}" for n, w in hits]
    unexpected = {f: h for f, h in found.items() if f not in PENDING_REWRITE}
    assert not unexpected, "history in the code (say the why in product terms): " + "; ".join(
        f"{f} {', '.join(h)}" for f, h in unexpected.items())
    stale = sorted(PENDING_REWRITE - found.keys())
    assert not stale, f"clean now, drop from PENDING_REWRITE: {', '.join(stale)}"


def _help_texts(path: Path) -> list[str]:
    """What ``--help`` shows of a benchmark: its docstring's first line (the description) and the
    ``help=`` strings of its options."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    texts = [doc.split("\n")[0]] if doc else []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "help" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    texts.append(kw.value.value)
    return texts


def test_no_history_in_the_benchmarks_help():
    found = {p.name: hits for p in sorted((ROOT / "benchmarks").glob("*.py"))
             if (hits := [w for t in _help_texts(p) for _, w in history_mentions(t)])}
    assert not found, f"history in a benchmark's --help: {found}"
