"""Audit of `foal-pipe extract` with tiny ViTs: a checkpoint value beyond the model's dtype, float16 overflow's
warnings and advice, a killed writer's lock kept by its loader's workers, the memory check's batch estimate,
options that did nothing, an image size the patches do not tile, and special files named like images; each was
a silent difference, a wrong hint or a lock held seconds too long."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import TINY_VIT, TINY_VIT_KWARGS, assert_clean_error, assert_identical_stores, invoke, make_image_tree

from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, writer_lock

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
VIT = ["--model", TINY_VIT, "--model-kwargs", ",".join(f"{k}={v}" for k, v in TINY_VIT_KWARGS), "--device", "cpu",
       "--workers", "0", "--chunk-rows", "4", "--batch-size", "4"]


@pytest.fixture(scope="module")
def state() -> dict:
    """The tiny test ViT's seeded random weights (no head)."""
    import timm
    import torch

    torch.manual_seed(11)
    model = timm.create_model(TINY_VIT, pretrained=False, num_classes=0, **dict(TINY_VIT_KWARGS))
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def _saved(path: Path, state: dict) -> Path:
    from safetensors.torch import save_file

    save_file(state, str(path))
    return path


# -- F1: values the model's dtype cannot hold ---------------------------------------------------------------------
def test_a_float64_value_beyond_float32_is_refused_by_its_key(tmp_path, state):
    """1e39 in a float64 checkpoint passed the finiteness check and became inf when cast to the float32 model; the
    run then stopped at row 0 with advice already in effect. It is refused when loading, by its key."""
    import torch

    big = state["norm.weight"].double().clone()
    big[0] = 1e39
    assert torch.isfinite(big).all() and not torch.isfinite(big.float()).all()  # what loading's cast does
    path = _saved(tmp_path / "big.safetensors", {**state, "norm.weight": big})
    tree = make_image_tree(tmp_path / "imgs", {"a": 2, "b": 2}, test_per_class=1)
    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, *VIT, "--checkpoint", path, "--out", out)
    assert_clean_error(result, f"--checkpoint {path} holds values beyond the range of the model's torch.float32 (inf "
                               "once cast) in norm.weight", out)
    fine = big.clone()
    fine[0] = 3.0  # a float64 value float32 holds is cast, as documented
    ok = invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, *VIT, "--checkpoint",
                _saved(tmp_path / "fine.safetensors", {**state, "norm.weight": fine}), "--out", out)
    assert ok.exit_code == 0, ok.output


def test_float16_overflow_is_refused_without_warnings_and_names_overwrite(tmp_path, state):
    """Features beyond float16's 65504 printed two numpy RuntimeWarnings before the error, and the advice
    (--dtype float32) was then refused as other settings of the store the run had begun, --overwrite unnamed."""
    tree = make_image_tree(tmp_path / "imgs", {"a": 3, "b": 3}, test_per_class=1)
    path = _saved(tmp_path / "loud.safetensors", {**state, "norm.weight": state["norm.weight"] * 1e5})
    out, fresh = tmp_path / "s.zarr", tmp_path / "fresh.zarr"
    base = ["extract", "--dataset", "imagefolder", "--data-dir", tree, *VIT, "--checkpoint", path]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = invoke(*base, "--dtype", "float16", "--out", out)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1 and "Traceback" not in result.output and "RuntimeWarning" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == ("Error: non-finite features at train row 0 (precision fp32, dtype float16); re-run with "
                         "--dtype float32 and --overwrite (the incomplete store has this run's settings)"), result.output
    assert "--precision fp32" not in lines[-1]  # in effect already: not advised
    again = invoke(*base, "--dtype", "float32", "--out", out, "--overwrite")  # the advice, followed
    assert again.exit_code == 0, again.output
    assert invoke(*base, "--dtype", "float32", "--out", fresh).exit_code == 0
    assert_identical_stores(out, fresh)
    features = np.asarray(open_store(out).split("train").features[:])
    assert np.isfinite(features).all() and np.abs(features).max() > np.finfo(np.float16).max  # why float16 failed


