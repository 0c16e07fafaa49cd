"""A table's kept runs of a store without a generation id (format 1) are found by the store's whole content: a chunk
rewritten with its size and last bytes kept holds other rows, so runs kept from before are not resumed."""

from __future__ import annotations

import zarr
from helpers import build_store

from foal_pipe.protocol.tablekept import store_content


def _chunks(store):
    return {f: f.read_bytes() for f in sorted((store / "train" / "features").rglob("*")) if f.name != "zarr.json"
            and f.is_file()}


def test_a_rewritten_format_1_store_is_other_content(tmp_path):
    store = build_store(tmp_path / "s.zarr")
    group = zarr.open_group(str(store), mode="r+")
    x = group["train/features"][:]
    del group["train/features"]
    features = group.create_array("train/features", shape=x.shape, chunks=x.shape, dtype=x.dtype, compressors=None)
    features[:] = x  # one uncompressed chunk: its last bytes are the last rows'
    first, before = store_content(store), _chunks(store)
    assert first is not None and store_content(store) == first  # the same bytes: the same content
    x[:10] += 3
    features[:] = x
    after = _chunks(store)
    assert [(len(b), b[-4:]) for b in before.values()] == [(len(b), b[-4:]) for b in after.values()] and before != after
    assert store_content(store) != first
