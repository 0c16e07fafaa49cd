"""Image datasets for ``foal-pipe extract``, behind one registry (:data:`DATASETS`).

Every dataset opens to a :class:`DatasetSplits`: the class names and one :class:`ImageSource` per split.
A source knows its labels up front (so a store can be created before any image is decoded) and loads one
image at a time, lazily, by position; :class:`PreparedImages` turns a source into the fixed-size uint8
arrays a DataLoader batches. Torch and torchvision are imported only inside the loaders that need them.

Rows keep dataset order. Register a new dataset by adding a :class:`DatasetEntry` to :data:`DATASETS`
(README, "Adding a dataset").
"""

from __future__ import annotations

import gzip
import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
DEFAULT_ROOT = Path("~/datasets")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# ---------------------------------------------------------------------------------------------------------
# Image sources: one split, labels known up front, images loaded lazily by position
# ---------------------------------------------------------------------------------------------------------
class ImageSource:
    """One split of a dataset: ``len(source)`` images with integer ``labels`` (shape ``(N,)``).

    Subclasses implement :meth:`load` (a PIL image or a uint8 array, HxW or HxWxC) and :meth:`describe`
    (where image ``i`` comes from, for error messages). ``index[i]`` is row ``i``'s index in the original
    dataset (written to the store as ``<split>/index``). Sources must pickle cheaply: DataLoader and Dask
    workers receive a copy.
    """

    labels: np.ndarray
    index: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def load(self, i: int) -> Any:
        raise NotImplementedError

    def describe(self, i: int) -> str:
        return f"image {i}"


