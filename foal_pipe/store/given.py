"""The arrays :func:`~foal_pipe.store.write.write_store` is given, read on the host and checked as the store will keep
them: NaN and inf refused, values cast to the stored dtype only where they stay finite, block tokens as a pair of
``(N, L, d)`` real numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import is_torch_array

from foal_pipe.core.backend import host_values
from foal_pipe.errors import FoalPipeError, clipped, param
from foal_pipe.store.meta import BLOCK_DTYPES, SPLITS


def on_host(x: Any, what: str) -> np.ndarray:
    """``x`` as a NumPy array: a tensor by :func:`host_values` (detached, bfloat16 widened; sparse or meta refused),
    an array of a namespace it does not copy (dask) or a list by NumPy; refused in one line where NumPy cannot."""
    try:
        try:
            return np.asarray(host_values(x, what))
        except FoalPipeError:
            if is_torch_array(x):  # sparse or on the meta device: host_values' line
                raise
            return np.asarray(x)  # a namespace without a copy to the host of its own (dask): NumPy reads it
    except FoalPipeError:
        raise
    except (TypeError, ValueError) as exc:  # ragged nesting, an object NumPy cannot read
        raise FoalPipeError(f"write_store: NumPy cannot read {what} as an array ({clipped(str(exc), 80)}); pass an "
                            "array of real numbers") from None


def check_finite(x: np.ndarray, what: str) -> None:
    """Refuse NaN or inf in ``x`` (features, or block tokens), naming the first: every reader refuses a store that
    holds one, so it is refused before anything is written."""
    finite = np.isfinite(x)
    if not finite.all():
        at = _first(~finite)
        raise FoalPipeError(f"write_store: {what} {x[at]} ({_place(at)}) is not a finite number, which every reader "
                            "refuses; drop or fix that row")


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i[0]) for i in np.nonzero(mask))


def _place(at: tuple[int, ...]) -> str:
    """A feature's (row, column) or a block token's (row, block, column) as a message names it."""
    return f"row {at[0]}, " + (f"position {at[1]}, {at[2]}" if len(at) > 2 else f"column {at[1]}")


def cast_finite(x: np.ndarray, dtype: str, what: str, fix: str) -> np.ndarray:
    """``x`` as ``dtype``, refused where a value is NaN or inf (every reader refuses such a store) or where a finite
    value becomes inf (beyond the dtype's range: ``fix`` says what to do)."""
    check_finite(x, what)
    with np.errstate(over="ignore"):
        cast = np.asarray(x, dtype=dtype)
    over = np.isfinite(x) & ~np.isfinite(cast)
    if over.any():
        at = _first(over)
        raise FoalPipeError(f"write_store: {what} {x[at]} ({_place(at)}) is beyond {dtype}'s range and would be "
                            f"written as inf; {fix}")
    return cast


def check_blocks(blocks: Any, rows: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The train and test block tokens as the store keeps them, in the train tokens' dtype (the store's blocks
    dtype), refused in one line before anything is written: no pair of splits, tokens that are no real numbers or
    not ``(N, L, d)`` with a row per feature row (``rows``, per split), NaN or inf, or a token beyond that dtype's
    range (it would be written as inf)."""
    if not isinstance(blocks, (tuple, list)) or len(blocks) != 2:
        raise FoalPipeError(f"write_store: {param('blocks')} must be a pair (train tokens, test tokens), each (N, L, d); "
                            "pass both splits' tokens")
    tokens = [on_host(b, f"{split} block tokens") for split, b in zip(SPLITS, blocks, strict=True)]
    dtype = tokens[0].dtype.name  # one outside the spec: refused by create_skeleton, before anything is written
    for split, t in zip(SPLITS, tokens, strict=True):
        if t.dtype.kind not in "biuf":
            raise FoalPipeError(f"write_store: {split} block tokens are {t.dtype} values; pass real numbers in "
                                f"{' or '.join(BLOCK_DTYPES)}")
        if t.ndim != 3 or t.shape[1:] != tokens[0].shape[1:] or t.shape[0] != rows[split] or 0 in t.shape[1:]:
            raise FoalPipeError(f"write_store: {split} block tokens have shape {t.shape}; pass (N, L, d) tokens, one "
                                f"row per feature row ({rows[split]}) and the same L, d >= 1 in both splits")
    fix = "pass the tokens of both splits as float32 or scale them"
    train, test = (cast_finite(t, dtype, f"{split} block token", fix) for split, t in zip(SPLITS, tokens, strict=True))
    return train, test
