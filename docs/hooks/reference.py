"""MkDocs hooks: ``bandpilot``'s click command for mkdocs-click, and Sphinx roles shown as code.

The CLI's commands register themselves on the typer app when their modules are imported (and the Prefect flows
add ``pipeline``, ``serve`` and ``stage`` through the ``bandpilot.commands`` entry point), so the full command
tree exists only after :func:`bandpilot.cli.main._load_commands`. This hook builds it once, as ``bandpilot`` does
at start-up, and publishes the click command as ``bandpilot_cli_reference.command`` for
``docs/reference/cli.md``."""

from __future__ import annotations

import re
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


# The docstrings use Sphinx roles (:class:`~a.b.C`, :func:`f`); mkdocstrings renders the role's name literally.
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]+)</code>")


def _role(m: re.Match) -> str:
    tilde, target = m.group(1), m.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs) -> str:
    """Show a Sphinx role as its code name (``~`` keeps the last component, as Sphinx does)."""
    return _ROLE.sub(_role, html)
