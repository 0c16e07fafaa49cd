"""What the user asks of an encoder (:class:`EncoderConfig`), and ``--model-kwargs`` text made into typed values."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from foal_pipe.encoders.fusion import TOKENS
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.store.blockfusion import parse_fusion

PAPER_MODEL = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
RESERVED_KWARGS = ("num_classes", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path",
                   "features_only")
"""timm.create_model arguments foal-pipe sets itself: the head is always dropped, the weights come from
``--checkpoint`` or the tag."""

ModelKwargs = tuple[tuple[str, Any], ...]

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_BOOLS = {"true": True, "false": False}


def _typed(text: str) -> Any:
    """``"2"`` -> 2, ``"0.1"``/``"1e-6"`` -> float, ``"true"``/``"false"`` -> bool, anything else -> str."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return _BOOLS.get(text.lower(), text)


def parse_model_kwargs(text: str | None) -> ModelKwargs:
    """``"depth=2,patch_size=4"`` -> ``(("depth", 2), ("patch_size", 4))``, sorted by name so that the order
    the user wrote them in does not change the settings; empty text -> ``()``."""
    if not text or not text.strip():
        return ()
    items: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise FoalPipeError(f"{param('model_kwargs')} item {item.strip()!r} is not NAME=VALUE; write e.g. "
                                f"{param('model_kwargs', 'depth=2,patch_size=4,img_size=32')}")
        if key in items:
            raise FoalPipeError(f"{param('model_kwargs')} gives {key} twice; give each argument once")
        items[key] = _typed(value)
    return tuple(sorted(items.items()))


def format_model_kwargs(kwargs: ModelKwargs) -> str:
    """The inverse of :func:`parse_model_kwargs`, for messages (``depth=2,patch_size=4``)."""
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in kwargs)


def _check_model_kwargs(kwargs: ModelKwargs) -> None:
    for key, value in kwargs:
        if not str(key).isidentifier():
            raise FoalPipeError(f"{param('model_kwargs')} name {key!r} is not an argument name; write NAME=VALUE, e.g. "
                                "depth=2")
        if key in RESERVED_KWARGS:
            raise FoalPipeError(f"{param('model_kwargs')} {key} is set by foal-pipe itself; drop it (the classifier head is "
                                f"always removed, weights come from the tag or {param('checkpoint')})")
        if not isinstance(value, bool | int | float | str):
            raise FoalPipeError(f"{param('model_kwargs')} {key} has a {type(value).__name__} value; use an int, float, "
                                "bool or str")


@dataclass(frozen=True)
class EncoderConfig:
    """What the user asked for. ``image_size=None`` means the model's own input size (pixels: the dataset's
    native size, else 32). ``pretrained=False`` (Python API only) gives seeded random weights, for benchmarks.
    ``model_kwargs`` are passed to ``timm.create_model`` (``--model-kwargs``), e.g. a tiny test ViT's depth."""

    name: str = PAPER_MODEL
    fusion: str = "mean-cls"
    token: str = "cls"
    image_size: int | None = None
    normalize: bool = True
    checkpoint: str | None = None
    pretrained: bool = True
    model_kwargs: ModelKwargs = ()

    def __post_init__(self) -> None:
        fusion = parse_fusion(self.fusion, param("fusion"))
        if fusion.concat:  # a store's features have the encoder's width; concat's rows are k times wider
            raise FoalPipeError(f"{param('fusion', fusion.text)} sets blocks side by side, which is fused when reading a "
                                f"blocks store, not when extracting: extract with {param('keep_blocks', True)}, then "
                                f"learn or sweep with {param('fusion', fusion.text)}")
        object.__setattr__(self, "fusion", fusion.text)  # the canonical spec
        if self.token not in TOKENS:
            raise FoalPipeError(f"unknown {param('token')} {self.token!r}; choose one of: {', '.join(TOKENS)}")
        if self.image_size is not None and self.image_size < 1:
            raise FoalPipeError(f"{param('image_size')} must be a positive number of pixels, got {self.image_size}")
        _check_model_kwargs(self.model_kwargs)
        img_size = dict(self.model_kwargs).get("img_size")
        if self.image_size is not None and img_size is not None and img_size != self.image_size:
            raise FoalPipeError(f"{param('image_size', self.image_size)} and {param('model_kwargs', f'img_size={img_size}')} "
                                "disagree; "
                                "give the input size once")