def test_non_finite_advice_names_only_settings_not_in_effect():
    from foal_pipe.extract.chunkfiller import _ChunkFiller

    filler = _ChunkFiller.__new__(_ChunkFiller)
    filler.precision = "bf16"
    assert "precision='fp32' or dtype='float32' and overwrite=True" in str(FoalPipeError(filler._fix("dtype", "float16")))
    assert "dtype" not in filler._fix("dtype", "float32")
    filler.precision = "fp32"
    at_full = str(FoalPipeError(filler._fix("blocks_dtype", "float32")))
    assert "precision=" not in at_full and "blocks_dtype=" not in at_full and "at full precision" in at_full


# -- F2: the writer's lock and its loader's workers ----------------------------------------------------------------
def _holders(lock: Path, pids: list[int]) -> list[int]:
    """The processes among ``pids`` with a descriptor open on ``lock``."""
    found = []
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(lock):
                    found.append(pid)
            except OSError:
                continue
    return found


def _children() -> list[int]:
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        pids += [int(p) for p in Path(f"/proc/self/task/{task}/children").read_text().split()]
    return pids


def _lock_is_held(lock: Path) -> bool:
    import fcntl

    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@LINUX
@pytest.mark.parametrize("needs_torch", [True, False])
def test_loader_workers_forked_under_the_writer_lock_do_not_hold_it(tmp_path, needs_torch):
    """DataLoader workers (and the pixels encoder's reader processes) are forked after the lock is taken: each
    held a copy, so a writer killed by SIGKILL left its lock held until torch's watchdog ended them (~5 s)."""
    from foal_pipe.datasets.sources import ArraySource, PreparedImages
    from foal_pipe.extract.loading import _load_batches

    pixels = np.arange(8 * 4 * 4 * 3, dtype=np.uint8).reshape(8, 4, 4, 3)
    images = PreparedImages(ArraySource(pixels, np.arange(8)), 4, "bilinear")
    inputs = SimpleNamespace(encoder=SimpleNamespace(needs_torch=needs_torch), workers=2, device="cpu")
    with writer_lock(tmp_path / "s.zarr") as lock:
        loaded = _load_batches(images, [[0, 1], [2, 3], [4, 5], [6, 7]], inputs)
        first = next(loaded)
        assert np.asarray(first[1]).tolist() == [0, 1]
        workers = _children()
        assert workers
        deadline = time.monotonic() + 3.0  # a worker closes its copy as it starts: one forked last may not have yet
        while _holders(lock, workers) and time.monotonic() < deadline:  # (the fault: held for the workers' life)
            time.sleep(0.05)
        assert _holders(lock, workers) == []
        assert _holders(lock, [os.getpid()]) == [os.getpid()] and _lock_is_held(lock)  # the writer's copy is kept
        rest = list(loaded)
    assert [np.asarray(batch[1]).tolist() for batch in rest] == [[2, 3], [4, 5], [6, 7]]


# -- F3: the memory check's batch ----------------------------------------------------------------------------------
def test_a_huge_batch_size_is_bounded_by_the_chunk(tmp_path, monkeypatch):
    """Batches never straddle chunks, yet --batch-size 1e9 was estimated as 1e9 rows (119 GiB, refused with a hint
    naming --image-size and --chunk-rows only)."""
    big, plain = tmp_path / "big.zarr", tmp_path / "plain.zarr"
    base = ["extract", "--model", "pixels", "--chunk-rows", "256", "--workers", "0"]
    assert invoke(*base, "--batch-size", "1000000000", "--out", big).exit_code == 0
    assert invoke(*base, "--out", plain).exit_code == 0
    assert_identical_stores(big, plain)
    import foal_pipe.memory as memory

    monkeypatch.setattr(memory, "available_memory", lambda: 1)
    out = tmp_path / "none.zarr"
    refused = invoke(*base[:4], "4096", "--workers", "0", "--batch-size", "1000000", "--out", out)
    batch = 1442 * 192 * 4  # digits' train split is the largest, one chunk of it, 192 float32 values a row
    assert_clean_error(refused, f"one batch of features {memory.human(batch)}", out)
    assert "choose a smaller --image-size (features of 192 values a row), --chunk-rows or --batch-size" in refused.output
    small = invoke(*base, "--out", out)
    assert_clean_error(small, "choose a smaller --image-size (features of 192 values a row) or --chunk-rows", out)


