"""The contract every analytic head follows: a running state over one stream (:class:`Head`) that, at a task end,
gives an exact model of every row added so far (:class:`Scorer`).

The walk (:mod:`foal_pipe.protocol.walk`) reads the train rows once and feeds each head the rows of its
:attr:`Head.space` in stream order, in blocks of any size; ``boundary()`` at every task end must equal a
from-scratch float64 computation of the head's definition on all rows added so far. Heads are built by their
registry entry (:data:`foal_pipe.heads.HEADS`) with their own options as keyword arguments plus ``xp`` (the array
namespace, :mod:`foal_pipe.core.backend`) and ``dim`` (the width of the rows they will be given). Each head's class
derives from :class:`HeadBase`, which carries the rest of what the package knows of it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import numpy as np
from array_api_compat import array_namespace

from foal_pipe.errors import FoalPipeError

#: The rows a head is given. ``features``: the store's rows after ``--fusion``; ``activations``: the projected,
#: activated rows ridge's Gram sums; ``projected``: the rows after the projection, before the activation.
SPACES = ("features", "activations", "projected")


class Scorer(Protocol):
    """An exact model at one task boundary: scores over the classes seen so far. A linear scorer (``X @ W``) also
    offers ``ties(X)``, the :class:`~foal_pipe.core.scoring.Ties` of its weights with the float64 rows, with which
    its argmax is refused where rounding would pick it."""

    classes: np.ndarray  # sorted global class ids seen so far (host NumPy)

    def scores(self, X: Any) -> Any:
        """(n, len(classes)) array in ``X``'s namespace; higher = more likely (argmax predicts)."""
        ...


class ClassColumns(Protocol):
    """A scorer whose column of a class depends on that class's statistics alone (fecam's distances). ``keys[k]``
    names the statistics of ``classes[k]`` (equal keys, equal columns, whichever boundary's scorer holds them), so a
    walk scoring the same rows at every boundary computes each (row, class) column once per change of the class's
    statistics: once in a disjoint stream, again whenever a class gets rows again."""

    classes: np.ndarray
    keys: Sequence[Hashable] | None  # None: no key, score with ``scores``

    def prepare(self, X: Any) -> Any:
        """The rows as :meth:`column` takes them (the same for every scorer of one head)."""
        ...

    def column(self, k: int, prepared: Any) -> Any:
        """Scores of ``classes[k]`` for prepared rows: column ``k`` of :meth:`Scorer.scores`."""
        ...

    def prepare_low(self, prepared: Any) -> Any:
        """What :meth:`bounded_column` takes of the prepared rows, or None where no cheaper column is offered."""
        ...

    def bounded_column(self, k: int, low: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """Column ``k`` computed more cheaply (host NumPy float64) and, per row, a bound on its distance from
        :meth:`column`'s values, or None (then :meth:`column` scores the class): a walk's argmax takes the exact
        columns only for the rows whose order the bounds leave open."""
        ...


class Head(Protocol):
    """A head's running state over one stream: rows arrive in stream order, any block size."""

    name: ClassVar[str]
    space: ClassVar[str]  # one of SPACES

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Rows ``X`` ((n, dim) float64 array in namespace ``xp``) labelled with global class ids ``labels``. A head that
        :attr:`~HeadBase.solve_on_demand` refuses a batch with a ``FoalPipeError`` (rows of another width, sums that
        would overflow) before it writes anything, so its state stays as it was and callers keep it; any other error,
        and dual's recursion refusing mid-batch, may leave the state half-written."""
        ...

    def boundary(self) -> Scorer:
        """At a task end: the exact model over all rows added so far."""
        ...


class LeaveOneOut(Protocol):
    """A head that can also score its exact leave-one-out accuracy (``sweep --heads``' training-data criterion):
    after the last boundary the walk passes every row added again, in blocks."""

    def loo_hits(self, X: Any, labels: np.ndarray) -> int:
        """How many of the rows ``X`` (each added before) the model refitted without that row predicts right."""
        ...


def shares(scores: np.ndarray) -> np.ndarray:
    """Ridge's rule (:meth:`~foal_pipe.model.deploy.DeployedModel.predict_proba`): scores of a least-squares fit to
    one-hot targets, clipped at 0 and normalised (a row with no positive score is uniform). A row whose finite scores
    sum past float64's largest number is divided by its largest score first, so that its shares still sum to 1
    rather than all rounding to 0."""
    scores = np.clip(scores, 0.0, None)
    with np.errstate(over="ignore"):  # such rows are scaled below
        total = scores.sum(axis=1, keepdims=True)
    over = np.isinf(total)
    if over.any():
        scores = np.where(over, scores / np.where(over, scores.max(axis=1, keepdims=True), 1.0), scores)
        total = np.where(over, scores.sum(axis=1, keepdims=True), total)
    uniform = np.full_like(scores, 1.0 / max(scores.shape[1], 1))
    return np.divide(scores, total, out=uniform, where=total > 0)


def softmax(scores: np.ndarray) -> np.ndarray:
    """LDA's scores are the Gaussian log-likelihoods up to a term shared by every class: their softmax is the
    posterior under equal class priors."""
    with np.errstate(over="ignore"):  # a gap past float64's largest number is -inf, whose exp is the 0 it rounds to
        shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


#: How a head's scores become class probabilities, by the name its class gives (``probabilities``).
PROBABILITY_RULES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"softmax": softmax, "shares": shares}


