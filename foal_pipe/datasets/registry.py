"""The dataset registry: :data:`DATASETS` maps a name to its loader (README, "Adding a dataset")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from foal_pipe.datasets.benchmarks import (
    PTM_CIL,
    PTM_CIL_SOURCE,
    folder_benchmark_loader,
    load_cub200,
    locate_cub,
    locate_folder_benchmark,
)
from foal_pipe.datasets.loaders import (
    _TORCHVISION,
    DEFAULT_ROOT,
    FASHION_MNIST_DIR,
    _candidates,
    _first_match,
    _idx_file,
    load_class_folders,
    load_core50,
    load_digits,
    load_fashion_mnist,
    load_hdf5,
    load_imagefolder,
    load_images,
    load_tiny_imagenet,
    torchvision_lacks,
    torchvision_loader,
)
from foal_pipe.datasets.manifest import SplitManifest, apply_manifest
from foal_pipe.datasets.sources import DatasetSplits, same_names
from foal_pipe.errors import FoalPipeError, param


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset: its loader and the facts docs/datasets.md, ``foal-pipe datasets`` and error messages
    show. A ``splittable`` loader also takes ``test_split`` and ``split_seed`` (``extract --test-split``) for data
    with no test split. ``classes``: the class count a benchmark must have (None: whatever the data holds).
    ``locate(data_dir)``: where the data is found, without reading it (None: not there); no ``locate`` for the
    datasets that are the user's own files, found wherever ``--data-dir`` points. ``bundled_with``: the library that
    ships the data (digits: scikit-learn), which reads no folder, so a ``--data-dir`` is refused, not ignored."""

    load: Callable[..., DatasetSplits]
    source: str
    looks_in: str
    obtain: str
    splittable: bool = False
    classes: int | None = None
    locate: Callable[[Path | None], str | None] | None = None
    bundled_with: str | None = None


def _where(ok: Callable[[Path], bool], default: Path, subdir: str) -> Callable[[Path | None], str | None]:
    """A ``locate`` for a loader that looks in ``DIR/<subdir>``, then ``DIR`` (``default`` without ``DIR``)."""
    def locate(data_dir: Path | None) -> str | None:
        found = _first_match(_candidates(data_dir, default, subdir), ok)
        return str(found) if found is not None else None

    return locate


def _torchvision_where(name: str) -> Callable[[Path | None], str | None]:
    """A ``locate`` for a torchvision dataset: its folder under the root (``DIR``, default ``~/datasets``), holding
    the files torchvision needs (an incomplete one is not found)."""
    def locate(data_dir: Path | None) -> str | None:
        root = (data_dir or DEFAULT_ROOT).expanduser()
        return str(root / _TORCHVISION[name].folder) if torchvision_lacks(name, root) == [] else None

    return locate


def _torchvision_entry(name: str, classes: int) -> DatasetEntry:
    folder = _TORCHVISION[name].folder
    return DatasetEntry(torchvision_loader(name), "torchvision", f"~/datasets/{folder}; DIR/{folder}", "--download",
                        classes=classes, locate=_torchvision_where(name))


_FASHION_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                  "t10k-labels-idx1-ubyte")


