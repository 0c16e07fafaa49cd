"""Feature fusion over a timm ViT's ``blocks`` (docs/protocol.md section 1).

The chosen token (:data:`TOKENS`: CLS, or the mean of the patch tokens) of each chosen block's output (a
fusion spec, :func:`foal_pipe.store.blockfusion.parse_fusion`: every block, the last, blocks A..B, block K) -- the
residual stream, before any norm -- is averaged, and the model's final norm is applied once to that average.
It is computed in the single forward pass of timm's ``forward_features``: a forward hook on each block adds
its token to a running (B, d) float32 sum, so nothing larger than one (B, d) tensor is kept
(``forward_intermediates`` would keep every block's full (B, L, d) output alive; benchmarks/extract_bench.py
measures both). :meth:`BlockFusion.with_blocks` also returns every block's token (``extract --keep-blocks``),
from the same forward pass; :func:`norm_parameters` gives the final norm's kind, eps and parameters, so the
fusion can be recomputed from those tokens without the model (:mod:`foal_pipe.store.blockfusion`, which sums and
divides exactly as the hooks do). Torch is imported inside functions only.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.store.blockfusion import NORMS, parse_fusion

TOKENS: dict[str, Callable[[Any, int], Any]] = {
    "cls": lambda out, n_prefix: out[:, 0],
    "mean": lambda out, n_prefix: out[:, n_prefix:].mean(dim=1),  # register / distillation tokens excluded
}
"""Token choice: ``(block output (B, L, d), number of prefix tokens) -> (B, d)``."""

def final_norm(model: Any) -> Any:
    """The norm timm applies to the features: ``norm``, or ``fc_norm`` where ``norm`` is an identity
    (models with average pooling, e.g. EVA, BEiT)."""
    import torch

    norm = getattr(model, "norm", None)
    if norm is not None and not isinstance(norm, torch.nn.Identity):
        return norm
    fc_norm = getattr(model, "fc_norm", None)
    return fc_norm if fc_norm is not None else torch.nn.Identity()


def norm_kinds() -> dict[type, str]:
    """The norm classes whose computation :data:`foal_pipe.store.blockfusion.NORMS` repeats, by exact class (a
    subclass may compute something else)."""
    import timm.layers as layers
    import torch

    return {torch.nn.LayerNorm: "layernorm", layers.LayerNorm: "layernorm", layers.LayerNormFp32: "layernorm",
            torch.nn.RMSNorm: "rmsnorm", layers.RmsNorm: "rmsnorm", layers.RmsNormFp32: "rmsnorm",
            layers.SimpleNorm: "simplenorm", layers.SimpleNormFp32: "simplenorm", torch.nn.Identity: "identity"}


def norm_kind(norm: Any) -> str | None:
    """The :data:`~foal_pipe.store.blockfusion.NORMS` kind of a norm module, ``None`` when it is not one of them."""
    kind = norm_kinds().get(type(norm))
    shape = tuple(getattr(norm, "normalized_shape", ()) or ())
    return kind if kind == "identity" or len(shape) == 1 else None


def norm_parameters(norm: Any) -> dict[str, Any]:
    """``{"kind", "eps", <parameter name>: float32 (d,) array...}`` of a supported final norm (a parameter the
    module lacks, e.g. a LayerNorm without bias, is its neutral value: ones or zeros)."""
    import torch

    kind = norm_kind(norm)
    if kind is None:
        raise FoalPipeError(f"the final norm {type(norm).__name__} is not one foal-pipe can recompute "
                            f"({', '.join(NORMS)}); extract without {param('keep_blocks', True)}")
    if kind == "identity":
        return {"kind": kind, "eps": 0.0}
    (dim,) = norm.normalized_shape
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps  # torch.nn.RMSNorm's default
    out: dict[str, Any] = {"kind": kind, "eps": float(eps)}
    for name, neutral in zip(NORMS[kind][1], (np.ones, np.zeros)):
        value = getattr(norm, name, None)
        out[name] = neutral(dim, np.float32) if value is None else value.detach().float().cpu().numpy()
    return out


def fusion_blocks(fusion: str, n_blocks: int, name: str) -> range:
    """The 0-based blocks a fusion spec averages in a model of ``n_blocks`` blocks, or one clear error."""
    try:
        return parse_fusion(fusion).blocks(n_blocks)
    except FoalPipeError as exc:
        raise FoalPipeError(f"{name}: {exc.template}") from None


def _remove_hooks(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


class BlockFusion:
    """Fused features of ``model`` (a loaded timm ViT): ``fusion(x)`` runs ``forward_features`` once and returns
    the final norm of the average of the chosen blocks' tokens, float32 ``(B, d)``; ``fusion.with_blocks(x)``
    returns them with every block's token, float32 ``(B, L, d)``."""

    def __init__(self, model: Any, fusion: str, token: str, n_prefix: int, name: str):
        self.model, self.name, self.n_prefix = model, name, n_prefix
        self.chosen = fusion_blocks(fusion, len(model.blocks), name)
        self.pick = TOKENS[token]
        self.norm = final_norm(model)
        self._sum: Any = None
        self._kept: list[Any] | None = None
        self._handles: list[Any] = []
        self._attach()
        weakref.finalize(self, _remove_hooks, self._handles)  # a dropped fusion leaves the model as it was

    def _attach(self) -> None:
        self._handles.extend(block.register_forward_hook(self._hook(i)) for i, block in enumerate(self.model.blocks))

    def _hook(self, index: int) -> Callable[[Any, Any, Any], None]:
        """The hook of block ``index``. It holds this object weakly: a strong reference would make a cycle
        (model -> hook -> fusion -> model), and the model's weights would stay on the GPU after the encoder is
        dropped, until Python's cycle collector happens to run."""
        chosen = index in self.chosen
        ref = weakref.ref(self)

        def add(_module: Any, _inputs: Any, out: Any) -> None:
            import torch

            fusion = ref()
            if fusion is None or (not chosen and fusion._kept is None):
                return
            if not isinstance(out, torch.Tensor) or out.ndim != 3:
                raise FoalPipeError(f"{fusion.name}: a block returned {type(out).__name__}, not a (B, L, d) token "
                                    "tensor; this model family is not supported")
            token = fusion.pick(out, fusion.n_prefix).float()
            if chosen:
                fusion._sum = token if fusion._sum is None else fusion._sum + token
            if fusion._kept is not None:
                fusion._kept.append(token)

        return add

    def __call__(self, x: Any) -> Any:
        return self._forward(x, keep=False)[0]

    def with_blocks(self, x: Any) -> tuple[Any, Any]:
        """``(fused (B, d), every block's token (B, L, d))`` from one forward pass."""
        return self._forward(x, keep=True)

    def _forward(self, x: Any, keep: bool) -> tuple[Any, Any]:
        import torch

        kept: list[Any] | None = [] if keep else None  # the hooks append to this same list
        self._sum, self._kept = None, kept
        try:
            self.model.forward_features(x)
            fused = self.norm(self._sum / len(self.chosen))
            return fused, torch.stack(kept, dim=1) if kept is not None else None
        finally:
            self._sum, self._kept = None, None

    @contextmanager
    def detached(self) -> Iterator[None]:
        """The model without the hooks (for timm's own ``forward_features``, the benchmark baseline)."""
        _remove_hooks(self._handles)
        try:
            yield
        finally:
            self._attach()
