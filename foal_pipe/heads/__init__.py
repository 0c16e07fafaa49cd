"""The analytic heads: closed-form classifiers on a frozen backbone's features, each exact at every task boundary.

A timm-like registry (:data:`HEADS`): one line per head, its class (:class:`~foal_pipe.heads.base.HeadBase`: the
head's options, rows, memory estimate, file layout and probabilities live there) and where it comes from.
``ridge`` is F-OAL's learner, a head like the others; in the CLI's one walk it has its own learner
(:attr:`HeadEntry.learner`: :mod:`foal_pipe.protocol.learners.gram`'s Gram lanes), which adds its gamma path, RLS
engine and fusion lanes.
Adding a head: docs/adding-a-head.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads.balanced import BalancedHead
from foal_pipe.heads.base import PROBABILITY_RULES, SPACES, Head, HeadBase, Scorer
from foal_pipe.heads.cosine import CosineHead
from foal_pipe.heads.dual import DualHead
from foal_pipe.heads.fecam import FeCAMHead
from foal_pipe.heads.ncm import NCMHead
from foal_pipe.heads.ridge import RidgeHead
from foal_pipe.heads.slda import SLDAHead

__all__ = ["DEFAULT_HEAD", "HEADS", "SPACES", "Head", "HeadBase", "HeadEntry", "Scorer", "head_entry", "make_head",
           "probabilities", "taken_options"]

#: The head of ``learn`` without ``--head``: F-OAL's ridge learner.
DEFAULT_HEAD = "ridge"


@dataclass(frozen=True)
class HeadEntry:
    """A head of the registry: its class (``head``), for the docs' table ``source`` and ``citation``, and ``learner``:
    the learner that runs it in the CLI's one walk (:data:`~foal_pipe.protocol.learnkinds.LEARN_KINDS`: ``"gram"``,
    ridge's Gram lanes; ``"heads"``, the registry heads' running states).

    ``gram_lanes``: its learner is ridge's Gram lanes. The rest is read from the class: ``factory`` builds its running
    state; ``space`` the rows it takes; ``options`` the :class:`~foal_pipe.protocol.config.ModelConfig` fields it reads
    (its ``Options`` but ``batch_size``, the stream's); ``memory(classes, dim)`` the bytes its state holds at its
    largest; ``kept(changed, seen, dim)`` the bytes one boundary's scorer keeps until the test pass scores it.
    """

    head: type[HeadBase]
    source: str
    citation: str
    learner: str = "heads"

    @property
    def factory(self) -> type[HeadBase]:
        return self.head

    @property
    def gram_lanes(self) -> bool:
        return self.learner == "gram"

    @property
    def space(self) -> str:
        return self.head.space

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(name for name in self.head.option_names() if name != "batch_size")

    @property
    def memory(self) -> Callable[[int, int], int]:
        return self.head.memory

    @property
    def kept(self) -> Callable[[int, int, int], int]:
        return self.head.kept


HEADS: dict[str, HeadEntry] = {
    "ridge": HeadEntry(RidgeHead, "F-OAL / ACIL / RanPAC", "Zhuang et al., NeurIPS 2024", "gram"),
    "ncm": HeadEntry(NCMHead, "nearest class mean of L2-normalised features", "Mensink et al., TPAMI 2013"),
    "slda": HeadEntry(SLDAHead, "deep streaming LDA (Avalanche StreamingLDA)", "Hayes & Kanan, CVPR-W 2020"),
    "fecam": HeadEntry(FeCAMHead, "FeCAM (its ViT scripts)", "Goswami et al., NeurIPS 2023"),
    "balanced": HeadEntry(BalancedHead, "AIR's analytic re-weighting (GeneralizedARM.update)", "Fang et al., AIR, 2024"),
    "dual": HeadEntry(DualHead, "DS-AL's dual stream (analytic/DSAL.py)", "Zhuang et al., AAAI 2024"),
    "cosine": HeadEntry(CosineHead, "SimpleCIL's prototype classifier (cosine to class means)", "Zhou et al., IJCV 2024"),
}


def head_entry(name: str, option: str = "head") -> HeadEntry:
    """The registry's entry of ``name``; an unknown name refused, naming ``option`` and listing the heads."""
    entry = HEADS.get(name)
    if entry is None:
        raise FoalPipeError(f"unknown {param(option)} {name!r}; choose one of {', '.join(HEADS)}")
    return entry


def taken_options(head: type[HeadBase], options: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that ``head`` takes, a None left out: it stands for an option not given (the CLI's
    and a model file's word for the head's default; an estimator refuses every other None first)."""
    taken = head.option_names()
    return {key: value for key, value in options.items() if key in taken and value is not None}


def make_head(name: str, options: Mapping[str, Any], xp: Any, dim: int) -> Head:
    """A fresh running state of head ``name`` on rows of width ``dim``; ``options`` maps its option names to values
    (None: the head's default)."""
    entry = head_entry(name)
    return entry.factory(xp=xp, dim=dim, **taken_options(entry.head, options))


def probabilities(name: str, scores: Any) -> Any:
    """Head ``name``'s scores (n, classes) as class probabilities, by its class's rule (``probabilities``); a head whose
    scores are distances or cosines (ncm, fecam, cosine) refuses."""
    rule = head_entry(name).head.probabilities
    if rule is None:
        raise FoalPipeError(f"the {name} head's scores are distances or cosines, not probabilities; use predict or "
                            "scores")
    return PROBABILITY_RULES[rule](scores)
