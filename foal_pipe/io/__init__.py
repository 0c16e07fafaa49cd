"""Atomic output: files and whole run directories appear complete or not at all.

A single file is written to a temporary name beside it, then renamed into place. A run's outputs (the model
and its metrics, a sweep, an evaluation) are written into a temporary sibling directory that replaces the
output directory in one rename, so a kill or a full disk leaves the previous outputs untouched.

The checks of an output path that need no settling are in :mod:`foal_pipe.io.outpaths`, the names of the
temporaries and their removal in :mod:`foal_pipe.io.temporaries`, CSV rows that read back as written in
:mod:`foal_pipe.io.csvrows`, and paths as UTF-8 text in every locale in :mod:`foal_pipe.io.pathtext`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from foal_pipe.durable import changed_at, fsync_path, held_signals, lock_folder, pid_alive, prepare_replacement, sync_tree, umask
from foal_pipe.errors import FoalPipeError, limit_fix, param
from foal_pipe.io.outpaths import (
    _check_kind,
    _check_parents,
    _probe_parent,
    _refuse_dots,
    check_entries_movable,
    check_not_an_input,
    follow_link,
)
from foal_pipe.io.temporaries import _JOURNAL, _OLD, _TEMP_EXTRA, _is_folder, _read_journal, _remove

_RENAME_EXCHANGE = 2  # linux/fs.h
#: The label of a row with no class (``extract --dataset images``): a store keeps it, ``learn`` refuses it. Here,
#: below both, so that the datasets make such rows and the store checks them without importing each other.
UNLABELLED = -1
#: The run files (:mod:`foal_pipe.protocol.schema` owns their format): here, so that the model layer, below the
#: protocol, finds a run's ``metrics.json`` by name.
METRICS_FILE = "metrics.json"
SWEEP_FILE = "sweep.json"
#: A run's wall seconds by step, and its key naming the record they are of (``{"file": NAME, "sha256": HEX}``).
TIMINGS_FILE = "timings.json"
TIMINGS_OF = "of"
#: The temporaries (real paths) of this process's atomic_dir calls in progress: a journal of this process's that is not
#: one of them was left by a call whose settlement failed, and is settled like a dead process's.
_IN_PROGRESS: set[str] = set()


class WriteError(FoalPipeError):
    """A write that failed, with its ``path`` and ``error``: :func:`atomic_dir` names the output a file of its
    temporary directory stands for, not the temporary path."""

    def __init__(self, message: str, path: Path, error: OSError) -> None:
        super().__init__(message)
        self.path, self.error = path, error


def _io_error(path: Path, exc: OSError, fix: str, note: str = "") -> WriteError:
    """The failed write of ``path``: the system's reason, then ``fix`` -- or, where the process ran into one of its
    limits (:data:`~foal_pipe.errors.LIMIT_FIXES`: open files, file size), that limit's, as the place is not at fault --
    and ``note``."""
    reason = exc.strerror or type(exc).__name__
    code = errno.errorcode.get(exc.errno or 0)
    fix = limit_fix(exc, fix, ", then re-run")
    return WriteError(f"cannot write {path}: {reason}{f' ({code})' if code else ''}; {fix}{note}", path, exc)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path; on success it replaces ``path`` (a symlink's target, the link kept), on error it
    is removed."""
    _check_kind(path, "file")
    path = follow_link(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        prepare_replacement(path, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise _io_error(path, exc, "free some space or choose another output path") from None
    finally:
        with held_signals(), contextlib.suppress(OSError):  # a failed unlink must not hide why the write failed
            tmp.unlink(missing_ok=True)


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON with sorted keys (the same data gives the same bytes), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return Path(path)


def check_output_dir(path: str | Path, create: bool = False, inputs: Iterable[str | Path | None] = (),
                     inside: str = "run") -> Path:
    """Refuse, before any work, an output directory that cannot be written; settles earlier interrupted runs.

    Makes a probe directory (removed again) in ``path``'s parent or, where that does not exist yet, its nearest
    existing ancestor (:func:`_probe_parent`), so a read-only place, a path under a file or ``path`` being a file
    are named now rather than after training; so are an existing ``path`` that cannot be replaced or holds a folder
    that cannot be carried into the new outputs (read-only: :func:`check_entries_movable`), a name too long for the
    run's temporaries and a ``path`` holding one of the command's ``inputs``. ``create``: make the parents
    (at write time). A symlinked ``path`` is checked (and later written) at its target: :func:`follow_link`.
    ``inside``: the name of the folder suggested inside a mount point, or a directory named by '.' or '..' that
    holds an input.
    """
    inputs = list(inputs)
    _check_kind(path, "directory")
    settle_enclosing(follow_link(path))
    path = _check_parents(follow_link(path))
    if path.name in ("", ".", ".."):  # rename() refuses them: the run would fail after all its work
        _refuse_dots(path, inputs, inside)
    try:
        where = _probe_parent(path, create)
        limit = os.pathconf(where, "PC_NAME_MAX")  # a longer name would fail on the run's temporaries, after the work
        if len(os.fsencode(path.name)) + _TEMP_EXTRA > limit:
            raise FoalPipeError(f"output name {path.name[:40]}... is too long: the run's temporary names add {_TEMP_EXTRA} "
                                f"bytes to it, past this filesystem's {limit}; choose a name of at most "
                                f"{limit - _TEMP_EXTRA} bytes")
        _remove_stale(path)
        if path.exists() and not path.is_dir():
            raise FoalPipeError(f"output {path} is a file, not a directory; pass a directory with {param('out')}")
        check_entries_movable(path)
        if os.path.ismount(path):  # rename() says EBUSY
            raise FoalPipeError(f"output {path} is a mount point, which cannot be replaced in one rename; choose a folder "
                                f"inside it, e.g. {param('out')} {path / inside}")
        with held_signals():  # made and removed with no interrupt between; in an existing `path` too: its entries
            for folder in (where, path) if path.is_dir() else (where,):  # are carried or removed at the swap
                with replacement_held_off(folder):  # not inside another run's swap of `path`, which carries entries
                    Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=folder)).rmdir()
    except OSError as exc:
        raise _io_error(path, exc, f"choose a writable {param('out')} directory") from None
    check_not_an_input(path, inputs)
    return path