# -- F4: options that do nothing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--fusion", "block:7"], "--model pixels has no transformer blocks or tokens, so --fusion block:7 does not apply; "
                              "drop --fusion or choose a timm ViT --model"),
    (["--token", "mean"], "so --token mean does not apply; drop --token"),
    (["--blocks-dtype", "float32"], "--blocks-dtype acts only with --keep-blocks and would be ignored here"),
])
def test_options_pixels_or_a_plain_store_ignore_are_refused(tmp_path, extra, message):
    out = tmp_path / "p.zarr"
    assert_clean_error(invoke("extract", "--model", "pixels", "--workers", "0", *extra, "--out", out), message, out)


def test_default_fusion_and_token_stay_accepted_with_pixels(tmp_path):
    """The DVC stage names --fusion and --token whatever the model: their defaults change nothing, so pass."""
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    assert invoke("extract", "--model", "pixels", "--workers", "0", "--fusion", "mean-cls", "--token", "cls",
                  "--out", a).exit_code == 0
    assert invoke("extract", "--model", "pixels", "--workers", "0", "--out", b).exit_code == 0
    assert_identical_stores(a, b)


def test_blocks_dtype_without_keep_blocks_is_refused_for_a_vit(tmp_path, state):
    out = tmp_path / "v.zarr"
    checkpoint = _saved(tmp_path / "w.safetensors", state)
    tree = make_image_tree(tmp_path / "imgs", {"a": 2, "b": 2}, test_per_class=1)
    assert_clean_error(invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, *VIT, "--checkpoint", checkpoint,
                              "--blocks-dtype", "float32", "--out", out),
                       "drop --blocks-dtype or add --keep-blocks", out)


# -- F5: patches that do not tile the image ---------------------------------------------------------------------------
def test_an_image_size_the_patches_do_not_tile_is_refused(tmp_path):
    """--image-size 30 with 8-pixel patches built a 3 x 3 grid: the last 6 pixels of each row and column never
    reached the model, in silence."""
    import timm

    kwargs = {k: v for k, v in TINY_VIT_KWARGS if k != "img_size"}
    model = timm.create_model(TINY_VIT, img_size=30, num_classes=0, **kwargs)
    assert model.patch_embed.grid_size[0] * 8 == 24 < 30  # what timm builds: 6 pixels left out
    checkpoint = _saved(tmp_path / "w30.safetensors", {k: v.contiguous() for k, v in model.state_dict().items()})
    out = tmp_path / "v.zarr"
    tree = make_image_tree(tmp_path / "imgs", {"a": 2, "b": 2}, test_per_class=1)
    base = ["extract", "--dataset", "imagefolder", "--data-dir", tree, "--model", TINY_VIT,
            "--model-kwargs", ",".join(f"{k}={v}" for k, v in kwargs.items()),
            "--checkpoint", checkpoint, "--device", "cpu", "--workers", "0", "--out", out]
    assert_clean_error(invoke(*base, "--image-size", "30"),
                       f"--image-size 30 is not a multiple of the patch size 8 of {TINY_VIT}: the last 6 pixels of each "
                       "row and column would never reach the model; use --image-size 24 or --image-size 32", out)


# -- F6: special files named like images ------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_named_pipe_or_device_named_like_an_image_is_refused(tmp_path, kind):
    tree = make_image_tree(tmp_path / "imgs", {"cat": 2, "dog": 2}, test_per_class=1)
    entry = tree / "train" / "cat" / "odd.png"
    if kind == "fifo":
        os.mkfifo(entry)
        what = "a named pipe (FIFO)"
    else:
        entry.symlink_to(os.devnull)
        what = f"a symbolic link to {os.devnull}, a device"
    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, "--model", "pixels", "--workers", "0",
                    "--out", out)
    assert_clean_error(result, f"{entry} is named like an image but is {what}, not a file", out)


def test_a_folder_named_like_an_image_is_searched_as_a_folder(tmp_path):
    from foal_pipe.datasets.loaders import load_imagefolder

    tree = make_image_tree(tmp_path / "imgs", {"cat": 2, "dog": 2}, test_per_class=1)
    (tree / "train" / "cat" / "x.png").mkdir()
    (tree / "train" / "cat" / "img000.png").rename(tree / "train" / "cat" / "x.png" / "inner.png")
    paths = load_imagefolder(tree, False).train.paths
    assert str(tree / "train" / "cat" / "x.png" / "inner.png") in paths and len(paths) == 4
