"""Encoders: fused features against hand computations over the block outputs, weights, preprocessing, errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_VIT, TINY_VIT_KWARGS

from foal_pipe.encoders import ENCODERS, EncoderConfig, PixelsEncoder, build_encoder, encode_numpy
from foal_pipe.errors import FoalPipeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _reference_model(checkpoint: Path):
    """The tiny ViT loaded independently of foal-pipe: timm architecture + safetensors state dict."""
    import timm
    from safetensors.torch import load_file

    model = timm.create_model(TINY_VIT, pretrained=False, **dict(TINY_VIT_KWARGS))
    model.load_state_dict(load_file(str(checkpoint)))
    return model.eval()


def _tiny(checkpoint: Path, **kw) -> EncoderConfig:
    return EncoderConfig(TINY_VIT, checkpoint=str(checkpoint), model_kwargs=TINY_VIT_KWARGS, **kw)


def _images(n: int = 6, size: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, size, size), dtype=np.uint8)


def _normalized(images: np.ndarray, mean, std) -> torch.Tensor:
    x = torch.from_numpy(images).float() / 255.0
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def _block_outputs(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Every block's raw output (the residual stream before any norm), by running the blocks by hand."""
    with torch.no_grad():
        h = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        outs = []
        for blk in model.blocks:
            h = blk(h)
            outs.append(h)
    return outs


@pytest.mark.parametrize("token", ["cls", "mean"])
def test_fused_features_equal_hand_computation(tiny_vit_checkpoint, token):
    enc = build_encoder(_tiny(tiny_vit_checkpoint, token=token)).load("cpu")
    images = _images()
    got = encode_numpy(enc, images)

    ref = _reference_model(tiny_vit_checkpoint)
    outs = _block_outputs(ref, _normalized(images, enc.mean, enc.std))
    pick = (lambda h: h[:, 0]) if token == "cls" else (lambda h: h[:, ref.num_prefix_tokens:].mean(dim=1))
    with torch.no_grad():
        want = ref.norm(torch.stack([pick(h) for h in outs]).mean(dim=0)).numpy()

    assert got.shape == (6, 32) and enc.dim == 32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the average of the blocks, not the last block alone: the two differ on this model
    with torch.no_grad():
        last_only = ref.norm(pick(outs[-1])).numpy()
    assert np.abs(got - last_only).max() > 1e-2


def test_last_fusion_equals_timm_forward_features_cls(tiny_vit_checkpoint):
    enc = build_encoder(_tiny(tiny_vit_checkpoint, fusion="last")).load("cpu")
    images = _images(seed=1)
    ref = _reference_model(tiny_vit_checkpoint)
    with torch.no_grad():
        want = ref.forward_features(_normalized(images, enc.mean, enc.std))[:, 0].numpy()
    np.testing.assert_allclose(encode_numpy(enc, images), want, rtol=1e-5, atol=1e-5)
    # plain_features (the benchmark baseline) is timm's forward_features CLS too, hooks bypassed
    x = enc.preprocess(torch.from_numpy(images))
    with torch.inference_mode():
        np.testing.assert_allclose(enc.plain_features(x).numpy(), want, rtol=1e-5, atol=1e-5)


FAMILIES = [  # tiny random members of each supported timm family (prefix tokens, norm_pre, fc_norm differ)
    ("deit_tiny_distilled_patch16_224", 32, 8),  # 2 prefix tokens (cls + distillation)
    ("vit_small_patch14_reg4_dinov2", 28, 14),  # 1 cls + 4 register tokens
    ("vit_base_patch16_clip_224", 32, 8),  # pre-norm (ln_pre)
    ("eva02_tiny_patch14_224", 28, 14),  # rotary embeddings; final norm is fc_norm
]


