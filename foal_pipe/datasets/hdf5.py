"""The ``hdf5`` dataset: one ``.h5`` file of images and integer labels per split."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from foal_pipe.datasets.sources import H5_PIXELS, H5_SHAPES, DatasetSplits, H5Source, h5_layout, h5_side, same_names
from foal_pipe.errors import FoalPipeError, param


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
        f = h5py.File(path, "r")
    except OSError as exc:
        raise FoalPipeError(f"cannot open {path} as HDF5 ({exc}); pass a .h5 file made with h5py") from None
    with f:
        labels, shapes = {}, {}
        for split in ("train", "test"):
            for key in ("images", "labels"):
                if f"{split}/{key}" not in f:
                    raise FoalPipeError(f"{path} has no dataset {split}/{key}; it needs train/images, "
                                        "train/labels, test/images and test/labels")
            raw = f[f"{split}/labels"]
            if raw.dtype.kind not in "iu":  # floats (NaN included) and booleans are not label ids
                raise FoalPipeError(f"{path}: dataset {split}/labels has dtype {raw.dtype}; labels must be integers "
                                    "0..K-1: store them with an integer dtype (e.g. labels.astype('int64'))")
            if f[f"{split}/images"].dtype.kind not in "iuf":
                raise FoalPipeError(f"{path}: dataset {split}/images has dtype {f[f'{split}/images'].dtype}; images "
                                    f"must be {H5_PIXELS}")
            labels[split] = np.asarray(raw[:]).astype(np.int64).reshape(-1)
            shapes[split] = f[f"{split}/images"].shape
            if shapes[split][0] != len(labels[split]) or h5_layout(shapes[split]) is None:
                raise FoalPipeError(f"{path}: {split}/images has shape {shapes[split]} and {split}/labels "
                                    f"{len(labels[split])} rows; expected N labels and N images of shape {H5_SHAPES}")
        names = f.attrs.get("classes")
        if names is None and "classes" in f:
            names = f["classes"][:]
    every = np.concatenate([labels["train"], labels["test"]])
    if every.size and every.min() < 0:
        raise FoalPipeError(f"{path} has negative labels (the smallest {int(every.min())}); labels must be 0..K-1")
    top = int(every.max(initial=-1))
    if names is not None:
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in np.asarray(names).reshape(-1).tolist()]
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
    return DatasetSplits("hdf5", classes, H5Source(path, "train", labels["train"], h5_layout(shapes["train"])),
                         H5Source(path, "test", labels["test"], h5_layout(shapes["test"])), str(path),
                         sides.pop() if len(sides) == 1 else None)  # one native size only when every image has it
