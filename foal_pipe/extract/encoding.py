"""Images to features outside ``extract``: the encoder a model was trained with, rebuilt from its provenance.

``predict --images`` and :meth:`~foal_pipe.model.deploy.DeployedModel.predict_images` use it. Images are prepared
exactly as ``extract`` prepares a folder's files (:func:`~foal_pipe.datasets.to_rgb_array` with the encoder's
size and interpolation) and encoded in the store's recorded precision, so the features equal those of a store
extracted from the same files (on the same kind of device). A model learned from a fusion computed when reading a
blocks store (``learn --fusion``, ``--no-fusion-norm`` included) encodes every block's float32 token and fuses them
with that store's own NumPy code (:func:`~foal_pipe.store.blockfusion.fuse`), so its features are the fused rows of a
float32 ``--keep-blocks`` store of the same files.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from foal_pipe.core.backend import host_values
from foal_pipe.datasets.sources import IMAGE_EXTENSIONS, _is_image_entry, broken_link, images_in, open_image, to_rgb_array
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.store.blockfusion import FinalNorm, Fusion, fuse, fused_encoder, parse_fusion, read_time_fusion

if TYPE_CHECKING:
    from foal_pipe.encoders import Encoder, TimmEncoder

#: Provenance keys that decide the features an encoder computes (not where it ran or which library built it).
ENCODER_KEYS = ("name", "fusion", "token", "image_size", "normalize", "mean", "std", "interpolation", "resize", "dim",
                "model_kwargs", "blocks")
#: Images encoded at once by default.
BATCH_SIZE = 64


def first_difference(ours: dict[str, Any], theirs: dict[str, Any], keys: Sequence[str] | None = None) -> str | None:
    """The first key (sorted, or of ``keys``) whose value differs between two provenance mappings, or None."""
    for key in keys if keys is not None else sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            return key
    return None


def build_recorded_encoder(spec: dict[str, Any] | None, checkpoint: str | Path | None = None,
                           device: str = "cpu") -> Any:
    """The encoder that ``spec`` (a store's or a model's ``encoder`` provenance) describes, loaded on ``device``.

    A checkpoint-based encoder needs ``checkpoint``, and its sha256 must equal the recorded one; any
    difference in what decides the features (``ENCODER_KEYS``, and whether the final norm was applied) is refused,
    naming the first key. A fusion computed when reading a blocks store is computed as it was (:class:`BlocksFused`).
    """
    from foal_pipe.encoders import DEVICES, EncoderConfig, build_encoder, resolve_device

    if device not in DEVICES:  # checked first: an encoder that ignores the device must not accept any name
        raise FoalPipeError(f"unknown {param('device')} {device!r}; choose one of: {', '.join(DEVICES)}")
    if not spec:
        raise FoalPipeError("the model records no encoder provenance, so it cannot encode images; extract a store "
                            f"with `foal-pipe extract` and pass {param('features')}")
    if "weights" not in spec:  # every encoder `extract` runs records its weights; other writers' stores do not
        raise FoalPipeError(f"the model's features come from encoder {spec.get('name')!r}, which foal-pipe did not "
                            "extract (no weights recorded), so it cannot encode images; predict with "
                            f"{param('features')} a store of those features")
    weights = spec.get("weights") or {}
    source = weights.get("source", "none")
    if source == "checkpoint" and checkpoint is None:
        raise FoalPipeError(f"the model's encoder {spec.get('name')} was loaded from a checkpoint (sha256 "
                            f"{str(weights.get('sha256'))[:12]}...); pass {param('checkpoint', 'FILE')} with those weights")
    if source != "checkpoint" and checkpoint is not None:
        held = "no weights" if source == "none" else f"{source} weights"  # pixels: none to load
        raise FoalPipeError(f"the model's encoder {spec.get('name')} has {held}, not a checkpoint's; "
                            f"drop {param('checkpoint')}")
    read_time = read_time_fusion(spec)  # fused from stored blocks: the encoder gives every block's token
    config = dict(name=spec.get("requested") or spec["name"], fusion="last" if read_time else spec.get("fusion", "mean-cls"),
                  token=spec.get("token", "cls"), normalize=bool(spec.get("normalize", True)),
                  checkpoint=str(checkpoint) if checkpoint is not None else None, pretrained=source != "random",
                  model_kwargs=tuple(sorted((spec.get("model_kwargs") or {}).items())))
    if config["name"] == "pixels":
        config.update(fusion="mean-cls", token="cls")
    encoder = build_encoder(EncoderConfig(**config))
    if encoder.image_size != spec.get("image_size"):
        encoder = build_encoder(EncoderConfig(**config, image_size=spec.get("image_size")))
    ours = encoder.provenance()
    fused = _with_blocks(encoder, read_time["fusion"]) if read_time else None
    if fused is not None:
        ours = fused_encoder(ours, fused[1], read_time["fusion_norm"], spec["blocks_dtype"])
    if source == "checkpoint" and ours["weights"].get("sha256") != weights.get("sha256"):
        raise FoalPipeError(f"{param('checkpoint')} {checkpoint} has sha256 {ours['weights'].get('sha256', '')[:12]}... but the "
                            f"model's encoder was trained with {str(weights.get('sha256'))[:12]}...; pass the "
                            "checkpoint the model's store was extracted with")
    key = first_difference(spec, ours, [k for k in ENCODER_KEYS if k in spec])
    if key is None and "final_norm" in spec and _norm_applied(spec) != _norm_applied(ours):  # its wording varies by version
        key = "final_norm"
    if key is not None:
        raise FoalPipeError(f"the rebuilt encoder differs from the model's: {key!r} is {ours.get(key)!r} but the model "
                            f"records {spec.get(key)!r}; use the foal-pipe/timm versions the model was trained with")
    where = "cpu" if device == "auto" and not encoder.needs_torch else resolve_device(device)
    loaded = encoder.load(where, recorded_precision(spec, where))
    return loaded if fused is None else BlocksFused(*fused, norm=read_time["fusion_norm"])


def _with_blocks(encoder: Encoder, spec: str) -> tuple[TimmEncoder, Fusion]:
    """The encoder (one with blocks) and the fusion a model learned from its stored block tokens."""
    from foal_pipe.encoders import TimmEncoder

    if not isinstance(encoder, TimmEncoder):  # pixels: no blocks, so no store of its blocks to have learned from
        raise FoalPipeError(f"the model's features fuse block tokens (fusion {spec}) but encoder {encoder.name} has no "
                            f"blocks; predict with {param('features')} the store it learned from")
    fusion = parse_fusion(spec)
    fusion.blocks(encoder.n_blocks)  # blocks the model lacks: refused by name
    return encoder, fusion


def _norm_applied(encoder: dict[str, Any]) -> bool:
    """Whether features went through the final norm (``final_norm`` as :func:`read_time_fusion` reads it)."""
    return str(encoder.get("final_norm", "")).startswith("applied")


class BlocksFused:
    """A loaded encoder whose features are ``fusion`` of its float32 block tokens, then its final norm if ``norm``,
    fused by the code that fuses a blocks store when read, so image features equal a float32 store's fused rows."""

    def __init__(self, encoder: TimmEncoder, fusion: Fusion, norm: bool):
        params = dict(encoder.norm_parameters()) if norm else None
        self.encoder, self.fusion = encoder, fusion
        self.norm = FinalNorm(params.pop("kind"), params.pop("eps"), **params) if params is not None else None
        self.image_size, self.interpolation = encoder.image_size, encoder.interpolation
        self.dim = fusion.width(encoder.n_blocks, encoder.dim)

    def encode(self, images: Any) -> np.ndarray:
        """uint8 images ``(B, 3, h, w)`` -> float32 fused features ``(B, dim)``."""
        _, blocks = self.encoder.encode_blocks(images, "float32")
        with np.errstate(all="ignore"):  # a non-finite row is refused by name where the features are checked
            return fuse(blocks, self.fusion, self.norm)


