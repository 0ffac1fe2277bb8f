"""Shared CLI helpers."""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=False)
err_console = Console(stderr=True)
