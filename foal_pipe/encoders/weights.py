"""Weights for a timm model, loaded strictly: a local checkpoint, timm's Hugging Face hub cache, or a seeded random
init (:data:`LOADERS`, by the ``source`` of the weights' provenance).

Every parameter of the headless model must come from the weights, with its exact shape; only the classifier
head's keys are dropped (timm itself loads non-strictly when the head is removed, which would leave missing
blocks at a random init). The position embeddings of a checkpoint saved at another image size are resampled to
the model's grid, as timm resamples its hub weights, and the store records it. A checkpoint is read with
safetensors or ``torch.load(weights_only=True)`` from the very bytes whose SHA-256 the store records; pickled
objects are never loaded. Hub weights are taken from the Hugging Face cache without touching the network when
they are there; otherwise huggingface_hub's own offline mode answers at once, and one bounded request to the hub
tells a missing network within seconds (instead of huggingface_hub's minute of retries). Torch and timm are
imported inside functions only.
"""

from __future__ import annotations

import hashlib
import io
import math
import pickle
import re
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from foal_pipe.encoders.config import EncoderConfig, ModelKwargs, format_model_kwargs
from foal_pipe.encoders.weightvalues import check_finite, check_values
from foal_pipe.errors import FoalPipeError, param

SEED = 0
"""Seed of every model built before its weights are loaded (random weights are exactly this init)."""
HUB_PROBE_SECONDS = 3.0
WRAPPERS = ("state_dict", "model")
"""Top-level keys of a training checkpoint that hold the state dict."""
SHOWN = 3
"""Keys named in an error about a checkpoint that does not fit."""


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in blocks (a checkpoint may be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_sha256(path: Path) -> str:
    """The SHA-256 of a checkpoint, hashed once and recorded (:mod:`foal_pipe.encoders.hashes`): later commands
    take the record while the file's size, times and inode are unchanged. A record can never put a wrong hash in
    a store: the loaded bytes are hashed again and must match (:func:`read_state_dict`)."""
    from foal_pipe.encoders import hashes

    return hashes.recorded(path) or hashes.hashed(path, file_sha256)


def _read_safetensors(data: bytes) -> Any:
    from safetensors.torch import load

    return load(data)


def _read_torch(data: bytes | Path, **kwargs: Any) -> Any:
    """``torch.load`` with weights only; its warnings about a pickle protocol other than 2 and about checking sparse
    tensors are dropped: the file loads, or is refused in one line (:func:`_parse_state_dict`)."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected pickle protocol|Validating sparse tensor invariants")
        return torch.load(io.BytesIO(data) if isinstance(data, bytes) else data, weights_only=True, map_location="cpu",
                          **kwargs)


def _looks_like(data: bytes) -> str | None:
    """What a checkpoint's bytes are by their first bytes: a safetensors file (an 8-byte header length, then a JSON
    header), torch.save's zip archive, or a pickle (torch.save's legacy format); None for none of them."""
    if data.startswith(b"PK\x03\x04"):
        return "a zip archive (torch.save's format)"
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a pickle (torch.save's legacy format, or pickle.dump)"
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
    if 0 < size <= len(data) - 8 and data[8:9] == b"{":
        return "a safetensors file"
    return None


READERS: dict[str, Callable[[bytes], Any]] = {
    ".safetensors": _read_safetensors,
    ".pth": _read_torch,
    ".pt": _read_torch,
    ".bin": _read_torch,
}
CHECKPOINT_SUFFIXES = tuple(READERS)


@dataclass
class Architecture:
    """A timm model by name (a tag picks its ``pretrained_cfg``) and keyword arguments, always headless."""

    name: str
    kwargs: ModelKwargs = ()
    pretrained_cfg: dict[str, Any] = field(default_factory=dict)

    def create(self, pretrained: bool = False, num_classes: int = 0) -> Any:
        """The model, its parameters initialised from :data:`SEED` (the default RNG is left as it was)."""
        import timm
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            return timm.create_model(self.name, pretrained=pretrained, num_classes=num_classes, **dict(self.kwargs))

    def describe(self) -> str:
        return f"{self.name} built with " + (format_model_kwargs(self.kwargs) if self.kwargs else "timm's defaults")


# ---------------------------------------------------------------------------------------------------------
# Provenance: where the weights come from, decided (and a checkpoint hashed) before anything is loaded
# ---------------------------------------------------------------------------------------------------------
def describe_weights(config: EncoderConfig, pretrained_cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """The store's ``encoder.weights``: ``checkpoint`` (path, bytes, sha256), ``random`` (seed), ``hf-hub`` (id), ``url``."""
    if config.checkpoint:
        path = Path(config.checkpoint).expanduser()
        if path.is_dir():
            raise FoalPipeError(f"{param('checkpoint')} {path} is a directory; pass the .safetensors or .pth state dict file "
                                "inside it")
        if not path.is_file():
            raise FoalPipeError(f"{param('checkpoint')} {path} does not exist; pass a .safetensors or .pth state dict")
        if path.suffix.lower() not in READERS:
            raise FoalPipeError(f"{param('checkpoint')} {path} has suffix {path.suffix!r}; expected one of "
                                f"{', '.join(CHECKPOINT_SUFFIXES)} (a state dict)")
        return {"source": "checkpoint", "path": str(path.resolve()), "bytes": path.stat().st_size,
                "sha256": checkpoint_sha256(path)}
    if not config.pretrained:
        return {"source": "random", "seed": SEED}
    if pretrained_cfg.get("hf_hub_id"):
        return {"source": "hf-hub", "id": str(pretrained_cfg["hf_hub_id"])}
    if pretrained_cfg.get("url"):
        return {"source": "url", "url": str(pretrained_cfg["url"])}
    raise FoalPipeError(f"timm has no pretrained weights for {name}; pass {param('checkpoint', 'FILE')} or choose a tag from "
                        "timm.list_pretrained()")


