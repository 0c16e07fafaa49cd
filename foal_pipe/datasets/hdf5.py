"""The ``hdf5`` dataset: one ``.h5`` file of images and integer labels per split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.datasets.h5pixels import H5_PIXELS, H5_SHAPES, file_identity, h5_layout, h5_side, h5_sides
from foal_pipe.datasets.h5source import H5Source
from foal_pipe.datasets.sources import DatasetSplits, same_names
from foal_pipe.errors import FoalPipeError, clipped, param
from foal_pipe.memory import available_memory, human


def load_hdf5(data_dir: Path | None, download: bool) -> DatasetSplits:
    """One ``.h5`` file with ``train/images``, ``train/labels``, ``test/images``, ``test/labels``."""
    import h5py

    if data_dir is None:
        raise FoalPipeError(f"{param('dataset', 'hdf5')} needs {param('data_dir', 'FILE.h5')} (with train/images, "
                            "train/labels, test/images, test/labels)")
    path = data_dir.expanduser()
    if not path.is_file():
        raise FoalPipeError(f"HDF5 dataset not found: {path} is not a file; pass {param('data_dir', 'FILE.h5')}")
    try:
        identity = file_identity(path)  # before the first read: a file put there later differs from it
        f = h5py.File(path, "r")
    except OSError as exc:
        raise FoalPipeError(f"cannot open {path} as HDF5 ({exc}); pass a .h5 file made with h5py") from None
    with f:
        labels, shapes = {}, {}
        for split in ("train", "test"):
            for key in ("images", "labels"):
                _check_inside(f, path, f"{split}/{key}")  # before `in`, which would follow an external link
                if f"{split}/{key}" not in f:
                    raise FoalPipeError(f"{path} has no dataset {split}/{key}; it needs train/images, "
                                        "train/labels, test/images and test/labels")
            raw, images = f[f"{split}/labels"], f[f"{split}/images"]
            _check_array(path, f"{split}/labels", raw, LABELS)
            _check_array(path, f"{split}/images", images, f"N images of shape {H5_SHAPES}")
            if raw.ndim == 0:
                raise FoalPipeError(f"{path}: dataset {split}/labels is a scalar (one value, {_short(raw[()])}), not an array; "
                                    f"it should be {LABELS}")
            if raw.dtype.kind not in "iu":  # floats (NaN included) and booleans are not label ids
                raise FoalPipeError(f"{path}: dataset {split}/labels has dtype {raw.dtype}; labels must be integers "
                                    "0..K-1: store them with an integer dtype (e.g. labels.astype('int64'))")
            if images.dtype.kind not in "iuf":
                raise FoalPipeError(f"{path}: dataset {split}/images has dtype {images.dtype}; images "
                                    f"must be {H5_PIXELS}")
            shapes[split], count = images.shape, int(raw.size or 0)  # both declared: nothing read yet
            if len(shapes[split]) in (3, 4) and 0 in shapes[split][1:]:
                raise FoalPipeError(f"{path}: dataset {split}/images has shape {shapes[split]}, images without pixels "
                                    f"(a height, width or channel count of 0); it should be N images of shape "
                                    f"{H5_SHAPES}, H and W at least 1")
            layout = h5_layout(shapes[split])
            if layout is None or shapes[split][0] != count:
                raise FoalPipeError(f"{path}: {split}/images has shape {shapes[split]} and {split}/labels "
                                    f"{count} rows; expected N labels and N images of shape {H5_SHAPES}")
            _check_image_size(path, split, shapes[split], layout)
            need, available = count * (raw.dtype.itemsize + 8), available_memory()  # as read, then as int64
            if available is not None and need > available:
                raise FoalPipeError(f"{path}: {split}/labels declares {count:,} rows, {human(need)} in memory, more than the "
                                    f"{human(available)} available; check the file (its {split}/images declare as many)")
            read = np.asarray(raw[:]).reshape(-1)
            if read.dtype.kind == "u" and int(read.max(initial=0)) > np.iinfo(np.int64).max:  # int64 would wrap it negative
                raise FoalPipeError(f"{path}: {split}/labels holds the label {int(read.max()):,}; labels must be 0..K-1")
            labels[split] = read.astype(np.int64)
        names = f.attrs.get("classes")
        if names is None:
            _check_inside(f, path, "classes")
            if "classes" in f:
                _check_array(path, "classes", f["classes"], CLASSES)
                names = f["classes"][()]
        if names is not None and np.ndim(names) == 0:
            where = "attribute" if "classes" in f.attrs else "dataset"
            raise FoalPipeError(f"{path}: its 'classes' {where} is one value ({_short(names)}), not a list; it should be "
                                f"{CLASSES}, e.g. ['cat', 'dog']")
    every = np.concatenate([labels["train"], labels["test"]])
    if every.size and every.min() < 0:
        raise FoalPipeError(f"{path} has negative labels (the smallest {int(every.min())}); labels must be 0..K-1")
    top = int(every.max(initial=-1))
    if names is not None:
        classes = [_class_name(path, k, n) for k, n in enumerate(np.asarray(names).reshape(-1).tolist())]
        beyond = int((every >= len(classes)).sum())
        if beyond:
            lie = "labels lie" if beyond != 1 else "label lies"
            raise FoalPipeError(f"{path}: {beyond:,} {lie} outside 0..{len(classes) - 1}, the "
                                f"{len(classes)} classes its 'classes' lists (the largest label is {top:,}); fix those "
                                "labels or list every class in 'classes'")
        clash = same_names(classes)
        if clash is not None:
            raise FoalPipeError(f"{path}: its 'classes' {clash}, two label ids for one class; list each class name "
                                "once (merge the labels of the two, or rename one)")
    else:
        unused = top + 1 - len(np.unique(every))
        if unused:
            raise FoalPipeError(f"{path}: its labels go up to {top:,}, so {top + 1:,} classes, but {unused:,} of the "
                                f"labels 0..{top:,} have no image in either split; fix the stray labels, or list the "
                                "class names in a 'classes' attribute if classes without images are meant")
        classes = [str(k) for k in range(top + 1)]
    sides = {h5_side(shapes[split]) for split in ("train", "test") if shapes[split][0]}
    return DatasetSplits("hdf5", classes, H5Source(path, "train", labels["train"], h5_layout(shapes["train"]), identity),
                         H5Source(path, "test", labels["test"], h5_layout(shapes["test"]), identity), str(path),
                         sides.pop() if len(sides) == 1 else None)  # one native size only when every image has it


#: What ``<split>/labels`` and ``classes`` should be (docs/datasets.md, "Expected layouts").
LABELS = "N integer labels 0..K-1, shape (N,)"
CLASSES = "K class names, one per label, as a list of strings (attribute or dataset 'classes')"


def _check_array(path: Path, name: str, node: Any, should: str) -> None:
    """Refuse ``name`` when it is not a dataset of values: a group, a named datatype, or an empty dataspace
    (``h5py.Empty``, which has no shape), naming what it is and what it ``should`` be."""
    import h5py

    if isinstance(node, h5py.Dataset) and node.shape is not None:
        return
    what = ("a group" if isinstance(node, h5py.Group) else "a named datatype" if isinstance(node, h5py.Datatype)
            else "a dataset with an empty dataspace (h5py.Empty, no values)" if isinstance(node, h5py.Dataset)
            else f"a {type(node).__name__}")
    raise FoalPipeError(f"{path}: {name} is {what}, not a dataset of values; it should be {should}")


def _short(value: Any) -> str:
    """``value`` (a NumPy scalar as its Python value, bytes as a str) as a short repr, for an error line."""
    value = value.item() if isinstance(value, np.generic) else value
    text = repr(value.decode(errors="replace") if isinstance(value, bytes) else value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _class_name(path: Path, k: int, name: Any) -> str:
    """Class ``k``'s name as text; bytes that are not UTF-8 (h5py gives an attribute's as lone surrogates) are refused:
    the name would crash, or be stored as other text than the file's, wherever it is written."""
    try:
        text = name.decode() if isinstance(name, bytes) else str(name)
        text.encode()
    except UnicodeError:
        raise FoalPipeError(f"{path}: its 'classes' name {k} ({clipped(repr(name))}) is not UTF-8 text; store the class names "
                            "as UTF-8 strings") from None
    return text


