"""Shared, generic fixtures: tiny random ViT checkpoints and small image trees (no network)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from helpers import KWARGS_4, TINY_VIT, TINY_VIT_KWARGS, make_image_tree  # noqa: E402  (helpers import foal_pipe)

#: Fixtures that build a timm ViT: a test using one (directly or through another fixture) is marked slow.
VIT_FIXTURES = frozenset({"tiny_vit_checkpoint", "vit_tiny_32_checkpoint", "vit4_checkpoint", "vit_reference"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if VIT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


#: What stages/_params.py pins in ``os.environ`` when imported (BLAS threads, CPU kernels), for the stage processes.
STAGE_PINS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "MKL_CBWR",
              "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "NPY_DISABLE_CPU_FEATURES")
SESSION_PINS = {name: os.environ.get(name) for name in STAGE_PINS}


@pytest.fixture(autouse=True)
def _stage_pins_stay_in_their_test() -> Iterator[None]:
    """A test importing a stage's ``_params`` pins the variables in this process, where they would outlive it: a later
    test's workers (loky's, Dask's) would load other kernels than this process did and differ in the last bits
    (``test_loky_workers_equal_one_process_on_one_blas_thread`` after ``test_orders.py``). Restored after each test."""
    yield
    for name, value in SESSION_PINS.items():
        if os.environ.get(name) != value:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Recorded checkpoint hashes go to a folder of this session's, not the user's cache (subprocesses inherit it)."""
    from foal_pipe.encoders.hashes import CACHE_VARIABLE

    before = os.environ.get(CACHE_VARIABLE)
    os.environ[CACHE_VARIABLE] = str(tmp_path_factory.mktemp("foal-pipe-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_VARIABLE, None)
    else:
        os.environ[CACHE_VARIABLE] = before


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


@pytest.fixture(scope="module")
def vit4_checkpoint(tmp_path_factory) -> Path:
    """A seeded random 4-block tiny ViT with non-trivial final-norm parameters, as safetensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(5)
    model = timm.create_model(TINY_VIT, pretrained=False, **dict(KWARGS_4))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
        model.cls_token.normal_(0, 1)
    path = tmp_path_factory.mktemp("ckpt4") / "vit4.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits as the `pixels` encoder stores them ([-1, 1]), every 5th image a test image (a test
    module's own ``digits`` fixture overrides it)."""
    import numpy as np
    from sklearn.datasets import load_digits

    from foal_pipe.store import write_store

    X, y = load_digits(return_X_y=True)
    test = np.arange(len(y)) % 5 == 4
    path = tmp_path_factory.mktemp("digits") / "digits.zarr"
    return write_store(path, (X[~test] / 8 - 1, y[~test]), (X[test] / 8 - 1, y[test]), [str(i) for i in range(10)],
                       chunk_rows=256)


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw, after they are saved (their layout done)."""
    from foal_pipe.report import plots

    drawn = []
    draw = plots.draw

    def keep(path, size, paint):
        def painted(fig):
            paint(fig)
            drawn.append(fig)
        return draw(path, size, painted)

    monkeypatch.setattr(plots, "draw", keep)
    return drawn


@pytest.fixture(scope="module")
def threads_cluster():
    """A cluster of one thread worker in this process (no worker processes to start)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                                  silence_logs=50) as c:
        yield c
