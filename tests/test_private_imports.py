"""No module takes another module's private names (``tools/check_private_imports.py``, also run by
``make lint``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_private_imports", ROOT / "tools" / "check_private_imports.py")
assert _spec is not None and _spec.loader is not None
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)


def test_the_check_finds_each_way_of_reaching_a_private_name(tmp_path):
    pkg = tmp_path / "bandpilot" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from bandpilot.sub.own import _kept_in_package\n")
    (pkg / "own.py").write_text("_kept_in_package = 1\n_x = 2\n")
    (pkg / "user.py").write_text(
        "import bandpilot.sub.own as own_mod\n"
        "from bandpilot.sub import own\n"
        "from bandpilot.sub.own import _x, public\n"
        "from .own import _rel\n"
        "from typer import _click\n"  # not ours
        "_mine = 1\n"
        "y = own._attr + own_mod._other + own.public + _mine\n"
    )
    assert checker.offences(pkg / "user.py", tmp_path) == [
        "bandpilot.sub.own._attr", "bandpilot.sub.own._other", "bandpilot.sub.own._rel", "bandpilot.sub.own._x"]
    # a package's __init__ re-exporting its own module's name is still another module's private name
    assert checker.offences(pkg / "__init__.py", tmp_path) == ["bandpilot.sub.own._kept_in_package"]
    allowed = frozenset({"bandpilot/sub/__init__.py: bandpilot.sub.own._kept_in_package", "bandpilot/gone.py: a._b"})
    bad = checker.check(tmp_path, allowed)
    assert len(bad) == 5 and bad[-1].startswith("bandpilot/gone.py: a._b: no longer occurs")


def test_no_cross_module_private_names_in_the_code():
    assert checker.check() == []
