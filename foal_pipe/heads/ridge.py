"""``ridge``: F-OAL's analytic ridge on the activations, the learner the walk runs itself
(:mod:`foal_pipe.protocol.walk`'s Gram lanes). This class carries what the registry reads of it; it is never built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from foal_pipe.heads.base import HeadBase
from foal_pipe.heads.checks import FLOAT64


@dataclass(frozen=True)
class RidgeOptions:
    """``gamma``: a number, or ``auto`` (checked by :func:`~foal_pipe.protocol.config.parse_gamma`)."""

    gamma: float | str = 1.0


class RidgeHead(HeadBase):
    """The registry's facts of ridge: its rows, its option, its memory (the Gram and ``H^T Y``)."""

    name: ClassVar[str] = "ridge"
    space: ClassVar[str] = "activations"
    Options: ClassVar[type] = RidgeOptions
    probabilities: ClassVar[str | None] = "shares"

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        return FLOAT64 * dim * (dim + n_classes)

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * dim * seen
