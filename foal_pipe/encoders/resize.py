"""Where images are resized to the model's input size (``--resize-on``), and the resize that runs on the device.

``workers``: the DataLoader workers resize each image with PIL (:func:`foal_pipe.datasets.to_rgb_array`).
``device``: for a dataset whose images share one native size (digits, Fashion-MNIST, CIFAR-100, an HDF5 file
of squares...), the workers ship native-size uint8 batches (a 32 px CIFAR batch is 49 times smaller than at
224 px) and :func:`resize_on_device` resizes them where the encoder computes. It reproduces PIL's resampling
bit for bit -- the same two passes (horizontal, then vertical), PIL's fixed-point filter coefficients, its
rounding and its clipping to 0..255 after each pass -- as float64 matrix products, which are exact here
(integer pixels times 22-bit integer coefficients, sums far below 2**53) on any device and in any summation
order. So both places give the same pixels, hence the same features, and the choice is not part of a
store's settings: it changes speed, never bytes. Torch is imported inside functions only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from foal_pipe.encoders.runtime import torch_version
from foal_pipe.errors import FoalPipeError, param

RESIZE_ON = ("auto", "device", "workers")
PRECISION_BITS = 22
"""Fraction bits of PIL's fixed-point coefficients for 8-bit images (libImaging/Resample.c: 32 - 8 - 2)."""
SLICE = 64
"""Images resized at a time by :func:`resize_on_device`."""


def _bilinear(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _bicubic(x: float, a: float = -0.5) -> float:
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


FILTERS: dict[str, tuple[float, Callable[[float], float]]] = {"bilinear": (1.0, _bilinear), "bicubic": (2.0, _bicubic)}
"""PIL's filters the device resize reproduces: name -> (support, filter), as in libImaging/Resample.c."""


@functools.lru_cache(maxsize=32)
def pil_coefficients(in_size: int, out_size: int, interpolation: str) -> np.ndarray:
    """PIL's resampling of one axis from ``in_size`` to ``out_size`` pixels as an ``(out_size, in_size)``
    float64 matrix of its integer fixed-point coefficients (``precompute_coeffs`` then
    ``normalize_coeffs_8bpc``, computed in the same double-precision steps)."""
    support, kernel = FILTERS[interpolation]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support *= filterscale
    weights = np.zeros((out_size, in_size))
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = [kernel((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        ww = 0.0
        for w in k:  # PIL's plain left-to-right sum (Python's sum() compensates rounding since 3.12)
            ww += w
        k = [w / ww if ww != 0.0 else w for w in k]
        weights[xx, xmin : xmin + xmax] = [math.trunc(w * (1 << PRECISION_BITS) + (-0.5 if w < 0 else 0.5)) for w in k]
    return weights


def _pil_pass(x: Any, coefficients: np.ndarray, horizontal: bool) -> Any:
    """One PIL pass over float64 images ``x`` (whole grey levels) along their width or height: the
    fixed-point sum, rounded half up and clipped to 0..255 as PIL's ``clip8``."""
    import torch

    k = torch.as_tensor(coefficients, device=x.device)
    acc = torch.matmul(x, k.T) if horizontal else torch.matmul(k, x)
    return acc.add_(1 << (PRECISION_BITS - 1)).div_(1 << PRECISION_BITS).floor_().clamp_(0, 255)


def resize_on_device(images: Any, size: int, interpolation: str) -> Any:
    """uint8 images ``(B, C, h, w)`` (a torch tensor on any device) -> float32 ``(B, C, size, size)`` holding
    exactly the grey levels of PIL's ``Image.resize((size, size), interpolation)``, on the same device.

    Computed :data:`SLICE` images at a time, so the float64 work space stays small (a batch of 256 ViT inputs
    at 224 px would take 308 MB in float64)."""
    import torch

    h, w = int(images.shape[-2]), int(images.shape[-1])
    across = pil_coefficients(w, size, interpolation) if w != size else None
    down = pil_coefficients(h, size, interpolation) if h != size else None
    out = torch.empty((*images.shape[:-2], size, size), dtype=torch.float32, device=images.device)
    for lo in range(0, int(images.shape[0]), SLICE):
        x = images[lo : lo + SLICE].double()
        if across is not None:  # PIL's order: the horizontal pass first
            x = _pil_pass(x, across, horizontal=True)
        if down is not None:
            x = _pil_pass(x, down, horizontal=False)
        out[lo : lo + SLICE] = x
    return out


def device_resize_problem(native_size: int | None, interpolation: str) -> str | None:
    """Why the device cannot resize this dataset for this encoder, or ``None`` when it can."""
    if native_size is None:
        return ("needs a dataset whose images share one size (digits, fashion-mnist, cifar100, core50, "
                "tiny-imagenet, an hdf5 file whose splits share one square size), and this one has none")
    if interpolation not in FILTERS:
        return f"reproduces PIL's {' and '.join(FILTERS)} resampling only, not the model's {interpolation!r}"
    if torch_version() is None:
        return "needs torch, which is not installed: pip install -e '.[extract]' in the foal-pipe clone"
    return None


def resolve_resize_on(resize_on: str, native_size: int | None, image_size: int, interpolation: str,
                      device: str) -> str:
    """``device`` or ``workers``. ``auto``: the device when it is CUDA and can resize this dataset (the GPU
    then does the work and the workers move small native-size batches), else the workers. Images that already
    have the model's size are not resized anywhere (``workers``)."""
    if resize_on not in RESIZE_ON:
        raise FoalPipeError(f"unknown {param('resize_on')} {resize_on!r}; choose one of: {', '.join(RESIZE_ON)}")
    if resize_on == "workers" or native_size == image_size or (resize_on == "auto" and device != "cuda"):
        return "workers"
    problem = device_resize_problem(native_size, interpolation)
    if resize_on == "auto":
        return "workers" if problem else "device"
    if problem:
        raise FoalPipeError(f"{param('resize_on', 'device')} {problem}; use {param('resize_on', 'workers')} (or auto)")
    return "device"