def check_output_file(path: str | Path) -> Path:
    """Refuse, before any work, an output file that cannot be written (a directory, a FIFO or device, under a file,
    read-only)."""
    _check_kind(path, "file")
    path = _check_parents(follow_link(path))
    try:
        where = _probe_parent(path, create=False)
        _remove_stale(path)
        if path.is_dir():
            raise FoalPipeError(f"output {path} is a directory; pass a file path with {param('out')}")
        # made and removed with no interrupt between, and not inside another run's swap of `where`
        with held_signals(), replacement_held_off(where):
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=where)
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise _io_error(path, exc, f"choose a writable {param('out')} path") from None
    return path


def _remove_stale(path: Path, swapped: bool = False) -> None:
    """Settle the temporaries of earlier runs on ``path`` whose process is gone (killed mid-write); ``swapped``: only
    those of a replacement whose journal was written (:func:`atomic_dir`'s, no one else's)."""
    bases = set()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp-*{_JOURNAL if swapped else ''}"):
        pid = tmp.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        base = tmp.with_name(tmp.name.removesuffix(_JOURNAL).removesuffix(_OLD))
        if pid.isdigit() and (not pid_alive(int(pid), changed_at(tmp)) or _left_by_this_process(int(pid), base)):
            bases.add(base)
    for tmp in sorted(bases):
        if not swapped or _read_journal(tmp.with_name(tmp.name + _JOURNAL))[0] is not None:
            try:
                _settle(path, tmp)
            except OSError as exc:
                raise _unsettled(path, tmp, exc) from None


def _unsettled(path: Path, tmp: Path, exc: OSError) -> WriteError:
    """A settlement of ``path`` that failed; its journal stays for the next run. Where the system named an entry of
    the previous outputs (a read-only folder, which cannot be moved into ``path``), that entry is named, not ``path``,
    which may well be writable."""
    where = Path(os.fsdecode(exc.filename)) if exc.filename is not None else path
    if any(where.is_relative_to(previous) for previous in (tmp, tmp.with_name(tmp.name + _OLD))):
        return _io_error(where, exc, f"the previous outputs' files that {path} lacks wait beside it ({tmp.name}*); make "
                         f"{where} writable (or free some space), then re-run: the next run on {path} moves them in")
    return _io_error(path, exc, f"the previous outputs' files it lacks wait beside it ({tmp.name}*); free some space or "
                     "make it writable, then re-run: the next run on it moves them in")


