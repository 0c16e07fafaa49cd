"""Shared, generic fixtures: tiny random ViT checkpoints and small image trees (no network)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_VIT = "vit_tiny_patch16_224"
TINY_VIT_KWARGS = (("img_size", 32), ("patch_size", 8), ("depth", 2), ("num_heads", 2), ("embed_dim", 32))
"""A 2-block, 32-dim ViT on 32-pixel images: the architecture behind ``tiny_vit_checkpoint``."""


@pytest.fixture(scope="session")
def tiny_vit_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random tiny ViT (``TINY_VIT`` with ``TINY_VIT_KWARGS``, classifier head included) saved as
    safetensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(123)
    model = timm.create_model(TINY_VIT, pretrained=False, **dict(TINY_VIT_KWARGS))
    with torch.no_grad():  # non-trivial norms, so a wrong norm placement shows in the numbers
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
        model.cls_token.normal_(0, 1)
    path = tmp_path_factory.mktemp("ckpt") / "tiny_vit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="session")
def vit_tiny_32_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """timm's standard ``vit_tiny_patch16_224`` architecture at 32 px (so the CLI can build it from its name and
    ``--image-size 32``), seeded random weights, saved as safetensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(7)
    model = timm.create_model(TINY_VIT, pretrained=False, img_size=32)
    path = tmp_path_factory.mktemp("ckpt") / "vit_tiny_32.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def assert_one_line_error(result, *fragments: str) -> None:
    """A CLI result that failed with exit 1 and one ``Error: ...`` message holding every fragment, no traceback."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert text.startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in text, text


def make_image_tree(root: Path, classes: dict[str, int], test_per_class: int = 2, seed: int = 0) -> Path:
    """``root/train/<class>/*.png`` and ``root/test/<class>/*.png`` with random images of mixed sizes and
    modes (RGB, grayscale, RGBA, palette)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    modes = ["RGB", "L", "RGBA", "P"]
    for split, counts in (("train", classes), ("test", {c: test_per_class for c in classes})):
        for cls, count in counts.items():
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                h, w = int(rng.integers(12, 48)), int(rng.integers(12, 48))
                img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
                mode = modes[i % len(modes)]
                img = img.convert(mode) if mode != "P" else img.convert("P", palette=Image.Palette.ADAPTIVE)
                img.save(folder / f"img{i:03d}.png")
    return root


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """A small imagefolder dataset: 3 classes, 5 + 2 images each."""
    return make_image_tree(tmp_path / "images", {"cat": 5, "dog": 5, "emu": 5})


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread, and a busy shared machine makes multi-thread spin-waits crawl."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
