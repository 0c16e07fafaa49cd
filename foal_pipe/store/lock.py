"""An exclusive writer lock: a file beside what it guards, naming the holder's pid and host.

Exclusivity comes from ``flock`` on the lock file, which the kernel releases when the holder dies (SIGKILL
included), so a dead holder's lock is taken over without any clean-up. Where the filesystem has no ``flock``,
the pid in the file decides: a lock whose holder is not alive on this host is taken over. The pid and host
are also what the refusal names, so a user knows whom to wait for.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from foal_pipe.durable import pid_alive
from foal_pipe.errors import FoalPipeError, limit_fix, param

LOCK_SUFFIX = ".lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def lock_path(path: str | Path) -> Path:
    """The lock file guarding ``path``: ``<path>.lock`` beside it (so it survives ``path`` being swapped)."""
    return Path(str(path) + LOCK_SUFFIX)


def _holder() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.now(UTC).isoformat(timespec="seconds")}


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, object]) -> str:
    if not holder:
        return "another process"
    since = f" since {holder['since']}" if holder.get("since") else ""
    return f"process {holder.get('pid')} on host {holder.get('host')}{since}"


def _alive_here(holder: dict[str, object]) -> bool:
    """Whether the recorded holder is a live process of this host (unknown hosts count as alive)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname():
        return bool(holder)
    if type(pid) is not int or pid == os.getpid():
        return False
    try:
        since = datetime.fromisoformat(str(holder.get("since"))).timestamp()
    except ValueError:
        since = None
    return pid_alive(pid, since)


def _open(lock: Path) -> tuple[int, bool]:
    """A descriptor of ``lock``, created if need be, and whether this call created it."""
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644), False


def _acquire(lock: Path, what: str) -> tuple[int, bool]:
    """An open descriptor of ``lock`` holding the exclusive lock, and whether this call created the file; or a
    refusal naming the holder."""
    while True:
        fd, created = _open(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise FoalPipeError(f"{what} is being written by {_describe(holder)} (lock file {lock}); wait for it "
                                "to finish or stop it, then re-run") from None
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            holder = _read_holder(fd)  # no flock here: trust the pid
            if _alive_here(holder):
                os.close(fd)
                raise FoalPipeError(f"{what} is being written by {_describe(holder)} (lock file {lock}); wait for "
                                    f"it to finish, or delete {lock} if that process is gone") from None
            return fd, created
        try:  # a holder releasing the lock unlinks the file: make sure ours is still the one at `lock`
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd, created
        except FileNotFoundError:
            pass
        os.close(fd)


def _lock_error(verb: str, lock: Path, exc: OSError) -> FoalPipeError:
    """Why the lock file could not be created or written, and the fix: the limit the process ran into
    (:data:`~foal_pipe.errors.LIMIT_FIXES`), else a writable place."""
    code = errno.errorcode.get(exc.errno or 0)
    fix = limit_fix(exc, f"choose a writable location ({param('out')})")
    return FoalPipeError(f"cannot {verb} the lock file {lock}: {exc.strerror or exc}{f' ({code})' if code else ''}; {fix}")


def _file_above(path: Path) -> Path | None:
    """The nearest existing parent of ``path`` if it is not a directory (a file), else None."""
    for parent in path.parents:
        if os.path.lexists(parent):
            return None if parent.is_dir() else parent
    return None


@contextmanager
def exclusive_lock(path: str | Path, what: str | None = None) -> Iterator[Path]:
    """Hold the writer lock of ``path`` (``<path>.lock``) for the body; refused while another process holds it.

    Yields the lock file's path. An unwritable place (read-only filesystem, no permission) is refused here,
    before any work, with a one-line :class:`FoalPipeError`.
    """
    path = Path(path)
    lock = lock_path(path)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd, created = _acquire(lock, what or str(path))
    except OSError as exc:
        blocked = _file_above(lock)
        if blocked is not None:  # mkdir would only say "File exists"
            raise FoalPipeError(f"cannot write {path}: {blocked} is a file, not a directory; choose another "
                                f"{param('out')}") from None
        raise _lock_error("create", lock, exc) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
    except OSError as exc:
        try:
            if created:  # ours alone (we hold its flock): nothing of this run is left behind
                lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
        raise _lock_error("write", lock, exc) from None
    try:
        yield lock
    finally:
        try:
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
