"""``learn --init-model``: continue a saved model of any head on a new store, exactly, matching classes by name (a known
class name keeps its id, a new name gets the next id beyond the model's). One entry, :func:`run_continue`; the model
file's head picks its part through the registry (:attr:`~foal_pipe.heads.HeadEntry.learner`, :data:`PARTS`); both
parts run the one walk (:func:`~foal_pipe.protocol.walk.walk`) with their learner. The model fixes everything its
sums depend on (projection, activation, fusion, dtype, dual's batches) and gamma (or its grid).

Ridge: the saved gram statistics (``G``, ``Q``, counts) are the model's whole memory of its stream. The new store is
walked as ``learn`` walks any store, its sums relabelled to the model's label ids and added to the saved ones at every
task boundary: so the weights equal one run over the old stream followed by the new one.

Another head: its model file holds what continuing needs (:mod:`foal_pipe.heads.state`): ncm's and slda's class sums,
counts (and slda's Gram), fecam's per-class sums and Grams, balanced's per-class Grams, dual's two Grams, right-hand
sides and main inverse right after its last boundary (the next task's residuals zero the old classes' columns, as the
recursion does at a task change). The new store's rows are added in stream order, as if the two streams were one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from foal_pipe.core.expansion import Expansion
from foal_pipe.core.gammasearch import PER_DECADE
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import ClassRefused, FoalPipeError, param
from foal_pipe.heads import DEFAULT_HEAD, HEADS, Head, Scorer
from foal_pipe.heads.state import export_head, takes_batch_size
from foal_pipe.io import check_output_dir
from foal_pipe.io.pathtext import path_text
from foal_pipe.model.deploy import DeployedModel, check_encoder, load_model, open_model_store
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.ridgemodel import RidgeModel, SavedRidge
from foal_pipe.protocol.commands import warn_dropped
from foal_pipe.protocol.config import OWN_SETTINGS, EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.continuechecks import FIXED_BY_MODEL, SEARCH_SETTINGS, given_settings, model_batches
from foal_pipe.protocol.evaluation import accuracy_matrices
from foal_pipe.protocol.headruns import check_head_options
from foal_pipe.protocol.headscores import head_accuracies
from foal_pipe.protocol.internal import internal_error
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.learners.heads import HeadsLearner
from foal_pipe.protocol.learnkinds import warn_auto_edges
from foal_pipe.protocol.loosample import RowSample
from foal_pipe.protocol.metricsparts import AllClasses, Continuation, StoreScore, TaskScore
from foal_pipe.protocol.newrows import check_new_rows, label_map, unshown_images
from foal_pipe.protocol.outputs import provenance, write_learned
from foal_pipe.protocol.records import Learned, accuracy_report, learn_metrics, run_info
from foal_pipe.protocol.run import HeadStart, Run, prepare, projection_dim
from foal_pipe.protocol.schema import LearnMetrics
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas
from foal_pipe.protocol.walk import walk
from foal_pipe.store import open_store
from foal_pipe.store.blockfusion import parse_fusion, read_time_fusion

if TYPE_CHECKING:  # scikit-learn: not loaded by learn --init-model
    from foal_pipe.model.classifier import AnalyticClassifier


def relabel(statistics: RidgeStatistics, merged: np.ndarray) -> RidgeStatistics:
    """The same sums with store label ids replaced by model label ids (columns re-sorted)."""
    ids = merged[statistics.classes]
    order = np.argsort(ids, kind="stable")
    counts = statistics.counts[order] if statistics.counts is not None else None
    return RidgeStatistics(statistics.G, statistics.Q[:, order], ids[order], statistics.n, counts, rounding=statistics.rounding)


def store_ids(classes: np.ndarray, merged: np.ndarray) -> np.ndarray:
    """Model label ids ``classes`` as store label ids (``merged``: the model id of each store id); a model-only
    class gets an id past the store's, one each in order, so no test row of the store matches it."""
    back = {int(m): k for k, m in enumerate(merged.tolist())}
    extra, ids = len(merged), []
    for m in classes.tolist():
        ids.append(back.get(m, extra))
        extra += m not in back
    return np.asarray(ids, dtype=np.int64)


