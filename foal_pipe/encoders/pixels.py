"""``--model pixels``: the identity encoder, in NumPy (no torch), for offline demos and tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from foal_pipe.encoders.base import Encoder
from foal_pipe.encoders.config import EncoderConfig
from foal_pipe.encoders.resize import resize_on_device
from foal_pipe.errors import FoalPipeError, param


class PixelsEncoder(Encoder):
    """The resized RGB image, flattened (``dim = 3 * s * s``); normalised to [-1, 1] by mean = std = 0.5
    unless ``--no-normalize`` (then [0, 1]). Computes on the host in float32 whatever the device; only a resize
    of native-size images (``--resize-on device``) runs on the device, with torch."""

    needs_torch = False

    def __init__(self, config: EncoderConfig, native_size: int | None = None):
        for option, value in ((param("checkpoint"), config.checkpoint), (param("model_kwargs"), config.model_kwargs)):
            if value:
                raise FoalPipeError(f"{param('model', 'pixels')} has no weights or architecture, so {option} does not "
                                    f"apply; drop {option} or choose a timm {param('model')}")
        for name in ("fusion", "token"):  # their defaults pass: a pipeline may name them whatever the model
            if getattr(config, name) != getattr(EncoderConfig, name):
                raise FoalPipeError(f"{param('model', 'pixels')} has no transformer blocks or tokens, so "
                                    f"{param(name, getattr(config, name))} does not apply; drop {param(name)} or choose a "
                                    f"timm ViT {param('model')}")
        self.config = config
        self.name = "pixels"
        self.image_size = config.image_size or native_size or 32
        self.dim = 3 * self.image_size**2
        self.mean = self.std = (0.5, 0.5, 0.5)
        self.interpolation = "bilinear"

    def provenance(self) -> dict[str, Any]:
        return {
            "name": "pixels",
            "fusion": "none",
            "token": "none",
            **self._input_provenance(),
            "weights": {"source": "none"},
            "precision": "fp32",
        }

    def load(self, device: str = "cpu", precision: str = "fp32") -> Encoder:
        return super().load(device, "fp32")  # nothing to compute in reduced precision

    def encode(self, images: Any) -> np.ndarray:
        size = self.image_size
        if tuple(images.shape[-2:]) == (size, size):
            x = np.asarray(images).astype(np.float32)
        else:  # native-size images (--resize-on device): resized where the encoder computes, as PIL would
            x = self._resized(images)
        x /= np.float32(255.0)
        if self.config.normalize:
            x -= np.asarray(self.mean, np.float32).reshape(1, -1, 1, 1)
            x /= np.asarray(self.std, np.float32).reshape(1, -1, 1, 1)
        return x.reshape(x.shape[0], -1)

    def _resized(self, images: Any) -> np.ndarray:
        import torch

        x = torch.as_tensor(images).to(self.device)
        return resize_on_device(x, self.image_size, self.interpolation).cpu().numpy()
