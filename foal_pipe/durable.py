"""The steps that atomic outputs (:mod:`foal_pipe.io`) build on, so that a kill or a power loss leaves nothing half-done:
signals held while a temporary is made or removed, files and folders flushed to the disk, a folder locked, the
permissions of a replaced output kept, and whether a temporary's writer still runs."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Set when a stop's KeyboardInterrupt was swallowed: raised inside a ``__del__`` or a weakref callback, Python prints
#: it and goes on (the command line's ``sys.unraisablehook`` records it).
_swallowed = threading.Event()


def swallowed_stop() -> None:
    """Record a stop that a finaliser swallowed, for :func:`raise_swallowed_stop`."""
    _swallowed.set()


def raise_swallowed_stop() -> None:
    """Raise, in the main thread, the KeyboardInterrupt of a stop that a finaliser swallowed, once: the run then
    unwinds as from any stop, before an output replaces the previous one or the next chunk of a store is written."""
    if _swallowed.is_set() and threading.current_thread() is threading.main_thread():
        _swallowed.clear()
        raise KeyboardInterrupt


#: Seconds by which a process must have started after a temporary's change time to count as another process that
#: the system gave a dead writer's id: a margin for /proc/stat's whole-second boot time and for the wall clock being
#: stepped while a writer runs (its start, counted from boot, would seem later), beyond which a reused id is the
#: usual case (a restarted container numbers its processes from 1 again).
_START_SLACK = 60.0


def pid_alive(pid: int, since: float | None = None) -> bool:
    """Whether a process with this id runs on this host (one we may not signal counts as running). ``since``: the last
    change time of what the process made (its temporary's ``st_ctime``); a process with this id that started later is
    another one, given the id after the maker died, so the maker counts as gone (where the start is known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if since is None:
        return True
    started = process_start(pid)
    return started is None or started <= since + _START_SLACK


def changed_at(path: Path) -> float | None:
    """``path``'s last change time (``st_ctime``), the ``since`` of :func:`pid_alive`; None once it is gone."""
    try:
        return path.lstat().st_ctime
    except OSError:
        return None


def process_start(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (Linux's /proc; None where unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks after boot
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class _Held:
    """The stand-in handler of a held signal: records it while the hold lasts, and passes one that arrives after
    (while the real handlers are being put back) straight on."""

    def __init__(self) -> None:
        self.active = True
        self.caught: list[int] = []
        self.saved: dict[int, Callable[[int, FrameType | None], Any]] = {}

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.active:
            self.caught.append(signum)
        else:
            self.saved[signum](signum, frame)


@contextmanager
def held_signals() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP (their Python handlers) over the few steps that make or remove a temporary, and
    deliver them after: an interrupt between making one and recording it, or half-way through a clean-up, would
    leave it behind. Only the main thread runs signal handlers; elsewhere there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = _Held()
    try:
        for signum in _HELD_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):  # a default or ignored signal raises nothing: leave it
                held.saved[signum] = handler
                signal.signal(signum, held)
        yield
    finally:
        held.active = False
        try:
            for restored, handler in held.saved.items():
                signal.signal(restored, handler)
        finally:
            for caught in held.caught:
                held.saved[caught](caught, None)


def fsync_path(path: str | Path, directory: bool = False) -> None:
    """Flush a file or a folder's entries to the disk. A file or folder this process may not open for reading,
    and a filesystem that cannot sync a folder, are let be: durability is not worth failing a finished run for;
    a failed flush (EIO, ENOSPC) is an error, the data may not be on the disk."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if not directory or exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def sync_tree(top: Path) -> None:
    """Flush a run's files and folders before they replace the previous outputs: after a power loss the swap,
    if it persisted, never shows files whose data did not."""
    for folder, _dirs, files in os.walk(top):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                fsync_path(os.path.join(folder, name))
        fsync_path(folder, directory=True)


def lock_folder(folder: Path, shared: bool = False) -> int | None:
    """An exclusive ``flock`` on ``folder`` (its descriptor, to close), so that runs finishing at once swap one after
    the other; ``shared``: one that many holders share and that keeps the exclusive one waiting (readers of a folder
    in ``folder``, against its replacement). None where the folder cannot be opened (no read permission)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    except BaseException:  # Ctrl-C while it waits: no descriptor left open
        os.close(fd)
        raise
    return fd


def prepare_replacement(path: Path, new: Path) -> None:
    """The last step before ``new`` replaces ``path`` (every replacement of :mod:`foal_pipe.io`): a stop a finaliser
    swallowed is raised here, so the previous outputs stay; then :func:`keep_permissions`."""
    raise_swallowed_stop()
    keep_permissions(path, new)


def keep_permissions(path: Path, new: Path) -> None:
    """Give the replacement of an existing ``path`` its permission bits and group (where this process may set
    it): a private (0700, 0600) or group-shared (setgid) output stays so."""
    try:
        old = path.stat()
    except FileNotFoundError:
        return
    with contextlib.suppress(PermissionError):
        os.chown(new, -1, old.st_gid)  # before chmod: chown clears the setgid bit
    os.chmod(new, stat.S_IMODE(old.st_mode))


def umask() -> int:
    """This process's umask (read by setting it, then put back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
