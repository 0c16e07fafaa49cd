"""Encoded batches into whole chunks of one split (:class:`_ChunkFiller`), each batch refused at its first non-finite
row (NaN or inf: reduced precision, float16 overflow) naming the settings that avoid it. Its own module because it
is the per-chunk buffering and checking that :func:`foal_pipe.extract.run.extract_rows` drives, apart from the
store's lock, run log and finish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.spec import ExtractSpec
from foal_pipe.store import FeatureWriter


class _ChunkFiller:
    """Batches' features (and block tokens), in order, into whole chunks of one split: each chunk is written once
    full, ``on_batch(n)`` called after each batch and ``on_chunk(hi)`` after each chunk."""

    def __init__(self, spec: ExtractSpec, split: str, writer: FeatureWriter, lo: int, hi: int, precision: str,
                 encoder: Any, on_batch: Callable[[int], None] | None, on_chunk: Callable[[int], None] | None):
        self.spec, self.split, self.writer, self.hi, self.precision = spec, split, writer, hi, precision
        self.on_batch, self.on_chunk = on_batch, on_chunk
        step = writer.chunk_rows
        self.buffer = np.empty((step, encoder.dim), dtype=spec.dtype)
        self.kept = (np.empty((step, encoder.n_blocks, encoder.dim), dtype=spec.blocks_dtype)
                     if spec.keep_blocks else None)
        self.chunk_lo, self.filled = lo, 0

    def add(self, encoded: Any) -> None:
        """One batch: its features, or ``(features, tokens)`` in a store that keeps block tokens."""
        spec, split, first = self.spec, self.split, self.chunk_lo + self.filled
        with np.errstate(over="ignore"):  # float16's overflow to inf: refused below, by its row
            feats = (encoded if self.kept is None else encoded[0]).astype(spec.dtype)
        if self.kept is not None:
            tokens = encoded[1]
            _check_finite(tokens, f"block tokens at {split}", first, f"precision {self.precision}, "
                          f"{param('blocks_dtype', spec.blocks_dtype)}", self._fix("blocks_dtype", spec.blocks_dtype))
            self.kept[self.filled : self.filled + len(tokens)] = tokens
        _check_finite(feats, f"features at {split}", first, f"precision {self.precision}, dtype {spec.dtype}",
                      self._fix("dtype", spec.dtype))
        self.buffer[self.filled : self.filled + len(feats)] = feats
        self.filled += len(feats)
        if self.on_batch:
            self.on_batch(len(feats))
        chunk_hi = min(self.chunk_lo + self.writer.chunk_rows, self.hi)
        if self.chunk_lo + self.filled == chunk_hi:
            kept = () if self.kept is None else (self.kept[: self.filled],)
            self.writer.write(self.chunk_lo, self.buffer[: self.filled], *kept)
            if self.on_chunk:
                self.on_chunk(chunk_hi)
            self.chunk_lo, self.filled = chunk_hi, 0

    def _fix(self, option: str, dtype: str) -> str:
        """The wider settings not yet in effect, and ``--overwrite``: the store now holds this run's settings, which
        a run with others is refused to mix with."""
        wider = [param(name, value) for name, value, now in (("precision", "fp32", self.precision),
                                                             (option, "float32", dtype)) if now != value]
        if not wider:
            return (f"the model gives them at full precision: check its weights ({param('checkpoint')}) and "
                    f"{param('model_kwargs')}, then re-run with {param('overwrite', True)}")
        return f"re-run with {' or '.join(wider)} and {param('overwrite', True)} (the incomplete store has this run's settings)"


def _check_finite(values: np.ndarray, what: str, first_row: int, how: str, fix: str) -> None:
    """Refuse a batch with a NaN or inf (reduced precision or float16 overflow), naming its first row."""
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if not finite.all():
        raise FoalPipeError(f"non-finite {what} row {first_row + int(np.flatnonzero(~finite)[0])} ({how}); {fix}")
