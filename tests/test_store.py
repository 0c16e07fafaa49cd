"""The store metadata contract: a round trip against literal JSON, and the reader's refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from foal_pipe.errors import FoalPipeError
from foal_pipe.store import FORMAT_VERSION, StoreMeta, open_store, write_store

LITERAL = json.loads(
    """{
  "format": "foal-pipe/features",
  "format_version": 5,
  "classes": ["apple", "pear"],
  "dataset": "fruit",
  "encoder": {"name": "vit_base_patch16_224.augreg2_in21k_ft_in1k", "fusion": "mean-cls",
              "image_size": 224, "normalize": true},
  "complete": true,
  "generation": "0123456789abcdef",
  "source": "/data/fruit",
  "blocks": {"count": 12, "dtype": "float16", "norm": {"kind": "layernorm", "eps": 1e-06}}
}"""
)


def test_meta_round_trip_against_literal_json():
    meta = StoreMeta.from_dict(LITERAL)
    assert meta.classes == ("apple", "pear") and meta.complete and meta.format_version == FORMAT_VERSION
    assert meta.generation == "0123456789abcdef" and meta.extra == {"source": "/data/fruit",
                                                                    "blocks": LITERAL["blocks"]}
    assert meta.to_dict() == LITERAL
    for version in (1, 2, 3, 4):  # still read
        old = {k: v for k, v in LITERAL.items() if k not in ("generation", "blocks")} | {"format_version": version}
        assert StoreMeta.from_dict(old).to_dict() == old


@pytest.mark.parametrize(
    ("change", "message"),
    [({"format_version": 6}, "format_version 6"), ({"format": "x"}, "not a foal-pipe feature store")],
)
def test_meta_refusals(change, message):
    with pytest.raises(FoalPipeError, match=message):
        StoreMeta.from_dict(LITERAL | change)
    with pytest.raises(FoalPipeError, match="lacks the attribute 'classes'"):
        StoreMeta.from_dict({k: v for k, v in LITERAL.items() if k != "classes"})


def test_chunked_reads_in_order_and_take(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(100, 5)).astype(np.float32), rng.integers(0, 3, 100)
    path = write_store(tmp_path / "s.zarr", (x, y), (x[:10], y[:10]), ["a", "b", "c"], chunk_rows=16)
    store = open_store(path)
    assert store.train.chunk_rows == 16 and store.dim == 5
    starts, blocks = zip(*store.train.iter_chunks())
    assert list(starts) == list(range(0, 100, 16))
    np.testing.assert_array_equal(np.concatenate(blocks), x)
    rows = np.array([99, 3, 50, 3, 17])
    np.testing.assert_array_equal(store.train.take(rows), x[rows])
    np.testing.assert_array_equal(store.train.labels, y)
