"""The analytic heads: closed-form classifiers on a frozen backbone's features, each exact at every task boundary.

A timm-like registry (:data:`HEADS`): each entry builds its head (:mod:`foal_pipe.heads.base`'s contract) from its
own options, says which rows it takes (:data:`~foal_pipe.heads.base.SPACES`), what its state holds for the
up-front memory estimate, and where it comes from. ``ridge`` is F-OAL's learner itself
(:mod:`foal_pipe.protocol.walk`'s Gram lanes); its entry has no factory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads.balanced import BalancedHead
from foal_pipe.heads.base import SPACES, Head, Scorer
from foal_pipe.heads.dual import DualHead
from foal_pipe.heads.fecam import FeCAMHead
from foal_pipe.heads.ncm import NCMHead
from foal_pipe.heads.slda import SLDAHead

__all__ = ["DEFAULT_HEAD", "HEADS", "SPACES", "Head", "HeadEntry", "Scorer", "head_entry", "make_head"]

#: The head of ``learn`` without ``--head``: F-OAL's ridge learner.
DEFAULT_HEAD = "ridge"


@dataclass(frozen=True)
class HeadEntry:
    """A head of the registry.

    ``factory(xp=, dim=, **options)`` builds its running state (None: ridge, the walk's own learner); ``space``
    the rows it takes; ``options`` the :class:`~foal_pipe.protocol.config.ModelConfig` fields it reads (None there:
    the head's default); ``memory(classes, dim)`` the bytes its state holds at its largest; ``kept(changed, seen,
    dim)`` the bytes one boundary's scorer keeps until the test pass scores it (``seen``: the classes seen so far;
    ``changed``: those whose rows changed since the last boundary, all a scorer holds anew where it shares the other
    classes' columns with earlier boundaries, as fecam's does); ``source`` and ``citation`` fill the docs' table.
    """

    factory: Callable[..., Head] | None
    space: str
    options: tuple[str, ...]
    memory: Callable[[int, int], int]
    kept: Callable[[int, int, int], int]
    source: str
    citation: str


HEADS: dict[str, HeadEntry] = {
    "ridge": HeadEntry(None, "activations", ("gamma",), lambda c, d: 8 * d * (d + c), lambda changed, seen, d: 8 * d * seen,
                       "F-OAL / ACIL / RanPAC", "Zhuang et al., NeurIPS 2024"),
    "ncm": HeadEntry(NCMHead, "features", (), lambda c, d: 8 * 2 * c * d, lambda changed, seen, d: 8 * seen * d,
                     "nearest class mean (SimpleCIL)", "Zhou et al., IJCV 2024"),
    "slda": HeadEntry(SLDAHead, "features", ("shrinkage",), lambda c, d: 8 * (3 * d * d + 2 * c * d),
                      lambda changed, seen, d: 8 * seen * (d + 1),
                      "deep streaming LDA (Avalanche StreamingLDA)", "Hayes & Kanan, CVPR-W 2020"),
    "fecam": HeadEntry(FeCAMHead, "features", ("shrinkage", "shrinkage_offdiag"), FeCAMHead.memory, FeCAMHead.kept,
                       "FeCAM (its ViT scripts)", "Goswami et al., NeurIPS 2023"),
    "balanced": HeadEntry(BalancedHead, "activations", ("gamma",), BalancedHead.memory,
                          lambda changed, seen, d: 8 * seen * d,
                          "AIR's analytic re-weighting (GeneralizedARM.update, ZHUANGHP/Analytic-continual-learning)",
                          "Fang et al., AIR, 2024"),
    "dual": HeadEntry(DualHead, "projected", ("gamma", "gamma_comp", "compensation"), DualHead.memory,
                      lambda changed, seen, d: 8 * 2 * seen * d,
                      "DS-AL's dual stream (analytic/DSAL.py, ZHUANGHP/Analytic-continual-learning)",
                      "Zhuang et al., AAAI 2024"),
}


def head_entry(name: str, option: str = "head") -> HeadEntry:
    """The registry's entry of ``name``; an unknown name refused, naming ``option`` and listing the heads."""
    entry = HEADS.get(name)
    if entry is None:
        raise FoalPipeError(f"unknown {param(option)} {name!r}; choose one of {', '.join(HEADS)}")
    return entry


def make_head(name: str, options: Mapping[str, Any], xp: Any, dim: int) -> Head:
    """A fresh running state of head ``name`` on rows of width ``dim``; ``options`` maps its option names to values
    (None: the head's default)."""
    entry = head_entry(name)
    given = {key: value for key, value in options.items()
             if (key in entry.options or key == "batch_size") and value is not None}
    return entry.factory(xp=xp, dim=dim, **given)
