"""The dataset registry: :data:`DATASETS` maps a name to its loader (README, "Adding a dataset")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from foal_pipe.datasets.loaders import (
    FASHION_MNIST_DIR,
    load_core50,
    load_digits,
    load_fashion_mnist,
    load_hdf5,
    load_imagefolder,
    load_images,
    load_tiny_imagenet,
    torchvision_loader,
)
from foal_pipe.datasets.sources import DatasetSplits
from foal_pipe.errors import FoalPipeError, param


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset: its loader and the facts the README table and error messages show. A ``splittable``
    loader also takes ``test_split`` and ``split_seed`` (``extract --test-split``) for data with no test split."""

    load: Callable[..., DatasetSplits]
    source: str
    looks_in: str
    obtain: str
    splittable: bool = False


DATASETS: dict[str, DatasetEntry] = {
    "digits": DatasetEntry(load_digits, "scikit-learn (bundled)", "nowhere: ships with scikit-learn",
                           "nothing to do (offline)"),
    "fashion-mnist": DatasetEntry(load_fashion_mnist, "IDX files", f"{FASHION_MNIST_DIR}, or DIR/fashion-mnist or DIR",
                                  "apt-get install dataset-fashion-mnist"),
    "cifar100": DatasetEntry(torchvision_loader("cifar100"), "torchvision", "DIR/cifar-100-python",
                             "--download"),
    "dtd": DatasetEntry(torchvision_loader("dtd"), "torchvision", "DIR/dtd", "--download"),
    "fgvc-aircraft": DatasetEntry(torchvision_loader("fgvc-aircraft"), "torchvision", "DIR/fgvc-aircraft-2013b",
                                  "--download"),
    "country211": DatasetEntry(torchvision_loader("country211"), "torchvision", "DIR/country211", "--download"),
    "core50": DatasetEntry(load_core50, "local folder", "DIR/core50_128x128 or DIR", "core50_128x128.zip"),
    "tiny-imagenet": DatasetEntry(load_tiny_imagenet, "local folder", "DIR/tiny-imagenet-200 or DIR",
                                  "tiny-imagenet-200.zip"),
    "imagefolder": DatasetEntry(load_imagefolder, "local folder",
                                "DIR/train/<class>, DIR/test/<class>; DIR/<class> with --test-split",
                                "your own images", splittable=True),
    "images": DatasetEntry(load_images, "local folder", "DIR (recursively), unlabelled: the test split",
                           "your own images"),
    "hdf5": DatasetEntry(load_hdf5, "one .h5 file", "the file given as --data-dir", "your own file"),
}


def open_dataset(name: str, data_dir: str | Path | None = None, download: bool = False,
                 test_split: float | None = None, split_seed: int = 0) -> DatasetSplits:
    """Open a registered dataset; a missing one raises :class:`FoalPipeError` naming the path looked for.
    ``test_split`` (a fraction) splits a dataset that has no test split, seeded by ``split_seed``."""
    entry = DATASETS.get(name)
    if entry is None:
        raise FoalPipeError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    folder = Path(data_dir) if data_dir is not None else None
    if test_split is None:
        splits = entry.load(folder, download)
    elif entry.splittable:
        splits = entry.load(folder, download, test_split=test_split, split_seed=split_seed)
    else:
        raise FoalPipeError(f"{param('dataset', name)} comes with its own train and test splits; drop {param('test_split')} "
                            f"(it splits a folder of class folders: {param('dataset', 'imagefolder')})")
    for split in ("train", "test") if name != "images" else ("test",):  # unlabelled images: no train split
        if len(splits.split(split)) == 0:
            raise FoalPipeError(f"dataset {name} has no {split} images at {splits.location}; check {param('data_dir')}")
    return splits