class ArraySource(ImageSource):
    """Images held in memory as a uint8 array ``(N, H, W)`` or ``(N, H, W, 3)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, index: np.ndarray | None = None, what: str = ""):
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.index = np.arange(len(self.labels)) if index is None else np.asarray(index, dtype=np.int64)
        self.what = what

    def load(self, i: int) -> np.ndarray:
        return self.images[i]

    def describe(self, i: int) -> str:
        return f"{self.what} image {int(self.index[i])}"


class FileSource(ImageSource):
    """Images in files, one path per row."""

    def __init__(self, paths: Sequence[Path], labels: Sequence[int]):
        self.paths = [str(p) for p in paths]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.index = np.arange(len(self.paths), dtype=np.int64)

    def load(self, i: int) -> Any:
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            img.load()
            return img

    def describe(self, i: int) -> str:
        return self.paths[i]


class TorchvisionSource(ImageSource):
    """One or more torchvision datasets (concatenated) that return ``(PIL image, label)``."""

    def __init__(self, parts: Sequence[Any], labels: np.ndarray, what: str):
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        self.labels = np.asarray(labels, dtype=np.int64)
        self.index = np.arange(len(self.labels), dtype=np.int64)
        self.what = what

    def load(self, i: int) -> Any:
        part = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return self.parts[part][i - int(self.offsets[part])][0]

    def describe(self, i: int) -> str:
        return f"{self.what} image {i}"


class H5Source(ImageSource):
    """``<split>/images`` of an HDF5 file, read lazily; the file is reopened in each worker process."""

    def __init__(self, path: Path, split: str, labels: np.ndarray):
        self.path = str(path)
        self.split = split
        self.labels = np.asarray(labels, dtype=np.int64)
        self.index = np.arange(len(self.labels), dtype=np.int64)
        self._handle: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None, "_pid": -1}

    def load(self, i: int) -> np.ndarray:
        if self._handle is None or self._pid != os.getpid():
            import h5py

            self._handle, self._pid = h5py.File(self.path, "r"), os.getpid()
        img = np.asarray(self._handle[f"{self.split}/images"][i])
        if img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[-1] not in (1, 3):
            img = img.transpose(1, 2, 0)  # CHW -> HWC
        if img.ndim == 3 and img.shape[-1] == 1:
            img = img[..., 0]
        return h5_pixels(img, f"{self.split}/images[{i}]")

    def describe(self, i: int) -> str:
        return f"{self.path}:{self.split}/images[{i}]"


#: What pixel values an HDF5 image may hold, by dtype kind: uint8 as is, other integers in 0..255, floats in
#: [0, 1] (scaled by 255). Anything else is refused rather than cast.
H5_PIXELS = "uint8, integers in 0..255, or floats in [0, 1]"


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
        lo, hi = float(img.min(initial=0.0)), float(img.max(initial=0.0))
        if lo < 0 or hi > 1:
            raise ValueError(f"{key} has float values {lo:g}..{hi:g}, outside [0, 1] (0..255 data: store it as "
                             f"uint8); images must be {H5_PIXELS}")
        return np.rint(img.astype(np.float64) * 255.0).astype(np.uint8)
    raise ValueError(f"{key} has dtype {img.dtype}; images must be {H5_PIXELS}")


@dataclass
class DatasetSplits:
    """An opened dataset: class names, the two splits, and where it was read from."""

    name: str
    classes: list[str]
    train: ImageSource
    test: ImageSource
    location: str = ""
    native_size: int | None = None  # side of the images when all share one (the pixels encoder's default)

    def split(self, name: str) -> ImageSource:
        return {"train": self.train, "test": self.test}[name]


# ---------------------------------------------------------------------------------------------------------
# Preprocessing: any image -> uint8 RGB (3, s, s); runs in DataLoader workers
# ---------------------------------------------------------------------------------------------------------
_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3, "lanczos": 1, "box": 4, "hamming": 5}


def to_rgb_array(img: Any, size: int, interpolation: str = "bicubic") -> np.ndarray:
    """Resize an image to ``size x size`` (no crop, aspect ratio not kept) as uint8 ``(3, size, size)``.

    Grayscale, palette and RGBA images become 3-channel RGB.
    """
    from PIL import Image

    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    if img.mode != "RGB":
        img = img.convert("RGB")
    if img.size != (size, size):
        img = img.resize((size, size), resample=_RESAMPLE[interpolation])
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1))


class PreparedImages:
    """Map-style dataset for a DataLoader: row ``i`` -> ``(uint8 (3, s, s), label, error)``.

    A row that cannot be read comes back as zeros with ``error`` set (an empty string otherwise), so the
    main process can raise one clean :class:`FoalPipeError` naming the file instead of a worker traceback.
    """

    def __init__(self, source: ImageSource, size: int, interpolation: str):
        self.source, self.size, self.interpolation = source, size, interpolation

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int, str]:
        try:
            return to_rgb_array(self.source.load(i), self.size, self.interpolation), int(self.source.labels[i]), ""
        except Exception as exc:  # any decoder error: reported by the main process
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return np.zeros((3, self.size, self.size), np.uint8), -1, f"{self.source.describe(i)} ({detail})"


# ---------------------------------------------------------------------------------------------------------
# Helpers for the loaders
# ---------------------------------------------------------------------------------------------------------
def _natural_key(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _images_in(folder: Path) -> list[Path]:
    return sorted(
        (p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()),
        key=lambda p: _natural_key(p.relative_to(folder).as_posix()),
    )


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


# ---------------------------------------------------------------------------------------------------------
# Loaders, one per dataset: (data_dir or None, download) -> DatasetSplits
# ---------------------------------------------------------------------------------------------------------
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
        images, labels = _read_idx(_idx_file(folder, img_stem)), _read_idx(_idx_file(folder, lab_stem))
        if images.shape[0] != labels.shape[0]:
            raise FoalPipeError(f"{folder}: {img_stem} has {images.shape[0]} images but {lab_stem} has "
                                f"{labels.shape[0]} labels; download the files again")
        splits[split] = ArraySource(images, labels.astype(np.int64), what=f"fashion-mnist {split}")
    return DatasetSplits("fashion-mnist", FASHION_CLASSES, splits["train"], splits["test"], str(folder), 28)


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


_TORCHVISION = {
    "cifar100": _TV("CIFAR100", ({"train": True},), ({"train": False},), "cifar-100-python", "~170 MB", 32),
    "dtd": _TV("DTD", ({"split": "train"}, {"split": "val"}), ({"split": "test"},), "dtd", "~600 MB"),
    "fgvc-aircraft": _TV("FGVCAircraft", ({"split": "trainval"},), ({"split": "test"},), "fgvc-aircraft-2013b",
                         "~2.6 GB", extra={"annotation_level": "variant"}),
    "country211": _TV("Country211", ({"split": "train"},), ({"split": "test"},), "country211", "~11 GB"),
}


def _labels_of(ds: Any) -> np.ndarray:
    for attr in ("targets", "_labels"):
        if hasattr(ds, attr):
            return np.asarray(getattr(ds, attr), dtype=np.int64)
    return np.asarray([ds[i][1] for i in range(len(ds))], dtype=np.int64)


def _torchvision_loader(name: str) -> Callable[[Path | None, bool], DatasetSplits]:
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
                    parts.append(cls(root=str(root), download=download, **args, **tv.extra))
                except RuntimeError as exc:
                    if download:
                        raise FoalPipeError(
                            f"downloading {name} into {root} failed ({str(exc).splitlines()[0]}); check the "
                            f"network, or download it elsewhere and copy {tv.folder}/ into {root}"
                        ) from None
                    raise FoalPipeError(
                        f"{name} not found: looked for {root / tv.folder} (torchvision's layout); pass "
                        f"--download to fetch it into {root} ({tv.size_note}), or --data-dir DIR where "
                        f"DIR/{tv.folder} exists"
                    ) from None
                except OSError as exc:  # network errors during download
                    raise FoalPipeError(
                        f"downloading {name} into {root} failed ({exc}); check the network, or copy "
                        f"{tv.folder}/ into {root} from a machine that has it"
                    ) from None
            labels = np.concatenate([_labels_of(p) for p in parts])
            opened[split] = TorchvisionSource(parts, labels, f"{name} {split}")
            classes = list(parts[0].classes)
        return DatasetSplits(name, [str(c) for c in classes], opened["train"], opened["test"], str(root),
                             tv.native_size)

    load.__doc__ = f"torchvision's {tv.cls} in --data-dir (default {DEFAULT_ROOT})."
    return load


def _folder_split(root: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    paths, labels = [], []
    lookup = {c: k for k, c in enumerate(classes)}
    for cls_dir in sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.name):
        files = _images_in(cls_dir)
        paths += files
        labels += [lookup[cls_dir.name]] * len(files)
    return paths, labels


def load_imagefolder(data_dir: Path | None, download: bool) -> DatasetSplits:
    """``DIR/train/<class>/*`` and ``DIR/test/<class>/*``; classes are the sorted folder names of both."""
    if data_dir is None:
        raise FoalPipeError("--dataset imagefolder needs --data-dir DIR, where DIR/train/<class>/ and "
                            "DIR/test/<class>/ hold the images")
    root = data_dir.expanduser()
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise FoalPipeError(f"imagefolder dataset not found: {root / split} is not a folder; put the images "
                                f"in {root}/train/<class>/ and {root}/test/<class>/")
    names = sorted({d.name for s in ("train", "test") for d in (root / s).iterdir() if d.is_dir()})
    if not names:
        raise FoalPipeError(f"{root}/train has no class folders; put the images in {root}/train/<class>/")
    sources = {}
    for split in ("train", "test"):
        paths, labels = _folder_split(root / split, names)
        if not paths:
            raise FoalPipeError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root / split}/<class>/; "
                                "add some or check --data-dir")
        sources[split] = FileSource(paths, labels)
    return DatasetSplits("imagefolder", names, sources["train"], sources["test"], str(root))


def load_images(data_dir: Path | None, download: bool) -> DatasetSplits:
    """Every image under ``DIR`` (recursively), unlabelled (label -1), as the test split; the train split is
    empty. For ``predict --features`` on images nobody has labelled."""
    if data_dir is None:
        raise FoalPipeError("--dataset images needs --data-dir DIR, the folder that holds the images")
    root = data_dir.expanduser()
    if not root.is_dir():
        raise FoalPipeError(f"images folder not found: {root} is not a folder; pass --data-dir DIR")
    paths = _images_in(root)
    if not paths:
        raise FoalPipeError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root}; add some or check --data-dir")
    from foal_pipe.store import UNLABELLED  # zarr: not imported for `foal-pipe --help`

    return DatasetSplits("images", ["unlabelled"], FileSource([], []), FileSource(paths, [UNLABELLED] * len(paths)),
                         str(root))


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
    sources = {}
    for split, sessions in (("train", CORE50_TRAIN_SESSIONS), ("test", CORE50_TEST_SESSIONS)):
        paths, labels = [], []
        for s in sessions:
            sdir = root / f"s{s}"
            if not sdir.is_dir():
                raise FoalPipeError(f"CORe50 session folder {sdir} is missing; unzip the whole core50_128x128.zip")
            for k, obj in enumerate(classes):
                files = _images_in(sdir / obj) if (sdir / obj).is_dir() else []
                paths += files
                labels += [k] * len(files)
        sources[split] = FileSource(paths, labels)
    return DatasetSplits("core50", classes, sources["train"], sources["test"], str(root), 128)


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
    classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
    lookup = {c: k for k, c in enumerate(classes)}
    paths, labels = [], []
    for c in classes:
        files = _images_in(root / "train" / c)
        paths += files
        labels += [lookup[c]] * len(files)
    train = FileSource(paths, labels)
    val_paths, val_labels = [], []
    for line in (root / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        if parts[1] not in lookup:
            raise FoalPipeError(f"{root}/val/val_annotations.txt names class {parts[1]!r} that has no "
                                f"{root}/train/{parts[1]} folder; unzip the full archive again")
        val_paths.append(root / "val" / "images" / parts[0])
        val_labels.append(lookup[parts[1]])
    order = sorted(range(len(val_paths)), key=lambda i: _natural_key(val_paths[i].name))
    test = FileSource([val_paths[i] for i in order], [val_labels[i] for i in order])
    return DatasetSplits("tiny-imagenet", classes, train, test, str(root), 64)


def load_hdf5(data_dir: Path | None, download: bool) -> DatasetSplits:
    """One ``.h5`` file with ``train/images``, ``train/labels``, ``test/images``, ``test/labels``."""
    import h5py

    if data_dir is None:
        raise FoalPipeError("--dataset hdf5 needs --data-dir FILE.h5 (with train/images, train/labels, "
                            "test/images, test/labels)")
    path = data_dir.expanduser()
    if not path.is_file():
        raise FoalPipeError(f"HDF5 dataset not found: {path} is not a file; pass --data-dir FILE.h5")
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
            if shapes[split][0] != len(labels[split]) or len(shapes[split]) not in (3, 4):
                raise FoalPipeError(f"{path}: {split}/images has shape {shapes[split]} and {split}/labels "
                                    f"{len(labels[split])} rows; expected (N, H, W[, C]) images and N labels")
        names = f.attrs.get("classes")
        if names is None and "classes" in f:
            names = f["classes"][:]
    n_classes = int(max(labels["train"].max(initial=-1), labels["test"].max(initial=-1))) + 1
    if names is not None:
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if len(classes) < n_classes:
            raise FoalPipeError(f"{path} lists {len(classes)} classes but its labels go up to {n_classes - 1}; "
                                "fix its 'classes' attribute")
    else:
        classes = [str(k) for k in range(n_classes)]
    if min(labels["train"].min(initial=0), labels["test"].min(initial=0)) < 0:
        raise FoalPipeError(f"{path} has negative labels; labels must be 0..K-1")
    shape = shapes["train"]
    hw = shape[1:3] if len(shape) == 3 or shape[-1] in (1, 3) else shape[2:4]
    native = int(hw[0]) if hw[0] == hw[1] else None
    return DatasetSplits("hdf5", classes, H5Source(path, "train", labels["train"]),
                         H5Source(path, "test", labels["test"]), str(path), native)


# ---------------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset: its loader and the facts the README table and error messages show."""

    load: Callable[[Path | None, bool], DatasetSplits]
    source: str
    looks_in: str
    obtain: str


DATASETS: dict[str, DatasetEntry] = {
    "digits": DatasetEntry(load_digits, "scikit-learn (bundled)", "nowhere: ships with scikit-learn",
                           "nothing to do (offline)"),
    "fashion-mnist": DatasetEntry(load_fashion_mnist, "IDX files", f"{FASHION_MNIST_DIR}, or DIR/fashion-mnist or DIR",
                                  "apt-get install dataset-fashion-mnist"),
    "cifar100": DatasetEntry(_torchvision_loader("cifar100"), "torchvision", "DIR/cifar-100-python",
                             "--download"),
    "dtd": DatasetEntry(_torchvision_loader("dtd"), "torchvision", "DIR/dtd", "--download"),
    "fgvc-aircraft": DatasetEntry(_torchvision_loader("fgvc-aircraft"), "torchvision", "DIR/fgvc-aircraft-2013b",
                                  "--download"),
    "country211": DatasetEntry(_torchvision_loader("country211"), "torchvision", "DIR/country211", "--download"),
    "core50": DatasetEntry(load_core50, "local folder", "DIR/core50_128x128 or DIR", "core50_128x128.zip"),
    "tiny-imagenet": DatasetEntry(load_tiny_imagenet, "local folder", "DIR/tiny-imagenet-200 or DIR",
                                  "tiny-imagenet-200.zip"),
    "imagefolder": DatasetEntry(load_imagefolder, "local folder", "DIR/train/<class>, DIR/test/<class>",
                                "your own images"),
    "images": DatasetEntry(load_images, "local folder", "DIR (recursively), unlabelled: the test split",
                           "your own images"),
    "hdf5": DatasetEntry(load_hdf5, "one .h5 file", "the file given as --data-dir", "your own file"),
}


def open_dataset(name: str, data_dir: str | Path | None = None, download: bool = False) -> DatasetSplits:
    """Open a registered dataset; a missing one raises :class:`FoalPipeError` naming the path looked for."""
    entry = DATASETS.get(name)
    if entry is None:
        raise FoalPipeError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    splits = entry.load(Path(data_dir) if data_dir is not None else None, download)
    for split in ("train", "test") if name != "images" else ("test",):  # unlabelled images: no train split
        if len(splits.split(split)) == 0:
            raise FoalPipeError(f"dataset {name} has no {split} images at {splits.location}; check --data-dir")
    return splits
