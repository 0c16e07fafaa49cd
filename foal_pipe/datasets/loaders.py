"""One loader per dataset: ``(data_dir or None, download) -> DatasetSplits`` (hdf5's in
:mod:`foal_pipe.datasets.hdf5`). Torch and torchvision are
imported only inside the loaders that need them.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.datasets.hdf5 import load_hdf5 as load_hdf5
from foal_pipe.datasets.sources import (
    IMAGE_EXTENSIONS,
    ArraySource,
    DatasetSplits,
    FileSource,
    TorchvisionSource,
    _is_image_entry,
    clash_text,
    images_in,
    name_clash,
    natural_key,
    nfc,
    nfc_key,
)
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.io import UNLABELLED
from foal_pipe.io.pathtext import os_path, path_text

DEFAULT_ROOT = Path("~/datasets")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@contextmanager
def removing_new_folders(path: Path) -> Iterator[None]:
    """Remove, when the body fails, the folders on the way to ``path`` (itself included) that did not exist before
    and are left empty: a refused run leaves nothing behind, and a folder that existed before is never touched."""
    new = [p for p in (path, *path.parents) if not os.path.lexists(p)]  # deepest first
    try:
        yield
    except BaseException:
        for folder in new:
            try:
                folder.rmdir()
            except OSError:  # not empty (a partial store to resume, a download's file), or gone: the rest hold it
                break
        raise


def _candidates(data_dir: Path | None, default: Path, subdir: str) -> list[Path]:
    """Where a local dataset may be: ``DIR/<subdir>`` or ``DIR`` itself (``--data-dir``), else the default."""
    if data_dir is None:
        return [default.expanduser()]
    base = data_dir.expanduser()
    return [base / subdir, base] if subdir else [base]


def _first_match(candidates: list[Path], ok: Callable[[Path], bool]) -> Path | None:
    return next((c for c in candidates if ok(c)), None)


def _missing(what: str, looked: list[Path], expected: str, obtain: str) -> FoalPipeError:
    where = " or ".join(str(p) for p in looked)
    return FoalPipeError(f"{what} not found: looked for {expected} in {where}; {obtain}")


def load_digits(data_dir: Path | None, download: bool) -> DatasetSplits:
    """scikit-learn's bundled 8x8 digits (1,797 images); test = every 5th image of each class."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    y = bunch.target.astype(np.int64)
    test_mask = np.zeros(len(y), bool)
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        test_mask[rows[4::5]] = True  # positions 4, 9, 14, ... within the class: a fixed 80/20 stratified split
    tr, te = np.flatnonzero(~test_mask), np.flatnonzero(test_mask)
    return DatasetSplits(
        "digits",
        [str(c) for c in range(10)],
        ArraySource(images[tr], y[tr], tr, "digits"),
        ArraySource(images[te], y[te], te, "digits"),
        location="scikit-learn (bundled)",
        native_size=8,
    )


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise FoalPipeError(f"{path} is not an IDX file of unsigned bytes; replace it with the original download")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise FoalPipeError(f"{path} is truncated ({body.size} bytes for shape {shape}); download it again")
    return body.reshape(shape)


FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
_FASHION_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _idx_file(folder: Path, stem: str) -> Path | None:
    return _first_match([folder / f"{stem}.gz", folder / stem], Path.is_file)