@pytest.mark.parametrize("name,size,patch", FAMILIES)
@pytest.mark.parametrize("token", ["cls", "mean"])
def test_vit_families_match_timm_forward_intermediates(name, size, patch, token):
    """Fusion by hooks equals timm's own forward_intermediates (raw block outputs with prefix tokens)."""
    kwargs = (("img_size", size), ("patch_size", patch), ("depth", 3), ("num_heads", 2), ("embed_dim", 32))
    enc = build_encoder(EncoderConfig(name, token=token, pretrained=False, model_kwargs=kwargs)).load("cpu")
    images = _images(4, size, seed=2)
    got = encode_numpy(enc, images)
    model = enc.model
    x = _normalized(images, enc.mean, enc.std)
    with torch.no_grad():
        inter = model.forward_intermediates(x, return_prefix_tokens=True, norm=False, output_fmt="NLC",
                                            intermediates_only=True)
        toks = [prefix[:, 0] if token == "cls" else spatial.mean(dim=1) for spatial, prefix in inter]
        final_norm = model.norm if not isinstance(model.norm, torch.nn.Identity) else model.fc_norm
        want = final_norm(torch.stack(toks).mean(dim=0)).numpy()
    assert enc.n_blocks == 3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_checkpoint_weights_are_loaded_from_safetensors_and_pth(tiny_vit_checkpoint, tmp_path):
    from safetensors.torch import load_file

    enc = build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu")
    state = load_file(str(tiny_vit_checkpoint))
    torch.testing.assert_close(enc.model.blocks[1].mlp.fc1.weight, state["blocks.1.mlp.fc1.weight"])
    pth = tmp_path / "tiny.pth"
    torch.save({"state_dict": state}, pth)  # a training checkpoint wrapping the state dict
    enc_pth = build_encoder(_tiny(pth)).load("cpu")
    images = _images(3)
    np.testing.assert_array_equal(encode_numpy(enc, images), encode_numpy(enc_pth, images))
    prov = enc.provenance()
    assert prov["name"] == "vit_tiny_patch16_224" and prov["requested"] == TINY_VIT  # the architecture, not a tag
    assert prov["model_kwargs"] == dict(TINY_VIT_KWARGS)
    assert prov["weights"]["source"] == "checkpoint"
    assert prov["weights"]["sha256"] == hashlib.sha256(tiny_vit_checkpoint.read_bytes()).hexdigest()
    assert prov["fusion"] == "mean-cls" and prov["token"] == "cls" and prov["image_size"] == 32
    assert prov["timm_version"] and prov["normalize"] is True


def test_checkpoint_errors(tiny_vit_checkpoint, tmp_path):
    with pytest.raises(FoalPipeError, match="does not exist"):
        build_encoder(_tiny(tmp_path / "missing.safetensors"))
    (tmp_path / "w.txt").write_text("x")
    with pytest.raises(FoalPipeError, match="suffix"):
        build_encoder(_tiny(tmp_path / "w.txt"))
    wrong = EncoderConfig(TINY_VIT, checkpoint=str(tiny_vit_checkpoint), image_size=32)  # depth 12, dim 192
    with pytest.raises(FoalPipeError, match="does not fit"):
        build_encoder(wrong).load("cpu")


@pytest.mark.slow  # builds a timm ViT
def test_unknown_model_and_models_without_blocks():
    with pytest.raises(FoalPipeError, match="unknown model 'vit_bse_patch16_224'.*did you mean"):
        build_encoder(EncoderConfig("vit_bse_patch16_224"))
    with pytest.raises(FoalPipeError, match="no transformer blocks"):
        build_encoder(EncoderConfig("resnet18", pretrained=False))
    with pytest.raises(FoalPipeError, match="no CLS token; use token='mean'"):
        build_encoder(EncoderConfig("vit_base_patch16_siglip_224", pretrained=False))
    with pytest.raises(FoalPipeError, match="fusion"):
        EncoderConfig("pixels", fusion="sum")
    with pytest.raises(FoalPipeError, match="unknown token 'avg'"):
        EncoderConfig("pixels", token="avg")


def test_pixels_encoder_flattens_normalized_pixels():
    images = _images(4, 8)
    enc = build_encoder(EncoderConfig("pixels"), native_size=8).load("cpu")
    assert isinstance(enc, PixelsEncoder) and ENCODERS["pixels"] is PixelsEncoder
    assert enc.image_size == 8 and enc.dim == 192
    want = (images.astype(np.float32) / 255.0 - 0.5) / 0.5
    np.testing.assert_allclose(encode_numpy(enc, images), want.reshape(4, -1), rtol=1e-6, atol=1e-6)
    raw = build_encoder(EncoderConfig("pixels", normalize=False, image_size=16)).load("cpu")
    assert raw.image_size == 16 and raw.dim == 768
    np.testing.assert_allclose(encode_numpy(raw, _images(2, 16)), _images(2, 16).reshape(2, -1) / 255.0, atol=1e-6)
    assert build_encoder(EncoderConfig("pixels")).image_size == 32  # no native size known: 32
    assert enc.provenance()["name"] == "pixels" and enc.provenance()["weights"] == {"source": "none"}


def test_pixels_encoder_is_numpy_and_equals_the_torch_computation_bit_for_bit():
    """The NumPy pixels encoder gives the very float32 values the torch preprocessing gave (stores unchanged)."""
    images = _images(5, 8, seed=3)
    enc = build_encoder(EncoderConfig("pixels"), native_size=8).load("cpu")
    got = enc.encode(images)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    x = torch.from_numpy(images).float().div_(255.0).sub_(0.5).div_(0.5)
    assert got.tobytes() == x.reshape(5, -1).numpy().tobytes()
    assert enc.encode(torch.from_numpy(images)).tobytes() == got.tobytes()  # a DataLoader's tensors too


