"""Image sources (one split, labels known up front, images loaded lazily by position) and the preprocessing
that turns any image into the uint8 RGB array a DataLoader batches.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import sys
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.datasets.png import png_shortfall
from foal_pipe.errors import FoalPipeError
from foal_pipe.io.pathtext import path_text

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


class ImageSource:
    """One split of a dataset: ``len(source)`` images with integer ``labels`` (shape ``(N,)``).

    Subclasses implement :meth:`load` (a PIL image or a uint8 array, HxW or HxWxC) and :meth:`describe`
    (where image ``i`` comes from, for error messages). ``index[i]`` is row ``i``'s index in the original
    dataset (written to the store as ``<split>/index``). Sources must pickle cheaply: DataLoader and Dask
    workers receive a copy.
    """

    labels: np.ndarray
    index: np.ndarray
    #: Whether a store records this source's images by the split's SHA-256 (no manifest names them one by one).
    hashed = False

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def load(self, i: int) -> Any:
        raise NotImplementedError

    def describe(self, i: int) -> str:
        return f"image {i}"

    def fingerprints(self) -> list[tuple[str, str]] | None:
        """``(name, SHA-256)`` of every row's image, the split manifest's entries (docs/datasets.md, "Split
        manifests"): a name that does not depend on the machine or on the split the image lies in, and the hash
        of its bytes. None for a source that cannot name its images cheaply (torchvision, HDF5)."""
        return None

    def changed(self) -> str | None:
        """Why the data read so far may not be the data hashed (None: nothing seen), checked before a chunk of
        its rows is recorded."""
        return None

    def close(self) -> None:
        """Close what :meth:`load` opened in this process (an HDF5 file); a later :meth:`load` opens it again."""

    def unreadable(self) -> list[str]:
        """Rows that cannot be read, seen without decoding (for files: missing, a broken link, empty; for HDF5: values
        that are not pixels), each as :meth:`describe`, the first at least with why: checked before a store is
        written, so that extraction does not stop partway."""
        return []


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

    def fingerprints(self) -> list[tuple[str, str]]:
        """Each row named by its index in the dataset, hashed over its pixels (dtype, shape and bytes)."""
        return [(str(int(k)), _sha256_array(self.images[i])) for i, k in enumerate(self.index.tolist())]


class FileSource(ImageSource):
    """Images in files, one path per row. ``root``: the folder the split manifest names the files from (their
    paths relative to it as text from their bytes (:func:`path_text`, whatever the locale) in Unicode NFC form, e.g.
    ``<class>/<file>`` under ``train/``, so a file keeps its name in either split and in a copy with NFD names), or
    the ``names`` themselves with the files' known ``digests`` (a split built from a manifest)."""

    def __init__(self, paths: Sequence[Path | str], labels: Sequence[int], root: Path | None = None,
                 names: Sequence[str] | None = None, digests: Sequence[str] | None = None):
        self.paths = [str(p) for p in paths]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.index = np.arange(len(self.paths), dtype=np.int64)
        if names is None and root is not None:
            names = [nfc(path_text(Path(p).relative_to(root).as_posix())) for p in paths]
        self.names = None if names is None else list(names)
        self.digests = None if digests is None else list(digests)

    def load(self, i: int) -> Any:
        broken = broken_link(self.paths[i])
        if broken is not None:
            raise ValueError(broken)
        if self.digests is None:
            return open_image(self.paths[i])
        data = Path(self.paths[i]).read_bytes()  # decoded from the bytes hashed: a file replaced meanwhile is seen
        if hashlib.sha256(data).hexdigest() != self.digests[i]:
            raise ValueError("its bytes changed since the store recorded their SHA-256; put the original back")
        return open_image(self.paths[i], data)

    def describe(self, i: int) -> str:
        return self.paths[i]

    def unreadable(self) -> list[str]:
        found = []
        for path in self.paths:
            try:
                empty = os.stat(path).st_size == 0
            except OSError as exc:
                found.append(f"{path} ({broken_link(path) or exc.strerror or exc})")
                continue
            if empty:
                found.append(f"{path} (an empty file)")
        return found

    def fingerprints(self) -> list[tuple[str, str]] | None:
        """Each file named relative to ``root``, hashed over its bytes (by a few threads: hashing releases the GIL)."""
        if self.names is None:
            return None
        if self.digests is None:
            self.digests = hash_files(self.paths)
        return list(zip(self.names, self.digests))


class TorchvisionSource(ImageSource):
    """One or more torchvision datasets (concatenated) that return ``(PIL image, label)``."""

    hashed = True

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


def open_image(path: str | Path, data: bytes | None = None) -> Any:
    """The decoded image of the file at ``path`` (from ``data``, its bytes, where given); a PNG with fewer rows than
    its header declares is a ValueError, and so are ``data`` in no format Pillow knows (Pillow's own error would
    name the in-memory buffer and its address, which differs run to run; the caller names the file).

    The warnings Pillow gives while it reads (a decompression bomb, corrupt EXIF data) would reach stderr as two
    raw lines naming no file: for an image that decodes they become one ``note:`` line naming it; for one that
    does not, its error says enough."""
    from PIL import Image, UnidentifiedImageError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opened = Image.open(path if data is None else io.BytesIO(data))
        except UnidentifiedImageError:
            if data is None:
                raise
            raise ValueError("not an image Pillow can read") from None
        with opened as img:
            img.filename = str(path)  # what the notes of its conversion (to_rgb_array) name
            img.load()
            short = png_shortfall(path, data) if img.format == "PNG" else None
            if short is not None:
                raise ValueError(short)
    _write_notes(path, caught, "decoded")
    return img


def _write_notes(path: str | Path, caught: Sequence[warnings.WarningMessage], done: str) -> None:
    """Each warning Pillow gave on the image of ``path``, once, as a ``note: FILE: ...`` line on stderr."""
    notes = [_image_note(w.message, w.category, done) for w in caught if not issubclass(w.category, ResourceWarning)]
    for note in dict.fromkeys(notes):
        sys.stderr.write(f"note: {path}: {note}\n" if path else f"note: {note}\n")


def _image_note(message: Warning | str, category: type[Warning], done: str) -> str:
    """One line for a warning Pillow gave on an image that was ``done`` (decoded, converted) anyway."""
    text = " ".join(str(message).split())
    size = re.search(r"\((\d+) pixels\) exceeds limit of (\d+) pixels", text)
    if category.__name__ == "DecompressionBombWarning" and size:
        return (f"{int(size.group(1)):,} pixels, more than Pillow's decompression-bomb limit of {int(size.group(2)):,}; "
                f"{done} anyway (PIL.Image.MAX_IMAGE_PIXELS sets the limit)")
    return f"{text.rstrip('.')}; {done} anyway"


def hash_files(paths: Sequence[str]) -> list[str]:
    """The SHA-256 of each file, in order, by a few threads (hashing releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(sha256_file, paths))


def broken_link(path: str) -> str | None:
    """Why ``path`` cannot be read when it is a symbolic link to nothing (None otherwise)."""
    if os.path.islink(path) and not os.path.exists(path):
        return f"a broken symbolic link to {os.readlink(path)}"
    return None


def sha256_file(path: str) -> str:
    """The SHA-256 of a file's bytes; an unreadable file (a broken symbolic link included) is a FoalPipeError naming
    it."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        why = broken_link(path) or exc.strerror or str(exc)
        raise FoalPipeError(f"cannot read image {path} ({why}); remove or replace the file") from None
    return digest.hexdigest()


def _sha256_array(image: np.ndarray) -> str:
    image = np.ascontiguousarray(image)
    return hashlib.sha256(f"{image.dtype.str}{image.shape}".encode() + image.tobytes()).hexdigest()


def nfc(name: str) -> str:
    """``name`` in Unicode NFC form (one code point for ``é``, as most file systems but macOS's keep names)."""
    return unicodedata.normalize("NFC", name)


def nfc_key(name: str) -> tuple[str, str]:
    """Sort key of a name by its NFC form, ties broken by the name itself (ASCII names sort as before)."""
    return nfc(name), name


def name_clash(names: Sequence[str], fold_case: bool = False) -> tuple[str, str] | None:
    """The first two of ``names`` that are one name: equal, or equal after Unicode NFC normalisation (``é`` as one
    code point or as ``e`` and an accent: they print alike), or with ``fold_case`` also equal but for case (two
    folders a case-insensitive file system would merge). None when every name is its own."""
    seen: dict[str, str] = {}
    for name in names:
        key = nfc(nfc(name).casefold()) if fold_case else nfc(name)
        if key in seen:
            return seen[key], name
        seen[key] = name
    return None


def clash_text(first: str, second: str, lead: str = "names ") -> str:
    """How two clashing names (:func:`name_clash`) are one name, after ``lead``."""
    if first == second:
        return f"{lead}{first!r} twice"
    if nfc(first) == nfc(second):
        return (f"{lead}{ascii(first)} and {ascii(second)}, one name ({nfc(first)!r}) in two Unicode normalisations, "
                "which print alike")
    return f"{lead}{first!r} and {second!r}, which differ only in case"


def same_names(names: Sequence[str]) -> str | None:
    """``names`` holding one name twice (:func:`name_clash`, case kept apart), as :func:`clash_text` says it."""
    clash = name_clash(names)
    return None if clash is None else clash_text(*clash)


@dataclass
class DatasetSplits:
    """An opened dataset: class names, the two splits, and where it was read from."""

    name: str
    classes: list[str]
    train: ImageSource
    test: ImageSource
    location: str = ""
    native_size: int | None = None  # side of the images when all share one (the pixels encoder's default)
    #: How the test split was drawn, for a dataset that had none (``extract --test-split``): ``test_fraction``, ``seed``.
    test_split: dict[str, float | int] | None = None

    def split(self, name: str) -> ImageSource:
        return {"train": self.train, "test": self.test}[name]

    @property
    def hashed(self) -> bool:
        """Whether a store records the images by each split's SHA-256 (datasets/identity.py: HDF5 and torchvision,
        whose images no split manifest names one by one), which a fixed image changes: it does not resume."""
        return self.train.hashed or self.test.hashed


# ---------------------------------------------------------------------------------------------------------
# Preprocessing: any image -> uint8 RGB (3, s, s); runs in DataLoader workers
# ---------------------------------------------------------------------------------------------------------
_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3, "lanczos": 1, "box": 4, "hamming": 5}


