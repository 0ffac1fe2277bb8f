"""``bandpilot calibrate DIR``: fit the emulator to a measurement directory and report the fit."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bandpilot.cli import common
from bandpilot.cli.main import app


@app.command()
def calibrate(
    directory: Path = typer.Argument(..., help="measurement directory (cluster.yaml + intra tables [+ inter table])"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the fitted `emulator:` YAML block here"),
    gpu: Optional[list[str]] = typer.Option(None, "--gpu", help="fit only these GPU types (repeatable; skips the network)"),
) -> None:
    """Fit emulator parameters to measured tables; print per-table MAPE / Spearman / max error."""
    from rich.table import Table

    from bandpilot.fabric.calibration import calibrate as run

    res = run(directory, gpu_types=gpu or None)
    table = Table(title=f"calibration of {res.cluster} ({res.seconds:.1f} s)")
    table.add_column("table", no_wrap=True)
    table.add_column("host", no_wrap=True)
    for col in ("n", "MAPE %", "Spearman", "max err %"):
        table.add_column(col, justify="right", no_wrap=True)
    for t in res.tables:
        who = t.host or "network"
        table.add_row(t.table, who, str(t.patterns), f"{t.mape:.1f}", f"{t.spearman:.3f}", f"{t.max_error:.0f}")
    common.console.print(table)
    text = res.to_yaml()
    if out is None:
        common.console.print(text, markup=False, highlight=False)
        return
    from bandpilot.io import write_text_atomic

    write_text_atomic(out, text)
    common.console.print(f"wrote {out}")
