"""Split manifests (docs/datasets.md, "Split manifests"): the list of images of each split, by name and SHA-256, that
a store records, so a split travels as a list rather than as a seed and a folder layout. ``extract --split-manifest``
builds the splits of a dataset from another store's manifest (or its exported JSON), exactly: every listed image
must be there with the same bytes, and rows follow the manifest's order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from foal_pipe.datasets.sources import DatasetSplits, FileSource, clash_text, hash_files, nfc
from foal_pipe.errors import FoalPipeError, param

FORMAT = "foal-pipe/split-manifest"
FORMAT_VERSION = 1
SPLITS = ("train", "test")
#: A SHA-256 as a manifest writes it; another spelling of a digest would be reported as an image with other bytes.
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class SplitManifest:
    """The images of each split: ``splits[split]`` lists ``(name, sha256, label)`` in row order; ``classes[label]``
    is the class name. Its canonical bytes (:meth:`to_bytes`) are what a store keeps and ``--split-manifest``
    reads."""

    classes: tuple[str, ...]
    splits: dict[str, tuple[tuple[str, str, int], ...]]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "classes": list(self.classes),
                **{split: [list(entry) for entry in self.splits[split]] for split in SPLITS}}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n").encode()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> SplitManifest:
        """A manifest read from ``where``; anything but this format is one line naming what is wrong."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise FoalPipeError(f"{where} is not a split manifest (no 'format': {FORMAT!r}); pass a feature store "
                                "written by `foal-pipe extract` or the JSON `foal-pipe info --export-manifest` writes")
        if doc.get("format_version") != FORMAT_VERSION or type(doc.get("format_version")) is not int:
            raise FoalPipeError(f"{where} is split manifest version {doc.get('format_version')!r}; this foal-pipe reads "
                                f"version {FORMAT_VERSION}: export it again with this foal-pipe")
        classes = doc.get("classes")
        if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
            raise FoalPipeError(f"{where}: 'classes' must be a non-empty list of class names; export it again")
        splits = {}
        for split in SPLITS:
            entries = doc.get(split)
            if not isinstance(entries, list):
                raise FoalPipeError(f"{where}: {split!r} must be a list of [name, sha256, label]; export it again")
            for entry in entries:
                if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                        and isinstance(entry[1], str) and SHA256.fullmatch(entry[1]) and type(entry[2]) is int
                        and -1 <= entry[2] < len(classes)):
                    raise FoalPipeError(f"{where}: {split} entry {json.dumps(entry)[:80]} is not [name, sha256 (64 "
                                        f"lowercase hex digits), label in 0..{len(classes) - 1} or -1]; export it again")
            splits[split] = tuple((name, digest, label) for name, digest, label in entries)
            names = sorted((nfc(entry[0]), entry[0]) for entry in splits[split])  # one name in NFC and NFD: one image
            twice = next(((a, b) for a, b in zip(names, names[1:]) if a[0] == b[0]), None)
            if twice is not None:
                forms = " (in two Unicode normalisations, one name)" if twice[0][1] != twice[1][1] else ""
                raise FoalPipeError(f"{where} lists the image {twice[0][0]!r} twice in its {split} split{forms}; a split "
                                    "names each image once: remove one of its entries")
        return cls(tuple(classes), splits)


def _class_name(classes: Any, label: int) -> str:
    """The class name of ``label``; ``""`` for an unlabelled image (-1)."""
    return classes[label] if 0 <= label < len(classes) else ""


def _said(class_name: str) -> str:
    """A class as an error names it: ``class 'ant'``, or ``unlabelled`` (:func:`_class_name`'s ``""``)."""
    return f"class {class_name!r}" if class_name else "unlabelled"


def build_manifest(data: DatasetSplits) -> SplitManifest | None:
    """The manifest of an opened dataset (None when a split cannot name its images: torchvision, HDF5). Two files of
    a split whose names are one name in NFC form (the manifest's) are refused before any image is hashed."""
    for split in SPLITS:
        source = data.split(split)
        names = source.names if isinstance(source, FileSource) else None
        odd = next((row for row, name in enumerate(names or []) if not _utf8(name)), None)
        if odd is not None:  # a file name of bytes that are not UTF-8 (Python holds them as lone surrogates)
            raise FoalPipeError(f"the image file {os.fsencode(source.describe(odd))!r} has a name that is not UTF-8 text, "
                                "and the split manifest records names as UTF-8; rename it (or its folder) in UTF-8")
        twice = _first_twice(names or [])
        if twice is not None:
            first, second = (source.describe(i) for i in twice)
            raise FoalPipeError(f"{clash_text(first, second, lead='the image files ')}; one file name in a folder, as "
                                "the split manifest names it: rename one of them")
    prints = {split: data.split(split).fingerprints() for split in SPLITS}
    if any(p is None for p in prints.values()):
        return None
    return SplitManifest(tuple(data.classes), {
        split: tuple((name, digest, int(label)) for (name, digest), label in
                     zip(prints[split], data.split(split).labels.tolist()))  # type: ignore[arg-type]
        for split in SPLITS})


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 text (no lone surrogate, which stands for a byte of a name that is not UTF-8)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _first_twice(names: list[str]) -> tuple[int, int] | None:
    """The rows of the first two equal ``names`` (None: each is its own)."""
    seen: dict[str, int] = {}
    for row, name in enumerate(names):
        if name in seen:
            return seen[name], row
        seen[name] = row
    return None