def _left_by_this_process(pid: int, base: Path) -> bool:
    """Whether ``base`` is a journaled swap of this process's that no atomic_dir call of it is still making."""
    return pid == os.getpid() and base.with_name(base.name + _JOURNAL).exists() and os.path.realpath(base) not in _IN_PROGRESS


def settle_enclosing(path: str | Path) -> None:
    """Settle the swaps of killed runs on the folders enclosing ``path``, outermost first, before anything is written in
    it: an ``evaluate`` writing ``RUN/eval`` while a killed ``learn``'s replacement of ``RUN`` is pending would leave
    ``RUN`` missing (killed between two renames) or settled later around what it wrote. Only journaled swaps of
    :func:`atomic_dir` are settled there, whose journal says what happened; other temporaries wait for a run on
    that folder itself. One that cannot be settled (a read-only folder) is a :class:`WriteError` naming it."""
    parents = Path(os.path.realpath(Path(path).absolute().parent))
    for folder in reversed([parents, *parents.parents]):
        try:
            if folder.name:
                _remove_stale(folder, swapped=True)
        except OSError as exc:
            raise _io_error(folder, exc, "an interrupted run's replacement of it is pending; make it writable, then "
                            "re-run") from None


def _carry(previous: Path, path: Path, owned: set[str]) -> None:
    """Move the entries of the previous outputs that ``path`` lacks into it, except the ``owned`` ones; an owned
    ``FOLDER/NAME`` is left out of a carried folder FOLDER (not a link), which stays behind too once it holds nothing
    else. A folder that ``path`` has too (the run wrote it, or an ``evaluate`` did before this settlement) is merged:
    what it lacks is carried into it the same way, not deleted with the previous outputs. A folder moved into is
    flushed to the disk before the journal goes: after a power loss, the next run carries what is missing."""
    moved = False
    for entry in previous.iterdir():
        target = path / entry.name
        if entry.name in owned:
            continue
        inner = {name.split("/", 1)[1] for name in owned if name.startswith(f"{entry.name}/")}
        if os.path.lexists(target):
            if _is_folder(entry) and _is_folder(target):
                _carry(entry, target, inner)
            continue
        if inner and _is_folder(entry):
            for stale in [e for e in entry.iterdir() if e.name in inner]:
                _remove(stale)
            if not any(entry.iterdir()):
                continue
        os.rename(entry, target)
        moved = True
    if moved:
        fsync_path(path, directory=True)


def _settle(path: Path, tmp: Path) -> None:
    """Finish or undo a replacement of ``path`` by the directory ``tmp``, then remove the temporaries.

    Before swapping, :func:`atomic_dir` records the new directory's inode, and the names the run owns, in the
    journal ``tmp.swap``. If ``path`` now has that inode the swap happened, and the previous outputs (left in
    ``tmp`` by an exchange, in ``tmp-old`` by two renames) give ``path`` the entries it lacks, except the owned
    ones (a stale file of the previous run's: :func:`_carry`); if ``path`` is missing (killed between the two renames), the
    previous outputs are put back; if another folder took ``path`` between the two renames (one written inside it,
    say ``RUN/eval``), the previous outputs give it all the entries it lacks, owned ones too: the run never replaced
    them. Without a journal ``tmp`` is an unfinished run. Signals are held meanwhile, so that an interrupt leaves no
    temporary of it.
    """
    journal, old = tmp.with_name(tmp.name + _JOURNAL), tmp.with_name(tmp.name + _OLD)
    with held_signals():
        new_inode, owned = _read_journal(journal)
        if new_inode is not None:
            if path.is_dir() and path.stat().st_ino == new_inode:
                for previous in (tmp, old):
                    if previous.is_dir():
                        _carry(previous, path, owned)
            elif not os.path.lexists(path) and old.is_dir():
                os.rename(old, path)
                fsync_path(path.parent, directory=True)
            elif _is_folder(path) and old.is_dir():
                _carry(old, path, set())
        for leftover in (tmp, old, journal):
            _remove(leftover)


