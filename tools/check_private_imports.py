"""No module reaches into another module's private names (run by ``make lint``).

A leading underscore says "this module's own": ``from bandpilot.x.y import _helper`` or
``y._helper`` in another module couples the two through a name neither promised to keep, so a
split by size leaks its seams. A private *module* (``flows/_common.py``) may serve its own package;
a name it holds that others use is public there (no underscore).

    python tools/check_private_imports.py            # exit 1 and one line per offence, if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bandpilot", "flows")
#: Offences tolerated while code that has them is being rewritten elsewhere, as "path: module.name";
#: an entry that no longer occurs fails the check, so the list only shrinks. Empty: keep it so.
PENDING_REWRITE: frozenset[str] = frozenset()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str | None, level: int, here: str, is_package: bool) -> str:
    if not level:
        return module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def offences(path: Path, root: Path = ROOT) -> list[str]:
    """``module.name`` of every private name ``path`` (a module under ``root``) takes from another
    project module."""
    here = _module_of(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> project module imported under it
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = _absolute(node.module, node.level, here, path.name == "__init__.py")
            if src.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                if _private(alias.name) and src != here:
                    found.append(f"{src}.{alias.name}")
                elif not _private(alias.name):
                    modules[alias.asname or alias.name] = f"{src}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):  # ``mod._name`` on an imported project module
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                and node.value.id in modules and modules[node.value.id] != here):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return sorted(set(found))


def check(root: Path = ROOT, allowed: frozenset[str] = PENDING_REWRITE) -> list[str]:
    """One line per offence not allowed, and per allowed one that is gone."""
    seen: set[str] = set()
    bad: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for name in offences(path, root):
                key = f"{rel}: {name}"
                seen.add(key)
                if key not in allowed:
                    bad.append(f"{key}: private name of another module (make it public there, or move the code)")
    bad += [f"{key}: no longer occurs, drop it from PENDING_REWRITE" for key in sorted(allowed - seen)]
    return bad


def main() -> int:
    bad = check()
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
