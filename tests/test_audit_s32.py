"""Audit of session 32's changes: write_store's finiteness check (82a4e04) and Expansion.at_zero (a69c483)."""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, write_store


def _rows(n: int = 10, d: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), np.arange(n) % 2


@pytest.mark.parametrize("kind", ["str", "object"])
def test_block_tokens_that_are_no_numbers_are_refused_in_one_line(tmp_path, kind):
    """Fault (82a4e04): write_store's new block-token check runs ``np.isfinite`` on the tokens before their dtype is
    checked, so block tokens of strings or Python objects now escape as a raw ``TypeError`` ("ufunc 'isfinite' not
    supported for the input types") instead of the one-line FoalPipeError the previous commit gave ("blocks dtype
    'object' is outside the spec; choose one of float16, float32")."""
    x, y = _rows()
    tokens = np.random.default_rng(1).normal(size=(10, 3, 4)).astype(np.float32).astype(kind)
    with pytest.raises(FoalPipeError) as caught:
        write_store(tmp_path / "s.zarr", (x, y), (x, y), ["a", "b"], blocks=(tokens, tokens))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "s.zarr").exists()


def test_block_tokens_that_overflow_the_stored_blocks_dtype_are_refused(tmp_path):
    """Fault (82a4e04): the block tokens' finiteness is checked in the dtype they are passed in, not in the blocks
    dtype they are stored as (the train tokens' dtype), so a finite test token beyond float16's range (1e5 with
    float16 train tokens) is written as inf: write_store still writes a store every reader refuses (read_blocks
    raises), which the commit set out to prevent and which the features' cast check (``beyond float16's range``)
    does prevent for features."""
    x, y = _rows()
    rng = np.random.default_rng(1)
    train_tokens = rng.normal(size=(10, 3, 4)).astype(np.float16)
    test_tokens = rng.normal(size=(10, 3, 4)).astype(np.float32)
    test_tokens[1, 1, 1] = 1e5  # finite in float32, inf in float16
    path = tmp_path / "s.zarr"
    try:
        write_store(path, (x, y), (x, y), ["a", "b"], blocks=(train_tokens, test_tokens))
    except FoalPipeError:
        assert not path.exists()
        return
    with pytest.raises(FoalPipeError):  # the store it wrote is refused by the reader
        open_store(path).test.read_blocks(0, 10)
    pytest.fail("write_store wrote a finite block token as inf (beyond the stored blocks dtype float16) instead of "
                "refusing it before anything is written")
