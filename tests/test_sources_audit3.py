"""Data identity of datasets without a split manifest (torchvision, HDF5). A store of one recorded only its row counts
and classes, so a corrected HDF5 file (or replaced torchvision images) with the same rows and classes was found
"already complete" and its stale features kept in silence, and a resumed store mixed features of old and new data.
The store now records each split's SHA-256 over its images (attribute ``data_sha256``) and ``extract`` refuses a
difference, naming ``--overwrite``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error, invoke

from foal_pipe.datasets.sources import TorchvisionSource
from foal_pipe.extract import ExtractSpec, create_store, extract_rows, mark_progress, open_inputs
from foal_pipe.store import open_store, writer_lock

h5py = pytest.importorskip("h5py")

TRAIN = np.random.default_rng(0).integers(0, 256, (6, 6, 6, 3), dtype=np.uint8)
TEST = np.random.default_rng(1).integers(0, 256, (2, 6, 6, 3), dtype=np.uint8)


def _h5(path: Path, train: np.ndarray = TRAIN, test: np.ndarray = TEST, **options) -> Path:
    """The file at ``path``, written aside and renamed into place (a reader of this process may hold the old one)."""
    aside = path.with_suffix(".tmp")
    with h5py.File(aside, "w") as f:
        f.create_dataset("train/images", data=train, **options)
        f.create_dataset("test/images", data=test, **options)
        f["train/labels"], f["test/labels"] = np.array([0, 1, 0, 1, 0, 1]), np.array([0, 1])
    os.replace(aside, path)
    return path


def _extract(data: Path, out: Path, *extra):
    return invoke("extract", "--dataset", "hdf5", "--data-dir", data, "--model", "pixels", "--image-size", 4,
                  "--out", out, "--chunk-rows", 2, "--workers", 0, "--device", "cpu", *extra)


def _spec(data: Path, out: Path) -> ExtractSpec:
    return ExtractSpec(dataset="hdf5", data_dir=str(data), model="pixels", image_size=4, out=str(out), chunk_rows=2,
                       workers=0, device="cpu")


def _sha(array: np.ndarray) -> str:
    return hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()


def _corrected(path: Path) -> np.ndarray:
    """The HDF5 file rewritten in place with one train pixel changed: same shapes, labels and classes."""
    fixed = TRAIN.copy()
    fixed[4, 0, 0, 0] ^= 0xFF  # row 4: not written yet by an interrupted store of 2 rows
    _h5(path, fixed)
    return fixed


def test_store_records_each_splits_sha256_over_its_images(tmp_path: Path) -> None:
    from foal_pipe.datasets.identity import data_sha256

    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    assert _extract(data, out).exit_code == 0
    attrs = dict(zarr.open_group(str(out), mode="r").attrs)
    assert attrs["data_sha256"] == {"train": _sha(TRAIN), "test": _sha(TEST)}
    # the pixels, not the file's bytes: another chunking and compression is the same data
    assert data_sha256(open_inputs(_spec(_h5(tmp_path / "z.h5", compression="gzip", chunks=(1, 6, 6, 3)),
                                         out)).data) == attrs["data_sha256"]
    assert open_store(out).meta.complete


def test_complete_store_of_changed_hdf5_data_is_refused(tmp_path: Path) -> None:
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    assert _extract(data, out).exit_code == 0
    again = _extract(data, out)  # unchanged: complete, as before
    assert again.exit_code == 0 and "is already complete with these settings" in again.output, again.output
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    _corrected(data)
    result = _extract(data, out)
    assert_one_line_error(result, f"{out} was extracted from other data: the train images of {data} are not those "
                                  f"it holds the features of (SHA-256 {_sha(TRAIN)[:12]}...", "restore the original data, "
                                  "or pass --overwrite to extract it again")
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert _extract(data, out, "--overwrite").exit_code == 0
    assert dict(zarr.open_group(str(out), mode="r").attrs)["data_sha256"]["train"] == _sha(_corrected(data))


def test_resume_of_changed_hdf5_data_is_refused(tmp_path: Path) -> None:
    """Rows 0-1 written from the old file, rows 2-5 would come from the new one."""
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    spec = _spec(data, out)
    with writer_lock(out):
        state = create_store(spec)
        extract_rows(spec, "train", 0, 2, path=state.path)
        mark_progress(state.path, "train", 2)
    fixed = _corrected(data)
    result = _extract(data, out)
    assert_one_line_error(result, "was extracted from other data: the train images", f"(SHA-256 {_sha(TRAIN)[:12]}..., "
                                  f"now {_sha(fixed)[:12]}...)", "pass --overwrite")
    assert not zarr.open_group(str(out), mode="r").attrs.get("complete")
    _h5(data)  # the original file back: the resume goes on
    assert _extract(data, out).exit_code == 0 and open_store(out).meta.complete


def test_a_store_without_the_record_is_taken_as_before(tmp_path: Path) -> None:
    """A store written before the attribute came keeps today's behaviour: complete, nothing to do."""
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    with writer_lock(out):
        state = create_store(_spec(data, out))
    group = zarr.open_group(str(state.path), mode="r+")
    attrs = dict(group.attrs)
    del attrs["data_sha256"]
    group.attrs.put(attrs)
    assert _extract(data, out).exit_code == 0 and open_store(out).meta.complete