def load_fashion_mnist(data_dir: Path | None, download: bool) -> DatasetSplits:
    """Fashion-MNIST from its four IDX files (gzipped or not)."""
    looked = _candidates(data_dir, FASHION_MNIST_DIR, "fashion-mnist")
    stems = [s for pair in _FASHION_FILES.values() for s in pair]
    folder = _first_match(looked, lambda d: all(_idx_file(d, s) for s in stems))
    if folder is None:
        raise _missing(
            "Fashion-MNIST", looked, "train-images-idx3-ubyte[.gz] and the 3 other IDX files",
            "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or download the 4 "
            "files from github.com/zalandoresearch/fashion-mnist into a folder and pass it as --data-dir",
        )
    splits = {}
    for split, (img_stem, lab_stem) in _FASHION_FILES.items():
        img_path, lab_path = _idx_file(folder, img_stem), _idx_file(folder, lab_stem)
        assert img_path is not None and lab_path is not None  # folder was chosen because every file is there
        images, labels = _read_idx(img_path), _read_idx(lab_path)
        if images.shape[0] != labels.shape[0]:
            raise FoalPipeError(f"{folder}: {img_stem} has {images.shape[0]} images but {lab_stem} has "
                                f"{labels.shape[0]} labels; download the files again")
        if labels.size and labels.max() >= len(FASHION_CLASSES):
            raise FoalPipeError(f"{folder}: {lab_stem} holds label {int(labels.max())}, outside 0..{len(FASHION_CLASSES) - 1} "
                                "(Fashion-MNIST's 10 classes); download the files again")
        splits[split] = ArraySource(images, labels.astype(np.int64), what=f"fashion-mnist {split}")
    return DatasetSplits("fashion-mnist", FASHION_CLASSES, splits["train"], splits["test"], path_text(folder), 28)


@dataclass(frozen=True)
class _TV:
    """How to open one torchvision dataset: class name, split arguments, label attribute, folder it makes."""

    cls: str
    train: tuple[dict[str, Any], ...]
    test: tuple[dict[str, Any], ...]
    folder: str
    size_note: str
    native_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # what torchvision requires in ``folder``


#: DTD (partition 1) and FGVCAircraft train on the paper's split, torchvision's ``train`` (DTD 40 images a class,
#: FGVCAircraft 3,334); their ``-trainval`` names keep twice that (DTD train + val, FGVCAircraft trainval) from the
#: same folder, so one download serves both names.
_DTD = _TV("DTD", ({"split": "train"},), ({"split": "test"},), "dtd", "~600 MB", needs=("dtd",))
_FGVC = _TV("FGVCAircraft", ({"split": "train"},), ({"split": "test"},), "fgvc-aircraft-2013b", "~2.6 GB",
            extra={"annotation_level": "variant"})
_TORCHVISION = {
    "cifar100": _TV("CIFAR100", ({"train": True},), ({"train": False},), "cifar-100-python", "~170 MB", 32,
                    needs=("train", "test", "meta")),
    "dtd": _DTD,
    "dtd-trainval": replace(_DTD, train=({"split": "train"}, {"split": "val"})),
    "fgvc-aircraft": _FGVC,
    "fgvc-aircraft-trainval": replace(_FGVC, train=({"split": "trainval"},)),
    "country211": _TV("Country211", ({"split": "train"},), ({"split": "test"},), "country211", "~11 GB"),
}


def _labels_of(ds: Any) -> np.ndarray:
    for attr in ("targets", "_labels"):
        if hasattr(ds, attr):
            return np.asarray(getattr(ds, attr), dtype=np.int64)
    return np.asarray([ds[i][1] for i in range(len(ds))], dtype=np.int64)


def torchvision_loader(name: str) -> Callable[[Path | None, bool], DatasetSplits]:
    tv = _TORCHVISION[name]

    def load(data_dir: Path | None, download: bool) -> DatasetSplits:
        import torchvision.datasets as tvd

        root = (data_dir or DEFAULT_ROOT).expanduser()
        cls = getattr(tvd, tv.cls)
        opened = {}
        for split, arg_sets in (("train", tv.train), ("test", tv.test)):
            parts = []
            for args in arg_sets:
                try:
                    with removing_new_folders(root):  # torchvision makes the root before it downloads
                        parts.append(cls(root=str(root), download=download, **args, **tv.extra))
                except RuntimeError as exc:
                    if download:
                        raise FoalPipeError(
                            f"downloading {name} into {root} failed ({str(exc).splitlines()[0]}); check the "
                            f"network, or download it elsewhere and copy {tv.folder}/ into {root}"
                        ) from None
                    raise _torchvision_missing(name, tv, root, exc) from None
                except OSError as exc:  # network errors during download
                    raise FoalPipeError(
                        f"downloading {name} into {root} failed ({exc}); check the network, or copy "
                        f"{tv.folder}/ into {root} from a machine that has it"
                    ) from None
            labels = np.concatenate([_labels_of(p) for p in parts])
            opened[split] = TorchvisionSource(parts, labels, f"{name} {split}")
            classes = list(parts[0].classes)
        return DatasetSplits(name, [str(c) for c in classes], opened["train"], opened["test"], path_text(root),
                             tv.native_size)

    load.__doc__ = f"torchvision's {tv.cls} in --data-dir (default {DEFAULT_ROOT})."
    return load