def recorded_precision(spec: dict[str, Any], device: str) -> str:
    """The autocast precision the store was extracted in (``extract`` defaults to bf16 on CUDA), so that the
    features are the store's; fp32 for a record without one (older stores, ``pixels``). A precision the device
    cannot run is refused."""
    from foal_pipe.encoders import PRECISIONS

    precision = spec.get("precision", "fp32")
    if precision not in PRECISIONS or precision == "auto":
        raise FoalPipeError(f"the model's encoder records precision {precision!r}, none of "
                            f"{', '.join(p for p in PRECISIONS if p != 'auto')}; rebuild the store with `foal-pipe extract`")
    if precision == "bf16" and device == "cuda":
        import torch

        if not torch.cuda.is_bf16_supported():
            raise FoalPipeError(f"the model's store was extracted in bf16, which this GPU cannot compute, so its features "
                                f"cannot be reproduced here; use {param('device', 'cpu')} or a GPU with bf16")
    return str(precision)


def find_images(patterns: Sequence[str | Path]) -> list[Path]:
    """Image files from files, folders (searched recursively) and glob patterns, in the order given. A broken
    symbolic link, given or matched, is listed as a folder's is (:func:`~foal_pipe.datasets.sources.images_in`), so
    that reading it names it (or ``skip_bad`` skips it, said), never left out in silence."""
    found: list[Path] = []
    for pattern in patterns:
        if not str(pattern).strip():  # Path("") is ".": every image under the working directory
            raise FoalPipeError(f"an image path is empty; pass {param('images')} with files, folders or glob patterns "
                                "(\".\" for the working directory)")
        path = Path(pattern).expanduser()
        if path.is_dir():
            files = images_in(path)
            if not files:
                raise FoalPipeError(f"{path} holds no images ({', '.join(IMAGE_EXTENSIONS)}); check the folder")
            found += files
        elif path.is_file() or broken_link(str(path)):
            found.append(path)
        else:
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            files = [m for m in matches if _is_image_entry(m)]
            if not files:
                raise FoalPipeError(f"{pattern} matches no image file; pass image files, folders or glob patterns")
            found += files
    if not found:
        raise FoalPipeError(f"no images given; pass {param('images')} with files, folders or glob patterns")
    return found


