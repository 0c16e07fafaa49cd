"""The ``hdf5`` dataset's rows: ``<split>/images`` of one file, read lazily in each process (:class:`H5Source`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.datasets.h5pixels import AGAIN, CHANGED, file_identity, h5_layout, h5_pixels, h5_unreadable, reread_images
from foal_pipe.datasets.sources import ImageSource
from foal_pipe.errors import FoalPipeError


class H5Source(ImageSource):
    """``<split>/images`` of an HDF5 file, read lazily; the file is reopened in each worker process."""

    hashed = True

    def __init__(self, path: Path, split: str, labels: np.ndarray, layout: str | None = None,
                 identity: tuple[int, ...] | None = None):
        self.path = str(path)
        self.identity = identity  # the file's when its labels were read (file_identity); None: not checked
        self.split = split
        self.layout = layout  # "HW", "HWC" or "CHW" (see h5_layout); None: judged from the dataset's shape
        self.labels = np.asarray(labels, dtype=np.int64)
        self.index = np.arange(len(self.labels), dtype=np.int64)
        self._handle: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None, "_pid": -1}

    def load(self, i: int) -> np.ndarray:
        if self._handle is None or self._pid != os.getpid():
            import h5py

            why = self.changed()
            if why is not None:
                raise FoalPipeError(why)
            handle = h5py.File(self.path, "r")
            reread_images(handle, self.path, self.split, self.labels, self.layout)  # the file the labels came from
            self._handle, self._pid = handle, os.getpid()
        images = self._handle[f"{self.split}/images"]
        if self.layout is None:
            self.layout = h5_layout(images.shape)
        img = np.asarray(images[i])
        if self.layout == "CHW":
            img = img.transpose(1, 2, 0)  # CHW -> HWC
        if img.ndim == 3 and img.shape[-1] == 1:
            img = img[..., 0]
        return h5_pixels(img, f"{self.split}/images[{i}]")

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle, self._pid = None, -1

    def describe(self, i: int) -> str:
        return f"{self.path}:{self.split}/images[{i}]"

    def changed(self) -> str | None:
        """The file replaced, or written to, since its labels were read: each split opens its own handle, so rows
        of another file would be stored under the first one's SHA-256, or two files' rows mixed."""
        if self.identity is None:
            return None
        try:
            same = file_identity(self.path) == self.identity
        except OSError as exc:
            return f"{self.path} {CHANGED}: {exc.strerror or exc}; {AGAIN}"
        return None if same else f"{self.path} {CHANGED} (another file, or written to); {AGAIN}"

    def unreadable(self) -> list[str]:
        """Rows whose values are not pixels (:func:`~foal_pipe.datasets.h5pixels.h5_unreadable`)."""
        return h5_unreadable(self.path, self.split)