def _check_inside(f: Any, path: Path, name: str) -> None:
    """Refuse a dataset the loader reads whose bytes lie outside ``path``: an external link (on the way to it too),
    a soft link that leads into another file, external raw storage, or a virtual dataset. h5py would read another
    file the user can read (a key, a password) into the store. A missing ``name`` is left to the caller."""
    import h5py

    parts, why = name.split("/"), ""
    try:
        for k in range(1, len(parts) + 1):
            link = f.get("/".join(parts[:k]), getlink=True)
            if link is None:
                return
            if isinstance(link, h5py.ExternalLink):
                why = f"an external link to {link.filename}:{link.path}"
                break
        dataset = None if why else f.get(name)
    except (RuntimeError, KeyError) as exc:  # a soft link to itself: "too many links"
        raise FoalPipeError(f"{path}: {name} cannot be followed ({str(exc).splitlines()[0]}): a soft link that leads back "
                            f"to itself or nowhere; store the dataset itself there (f[{name!r}] = array)") from None
    if not why:
        if not isinstance(dataset, h5py.Dataset):
            return
        if dataset.file.filename != f.filename:
            why = f"a soft link into another file ({dataset.file.filename})"
        elif dataset.is_virtual:
            why = f"a virtual dataset mapping {', '.join(sorted({m.file_name for m in dataset.virtual_sources()}))}"
        elif dataset.external is not None:
            why = f"stored outside the file (external raw storage in {', '.join(str(e[0]) for e in dataset.external)})"
    if why:
        raise FoalPipeError(f"{path}: dataset {name} is {why}, not data stored in the file, and foal-pipe reads only the "
                            f"file it is given; store the data inside the file (write the array itself: f[{name!r}] = array)")


def _check_image_size(path: Path, split: str, shape: tuple[int, ...], layout: str) -> None:
    """Refuse images larger than an image file may be (twice Pillow's decompression-bomb limit, past which Pillow
    refuses to decode one): a tiny file may declare ``(2, 10**6, 10**6)``, and hashing or reading one image would
    end in a MemoryError. None as the limit (Pillow's check turned off) lets any size through, as for files."""
    from PIL import Image

    h, w = h5_sides(shape, layout)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and h * w > 2 * limit:
        raise FoalPipeError(f"{path}: each {split}/images image is {h:,} x {w:,} = {h * w:,} pixels, more than the "
                            f"{2 * int(limit):,} an image file may have (twice Pillow's decompression-bomb limit, "
                            "PIL.Image.MAX_IMAGE_PIXELS); store the images at a smaller size")
