"""Strict checkpoint loading: every parameter from the file with its exact shape, only the head dropped, no
unpickling; anything else refused with one line naming the counts, the first keys and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_VIT, TINY_VIT_KWARGS
from safetensors.torch import load_file, save_file

from foal_pipe.encoders import EncoderConfig, build_encoder
from foal_pipe.errors import FoalPipeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NO_DEPTH = tuple(kv for kv in TINY_VIT_KWARGS if kv[0] != "depth")  # the same ViT, timm's default 12 blocks


def _config(checkpoint: Path, kwargs=TINY_VIT_KWARGS, name: str = TINY_VIT) -> EncoderConfig:
    return EncoderConfig(name, checkpoint=str(checkpoint), model_kwargs=kwargs)


def _load(checkpoint: Path, kwargs=TINY_VIT_KWARGS, name: str = TINY_VIT):
    return build_encoder(_config(checkpoint, kwargs, name)).load("cpu")


def _images(n: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)


@pytest.fixture(scope="module")
def state(tiny_vit_checkpoint) -> dict[str, torch.Tensor]:
    return load_file(str(tiny_vit_checkpoint))


def _refusal(checkpoint: Path, kwargs=TINY_VIT_KWARGS) -> str:
    with pytest.raises(FoalPipeError) as info:
        _load(checkpoint, kwargs)
    message = str(info.value)
    assert "\n" not in message and str(checkpoint) in message
    assert "pass the model, model_kwargs and image_size it was saved with" in message
    return message


def test_timm_alone_accepts_a_2_block_checkpoint_for_a_12_block_model(tiny_vit_checkpoint):
    """The failure being guarded against: timm's own file loading with the head removed is not strict."""
    import timm

    model = timm.create_model(TINY_VIT, pretrained=True, num_classes=0, **dict(NO_DEPTH),
                              pretrained_cfg_overlay={"file": str(tiny_vit_checkpoint)})
    assert len(model.blocks) == 12  # 10 blocks left at a random init, and no error


def test_fewer_blocks_than_the_model_are_refused(tiny_vit_checkpoint):
    message = _refusal(tiny_vit_checkpoint, NO_DEPTH)
    n_missing = 10 * 12  # 12 tensors per ViT block
    assert f"{n_missing} missing keys (blocks.2.norm1.weight, blocks.2.norm1.bias, blocks.2.attn.qkv.weight, ...)" \
        in message
    assert "the file has 2 blocks, the model 12" in message
    assert "vit_tiny_patch16_224 built with embed_dim=32,img_size=32,num_heads=2,patch_size=8" in message


def test_extra_keys_are_refused(tmp_path, state):
    path = tmp_path / "extra.safetensors"
    save_file({**state, "blocks.0.extra.weight": torch.zeros(2), "adapter.bias": torch.zeros(3)}, str(path))
    message = _refusal(path)
    assert "2 unexpected keys (adapter.bias, blocks.0.extra.weight)" in message and "missing" not in message


def test_more_blocks_than_the_model_are_refused(tmp_path, tiny_vit_checkpoint):
    import timm

    deeper = timm.create_model(TINY_VIT, pretrained=False, **{**dict(TINY_VIT_KWARGS), "depth": 3})
    path = tmp_path / "deeper.safetensors"
    save_file({k: v.contiguous() for k, v in deeper.state_dict().items()}, str(path))
    message = _refusal(path)
    assert "12 unexpected keys (blocks.2.attn.proj.bias, blocks.2.attn.proj.weight, blocks.2.attn.qkv.bias, ...)" in message
    assert "the file has 3 blocks, the model 2" in message


def test_wrong_shapes_are_refused_with_both_shapes(tmp_path, state):
    path = tmp_path / "shapes.safetensors"
    # 1 + 5 position embeddings: no square patch grid, so not one saved at another image size
    save_file({**state, "pos_embed": torch.zeros(1, 6, 32), "blocks.1.mlp.fc1.bias": torch.zeros(64)}, str(path))
    message = _refusal(path)
    assert "2 shape mismatches (pos_embed 1x6x32 in the file vs 1x17x32 in the model, blocks.1.mlp.fc1.bias 64 in " \
           "the file vs 128 in the model)" in message


def test_missing_unexpected_and_shapes_are_counted_together(tmp_path, state):
    broken = {k: v for k, v in state.items() if k != "norm.weight"}
    broken["cls_token"] = torch.zeros(1, 1, 16)
    broken["stray"] = torch.zeros(1)
    path = tmp_path / "all.safetensors"
    save_file(broken, str(path))
    message = _refusal(path)
    assert "1 missing keys (norm.weight), 1 unexpected keys (stray), 1 shape mismatches (cls_token" in message