def parse_manifest(raw: bytes, where: str) -> SplitManifest:
    """The manifest in ``raw`` (a store's ``manifest`` array or an exported JSON file), read from ``where``."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise FoalPipeError(f"{where} is not a split manifest (not JSON); pass a feature store or the JSON file "
                            "`foal-pipe info STORE --export-manifest FILE` writes") from None
    return SplitManifest.from_dict(doc, where)


def apply_manifest(pool: DatasetSplits, manifest: SplitManifest, where: str) -> DatasetSplits:
    """The splits ``manifest`` lists, taken from the images of ``pool`` (both its splits): each entry is the file of
    that name (relative to its split's class folders, so an image may lie in either split) whose bytes have the
    entry's SHA-256; rows in the manifest's order, with its labels and class names. Names match in Unicode NFC form
    (a copy unpacked on macOS has NFD names). A listed image that is missing, or whose bytes differ, is refused;
    images of ``pool`` the manifest does not list are left out. A class the manifest lists without any image is
    refused: the store would hold a class with no rows, which ``learn`` would put in a task as if it had some."""
    used = {label for split in SPLITS for _, _, label in manifest.splits[split]}
    rowless = [name for label, name in enumerate(manifest.classes) if label not in used]
    if used == {-1}:  # unlabelled images (`--dataset images`): its one placeholder class has no rows by design
        rowless = []
    empty = next((split for split in SPLITS if not manifest.splits[split]), None)
    if used - {-1} and empty is not None:
        raise FoalPipeError(f"the split manifest {where} lists no {empty} images, and a store of labelled images needs "
                            "both splits; pass the manifest as it was exported")
    if rowless:
        more = f" ({len(rowless)} such classes)" if len(rowless) > 1 else ""
        raise FoalPipeError(f"the split manifest {where} lists class {rowless[0]!r} without any image in either split"
                            f"{more}, which would be a class with no rows; list its images, or remove it from 'classes' "
                            "and renumber the labels after it")
    files: dict[str, list[tuple[str, str]]] = {}  # name -> (path, class name) of each file so named
    for split in SPLITS:
        source = pool.split(split)
        if not isinstance(source, FileSource) or source.names is None:
            raise FoalPipeError(f"{param('split_manifest')} splits image files; {pool.name} is not read from image files "
                                f"named in a folder: leave out {param('split_manifest')}")
        for name, path, label in zip(source.names, source.paths, source.labels.tolist()):
            files.setdefault(nfc(name), []).append((path, _class_name(pool.classes, label)))
    listed = [(split, entry) for split in SPLITS for entry in manifest.splits[split]]
    missing = [(split, name) for split, (name, _, _) in listed if nfc(name) not in files]
    if missing:
        s = "s" * (len(missing) != 1)
        raise FoalPipeError(f"{len(missing)} image{s} of the split manifest {where} ({missing[0][0]}: {missing[0][1]!r}"
                            f"{', ...' if len(missing) > 1 else ''}) {'are' if s else 'is'} not in {pool.location}; "
                            f"point {param('data_dir')} at the images the manifest lists")
    candidates = sorted({path for _, (name, _, _) in listed for path, _ in files[nfc(name)]})
    digests = dict(zip(candidates, hash_files(candidates)))
    taken: set[str] = set()
    rows: dict[str, list[tuple[str, str, int, str]]] = {split: [] for split in SPLITS}
    for split, (name, digest, label) in listed:
        same = [(path, cls) for path, cls in files[nfc(name)] if digests[path] == digest and path not in taken]
        if not same and any(digests[path] == digest for path, _ in files[nfc(name)]):
            raise FoalPipeError(f"the split manifest {where} lists image {name!r} in both splits, and {pool.location} "
                                "holds one such file; a manifest names each image in one split: remove one of its entries")
        if not same:
            raise FoalPipeError(f"image {name!r} of the split manifest {where} ({split}) has other bytes in "
                                f"{pool.location} ({files[nfc(name)][0][0]}) than the manifest records; restore the "
                                "original file")
        path, cls = same[0]
        listed_as = _class_name(manifest.classes, label)
        if nfc(cls) != nfc(listed_as):
            raise FoalPipeError(f"image {name!r} is {_said(cls)} in {pool.location} but {_said(listed_as)} in the split "
                                f"manifest {where}; it is not the same dataset")
        taken.add(path)
        rows[split].append((path, nfc(name), label, digest))  # the NFC form, as a store records names
    sources = {split: FileSource([r[0] for r in rows[split]], [r[2] for r in rows[split]],
                                 names=[r[1] for r in rows[split]], digests=[r[3] for r in rows[split]])
               for split in SPLITS}
    return DatasetSplits(pool.name, list(manifest.classes), sources["train"], sources["test"], pool.location,
                         pool.native_size)