def magnitude(X: Any) -> float:
    """``max|X|`` (0 for no entries), on the host."""
    xp = array_namespace(X)
    return float(xp.max(xp.abs(X))) if X.shape[0] * X.shape[1] else 0.0


def largest_square(gram: Any) -> float:
    """The largest diagonal entry of a Gram of rows (0 for none): no entry of it is larger in magnitude."""
    xp = array_namespace(gram)
    return float(xp.max(xp.linalg.diagonal(gram))) if gram.shape[0] else 0.0


def check_gram_room(head: str, top: float, rows: int, held: float, shift: float = 0.0) -> None:
    """Refuse, before a head writes anything (:meth:`Head.add`), ``rows`` rows of entries at most ``top`` in
    magnitude, less a shift of entries at most ``shift``, whose products would take float64 Gram sums now at most
    ``held`` (:func:`largest_square`) past the largest float64: the sums would be inf for good and every later boundary
    refused. A cheap bound on the host, as ridge's (:meth:`~foal_pipe.core.engines.GramEngine.update`): no extra pass
    over the products, so the sums of the batches it lets through keep their bits."""
    bound = top + shift
    if held + rows * bound * bound > float(np.finfo(np.float64).max):  # Python floats: inf past the largest, no warning
        raise FoalPipeError(f"{head}: features of magnitude {top:.3g} overflow the float64 Gram sums (|x|^2 beyond the "
                            "largest number); scale the features down (e.g. divide by their largest value)")


@dataclass(frozen=True)
class NoOptions:
    """The options of a head that has none."""


class HeadBase:
    """What a head's class carries besides its running state, so that a head lives in one module: its ``Options``
    (a frozen dataclass whose ``__post_init__`` refuses a bad value in one line), its memory estimate, its file
    layout (``scorer_tensors`` and ``state_tensors`` in named dimensions: C classes, d the store's features, D the
    projection's width; :meth:`state_dict` and :meth:`load_state_dict`, like PyTorch's; :meth:`scorer_from`) and how
    its scores become probabilities (``probabilities``: a key of :data:`PROBABILITY_RULES`; None: its scores are
    distances or cosines, not probabilities).

    A subclass sets the class variables, defines ``add`` and ``boundary`` (:class:`Head`), and builds
    ``self.options = Options(**options)`` in ``__init__(self, *, xp, dim, **options)``."""

    name: ClassVar[str]
    space: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    weight_tensor: ClassVar[str | None] = None  # the tensor whose column k scores class k linearly (weight norms)
    probabilities: ClassVar[str | None] = None
    #: Whether :meth:`boundary` is a function of the rows added so far alone, whichever boundaries came before (a
    #: cache inside, as fecam's per-class solves, gives the same bits): a caller may then solve only when it needs the
    #: model, once for any number of ``add`` calls. False where a boundary ends a task that later rows depend on (dual).
    solve_on_demand: ClassVar[bool] = True
    #: Bytes its scoring holds per row and class beyond the one float64 score, measured (tracemalloc, 1,000 classes):
    #: the memory estimates of ``learn``, ``evaluate`` and ``predict`` charge it to a block's scores.
    score_bytes: ClassVar[int] = 0

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.options: Any = self.Options(**options)  # refuses a bad value in one line

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Rows ``X`` labelled with global class ids ``labels`` (:class:`Head`)."""
        raise NotImplementedError

    def boundary(self) -> Scorer:
        """The exact model over all rows added so far (:class:`Head`)."""
        raise NotImplementedError

    @classmethod
    def check_counts(cls, classes: Sequence[Any], counts: Sequence[int]) -> None:
        """Refuse a boundary whose rows per class (``counts``, of ``classes``: ids or names) the head cannot fit, in
        one line; every count of at least one fits by default. :meth:`boundary` calls it, and ``foal-pipe table``
        before any run, from the stream alone."""

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """Bytes the running state holds at its largest, for ``n_classes`` classes of rows of width ``dim``."""
        raise NotImplementedError

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        """Bytes one boundary's scorer keeps until the test pass scores it (``seen``: the classes seen so far;
        ``changed``: those whose rows changed since the last boundary)."""
        raise NotImplementedError

    def state_dict(self, scorer: Any) -> dict[str, Any]:
        """Every tensor of :attr:`scorer_tensors` and :attr:`state_tensors` after the boundary ``scorer``."""
        raise NotImplementedError

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict`'s statistics (and ``classes``) into this fresh head: it then adds rows exactly as if
        its stream had never stopped."""
        raise NotImplementedError

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> Scorer:
        """The scorer :attr:`scorer_tensors` hold (``options``: the head's ``Options``)."""
        raise NotImplementedError

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The names of the head's options, in their dataclass's order."""
        return tuple(f.name for f in fields(cls.Options))
