"""Any timm ViT-family model (one with ``blocks``: ViT, DeiT, DINOv2, CLIP ViT, EVA, BEiT...) as an encoder:
described from a ``meta``-device skeleton, weights from :mod:`~foal_pipe.encoders.weights`, features from
:mod:`~foal_pipe.encoders.fusion`. Torch and timm are imported inside functions only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from foal_pipe.encoders.base import Encoder
from foal_pipe.encoders.config import PAPER_MODEL, EncoderConfig
from foal_pipe.encoders.fusion import BlockFusion, final_norm, fusion_blocks, norm_kind, norm_parameters
from foal_pipe.encoders.resize import resize_on_device
from foal_pipe.encoders.runtime import autocast, require_extract_stack
from foal_pipe.encoders.weights import Architecture, describe_weights, load_model, pos_embed_resampling
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.store.blockfusion import parse_fusion


def _unknown_model_message(name: str) -> str:
    import difflib

    import timm

    close = difflib.get_close_matches(name.split(".")[0], ["pixels", *timm.list_models()], n=3, cutoff=0.6)
    if "pixels" in close:  # the built-in encoder, not a timm model that happens to look alike (mixnet_l)
        close = ["pixels"]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return (f"unknown model {name!r}{hint}; use a full timm tag like {PAPER_MODEL}, see "
            "timm.list_pretrained('vit_*'), or 'pixels'")


def _skeleton(arch: Architecture) -> Any:
    """The model on the ``meta`` device (no weights, no memory), or one clear error."""
    import torch

    try:
        with torch.device("meta"):
            return arch.create()
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        if "pretrained tag" in str(exc) or "Invalid" in str(exc):
            raise FoalPipeError(f"{arch.name}: {first}; see timm.list_pretrained('{arch.name.split('.')[0]}*') "
                                "for valid tags") from None
        raise FoalPipeError(f"cannot build timm model {arch.describe()} ({first}); check {param('model')}, "
                            f"{param('model_kwargs')} and {param('image_size')}") from None
    except (TypeError, AssertionError, ValueError) as exc:
        raise FoalPipeError(f"cannot build timm model {arch.describe()} ({exc}); check {param('model')}, "
                            f"{param('model_kwargs')} and {param('image_size')} (it must suit the patch size)") from None


def _check_patch_grid(skeleton: Any, size: int, config: EncoderConfig) -> None:
    """Refuse an input side that is no multiple of the patch size: the patch embedding's strided convolution would
    leave the last pixels of each row and column out, unseen (a model that pads its input, ``dynamic_img_pad``, sees
    them)."""
    import math

    from timm.layers import PatchEmbed

    embed = getattr(skeleton, "patch_embed", None)
    if not isinstance(embed, PatchEmbed) or embed.dynamic_img_pad:
        return
    step = math.lcm(*map(int, embed.patch_size))
    if size % step == 0:
        return
    lower, upper = size - size % step, size - size % step + step
    typed = config.image_size is not None or "img_size" not in dict(config.model_kwargs)
    option = (lambda v: param("image_size", v)) if typed else (lambda v: param("model_kwargs", f"img_size={v}"))
    sizes = " or ".join(option(v) for v in (lower, upper) if v)
    raise FoalPipeError(f"{option(size)} is not a multiple of the patch size {step} of {config.name}: the last {size % step} "
                        f"pixels of each row and column would never reach the model; use {sizes}")


class TimmEncoder(Encoder):
    """A timm ViT with feature fusion over its ``blocks``.

    ``name`` (what the store records) is the full tag when the weights are the tag's, and the architecture
    alone (with ``model_kwargs`` beside it) for a ``--checkpoint`` or random weights."""

    def __init__(self, config: EncoderConfig, native_size: int | None = None):
        require_extract_stack(param("model", config.name))
        import timm
        import torch

        self.config = config
        if not timm.is_model(config.name):
            raise FoalPipeError(_unknown_model_message(config.name))
        kwargs = dict(config.model_kwargs)
        if config.image_size is not None:
            kwargs["img_size"] = config.image_size
        self.arch = Architecture(config.name, tuple(sorted(kwargs.items())))
        skeleton = _skeleton(self.arch)
        blocks = getattr(skeleton, "blocks", None)
        if not isinstance(blocks, torch.nn.Sequential | torch.nn.ModuleList) or len(blocks) == 0:
            raise FoalPipeError(
                f"{config.name} ({type(skeleton).__name__}) has no transformer blocks (`blocks`), so feature "
                "fusion cannot apply; use a ViT family model (vit_*, deit_*, dinov2, CLIP ViT, eva*, beit*)"
            )
        fusion_blocks(config.fusion, len(blocks), config.name)  # blocks the model lacks: refused before any work
        has_cls = getattr(skeleton, "cls_token", None) is not None
        self.num_prefix = int(getattr(skeleton, "num_prefix_tokens", 1 if has_cls else 0))
        if config.token == "cls" and not has_cls:
            raise FoalPipeError(f"{config.name} has no CLS token; use {param('token', 'mean')} (mean of the patch tokens)")
        cfg = dict(skeleton.pretrained_cfg)
        self.arch.pretrained_cfg = cfg
        self.architecture = cfg.get("architecture") or config.name.split(".")[0]
        tagged = f"{self.architecture}.{cfg['tag']}" if cfg.get("tag") else self.architecture
        self.weights = describe_weights(config, cfg, tagged)
        if self.weights["source"] == "checkpoint":  # saved at another image size: recorded, resampled on loading
            plan = pos_embed_resampling(Path(self.weights["path"]), skeleton)
            if plan is not None:
                self.weights["pos_embed_resampled"] = plan
        self.name = tagged if self.weights["source"] in ("hf-hub", "url") else self.architecture
        data_cfg = timm.data.resolve_model_data_config(skeleton)
        built = getattr(getattr(skeleton, "patch_embed", None), "img_size", None)  # what the model was built for
        built = built[-1] if isinstance(built, tuple | list) else built
        self.image_size = int(config.image_size or built or data_cfg["input_size"][-1])
        _check_patch_grid(skeleton, self.image_size, config)
        self.mean, self.std = tuple(map(float, data_cfg["mean"])), tuple(map(float, data_cfg["std"]))
        self.interpolation = str(data_cfg.get("interpolation") or "bicubic")
        self.dim = int(skeleton.num_features)
        self.n_blocks = len(blocks)
        self.norm_kind = norm_kind(final_norm(skeleton))  # None: --keep-blocks cannot recompute the fusion
        self.model: Any = None
        self.fusion: BlockFusion | None = None

    def provenance(self) -> dict[str, Any]:
        import timm

        return {
            "name": self.name,
            "requested": self.config.name,
            "fusion": self.config.fusion,
            "token": self.config.token,
            **self._input_provenance(),
            "blocks": self.n_blocks,
            "final_norm": parse_fusion(self.config.fusion).norm_note,
            "weights": self.weights,
            "model_kwargs": dict(self.config.model_kwargs),
            "timm_version": timm.__version__,
            "precision": self.precision,
        }

    def load(self, device: str = "cpu", precision: str = "fp32") -> Encoder:
        super().load(device, precision)
        model = load_model(self.arch, self.weights, self.name).eval().requires_grad_(False).to(device)
        self.model = model
        self.fusion = BlockFusion(model, self.config.fusion, self.config.token, self.num_prefix, self.name)
        return self

    def preprocess(self, images: Any) -> Any:
        """uint8 ``(B, 3, h, w)`` (any device) -> float32 ``(B, 3, s, s)`` on the encoder's device: resized
        to ``s`` there when ``h, w`` differ (as PIL would), scaled to [0, 1] and normalised with
        ``mean``/``std`` when the config says so."""
        import torch

        x = images.to(self.device, non_blocking=True)
        size = self.image_size
        x = resize_on_device(x, size, self.interpolation) if tuple(x.shape[-2:]) != (size, size) else x.float()
        x.div_(255.0)
        if self.config.normalize:  # in place: a batch of 256 ViT-B inputs is 154 MB in float32
            x.sub_(torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1))
            x.div_(torch.tensor(self.std, device=x.device).view(1, -1, 1, 1))
        return x

    def _fusion(self) -> BlockFusion:
        if self.fusion is None:
            raise RuntimeError("call load() before encoding")
        return self.fusion

    def features(self, x: Any) -> Any:
        """Preprocessed float input -> fused float32 features ``(B, dim)`` on the device."""
        fusion = self._fusion()
        with autocast(self.device, self.precision):
            return fusion(x).float()

    def features_and_blocks(self, x: Any) -> tuple[Any, Any]:
        """Preprocessed float input -> fused float32 features ``(B, dim)`` and every block's chosen token, float32
        ``(B, n_blocks, dim)`` before any norm, from one forward pass."""
        fusion = self._fusion()
        with autocast(self.device, self.precision):
            fused, blocks = fusion.with_blocks(x)
            return fused.float(), blocks

    def plain_features(self, x: Any) -> Any:
        """timm's own ``forward_features`` CLS token (after the final norm), hooks bypassed: the baseline
        the fused forward is measured against."""
        fusion = self._fusion()
        with fusion.detached(), autocast(self.device, self.precision):
            return self.model.forward_features(x)[:, 0].float()

    def __call__(self, images: Any) -> Any:
        """uint8 torch images -> float32 torch features on the device."""
        import torch

        with torch.inference_mode():
            return self.features(self.preprocess(images))

    def encode(self, images: Any) -> np.ndarray:
        return self.submit(images)()

    def submit(self, images: Any) -> Callable[[], np.ndarray]:
        later = self._to_host(self(_as_tensor(images)))
        return lambda: later()[0]

    def encode_blocks(self, images: Any, blocks_dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
        """uint8 images -> ``(features (B, dim) float32, block tokens (B, n_blocks, dim) in blocks_dtype)``,
        NumPy, from one forward pass (``extract --keep-blocks``)."""
        return self.submit_blocks(images, blocks_dtype)()

    def submit_blocks(self, images: Any, blocks_dtype: str = "float32") -> Callable[[], tuple[np.ndarray, np.ndarray]]:
        """:meth:`encode_blocks` started as :meth:`submit` is. The tokens are cast on the device (rounded to nearest,
        as NumPy would), so a float16 copy moves half the bytes to the host."""
        import torch

        with torch.inference_mode():
            fused, blocks = self.features_and_blocks(self.preprocess(_as_tensor(images)))
            later = self._to_host(fused, blocks.to(getattr(torch, blocks_dtype)))

        def features_and_tokens() -> tuple[np.ndarray, np.ndarray]:
            host_fused, host_blocks = later()
            return host_fused, host_blocks

        return features_and_tokens

    def _to_host(self, *tensors: Any) -> Callable[[], tuple[np.ndarray, ...]]:
        """Copy ``tensors`` to the host; on CUDA into pinned memory behind the queued work, the returned function
        waiting for the copy (the values are those a synchronous ``.cpu()`` gives, bit for bit)."""
        import torch

        if self.device != "cuda":
            on_host = tuple(t.cpu().numpy() for t in tensors)
            return lambda: on_host
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in tensors)
        copied = torch.cuda.Event()
        copied.record()

        def arrays() -> tuple[np.ndarray, ...]:
            copied.synchronize()
            return tuple(h.numpy() for h in host)

        return arrays

    def norm_parameters(self) -> dict[str, Any]:
        """The final norm's kind, eps and float32 parameters (:func:`~foal_pipe.encoders.fusion.norm_parameters`)."""
        if self.model is None:
            raise RuntimeError("call load() before reading the norm")
        return norm_parameters(final_norm(self.model))


def _as_tensor(images: Any) -> Any:
    """A NumPy batch as a CPU torch tensor (sharing its memory); a tensor as it is."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
