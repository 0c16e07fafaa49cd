"""Reading the split manifest a store keeps (format 5, docs/feature-store.md): the bytes of the document
:mod:`foal_pipe.datasets.manifest` defines, as the uint8 array ``manifest``, with its SHA-256 and length in the
attribute ``manifest``. The array travels through the store's codecs, chunk records and generation id like any other;
:mod:`foal_pipe.store.write` writes it. The store layer parses the document itself (:func:`parse_stored_manifest`),
strictly and in one place, so that it stays independent of :mod:`foal_pipe.datasets`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from foal_pipe.errors import FoalPipeError, clipped
from foal_pipe.store.chunks import REEXTRACT, read_rows
from foal_pipe.store.integrity import compute_generation
from foal_pipe.store.meta import SPLITS, StoreMeta, open_array, read_meta

MANIFEST = "manifest"
#: The prefix of the identity :func:`data_identities` gives a store's train images (the hash of their SHA-256s).
IMAGES = "images:"
#: The document a store's ``manifest`` array holds (as :mod:`foal_pipe.datasets.manifest` writes it).
MANIFEST_FORMAT, MANIFEST_VERSION = "foal-pipe/split-manifest", 1
#: One split's entries: ``(name, sha256, label)`` in row order.
Entries = tuple[tuple[str, str, int], ...]


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


def _entries(doc: dict[str, Any], split: str, n_classes: int) -> Entries:
    """The entries of ``split``, each checked to be ``[name, sha256, label]``; a ValueError says what is wrong."""
    entries = doc.get(split)
    if not isinstance(entries, list):
        raise ValueError(f"{split!r} is not a list of [name, sha256, label]")
    for row, entry in enumerate(entries):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], str)
                and len(entry[1]) == 64 and type(entry[2]) is int and -1 <= entry[2] < n_classes):
            raise ValueError(f"{split} row {row:,} is not [name, sha256 (64 hex digits), label in 0..{n_classes - 1} "
                             f"or -1]: {clipped(json.dumps(entry), 100)}")
    twice = next((name for name, count in Counter(entry[0] for entry in entries).items() if count > 1), None)
    if twice is not None:
        raise ValueError(f"{split} lists the image {twice!r} twice")
    return tuple((name, digest, label) for name, digest, label in entries)


def parse_stored_manifest(raw: bytes, path: str | Path) -> tuple[tuple[str, ...], dict[str, Entries]]:
    """The class names and each split's entries of the manifest bytes ``raw`` of the store at ``path``. Anything
    but the document ``extract`` writes (not JSON, another format or version, a class name that is not a string, an
    entry that is not ``[name, sha256, label]`` with its label in range) is one refusal naming what is wrong: both
    readers (a model's identity, ``info --verify``) refuse the same manifest with the same words."""
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"no 'format': {MANIFEST_FORMAT!r}")
        if type(doc.get("format_version")) is not int or doc["format_version"] != MANIFEST_VERSION:
            raise ValueError(f"format_version {doc.get('format_version')!r}, not {MANIFEST_VERSION}")
        classes = doc.get("classes")
        if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
            raise ValueError("'classes' is not a non-empty list of class names")
        return tuple(classes), {split: _entries(doc, split, len(classes)) for split in SPLITS}
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        why = "not JSON" if isinstance(exc, (UnicodeDecodeError, RecursionError, json.JSONDecodeError)) else str(exc)
        raise FoalPipeError(f"{path}: its split manifest is not readable ({why}); {REEXTRACT}") from None


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
        classes, splits = parse_stored_manifest(raw, store.path)
        rows = [[sha, classes[label] if label >= 0 else ""] for _, sha, label in splits["train"]]
        digest = hashlib.sha256(json.dumps([store.meta.dataset, rows], ensure_ascii=False).encode())
        identities.append(IMAGES + digest.hexdigest())
    return identities
