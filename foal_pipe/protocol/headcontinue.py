"""``learn --init-model`` with a head other than ridge: the head's statistics from its model file, the new store's
rows added in stream order, exactly as if the old stream and the new one had been one stream.

Every head's model file holds what continuing needs (:mod:`foal_pipe.heads.state`): ncm's and slda's class sums,
counts (and slda's Gram), fecam's per-class sums and Grams, balanced's per-class Grams, dual's two Grams, right-hand
sides and main inverse right after its last boundary (the next task's residuals zero the old classes' columns, as
the recursion does at a task change). The new store's classes are matched to the model's by name (a new name gets
the next id beyond the model's), the head, its options, the projection and dual's batch size come from the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads import HEADS, Head, Scorer
from foal_pipe.heads.state import export_head, takes_batch_size
from foal_pipe.io import check_output_dir
from foal_pipe.model.deploy import DeployedModel, check_encoder, load_model
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.protocol.commands import warn_dropped
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.continuation import FIXED_BY_MODEL, check_new_rows, continued_outputs, label_map
from foal_pipe.protocol.headruns import HEAD_OPTION_FIELDS
from foal_pipe.protocol.headwalk import head_accuracies, head_boundaries
from foal_pipe.protocol.records import Learned, accuracy_report, run_info
from foal_pipe.protocol.run import HeadStart, prepare
from foal_pipe.protocol.schema import LearnMetrics
from foal_pipe.store import open_store


class StoreIds:
    """A boundary model over model label ids seen with store label ids: a model-only class gets an id past the
    store's, so no test row of the store matches it."""

    def __init__(self, inner: Scorer, merged: np.ndarray) -> None:
        back = {int(m): k for k, m in enumerate(merged.tolist())}
        extra, ids = len(merged), []
        for m in inner.classes.tolist():
            ids.append(back.get(m, extra))
            extra += m not in back
        self.inner, self.classes = inner, np.asarray(ids, dtype=np.int64)

    def scores(self, X: Any) -> Any:
        return self.inner.scores(X)


class Relabelled:
    """A restored head walked on a store: rows' store label ids become the model's (``merged``) on the way in, the
    boundary models are seen in store ids (:class:`StoreIds`); ``last`` keeps the last one in model ids."""

    space: ClassVar[str]
    name: ClassVar[str]

    def __init__(self, head: Head, merged: np.ndarray) -> None:
        self.head, self.merged = head, merged
        self.last: Scorer | None = None

    def add(self, X: Any, labels: np.ndarray) -> None:
        self.head.add(X, self.merged[np.asarray(labels, dtype=np.int64)])

    def boundary(self) -> StoreIds:
        self.last = self.head.boundary()
        return StoreIds(self.last, self.merged)


def relabelled(head: Head, merged: np.ndarray, space: str) -> Relabelled:
    """:class:`Relabelled` with the head's ``name`` and the ``space`` of its rows (the walk reads them from the type)."""
    kind = type(f"Relabelled{type(head).__name__}", (Relabelled,), {"space": space, "name": type(head).name})
    return kind(head, merged)


def head_settings(deployed: DeployedModel, given: ModelConfig, explicit: Collection[str] | None = None) -> ModelConfig:
    """The settings of the model's head; an ``explicit`` (typed) ``--head``, head option, gamma, projection size,
    activation or dtype that differs from the model's is refused (the statistics were computed with the model's).
    ``explicit`` None: the fields that differ from ``ModelConfig()``."""
    if explicit is None:
        explicit = [key for key in ("head", *FIXED_BY_MODEL, *HEAD_OPTION_FIELDS)
                    if getattr(given, key) != getattr(ModelConfig(), key)]
    name, options = deployed.classifier.name, deployed.classifier.options
    space = deployed.classifier.space
    D = int(deployed.projection.components_.shape[1])
    fixed: dict[str, Any] = {"head": name, **{k: v for k, v in options.items() if k != "batch_size"},
                             "projection_dim": D if space != "features" else 0,
                             "dtype": deployed.classifier.dtype,
                             "activation": deployed.projection.activation if space == "activations" else None,
                             "head_rows": "activations" if space != HEADS[name].space else None}
    for key in explicit:
        asked, known = getattr(given, key), fixed.get(key)
        if asked != known:
            held = f"its {known}" if known is not None else "which does not take it"
            raise FoalPipeError(f"{param(key, asked)} conflicts with the model's {name} head ({held}); the model fixes "
                                f"it: drop {param(key)}")
    fixed.setdefault("gamma", ModelConfig().gamma)
    return replace(given, **{k: v for k, v in fixed.items() if k in ModelConfig.__dataclass_fields__})


