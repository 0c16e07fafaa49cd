"""Every head as a scikit-learn estimator, built by name: ``head_classifier("cosine")`` or ``SLDAClassifier(
shrinkage="oas")``, with ``fit``, ``partial_fit`` (one call, one task), ``predict``, ``score`` and, where the head's
scores mean probabilities, ``predict_proba``.

``partial_fit`` adds a task's rows to the head's sufficient statistics; the model is solved when first needed and
kept until the next call, so a stream of small calls pays one solve per prediction, not one per call (10-row calls at
D = 768: slda 85 ms and fecam 400 ms a call before). The solve of a head whose model depends on its statistics alone
(:attr:`~foal_pipe.heads.base.HeadBase.solve_on_demand`) gives the bits a solve after every call gives wherever each
call's own solve would have succeeded. A call whose own solve would have been refused (a gamma its rows so far cannot
resolve, a fecam class whose rows do not vary yet) is refused only if the model is still unsolvable when next needed:
kept where later rows make it solvable, the model is then the exact solve over every row. Dual's boundary ends a task
(its batches, its ``R``, its earlier classes), so dual solves at every call.

One class per head of the registry (:data:`foal_pipe.heads.HEADS`), made here from the head's ``Options`` dataclass,
so its parameters are the head's options with their defaults and a new head gets its estimator without a line
here. The estimator takes the rows as they are: put a :class:`~foal_pipe.core.projection.SmoothProjection` before a
head on the activations (balanced, or KLDA's slda on random features) in a pipeline.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import MISSING, asdict, fields
from typing import Any, ClassVar

import array_api_compat.numpy as xp_numpy
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import validate_data

from foal_pipe.core.backend import host_values, to_numpy
from foal_pipe.core.engines import locked, owner_lock
from foal_pipe.core.scoring import Ties, best_of
from foal_pipe.errors import FoalPipeError, as_user_error, param
from foal_pipe.heads import HEADS, Head, HeadBase, Scorer, head_entry, make_head
from foal_pipe.heads.base import PROBABILITY_RULES
from foal_pipe.model.fittedparams import check_fitted_params
from foal_pipe.model.labels import CLASSES_KIND_PROBLEM, check_label_kinds, check_targets, label_array
from foal_pipe.model.ondemand import SolvesOnDemand
from foal_pipe.model.projection import NotFitted
from foal_pipe.model.ridgeinput import UserErrors
from foal_pipe.model.ridgemodel import finite_scores

#: The fitted state, set by partial_fit: what fit forgets and a refused solve restores.
_FITTED = ("_head", "_model", "_undo", "_ids", "_rows", "_fitted_with", "classes_", "n_features_in_", "feature_names_in_",
           "n_samples_seen_")


def _has_probabilities(estimator: HeadEstimator) -> bool:
    return HEADS[estimator.head].head.probabilities is not None


class HeadEstimator(UserErrors, SolvesOnDemand, ClassifierMixin, BaseEstimator):
    """The estimator of one head (``head``, set by each subclass): each :meth:`partial_fit` call adds one task's
    rows; the head's exact model over every row so far is solved when a prediction, ``class_scores`` or pickling
    first needs it (see the module docstring); :meth:`fit` starts afresh and solves at once. Labels may be any
    classification targets; ``classes_`` is sorted and grows as new labels arrive. ``fit``, ``partial_fit``, the solve
    and pickling hold the estimator's lock; a reader takes the solved model, ``classes_`` and the class ids together
    under it and scores outside it (a read beside a ``partial_fit`` gives the model before or after that call)."""

    head: ClassVar[str]
    # fitted state, set by partial_fit (_FITTED)
    _STATE = _FITTED
    _ids: dict[Any, int]  # label -> the head's class id, in order of first appearance
    _rows: dict[Any, int]  # label -> its rows so far
    _fitted_with: dict[str, Any]  # the options the head was built with, whatever set_params sets later
    classes_: np.ndarray
    n_samples_seen_: int

    def _options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(HEADS[self.head].head.Options)}

    def fit(self, X: Any, y: Any) -> HeadEstimator:
        """Forget every row, then :meth:`partial_fit` on ``(X, y)`` and solve at once: a model that cannot be solved is
        refused by this call, and a prediction after it changes no attribute."""
        with owner_lock(self):
            for name in _FITTED:
                self.__dict__.pop(name, None)
            self.partial_fit(X, y)
            self._solve(say_undone=False)
            return self

    @locked
    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> HeadEstimator:
        """Add the rows ``X`` labelled ``y`` as one task. ``classes`` (scikit-learn's every label of the stream) may
        name only labels with rows, in ``y`` or before: a head's model of a class comes from its rows, so a class
        without rows is refused rather than scored from nothing (``classes_`` grows as labels arrive). The head keeps
        the options it was built with: a call after ``set_params`` changed one is refused (:meth:`fit` starts afresh).
        A refused batch leaves the estimator as it was, the calls since the last solve included; a refused solve (when
        the model is next needed) returns it to its last solved model, undoing the calls since: a call is refused for
        its model only if no later call made the model solvable (see the module docstring)."""
        first = not hasattr(self, "_head")
        if not first:
            check_fitted_params(self, self._fitted_with)
        try:
            return self._add(X, y, classes, first)
        except BaseException:
            if first:  # validate_data set n_features_in_ before the refusal: a refused first call leaves none
                for name in ("n_features_in_", "feature_names_in_"):
                    self.__dict__.pop(name, None)
            raise

    def _add(self, X: Any, y: Any, classes: Any, first: bool) -> HeadEstimator:
        """:meth:`partial_fit`'s work; nothing of the fitted state changes until the head has taken the rows (and,
        for a head that solves at every call, its boundary has solved)."""
        try:
            X, y = validate_data(self, host_values(X), label_array(y), reset=first, dtype=np.float64, order="C")
        except (ValueError, TypeError) as exc:
            raise as_user_error(exc) from None
        check_targets(y)
        seen = np.empty(0, dtype=y.dtype) if first else self.classes_
        check_label_kinds(seen, y)
        merged = np.union1d(seen, y)  # sorted, in a dtype that holds every label so far exactly (check_label_kinds)
        if classes is not None:
            self._check_classes(np.asarray(label_array(classes, "classes=")).ravel(), merged)
        ids = {} if first else dict(self._ids)
        rows = {} if first else dict(getattr(self, "_rows", {}))
        labels, counts = np.unique(y, return_counts=True)
        for label, n in zip(labels.tolist(), counts.tolist()):
            ids.setdefault(label, len(ids))
            rows[label] = rows.get(label, 0) + n
        HEADS[self.head].head.check_counts(list(rows), list(rows.values()))  # e.g. fecam: a class of one row
        head, model, undo = self._take(np.asarray(X, dtype=np.float64),
                                       np.asarray([ids[v] for v in y.tolist()], dtype=np.int64),
                                       lambda: self._solved_copy(int(X.shape[1])), not HEADS[self.head].head.solve_on_demand,
                                       {i: label for label, i in ids.items()})
        if first:
            self._fitted_with = self._options()
        self.n_samples_seen_ = int(X.shape[0]) + (0 if first else self.n_samples_seen_)
        self._head, self._ids, self._rows = head, ids, rows
        self._keep(model, undo)
        self.classes_ = merged
        return self

    def _solved_model(self) -> Scorer:
        model = self.__dict__.get("_model")
        if model is None:
            raise NotFitted(f"this {type(self).__name__} is not fitted yet; call fit or partial_fit first")
        return model

    def _class_names(self) -> dict[int, Any]:
        return {i: label for label, i in self.__dict__.get("_ids", {}).items()}

    @property
    def _scorer(self) -> Scorer:
        return self._solve()

    def _solved_copy(self, dim: int) -> Head:
        """The head the rows of a call go to when none are pending: a copy of the solved head (heads add in place),
        or a fresh one of width ``dim``."""
        head = self.__dict__.get("_head")
        if head is None:
            return self._new_head(dim)
        return copy.deepcopy(head, {id(xp_numpy): xp_numpy})

    def _new_head(self, dim: int) -> Head:
        """A fresh head of the options: a boolean refused (no head option is a flag, though ``float(True)`` is 1), and
        so is a None the head does not take (:func:`_check_none`); a None it takes is its default (dual's
        ``gamma_comp``)."""
        options = self._options()
        for f in fields(HEADS[self.head].head.Options):
            if isinstance(options[f.name], (bool, np.bool_)):
                raise FoalPipeError(f"{param(f.name)} must be a number, got {options[f.name]!r}; try "
                                    f"{param(f.name, f.default)}")
            if options[f.name] is None:
                _check_none(self.head, f.name, f.default)
        return make_head(self.head, options, xp_numpy, dim)

    def _check_classes(self, classes: np.ndarray, seen: np.ndarray) -> None:
        """Refuse ``partial_fit``'s ``classes`` where it names a label without rows (or of another kind)."""
        check_label_kinds(seen, classes, CLASSES_KIND_PROBLEM)
        without = np.setdiff1d(classes, seen)
        if without.size:
            raise FoalPipeError(f"classes= names {without.tolist()[0]!r}, which has no rows yet: the {self.head} head models a "
                                "class from its rows; drop classes= (classes_ grows as labels arrive)")

    def class_scores(self, X: Any) -> np.ndarray:
        """The head's scores of ``X``, one column per class of :attr:`classes_` (higher: more likely); refused where
        they overflow float64 (rows far larger than the head's)."""
        return self._scores_with_ties(X)[0]

    def _scores_with_ties(self, X: Any) -> tuple[np.ndarray, tuple[Ties, np.ndarray] | None]:
        """:meth:`class_scores`, and a linear head's :class:`~foal_pipe.core.scoring.Ties` with the float64 rows."""
        return self._scored(X)[:2]

    def _scored(self, X: Any) -> tuple[np.ndarray, tuple[Ties, np.ndarray] | None, np.ndarray]:
        """:meth:`_scores_with_ties` and the ``classes_`` of the same model: the model, ``classes_`` and the class ids
        taken together under the lock (a ``partial_fit`` in another thread changes them one by one), scored outside."""
        with owner_lock(self):
            if "_head" not in self.__dict__:
                raise NotFitted(f"this {type(self).__name__} is not fitted yet; call fit or partial_fit first")
            try:
                X = np.asarray(validate_data(self, host_values(X), reset=False, dtype=np.float64, order="C"), dtype=np.float64)
            except (ValueError, TypeError) as exc:
                raise as_user_error(exc) from None
            scorer, ids, classes = self._scorer, self._ids, self.classes_
        with np.errstate(over="ignore", invalid="ignore"):  # refused by finite_scores, without a warning first
            scores = finite_scores(np.asarray(to_numpy(scorer.scores(X)), dtype=np.float64))
        order = [ids[c] for c in classes.tolist()]  # the scorer's columns are sorted ids
        ties = getattr(scorer, "ties", None)
        if ties is None:
            return scores[:, order], None, classes
        columns, rows = ties(X)
        return scores[:, order], (columns.columns(order), rows), classes

    def predict(self, X: Any) -> np.ndarray:
        """The class of the highest score (the first of a tie); a linear head's refused where the scores' float64
        rounding would pick it (:meth:`~foal_pipe.core.scoring.Ties.check`)."""
        scores, ties, classes = self._scored(X)
        return best_of(scores, classes, ties=ties)[0]

    @available_if(_has_probabilities)
    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities where the head's scores mean them (slda's softmax; balanced's and dual's shares)."""
        return PROBABILITY_RULES[str(HEADS[self.head].head.probabilities)](self.class_scores(X))

    def __getstate__(self) -> dict[str, Any]:
        """The head's model-file tensors (:mod:`foal_pipe.heads.state`) stand for its running state: no array
        namespace module is pickled; taken under the lock, of one model."""
        from foal_pipe.heads.state import export_head

        with owner_lock(self):
            model = self._solve() if "_head" in self.__dict__ else None
            state = {k: v for k, v in self.__dict__.items() if k not in ("_head", "_model", "_undo")}
            if model is not None:
                state["_tensors"] = export_head(self.head, self._head, model)
            return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from foal_pipe.heads.state import restore_head, scorer_from

        tensors = state.pop("_tensors", None)
        self.__dict__.update(state)
        if tensors is not None:
            self.__dict__.setdefault("_fitted_with", self._options())  # pickled before the options were recorded
            # a None recorded by a fit from before None was refused stood for the default, as it does here
            head = make_head(self.head, self._fitted_with, xp_numpy, self.n_features_in_)
            self._head = restore_head(head, self.head, tensors)
            self._model = scorer_from(self.head, tensors, head.options, xp_numpy)  # type: ignore[attr-defined]


def _check_none(head: str, name: str, default: Any) -> None:
    """Refuse option ``name`` given as None where the head does not take None (its ``Options`` refuse it): the CLI's
    None means "not given", but a scikit-learn caller means a value by it (``LinearDiscriminantAnalysis``'s
    ``shrinkage=None``: none), which no default stands for. A None the head documents (dual's ``gamma_comp``: the
    same as ``gamma``) keeps its meaning."""
    try:
        HEADS[head].head.Options(**{name: None})
    except FoalPipeError:
        raise FoalPipeError(f"{param(name, None)} is not a value of {head}'s {param(name)}",
                            f"leave it out for the default {default!r}, or pass a value docs/heads.md lists") from None


def _estimator(name: str, head: type[HeadBase]) -> type[HeadEstimator]:
    """The estimator class of head ``name``: ``__init__`` takes the head's options as keyword parameters."""
    options = fields(head.Options)

    def __init__(self: HeadEstimator, **given: Any) -> None:
        unknown = set(given) - {f.name for f in options}
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no parameter {sorted(unknown)[0]!r}")
        for f in options:
            setattr(self, f.name, given.get(f.name, f.default))

    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                             default=None if f.default is MISSING else f.default) for f in options])
    title = head.__name__.removesuffix("Head")
    doc = (f"scikit-learn estimator of the ``{name}`` head (:class:`{head.__module__}.{head.__name__}`); parameters: "
           f"{', '.join(f'``{f.name}={f.default!r}``' for f in options) or 'none'}.")
    return type(f"{title}Classifier", (HeadEstimator,), {"head": name, "__init__": __init__, "__doc__": doc,
                                                          "__module__": __name__})


#: The estimator class of every head (ridge's: ``RidgeClassifier``, equal to
#: :class:`~foal_pipe.model.classifier.AnalyticClassifier` at its gamma; not scikit-learn's RidgeClassifier, which fits
#: +-1 targets with an intercept).
ESTIMATORS: dict[str, type[HeadEstimator]] = {name: _estimator(name, entry.head) for name, entry in HEADS.items()}
globals().update({cls.__name__: cls for cls in ESTIMATORS.values()})  # importable by name, so they pickle


def head_classifier(name: str, **options: Any) -> BaseEstimator:
    """The scikit-learn estimator of head ``name`` with its ``options`` (ridge's equals an
    :class:`~foal_pipe.model.classifier.AnalyticClassifier` at its gamma, which adds the RLS engine, float32 sums and
    the array backends)."""
    head_entry(name)
    unknown = set(options) - {f.name for f in fields(HEADS[name].head.Options)}
    if unknown:
        raise FoalPipeError(f"the {name} head takes no option {param(sorted(unknown)[0])}; its options: "
                            f"{', '.join(asdict(HEADS[name].head.Options()) ) or 'none'}")
    return ESTIMATORS[name](**options)
