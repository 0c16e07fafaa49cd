"""Where an output is written and what it must not be: the checks of an output path that need no settling.

:func:`foal_pipe.io.check_output_dir` and :func:`foal_pipe.io.check_output_file` run them before any work, with the
settling of interrupted runs that :mod:`foal_pipe.io` owns; the feature store tests are here too, so that ``extract``,
the store and the model file find a store (or refuse an output inside one) without importing Zarr.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from foal_pipe.errors import FoalPipeError, param

STORE_FORMAT = "foal-pipe/features"
"""The ``format`` attribute of a feature store (:data:`foal_pipe.store.meta.FORMAT`): here, so that the output
checks recognise a store without importing Zarr."""


def follow_link(path: str | Path) -> Path:
    """The path an output given as a symlink is written at: its target, so the link stays and nothing of the
    target's moves (replacing the link itself would leave the user's link a real folder, take the target's
    files into it and, across filesystems, fail half-way). A symlink loop is refused."""
    path = Path(path)
    if not os.path.islink(path):
        return path
    target = Path(os.path.realpath(path))
    if os.path.islink(target):
        raise FoalPipeError(f"output {path} is a symlink that never reaches a file or folder (a loop); "
                            f"remove it or choose another {param('out')}")
    return target


def _refuse_dots(path: Path, inputs: list[str | Path | None], inside: str) -> NoReturn:
    """Refuse ``path`` named by '.' or '..' with an ``--out`` to pass instead: the directory by name or, where it holds
    an input (and would be refused in turn), a folder in it (``inside``, else ``inside-2``, ...) that the checks accept."""
    named = Path(os.path.abspath(path))
    why = f"output {path} names a directory by '.' or '..', which cannot be replaced in one rename"
    try:
        check_not_an_input(named, inputs)
    except FoalPipeError:
        folder = next(named / name for name in itertools.chain([inside], (f"{inside}-{i}" for i in itertools.count(2)))
                      if not os.path.lexists(named / name) or _takes(named / name, inputs))
        raise FoalPipeError(f"{why}, and {named} holds this command's inputs; pass a folder by name, e.g. "
                            f"{param('out')} {folder}") from None
    raise FoalPipeError(f"{why}; pass it by name, e.g. {param('out')} {named}")


def _takes(folder: Path, inputs: list[str | Path | None]) -> bool:
    """Whether the existing ``folder`` can be an output: a folder, not a feature store, and not one of ``inputs`` nor
    holding one."""
    if not folder.is_dir() or is_feature_store(folder):
        return False
    try:
        check_not_an_input(folder, inputs)
    except FoalPipeError:
        return False
    return True


def _check_kind(path: str | Path, kind: str) -> None:
    """Refuse an existing output (or a symlink's target) that is neither a regular file nor a folder, such as a
    FIFO, a device or ``/dev/stdout``: it would be replaced by a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        what = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device or socket"
        fix = "leave out --out to write to standard output, or " if kind == "file" else ""
        raise FoalPipeError(f"output {path} is {what}, not a {kind}, and would be replaced; {fix}choose another "
                            f"{param('out')}")


def check_entries_movable(path: Path) -> None:
    """Refuse an existing output directory holding a folder this process cannot write (a previous run's ``eval/``
    made read-only): a run carries it into its new outputs after the swap, and renaming a folder into another
    needs write permission on it, so the run would fail after replacing the outputs, leaving the folder in its
    temporary. Links are carried as they are, and files need no permission of their own."""
    if not os.path.isdir(path):
        return
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and not os.access(entry.path, os.W_OK):
            raise FoalPipeError(f"output {path} holds the read-only folder {entry.path}, which this run would move into "
                                f"its new outputs (moving a folder needs write permission on it); make it writable "
                                f"(chmod u+w {shlex.quote(entry.path)}) or move it out, then re-run")


def check_not_an_input(path: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output that is one of the command's inputs, or a folder holding one: written over, or swapped away
    with the folder (and left in its temporary by a kill), the input would be lost. A symlinked output is checked at
    its target, where it is written (:func:`follow_link`): a dangling link writes a new file, overwriting nothing."""
    target = follow_link(path)
    if not os.path.lexists(target):
        return
    for given in inputs:
        if given is not None and os.path.exists(given):
            held = target.resolve() in Path(given).resolve().parents
            if held or os.path.samefile(target, given):
                raise FoalPipeError(f"output {path} {'holds' if held else 'is'} an input of this command ({given}) and "
                                    f"would be {'replaced with it' if held else 'overwritten'}; choose another {param('out')}")


def is_feature_store(path: Path) -> bool:
    """Whether ``path`` holds a foal-pipe feature store (its group attributes say so), complete or not."""
    try:
        doc = json.loads((path / "zarr.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("attributes"), dict) and doc["attributes"].get("format") == STORE_FORMAT


def _probe_parent(path: Path, create: bool) -> Path:
    """``path``'s parent, made when ``create``; else its nearest existing ancestor, where a probe shows that the
    parents can be made: a run refused after the check leaves no empty folders behind."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.parent
    return next(parent for parent in path.absolute().parents if parent.is_dir())


def _check_parents(path: Path) -> Path:
    """Refuse a path below a file (mkdir would only say "File exists") and a path in a feature store (a run's files
    there would sit among its arrays, or overwrite them)."""
    for parent in path.parents:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise FoalPipeError(f"cannot write {path}: {parent} is a file, not a directory; choose another {param('out')}")
            break
    where = enclosing_store(path, itself=True)
    if where is not None:
        raise FoalPipeError(f"output {path} lies in the feature store {where}; choose an {param('out')} outside it")
    return path


def enclosing_store(path: str | Path, itself: bool = False) -> Path | None:
    """The feature store that ``path`` lies in (``itself``: or is), if any."""
    full = Path(path).resolve()
    return next((where for where in ((full,) if itself else ()) + tuple(full.parents) if is_feature_store(where)), None)