@contextmanager
def replacement_held_off(folder: str | Path) -> Iterator[None]:
    """Keep an :func:`atomic_dir` replacement of the existing ``folder`` waiting while the block reads it and writes in
    it (``evaluate`` reading RUN, then writing RUN/eval): a shared lock on its parent, which that swap locks exclusively,
    and other readers share. Parent before child: a lock taken in the block is on a folder inside ``folder``."""
    real = Path(os.path.realpath(folder))
    lock = lock_folder(real.parent, shared=True) if real.is_dir() and real.parent != real else None
    try:
        yield
    finally:
        if lock is not None:
            os.close(lock)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def atomic_dir(path: str | Path, owned: Iterable[str] = ()) -> Iterator[Path]:
    """Yield a fresh temporary sibling directory; on success it becomes ``path`` in one rename.

    Entries of an existing ``path`` that this run does not write (say a user's notes beside a run's model) are
    carried over, except those named in ``owned``: the command's own outputs, which a run that does not write
    one (no sweep, no plots) must not show from an earlier run; ``FOLDER/NAME`` names one inside a carried
    ``FOLDER`` (say an evaluation of the replaced run in ``eval/``), left out of it; they are looked up (iterated
    once) under the lock on ``path``'s parent, just before the swap, so ``owned`` may find them then. A symlinked ``path`` is
    replaced at its target, the link kept (:func:`follow_link`). On any error the temporary directory is removed
    and ``path`` is left as it was; a run killed at any point (power loss included: the files and the swap are
    synced) is settled by the next :func:`check_output_dir` on ``path``. An I/O error is reported as a failed write
    of ``path``, except the caller's about a path outside the temporary directory (an input it reads), which
    propagates as it is.
    """
    path = check_output_dir(path, create=True)
    tmp: Path | None = None
    lock: int | None = None
    foreign: OSError | None = None
    try:
        with held_signals():  # an interrupt now would leave it unrecorded: it comes after `tmp` is set
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
            _IN_PROGRESS.add(os.path.realpath(tmp))
        try:
            yield tmp
        except OSError as exc:  # the caller's: a write of its files (no path, or one in `tmp`), or about another path
            if exc.filename is not None and not Path(os.fsdecode(exc.filename)).is_relative_to(tmp):
                foreign = exc  # say, an input read while the outputs are written: its own error, not --out's
            raise
        os.chmod(tmp, 0o777 & ~umask())
        sync_tree(tmp)
        lock = lock_folder(path.parent)  # released after _settle: a second run swaps against this one's settled result
        prepare_replacement(path, tmp)
        if path.is_dir():
            journal = tmp.with_name(tmp.name + _JOURNAL)
            journal.write_text("\n".join([str(tmp.stat().st_ino), *sorted(set(owned))]))
            fsync_path(journal)
            fsync_path(path.parent, directory=True)
            if not exchange(tmp, path):
                os.rename(path, tmp.with_name(tmp.name + _OLD))
                os.rename(tmp, path)
        else:
            os.rename(tmp, path)
        fsync_path(path.parent, directory=True)
    except WriteError as exc:  # a file of the run's: named as it would have been written
        if tmp is None or not exc.path.is_relative_to(tmp):
            raise
        raise _io_error(path / exc.path.relative_to(tmp), exc.error, f"free some space or choose another {param('out')}",
                        "; previous outputs are unchanged") from None
    except OSError as exc:
        if exc is foreign:
            raise
        raise _io_error(path, exc, f"free some space or choose another {param('out')}",
                        "; previous outputs are unchanged") from None
    finally:
        try:
            if tmp is not None:
                try:
                    _settle(path, tmp)
                except OSError as exc:  # its journal stays: the next run on `path`, in this process too, settles it
                    raise _unsettled(path, tmp, exc) from None
                finally:
                    _IN_PROGRESS.discard(os.path.realpath(tmp))
        finally:
            if lock is not None:
                os.close(lock)  # releases the flock
