"""Checkpoint hashes recorded once: a checkpoint's SHA-256 keyed by what the file system says of it (resolved
path, size, modification and change times in nanoseconds, inode), so a later ``extract`` or ``predict --images``
of the same file takes the record instead of reading gigabytes again.

The record is an optimisation, never a source of truth: the weights' bytes are hashed again as they are loaded
and must match it (:func:`~foal_pipe.encoders.weights.read_state_dict`), and a mismatch drops the record. As git
does for its index, a file modified within :data:`SETTLE_SECONDS` of being hashed is not recorded (a rewrite in
the same clock tick could keep its times), and the change time cannot be set back by a user. The records live in
``$FOAL_PIPE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/foal-pipe``, else ``~/.cache/foal-pipe``), in one JSON file;
a folder that cannot be written only means hashing again, and so does a process with no home directory to find it
in (no ``HOME`` and no passwd entry, as ``docker run --user UID`` gives) and neither variable set.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_VARIABLE = "FOAL_PIPE_CACHE_DIR"
RECORDS = "checkpoint-sha256.json"
SETTLE_SECONDS = 2.0


def cache_dir() -> Path | None:
    """Where foal-pipe keeps what it computed once (see the module's docstring); None where that names a home
    directory and the process has none (``Path.home()`` raises RuntimeError): the records are skipped."""
    try:
        if os.environ.get(CACHE_VARIABLE):
            return Path(os.environ[CACHE_VARIABLE]).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base).expanduser() / "foal-pipe"
    except RuntimeError:
        return None


def _key(path: Path) -> tuple[str, dict[str, int]]:
    info = path.stat()
    return str(path.resolve()), {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns,
                                 "inode": info.st_ino}


def _load() -> dict[str, Any]:
    folder = cache_dir()
    if folder is None:
        return {}
    try:
        records = json.loads((folder / RECORDS).read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _save(records: dict[str, Any]) -> None:
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".records-", delete=False) as f:
            json.dump(records, f, indent=1, sort_keys=True)
        os.replace(f.name, folder / RECORDS)
    except OSError:
        pass  # an unwritable cache: the next command hashes again


def recorded(path: Path) -> str | None:
    """The recorded SHA-256 of ``path`` while its size, times and inode are those recorded, else None."""
    name, stat = _key(path)
    entry = _load().get(name)
    if isinstance(entry, dict) and entry.get("stat") == stat and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    return None


def hashed(path: Path, sha256_of: Callable[[Path], str]) -> str:
    """``sha256_of(path)``, recorded when the file did not change while it was hashed and was last modified more
    than :data:`SETTLE_SECONDS` before."""
    before = _key(path)
    sha256 = sha256_of(path)
    name, stat = _key(path)
    if (name, stat) == before and time.time_ns() - stat["mtime_ns"] >= SETTLE_SECONDS * 1e9:
        records = _load()
        records[name] = {"stat": stat, "sha256": sha256}
        _save(records)
    return sha256


def forget(path: Path) -> None:
    """Drop the record of ``path`` (its bytes did not match it)."""
    records = _load()
    if records.pop(str(path.resolve()), None) is not None:
        _save(records)