def torchvision_lacks(name: str, root: Path) -> list[str] | None:
    """What torchvision needs of ``name`` in ``root`` that is not there (None: not even its folder)."""
    folder = root / _TORCHVISION[name].folder
    return [need for need in _TORCHVISION[name].needs if not (folder / need).exists()] if folder.is_dir() else None


def _torchvision_missing(name: str, tv: _TV, root: Path, exc: RuntimeError) -> FoalPipeError:
    """Why torchvision refused ``name`` without ``--download``: no folder, a folder lacking files, or damaged files."""
    folder, lacks = root / tv.folder, torchvision_lacks(name, root)
    fetch = f"pass {param('download', True)} to fetch it into {root} ({tv.size_note})"
    if lacks is None:
        return FoalPipeError(f"{name} not found: looked for {folder} (torchvision's layout); {fetch}, or "
                             f"{param('data_dir', 'DIR')} where DIR/{tv.folder} exists")
    found = f"it lacks {', '.join(lacks)}" if lacks else f"torchvision refused it ({str(exc).split('.')[0]})"
    return FoalPipeError(f"{name} at {folder} is {'incomplete' if lacks else 'damaged'}: {found}; {fetch}, or copy the "
                         f"whole {tv.folder}/ there")


def class_folders(root: Path, splits: tuple[str, ...] = ("",)) -> list[str]:
    """The class names of ``root/<split>/<class>/`` folders: the union of the folder names of ``splits`` (as text from
    their bytes, :func:`path_text`: the same names in every locale) in Unicode NFC form, sorted (so a copy of the
    tree with NFD names, as macOS unpacks them, has the same class names, order and store bytes; its files are still
    read by their names on disk). Two folders whose names are one class name are refused: equal after Unicode NFC
    normalisation (``é`` as one code point in one split and as ``e`` and an accent in the other: they print alike but
    would be two classes), or equal but for case (``Dog`` and ``dog``: one folder on the case-insensitive file
    systems images are shared on)."""
    folders = {split: {path_text(d.name) for d in (root / split).iterdir() if d.is_dir()} for split in splits}
    names = sorted(set().union(*folders.values()), key=nfc_key)
    clash = name_clash(names, fold_case=True)
    if clash is not None:
        where = [" and ".join(f"{root / split / name}" for split in splits if name in folders[split]) for name in clash]
        raise FoalPipeError(f"the class folders {where[0]} and {where[1]} are one class name: {clash_text(*clash, lead='')}; "
                            "rename them to one spelling (a class has one folder name in every split)")
    return [nfc(name) for name in names]


def refuse_stray_images(folder: Path) -> None:
    """Refuse image files lying directly in ``folder``, beside its class folders: they have no class, and leaving
    them out in silence would extract a dataset other than the one the user sees."""
    strays = sorted((p for p in folder.iterdir() if _is_image_entry(p)), key=lambda p: nfc_key(path_text(p.name)))
    if strays:
        more = f" (and {len(strays) - 1} more)" if len(strays) > 1 else ""
        raise FoalPipeError(f"image {strays[0]}{more} lies directly in {folder}, outside the class folders, so it has no "
                            f"class; move it into {folder}/<class>/ or out of {folder}")