@pytest.mark.parametrize("wrapper", ["state_dict", "model"])
def test_a_training_checkpoint_wrapping_the_state_dict_is_accepted(tmp_path, tiny_vit_checkpoint, state, wrapper):
    path = tmp_path / "train.pth"
    torch.save({wrapper: state, "epoch": 7, "optimizer": {"lr": 0.1}}, path)
    want = _load(tiny_vit_checkpoint).encode(_images())
    assert _load(path).encode(_images()).tobytes() == want.tobytes()


def test_both_wrappers_are_ambiguous(tmp_path, state):
    path = tmp_path / "both.pth"
    torch.save({"state_dict": state, "model": state}, path)
    with pytest.raises(FoalPipeError, match="holds both 'state_dict' and 'model'"):
        _load(path)


def test_head_keys_are_dropped_whatever_the_class_count(tmp_path, state):
    """The fixture holds a 1000-class head; a 100-class head (another shape) is dropped just the same, and the
    features equal those of the headless state dict."""
    headless = {k: v for k, v in state.items() if not k.startswith("head.")}
    assert {"head.weight", "head.bias"} <= set(state) and len(headless) == len(state) - 2
    other_head = {**headless, "head.weight": torch.zeros(100, 32), "head.bias": torch.zeros(100)}
    paths = {}
    for name, sd in (("headless", headless), ("other", other_head)):
        paths[name] = tmp_path / f"{name}.safetensors"
        save_file(sd, str(paths[name]))
    want = _load(paths["headless"]).encode(_images())
    assert _load(paths["other"]).encode(_images()).tobytes() == want.tobytes()


@pytest.mark.slow  # builds a timm ViT
def test_distilled_head_keys_are_dropped_too(tmp_path):
    """DeiT distilled has two heads (head, head_dist): both are the classifier, both are dropped."""
    import timm

    name = "deit_tiny_distilled_patch16_224"
    kwargs = (("depth", 1), ("embed_dim", 32), ("img_size", 32), ("num_heads", 2), ("patch_size", 8))
    model = timm.create_model(name, pretrained=False, **dict(kwargs))
    sd = model.state_dict()
    assert {"head.weight", "head_dist.weight"} <= set(sd)
    path = tmp_path / "deit.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    enc = _load(path, kwargs, name)
    torch.testing.assert_close(enc.model.dist_token, sd["dist_token"])


@pytest.mark.slow  # builds a timm ViT
def test_a_pickled_module_is_refused_without_being_unpickled(tmp_path, monkeypatch):
    """torch.save(model) pickles the module; weights_only=True refuses it before any of its code runs."""
    import timm

    path = tmp_path / "whole.pth"
    torch.save(timm.create_model(TINY_VIT, pretrained=False, **dict(TINY_VIT_KWARGS)), path)
    ran = []
    monkeypatch.setattr(torch.nn.Module, "__setstate__", lambda self, st: ran.append(1), raising=False)
    with pytest.raises(FoalPipeError, match=r"holds pickled Python objects \(timm\.models\.vision_transformer\."
                                            r"VisionTransformer\), not only tensors, and is not unpickled"):
        _load(path)
    assert not ran


class _Payload:  # unpickling this would construct an arbitrary object
    def __reduce__(self):
        return (print, ("payload ran",))


def test_a_pickle_payload_never_runs(tmp_path, capsys):
    path = tmp_path / "evil.pth"
    torch.save({"blocks.0.norm1.weight": _Payload()}, path)
    with pytest.raises(FoalPipeError, match="holds pickled Python objects"):
        _load(path)
    assert "payload ran" not in capsys.readouterr().out


@pytest.mark.parametrize("content,message", [
    ([torch.zeros(2)], "holds a list, not a state dict"),
    ({"pos_embed": torch.zeros(1), "epoch": 3}, "entry 'epoch' is a int, not a tensor (1 such entries)"),
    ({"model": {"pos_embed": torch.zeros(1), "step": "ten"}}, "entry 'step' is a str, not a tensor"),
    ({}, "holds no tensors"),
])
def test_a_checkpoint_that_is_not_a_state_dict_is_refused(tmp_path, content, message):
    path = tmp_path / "odd.pt"
    torch.save(content, path)
    with pytest.raises(FoalPipeError) as info:
        _load(path)
    assert message in str(info.value) and "torch.save(model.state_dict(), FILE)" in str(info.value)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_a_damaged_file_is_one_clear_error(tmp_path, tiny_vit_checkpoint, suffix):
    path = tmp_path / f"cut{suffix}"
    data = tiny_vit_checkpoint.read_bytes() if suffix == ".safetensors" else b"PK\x03\x04 not a zip at all"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FoalPipeError, match=r"cannot read checkpoint .* as a state dict \(.+\); save the weights"):
        _load(path)