def model_fusion(deployed: DeployedModel, given: ModelConfig) -> dict[str, Any]:
    """The model's read-time fusion (or none) as ``ModelConfig`` fields, which the new store's rows must have too: a
    ``fusion`` or ``fusion_norm`` other than the model's is refused, not mixed into its sums."""
    fused = read_time_fusion(deployed.encoder_spec)
    fusion, norm = fused.get("fusion"), fused.get("fusion_norm", True)
    asked = None if given.fusion is None else parse_fusion(given.fusion).text
    if (asked is not None and (asked, given.fusion_norm) != (fusion, norm)) or (not given.fusion_norm and norm):
        held = "none: the store's features as stored" if fusion is None else fusion + ("" if norm else ", no final norm")
        if asked == fusion and not norm:  # the spec is the model's; only the final norm, applied by default, is not
            raise FoalPipeError(f"{param('fusion', asked)} applies the final norm, which the model's fusion ({held}) does "
                                f"not; the model fixes it (its sums were computed without it): drop {param('fusion')}, "
                                f"or add {param('fusion_norm', False)}")
        typed = [("fusion", asked)] * (asked is not None) + [("fusion_norm", False)] * (not given.fusion_norm)
        raise FoalPipeError(f"{' '.join(param(*t) for t in typed)} conflicts with the model's fusion ({held}); the model "
                            f"fixes it (its sums were computed with it): drop {' and '.join(param(k) for k, _ in typed)}")
    return {"fusion": fusion, "fusion_norm": norm}


def check_eval_stores(deployed: DeployedModel, paths: Sequence[str | Path]) -> None:
    """Refuse an ``eval_features`` store the model cannot score (missing, another encoder or width) before any work."""
    for path in paths:
        try:  # the advice of open_store's refusal names the option that gave the path
            store = open_model_store(path, deployed.encoder_spec)
        except FoalPipeError as exc:
            raise FoalPipeError(exc.template.replace(param("features"), param("eval_features"))) from None
        check_encoder(deployed.encoder_spec, store, path)
        deployed.check_width(store.dim, path)


def in_dtype(projection: Expansion, dtype: str) -> Expansion:
    """The model's projection (loaded as float64) in the run's ``dtype``, as ``learn`` draws and saves it."""
    bias = None if projection.bias_ is None else projection.bias_.astype(dtype)
    return replace(projection, components_=projection.components_.astype(dtype), bias_=bias, _device={})


def check_continuable(stream: StreamConfig, evaluation: EvaluationConfig) -> None:
    """What every continuation refuses: scoring among all classes, and a stream other than disjoint tasks scored at
    their ends."""
    if not evaluation.mask_unseen:
        raise FoalPipeError(f"{param('init_model')} evaluates with the seen classes only; drop {param('mask_unseen', False)}")
    if stream.stream != "disjoint" or evaluation.eval_every is not None:
        option = param("eval_every") if evaluation.eval_every is not None else param("stream", stream.stream)
        raise FoalPipeError(f"{param('init_model')} continues a model over disjoint tasks scored at their ends; leave out "
                            f"{option}")


@dataclass
class Continued:
    """A boundary solver whose statistics start from the model's: ``base + relabel(running)``; boundary classes
    are given back in store ids (model-only classes get ids past the store's, so they never match a test label)."""

    inner: FixedGamma | ManyGammas
    base: RidgeStatistics
    merged: np.ndarray

    @property
    def needs_rows(self) -> bool:
        return self.inner.needs_rows

    @property
    def sample(self) -> RowSample | None:
        return self.inner.sample

    def total(self, running: RidgeStatistics) -> RidgeStatistics:
        return self.base + relabel(running, self.merged)

    def start(self, statistics: RidgeStatistics, max_task: int) -> Any:
        return self.inner.start(self.total(statistics), max_task)

    def zoom(self, state: Any) -> None:
        if isinstance(self.inner, ManyGammas):
            self.inner.zoom(state)

    def finish(self, state: Any) -> Boundary:
        boundary = self.inner.finish(state)
        boundary.classes = store_ids(boundary.classes, self.merged)
        return boundary