DATASETS: dict[str, DatasetEntry] = {
    "digits": DatasetEntry(load_digits, "scikit-learn (bundled)", "nowhere: ships with scikit-learn",
                           "nothing to do (offline)", classes=10, locate=lambda data_dir: "scikit-learn (bundled)",
                           bundled_with="scikit-learn"),
    "fashion-mnist": DatasetEntry(load_fashion_mnist, "IDX files", f"{FASHION_MNIST_DIR}, or DIR/fashion-mnist or DIR",
                                  "apt-get install dataset-fashion-mnist", classes=10,
                                  locate=_where(lambda d: all(_idx_file(d, s) for s in _FASHION_STEMS),
                                                FASHION_MNIST_DIR, "fashion-mnist")),
    **{name: _torchvision_entry(name, classes)
       for name, classes in (("cifar100", 100), ("dtd", 47), ("dtd-trainval", 47), ("fgvc-aircraft", 100),
                             ("fgvc-aircraft-trainval", 100), ("country211", 211))},
    "core50": DatasetEntry(load_core50, "local folder", "~/datasets/core50_128x128; DIR/core50_128x128 or DIR",
                           "core50_128x128.zip", classes=50,
                           locate=_where(lambda d: (d / "s1").is_dir(), DEFAULT_ROOT / "core50_128x128",
                                         "core50_128x128")),
    "tiny-imagenet": DatasetEntry(load_tiny_imagenet, "local folder",
                                  "~/datasets/tiny-imagenet-200; DIR/tiny-imagenet-200 or DIR", "tiny-imagenet-200.zip",
                                  classes=200,
                                  locate=_where(lambda d: (d / "train").is_dir()
                                                and (d / "val" / "val_annotations.txt").is_file(),
                                                DEFAULT_ROOT / "tiny-imagenet-200", "tiny-imagenet-200")),
    "cub200": DatasetEntry(load_cub200, "CUB-200-2011 archive, official split",
                           "~/datasets/CUB_200_2011; DIR/CUB_200_2011 or DIR",
                           "CUB_200_2011.tgz (data.caltech.edu/records/65de6-vzc59)", classes=200, locate=locate_cub),
    **{name: DatasetEntry(folder_benchmark_loader(name), "PTM-CIL split (train/, test/)",
                          f"~/datasets/{bench.folders[0]}; " + " or ".join(f"DIR/{f}" for f in bench.folders) + " or DIR",
                          PTM_CIL_SOURCE, classes=bench.classes, locate=locate_folder_benchmark(name))
       for name, bench in PTM_CIL.items()},
    "imagefolder": DatasetEntry(load_imagefolder, "local folder",
                                "DIR/train/<class>, DIR/test/<class>; DIR/<class> with --test-split",
                                "your own images", splittable=True),
    "images": DatasetEntry(load_images, "local folder", "DIR (recursively), unlabelled: the test split",
                           "your own images"),
    "hdf5": DatasetEntry(load_hdf5, "one .h5 file", "the file given as --data-dir", "your own file"),
}


def open_dataset(name: str, data_dir: str | Path | None = None, download: bool = False,
                 test_split: float | None = None, split_seed: int = 0,
                 split_manifest: SplitManifest | None = None, manifest_source: str = "the split manifest") -> DatasetSplits:
    """Open a registered dataset; a missing one raises :class:`FoalPipeError` naming the path looked for.
    ``test_split`` (a fraction) splits a dataset that has no test split, seeded by ``split_seed``;
    ``split_manifest`` (read from ``manifest_source`` by :func:`foal_pipe.extract.manifest.read_manifest`) takes the
    splits it lists from the dataset's images."""
    entry = DATASETS.get(name)
    if entry is None:
        raise FoalPipeError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if data_dir is not None and entry.bundled_with is not None:
        raise FoalPipeError(f"{param('dataset', name)} ships with {entry.bundled_with} and reads no folder, so "
                            f"{param('data_dir')} does not apply; drop {param('data_dir')}")
    if download and entry.source != "torchvision":  # torchvision's loaders are the ones that download
        fetched = ", ".join(k for k, e in DATASETS.items() if e.source == "torchvision")
        raise FoalPipeError(f"{param('dataset', name)} is read from files already on this machine; only torchvision's "
                            f"datasets ({fetched}) are downloaded, so {param('download', True)} would be ignored; drop "
                            f"{param('download')}")
    folder = Path(data_dir) if data_dir is not None else None
    if split_manifest is not None:
        if test_split is not None:
            raise FoalPipeError(f"{param('split_manifest')} lists the split itself; drop {param('test_split')}")
        if name == "imagefolder" and folder is not None:  # the manifest splits: a class may lie in one split folder
            pool = (load_imagefolder(folder, download, pooled=True) if (folder.expanduser() / "train").is_dir()
                    else load_class_folders(folder))
        else:
            pool = entry.load(folder, download)
        splits = apply_manifest(pool, split_manifest, manifest_source)
    elif test_split is None:
        splits = entry.load(folder, download)
    elif entry.splittable:
        splits = entry.load(folder, download, test_split=test_split, split_seed=split_seed)
    else:
        raise FoalPipeError(f"{param('dataset', name)} comes with its own train and test splits; drop {param('test_split')} "
                            f"(it splits a folder of class folders: {param('dataset', 'imagefolder')})")
    clash = same_names(splits.classes)
    if clash is not None:  # a store's readers refuse such classes: refused here, before any store is written
        raise FoalPipeError(f"dataset {name} at {splits.location}: its classes {clash}, two label ids for one class; "
                            "give each class one name")
    for split in ("train", "test") if name != "images" else ("test",):  # unlabelled images: no train split
        if len(splits.split(split)) == 0:
            raise FoalPipeError(f"dataset {name} has no {split} images at {splits.location}; check {param('data_dir')}")
    return splits
