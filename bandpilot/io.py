"""Small atomic file writers: write a temp file beside the target, flush it to disk, then rename.

Why: a crash or a full disk must leave either the old file or the new one, never half of it. The
temporary file or directory gets the mode an ordinary ``open``/``mkdir`` would give it under the
process umask (``tempfile`` makes them private, 0600/0700): a ``topology.conf`` or a report that
slurmctld or a colleague cannot read is no use.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (``/proc/self/status``);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_file_beside(path: Path) -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``path``'s directory, with the mode a new file gets under the umask."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, tmp


def temp_dir_beside(path: Path) -> Path:
    """``tempfile.mkdtemp`` in ``path``'s directory, with the mode a new directory gets under the umask:
    the directory is renamed into place whole, so its mode is the one readers see."""
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


@contextmanager
def replaced_dir(dest: str | Path) -> Iterator[Path]:
    """A new directory for ``dest`` to fill in the block: built beside it with the umask's mode, then
    swapped in whole (the old one removed) when the block ends; on an error ``dest`` is as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(dest)
    try:
        yield tmp
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file_beside(path)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, doc: Any) -> Path:
    """JSON with non-finite floats as null (JSON has no NaN; DVC and browsers choke on it)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return write_text_atomic(path, json.dumps(clean(doc), indent=2, sort_keys=True) + "\n")
