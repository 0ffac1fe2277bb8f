"""Help that reads like click's own tools.

Why this exists: typer 0.29 renders help its own way - rich boxes that cut text with "…" and keep a
docstring's hard line breaks, a ``<bool>`` tag on every flag, ``<int>``/``<path>`` tags on options
and ``{k}`` for required positionals. :func:`click_style` switches every command of a typer app to
click's plain layout (text re-wrapped, ``--seed INTEGER``, flags untyped, positionals ``K``) and
lists subcommands with their whole first paragraph instead of click's truncated short help.
"""

from __future__ import annotations

import re
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

try:  # typer >= 0.24 vendors click; older typers use click itself
    from typer import _click as click_mod
except ImportError:  # pragma: no cover
    import click as click_mod

# typer's type labels -> click's metavars
_TYPE_NAMES = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "bool": "BOOLEAN", "path": "PATH",
               "file": "FILE", "directory": "DIRECTORY", "datetime": "DATETIME", "int range": "INTEGER RANGE",
               "float range": "FLOAT RANGE", "UUID": "UUID"}


def _type_label(param: Any, ctx: Any) -> str:
    if param.metavar:
        return str(param.metavar)
    raw = param.display_type(ctx)
    raw = raw[1:-1] if raw.startswith("<") and raw.endswith(">") else raw
    raw = re.sub(r"^list\[(.*)\]$", r"\1", raw)
    if "|" in raw:  # choices
        return f"[{raw}]"
    return _TYPE_NAMES.get(raw, raw.upper())


def _argument_name(param: Any) -> str:
    name = str(param.metavar or param.name).upper()
    if param.nargs != 1:
        name += "..."
    return name if param.required else f"[{name}]"


def _option_name(param: Any, ctx: Any) -> str:
    def opts(decls: list[str]) -> str:
        text, _ = click_mod.formatting.join_options(decls)
        if not param.is_flag and not param.count:
            text += " " + _type_label(param, ctx)
        return text

    names = [opts(param.opts)]
    if param.secondary_opts:
        names.append(opts(param.secondary_opts))
    return " / ".join(names)


def _first_paragraph(cmd: Any) -> str:
    if cmd.short_help:
        return " ".join(cmd.short_help.split())
    return " ".join((cmd.help or "").split("\n\n")[0].split())


class ClickStyleCommand(TyperCommand):
    """A typer command whose help is click's plain layout with click's metavars."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [_argument_name(p) for p in self.get_params(ctx) if isinstance(p, TyperArgument)]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args, opts = [], []
        for p in self.get_params(ctx):
            rec = p.get_help_record(ctx)
            if rec is None:
                continue
            if isinstance(p, TyperArgument):
                args.append((_argument_name(p).strip("[]"), rec[1]))
            else:
                opts.append((_option_name(p, ctx), rec[1]))
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)


class ClickStyleGroup(TyperGroup):
    """A typer group listing its subcommands with their whole summary (click cuts at ~45 characters)."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, _first_paragraph(cmd)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def click_style(app: typer.Typer) -> None:
    """Give every command and group of ``app`` (recursively) the click-style help classes.
    Classes a command sets explicitly are kept. Idempotent."""
    app.rich_markup_mode = None
    if _unset(app.info.cls):
        app.info.cls = ClickStyleGroup
    for info in app.registered_commands:
        if _unset(info.cls):
            info.cls = ClickStyleCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            click_style(group.typer_instance)


def _unset(value: Any) -> bool:
    from typer.models import DefaultPlaceholder

    # typer fills in its own base classes as defaults: those are "unset" too
    return value is None or value in (TyperCommand, TyperGroup) or isinstance(value, DefaultPlaceholder)
