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
import zarr

from foal_pipe.errors import FoalPipeError
from foal_pipe.store.chunks import REEXTRACT, read_rows
from foal_pipe.store.integrity import compute_generation
from foal_pipe.store.meta import StoreMeta, open_array, read_meta

MANIFEST = "manifest"


def stored_manifest(path: str | Path, opened: tuple[zarr.Group, StoreMeta] | None = None) -> bytes | None:
    """The manifest bytes of the store at ``path`` (``opened``: its group and attributes, where read), complete or
    not, checked against their recorded SHA-256; None when it keeps none."""
    path = Path(path)
    group, meta = opened or read_meta(path)
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


def read_row_sources(path: Path, group: zarr.Group, meta: StoreMeta, arrays: dict[str, zarr.Array],
                     n_train: int) -> np.ndarray | None:
    """``train/index`` (None without one), read and checked when a store is opened, and the split manifest checked
    against its SHA-256 there too: a damaged one found only when the model is saved would void the whole run. The
    manifest is parsed only where a model records its identity (:func:`data_identities`): at ImageNet's 1.28M rows
    that takes seconds, which ``info`` or ``predict`` need not pay."""
    array, index = arrays.get("train/index"), None
    if array is not None:
        if array.shape != (n_train,) or not np.issubdtype(array.dtype, np.integer):
            raise FoalPipeError(f"train/index in {path} is {array.dtype} {array.shape}, expected integers of shape "
                                f"({n_train},) (one per train row); {REEXTRACT}")
        index = read_rows(path, "train/index", array, 0, n_train)
    stored_manifest(path, (group, meta))
    return index


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