@pytest.mark.parametrize("option", [{"checkpoint": "w.safetensors"}, {"model_kwargs": (("depth", 2),)}])
def test_pixels_refuses_weights_and_architecture_options(option):
    with pytest.raises(FoalPipeError, match="model='pixels' has no weights or architecture"):
        build_encoder(EncoderConfig("pixels", **option))


def test_same_images_twice_give_the_same_bytes(tiny_vit_checkpoint):
    """Two encoders loaded separately, and the same encoder called twice, give byte-identical features."""
    images = _images(8, seed=4)
    first = build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu")
    second = build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu")
    a, b, c = first.encode(images), second.encode(images), first.encode(images)
    assert a.tobytes() == b.tobytes() == c.tobytes()
    random_a = build_encoder(EncoderConfig(TINY_VIT, pretrained=False, model_kwargs=TINY_VIT_KWARGS)).load("cpu")
    torch.rand(3)  # the global RNG state does not decide the random init: it is seeded
    random_b = build_encoder(EncoderConfig(TINY_VIT, pretrained=False, model_kwargs=TINY_VIT_KWARGS)).load("cpu")
    assert random_a.encode(images).tobytes() == random_b.encode(images).tobytes()
    state = torch.get_rng_state()
    build_encoder(EncoderConfig(TINY_VIT, pretrained=False, model_kwargs=TINY_VIT_KWARGS)).load("cpu")
    assert torch.equal(torch.get_rng_state(), state)  # and the caller's RNG is left alone


def test_timm_preprocessing_uses_the_models_mean_std_unless_no_normalize(tiny_vit_checkpoint):
    enc = build_encoder(_tiny(tiny_vit_checkpoint))
    assert enc.mean == (0.5, 0.5, 0.5) and enc.interpolation == "bicubic"  # augreg ViT's pretrained_cfg
    clip = build_encoder(EncoderConfig("vit_base_patch16_clip_224.openai", pretrained=False))
    assert clip.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073)) and clip.image_size == 224
    white = torch.full((1, 3, 32, 32), 255, dtype=torch.uint8)
    ones, black = torch.ones(1, 3, 32, 32), torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    assert torch.allclose(enc.preprocess(white), ones)
    raw = build_encoder(_tiny(tiny_vit_checkpoint, normalize=False))
    assert torch.allclose(raw.preprocess(white), ones)
    assert torch.allclose(raw.preprocess(black), torch.zeros(1, 3, 32, 32))
    assert torch.allclose(enc.preprocess(black), -ones)
    assert torch.allclose(enc.preprocess(white[..., :2, :2]), ones)  # other sizes are resized to the model's


def test_bf16_autocast_on_cpu_is_close_to_fp32(tiny_vit_checkpoint):
    images = _images(4)
    fp32 = encode_numpy(build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu", "fp32"), images)
    bf16 = encode_numpy(build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu", "bf16"), images)
    assert bf16.dtype == np.float32
    np.testing.assert_allclose(bf16, fp32, atol=0.15)
    assert not np.array_equal(bf16, fp32)


def test_a_dropped_encoder_frees_its_model_without_the_cycle_collector(tiny_vit_checkpoint):
    """No reference cycle through the block hooks: the weights (on a GPU, gigabytes) go when the encoder goes,
    not whenever Python's cycle collector next runs (``run_extract`` twice in one process held two models)."""
    import gc
    import weakref

    enc = build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu")
    encode_numpy(enc, _images(2))
    model = weakref.ref(enc.model)
    gc.disable()
    try:
        del enc
        assert model() is None
    finally:
        gc.enable()


def test_a_dropped_fusion_removes_its_hooks(tiny_vit_checkpoint):
    from foal_pipe.encoders.fusion import BlockFusion

    enc = build_encoder(_tiny(tiny_vit_checkpoint)).load("cpu")
    blocks = enc.model.blocks
    assert all(len(b._forward_hooks) == 1 for b in blocks)
    extra = BlockFusion(enc.model, "last", "cls", enc.model.num_prefix_tokens, "extra")
    assert all(len(b._forward_hooks) == 2 for b in blocks)
    with extra.detached():
        assert all(len(b._forward_hooks) == 1 for b in blocks)
    del extra
    assert all(len(b._forward_hooks) == 1 for b in blocks)
    encode_numpy(enc, _images(2))  # the encoder's own hooks still work


def test_a_misspelt_pixels_suggests_pixels_not_a_timm_model():
    """`--model pixel` used to suggest mixnet_l; the built-in encoder is the one meant."""
    from foal_pipe.encoders.vit import _unknown_model_message

    message = _unknown_model_message("pixel")
    assert "(did you mean pixels?)" in message and "mixnet" not in message
    assert "did you mean vit_base_patch16_224" in _unknown_model_message("vit_bse_patch16_224")