#: How images with more than 8 bits per pixel become 8-bit (PIL's ``convert`` would clip them to 0..255). 16-bit
#: colour images never get here: Pillow decodes them to 8 bits itself (docs/extract.md, "Preprocessing").
WIDE_PIXELS = ("16-bit grey images (0..65535) are divided by 257, float images must lie in [0, 1] and are multiplied "
               "by 255, both rounded to the nearest integer")
#: Formats whose Pillow mode "I" is 16-bit grey (older Pillow's PNG; PGM with a maxval above 255, which Pillow
#: scales to 0..65535); elsewhere mode "I" is 32-bit.
SIXTEEN_BIT_I = ("PNG", "PPM")


def eight_bit(img: Any) -> Any:
    """A PIL image with more than 8 bits per pixel as an 8-bit grayscale one, by :data:`WIDE_PIXELS`; other
    images as they are. PIL's ``convert("RGB")`` clips 16-bit values to 255 and float values in [0, 1] to 0 or 1
    (an almost white or black image); a ValueError names pixels that no rule maps (a 32-bit integer image,
    floats outside [0, 1], negative 16-bit values)."""
    from PIL import Image

    mode = img.mode
    if not (mode.startswith("I;16") or mode in ("I", "F")):
        return img
    if mode == "I" and img.format not in SIXTEEN_BIT_I:
        raise ValueError(f"32-bit integer pixels (mode I) have no rule to 0..255; save the image with 8 or 16 bits "
                         f"({WIDE_PIXELS})")
    pixels = np.asarray(img, dtype=np.float64)
    if not np.isfinite(pixels).all():
        raise ValueError(f"NaN or inf pixel values; {WIDE_PIXELS}")
    lo, hi = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
    top = 1.0 if mode == "F" else 65535.0
    if lo < 0 or hi > top:
        raise ValueError(f"{'float' if mode == 'F' else '16-bit'} pixel values {lo:g}..{hi:g} lie outside "
                         f"0..{top:g}; {WIDE_PIXELS}")
    scaled = pixels * 255.0 if mode == "F" else pixels / 257.0
    return Image.fromarray(np.rint(scaled).astype(np.uint8), mode="L")


