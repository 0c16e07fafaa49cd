"""A checkpoint's model is built on ``meta`` and given the file's tensors, without timm's random init: bit for bit
the model of the random init + ``load_state_dict`` copy, whose path is still taken for a model the state dict does
not fill (a non-persistent buffer, a tied parameter, a plain tensor attribute)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_VIT, TINY_VIT_KWARGS, assert_identical_stores, make_image_tree
from safetensors.torch import load_file, save_file

from foal_pipe.encoders import EncoderConfig, build_encoder, weights
from foal_pipe.extract import ExtractSpec, run_extract

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY_BEIT = "beit_base_patch16_224"
BEIT_KWARGS = (("depth", 2), ("embed_dim", 32), ("img_size", 32), ("num_heads", 2), ("patch_size", 8))
"""A 2-block BEiT: relative position indices and ``k_bias`` are non-persistent buffers, set at init."""


@pytest.fixture
def creations(monkeypatch) -> list[str]:
    """The device of every model :class:`~foal_pipe.encoders.weights.Architecture` builds, in order."""
    seen: list[str] = []
    real = weights.Architecture.create

    def recorded(self, *args, **kwargs):
        seen.append(torch.empty(0).device.type)  # the default device: ``meta`` inside ``with torch.device("meta")``
        return real(self, *args, **kwargs)

    monkeypatch.setattr(weights.Architecture, "create", recorded)
    return seen


def _save(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> Path:
    save_file({k: (v.to(dtype) if dtype else v).contiguous() for k, v in state.items()}, str(path))
    return path


def _checkpoint(tmp_path: Path, name: str, kwargs, dtype: torch.dtype | None = None) -> Path:
    import timm

    torch.manual_seed(5)
    model = timm.create_model(name, pretrained=False, **dict(kwargs))
    with torch.no_grad():  # every tensor differs from the seed-0 init it replaces
        for value in model.state_dict().values():
            if value.is_floating_point():
                value.uniform_(-1, 1)
    return _save(model.state_dict(), tmp_path / f"{name}.safetensors", dtype)


def _random_init_and_copy(name: str, kwargs, path: Path):
    """The model as built before: timm's seed-0 random init, then the checkpoint's headless tensors copied in."""
    import timm

    torch.manual_seed(weights.SEED)
    model = timm.create_model(name, pretrained=False, num_classes=0, **dict(kwargs))
    model.load_state_dict({k: v for k, v in load_file(str(path)).items() if not k.startswith("head.")}, strict=True)
    return model


def _loaded(name: str, kwargs, path: Path):
    encoder = build_encoder(EncoderConfig(name, checkpoint=str(path), model_kwargs=kwargs))
    return weights.load_model(encoder.arch, encoder.weights, encoder.name)


def _assert_bit_identical(ours, theirs) -> None:
    assert ours.training == theirs.training
    mine = dict([*ours.named_parameters(remove_duplicate=False), *ours.named_buffers(remove_duplicate=False)])
    want = dict([*theirs.named_parameters(remove_duplicate=False), *theirs.named_buffers(remove_duplicate=False)])
    assert mine.keys() == want.keys() and want
    for key, value in want.items():
        got = mine[key]
        assert (got.dtype, got.device, got.shape, got.stride()) == (value.dtype, value.device, value.shape,
                                                                    value.stride()), key
        assert got.requires_grad == value.requires_grad, key
        assert got.detach().numpy().tobytes() == value.detach().numpy().tobytes(), key


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_the_meta_built_model_is_bit_for_bit_the_random_init_and_copy(tmp_path, creations, dtype):
    """A float32 checkpoint, and half-precision ones: the model's float32 tensors hold the file's values cast
    as the copy casts them (without the cast the parameters would keep the file's dtype)."""
    path = _checkpoint(tmp_path, TINY_VIT, TINY_VIT_KWARGS, dtype)
    ours = _loaded(TINY_VIT, TINY_VIT_KWARGS, path)
    assert creations and set(creations) == {"meta"}  # no model built with a random init
    theirs = _random_init_and_copy(TINY_VIT, TINY_VIT_KWARGS, path)
    _assert_bit_identical(ours, theirs)
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    images = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (4, 3, 32, 32), dtype=np.uint8))
    with torch.inference_mode():
        x = images.float() / 255
        assert torch.equal(ours.eval().forward_features(x), theirs.eval().forward_features(x))


def test_extract_writes_the_same_store_as_the_random_init_and_copy(tmp_path, monkeypatch, creations):
    tree = make_image_tree(tmp_path / "images", {"cat": 3, "dog": 3})
    path = _checkpoint(tmp_path, TINY_VIT, TINY_VIT_KWARGS, torch.float16)

    def extract(out: Path) -> None:
        run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model=TINY_VIT, checkpoint=str(path),
                                model_kwargs=TINY_VIT_KWARGS, out=str(out), batch_size=4, workers=0, device="cpu"))

    extract(tmp_path / "meta.zarr")
    assert "cpu" not in creations
    monkeypatch.setattr(weights, "_filled_by", lambda model, keys: False)  # the random init + copy
    extract(tmp_path / "copy.zarr")
    assert "cpu" in creations
    assert_identical_stores(tmp_path / "meta.zarr", tmp_path / "copy.zarr")


def test_a_model_with_non_persistent_buffers_takes_the_random_init_and_copy(tmp_path, creations):
    """BEiT computes its relative position indices at init and keeps them out of the state dict: built on
    ``meta`` they would stay there, so the model is built on the CPU and the checkpoint copied in."""
    path = _checkpoint(tmp_path, TINY_BEIT, BEIT_KWARGS)
    ours = _loaded(TINY_BEIT, BEIT_KWARGS, path)
    assert creations[-1] == "cpu"
    not_saved = {n for n, _ in ours.named_buffers()} - set(load_file(str(path)))
    assert "blocks.0.attn.relative_position_index" in not_saved
    assert not any(t.is_meta for t in [*ours.parameters(), *ours.buffers()])
    _assert_bit_identical(ours, _random_init_and_copy(TINY_BEIT, BEIT_KWARGS, path))


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)
        self.b = torch.nn.Linear(2, 2)


def _tied() -> torch.nn.Module:
    model = _Tiny()
    model.b.weight = model.a.weight
    return model


def _non_persistent() -> torch.nn.Module:
    model = _Tiny()
    model.register_buffer("index", torch.arange(3), persistent=False)
    return model


def _plain_tensor() -> torch.nn.Module:
    model = _Tiny()
    model.a.table = torch.zeros(3)
    return model


@pytest.mark.parametrize("build,filled", [(_Tiny, True), (_tied, False), (_non_persistent, False),
                                          (_plain_tensor, False)])
def test_only_a_model_the_state_dict_fills_is_built_on_meta(build, filled):
    with torch.device("meta"):
        model = build()
    assert weights._filled_by(model, set(model.state_dict())) is filled
