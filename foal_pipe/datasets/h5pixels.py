"""What an HDF5 ``<split>/images`` dataset may hold: the shapes (:func:`h5_layout`) and the pixel values
(:func:`h5_pixels`), and the rows whose values are not pixels, found before a store is written (:func:`h5_unreadable`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError

#: What pixel values an HDF5 image may hold, by dtype kind: uint8 as is, other integers in 0..255, floats in
#: [0, 1] (scaled by 255). Anything else is refused rather than cast.
H5_PIXELS = "uint8, integers in 0..255, or floats in [0, 1]"

#: The shapes an HDF5 ``<split>/images`` dataset may have (C: 1 grey, 3 RGB, 4 RGBA, whose alpha is dropped as
#: PIL's ``convert("RGB")`` drops an RGBA PNG's).
H5_SHAPES = "(N, H, W), (N, H, W, C) or (N, C, H, W) with C = 1 (grey), 3 (RGB) or 4 (RGBA)"

#: The most bytes of ``<split>/images`` :func:`h5_unreadable` reads at once (a dataset larger than the memory).
SLICE_BYTES = 64 << 20


def h5_layout(shape: Sequence[int]) -> str | None:
    """How the images of an HDF5 dataset of ``shape`` lie: ``"HW"`` (grey), ``"HWC"`` or ``"CHW"``, C being 1, 3
    or 4 (RGBA); a last axis of 1 or 3 is channels before a second axis of 1 or 3 (the rule before RGBA was read),
    then a last axis of 4 before a second axis of 4. None: not images (:data:`H5_SHAPES`), images of no pixels (a
    height or width of 0) included: each would be one grey image, all rows alike."""
    layout = _channels_at(shape)
    return None if layout is None or min(h5_sides(shape, layout)) < 1 else layout


def _channels_at(shape: Sequence[int]) -> str | None:
    """:func:`h5_layout` by the number of axes and channels alone."""
    if len(shape) == 3:
        return "HW"
    if len(shape) != 4:
        return None
    for channels in ((1, 3), (4,)):
        if shape[-1] in channels:
            return "HWC"
        if shape[1] in channels:
            return "CHW"
    return None


def h5_side(shape: Sequence[int]) -> int | None:
    """The side of the square images of an HDF5 dataset of ``shape`` (None: not square, or not images)."""
    layout = h5_layout(shape)
    if layout is None:
        return None
    h, w = h5_sides(shape, layout)
    return h if h == w else None


def h5_sides(shape: Sequence[int], layout: str) -> tuple[int, int]:
    """Height and width of the images of a dataset of ``shape`` lying as ``layout`` (:func:`h5_layout`)."""
    h, w = shape[2:4] if layout == "CHW" else shape[1:3]
    return int(h), int(w)


def h5_pixels(img: np.ndarray, key: str) -> np.ndarray:
    """An HDF5 image as uint8, or a ValueError naming ``key`` when its values are not pixels (NaN, out of
    range, or a dtype that is not numbers): a silent clip or cast would change the features."""
    if img.dtype == np.uint8:
        return img
    if img.dtype.kind in "iu":
        lo, hi = int(img.min(initial=0)), int(img.max(initial=0))
        if lo < 0 or hi > 255:
            raise ValueError(f"{key} has values {lo}..{hi}, outside 0..255; images must be {H5_PIXELS}")
        return img.astype(np.uint8)
    if img.dtype.kind == "f":
        if not np.isfinite(img).all():
            raise ValueError(f"{key} has NaN or inf pixel values; images must be {H5_PIXELS}")
        flo, fhi = float(img.min(initial=0.0)), float(img.max(initial=0.0))
        if flo < 0 or fhi > 1:
            raise ValueError(f"{key} has float values {flo:g}..{fhi:g}, outside [0, 1] (0..255 data: store it as "
                             f"uint8); images must be {H5_PIXELS}")
        return np.rint(img.astype(np.float64) * 255.0).astype(np.uint8)
    raise ValueError(f"{key} has dtype {img.dtype}; images must be {H5_PIXELS}")


#: What h5py raises reading a file that is damaged or changed under it (a dataset gone: KeyError).
H5_READ_ERRORS = (OSError, RuntimeError, KeyError)


def h5_read_error(path: str, exc: BaseException) -> FoalPipeError:
    """The one-line refusal of a file h5py could not read: the first line of its reason."""
    return FoalPipeError(f"cannot read {path} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                         "restore the file")


def h5_unreadable(path: str, split: str) -> list[str]:
    """The rows of ``<split>/images`` whose values :func:`h5_pixels` refuses, each as ``FILE:<split>/images[i]``,
    the first with why. The store records the images' SHA-256, so a file corrected after the store was begun could
    not be resumed: reading every image once first (uint8 needs no look) refuses it before anything is written.
    Measured: 60,000 CIFAR-sized float32 images (737 MB) in 0.2 s, the file in the page cache."""
    import h5py

    key = f"{split}/images"
    try:
        with h5py.File(path, "r") as f:
            images = reread_images(f, path, split)
            n = int(images.shape[0])
            if images.dtype == np.uint8 or not n:
                return []
            top = 255 if images.dtype.kind in "iu" else 1
            step = max(1, SLICE_BYTES // max(1, int(np.prod(images.shape[1:], dtype=np.int64)) * images.dtype.itemsize))
            bad: list[int] = []
            for lo in range(0, n, step):
                rows = np.asarray(images[lo : lo + step]).reshape(min(step, n - lo), -1)
                fine = (rows.min(axis=1) >= 0) & (rows.max(axis=1) <= top)  # NaN compares False: not fine
                bad += (lo + np.flatnonzero(~fine)).tolist()
            if not bad:
                return []
            why = _why(images[bad[0]], f"{key}[{bad[0]}]")
    except H5_READ_ERRORS as exc:
        raise h5_read_error(path, exc) from None
    return [f"{path}:{key}[{bad[0]}] ({why})"] + [f"{path}:{key}[{i}]" for i in bad[1:]]


#: The end of an error for a file that changed after ``load_hdf5`` read it (a file being written, or replaced).
CHANGED = "changed since foal-pipe first read it"


def file_identity(path: str | Path) -> tuple[int, ...]:
    """What tells the file at ``path`` from another one put there, or itself written to: its device, inode, size and
    time of last change. Compared whenever the file is opened again and before each chunk is recorded
    (:meth:`~foal_pipe.datasets.sources.H5Source.changed`): the store's ``data_sha256`` is the first read's."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
