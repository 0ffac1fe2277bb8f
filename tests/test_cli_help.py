"""Issue 26 item 8: every ``--help`` reads like click's own tools (no typer type tags, no braces,
no cut text), one output-option convention, ``dispatch`` without a mandatory ``--batch``."""

from __future__ import annotations

import re

import pytest

from bandpilot.cli.main import _load_commands, app, main


def _paths() -> list[list[str]]:
    import typer.main

    _load_commands()
    out: list[list[str]] = []

    def walk(cmd, path):
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


PATHS = _paths()


def _help(path: list[str], capsys) -> str:
    assert main([*path, "--help"]) == 0
    return capsys.readouterr().out


def test_every_command_is_walked():
    names = {" ".join(p) for p in PATHS}
    assert {"select", "queue status", "cluster topology", "dispatch", "verify"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "bandpilot")
def test_help_reads_like_click(path, capsys):
    text = _help(path, capsys)
    assert text.startswith(f"Usage: bandpilot {' '.join(path)}".rstrip() + " ")
    for bad in ("<bool>", "<int>", "<str>", "<path>", "<float>", "{", "…", "╭", "│"):
        assert bad not in text, f"{bad!r} in `bandpilot {' '.join(path)} --help`:\n{text}"
    assert not re.search(r"(--[\w-]+|^\s+[a-z_]+\.*) <[\w\[\] |]+>", text, re.M), text  # typer's type tags
    usage = text.splitlines()[0]
    assert usage == usage.rstrip() and "[OPTIONS]" in usage
    # No summary cut off with click's "...": only variadic metavars (JOBS..., [ARGS]...) end that way.
    for line in text.splitlines():
        assert not line.endswith("...") or re.search(r"[A-Z\]]\.\.\.$", line), line
    assert "--batch" not in text, f"`bandpilot {' '.join(path)} --help` names dispatch's hidden --batch flag"


def test_flags_are_untyped_and_types_are_click_names(capsys):
    text = _help(["select"], capsys)
    assert re.search(r"^\s+--single-host\s{2,}All K GPUs", text, re.M), text
    assert re.search(r"--seed INTEGER\s", text) and re.search(r"-s, --state PATH\s", text), text
    assert "Usage: bandpilot select [OPTIONS] K" in text


def test_command_list_keeps_whole_summaries(capsys):
    text = _help([], capsys)
    assert "Paper Sec. V evaluation" in text
    flat = " ".join(text.split())
    assert "nightly retrain, frequent dispatch" in flat


@pytest.mark.slow
def test_one_output_option_convention():
    import typer.main

    _load_commands()
    seen = []
    for path in PATHS:
        cmd = typer.main.get_command(app)
        for name in path:
            cmd = cmd.commands[name]
        for p in getattr(cmd, "params", []):
            if p.name in ("out", "output") and not p.hidden:
                seen.append((" ".join(path), sorted(p.opts)))
    assert seen
    for where, opts in seen:
        assert opts == ["--out", "-o"], (where, opts)


def test_old_output_spelling_still_works(tmp_path, capsys):
    dest = tmp_path / "topo.txt"
    assert main(["cluster", "topology", "--cluster", "h100", "--output", str(dest)]) == 0
    assert dest.read_text().strip()


def test_dispatch_needs_no_batch_flag(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert main(["cluster", "init", "--cluster", "h100", "--store", url]) == 0
    capsys.readouterr()
    assert main(["dispatch", "--store", url]) == 0
    assert "no batch" in capsys.readouterr().out
    assert main(["dispatch", "--batch", "--store", url]) == 0  # the old spelling keeps working


def test_api_help_names_the_dispatch_command(capsys):
    flat = " ".join(_help(["api"], capsys).split())
    assert "when `bandpilot serve` or `bandpilot dispatch` assigns instead" in flat, flat


def test_inject_file_keys_are_documented(capsys):
    text = _help(["verify"], capsys)
    for key in ("kind", "host", "gpu", "peer", "factor", "nvlink_width", "nvlink_pair", "nic_rail", "slow_host",
                "missing_gpu"):
        assert re.search(rf"\b{key}\b", text), key
    assert "  - kind: nvlink_width\n" in text  # the example keeps its layout


def test_every_visible_parameter_says_what_it_is():
    import typer.main

    _load_commands()
    bare = []

    def walk(cmd, path):
        for p in getattr(cmd, "params", []):
            if not p.hidden and not getattr(p, "help", None) and p.name != "help":
                bare.append((" ".join(path), p.name))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    assert bare == []


def test_the_api_command_starts_without_the_other_command_modules():
    """`bandpilot api` imports only its own command module (start-up time, issue 25); the module in
    OWN_MODULE really defines the command."""
    import subprocess
    import sys

    code = ("import sys; from bandpilot.cli.main import OWN_MODULE, _load_commands, app; _load_commands(['api', '--port', '1']); "
            "assert [c.name for c in app.registered_commands] == ['api'], app.registered_commands; "
            "assert 'bandpilot.cli.queue' not in sys.modules and 'bandpilot.scheduling' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
