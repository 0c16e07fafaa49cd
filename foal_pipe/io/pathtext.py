"""A path's text from its bytes, whatever the locale.

Python decodes file names, and the paths typed on the command line, with the locale's file-system encoding: under
``LC_ALL=C`` (with ``PYTHONUTF8=0``) the UTF-8 bytes of ``café`` become lone surrogates, under ISO-8859-1 ``cafÃ©``.
What a store or a record keeps -- class and image names, its source, the ``features`` a run names -- is that text,
so it would differ with the locale (another generation id, ``sÃ¼Ã\\x9f.zarr`` in metrics.json). :func:`path_text`
takes it from the bytes instead, as a UTF-8 locale reads them; :func:`os_path` turns such a text back into the
path this process opens. The OS path itself is kept for opening files.
"""

from __future__ import annotations

import os


def path_text(path: str | os.PathLike[str]) -> str:
    """``path``'s bytes decoded as UTF-8, the same text in every locale; bytes that are not UTF-8 as lone surrogates
    (``surrogateescape``, as a UTF-8 locale holds them), so that the name can still be refused or written back."""
    return os.fsencode(path).decode("utf-8", "surrogateescape")


def os_path(text: str) -> str:
    """The path this process opens for ``text``, a path recorded by :func:`path_text` (its UTF-8 bytes, in the
    locale's file-system encoding); ``text`` itself where it holds a surrogate that stands for no byte."""
    try:
        return os.fsdecode(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return text

