"""``learn`` and ``sweep``: the online protocol over a feature store, evaluated after every task.

The entry points are :func:`learn` and :func:`sweep` (:mod:`foal_pipe.protocol.entry`): ``learn(features, out,
LearnSettings(...))`` refuses the option combinations no run takes and dispatches every head, class orders and
continuation; the command line calls them.

Every head runs in one walk (:func:`~foal_pipe.protocol.walk.walk`: the task loop, the one read, the progress bar)
with its learner (:mod:`foal_pipe.protocol.learners`: ridge's ``gram`` lanes or ``rls`` engine, the registry heads'
states), picked by its registry entry through :data:`~foal_pipe.protocol.learnkinds.LEARN_KINDS`.

Both of ridge's engines first read the stream's train rows once, whatever the class order and the number of tasks
(:class:`~foal_pipe.protocol.rowcache.GroupedRows`: every chunk decoded once on background threads, the rows grouped by
task, in memory or in a temporary file; on a GPU backend copied to the device as they decode,
:mod:`~foal_pipe.protocol.devicecopy`). At each task boundary k both then give the ridge solution over every
training row of tasks 1..k:

* ``rls`` replays the stream batch by batch in stream order, exactly as the paper's Algorithm 1.
* ``gram`` walks the tasks in stream order with one running :class:`~foal_pipe.core.statistics.RidgeStatistics`:
  task k's rows are projected and added in full-size blocks (a fixed number of rows, cut the same way in
  every pass), then the boundary is solved.

At a boundary the gram walk either solves for a fixed gamma (``learn --gamma 1``), or decomposes ``G``
once and serves many gammas (``sweep``, ``learn --gamma auto``): their weights, their GCV, and, after one
more pass over the cached rows of tasks 1..k, their exact leave-one-out scores. That pass multiplies the
activations kept from the rows' first projection (:class:`~foal_pipe.protocol.learners.gram.KeptActivations`,
rows x D values) where ``--max-memory`` and the machine allow; otherwise it projects the cached rows again, in the
same blocks, so to the same bits. Test accuracy for every boundary (and every gamma) is computed from one read of the test split
at the end.

``sweep --fusions`` walks several fusions of a blocks store at once: each blocks chunk is decoded once and
fused every way (:class:`~foal_pipe.store.blockfusion.FusedSplits`), and each fusion keeps its own running
statistics (a lane of :mod:`foal_pipe.protocol.learners.gram`), so the walk is the same one with a lane per fusion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from foal_pipe.lazy import lazy_names

if TYPE_CHECKING:
    from foal_pipe.protocol.commands import run_learn, run_sweep
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig, SweepConfig
    from foal_pipe.protocol.entry import LearnSettings, SweepSettings, learn, sweep

__all__ = ["EvaluationConfig", "ExecutionConfig", "LearnSettings", "ModelConfig", "StreamConfig", "SweepConfig",
           "SweepSettings", "learn", "run_learn", "run_sweep", "sweep"]

__getattr__ = lazy_names(__name__, {
    "foal_pipe.protocol.commands": ["run_learn", "run_sweep"],
    "foal_pipe.protocol.entry": ["LearnSettings", "SweepSettings", "learn", "sweep"],
    "foal_pipe.protocol.config": ["EvaluationConfig", "ExecutionConfig", "ModelConfig", "StreamConfig",
                                    "SweepConfig"],
})
