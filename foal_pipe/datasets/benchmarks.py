"""The benchmarks of class-incremental learning on a frozen pretrained backbone (docs/datasets.md, "Benchmarks"):
CUB-200-2011 from its own archive with its official split, and ImageNet-R, ImageNet-A, ObjectNet, OmniBenchmark
and VTAB in the ``train/<class>/``, ``test/<class>/`` split the PTM-CIL code bases (LAMDA-PILOT, RanPAC)
distribute. Each loader checks the class count the benchmark has, so a partly unpacked archive or the wrong folder
is refused instead of becoming a smaller benchmark under the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from foal_pipe.datasets.loaders import DEFAULT_ROOT, _candidates, _first_match, _folder_split, _missing
from foal_pipe.datasets.sources import DatasetSplits, FileSource
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.io.pathtext import os_path, path_text

#: Where the PTM-CIL splits are published: LAMDA-PILOT's README (section "Datasets") links the archives.
PTM_CIL_SOURCE = "the archive linked from LAMDA-PILOT's README (github.com/sun-hailong/LAMDA-PILOT, section Datasets)"


@dataclass(frozen=True)
class FolderBenchmark:
    """A PTM-CIL benchmark: ``classes`` class folders in ``train/`` and ``test/`` of one of ``folders`` (under
    ``--data-dir``, or ``~/datasets``), in the layout LAMDA-PILOT's ``utils/data.py`` reads."""

    name: str
    classes: int
    folders: tuple[str, ...]
    title: str


PTM_CIL = {
    "imagenet-r": FolderBenchmark("imagenet-r", 200, ("imagenet-r",), "ImageNet-R"),
    "imagenet-a": FolderBenchmark("imagenet-a", 200, ("imagenet-a",), "ImageNet-A"),
    "objectnet": FolderBenchmark("objectnet", 200, ("objectnet",), "ObjectNet"),
    "omnibenchmark": FolderBenchmark("omnibenchmark", 300, ("omnibenchmark",), "OmniBenchmark"),
    "vtab": FolderBenchmark("vtab", 50, ("vtab-cil/vtab", "vtab"), "VTAB"),
}
CUB_CLASSES = 200
CUB_FOLDER = "CUB_200_2011"
CUB_FILES = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt")


def _is_split_folder(root: Path) -> bool:
    return (root / "train").is_dir() and (root / "test").is_dir()


def _benchmark_candidates(data_dir: Path | None, folders: tuple[str, ...]) -> list[Path]:
    if data_dir is None:
        return [DEFAULT_ROOT.expanduser() / folders[0]]
    return [*(data_dir.expanduser() / f for f in folders), data_dir.expanduser()]


def locate_folder_benchmark(name: str) -> Callable[[Path | None], str | None]:
    """Where ``name``'s ``train/`` and ``test/`` folders are for a ``--data-dir`` (None: not there)."""
    bench = PTM_CIL[name]

    def locate(data_dir: Path | None) -> str | None:
        found = _first_match(_benchmark_candidates(data_dir, bench.folders), _is_split_folder)
        return str(found) if found is not None else None

    return locate


def folder_benchmark_loader(name: str) -> Callable[[Path | None, bool], DatasetSplits]:
    """The loader of the PTM-CIL benchmark ``name``: classes are the sorted folder names of ``train/`` (the label
    ids torchvision's ImageFolder gives, as in LAMDA-PILOT), checked against the benchmark's class count."""
    bench = PTM_CIL[name]

    def load(data_dir: Path | None, download: bool) -> DatasetSplits:
        looked = _benchmark_candidates(data_dir, bench.folders)
        root = _first_match(looked, _is_split_folder)
        if root is None:
            raise _missing(bench.title, looked, "train/<class>/ and test/<class>/ folders",
                           f"download {PTM_CIL_SOURCE}, unpack it and pass {param('data_dir')} pointing at "
                           f"{bench.folders[0]} or its parent")
        folders = {split: sorted(path_text(d.name) for d in (root / split).iterdir() if d.is_dir())
                   for split in ("train", "test")}
        classes = folders["train"]
        if len(classes) != bench.classes:
            raise FoalPipeError(f"{bench.title} at {root} has {len(classes)} class folders in train/, but the benchmark "
                                f"has {bench.classes}; unpack the whole archive, or use "
                                f"{param('dataset', 'imagefolder')} for a subset of it")
        if folders["test"] != classes:
            odd = sorted(set(classes) ^ set(folders["test"]))
            raise FoalPipeError(f"{bench.title} at {root}: test/ and train/ hold different class folders ({odd[0]!r} "
                                f"is in one only, {len(odd)} in all); unpack the whole archive again")
        sources = {}
        searched: dict[tuple[int, int], Path] = {}  # one record for both splits: a test folder linked to a train one
        for split in ("train", "test"):
            paths, labels = _folder_split(root / split, classes, searched)
            empty = sorted(set(range(len(classes))) - set(labels))
            if empty:
                raise FoalPipeError(f"{bench.title} at {root}: {split}/{classes[empty[0]]} holds no images "
                                    f"({len(empty)} empty class folder{'s' * (len(empty) != 1)} in {split}/); unpack "
                                    "the whole archive again")
            sources[split] = FileSource(paths, labels, root / split)
        return DatasetSplits(name, classes, sources["train"], sources["test"], path_text(root))

    load.__doc__ = f"{bench.title}: the PTM-CIL split, {bench.classes} classes in train/<class>/ and test/<class>/."
    return load