def load_model(arch: Architecture, weights: dict[str, Any], label: str) -> Any:
    """The headless model of ``arch`` with ``weights`` (a :func:`describe_weights` dict) loaded strictly;
    ``label`` names the encoder in messages."""
    return LOADERS[weights["source"]](arch, weights, label)


# ---------------------------------------------------------------------------------------------------------
# Local checkpoints
# ---------------------------------------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] if text else type(exc).__name__


def read_state_dict(path: Path, expected_sha256: str) -> dict[str, Any]:
    """A checkpoint's tensors by name: a state dict, or one under a top-level ``state_dict``/``model`` key.

    The file is read once, and those bytes must have ``expected_sha256`` (the hash recorded in the store when
    the encoder was described), so the store's record is the hash of what was loaded."""
    data = path.read_bytes()
    with ThreadPoolExecutor(1) as pool:  # hashlib lets go of the GIL: the bytes are hashed while they are parsed
        digest = pool.submit(lambda: hashlib.sha256(data).hexdigest())
        state = _parse_state_dict(path, data)
        if digest.result() != expected_sha256:
            from foal_pipe.encoders import hashes

            hashes.forget(path)
            raise FoalPipeError(f"{param('checkpoint')} {path} changed after it was hashed; re-run once it no longer "
                                "changes")
    return state


