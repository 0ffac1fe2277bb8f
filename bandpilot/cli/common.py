"""Shared CLI helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bandpilot.errors import RequestError


def __getattr__(name: str) -> Any:
    """``console`` and ``err_console`` (rich), made on first use: importing rich cost `bandpilot api`
    ~0.07 s of start-up, and it prints nothing with them."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    class PipeConsole(Console):
        """Lines of text are not wrapped when the output is not a terminal (rich wraps at 80 columns
        there): a script reading ``select``'s output gets one line per line printed."""

        def print(self, *objects: Any, soft_wrap: bool | None = None, **kw: Any) -> None:
            if soft_wrap is None and not self.is_terminal and all(isinstance(o, str) for o in objects):
                soft_wrap = True
            super().print(*objects, soft_wrap=soft_wrap, **kw)

    value = PipeConsole(stderr=name == "err_console")
    globals()[name] = value
    return value


def store_url(value: str | None) -> str | None:
    """A store URL from what a person types: URLs as they are; a plain file path (``q.db``,
    ``~/q.db``) is an absolute SQLite URL; a relative ``sqlite:///`` path is made absolute, so
    messages say exactly which file is meant."""
    if not value:
        return value
    if "://" not in value:
        return f"sqlite:///{Path(value).expanduser().resolve()}"
    if value.startswith("sqlite:///") and value != "sqlite:///:memory:":
        path = value.removeprefix("sqlite:///")
        if path and not path.startswith("/") and "?" not in path:
            return f"sqlite:///{Path(path).expanduser().resolve()}"
    return value


def cli_store(url: str | None, *, create: bool = False) -> Any:
    """The queue store a command names (``--store``/``$BANDPILOT_STORE``/the project default).
    Only ``cluster init`` creates one: every other command needs an existing store and says how
    to make one instead of leaving an empty database behind."""
    from bandpilot.queue import Store

    return Store(store_url(url), create=create)


def echo_json(doc: Any) -> None:
    """``--json`` output: indented, anything not JSON (a path, a time) as its string."""
    import json

    import typer

    typer.echo(json.dumps(doc, indent=2, default=str))


def shape_flags(shape: str | None, traffic: str | None, compute_ms: float | None):
    """The --shape with its --traffic / --compute-ms, parsed once (None without --shape); used by
    ``select`` and ``queue submit``."""
    if shape is None:
        if traffic is not None or compute_ms is not None:
            raise RequestError("--traffic and --compute-ms need --shape")
        return None
    from bandpilot.dispatch.shape import Shape, parse_traffic

    doc = Shape.parse(shape, "--shape").to_dict()
    if traffic is not None:
        doc["traffic"] = parse_traffic(traffic, "--traffic")
    if compute_ms is not None:
        doc["compute_ms"] = compute_ms
    return Shape.parse(doc, "--shape")
