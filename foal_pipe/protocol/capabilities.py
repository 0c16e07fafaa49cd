"""What every head can take: one declarative table of the options whose support differs by head (in the spirit of
scikit-learn's ``_parameter_constraints``), from which the runs refuse a combination in one line before any work
and docs/heads.md's head x capability table is generated (a test checks that the page holds this table).

A row names the capability, the heads that take it (None: every head of :data:`~foal_pipe.heads.HEADS`, those
added later included), when a run asks for it, and, for the heads that cannot take it, why and the way out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from foal_pipe.errors import ClassRefused, FoalPipeError, param, python_form
from foal_pipe.heads import HEADS
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig


@dataclass(frozen=True)
class Settings:
    """A run's settings, as the table's ``asked`` rules read them."""

    stream: StreamConfig
    model: ModelConfig
    evaluation: EvaluationConfig
    execution: ExecutionConfig


@dataclass(frozen=True)
class Capability:
    """One row of the table: ``takes`` the heads that can (None: every head); ``asked(settings)`` whether a run
    asks for it (None: a command's own option, refused where that command checks it); ``why`` and ``fix``, the
    refusal's two halves (``{head}`` stands for the head's name)."""

    name: str
    takes: tuple[str, ...] | None
    asked: Callable[[Settings], bool] | None = None
    why: str = ""
    fix: str = ""

    def taken_by(self, head: str) -> bool:
        return self.takes is None or head in self.takes

    def refusal(self, head: str) -> str:
        """The one-line refusal of this capability for ``head`` (a message template: :func:`param` marks)."""
        return f"{param('head', head)} {self.why}; {self.fix.format(head=head)}"


#: Every capability whose support is worth a column, in the docs table's order.
CAPABILITIES: tuple[Capability, ...] = (
    Capability("--order-seeds", None),
    Capability("sweep --heads", None),
    Capability("--stream si-blurry", None),
    Capability("--fusion", None),
    Capability("sweep --fusions", None),
    Capability("--init-model", None),
    Capability("--eval-every", ("ridge", "ncm", "slda", "fecam", "balanced", "cosine"),
               lambda s: s.evaluation.eval_every is not None,
               "solves its compensation stream once per task, so a point inside a task is no model of its recursion",
               f"drop {param('eval_every')}, or compare at task ends"),
    Capability("--no-mask-unseen", ("ridge",), lambda s: not s.evaluation.mask_unseen,
               "predicts among the classes seen so far",
               f"drop {param('mask_unseen', False)} (it is ridge's published-code rule)"),
    Capability("--scheduler dask", None),
    Capability("--init-model --scheduler dask", ("ridge",), None,
               "continues its model in this process (only ridge's sums are added on a cluster)",
               f"continue it with {param('scheduler', 'local')}"),
    Capability("--dtype float32", None),
    Capability("--gamma auto", ("ridge",), lambda s: s.model.gamma == "auto",
               f"has no search over gamma ({param('gamma', 'auto')} is ridge's)",
               f"pass a number such as {param('gamma', 1)} where the head takes one, or compare gammas with "
               "`sweep --heads ridge,{head}`"),
    Capability("--engine rls", ("ridge",), lambda s: s.model.engine != "gram", "has no RLS recursion",
               f"drop {param('engine')}"),
)


#: The training rows of every class seen that a head's model needs (fecam: a covariance per class); at a task end
#: the head itself refuses fewer, at an ``--eval-every`` point the run refuses before any work
#: (:func:`check_points`).
MIN_CLASS_ROWS: dict[str, int] = {"fecam": 2}


def _short_point(labels: np.ndarray, every: int, least: int) -> tuple[int, int] | None:
    """The first point of ``every`` rows (``labels``: the stream's, in order) where a seen class has fewer than
    ``least`` rows, and that class; None when there is none."""
    for n in range(every, labels.size + 1, every):
        counts = np.bincount(labels[:n])
        short = np.flatnonzero((counts > 0) & (counts < least))
        if short.size:
            return n, int(short[0])
    return None


def check_points(head: str, labels: Sequence[np.ndarray], every: int, seeds: Sequence[int] | None = None,
                 names: Sequence[str] | None = None) -> None:
    """``--eval-every`` with a head that needs :data:`MIN_CLASS_ROWS`: refuse, before any work, points where a seen
    class has fewer rows in one of the streams ``labels`` (``seeds``: their class orders' seeds, named), naming the
    nearest ``--eval-every`` above that has none in any of them. The class is named as ``names`` (the store's class
    names, by label id) names it, as the heads' own refusals are; without them the refusal is a
    :class:`~foal_pipe.errors.ClassRefused` a caller can name."""
    least = MIN_CLASS_ROWS.get(head)
    if least is None:
        return
    found = next(((k, hit) for k, order in enumerate(labels) if (hit := _short_point(order, every, least))), None)
    if found is None:
        return
    k, (n, c) = found
    fix = next((e for e in range(every + 1, min(order.size for order in labels) + 1)
                if all(_short_point(order, e, least) is None for order in labels)), None)
    way = f"pass {param('eval_every', fix)}" if fix is not None else f"drop {param('eval_every')}"
    where = "" if seeds is None else f" in class order seed {seeds[k]}"
    refused = ClassRefused(c, lambda name: f"{param('head', head)} needs {least} training rows of every class seen, but"
                                          f"{where} at the point after {n} rows class {name} has fewer: {way}")
    raise refused if names is None else refused.named(dict(enumerate(names)))


def check_capabilities(heads: Sequence[str], settings: Settings) -> None:
    """Refuse, in one line, the first capability the run asks for that one of ``heads`` cannot take."""
    for capability in CAPABILITIES:
        if capability.asked is None or not capability.asked(settings):
            continue
        for head in heads:
            if not capability.taken_by(head):
                raise FoalPipeError(capability.refusal(head))


def capability_table(form: Callable[..., str] = python_form) -> str:
    """docs/heads.md's head x capability table (Markdown), from :data:`CAPABILITIES` and the registry; parameters
    named by ``form`` (the CLI's flags: :func:`foal_pipe.cli.flags.cli_form`). A head that cannot take a capability
    shows "no", its reason under the table."""
    heads = list(HEADS)
    lines = ["| capability | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    notes = []
    for capability in CAPABILITIES:
        cells = ["yes" if capability.taken_by(head) else "no" for head in heads]
        lines.append(f"| `{capability.name}` | " + " | ".join(cells) + " |")
        refused = [head for head in heads if not capability.taken_by(head)]
        if refused:
            why = FoalPipeError(f"{capability.why}; {capability.fix.format(head='NAME')}").render(form)
            notes.append(f"- `{capability.name}`, not {', '.join(refused)}: {why}.")
    return "\n".join([*lines, "", *notes]) + "\n"