def test_the_recorded_hash_is_that_of_the_bytes_loaded(tmp_path, tiny_vit_checkpoint, state):
    """A file that changes between description (hashed, compared on resume) and loading is refused."""
    path = tmp_path / "moving.safetensors"
    path.write_bytes(tiny_vit_checkpoint.read_bytes())
    enc = build_encoder(_config(path))
    save_file({**state, "cls_token": torch.ones(1, 1, 32)}, str(path))
    with pytest.raises(FoalPipeError, match="changed after it was hashed"):
        enc.load("cpu")


AT_ANY_SIZE = tuple(kv for kv in TINY_VIT_KWARGS if kv[0] != "img_size")  # the same ViT, its size from --image-size


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_a_checkpoint_at_another_image_size_is_resampled_as_timm_does(tmp_path, tiny_vit_checkpoint, state, suffix):
    """Saved at 32 px (a 4 x 4 patch grid), loaded at 48 px (6 x 6): the position embeddings are resampled as
    timm's own checkpoint loading resamples them, the rest is loaded strictly, and the store's provenance says so."""
    import timm

    path = tiny_vit_checkpoint
    if suffix == ".pth":
        path = tmp_path / "tiny.pth"
        torch.save({"model": state}, path)
    enc = build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(path), model_kwargs=AT_ANY_SIZE, image_size=48))
    assert enc.weights["pos_embed_resampled"] == {"from": [4, 4], "to": [6, 6], "prefix_tokens": 1,
                                                  "interpolation": "bicubic", "antialias": True}
    assert enc.provenance()["weights"]["pos_embed_resampled"] == enc.weights["pos_embed_resampled"]
    enc.load("cpu")
    theirs = timm.create_model(TINY_VIT, pretrained=True, num_classes=0, img_size=48, **dict(AT_ANY_SIZE),
                               pretrained_cfg_overlay={"file": str(tiny_vit_checkpoint)}).eval()
    ours = enc.model.state_dict()
    assert ours.keys() == theirs.state_dict().keys() and ours["pos_embed"].shape == (1, 37, 32)
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours[key], value), key
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 48, 48), dtype=np.uint8)
    x = enc.preprocess(torch.from_numpy(images))
    with torch.inference_mode():
        assert torch.equal(enc.plain_features(x), theirs.forward_features(x)[:, 0])
    at_32 = build_encoder(_config(tiny_vit_checkpoint))  # at its own size: nothing resampled, nothing recorded
    assert "pos_embed_resampled" not in at_32.weights


def test_extract_records_the_resampling_and_resumes(tmp_path, tiny_vit_checkpoint):
    """The store records the resampling before any weights load, so a re-run finds the same settings."""
    from typer.testing import CliRunner

    from foal_pipe.cli import app
    from foal_pipe.store import open_store

    out = tmp_path / "d.zarr"
    args = ["extract", "--model", TINY_VIT, "--checkpoint", str(tiny_vit_checkpoint), "--model-kwargs",
            "patch_size=8,depth=2,num_heads=2,embed_dim=32", "--image-size", "16", "--out", str(out), "--workers", "0"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    weights = open_store(out).meta.encoder["weights"]
    assert weights["pos_embed_resampled"]["from"] == [4, 4] and weights["pos_embed_resampled"]["to"] == [2, 2]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "already complete with these settings" in again.output, again.output
    info = CliRunner().invoke(app, ["info", str(out)])
    assert "position embeddings resampled 4x4 -> 2x2 (bicubic): saved at another image size" in info.output


@pytest.mark.parametrize("change, message", [
    (lambda t: t.to(torch.int32), "holds blocks.0.attn.qkv.weight as torch.int32, but the model's blocks.0.attn.qkv.weight is "
                                  "torch.float32: loading would cast it"),
    (lambda t: torch.where(torch.arange(t.numel()).reshape(t.shape) == 3, torch.nan, t),
     "holds non-finite values (NaN or inf) in blocks.0.attn.qkv.weight; the weights are damaged"),
])
def test_a_tensor_of_another_kind_or_not_finite_is_refused(tmp_path, state, change, message):
    """An integer tensor for a float parameter was cast (the features all 0, learn at chance, exit 0); a NaN weight
    surfaced only as non-finite features, with advice about --precision. Both are refused when loading."""
    path = tmp_path / "kind.safetensors"
    save_file({**state, "blocks.0.attn.qkv.weight": change(state["blocks.0.attn.qkv.weight"])}, str(path))
    with pytest.raises(FoalPipeError) as info:
        _load(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    float16 = tmp_path / "half.safetensors"  # a float16 file for a float32 model stays accepted (cast, documented)
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(float16))
    _load(float16)