AGAIN = "re-run the command once nothing writes the file"


def reread_images(f: Any, path: str, split: str, labels: np.ndarray | None = None, layout: str | None = None) -> Any:
    """``<split>/images`` of the open file ``f`` at ``path``, read again after ``load_hdf5`` checked the file: refused in
    one line when the file changed in between so that it is gone or not a dataset, or, given the ``labels`` and
    ``layout`` (None: not known) read then, when its row count, layout or labels differ. A store would otherwise pair
    the labels read first with other images, or record the SHA-256 of images it does not hold the features of."""
    import h5py

    key = f"{split}/images"
    images, now = f.get(key), f.get(f"{split}/labels")
    if not isinstance(images, h5py.Dataset) or images.shape is None:
        raise FoalPipeError(f"{path} {CHANGED}: {key} is gone or no longer a dataset; {AGAIN}")
    if labels is None:
        return images
    if images.shape[0] != len(labels) or layout not in (None, h5_layout(images.shape)):
        lying = f" lying as {layout}" if layout else ""
        raise FoalPipeError(f"{path} {CHANGED}: its {key} have shape {images.shape} now, where {len(labels):,} images"
                            f"{lying} were read then; {AGAIN}")
    read = np.asarray(now[:]).astype(np.int64).reshape(-1) if isinstance(now, h5py.Dataset) and now.shape else None
    if read is None or read.shape != labels.shape:
        raise FoalPipeError(f"{path} {CHANGED}: its {split}/labels are not the {len(labels):,} labels read then; {AGAIN}")
    differ = np.flatnonzero(read != labels)
    if differ.size:
        row = int(differ[0])
        raise FoalPipeError(f"{path} {CHANGED}: its {split}/labels differ from those read then ({differ.size:,} rows, "
                            f"the first row {row}: {int(labels[row])} then, {int(read[row])} now); {AGAIN}")
    return images


def _why(img: Any, key: str) -> str:
    """:func:`h5_pixels`'s reason for refusing ``img``."""
    try:
        h5_pixels(np.asarray(img), key)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"{key} was found not to be pixels")  # the scan and h5_pixels apply one rule