@dataclass
class Encoded:
    """Features of the images that could be read, the paths they came from, and the files skipped (with why)."""

    features: np.ndarray
    paths: list[Path]
    skipped: list[str] = field(default_factory=list)


def _read(path: Path, size: int, interpolation: str) -> np.ndarray:
    return to_rgb_array(open_image(path), size, interpolation)


def encode_files(encoder: Any, paths: Sequence[Path], batch_size: int = BATCH_SIZE, skip_bad: bool = False,
                 advance: Callable[[int], None] = lambda n: None) -> Encoded:
    """Encode image files ``batch_size`` at a time; an unreadable file is refused by name, or skipped with
    ``skip_bad`` (listed in ``skipped``)."""
    parts, kept, skipped = [], [], []
    for lo in range(0, len(paths), batch_size):
        batch, names = [], []
        for path in paths[lo : lo + batch_size]:
            try:
                batch.append(_read(path, encoder.image_size, encoder.interpolation))
            except Exception as exc:  # any decoder error: named, never a traceback
                detail = broken_link(str(path)) or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                if not skip_bad:
                    raise FoalPipeError(f"cannot read image {path} ({detail}); fix or remove it, or pass "
                                        f"{param('skip_bad', True)} to skip unreadable files") from None
                skipped.append(f"{path} ({detail})")
                continue
            names.append(path)
        if batch:
            parts.append(encoder.encode(np.stack(batch)))
            kept += names
        advance(min(batch_size, len(paths) - lo))
    if not kept:
        raise FoalPipeError(f"none of the {len(paths)} images could be read; check the files")
    return Encoded(np.concatenate(parts), kept, skipped)


def encode_images(encoder: Any, images: Any, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """Features of image files (paths) or of uint8 arrays ``(n, 3, h, w)`` (a tensor's values, as NumPy's)."""
    images = host_values(images, "images")
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise FoalPipeError(f"images must be uint8 (n, 3, h, w), got {images.dtype} {images.shape}; "
                                "or pass image file paths")
        if images.size == 0:
            raise FoalPipeError(f"images of shape {images.shape} hold no pixels; pass at least one image of at least "
                                "1 x 1 pixels")
        return np.concatenate([encoder.encode(images[lo : lo + batch_size])
                               for lo in range(0, len(images), batch_size)])
    paths = [images] if isinstance(images, str | Path) else list(images)
    stray = next((p for p in paths if not isinstance(p, str | os.PathLike)), None)
    if stray is not None:
        raise FoalPipeError(f"images must be image file paths or one uint8 array (n, 3, h, w), but they hold a "
                            f"{type(stray).__name__}; pass paths, or stack the pixels into one array")
    return encode_files(encoder, find_images(paths), batch_size).features
