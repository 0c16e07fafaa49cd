"""Feature fusion over a timm ViT's ``blocks`` (docs/protocol.md section 1).

The chosen token (:data:`TOKENS`: CLS, or the mean of the patch tokens) of each chosen block's output
(:data:`FUSIONS`: every block, or the last) -- the residual stream, before any norm -- is averaged, and the
model's final norm is applied once to that average. It is computed in the single forward pass of timm's
``forward_features``: a forward hook on each chosen block adds its token to a running (B, d) float32 sum, so
nothing larger than one (B, d) tensor is kept (``forward_intermediates`` would keep every block's full
(B, L, d) output alive; benchmarks/extract_bench.py measures both). Torch is imported inside functions only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from foal_pipe.errors import FoalPipeError

TOKENS: dict[str, Callable[[Any, int], Any]] = {
    "cls": lambda out, n_prefix: out[:, 0],
    "mean": lambda out, n_prefix: out[:, n_prefix:].mean(dim=1),  # register / distillation tokens excluded
}
"""Token choice: ``(block output (B, L, d), number of prefix tokens) -> (B, d)``."""

FUSIONS: dict[str, Callable[[Sequence[Any]], list[Any]]] = {
    "mean-cls": lambda blocks: list(blocks),  # the paper: the average over every block
    "last": lambda blocks: [blocks[-1]],  # the last block only: timm's forward_features token
}
"""Which blocks are averaged: ``model.blocks -> the blocks to hook``."""


def final_norm(model: Any) -> Any:
    """The norm timm applies to the features: ``norm``, or ``fc_norm`` where ``norm`` is an identity
    (models with average pooling, e.g. EVA, BEiT)."""
    import torch

    norm = getattr(model, "norm", None)
    if norm is not None and not isinstance(norm, torch.nn.Identity):
        return norm
    fc_norm = getattr(model, "fc_norm", None)
    return fc_norm if fc_norm is not None else torch.nn.Identity()


class BlockFusion:
    """Fused features of ``model`` (a loaded timm ViT): ``fusion(x)`` runs ``forward_features`` once and returns
    the final norm of the average of the chosen blocks' tokens, float32 ``(B, d)``."""

    def __init__(self, model: Any, fusion: str, token: str, n_prefix: int, name: str):
        self.model, self.name, self.n_prefix = model, name, n_prefix
        self.blocks = FUSIONS[fusion](model.blocks)
        self.pick = TOKENS[token]
        self.norm = final_norm(model)
        self._sum: Any = None
        self._handles = self._attach()

    def _attach(self) -> list[Any]:
        return [block.register_forward_hook(self._add) for block in self.blocks]

    def _add(self, _module: Any, _inputs: Any, out: Any) -> None:
        import torch

        if not isinstance(out, torch.Tensor) or out.ndim != 3:
            raise FoalPipeError(f"{self.name}: a block returned {type(out).__name__}, not a (B, L, d) token tensor; "
                                "this model family is not supported")
        token = self.pick(out, self.n_prefix).float()
        self._sum = token if self._sum is None else self._sum + token

    def __call__(self, x: Any) -> Any:
        self._sum = None
        try:
            self.model.forward_features(x)
            return self.norm(self._sum / len(self.blocks))
        finally:
            self._sum = None

    @contextmanager
    def detached(self) -> Iterator[None]:
        """The model without the hooks (for timm's own ``forward_features``, the benchmark baseline)."""
        for handle in self._handles:
            handle.remove()
        try:
            yield
        finally:
            self._handles = self._attach()
