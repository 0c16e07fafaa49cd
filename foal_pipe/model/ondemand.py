"""A head's model solved when first needed: what :class:`~foal_pipe.model.headestimator.HeadEstimator` and
:class:`~foal_pipe.model.headmodel.HeadClassifier` share.

``partial_fit`` only adds rows to the head's sufficient statistics where the head
:attr:`~foal_pipe.heads.base.HeadBase.solve_on_demand`; the first reader solves them, once for any number of calls.
The state at the last solve waits beside the running head (``_undo``), so that a solve the head refuses returns the
owner to its last solved model, saying how many calls it undid, instead of leaving a model no solve gave.
Adding rows and solving hold the owner's lock (:func:`~foal_pipe.core.engines.owner_lock`): a reader never solves a
head that a call is adding to, so the model kept is always the solve of whole calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from foal_pipe.core.engines import locked
from foal_pipe.errors import ClassRefused, FoalPipeError
from foal_pipe.heads import Head, Scorer


def undone(exc: BaseException, owner: str, calls: int, back: str = "its last solved model") -> BaseException:
    """``exc`` saying that ``owner`` (a class name) is back at ``back`` with its last ``calls`` partial_fit calls
    undone."""
    last = "last partial_fit call" if calls == 1 else f"last {calls} partial_fit calls"
    said = f"this {owner} is back at {back}: the rows of its {last} are undone"
    if isinstance(exc, FoalPipeError):
        return FoalPipeError(f"{exc.template}; {said}")
    exc.add_note(said)
    return exc


class SolvesOnDemand:
    """The running head ``_head``, its solved model ``_model`` and, while calls since the last solve are pending,
    ``_undo``: the attributes of :attr:`_STATE` at that solve (empty: not fitted then) and the number of calls since.

    A subclass lists in :attr:`_STATE` every attribute its ``partial_fit`` changes, adds rows with :meth:`_take`,
    commits its own attributes, then calls :meth:`_keep`; it gives its solved model in :meth:`_solved_model`."""

    #: The attributes partial_fit changes (``_head`` and ``_model`` among them): what a refused solve restores.
    _STATE: ClassVar[tuple[str, ...]]
    _head: Head | None  # None only before the first call of an owner restored from a file
    _model: Scorer | None
    _undo: tuple[dict[str, Any], int] | None = None

    def _solved_model(self) -> Scorer:
        """The model of the last solve (no calls pending)."""
        raise NotImplementedError

    def _class_names(self) -> Mapping[Any, Any]:
        """The head's class ids as the caller names them (:class:`~foal_pipe.errors.ClassRefused`); none: the ids."""
        return {}

    @locked
    def _take(self, X: np.ndarray, labels: np.ndarray, solved_copy: Callable[[], Head], solve_now: bool,
              names: Mapping[Any, Any] | None = None) -> tuple[Head, Scorer | None, tuple[dict[str, Any], int]]:
        """Add a call's rows: to the running head while calls are pending, else to ``solved_copy()`` (the solved
        head stays as it was, the state to return to). Gives the head, its model where ``solve_now`` (a head whose
        boundary ends a task), and the ``_undo`` that :meth:`_keep` records. A ``FoalPipeError`` of the head is raised
        before it wrote anything, so the pending calls stay; any other error may have left the running head
        half-written, so the owner goes back to its last solved model. A class the head refuses is named by ``names``
        (the head's ids as the caller names them, this call's new classes included)."""
        pending = self._undo
        if pending is not None:
            (undo, calls), head = pending, self._head
            assert head is not None
        else:
            undo = {k: v for k, v in self.__dict__.items() if k in self._STATE} if "_head" in self.__dict__ else {}
            calls, head = 0, solved_copy()
        try:
            head.add(X, labels)
            model = head.boundary() if solve_now else None
        except ClassRefused as exc:
            raise exc.named(names or {}) from None
        except FoalPipeError:
            raise
        except BaseException as exc:
            if pending is not None:
                raise self._restore(exc, pending) from None
            raise
        return head, model, (undo, calls + 1)

    def _keep(self, model: Scorer | None, undo: tuple[dict[str, Any], int]) -> None:
        """After the subclass committed a call's state: its model, or the call pending with ``undo`` (set first, so
        that a reader never finds neither)."""
        if model is None:
            self._undo = undo
        self._model = model

    @locked
    def _solve(self, say_undone: bool = True) -> Scorer:
        """The model of every row so far: solved once after the last call, then kept. A refused solve (any error but
        an interruption, after which the next access solves again) returns the owner to its last solved model and
        says how many calls it undid (not ``say_undone``: the error as it is). Under the owner's lock: readers in
        several threads solve once, never beside a call adding rows; one that finds the state changed while it
        solved (an owner whose calls commit outside the lock) solves again."""
        pending = self._undo
        if pending is None:
            return self._solved_model()
        assert self._head is not None
        try:
            model = self._head.boundary()
        except Exception as exc:
            if self._undo is not pending:
                return self._solve(say_undone)
            said = exc.named(self._class_names()) if isinstance(exc, ClassRefused) else exc
            if not say_undone:
                self._restore(exc, pending, say_undone)
                if said is exc:
                    raise
                raise said from None
            raise self._restore(said, pending) from None
        if self._undo is pending:
            self._model = model
            self.__dict__.pop("_undo", None)
        return self._solve(say_undone)

    def _restore(self, exc: BaseException, pending: tuple[dict[str, Any], int], say_undone: bool = True) -> BaseException:
        """Return to ``pending``'s state at the last solve (its attributes in their order then, in one swap for
        readers) and give ``exc``, saying how many calls were undone where ``say_undone``."""
        undo, calls = pending
        kept = {k: v for k, v in self.__dict__.items() if k not in self._STATE and k != "_undo"}
        self.__dict__ = {**kept, **undo}
        if not say_undone:
            return exc
        return undone(exc, type(self).__name__, calls, "its last solved model" if undo else "not fitted")