def to_rgb_array(img: Any, size: int, interpolation: str = "bicubic") -> np.ndarray:
    """Resize an image to ``size x size`` (no crop, aspect ratio not kept) as uint8 ``(3, size, size)``.

    Grayscale, palette and RGBA images become 3-channel RGB; 16-bit and float images are first brought to 8 bits
    by :func:`eight_bit`.
    """
    from PIL import Image

    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    path = getattr(img, "filename", "")  # an image Pillow opened from a file (open_image): the note names it
    img = eight_bit(img)
    if img.mode != "RGB":
        with warnings.catch_warnings(record=True) as caught:  # a palette with transparency in bytes: a note, as in open_image
            warnings.simplefilter("always")
            img = img.convert("RGB")
        _write_notes(path, caught, "converted to RGB")
    if img.size != (size, size):
        img = img.resize((size, size), resample=_RESAMPLE[interpolation])
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1))


#: What starts a :class:`PreparedImages` row's error that is a whole message (a source's refusal), not an image's.
WHOLE = "\0"


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
        except FoalPipeError as exc:  # not the image but its source (a file changed under the run): said as it is
            return np.zeros((3, self.size, self.size), np.uint8), -1, WHOLE + str(exc)
        except Exception as exc:  # any decoder error: reported by the main process
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return np.zeros((3, self.size, self.size), np.uint8), -1, f"{self.source.describe(i)} ({detail})"