def run_continue_head(
    init_model: str | Path,
    features: str | Path,
    out: str | Path,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    eval_features: Sequence[str | Path] = (),
    log: Callable[[str], None] = print,
    explicit: Collection[str] | None = None,
) -> Learned:
    """``learn --init-model`` of a head's model: its statistics plus the new store's rows, scored after each task on
    the new store's test split (and at the end on each ``eval_features`` store); writes what ``learn --head``
    writes."""
    start = time.perf_counter()
    check_output_dir(out)
    deployed = load_model(init_model, estimators=False)
    if not isinstance(deployed.classifier, HeadClassifier):
        raise FoalPipeError(f"{init_model} is a ridge model; continue it with `learn --init-model` "
                            "(foal_pipe.protocol.continuation.run_continue)")
    name, options = deployed.classifier.name, deployed.classifier.options
    settings = head_settings(deployed, model, explicit)
    if not evaluation.mask_unseen:
        raise FoalPipeError(f"{param('init_model')} evaluates with the seen classes only; drop {param('mask_unseen', False)}")
    if execution.scheduler != "local":
        raise FoalPipeError(f"the {name} head runs in this process; use {param('scheduler', 'local')}")
    if stream.stream != "disjoint" or evaluation.eval_every is not None:  # as a ridge model's continuation
        option = param("eval_every") if evaluation.eval_every is not None else param("stream", stream.stream)
        raise FoalPipeError(f"{param('init_model')} continues a model over disjoint tasks scored at their ends; leave out "
                            f"{option}")
    if takes_batch_size(name) and stream.batch_size != options["batch_size"]:
        raise FoalPipeError(f"the model's {name} recursion ran on mini-batches of {options['batch_size']} rows; pass "
                            f"{param('batch_size', options['batch_size'])} to continue it exactly")
    store = open_store(features)
    check_encoder(deployed.encoder_spec, store, features)
    check_new_rows(deployed, store, features, init_model)
    if store.dim != deployed.projection.n_features_in_:
        raise FoalPipeError(f"the model expects {deployed.projection.n_features_in_}-dimensional features but "
                            f"{features} has {store.dim}; use a store made with the model's encoder")
    merged = label_map(deployed, list(store.classes))
    held = sum(int(np.asarray(t).nbytes) for t in deployed.classifier.tensors.values())
    run = prepare(features, stream, settings, evaluation, execution, heads=[name], ridge=False,
                  start=HeadStart(merged, deployed.classifier.classes_, held))
    run.projection = deployed.projection
    warn_dropped(run, stream, log)
    space = deployed.classifier.space
    walker = relabelled(deployed.classifier.head(run.xp), merged, space)
    with np.errstate(all="ignore"):
        boundaries, _ = head_boundaries(run, {name: walker})
        acc = head_accuracies(run, boundaries, {name: space})[name]
    new_rows = sum(int(r.size) for r in run.stream.rows)
    final = HeadClassifier(name, options, export_head(name, walker.head, walker.last),
                           deployed.classifier.n_samples_seen_ + new_rows, space, deployed.classifier.dtype)
    shown = {k: v for k, v in options.items() if k != "batch_size"}
    metrics = LearnMetrics(**accuracy_report(acc), head=name, head_options=shown, **run_info(run, stream))
    return continued_outputs(init_model, deployed, final, merged, run, metrics, eval_features, out, start)
