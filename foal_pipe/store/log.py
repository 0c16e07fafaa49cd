"""The store's writer lock and its sidecar run log: what varies from run to run stays out of the store."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from foal_pipe.io import write_json
from foal_pipe.io.pathtext import path_text
from foal_pipe.store.lock import exclusive_lock
from foal_pipe.store.meta import LOG_SUFFIX, writing

_HELD: dict[Path, tuple[int, int]] = {}
"""The lock files this process holds as a writer, by path: their device and inode (see :func:`close_inherited_locks`)."""


@contextmanager
def writer_lock(path: str | Path) -> Iterator[Path]:
    """The exclusive lock every writer of the store at ``path`` holds (``<path>.lock``; see foal_pipe.store.lock)."""
    with exclusive_lock(path, f"feature store {path}") as lock:
        st = os.stat(lock)
        _HELD[lock] = (st.st_dev, st.st_ino)
        try:
            yield lock
        finally:
            _HELD.pop(lock, None)


def close_inherited_locks() -> None:
    """In a process forked by a writer (a loader's worker): close its copies of the writer's lock descriptors. The
    kernel drops a ``flock`` once every copy is closed, so a worker that outlived a killed writer would hold the
    lock until it noticed; closing (not unlocking, which would free the writer's too) leaves the writer's held."""
    held = set(_HELD.values())
    if not held:
        return
    fds = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for name in os.listdir(fds):
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):  # the listing's own descriptor, closed by now
            continue
        if (st.st_dev, st.st_ino) in held:
            os.close(int(name))


def log_path(path: str | Path) -> Path:
    """``<store>.log.json`` beside the store: timestamps, durations, host, device and versions of each run."""
    return Path(str(path) + LOG_SUFFIX)


def read_log(path: str | Path) -> dict[str, Any] | None:
    """The store's run log, or None when there is none or it is unreadable (it is informational only)."""
    try:
        log = json.loads(log_path(path).read_text())
    except (OSError, ValueError):
        return None
    return log if isinstance(log, dict) and isinstance(log.get("runs"), list) else None


def log_run(path: str | Path, entry: dict[str, Any], fresh: bool = False) -> None:
    """Append a run to the store's log (a new log when ``fresh``: the store was just created)."""
    log = None if fresh else read_log(path)
    log = log or {"store": path_text(Path(path).name), "runs": []}
    log["runs"].append(entry)
    with writing(Path(path), "the run log"):
        write_json(log_path(path), log)


def update_run(path: str | Path, fields: dict[str, Any]) -> None:
    """Add ``fields`` to the last run of the store's log."""
    log = read_log(path) or {"store": path_text(Path(path).name), "runs": [{}]}
    log["runs"][-1] = {**log["runs"][-1], **fields}
    with writing(Path(path), "the run log"):
        write_json(log_path(path), log)
