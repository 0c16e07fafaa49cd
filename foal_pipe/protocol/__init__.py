"""``learn`` and ``sweep``: the online protocol over a feature store, evaluated after every task.

At each task boundary k both engines give the ridge solution over every training row of tasks 1..k:

* ``rls`` replays the stream batch by batch in stream order (reading each task's rows window by
  window), exactly as the paper's Algorithm 1.
* ``gram`` walks the tasks in stream order with one running :class:`~foal_pipe.core.statistics.RidgeStatistics`:
  task k's rows are read chunk by chunk (each chunk decoded once per task) and added, then the boundary is
  solved. Memory does not grow with the number of tasks: the running sums, one batch's Gram matrix and one
  block of rows (a leave-one-out run may also keep the rows' activations, below).

At a boundary the gram walk either solves for a fixed gamma (``learn --gamma 1``), or decomposes ``G``
once and serves many gammas (``sweep``, ``learn --gamma auto``): their weights, their GCV, and, after one
more pass over the rows seen so far, their exact leave-one-out scores. That pass multiplies the activations
kept from the rows' first projection (:class:`~foal_pipe.protocol.walk.KeptActivations`, rows x D values)
where ``--max-memory`` and the machine allow; otherwise it is fused with the next task's pass, which decodes
each chunk once per task and projects the rows seen so far again. Test accuracy for every boundary (and every
gamma) is computed in one pass over the test split at the end.

``sweep --fusions`` walks several fusions of a blocks store at once: each blocks chunk is decoded once and
fused every way (:class:`~foal_pipe.store.blockfusion.FusedSplits`), and each fusion keeps its own running
statistics (a lane of :mod:`foal_pipe.protocol.walk`), so the walk is the same one with a lane per fusion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from foal_pipe import lazy_names

if TYPE_CHECKING:
    from foal_pipe.protocol.commands import run_learn, run_sweep
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig

__all__ = ["EvaluationConfig", "ExecutionConfig", "ModelConfig", "StreamConfig", "SweepConfig", "run_learn", "run_sweep"]

__getattr__ = lazy_names(__name__, {
    "foal_pipe.protocol.commands": ["run_learn", "run_sweep"],
    "foal_pipe.protocol.config": ["EvaluationConfig", "ExecutionConfig", "ModelConfig", "StreamConfig",
                                    "SweepConfig"],
})
