"""Prefect 3 flows: thin wrappers over BandPilot library functions.

ingest -> retrain (train, optional sweep, evaluate, promotion gate) -> dispatch, plus
``evaluate`` on its own and :mod:`flows.pipeline`, the main job. Each flow is also a plain
function of its library calls, so ``dvc repro`` and the CLI reach the same code.
"""

from bandpilot.config import setup_env as _setup_env

# Prefect reads its settings when it is imported: quiet, offline defaults must come first.
_setup_env()