class _FakeCIFAR:
    """torchvision's CIFAR100 as the loader uses it: images in ``data`` (N, 32, 32, 3), ``targets``, ``classes``."""

    def __init__(self, data: np.ndarray):
        self.data, self.targets, self.classes = data, [0, 1] * (len(data) // 2), ["a", "b"]

    def __len__(self) -> int:
        return len(self.data)


class _FakeDTD:
    """torchvision's DTD / FGVCAircraft: images read from ``_image_files``."""

    def __init__(self, files: list[Path]):
        self._image_files = files

    def __len__(self) -> int:
        return len(self._image_files)


def test_torchvision_sources_hash_their_arrays_or_files(tmp_path: Path) -> None:
    from foal_pipe.datasets.identity import split_sha256

    images = np.random.default_rng(2).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    labels = np.array([0, 1, 0, 1])
    cifar = TorchvisionSource([_FakeCIFAR(images)], labels, "cifar100 train")
    assert split_sha256(cifar) == _sha(images)
    changed = images.copy()
    changed[3, 31, 31, 2] ^= 1
    assert split_sha256(TorchvisionSource([_FakeCIFAR(changed)], labels, "cifar100 train")) == _sha(changed)
    files = []
    for i in range(2):
        files.append(tmp_path / f"{i}.jpg")
        files[-1].write_bytes(bytes([i]) * 10)
    digests = "".join(hashlib.sha256(f.read_bytes()).hexdigest() for f in files)
    dtd = TorchvisionSource([_FakeDTD(files[:1]), _FakeDTD(files[1:])], labels[:2], "dtd train")
    assert split_sha256(dtd) == hashlib.sha256(digests.encode()).hexdigest()
    assert split_sha256(TorchvisionSource([_FakeDTD([]), []], labels[:0], "x")) is None  # a part with neither: unknown


def test_cifar_store_of_changed_batches_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CIFAR-100 through the CLI with torchvision's class replaced by a double (offline): re-downloaded batches that
    decode to other pixels are refused; the same pixels are complete."""
    import torchvision.datasets

    pixels = {True: np.random.default_rng(3).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8),
              False: np.random.default_rng(4).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)}

    class CIFAR100(_FakeCIFAR):
        def __init__(self, root, download, train):
            super().__init__(pixels[train])

        def __getitem__(self, i):
            return self.data[i], self.targets[i]

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", CIFAR100)
    out = tmp_path / "c.zarr"
    args = ("extract", "--dataset", "cifar100", "--data-dir", tmp_path, "--model", "pixels", "--image-size", 4,
            "--out", out, "--workers", 0, "--device", "cpu")
    assert invoke(*args).exit_code == 0
    assert "already complete" in invoke(*args).output
    pixels[False] = pixels[False][::-1].copy()  # the test batch's two images swapped
    assert_one_line_error(invoke(*args), "was extracted from other data: the test images of", "pass --overwrite")