def check_search(explicit: Collection[str], gamma: float | str, grid: tuple[float, ...], given: ModelConfig,
                 head: str | None = None, per_decade: int = PER_DECADE) -> None:
    """Refuse an ``explicit`` (typed) gamma-search setting that continuing the model would ignore: every one for a
    head or a fixed ``gamma``; with ``gamma="auto"`` (chosen by GCV, :func:`model_settings`) the leave-one-out
    sample, and a ``gamma_grid`` or ``per_decade`` other than the model's ``grid`` and ``per_decade``."""
    for key in (k for k in SEARCH_SETTINGS if k in explicit):
        if head is not None:
            raise FoalPipeError(f"{param(key)} acts with ridge's {param('gamma', 'auto')}; the model's {head} head has no "
                                f"gamma search: drop {param(key)}")
        if gamma != "auto":
            raise FoalPipeError(f"{param(key)} acts with {param('gamma', 'auto')}; the model's gamma is fixed at {gamma:g} "
                                f"(its last choice, if it was chosen): drop {param(key)}")
        if key == "loo_sample":
            raise FoalPipeError(f"a continued model chooses gamma by GCV (leave-one-out would need the old rows), so "
                                f"{param('loo_sample')} would be ignored: drop it")
        if key == "gamma_grid" and tuple(given.gamma_grid) != grid:
            raise FoalPipeError(f"{param('gamma_grid', ','.join(f'{g:g}' for g in given.gamma_grid))} conflicts with the "
                                f"model's grid {','.join(f'{g:g}' for g in grid)}; the model fixes it: drop "
                                f"{param('gamma_grid')}")
        if key == "per_decade" and given.per_decade != per_decade:
            raise FoalPipeError(f"{param('per_decade', given.per_decade)} conflicts with the model's search, {per_decade} "
                                f"points per decade; the model fixes it: drop {param('per_decade')}")


def model_settings(model: DeployedModel, given: ModelConfig, explicit: Collection[str]) -> ModelConfig:
    """The model's gamma, projection size, activation and dtype; a different value in an ``explicit`` field
    (:func:`~foal_pipe.protocol.continuechecks.given_settings`) is refused, not applied to half the stream."""
    meta = model.metadata
    gamma = "auto" if "gamma_grid" in meta else float(meta["gamma"])
    fixed = {"gamma": gamma, "projection_dim": projection_dim(model.projection),
             "activation": model.projection.activation, "dtype": meta["dtype"]}
    for key in FIXED_BY_MODEL:
        asked = getattr(given, key)
        if key in explicit and asked != fixed[key]:
            why = "its sums were computed with it"
            if key == "gamma":  # not in G and Q: the stream goes on with it
                why = ("it keeps choosing by GCV over its grid" if gamma == "auto"
                       else "the result equals one run over the old stream and the new one at its gamma")
            raise FoalPipeError(f"{param(key, asked)} conflicts with the model's {fixed[key]}; the model fixes it ({why}): "
                                f"drop {param(key)}")
    if meta["engine"] != "gram":
        raise FoalPipeError(f"{param('init_model')} continues the gram engine's sums; use a model learned with "
                            f"{param('engine', 'gram')}")
    if given.engine != "gram":
        raise FoalPipeError(f"{param('engine', given.engine)}: {param('init_model')} adds to the model's gram sums; drop "
                            f"{param('engine')}")
    if gamma == "auto":  # it keeps choosing, by the one criterion the sums alone give
        if "select" in explicit and given.select != "gcv":
            raise FoalPipeError(f"{param('select', given.select)}: a continued model chooses gamma by GCV (leave-one-out "
                                f"would need the old rows); drop {param('select')}")
        given = replace(given, select="gcv")
    grid = tuple(meta["gamma_grid"]) if gamma == "auto" else given.gamma_grid
    # recorded beside the grid; a file written before it was records none, and takes the one given (default 8)
    per_decade = int(meta.get("per_decade", given.per_decade))
    check_search(explicit, gamma, grid, given, per_decade=per_decade)
    return replace(given, gamma=gamma, projection_dim=fixed["projection_dim"], activation=fixed["activation"],
                   dtype=fixed["dtype"], gamma_grid=grid, per_decade=per_decade if gamma == "auto" else given.per_decade)