def _folder_split(root: Path, classes: list[str],
                  seen: dict[tuple[int, int], Path] | None = None) -> tuple[list[Path], list[int]]:
    """The images of ``root/<class>/`` folders and their labels, a folder matched to its class by its NFC name;
    ``seen``: the folders searched so far for the dataset (:func:`images_in`: none is searched twice), shared by
    the splits (by default, by this split's class folders only)."""
    seen = {} if seen is None else seen
    paths, labels = [], []
    lookup = {nfc(c): k for k, c in enumerate(classes)}
    for cls_dir in sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: nfc_key(path_text(d.name))):
        files = images_in(cls_dir, seen)
        paths += files
        labels += [lookup[nfc(path_text(cls_dir.name))]] * len(files)
    return paths, labels


def load_imagefolder(data_dir: Path | None, download: bool, test_split: float | None = None,
                     split_seed: int = 0, pooled: bool = False) -> DatasetSplits:
    """``DIR/train/<class>/*`` and ``DIR/test/<class>/*``; classes are the sorted folder names of both. With
    ``test_split``, ``DIR/<class>/*`` instead, split by :func:`split_folder`. ``pooled``: the images a split manifest
    takes its splits from, so a class (or a whole split folder) may hold its images in one split folder only."""
    if data_dir is None:
        raise FoalPipeError(f"{param('dataset', 'imagefolder')} needs {param('data_dir', 'DIR')}, where DIR/train/<class>/ "
                            f"and DIR/test/<class>/ hold the images (or DIR/<class>/ with {param('test_split')})")
    root = data_dir.expanduser()
    if test_split is not None:
        return split_folder(root, test_split, split_seed)
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise FoalPipeError(f"imagefolder dataset not found: {root / split} is not a folder; put the images "
                                f"in {root}/train/<class>/ and {root}/test/<class>/, or pass {param('test_split', 'FRACTION')} "
                                f"to split {root}/<class>/ folders")
    names = class_folders(root, ("train", "test"))
    for split in ("train", "test"):
        refuse_stray_images(root / split)
    if not names:
        raise FoalPipeError(f"{root}/train has no class folders; put the images in {root}/train/<class>/")
    sources = {}
    searched: dict[tuple[int, int], Path] = {}  # one record of the folders searched for both splits: none is read twice
    for split in ("train", "test"):
        paths, labels = _folder_split(root / split, names, searched)
        if not paths and not pooled:
            raise FoalPipeError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root / split}/<class>/; "
                                f"add some or check {param('data_dir')}")
        sources[split] = FileSource(paths, labels, root / split)
    seen = {split: set(sources[split].labels.tolist()) for split in ("train", "test")}
    empty = [name for label, name in enumerate(names) if label not in seen["train"] | seen["test"]]
    if empty:
        more = f" ({len(empty)} such classes)" if len(empty) > 1 else ""
        raise FoalPipeError(f"class {empty[0]!r} has no images in {root / 'train' / empty[0]} nor in "
                            f"{root / 'test' / empty[0]}{more}; add images to both, or remove the folders")
    for split, other in (("test", "train"), ("train", "test")) if not pooled else ():
        alone = sorted(seen[split] - seen[other])
        if alone:
            name = names[alone[0]]
            more = f" ({len(alone)} such classes)" if len(alone) > 1 else ""
            raise FoalPipeError(f"class {name!r} has images in {root / split / name} but none in {root / other / name}"
                                f"{more}; every class needs images in both train/ and test/ (a class never trained on "
                                f"is always predicted wrong, one never tested is not measured): add them, or remove "
                                f"{root / split / name}")
    return DatasetSplits("imagefolder", names, sources["train"], sources["test"], path_text(root))


