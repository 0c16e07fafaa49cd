"""The identity of a dataset's images where no split manifest names them (torchvision, HDF5): one SHA-256 per split
over its images in row order. A store records it (attribute ``data_sha256``, docs/feature-store.md), so ``extract``
refuses to resume, or to call complete, a store whose data changed with the same rows and classes (a corrected
HDF5 file, replaced image files): row counts and classes alone would not tell.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from foal_pipe.datasets.h5pixels import H5_READ_ERRORS, h5_read_error, reread_images
from foal_pipe.datasets.h5source import H5Source
from foal_pipe.datasets.sources import (
    ArraySource,
    DatasetSplits,
    FileSource,
    ImageSource,
    TorchvisionSource,
    hash_files,
)

#: The most bytes of an array hashed at once: an HDF5 dataset larger than the memory is read a slice at a time.
SLICE_BYTES = 64 << 20


def data_sha256(data: DatasetSplits) -> dict[str, str] | None:
    """Each split's :func:`split_sha256`; None when a split's source cannot say (a custom source)."""
    digests = {}
    for split in ("train", "test"):
        digest = split_sha256(data.split(split))
        if digest is None:
            return None
        digests[split] = digest
    return digests


def split_sha256(source: ImageSource) -> str | None:
    """The SHA-256 of a split's images in row order, as the loader holds them: an array (HDF5's ``<split>/images``,
    CIFAR-100's ``data``) by its dtype, shape and bytes in C order, so the file's chunking or compression does not
    count; image files by each file's SHA-256. Measured: 60,000 CIFAR-sized images (184 MB) hash in 0.1-0.2 s in
    memory, 0.4-0.5 s read from an HDF5 file (gzip or not). None for a source this module does not know."""
    digest = hashlib.sha256()
    if isinstance(source, H5Source):
        import h5py

        try:
            with h5py.File(source.path, "r") as f:
                _hash_array(digest, reread_images(f, source.path, source.split, source.labels, source.layout))
        except H5_READ_ERRORS as exc:
            raise h5_read_error(source.path, exc) from None
    elif isinstance(source, TorchvisionSource):
        if not all(_hash_part(digest, part) for part in source.parts):
            return None
    elif isinstance(source, ArraySource):
        _hash_array(digest, source.images)
    elif isinstance(source, FileSource):
        _hash_files(digest, source.paths)
    else:
        return None
    return digest.hexdigest()


def _hash_array(digest: Any, array: Any) -> None:
    """Add an array of images (NumPy or h5py, one image a row) to ``digest``: its dtype and shape, then its bytes,
    :data:`SLICE_BYTES` at a time."""
    digest.update(f"{np.dtype(array.dtype).str}{tuple(int(n) for n in array.shape)}".encode())
    row = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * np.dtype(array.dtype).itemsize)
    step = max(1, SLICE_BYTES // row)
    for lo in range(0, int(array.shape[0]), step):
        digest.update(np.ascontiguousarray(array[lo : lo + step]))


def _hash_files(digest: Any, paths: Sequence[str]) -> None:
    """Add image files to ``digest``: each file's SHA-256 (64 hex digits), in order."""
    for hexdigest in hash_files(paths):
        digest.update(hexdigest.encode())


def _hash_part(digest: Any, part: Any) -> bool:
    """Add one torchvision dataset to ``digest``: the images it holds in memory (CIFAR's ``data``) or the files it
    reads them from (``_image_files`` of DTD and FGVCAircraft, ``samples`` of Country211, an ImageFolder). False when
    it has neither."""
    data = getattr(part, "data", None)
    if isinstance(data, np.ndarray):
        _hash_array(digest, data)
        return True
    files = getattr(part, "_image_files", None)
    if files is None and isinstance(getattr(part, "samples", None), list):
        files = [sample[0] for sample in part.samples]
    if files is None or len(files) != len(part):
        return False
    _hash_files(digest, [str(path) for path in files])
    return True
