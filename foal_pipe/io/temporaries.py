"""The temporaries that the atomic writes leave beside an output: their names, the journal of a swap, their removal.

Apart from the writes and their settling (:mod:`foal_pipe.io`), so that what names a temporary, and what ``summary``
skips as one, is in one place.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The suffixes of :func:`foal_pipe.io.atomic_dir`'s temporaries: its journal, and the previous outputs moved away.
_JOURNAL = ".swap"
_OLD = "-old"
#: The names of the temporaries beside an output NAME (``.NAME.tmp-PID[-RANDOM][-old|.swap]``, a table's
#: ``.NAME.table-runs[-PID-RANDOM]``): what ``summary`` skips.
TEMPORARY = re.compile(r"\..+\.(tmp-\d+(-[a-z0-9_]{8})?(-old|\.swap)?|table-runs(-\d+-[a-z0-9_]{8})?)")
#: The longest name atomic_dir makes beside NAME, less NAME: ``.NAME.tmp-PID-RANDOM.swap`` with a 7-digit PID.
_TEMP_EXTRA = len(".") + len(".tmp-") + 7 + len("-") + 8 + len(_JOURNAL)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=_writable_retry)
    else:
        path.unlink(missing_ok=True)


def _writable_retry(func: Callable[..., Any], name: str, _exc: Any) -> None:
    """rmtree's error handler: a read-only folder of replaced outputs is made writable, so it is not left behind.
    Only a removal is retried (rmtree also reports a failed ``os.open``, which takes more arguments)."""
    if func not in (os.unlink, os.rmdir, os.remove):
        return
    with contextlib.suppress(OSError):
        parent = os.path.dirname(name)
        os.chmod(parent, stat.S_IMODE(os.stat(parent).st_mode) | stat.S_IRWXU)
        func(name)


def _read_journal(journal: Path) -> tuple[int | None, set[str]]:
    """The new directory's inode and the names the run owns (never carried over), as :func:`atomic_dir` wrote
    them; no inode when there is no whole journal."""
    try:
        inode, *owned = journal.read_text().split("\n")
        return int(inode), set(owned)
    except (OSError, ValueError):
        return None, set()


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()
