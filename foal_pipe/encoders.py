"""Frozen image encoders for ``foal-pipe extract``: a registry (:data:`ENCODERS`) of name -> factory.

``pixels`` is the identity encoder (resized, flattened pixels) for offline demos and tests; every other name
is a timm model (``TimmEncoder``), which must be a ViT family with ``blocks`` (ViT, DeiT, DINOv2, CLIP ViT,
EVA, BEiT...). Feature fusion follows docs/protocol.md section 1: the chosen token (CLS, or the mean of the patch
tokens) of every block's output -- the residual stream, before any norm -- is averaged over the blocks, and
the model's final norm is applied once to that average. It is computed in the same single forward pass as
timm's ``forward_features``: a forward hook on each block adds its token to a running (B, d) float32 sum, so
nothing larger than one (B, d) tensor is kept (``forward_intermediates`` would keep every block's full
(B, L, d) output alive; benchmarks/extract_bench.py measures both).

An encoder is described cheaply first (the model is built on the ``meta`` device: no weights, no memory),
so a store can be created and checked before any weights are fetched; :meth:`Encoder.load` then loads the
weights and moves the model to a device. Torch and timm are imported inside functions only.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from foal_pipe.errors import FoalPipeError

FUSIONS = ("mean-cls", "last")
TOKENS = ("cls", "mean")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
PAPER_MODEL = "vit_base_patch16_224.augreg2_in21k_ft_in1k"


@dataclass(frozen=True)
class EncoderConfig:
    """What the user asked for. ``image_size=None`` means the model's own input size (pixels: the dataset's
    native size, else 32). ``pretrained=False`` (Python API only) gives seeded random weights, for benchmarks.
    ``model_kwargs`` (Python API only) are passed to ``timm.create_model``, e.g. a tiny test ViT's depth."""

    name: str = PAPER_MODEL
    fusion: str = "mean-cls"
    token: str = "cls"
    image_size: int | None = None
    normalize: bool = True
    checkpoint: str | None = None
    pretrained: bool = True
    model_kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise FoalPipeError(f"unknown --fusion {self.fusion!r}; choose one of: {', '.join(FUSIONS)}")
        if self.token not in TOKENS:
            raise FoalPipeError(f"unknown --token {self.token!r}; choose one of: {', '.join(TOKENS)}")
        if self.image_size is not None and self.image_size < 1:
            raise FoalPipeError(f"--image-size must be a positive number of pixels, got {self.image_size}")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; asking for CUDA without it is an error."""
    import torch

    if device not in DEVICES:
        raise FoalPipeError(f"unknown --device {device!r}; choose one of: {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise FoalPipeError(f"--device cuda but CUDA is not available to torch {torch.__version__}; use --device cpu")
    return device


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` -> ``bf16`` on CUDA, ``fp32`` on CPU."""
    if precision not in PRECISIONS:
        raise FoalPipeError(f"unknown --precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if device == "cuda" else "fp32"
    return precision


def _autocast(device: str, precision: str) -> Any:
    import torch

    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision])


class Encoder:
    """A frozen encoder: uint8 images ``(B, 3, s, s)`` in, float32 features ``(B, dim)`` out.

    Attributes set by subclasses: ``name`` (full tag), ``dim``, ``image_size``, ``mean``/``std`` (per channel,
    applied when ``normalize``), ``interpolation`` (for the resize), ``config``.
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

    def provenance(self) -> dict[str, Any]:
        """The store's ``encoder`` attribute."""
        raise NotImplementedError

    def load(self, device: str = "cpu", precision: str = "fp32") -> Encoder:
        """Load weights and move to ``device``; returns ``self``."""
        self.device, self.precision = device, precision
        return self

    def preprocess(self, images: Any) -> Any:
        """uint8 ``(B, 3, s, s)`` (any device) -> float32 on the encoder's device, scaled to [0, 1] and
        normalised with ``mean``/``std`` when the config says so."""
        import torch

        x = images.to(self.device, non_blocking=True).float().div_(255.0)
        if self.config.normalize:  # in place: a batch of 256 ViT-B inputs is 154 MB in float32
            x.sub_(torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1))
            x.div_(torch.tensor(self.std, device=x.device).view(1, -1, 1, 1))
        return x

    def features(self, x: Any) -> Any:
        """Preprocessed float input -> float32 features ``(B, dim)`` on the device."""
        raise NotImplementedError

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

    def __call__(self, images: Any) -> Any:
        import torch

        with torch.inference_mode():
            return self.features(self.preprocess(images))