def split_folder(root: Path, fraction: float, seed: int) -> DatasetSplits:
    """``root/<class>/*`` split into train and test, stratified: ``fraction * n`` of each class's ``n`` images,
    rounded half up (at least 1, at most ``n - 1``), are test images, drawn by a generator seeded with ``seed`` and the
    class name (so a class's split does not depend on the other classes). Rows keep file order."""
    if not root.is_dir():
        raise FoalPipeError(f"imagefolder dataset not found: {root} is not a folder; pass {param('data_dir', 'DIR')} with "
                            "DIR/<class>/ folders of images")
    if (root / "train").is_dir() or (root / "test").is_dir():
        raise FoalPipeError(f"{root} is already split into train/ and test/ folders; drop {param('test_split')} (or "
                            f"{param('data_dir')} a folder of class folders)")
    names = class_folders(root)
    refuse_stray_images(root)
    if not names:
        raise FoalPipeError(f"{root} has no class folders; put the images in {root}/<class>/")
    paths: dict[str, list[Path]] = {"train": [], "test": []}
    labels: dict[str, list[int]] = {"train": [], "test": []}
    on_disk = {nfc(path_text(d.name)): d for d in root.iterdir() if d.is_dir()}
    searched: dict[tuple[int, int], Path] = {}  # shared by the classes: a folder linked from two is refused
    for k, name in enumerate(names):
        files = images_in(on_disk[name], searched)
        if len(files) < 2:
            raise FoalPipeError(f"{on_disk[name]} has {len(files)} image{'s' * (len(files) != 1)}; {param('test_split')} needs "
                                "at least 2 per class (one to train on, one to test): add images or remove the folder")
        n_test = min(max(int(np.floor(fraction * len(files) + 0.5)), 1), len(files) - 1)
        rng = np.random.default_rng([seed, zlib.crc32(nfc(name).encode())])  # one split for NFC and NFD names
        test = np.zeros(len(files), dtype=bool)
        test[rng.choice(len(files), n_test, replace=False)] = True
        for path, is_test in zip(files, test.tolist()):
            split = "test" if is_test else "train"
            paths[split].append(path)
            labels[split].append(k)
    return DatasetSplits("imagefolder", names, FileSource(paths["train"], labels["train"], root),
                         FileSource(paths["test"], labels["test"], root), path_text(root),
                         test_split={"test_fraction": fraction, "seed": seed})


def load_class_folders(data_dir: Path) -> DatasetSplits:
    """Every image of ``DIR/<class>/*`` as the train split (the test split empty): the images a split manifest
    takes its splits from when they lie in one folder per class."""
    root = data_dir.expanduser()
    names = class_folders(root) if root.is_dir() else []
    if not names:
        raise FoalPipeError(f"imagefolder dataset not found: {root} has no class folders; pass {param('data_dir', 'DIR')} "
                            "with DIR/<class>/ or DIR/train/<class>/ folders of images")
    paths, labels = _folder_split(root, names)
    return DatasetSplits("imagefolder", names, FileSource(paths, labels, root), FileSource([], [], root), path_text(root))


def load_images(data_dir: Path | None, download: bool) -> DatasetSplits:
    """Every image under ``DIR`` (recursively), unlabelled (label -1), as the test split; the train split is
    empty. For ``predict --features`` on images nobody has labelled."""
    if data_dir is None:
        raise FoalPipeError(f"{param('dataset', 'images')} needs {param('data_dir', 'DIR')}, the folder that holds the images")
    root = data_dir.expanduser()
    if not root.is_dir():
        raise FoalPipeError(f"images folder not found: {root} is not a folder; pass {param('data_dir', 'DIR')}")
    paths = images_in(root)
    if not paths:
        raise FoalPipeError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root}; add some or check {param('data_dir')}")
    return DatasetSplits("images", ["unlabelled"], FileSource([], [], root), FileSource(paths, [UNLABELLED] * len(paths), root),
                         path_text(root))


CORE50_TRAIN_SESSIONS = (1, 2, 4, 5, 6, 8, 9, 11)
CORE50_TEST_SESSIONS = (3, 7, 10)


