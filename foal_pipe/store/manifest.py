"""Reading the split manifest a store keeps (format 5, docs/feature-store.md): the bytes of the document
:mod:`foal_pipe.datasets.manifest` defines, as the uint8 array ``manifest``, with its SHA-256 and length in the
attribute ``manifest``. The array travels through the store's codecs, chunk records and generation id like any other;
:mod:`foal_pipe.store.write` writes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError
from foal_pipe.store.chunks import REEXTRACT, read_rows
from foal_pipe.store.integrity import compute_generation
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


def data_identities(store: Any) -> list[str]:
    """The identities of ``store``'s training rows that survive re-extraction: its ``data_identity`` (dataset, source
    as typed, row indices, labels) and, for a store with a split manifest, the hash of its train images' SHA-256 and
    class names in row order, which neither the folder's path as typed nor a copy of the folder changes. A store
    without a generation id (formats 1-2) is named by its content instead (the id :func:`compute_generation` would
    give it: attributes, arrays' metadata, every chunk's size and last bytes), so a model of it can be continued."""
    identities = [identity] if (identity := store.data_identity()) else []
    if store.meta.generation is None:
        identities.append("content:" + compute_generation(store.path))
    raw = stored_manifest(store.path)
    if raw is not None:
        try:
            doc = json.loads(raw.decode("utf-8"))
            rows = [[sha, doc["classes"][label]] for _, sha, label in doc["train"]]
        except (ValueError, KeyError, IndexError, TypeError):
            raise FoalPipeError(f"{store.path}: its split manifest is not readable; {REEXTRACT}") from None
        digest = hashlib.sha256(json.dumps([store.meta.dataset, rows], ensure_ascii=False).encode())
        identities.append("images:" + digest.hexdigest())
    return identities
