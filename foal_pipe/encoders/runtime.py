"""Where and how an encoder computes: the optional torch stack, the device and the autocast precision.

Torch, torchvision and timm come with ``pip install -e '.[extract]'``; the learner and ``--model pixels``
run without them, so they are imported inside functions only and their absence is one clear error.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from foal_pipe.errors import FoalPipeError, param

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
EXTRACT_STACK = ("torch", "torchvision", "timm")
INSTALL_EXTRACT = "pip install -e '.[extract]' in the foal-pipe clone"


def require_extract_stack(what: str) -> None:
    """Raise one line naming the install command when a module of :data:`EXTRACT_STACK` is not importable."""
    missing = []
    for module in EXTRACT_STACK:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise FoalPipeError(f"{what} needs torch, torchvision and timm (not installed: {', '.join(missing)}); run "
                            f"{INSTALL_EXTRACT}, or use {param('model', 'pixels')} (which needs none of them)")


def _torch() -> Any:
    """The torch module, or ``None`` without it."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_version() -> str | None:
    """torch's version, ``None`` when it is not installed (``--model pixels`` on a light install)."""
    torch = _torch()
    return None if torch is None else str(torch.__version__)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; asking for CUDA without it is an error."""
    if device not in DEVICES:
        raise FoalPipeError(f"unknown {param('device')} {device!r}; choose one of: {', '.join(DEVICES)}")
    torch = _torch()
    cuda = torch is not None and torch.cuda.is_available()
    if device == "auto":
        return "cuda" if cuda else "cpu"
    if device == "cuda" and torch is None:
        raise FoalPipeError(f"{param('device', 'cuda')} needs torch, which is not installed; run {INSTALL_EXTRACT} (with "
                            f"a CUDA build of torch) or use {param('device', 'cpu')}")
    if device == "cuda" and not cuda:
        raise FoalPipeError(f"{param('device', 'cuda')} but CUDA is not available to torch {torch.__version__}; use "
                            f"{param('device', 'cpu')}")
    return device


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` -> ``bf16`` on CUDA, ``fp32`` on CPU."""
    if precision not in PRECISIONS:
        raise FoalPipeError(f"unknown {param('precision')} {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if device == "cuda" else "fp32"
    return precision


def autocast(device: str, precision: str) -> Any:
    """torch autocast to ``precision`` on ``device``; for fp32, a context that computes in fp32 (:func:`without_tf32`
    on CUDA, nothing on the CPU)."""
    import torch

    if precision == "fp32":
        return without_tf32() if device == "cuda" else nullcontext()
    return torch.autocast(device_type=device, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision])


@contextmanager
def without_tf32() -> Iterator[None]:
    """fp32 on CUDA computed in fp32 while the model runs: torch lets cuDNN's convolutions (a ViT's patch embedding) run
    in TF32 by default, and a caller may have turned TF32 on for matrix products, both rounding inputs to 10 bits.
    Both are off inside, and as the caller had them after (bf16 and fp16 autocast use no TF32)."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
