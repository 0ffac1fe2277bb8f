"""``bandpilot`` entry point. Command modules in this package register themselves on :data:`app`.

Every command is a thin wrapper over a library function; expected failures
(:class:`~bandpilot.errors.BandPilotError`) print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer

from bandpilot.config import setup_env
from bandpilot.errors import BandPilotError

app = typer.Typer(
    name="bandpilot",
    help="BandPilot: learn a GPU bandwidth model from nccl-tests data and dispatch GPU requests with it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help (bandpilot/cli/style.py says why)
)

_SKIP = {"main", "__init__", "common", "style", "reporting"}
#: Commands whose start-up time is a target, and the one module that defines each: `bandpilot api`
#: loads only it (the other command modules' imports cost ~0.3 s on a busy machine, measured).
OWN_MODULE = {"api": "api"}


def _load_commands(argv: list[str] | None = None) -> None:
    import bandpilot.cli as pkg
    from bandpilot.cli.style import click_style

    first = next((a for a in argv if not a.startswith("-")), None) if argv else None
    if first in OWN_MODULE:
        importlib.import_module(f"bandpilot.cli.{OWN_MODULE[first]}")
        click_style(app)
        return

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if mod not in _SKIP:
            importlib.import_module(f"bandpilot.cli.{mod}")
    # Command groups contributed by other installed packages (the Prefect flows add
    # ``pipeline`` and ``serve``): the library never imports its orchestration layer.
    from importlib.metadata import entry_points

    for ep in entry_points(group="bandpilot.commands"):
        ep.load()(app)
    click_style(app)


def _click_errors() -> tuple[type[BaseException], ...]:
    """typer 0.29 raises its vendored click's exceptions, which are not ``click.ClickException``s."""
    import click

    kinds: list[type[BaseException]] = [click.ClickException]
    try:
        from typer._click.exceptions import ClickException as VendoredClickException

        kinds.append(VendoredClickException)
    except ImportError:  # pragma: no cover - typer without a vendored click
        pass
    return tuple(kinds)


def _asks_for_help(args: list[str]) -> bool:
    """Help only (no arguments, or ``--help`` anywhere): nothing runs, so nothing is created."""
    return not args or "--help" in args


def main(argv: list[str] | None = None) -> int:
    # MLflow logs INFO lines (schema creation, run links) into a command's output; warnings still show.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    args = argv if argv is not None else sys.argv[1:]
    setup_env(create=not _asks_for_help(args))
    _load_commands(args)
    from bandpilot import progress
    from bandpilot.cli.reporting import make_reporter

    try:
        # Long work reports its stages (bandpilot.progress) on stderr: lines, or bars on a terminal.
        # Non-standalone mode hands `raise typer.Exit(n)` back as the return value.
        with progress.use(make_reporter()):
            rc = app(args=args, prog_name="bandpilot", standalone_mode=False)
    except BandPilotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except Exception as exc:  # usage errors: click's message, exit 2
        if isinstance(exc, _click_errors()):
            exc.show()
            return exc.exit_code
        raise
    return int(rc or 0) if isinstance(rc, int) else 0


if __name__ == "__main__":  # pragma: no cover
    # Under ``python -m`` this file runs as __main__ with its own ``app``; command modules
    # register on ``bandpilot.cli.main.app``, so hand over to the imported module.
    from bandpilot.cli.main import main as _main

    sys.exit(_main())
