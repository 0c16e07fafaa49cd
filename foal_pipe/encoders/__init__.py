"""Frozen image encoders for ``foal-pipe extract``: a registry (:data:`ENCODERS`) of name -> factory.

``pixels`` is the identity encoder (resized, flattened pixels, NumPy only) for offline demos and tests; every
other name is a timm model (:class:`TimmEncoder`), which must be a ViT family with ``blocks``. One module per
concern: :mod:`.config` (what was asked, ``--model-kwargs``), :mod:`.runtime` (torch, device, precision),
:mod:`.weights` (strict loading of checkpoints and hub weights, their provenance), :mod:`.fusion` (the fused
block tokens), :mod:`.resize` (``--resize-on``: PIL's resize on the device), :mod:`.vit` and :mod:`.pixels`
(the encoders). Importing this package imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from foal_pipe.encoders.base import Encoder
from foal_pipe.encoders.config import PAPER_MODEL, EncoderConfig, format_model_kwargs, parse_model_kwargs
from foal_pipe.encoders.fusion import TOKENS
from foal_pipe.encoders.pixels import PixelsEncoder
from foal_pipe.encoders.resize import RESIZE_ON, resize_on_device, resolve_resize_on
from foal_pipe.encoders.runtime import DEVICES, PRECISIONS, resolve_device, resolve_precision, torch_version
from foal_pipe.encoders.vit import TimmEncoder
from foal_pipe.encoders.weights import CHECKPOINT_SUFFIXES

EncoderFactory = Callable[[EncoderConfig, "int | None"], Encoder]

ENCODERS: dict[str, EncoderFactory] = {"pixels": PixelsEncoder}
"""Encoders by name; any name not listed is looked up in timm (:class:`TimmEncoder`)."""


def build_encoder(config: EncoderConfig, native_size: int | None = None) -> Encoder:
    """Describe an encoder (no weights loaded yet); call :meth:`Encoder.load` to compute with it."""
    return ENCODERS.get(config.name, TimmEncoder)(config, native_size)


def encode_numpy(encoder: Encoder, images: np.ndarray) -> np.ndarray:
    """uint8 ``(B, 3, s, s)`` NumPy images -> float32 NumPy features (:meth:`Encoder.encode`)."""
    return encoder.encode(images)


__all__ = [
    "CHECKPOINT_SUFFIXES",
    "DEVICES",
    "ENCODERS",
    "PAPER_MODEL",
    "PRECISIONS",
    "RESIZE_ON",
    "TOKENS",
    "Encoder",
    "EncoderConfig",
    "PixelsEncoder",
    "TimmEncoder",
    "build_encoder",
    "encode_numpy",
    "format_model_kwargs",
    "parse_model_kwargs",
    "resolve_device",
    "resolve_precision",
    "resolve_resize_on",
    "resize_on_device",
    "torch_version",
]