def _cub_root(data_dir: Path | None) -> tuple[Path | None, list[Path]]:
    looked = _candidates(data_dir, DEFAULT_ROOT / CUB_FOLDER, CUB_FOLDER)
    return _first_match(looked, lambda d: (d / "images.txt").is_file() and (d / "images").is_dir()), looked


def locate_cub(data_dir: Path | None) -> str | None:
    root, _ = _cub_root(data_dir)
    return str(root) if root is not None else None


def _read_table(root: Path, name: str) -> dict[int, str]:
    """``<id> <value>`` per line of one of the archive's text files, as ``{id: value}``."""
    path = root / name
    if not path.is_file():
        raise FoalPipeError(f"CUB-200-2011 at {root} lacks {name}; unpack the whole CUB_200_2011.tgz again")
    table: dict[int, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        if not key.isdigit() or not value or int(key) in table:
            raise FoalPipeError(f"{path} line {number} is {line.strip()[:40]!r}, expected '<id> <value>' with each id "
                                "once; unpack the archive again")
        table[int(key)] = value.strip()
    return table


def load_cub200(data_dir: Path | None, download: bool) -> DatasetSplits:
    """CUB-200-2011 as its archive unpacks, with its official split (``train_test_split.txt``); class names from
    ``classes.txt``, rows in image-id order."""
    root, looked = _cub_root(data_dir)
    if root is None:
        raise _missing("CUB-200-2011", looked, "images.txt and images/<NNN.Name>/",
                       "download CUB_200_2011.tgz (data.caltech.edu/records/65de6-vzc59), unpack it and pass "
                       f"{param('data_dir')} pointing at CUB_200_2011 or its parent")
    images, labels, is_train, names = (_read_table(root, name) for name in CUB_FILES)
    if sorted(names) != list(range(1, len(names) + 1)) or len(names) != CUB_CLASSES:
        raise FoalPipeError(f"{root / 'classes.txt'} lists {len(names)} classes, but CUB-200-2011 has {CUB_CLASSES} "
                            "numbered 1 to 200; unpack the whole archive again")
    classes = [names[k] for k in range(1, CUB_CLASSES + 1)]
    paths: dict[str, list[Path]] = {"train": [], "test": []}
    rows: dict[str, list[int]] = {"train": [], "test": []}
    valid = {str(k) for k in names}
    for image_id in sorted(images):
        label, flag = labels.get(image_id), is_train.get(image_id)
        if label not in valid or flag not in ("0", "1"):
            raise FoalPipeError(f"CUB-200-2011 at {root}: image {image_id} has class {label!r} in image_class_labels.txt "
                                f"and split {flag!r} in train_test_split.txt (expected 1-200 and 0 or 1); unpack the "
                                "archive again")
        path = root / "images" / os_path(images[image_id])
        if not path.is_file():
            raise FoalPipeError(f"CUB-200-2011 at {root}: {path} is missing (images.txt lists it); unpack the whole "
                                "archive again")
        split = "train" if flag == "1" else "test"
        paths[split].append(path)
        rows[split].append(int(label) - 1)
    return DatasetSplits("cub200", classes, FileSource(paths["train"], rows["train"], root / "images"),
                         FileSource(paths["test"], rows["test"], root / "images"), path_text(root))