def _parse_state_dict(path: Path, data: bytes) -> dict[str, Any]:
    """The tensors of a checkpoint's bytes, unwrapped and checked (see :func:`read_state_dict`)."""
    import torch

    fix = ("save the weights with safetensors.torch.save_file(model.state_dict(), FILE) or "
           "torch.save(model.state_dict(), FILE)")
    try:
        state = READERS[path.suffix.lower()](data)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: (GLOBAL )?([\w.]+)", str(exc))
        what = f" ({found.group(2)})" if found else ""
        raise FoalPipeError(f"{param('checkpoint')} {path} holds pickled Python objects{what}, not only tensors, and is not "
                            f"unpickled; {fix}") from None
    except Exception as exc:
        looks = _looks_like(data)
        safetensors = path.suffix.lower() == ".safetensors"
        if looks is not None and (looks == "a safetensors file") != safetensors:
            rename = path.with_suffix(".pth" if safetensors else ".safetensors").name
            raise FoalPipeError(f"{param('checkpoint')} {path} is {looks}, not what its suffix {path.suffix!r} says; rename "
                                f"it to {rename}") from None
        what = f"its first bytes are those of {looks}" if looks else "it is neither safetensors nor torch.save's format"
        raise FoalPipeError(f"cannot read {param('checkpoint')} {path} as a state dict ({_one_line(exc)}; {what}); "
                            f"{fix}") from None
    if not isinstance(state, dict):
        raise FoalPipeError(f"{param('checkpoint')} {path} holds a {type(state).__name__}, not a state dict (parameter names "
                            f"to tensors); {fix}")
    wrapped = [key for key in WRAPPERS if isinstance(state.get(key), dict)]
    if len(wrapped) > 1:
        raise FoalPipeError(f"{param('checkpoint')} {path} holds both 'state_dict' and 'model'; which are the weights is "
                            f"ambiguous: {fix}")
    if wrapped:
        state = state[wrapped[0]]
    keys = [k for k in state if not isinstance(k, str)]
    if keys:
        raise FoalPipeError(f"{param('checkpoint')} {path}: key {keys[0]!r} ({type(keys[0]).__name__}) is not a "
                            f"string ({len(keys)} such keys); a state dict maps parameter names to tensors: {fix}")
    bad = [(k, v) for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        key, value = bad[0]
        raise FoalPipeError(f"{param('checkpoint')} {path}: entry {key!r} is a {type(value).__name__}, not a tensor "
                            f"({len(bad)} such entries); {fix} (a training checkpoint may hold it under "
                            "'state_dict' or 'model')")
    if not state:
        raise FoalPipeError(f"{param('checkpoint')} {path} holds no tensors; {fix}")
    return state


def head_keys(arch: Architecture, headless: Any) -> set[str]:
    """State-dict keys of the classifier head: those a model with a head has (built on the ``meta`` device: no
    memory, no init) and the ``headless`` model lacks."""
    import torch

    with torch.device("meta"):
        headed = arch.create(num_classes=1)
    return set(headed.state_dict()) - set(headless.state_dict())


def _n_blocks(keys: list[str]) -> int:
    return len({m.group(1) for k in keys if (m := re.match(r"blocks\.(\d+)\.", k))})


def _shape(shape: Any) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _listed(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (", ..." if len(items) > SHOWN else "")


def _mismatch(missing: list[str], unexpected: list[str], shapes: list[str]) -> str:
    """``"2 missing keys (a, b), 1 shape mismatches (c ...)"``: what does not fit, counted, the first named."""
    parts = [(missing, "missing keys"), (unexpected, "unexpected keys"), (shapes, "shape mismatches")]
    return ", ".join(f"{len(items)} {what} ({_listed(items)})" for items, what in parts if items)


def fit_state_dict(state: dict[str, Any], model: Any, head: set[str], path: Path, arch: Architecture) -> dict[str, Any]:
    """``state`` without the head's keys, refused unless its keys and shapes are exactly the model's, each tensor of
    the model's kind (a floating-point parameter from integers would be cast, silently, to whole numbers) and every
    floating-point tensor finite (NaN weights would surface only as non-finite features)."""
    model_state = model.state_dict()
    want = {k: tuple(v.shape) for k, v in model_state.items()}
    state = {k: v for k, v in state.items() if k in want or k not in head}
    missing = [k for k in want if k not in state]
    unexpected = sorted(k for k in state if k not in want)
    shapes = [f"{k} {_shape(state[k].shape)} in the file vs {_shape(want[k])} in the model" for k in want
              if k in state and tuple(state[k].shape) != want[k]]
    if not (missing or unexpected or shapes):
        check_values(state, model_state, path)
        return state
    in_file, in_model = _n_blocks(list(state)), _n_blocks(list(want))
    hint = f"; the file has {in_file} blocks, the model {in_model}" if in_file != in_model else ""
    raise FoalPipeError(f"{param('checkpoint')} {path} does not fit {arch.describe()}: "
                        f"{_mismatch(missing, unexpected, shapes)}{hint}; pass the {param('model')}, {param('model_kwargs')} "
                        f"and {param('image_size')} it was saved with")


def _unwrapped(state: Any) -> Any:
    wrapped = [key for key in WRAPPERS if isinstance(state, dict) and isinstance(state.get(key), dict)]
    return state[wrapped[0]] if len(wrapped) == 1 else state


def checkpoint_shape(path: Path, key: str) -> tuple[int, ...] | None:
    """The shape of tensor ``key`` in a checkpoint (None when it has none or cannot be read: loading it then says
    why), read from the safetensors header or a memory-mapped torch file, without loading the other tensors."""
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as f:
                return tuple(f.get_slice(key).get_shape()) if key in f.keys() else None  # noqa: SIM118 (safe_open has no __contains__)
        import torch

        try:
            state = _read_torch(path, mmap=True)
        except RuntimeError:  # the legacy (not zip) format cannot be memory-mapped
            state = _read_torch(path.read_bytes())
        state = _unwrapped(state)
        value = state.get(key) if isinstance(state, dict) else None
        return tuple(value.shape) if isinstance(value, torch.Tensor) else None
    except Exception:
        return None


def pos_embed_resampling(path: Path, model: Any) -> dict[str, Any] | None:
    """How the checkpoint's ``pos_embed`` is resampled to ``model``'s patch grid when the checkpoint was saved at
    another image size: timm's rule (``resample_abs_pos_embed``, bicubic with antialias, the prefix tokens kept,
    as timm's checkpoint filters do for its hub weights), the saved grid taken as square. None when it fits as it
    is, or when it is no square grid of the model's width (then the strict load names the mismatch)."""
    want, grid = getattr(model, "pos_embed", None), getattr(getattr(model, "patch_embed", None), "grid_size", None)
    shape = checkpoint_shape(path, "pos_embed")
    if want is None or grid is None or shape is None or shape == tuple(want.shape):
        return None
    prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 1))
    side = math.isqrt(max(shape[1] - prefix, 0)) if len(shape) == 3 else 0
    if side == 0 or side * side != shape[1] - prefix or shape[0] != 1 or shape[2] != want.shape[2]:
        return None
    return {"from": [side, side], "to": [int(g) for g in grid], "prefix_tokens": prefix, "interpolation": "bicubic",
            "antialias": True}


