"""What a run holds once :func:`~foal_pipe.protocol.run.prepare` has validated it: the :class:`Run`, a continued
head's :class:`HeadStart` and the rows a sampled leave-one-out scores. Apart from ``prepare``, so that the memory
estimates (:mod:`~foal_pipe.protocol.memoryparts`), which ``prepare`` checks, can read a Run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from foal_pipe.core.backend import synchronize
from foal_pipe.core.expansion import Expansion
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig
from foal_pipe.protocol.loosample import RowSample
from foal_pipe.protocol.rowcache import block_rows
from foal_pipe.protocol.stream import Stream
from foal_pipe.store import FeatureStore
from foal_pipe.store.blockfusion import FusedSplits


@dataclass
class Run:
    """Everything validated before any work: the store, the stream, the projection, the settings."""

    store: FeatureStore
    stream: Stream
    projection: Expansion
    backend: str
    xp: Any
    model: ModelConfig
    evaluation: EvaluationConfig
    execution: ExecutionConfig
    test_totals: np.ndarray  # test rows per task
    row_task: np.ndarray  # task of every train row, -1 for rows outside the stream
    seed: int  # the projection's seed, which also draws the rows of a sampled leave-one-out
    timings: dict[str, float] = field(default_factory=dict)
    keep_activations: bool = False  # leave-one-out multiplies kept activations instead of projecting rows again
    fused: dict[str, FusedSplits] | None = None  # sweep --fusions: {"train", "test"}, every fusion from one read
    parts: dict[str, int] = field(default_factory=dict)  # prepare's memory estimate, kept activations included

    @property
    def features_dim(self) -> int:
        """The width of the rows before the projection: a fusion's (``fused``; every fusion has one) or the store's."""
        return self.fused["train"].dim if self.fused is not None else self.store.dim

    @property
    def lanes(self) -> tuple[str | None, ...]:
        """What the walk keeps statistics for: every fusion of ``fused``, or the store's features (None)."""
        return self.fused["train"].specs if self.fused is not None else (None,)

    def source(self, split: str) -> Any:
        """Where a split's chunks come from: ``iter_chunks`` gives ``{fusion: X}`` with ``fused``, else ``X``."""
        return self.fused[split] if self.fused is not None else self.store.split(split)

    @property
    def dim(self) -> int:
        return int(self.projection.components_.shape[1])

    @property
    def block_rows(self) -> int:
        return block_rows(self.dim)

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Add the seconds of the body to ``step``; on a GPU the step ends when the device has done what it queued
        (CuPy and torch return before their kernels finish), so the device's seconds land in the step that
        queued them, as on the CPU."""
        start = time.perf_counter()
        try:
            yield
            synchronize(self.xp)
        finally:
            self.timings[step] = self.timings.get(step, 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class HeadStart:
    """Where a continued head starts (``learn --init-model``): ``merged`` maps store label ids to the model's,
    ``classes`` are the model's classes (solved again at the first boundary), ``held`` the bytes of its loaded
    tensors, held through the run."""

    merged: np.ndarray
    classes: np.ndarray
    held: int


def row_sample(run: Run) -> RowSample | None:
    """The rows a sampled leave-one-out scores (``--loo-sample``), None when it scores every row."""
    if not run.model.loo_sample:
        return None
    return RowSample.draw(run.stream.rows, int(run.row_task.size), int(run.model.loo_sample), run.seed)
