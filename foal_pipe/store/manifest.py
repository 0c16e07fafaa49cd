"""Reading the split manifest a store keeps (format 5, docs/feature-store.md): the bytes of the document
:mod:`foal_pipe.datasets.manifest` defines, as the uint8 array ``manifest``, with its SHA-256 and length in the
attribute ``manifest``. The array travels through the store's codecs, chunk records and generation id like any other;
:mod:`foal_pipe.store.write` writes it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from foal_pipe.errors import FoalPipeError
from foal_pipe.store.chunks import REEXTRACT, read_rows
from foal_pipe.store.meta import open_array, read_meta

MANIFEST = "manifest"


def read_manifest_bytes(path: str | Path) -> bytes | None:
    """The manifest bytes of the complete store at ``path`` (checked as :func:`~foal_pipe.store.open_store` checks
    any store, then against their recorded SHA-256); None when the store keeps none."""
    from foal_pipe.store.read import open_store

    open_store(path)
    return stored_manifest(path)


def stored_manifest(path: str | Path) -> bytes | None:
    """The manifest bytes of the store at ``path``, complete or not, checked against their recorded SHA-256; None
    when it keeps none."""
    path = Path(path)
    group, meta = read_meta(path)
    attr = meta.extra.get(MANIFEST)
    if attr is None:
        return None
    if not (isinstance(attr, dict) and isinstance(attr.get("sha256"), str) and type(attr.get("bytes")) is int):
        raise FoalPipeError(f"{path}: attribute 'manifest' is not {{sha256, bytes}}; {REEXTRACT}")
    array = open_array(group, path, MANIFEST)
    if array.ndim != 1 or array.dtype != np.uint8 or int(array.shape[0]) != attr["bytes"]:
        raise FoalPipeError(f"{path}: the manifest array is not {attr['bytes']} bytes; {REEXTRACT}")
    raw = read_rows(path, MANIFEST, array, 0, attr["bytes"]).tobytes()
    if hashlib.sha256(raw).hexdigest() != attr["sha256"]:
        raise FoalPipeError(f"{path}: the manifest array differs from its recorded SHA-256 (damaged); {REEXTRACT}")
    return raw