def resample_pos_embed(pos_embed: Any, plan: dict[str, Any]) -> Any:
    """``pos_embed`` resampled as :func:`pos_embed_resampling` planned."""
    from timm.layers import resample_abs_pos_embed

    return resample_abs_pos_embed(pos_embed, new_size=plan["to"], old_size=plan["from"],
                                  num_prefix_tokens=plan["prefix_tokens"], interpolation=plan["interpolation"],
                                  antialias=plan["antialias"])


def _filled_by(skeleton: Any, keys: set[str]) -> bool:
    """Whether loading a state dict with ``keys`` sets every tensor of ``skeleton``: each parameter and buffer is
    a key (a non-persistent buffer, computed at init, is none), none is shared by two names (assigning would
    untie them), and no module holds a plain tensor attribute (it would stay on ``meta``)."""
    import torch

    named = [*skeleton.named_parameters(remove_duplicate=False), *skeleton.named_buffers(remove_duplicate=False)]
    plain = any(isinstance(value, torch.Tensor) for module in skeleton.modules() for value in vars(module).values())
    return {name for name, _ in named} <= keys and len({id(t) for _, t in named}) == len(named) and not plain


def _checkpoint_model(arch: Architecture, weights: dict[str, Any], label: str) -> Any:
    """The model with the checkpoint's tensors. Built on ``meta`` and then given the tensors (``assign``), it skips
    timm's random init of every parameter (1.5 s of ViT-B's start-up), which loading would overwrite anyway.
    Each tensor is copied into a fresh one with the model's own dtype and strides, as ``load_state_dict``'s
    ``copy_`` does (a float16 file is cast, and safetensors' tensors sit unaligned in byte arrays; the copies
    take 0.06 s of ViT-B's), so the parameters are bit for bit those of the random init + copy; that path is
    still taken for a model whose tensors the state dict does not all set (:func:`_filled_by`)."""
    import torch

    path = Path(weights["path"])
    state = read_state_dict(path, weights["sha256"])
    if "pos_embed_resampled" in weights:  # saved at another image size
        state = {**state, "pos_embed": resample_pos_embed(state["pos_embed"], weights["pos_embed_resampled"])}
    with torch.device("meta"):
        model = arch.create()
    state = fit_state_dict(state, model, head_keys(arch, model), path, arch)
    if not _filled_by(model, set(state)):
        model = arch.create()
        model.load_state_dict(state, strict=True)
        return model
    like = model.state_dict()
    model.load_state_dict({k: torch.empty_like(like[k], device="cpu").copy_(v) for k, v in state.items()},
                          strict=True, assign=True)
    return model


def _random_model(arch: Architecture, weights: dict[str, Any], label: str) -> Any:
    return arch.create()


