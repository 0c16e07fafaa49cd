"""The interface every encoder implements: uint8 images in, float32 features out, and its provenance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from foal_pipe.encoders.config import EncoderConfig


class Encoder:
    """A frozen encoder: uint8 images ``(B, 3, s, s)`` in, float32 features ``(B, dim)`` out.

    Images of another size (one size per batch: a dataset's native size under ``--resize-on device``) are
    first resized to ``s`` where the encoder computes, exactly as PIL would (:mod:`.resize`).

    An encoder is described cheaply first (no weights), so a store can be created and checked before any
    weights are fetched; :meth:`load` then loads the weights and moves them to a device.

    Attributes set by subclasses: ``name`` (what the store records as the encoder), ``dim``, ``image_size``,
    ``mean``/``std`` (per channel, applied when ``normalize``), ``interpolation`` (for the resize), ``config``;
    ``needs_torch`` (False for an encoder that computes in NumPy: then extraction never imports torch unless a
    ``--device cuda`` or ``--resize-on device`` asks for it).
    """

    name: str
    dim: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str
    config: EncoderConfig
    device: str = "cpu"
    precision: str = "fp32"
    needs_torch: bool = True

    def provenance(self) -> dict[str, Any]:
        """The store's ``encoder`` attribute."""
        raise NotImplementedError

    def load(self, device: str = "cpu", precision: str = "fp32") -> Encoder:
        """Load weights and move to ``device``; returns ``self``."""
        self.device, self.precision = device, precision
        return self

    def encode(self, images: Any) -> np.ndarray:
        """uint8 images ``(B, 3, h, w)`` (a NumPy array or a CPU torch tensor) -> float32 NumPy ``(B, dim)``."""
        raise NotImplementedError

    def submit(self, images: Any) -> Callable[[], np.ndarray]:
        """Start encoding ``images``; calling the result gives :meth:`encode`'s features. An encoder on an
        asynchronous device returns before its work is done, so extraction queues the next batch before it waits
        for this one and the device does not idle while the host checks and writes; here the work is done now."""
        features = self.encode(images)
        return lambda: features

    def _input_provenance(self) -> dict[str, Any]:
        """What every encoder records about its input: size, normalisation, resizing and output dim."""
        return {
            "image_size": self.image_size,
            "normalize": self.config.normalize,
            "mean": list(self.mean),
            "std": list(self.std),
            "interpolation": self.interpolation,
            "resize": "square",
            "dim": self.dim,
        }
