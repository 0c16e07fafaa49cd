"""The reader enforces the store contract (docs/feature-store.md) where an audit found it did not.

Before: an `encoder` attribute without `name`, `fusion`, `image_size` or `normalize` (or with them of other types)
was learned and shown as `encoder None`; test features of another dtype than train's, or chunked across the feature
axis, were accepted; a chunk file appended to in a store with chunk records was read whole and refused as a
checksum mismatch instead of as larger than its recorded size; docs/extract.md said the store records the
checkpoint's path.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import DIM, assert_one_line_error, build_store, invoke

from foal_pipe.encoders.config import EncoderConfig
from foal_pipe.encoders.pixels import PixelsEncoder
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, write_store
from foal_pipe.store.meta import StoreMeta
from foal_pipe.store.verify import verify_store

ROOT = Path(__file__).resolve().parents[1]
GOOD_ENCODER = {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}


def _refused_everywhere(store: Path, tmp_path: Path, fragment: str) -> None:
    """open_store, learn and info all refuse ``store`` with one line holding ``fragment``."""
    with pytest.raises(FoalPipeError) as caught:
        open_store(store)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert str(store) in str(caught.value)
    assert_one_line_error(invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "2"), fragment)
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize(("encoder", "fragment"), [
    ({}, "attribute 'encoder' lacks 'name' (it must hold at least name, fusion, image_size, normalize; it holds [])"),
    ({"name": "x"}, "attribute 'encoder' lacks 'fusion' (it must hold at least name, fusion, image_size, normalize; "
                    'it holds ["name"])'),
    ({"name": 5, "fusion": 3, "image_size": "big", "normalize": "yes"},
     "attribute 'encoder' field 'name' must be a string, but it is an integer (5)"),
    ({"name": "x", "fusion": 3, "image_size": 32, "normalize": True},
     "attribute 'encoder' field 'fusion' must be a string, but it is an integer (3)"),
    ({"name": "x", "fusion": "none", "image_size": "big", "normalize": True},
     "attribute 'encoder' field 'image_size' must be an integer, but it is a string (\"big\")"),
    ({"name": "x", "fusion": "none", "image_size": True, "normalize": True},
     "attribute 'encoder' field 'image_size' must be an integer, but it is a boolean (true)"),
    ({"name": "x", "fusion": "none", "image_size": 32, "normalize": "yes"},
     "attribute 'encoder' field 'normalize' must be a boolean, but it is a string (\"yes\")"),
])
def test_an_encoder_without_the_contract_fields_is_refused(tmp_path, encoder, fragment):
    store = build_store(tmp_path / "s.zarr", n_train=64, n_test=32, attrs={"encoder": encoder})
    _refused_everywhere(store, tmp_path, fragment + "; fix it or re-extract the store")
    result = invoke("info", store)
    assert_one_line_error(result, fragment)


def test_every_encoder_extract_records_is_read(tmp_path):
    """What extract writes for --model pixels (every version wrote these four fields, as write_store's default and
    the test helpers do), with and without normalisation and at a native size, passes the check."""
    for config in (EncoderConfig(name="pixels"), EncoderConfig(name="pixels", normalize=False, image_size=8)):
        encoder = PixelsEncoder(config, native_size=28).provenance()
        meta = StoreMeta.from_dict({"format": "foal-pipe/features", "format_version": 5, "classes": ["a"],
                                    "dataset": "digits", "encoder": encoder, "complete": True})
        assert meta.encoder == encoder
    extra = {**GOOD_ENCODER, "requested": "x", "weights": {"source": "checkpoint", "bytes": 3, "sha256": "0" * 64}}
    store = build_store(tmp_path / "s.zarr", n_train=64, n_test=32, attrs={"encoder": extra})
    assert open_store(store).meta.encoder == extra


def _replace_test_features(store: Path, dtype: str, chunks: tuple[int, int]) -> np.ndarray:
    group = zarr.open_group(str(store), mode="r+")
    x = np.asarray(group["test/features"][:])
    group.create_array("test/features", shape=x.shape, chunks=chunks, dtype=dtype, overwrite=True)[:] = x.astype(dtype)
    return x


def test_test_features_of_another_dtype_are_refused(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=128, n_test=64)
    _replace_test_features(store, "float16", (64, DIM))
    _refused_everywhere(store, tmp_path, f"train features are float32 but test features are float16 in {store}; "
                                         "re-extract it: extract writes both splits in one ")  # dtype / --dtype
    assert_one_line_error(invoke("info", "--verify", store), "readers refuse it: train features are float32 but test "
                                                             "features are float16")


def test_features_chunked_across_the_feature_axis_are_refused(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=128, n_test=64)
    _replace_test_features(store, "float32", (64, 8))
    _refused_everywhere(store, tmp_path, f"test/features in {store} is float32 (64, {DIM}) in chunks of (64, 8), "
                                         f"expected float32 (64, {DIM}) chunked along rows only (rows, {DIM}); "
                                         "re-extract it")


def test_features_chunked_along_rows_only_are_read(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=128, n_test=64, chunk=40)
    opened = open_store(store)
    assert opened.test.features.chunks == (40, DIM)
    assert np.concatenate([b for _, b in opened.test.iter_chunks()]).shape == (64, DIM)


def test_a_chunk_larger_than_its_record_is_refused_before_it_is_read(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 6)).astype(np.float32), np.arange(96) % 3
    store = write_store(tmp_path / "s.zarr", (x[:64], y[:64]), (x[64:], y[64:]), ["a", "b", "c"], chunk_rows=32)
    chunk = store / "train" / "features" / "c" / "1" / "0"
    recorded = json.loads((store / "train" / "features" / "zarr.json").read_text())["attributes"]["chunk_files"]["bytes"]
    assert recorded[1] == chunk.stat().st_size
    with chunk.open("ab") as f:
        f.write(b"\0" * 10)
    reason = f"damaged ({recorded[1] + 10:,} bytes, more than a chunk of its array can hold ({recorded[1]:,}, its recorded size))"
    opened = open_store(store)  # the listing and the metadata are intact; the read refuses the file
    np.testing.assert_array_equal(opened.train.read(0, 32), x[:32])
    with pytest.raises(FoalPipeError) as caught:
        opened.train.read(32, 64)
    assert str(caught.value).startswith(f"{store}: train/features chunk at rows 32-63 is {reason}; re-extract it")
    assert [str(p) for p in verify_store(store).problems] == [f"train/features rows 32-63: {reason}"]
    assert_one_line_error(invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "3"), reason)


def test_a_chunk_of_its_recorded_size_still_reads(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(96, 6)).astype(np.float32), np.arange(96) % 3
    store = write_store(tmp_path / "s.zarr", (x[:64], y[:64]), (x[64:], y[64:]), ["a", "b", "c"], chunk_rows=32)
    assert verify_store(store).problems == []
    np.testing.assert_array_equal(np.concatenate([b for _, b in open_store(store).train.iter_chunks()]), x[:64])


def test_extract_docs_say_the_store_keeps_no_checkpoint_path():
    text = " ".join((ROOT / "docs" / "extract.md").read_text().split())
    assert "the checkpoint's path, size and SHA-256" not in text
    assert "the checkpoint's size and SHA-256 (`weights`: `source` `checkpoint`, `bytes`, `sha256`), not its path" in text


@pytest.mark.parametrize("encoder", [{"name": "pixels"}, {"name": 5, "fusion": "none", "image_size": 0, "normalize": False}])
def test_write_store_refuses_an_encoder_every_reader_would_refuse(tmp_path, encoder):
    x, y = np.zeros((4, 3), dtype=np.float32), np.array([0, 1, 0, 1])
    with pytest.raises(FoalPipeError, match=r"^encoder .*; pass e\.g\. encoder=\{'name'"):
        write_store(tmp_path / "s.zarr", (x, y), (x, y), ["a", "b"], encoder=encoder)
    assert list(tmp_path.iterdir()) == []  # nothing written