# ---------------------------------------------------------------------------------------------------------
# timm's pretrained weights: the Hugging Face cache first, then the network, never a silent partial load
# ---------------------------------------------------------------------------------------------------------
def _pretrained_model(arch: Architecture, label: str) -> Any:
    """timm's pretrained weights loaded strictly: built with the tag's own head (so timm keeps strict loading
    on), which is then removed."""
    try:
        model = arch.create(pretrained=True, num_classes=int(arch.pretrained_cfg.get("num_classes") or 0))
    except RuntimeError as exc:
        if "state_dict" not in str(exc):
            raise
        lines = str(exc).splitlines()
        keys = {kind: [k for line in lines if kind in line for k in re.findall(r'"([^"]+)"', line)]
                for kind in ("Missing key(s)", "Unexpected key(s)")}
        shapes = [m.group(1) for line in lines if (m := re.search(r"size mismatch for (\S+):", line))]
        found = _mismatch(keys["Missing key(s)"], keys["Unexpected key(s)"], shapes) or _one_line(exc)
        raise FoalPipeError(f"the pretrained weights of {label} do not fit {arch.describe()}: {found}; "
                            f"drop the {param('model_kwargs')} that change the architecture (depth, embed_dim, num_heads, "
                            f"...) or pass a {param('checkpoint')} saved from it") from None
    model.reset_classifier(0)
    check_finite(model, label)
    return model


@contextmanager
def hf_offline() -> Iterator[None]:
    """Make huggingface_hub answer from its cache only (its own offline mode), for the duration."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def no_weights(label: str, why: str) -> FoalPipeError:
    from huggingface_hub import constants

    return FoalPipeError(
        f"no weights for {label}: {why}; pass {param('checkpoint', 'FILE')} (a local .safetensors or .pth state dict), or "
        f"download them once on a machine with network (into the Hugging Face cache, {constants.HF_HUB_CACHE}) "
        f"and run with HF_HUB_OFFLINE=1, or use {param('model', 'pixels')}"
    )


def hub_files(pretrained_cfg: dict[str, Any]) -> list[str]:
    """The files timm loads from a hub repository, in its order of preference (safetensors first)."""
    name = str(pretrained_cfg.get("hf_hub_filename") or "pytorch_model.bin")
    safe = {"pytorch_model.bin": "model.safetensors", "open_clip_pytorch_model.bin": "open_clip_model.safetensors"}
    alternative = safe.get(name, name[:-4] + ".safetensors" if name.endswith(".bin") else None)
    return [f for f in (alternative, name) if f]


def _probe_hub(repo: str, revision: str | None, filename: str, label: str) -> None:
    """One request, no retries, at most :data:`HUB_PROBE_SECONDS` per phase: does the hub answer at all?"""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    url = hf_hub_url(repo, filename, revision=revision)
    try:
        get_hf_file_metadata(url, timeout=HUB_PROBE_SECONDS)
    except HfHubHTTPError:
        return  # the hub answered (an absent file or a gated repo): the download itself says what is wrong
    except Exception as exc:  # no network: DNS failure, refused or timed-out connection
        raise no_weights(label, f"they are not in the Hugging Face cache and {urlsplit(url).netloc} did not answer "
                                f"({_one_line(exc)})") from None


def _hub_model(arch: Architecture, weights: dict[str, Any], label: str) -> Any:
    from huggingface_hub import constants, try_to_load_from_cache

    repo, _, revision = str(weights["id"]).partition("@")
    files = hub_files(arch.pretrained_cfg)
    cached = any(isinstance(try_to_load_from_cache(repo, f, revision=revision or None), str) for f in files)
    if not cached and constants.HF_HUB_OFFLINE:
        raise no_weights(label, "they are not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    if not cached:
        _probe_hub(repo, revision or None, files[0], label)
    try:  # from the cache: without network, and without checking for a newer revision
        with hf_offline() if cached else nullcontext():
            return _pretrained_model(arch, label)
    except FoalPipeError:
        raise
    except Exception as exc:
        raise no_weights(label, f"loading them failed ({_one_line(exc)})") from None


def _url_model(arch: Architecture, weights: dict[str, Any], label: str) -> Any:
    try:
        return _pretrained_model(arch, label)
    except FoalPipeError:
        raise
    except Exception as exc:
        raise no_weights(label, f"loading them from {weights['url']} failed ({_one_line(exc)})") from None


LOADERS: dict[str, Callable[[Architecture, dict[str, Any], str], Any]] = {
    "checkpoint": _checkpoint_model,
    "random": _random_model,
    "hf-hub": _hub_model,
    "url": _url_model,
}
"""How to build the model for each weights ``source`` of :func:`describe_weights`."""