def evaluate_store(model: DeployedModel, features: str | Path) -> StoreScore:
    """Accuracy of the final model on a store's test split, classes matched by name (forgetting, across
    deployments); rows of classes the model never saw count as wrong and are counted apart."""
    return store_score(features, *model.store_predictions(features))


def store_score(features: str | Path, true: np.ndarray, predicted: np.ndarray) -> StoreScore:
    """:func:`evaluate_store` from the model's ``(true, predicted)`` label ids on the store's test rows."""
    return StoreScore(features=path_text(features), n_test=int(true.size),
                      accuracy=int((predicted == true).sum()) / max(true.size, 1),
                      unknown_class_rows=int((true < 0).sum()))


def same_store(a: str | Path, b: str | Path) -> bool:
    """Whether two paths hold one store's rows: the same folder, or the same generation id (a copy)."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    generation = open_store(a).meta.generation
    return generation is not None and generation == open_store(b).meta.generation


def all_classes(result: DeployedModel, run: Run, merged: np.ndarray,
                scored: Sequence[tuple[str | Path, np.ndarray, np.ndarray]]) -> AllClasses:
    """The final model on every class it has seen: the run's store's test rows task by task (rows of classes
    outside this run's tasks left out, as its accuracy matrix does) and each eval store's rows of the classes the
    model knows (``scored``: its path and the model's ``(true, predicted)``; a store that is the run's own, or one
    scored before it, a copy included, is left out: every store's rows are counted once)."""
    true, predicted = result.store_predictions(run.store.path)
    parts: list[tuple[str, str | Path, np.ndarray]] = [
        (f"T{t + 1}", run.store.path, (predicted == true)[np.isin(true, merged[task])])
        for t, task in enumerate(run.stream.tasks)]
    counted_stores: list[str | Path] = [run.store.path]
    for path, true, predicted in scored:  # a store of no class the model knows adds no rows, and no part
        if (true >= 0).any() and not any(same_store(path, other) for other in counted_stores):
            parts.append(("eval", path, (predicted == true)[true >= 0]))
            counted_stores.append(path)
    n = sum(hits.size for _, _, hits in parts)
    return AllClasses(A_last=sum(int(hits.sum()) for _, _, hits in parts) / max(n, 1), n_test=n, tasks=[
        TaskScore(task=task, features=path_text(path), n_test=int(hits.size), accuracy=int(hits.sum()) / max(hits.size, 1))
        for task, path, hits in parts])


def run_continue(
    init_model: str | Path,
    features: str | Path,
    out: str | Path,
    stream: StreamConfig,
    model: ModelConfig,
    evaluation: EvaluationConfig,
    execution: ExecutionConfig,
    eval_features: Sequence[str | Path] = (),
    log: Callable[[str], None] = print,
    explicit: Collection[str] = (),
) -> Learned:
    """``learn --init-model``: the model's statistics plus the new store's rows, evaluated after each task on the new
    store's test split (and at the end on each ``eval_features`` store); writes what ``learn`` (or ``learn --head``)
    writes. ``explicit``: the settings the caller typed; they and every one set to other than its default are given
    (:func:`~foal_pipe.protocol.continuechecks.given_settings`): a different value of one the model fixes is refused."""
    start = time.perf_counter()
    check_output_dir(out, inputs=[features, init_model, *eval_features])
    deployed = load_model(init_model, estimators=False)
    name = deployed.classifier.name
    part = PARTS[HEADS[name].learner]
    stream = model_batches(stream, getattr(deployed.classifier, "options", {}), explicit)
    settings = part.settings(init_model, deployed, model, stream, execution, given_settings(model, explicit))
    settings = replace(settings, **model_fusion(deployed, model))
    check_continuable(stream, evaluation)
    store = open_model_store(features, deployed.encoder_spec)  # settings' fusion is the model's (model_fusion)
    check_encoder(deployed.encoder_spec, store, features)
    deployed.check_width(store.dim, features)
    identities = check_new_rows(deployed, store, features, init_model)
    if unshown := unshown_images(deployed, identities, features, init_model):
        log(unshown)
    if outside := deployed.rows_outside_stores:
        log(f"warning: {init_model} learned {outside} rows through DeployedModel.partial_fit, which no store identity "
            f"records: nothing shows that {features} does not hold them (each would count twice)")
    check_eval_stores(deployed, eval_features)
    merged = label_map(deployed, list(store.classes))
    run = prepare(features, stream, settings, evaluation, execution, **part.prepare(deployed, merged, settings))
    if run.store.fingerprint != store.fingerprint:  # the rows checked new are the rows learned
        raise FoalPipeError(f"{features} was replaced while it was being opened; run the command again")
    run.projection = in_dtype(deployed.projection, settings.dtype)
    warn_dropped(run, stream, log)
    with np.errstate(all="ignore"):
        final, metrics = part.learn(run, deployed, merged, stream)
    warn_auto_edges(metrics, log)  # a model that keeps choosing: at an edge of its grid, or at the sums' resolution
    return continued_outputs(init_model, deployed, final, merged, run, metrics, eval_features, out, start, identities)


def _gram_settings(init_model: str | Path, deployed: DeployedModel, model: ModelConfig, stream: StreamConfig,
                   execution: ExecutionConfig, explicit: Collection[str]) -> ModelConfig:
    """Ridge's settings: the model's gamma, projection, activation and dtype (:func:`model_settings`)."""
    if model.head != DEFAULT_HEAD:
        raise FoalPipeError(f"{init_model} is a ridge model; {param('head', model.head)} cannot continue it: drop "
                            f"{param('head')}")
    check_head_options([DEFAULT_HEAD], model)
    return model_settings(deployed, model, explicit)


def _continue_gram(run: Run, deployed: DeployedModel, merged: np.ndarray, stream: StreamConfig) -> tuple[Any, LearnMetrics]:
    """Ridge's part: the model's gram sums added to the new store's at every boundary, in ridge's Gram lanes."""
    model = run.model
    inner = (ManyGammas(model.gamma_grid, model.loo, model.select, model.per_decade) if model.gamma == "auto"
             else FixedGamma(float(model.gamma)))
    solver = Continued(inner, ridge_of(deployed).statistics_, merged)
    gram = walk(run, [GramLearner(run, {None: solver})])[0]
    acc = accuracy_matrices(run, gram.boundaries)[0]
    grid = model.gamma_grid if model.gamma == "auto" else None  # the continued model keeps choosing
    final = SavedRidge(RidgeModel.solved(solver.total(gram.running), float(gram.boundaries[-1].gammas[0]), grid,
                                         model.per_decade))
    return final, learn_metrics(run, stream, accuracy_report(acc), gram.boundaries)


def continued_outputs(init_model: str | Path, deployed: DeployedModel, final: Any, merged: np.ndarray, run: Run,
                      metrics: LearnMetrics, eval_features: Sequence[str | Path], out: str | Path, start: float,
                      identities: list[str]) -> Learned:
    """Write a continuation's outputs (ridge or a head): the ``final`` classifier deployed with the model's
    projection and encoder and every class's name (the model's where it names its classes, else the new store's at
    their ``merged`` ids), and ``metrics`` with what continuing adds: the model continued, the rows seen in all, the
    new store's label ids, the tasks by name and the scores on each ``eval_features`` store; no ``seed`` or
    ``projection_init``: the projection is the model's, whose file does not record how it was drawn."""
    store, ours = run.store, dict(zip(deployed.classifier.classes_.tolist(), deployed.class_names))
    names = {**ours, **dict(zip(merged.tolist(), store.classes)), **(ours if deployed.named else {})}  # its spelling
    kept = ([names[c] for c in final.classes_.tolist()], deployed.encoder_spec,
            {**deployed.metadata, **provenance(run, deployed.metadata, identities)})
    result = DeployedModel(final, deployed.projection, *kept)  # as predict loads it
    scored = [(path, *result.store_predictions(path)) for path in eval_features]
    metrics = replace(metrics, seed=None, projection_init=None, continuation=Continuation(
        init_model=path_text(init_model), n_samples_seen_total=int(final.n_samples_seen_),
        label_ids=dict(zip(store.classes, merged.tolist())),
        task_names=[[store.classes[c] for c in task] for task in run.stream.tasks],
        eval_features=[store_score(*score) for score in scored],
        all_classes=all_classes(result, run, merged, scored) if scored else None))
    return write_learned(out, [run], start, metrics, DeployedModel(final, run.projection, *kept).save, timed=True)


class StoreIds:
    """A boundary model over model label ids seen with store label ids: a model-only class gets an id past the
    store's, so no test row of the store matches it."""

    def __init__(self, inner: Scorer, merged: np.ndarray) -> None:
        self.inner, self.classes = inner, store_ids(inner.classes, merged)

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
        try:
            self.last = self.head.boundary()
        except ClassRefused as exc:  # a model id: the walk names store ids
            raise exc.named(dict(zip(self.merged.tolist(), range(self.merged.size)))) from None
        return StoreIds(self.last, self.merged)


def relabelled(head: Head, merged: np.ndarray, space: str) -> Relabelled:
    """:class:`Relabelled` with the head's ``name`` and the ``space`` of its rows (the walk reads them from the type)."""
    kind = type(f"Relabelled{type(head).__name__}", (Relabelled,), {"space": space, "name": type(head).name})
    return kind(head, merged)


def head_of(deployed: DeployedModel) -> HeadClassifier:
    """The model's head (its file's learner chose the head's part, :data:`PARTS`)."""
    if not isinstance(deployed.classifier, HeadClassifier):
        raise internal_error("a ridge model continued as a head")
    return deployed.classifier


def ridge_of(deployed: DeployedModel) -> AnalyticClassifier | SavedRidge:
    """The model's ridge classifier (its file's learner chose ridge's part, :data:`PARTS`)."""
    if isinstance(deployed.classifier, HeadClassifier):
        raise internal_error("a head's model continued as ridge")
    return deployed.classifier


def continued_head_settings(deployed: DeployedModel, given: ModelConfig, explicit: Collection[str]) -> ModelConfig:
    """The settings of the model's head; an ``explicit`` (given: :func:`~foal_pipe.protocol.continuechecks.given_settings`)
    ``--head``, gamma, projection size, activation, dtype or ``--engine`` (ridge's solver, which no head takes), or
    any of ``given.head_options``, that differs from the model's is refused (the statistics were computed with the
    model's)."""
    classifier = head_of(deployed)
    name, options, space = classifier.name, classifier.options, classifier.space
    fixed: dict[str, Any] = {"head": name, **{k: v for k, v in options.items() if k != "batch_size"},
                             "projection_dim": projection_dim(deployed.projection) if space != "features" else 0,
                             "dtype": classifier.dtype,
                             "activation": deployed.projection.activation if space == "activations" else None,
                             "head_rows": "activations" if space != HEADS[name].space else None}
    check_search(explicit, ModelConfig().gamma, given.gamma_grid, given, name)
    if "head_rows" in explicit and given.head_rows is not None:
        asked_space = "activations" if HEADS[name].space == "features" and given.head_rows == "activations" else HEADS[name].space
        if asked_space != space:
            raise FoalPipeError(f"{param('head_rows', given.head_rows)} conflicts with the model's {name} head (its "
                                f"{space}); the model fixes it: drop {param('head_rows')}")
    asked_for = {**{key: getattr(given, key) for key in explicit if key not in (*SEARCH_SETTINGS, "head_rows")},
                 **given.head_options}
    for key, asked in asked_for.items():
        known = fixed.get(key)
        if asked != known:
            held = f"its {known}" if known is not None else "which does not take it"
            raise FoalPipeError(f"{param(key, asked)} conflicts with the model's {name} head ({held}); the model fixes "
                                f"it: drop {param(key)}")
    fixed.setdefault("gamma", ModelConfig().gamma)
    if space == "projected":  # the head applies its own activations: the projection none (as a fresh run records)
        fixed["activation"] = "identity"
    own = {k: v for k, v in options.items() if k not in OWN_SETTINGS}
    return replace(given, **{k: v for k, v in fixed.items() if k in ModelConfig.__dataclass_fields__}, head_options=own)


def _head_settings(init_model: str | Path, deployed: DeployedModel, model: ModelConfig, stream: StreamConfig,
                   execution: ExecutionConfig, explicit: Collection[str]) -> ModelConfig:
    """Another head's settings: its own (:func:`continued_head_settings`), in this process, on its batch size."""
    classifier = head_of(deployed)
    name, options = classifier.name, classifier.options
    settings = continued_head_settings(deployed, model, explicit)
    if execution.scheduler != "local":
        raise FoalPipeError(f"continuing a {name} model ({param('init_model')}) runs in this process (only ridge's sums "
                            f"are added on a cluster); continue it with {param('scheduler', 'local')}")
    if takes_batch_size(name) and stream.batch_size != options["batch_size"]:
        raise FoalPipeError(f"the model's {name} recursion ran on mini-batches of {options['batch_size']} rows; pass "
                            f"{param('batch_size', options['batch_size'])} to continue it exactly")
    return settings


def _head_prepare(deployed: DeployedModel, merged: np.ndarray, settings: ModelConfig) -> dict[str, Any]:
    classifier = head_of(deployed)
    held = sum(int(np.asarray(t).nbytes) for t in classifier.tensors.values())
    return {"heads": [classifier.name], "ridge": False, "start": HeadStart(merged, classifier.classes_, held)}


def _continue_head(run: Run, deployed: DeployedModel, merged: np.ndarray, stream: StreamConfig) -> tuple[Any, LearnMetrics]:
    """Another head's part: the head restored from its tensors, the new store's rows added by the heads' learner."""
    classifier = head_of(deployed)
    name, options, space = classifier.name, classifier.options, classifier.space
    walker = relabelled(classifier.head(run.xp), merged, space)
    boundaries = walk(run, [HeadsLearner(run, {name: walker})])[0].boundaries
    acc = head_accuracies(run, boundaries, {name: space})[name]
    new_rows = sum(int(r.size) for r in run.stream.rows)
    last = walker.last
    if last is None:
        raise internal_error("a continued head without a boundary")
    final = HeadClassifier(name, options, export_head(name, walker.head, last), classifier.n_samples_seen_ + new_rows,
                           space, classifier.dtype)
    shown = {k: v for k, v in options.items() if k != "batch_size"}
    return final, LearnMetrics(**accuracy_report(acc), head=name, head_options=shown, head_rows=run.model.head_rows,
                               **run_info(run, stream))


@dataclass(frozen=True)
class Part:
    """One learner's part of ``learn --init-model``: ``settings(init_model, deployed, model, stream, execution,
    explicit)``, the settings the model fixes (refused when the caller gave others); ``prepare(deployed, merged,
    settings)``, :func:`~foal_pipe.protocol.run.prepare`'s keywords; ``learn(run, deployed, merged, stream)``, the
    walk from the model's state and its scores: the final classifier and the metrics."""

    settings: Callable[..., ModelConfig]
    prepare: Callable[[DeployedModel, np.ndarray, ModelConfig], dict[str, Any]]
    learn: Callable[[Run, DeployedModel, np.ndarray, StreamConfig], tuple[Any, LearnMetrics]]


#: Each learner's part of ``learn --init-model``, by the model file's :attr:`~foal_pipe.heads.HeadEntry.learner`.
PARTS: dict[str, Part] = {
    "gram": Part(_gram_settings, lambda deployed, merged, settings: {"n_models": 1, "loo": settings.loo}, _continue_gram),
    "heads": Part(_head_settings, _head_prepare, _continue_head),
}
