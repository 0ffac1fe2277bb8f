"""MkDocs hook: makes ``bandpilot``'s click command importable for mkdocs-click.

The CLI's commands register themselves on the typer app when their modules are imported (and the Prefect flows
add ``pipeline``, ``serve`` and ``stage`` through the ``bandpilot.commands`` entry point), so the full command
tree exists only after :func:`bandpilot.cli.main._load_commands`. This hook builds it once, as ``bandpilot`` does
at start-up, and publishes the click command as ``bandpilot_cli_reference.command`` for
``docs/reference/cli.md``."""

from __future__ import annotations

import sys
import types


def _command():
    import typer

    from bandpilot.cli import main

    main._load_commands([])
    return typer.main.get_command(main.app)


_module = types.ModuleType("bandpilot_cli_reference")
_module.command = _command()
sys.modules["bandpilot_cli_reference"] = _module
