"""Image datasets for ``foal-pipe extract``, behind one registry (:data:`DATASETS`).

Every dataset opens to a :class:`DatasetSplits`: the class names and one :class:`ImageSource` per split.
A source knows its labels up front (so a store can be created before any image is decoded) and loads one
image at a time, lazily, by position; :class:`PreparedImages` turns a source into the fixed-size uint8
arrays a DataLoader batches. Torch and torchvision are imported only inside the loaders that need them.

Rows keep dataset order. Register a new dataset by adding a :class:`DatasetEntry` to :data:`DATASETS`
(README, "Adding a dataset").
"""

from foal_pipe.datasets.h5source import H5Source
from foal_pipe.datasets.registry import DATASETS, DatasetEntry, open_dataset
from foal_pipe.datasets.sources import (
    IMAGE_EXTENSIONS,
    ArraySource,
    DatasetSplits,
    FileSource,
    ImageSource,
    PreparedImages,
    TorchvisionSource,
    to_rgb_array,
)

__all__ = [
    "DATASETS", "IMAGE_EXTENSIONS", "ArraySource", "DatasetEntry", "DatasetSplits", "FileSource", "H5Source",
    "ImageSource", "PreparedImages", "TorchvisionSource", "open_dataset", "to_rgb_array"
]