# ---------------------------------------------------------------------------------------------------------
# Image files of a folder, in natural order (the loaders and `predict --images` list them)
# ---------------------------------------------------------------------------------------------------------
def natural_key(text: str) -> tuple[list[Any], str]:
    """Sort key of a name in natural order (``img2`` before ``img10``), ties broken by the name itself: ``x1``,
    ``x01`` and ``x001`` have equal numbers, and without the name their order would be the order the file system
    lists them in (which differs between two copies of one tree). Digit runs are the odd pieces of the split."""
    return [int(t) if k % 2 else t for k, t in enumerate(re.split(r"(\d+)", text))], text


def _is_image_entry(p: Path) -> bool:
    """An image file by its name: a file, or a link to nothing (a broken symbolic link, listed so that reading
    it names it, as an unreadable file is named, rather than leaving it out in silence). A named pipe, device or
    socket so named (or a link to one) is refused here: reading it would block, or never end. A folder is a folder."""
    if p.suffix.lower() not in IMAGE_EXTENSIONS or p.is_dir():
        return False
    if p.is_file() or not p.exists():
        return p.is_file() or p.is_symlink()
    mode = p.stat().st_mode
    kind = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    link = f"a symbolic link to {os.readlink(p)}, " if p.is_symlink() else ""
    raise FoalPipeError(f"{p} is named like an image but is {link}{kind}, not a file; remove it, or replace it with the image")


def images_in(folder: Path, seen: dict[tuple[int, int], Path] | None = None) -> list[Path]:
    """The image files under ``folder`` (recursively, through symbolic links to folders too), in natural order of
    their paths relative to it, compared in Unicode NFC form: a pure function of the names, whatever order the
    file system lists them in and whichever normalisation it keeps (macOS unpacks names NFD). A folder reached twice
    is refused by name: a link to a folder that holds it would never end, two links would read its images twice.
    ``seen`` (``(st_dev, st_ino)`` of each folder searched: where it was first reached) is shared by the calls for
    one dataset's class folders and splits, so that a folder reached from two of them (a link in test/ to a train/
    folder: training images as test rows) is refused too. A folder that cannot be listed is refused by name (its
    images left out would be another dataset); one that vanished meanwhile is skipped, as Path.rglob skips it."""
    found: list[Path] = []
    seen = {} if seen is None else seen
    todo = [folder]
    while todo:
        directory = todo.pop()
        try:
            st = directory.stat()
            with os.scandir(directory) as entries:
                names = sorted((entry.name for entry in entries), key=_name_key)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise FoalPipeError(f"cannot list folder {directory} ({exc.strerror or exc}), so its images would be left "
                                "out; make it readable (read and search permission: chmod u+rx) or move it away") from None
        first = seen.setdefault((st.st_dev, st.st_ino), directory)
        if first != directory:
            raise _reached_twice(first, directory)
        below = [directory / name for name in names if _is_dir(directory / name)]
        found += [directory / name for name in names if _is_image_entry(directory / name)]
        todo.extend(reversed(below))
    return sorted(found, key=lambda p: _name_key(p.relative_to(folder).as_posix()))


def _reached_twice(first: Path, again: Path) -> FoalPipeError:
    """The refusal of a folder reached at ``first`` and again at ``again``: a loop (``first`` holds ``again``), or
    two ways to one folder (in one class folder, two, or both splits); it names the symbolic link to remove, the
    nearest one on the way to ``again`` (else to ``first``: the link may sort before the folder it points to) below
    the folder that holds both paths."""
    top = Path(os.path.commonpath([first, again]))

    def link_to(path: Path) -> Path | None:
        return next((p for p in (path, *path.parents) if p.is_symlink() and p.is_relative_to(top) and p != top), None)

    real = os.path.realpath(again)
    link = link_to(again) or link_to(first)
    if link is not None and first in again.parents:
        return FoalPipeError(f"{link} is a symbolic link to {os.readlink(link)}, which leads back to a folder that holds "
                             f"it ({again} is {real} again): searching it would never end; remove the link or point it "
                             "elsewhere")
    fix = f"remove the duplicate link {link}" if link is not None else "reach it one way only (a bind mount or a hard link)"
    return FoalPipeError(f"{again} and {first} are one folder ({real}), reached twice: its images would be read twice; "
                         f"{fix}")


def _name_key(name: str) -> tuple[tuple[list[Any], str], str]:
    """:func:`natural_key` of the NFC form of the name's text (:func:`path_text`: one order in every locale), ties
    broken by that text itself (ASCII names: the order of :func:`natural_key`)."""
    text = path_text(name)
    return natural_key(nfc(text)), text


def _is_dir(path: Path) -> bool:
    """A folder, or a symbolic link to one (a link to itself is no folder)."""
    try:
        return path.is_dir()
    except OSError:
        return False