def load_core50(data_dir: Path | None, download: bool) -> DatasetSplits:
    """CORe50 128x128 (50 objects): sessions s1,2,4,5,6,8,9,11 train, s3,7,10 test (the NC protocol)."""
    looked = _candidates(data_dir, DEFAULT_ROOT / "core50_128x128", "core50_128x128")
    root = _first_match(looked, lambda d: (d / "s1").is_dir())
    if root is None:
        raise _missing(
            "CORe50", looked, "the session folders s1..s11", "download core50_128x128.zip from "
            "vlomonaco.github.io/core50 and unzip it (it makes core50_128x128/s1/o1/*.png ...), then pass "
            "--data-dir pointing at core50_128x128 or its parent",
        )
    classes = [f"o{k}" for k in range(1, 51)]
    sources, lacking = {}, []
    searched: dict[tuple[int, int], Path] = {}  # shared by every session and object: a folder linked from two is refused
    for split, sessions in (("train", CORE50_TRAIN_SESSIONS), ("test", CORE50_TEST_SESSIONS)):
        paths, labels = [], []
        for s in sessions:
            sdir = root / f"s{s}"
            if not sdir.is_dir():
                raise FoalPipeError(f"CORe50 session folder {sdir} is missing; unzip the whole core50_128x128.zip")
            for k, obj in enumerate(classes):
                files = images_in(sdir / obj, searched) if (sdir / obj).is_dir() else []
                lacking += [] if files else [f"s{s}/{obj}"]
                paths += files
                labels += [k] * len(files)
        sources[split] = FileSource(paths, labels, root)
    if lacking:  # every session films every object: a partial unzip would be a store of 50 classes, some without rows
        shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
        total = len(classes) * len(CORE50_TRAIN_SESSIONS + CORE50_TEST_SESSIONS)
        raise FoalPipeError(f"CORe50 at {root}: {len(lacking)} of its {total} object folders (session/object) are "
                            f"missing or hold no images ({shown}); unzip the whole core50_128x128.zip")
    return DatasetSplits("core50", classes, sources["train"], sources["test"], path_text(root), 128)


def load_tiny_imagenet(data_dir: Path | None, download: bool) -> DatasetSplits:
    """Tiny-ImageNet-200: ``train/<wnid>/images/*.JPEG``; test = ``val/`` labelled by val_annotations.txt."""
    looked = _candidates(data_dir, DEFAULT_ROOT / "tiny-imagenet-200", "tiny-imagenet-200")
    root = _first_match(looked, lambda d: (d / "train").is_dir() and (d / "val" / "val_annotations.txt").is_file())
    if root is None:
        raise _missing(
            "Tiny-ImageNet", looked, "train/ and val/val_annotations.txt", "download tiny-imagenet-200.zip "
            "(cs231n.stanford.edu/tiny-imagenet-200.zip) and unzip it, then pass --data-dir pointing at "
            "tiny-imagenet-200 or its parent",
        )
    folders = {path_text(d.name): d for d in (root / "train").iterdir() if d.is_dir()}
    classes = sorted(folders)
    lookup = {c: k for k, c in enumerate(classes)}
    paths, labels = [], []
    searched: dict[tuple[int, int], Path] = {}  # shared by the classes: a folder linked from two is refused
    for c in classes:
        files = images_in(folders[c], searched)
        paths += files
        labels += [lookup[c]] * len(files)
    train = FileSource(paths, labels, root)
    val_paths, val_labels = [], []
    seen: dict[str, int] = {}  # image name -> line number
    for number, line in enumerate((root / "val" / "val_annotations.txt").read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        if parts[0] in seen:
            raise FoalPipeError(f"{root}/val/val_annotations.txt line {number} names {parts[0]!r} again (first on line "
                                f"{seen[parts[0]]}); an image has one class: unzip the full archive again")
        seen[parts[0]] = number
        if parts[1] not in lookup:
            raise FoalPipeError(f"{root}/val/val_annotations.txt names class {parts[1]!r} that has no "
                                f"{root}/train/{parts[1]} folder; unzip the full archive again")
        val_paths.append(root / "val" / "images" / os_path(parts[0]))
        val_labels.append(lookup[parts[1]])
    order = sorted(range(len(val_paths)), key=lambda i: natural_key(path_text(val_paths[i].name)))
    test = FileSource([val_paths[i] for i in order], [val_labels[i] for i in order], root)
    return DatasetSplits("tiny-imagenet", classes, train, test, path_text(root), 64)