class PixelsEncoder(Encoder):
    """Identity encoder: the resized RGB image, flattened (``dim = 3 * s * s``); normalised to [-1, 1] by
    mean = std = 0.5 unless ``--no-normalize`` (then [0, 1])."""

    def __init__(self, config: EncoderConfig, native_size: int | None = None):
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

    def features(self, x: Any) -> Any:
        return x.reshape(x.shape[0], -1).float()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the URL's host opens within ``timeout`` seconds (DNS included)."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port or (443 if parsed.scheme != "http" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextmanager
def _hf_offline() -> Any:
    """Make huggingface_hub answer from its cache only, without its retry loop."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def _final_norm(model: Any) -> Any:
    """The norm timm applies to the features: ``norm``, or ``fc_norm`` where ``norm`` is an identity
    (models with average pooling, e.g. EVA, BEiT)."""
    import torch

    norm = getattr(model, "norm", None)
    if norm is not None and not isinstance(norm, torch.nn.Identity):
        return norm
    fc_norm = getattr(model, "fc_norm", None)
    return fc_norm if fc_norm is not None else torch.nn.Identity()


class TimmEncoder(Encoder):
    """A timm ViT with feature fusion over its ``blocks`` (see the module docstring)."""

    def __init__(self, config: EncoderConfig, native_size: int | None = None):
        import timm
        import torch

        self.config = config
        if not timm.is_model(config.name):
            raise FoalPipeError(self._unknown_model_message(config.name))
        self._kwargs: dict[str, Any] = {"num_classes": 0, **dict(config.model_kwargs)}
        if config.image_size is not None:
            self._kwargs["img_size"] = config.image_size
        try:
            with torch.device("meta"):
                skeleton = timm.create_model(config.name, pretrained=False, **self._kwargs)
        except RuntimeError as exc:
            if "pretrained tag" in str(exc) or "Invalid" in str(exc):
                raise FoalPipeError(f"{config.name}: {str(exc).splitlines()[0]}; see timm.list_pretrained("
                                    f"'{config.name.split('.')[0]}*') for valid tags") from None
            raise FoalPipeError(f"cannot build timm model {config.name} ({str(exc).splitlines()[0]}); "
                                "check --model and --image-size") from None
        except (TypeError, AssertionError, ValueError) as exc:
            raise FoalPipeError(f"cannot build timm model {config.name} ({exc}); check --model and "
                                "--image-size (it must suit the patch size)") from None
        blocks = getattr(skeleton, "blocks", None)
        if not isinstance(blocks, torch.nn.Sequential | torch.nn.ModuleList) or len(blocks) == 0:
            raise FoalPipeError(
                f"{config.name} ({type(skeleton).__name__}) has no transformer blocks (`blocks`), so feature "
                "fusion cannot apply; use a ViT family model (vit_*, deit_*, dinov2, CLIP ViT, eva*, beit*)"
            )
        self.num_prefix = int(getattr(skeleton, "num_prefix_tokens", 1 if getattr(skeleton, "cls_token", None) is
                                      not None else 0))
        if config.token == "cls" and getattr(skeleton, "cls_token", None) is None:
            raise FoalPipeError(f"{config.name} has no CLS token; use --token mean (mean of the patch tokens)")
        cfg = skeleton.pretrained_cfg
        self.architecture = cfg.get("architecture") or config.name.split(".")[0]
        self.tag = cfg.get("tag") or ""
        self.name = f"{self.architecture}.{self.tag}" if self.tag else self.architecture
        data_cfg = timm.data.resolve_model_data_config(skeleton)
        built = getattr(getattr(skeleton, "patch_embed", None), "img_size", None)  # what the model was built for
        built = built[-1] if isinstance(built, tuple | list) else built
        self.image_size = int(config.image_size or built or data_cfg["input_size"][-1])
        self.mean, self.std = tuple(map(float, data_cfg["mean"])), tuple(map(float, data_cfg["std"]))
        self.interpolation = str(data_cfg.get("interpolation") or "bicubic")
        self.dim = int(skeleton.num_features)
        self.n_blocks = len(blocks)
        self.hf_hub_id = cfg.get("hf_hub_id")
        self.url = cfg.get("url")
        self.model: Any = None
        self.weights = self._weights_provenance()
        del skeleton

    @staticmethod
    def _unknown_model_message(name: str) -> str:
        import difflib

        import timm

        close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return (f"unknown model {name!r}{hint}; use a full timm tag like {PAPER_MODEL}, see "
                "timm.list_pretrained('vit_*'), or 'pixels'")

    def _weights_provenance(self) -> dict[str, Any]:
        if self.config.checkpoint:
            path = Path(self.config.checkpoint).expanduser()
            if not path.is_file():
                raise FoalPipeError(f"--checkpoint {path} does not exist; pass a .safetensors or .pth state dict")
            if path.suffix.lower() not in CHECKPOINT_SUFFIXES:
                raise FoalPipeError(f"--checkpoint {path} has suffix {path.suffix!r}; expected one of "
                                    f"{', '.join(CHECKPOINT_SUFFIXES)} (a state dict)")
            return {"source": "checkpoint", "path": str(path.resolve()), "bytes": path.stat().st_size,
                    "sha256": _sha256(path)}
        if not self.config.pretrained:
            return {"source": "random", "seed": 0}
        if self.hf_hub_id:
            return {"source": "hf-hub", "id": str(self.hf_hub_id)}
        if self.url:
            return {"source": "url", "url": str(self.url)}
        raise FoalPipeError(f"timm has no pretrained weights for {self.name}; pass --checkpoint FILE or choose "
                            "a tag from timm.list_pretrained()")

    def provenance(self) -> dict[str, Any]:
        import timm

        return {
            "name": self.name,
            "requested": self.config.name,
            "fusion": self.config.fusion,
            "token": self.config.token,
            **self._input_provenance(),
            "blocks": self.n_blocks,
            "final_norm": "applied once to the block average",
            "weights": self.weights,
            "model_kwargs": {k: v for k, v in self.config.model_kwargs},
            "timm_version": timm.__version__,
            "precision": self.precision,
        }

    # -- loading --------------------------------------------------------------------------------------------
    def _offline_message(self, why: str) -> str:
        from huggingface_hub import constants

        return (
            f"no weights for {self.name}: {why}; pass --checkpoint FILE (a local .safetensors or .pth state "
            f"dict), or fetch the weights into the Hugging Face cache ({constants.HF_HUB_CACHE}) on a machine "
            "with network and run with HF_HUB_OFFLINE=1"
        )

    def _create(self) -> Any:
        import timm
        import torch

        kwargs = dict(self._kwargs)
        source = self.weights["source"]
        if source == "random":
            torch.manual_seed(int(self.weights["seed"]))
            return timm.create_model(self.config.name, pretrained=False, **kwargs)
        if source == "checkpoint":
            kwargs["pretrained_cfg_overlay"] = {"file": self.weights["path"]}
            try:
                return timm.create_model(self.config.name, pretrained=True, **kwargs)
            except Exception as exc:
                text = str(exc).strip()
                first = text.splitlines()[0][:300] if text else type(exc).__name__
                if any(k in text for k in ("weights_only", "pickle", "deserializ", "header", "magic number")):
                    raise FoalPipeError(
                        f"cannot read --checkpoint {self.weights['path']} as a state dict ({first}); save it with "
                        "safetensors or torch.save(model.state_dict())"
                    ) from None
                raise FoalPipeError(
                    f"--checkpoint {self.weights['path']} does not fit {self.name} ({first}); pass the --model "
                    "(and --image-size) it was saved from"
                ) from None
        from huggingface_hub import constants

        offline = constants.HF_HUB_OFFLINE
        endpoint = constants.ENDPOINT if source == "hf-hub" else str(self.weights.get("url"))
        guard = nullcontext()
        if not offline and not _reachable(endpoint):
            offline, guard = True, _hf_offline()  # answer from the cache, at once
        try:
            with guard:
                return timm.create_model(self.config.name, pretrained=True, **kwargs)
        except Exception as exc:
            if offline:
                why = ("not in the Hugging Face cache and HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
                       or os.environ.get("HF_HUB_OFFLINE") else
                       f"not in the Hugging Face cache and {urlparse(endpoint).hostname} is unreachable")
                raise FoalPipeError(self._offline_message(why)) from None
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise FoalPipeError(self._offline_message(f"download failed ({first})")) from None

    def load(self, device: str = "cpu", precision: str = "fp32") -> Encoder:
        import torch

        super().load(device, precision)
        model = self._create().eval().requires_grad_(False).to(device)
        self.model = model
        self._norm = _final_norm(model)
        self._state: dict[str, Any] = {"sum": None}
        taken = list(model.blocks) if self.config.fusion == "mean-cls" else [model.blocks[-1]]
        self._n_taken = len(taken)
        npt, use_cls = self.num_prefix, self.config.token == "cls"

        def hook(_module: Any, _inputs: Any, out: Any) -> None:
            if not isinstance(out, torch.Tensor) or out.ndim != 3:
                raise FoalPipeError(f"{self.name}: a block returned {type(out).__name__}, not a (B, L, d) token "
                                    "tensor; this model family is not supported")
            token = out[:, 0] if use_cls else out[:, npt:].mean(dim=1)
            token = token.float()
            self._state["sum"] = token if self._state["sum"] is None else self._state["sum"] + token

        self._hook_fn, self._taken = hook, taken
        self._hooks = [blk.register_forward_hook(hook) for blk in taken]
        return self

    def features(self, x: Any) -> Any:
        if self.model is None:
            raise RuntimeError("call load() before encoding")
        self._state["sum"] = None
        with _autocast(self.device, self.precision):
            self.model.forward_features(x)
            fused = self._state["sum"] / self._n_taken
            out = self._norm(fused)
        self._state["sum"] = None
        return out.float()

    def plain_features(self, x: Any) -> Any:
        """timm's own ``forward_features`` CLS token (after the final norm), hooks bypassed: the baseline
        the fused forward is measured against."""
        for handle in self._hooks:
            handle.remove()
        try:
            with _autocast(self.device, self.precision):
                out = self.model.forward_features(x)[:, 0]
        finally:
            self._hooks = [blk.register_forward_hook(self._hook_fn) for blk in self._taken]
        return out.float()


EncoderFactory = Callable[[EncoderConfig, "int | None"], Encoder]

ENCODERS: dict[str, EncoderFactory] = {"pixels": PixelsEncoder}
"""Encoders by name; any name not listed is looked up in timm (:class:`TimmEncoder`)."""


def build_encoder(config: EncoderConfig, native_size: int | None = None) -> Encoder:
    """Describe an encoder (no weights loaded yet); call :meth:`Encoder.load` to compute with it."""
    factory = ENCODERS.get(config.name, TimmEncoder)
    return factory(config, native_size)


def encode_numpy(encoder: Encoder, images: np.ndarray) -> np.ndarray:
    """Convenience for tests and notebooks: uint8 ``(B, 3, s, s)`` numpy -> float32 numpy features."""
    import torch

    return encoder(torch.from_numpy(np.ascontiguousarray(images))).cpu().numpy()


__all__ = [
    "ENCODERS",
    "Encoder",
    "EncoderConfig",
    "PixelsEncoder",
    "TimmEncoder",
    "build_encoder",
    "encode_numpy",
    "resolve_device",
    "resolve_precision",
]
