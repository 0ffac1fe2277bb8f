"""One settings object reads every ``BANDPILOT_*`` variable (bandpilot.config.settings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bandpilot.config import ENV_NAMES, Settings, project_root, settings
from bandpilot.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
# Files allowed to read BANDPILOT_* themselves (none: every read goes through bandpilot.config.settings).
PENDING: set[str] = set()


def test_defaults_and_parsing(monkeypatch, tmp_path):
    for name in ENV_NAMES.values():
        monkeypatch.delenv(name, raising=False)
    assert settings() == Settings()
    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("BANDPILOT_API_THREADS", " 3")
    monkeypatch.setenv("BANDPILOT_TASK_RUNNER", "Dask")
    s = settings()
    assert (s.home, s.api_threads, s.task_runner) == ((tmp_path / "h").resolve(), 3, "dask")
    assert project_root() == (tmp_path / "h").resolve()
    assert settings() is s  # parsed once for the same values


@pytest.mark.parametrize("name,value", [("BANDPILOT_API_THREADS", "many"), ("BANDPILOT_API_THREADS", "0"),
                                        ("BANDPILOT_DISPATCH_S", "-1"),
                                        ("BANDPILOT_DISPATCH_S", "nan"), ("BANDPILOT_API_MAX_PENDING", "-2")])
def test_bad_value_names_the_variable_where_it_is_read(monkeypatch, tmp_path, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    assert project_root() == tmp_path.resolve()  # other settings (every command's set-up) still work
    with pytest.raises(SpecError, match=re.escape(name)) as exc:
        getattr(settings(), name.removeprefix("BANDPILOT_").lower())
    assert "\n" not in str(exc.value)


def test_variables_are_documented_and_read_in_one_place():
    documented = (ROOT / "docs" / "operator" / "configuration.md").read_text()
    assert all(f"`{name}`" in documented for name in ENV_NAMES.values())
    readers = set()
    for path in (ROOT / "bandpilot").rglob("*.py"):
        text = path.read_text()
        if re.search(r"(environ(\.get)?\(|getenv\(|_env_\w*\()\s*[\"']BANDPILOT_", text) or re.search(r"_ENV\s*=\s*\"BANDPILOT_", text):
            readers.add(str(path.relative_to(ROOT)))
    assert readers <= PENDING, sorted(readers - PENDING)
