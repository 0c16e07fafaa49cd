"""Extraction into feature stores: contents, resume after interruptions, settings checks, CLI and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import TINY_VIT, TINY_VIT_KWARGS, assert_identical_stores, interrupt_after, make_image_tree
from PIL import Image
from typer.testing import CliRunner

import foal_pipe.extract as ex
import foal_pipe.store as st
from foal_pipe.cli import app
from foal_pipe.datasets import open_dataset, to_rgb_array
from foal_pipe.encoders import EncoderConfig, build_encoder, encode_numpy
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, create_store, extract_rows, finish_store, run_extract
from foal_pipe.store import open_store, read_meta, write_store

REPO = Path(__file__).resolve().parents[1]
SUBPROCESS_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pixels(out: Path, **kw) -> ExtractSpec:
    base = dict(dataset="digits", model="pixels", out=str(out), chunk_rows=128, batch_size=50, workers=0,
                device="cpu")
    return ExtractSpec(**{**base, **kw})


def _vit(out: Path, checkpoint: Path, **kw) -> ExtractSpec:
    """The tiny 2-block ViT on digits (upsized to 32 px); batches of 48 do not divide the 128-row chunks."""
    base = dict(dataset="digits", model=TINY_VIT, checkpoint=str(checkpoint), model_kwargs=TINY_VIT_KWARGS,
                out=str(out), chunk_rows=128, batch_size=48, workers=0, device="cpu")
    return ExtractSpec(**{**base, **kw})


@pytest.fixture(scope="module")
def vit_reference(tmp_path_factory, tiny_vit_checkpoint) -> Path:
    """An uninterrupted tiny-ViT extraction of digits."""
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    run_extract(_vit(out, tiny_vit_checkpoint))
    return out


def test_pixels_store_holds_the_digits_in_dataset_order(tmp_path):
    spec = _pixels(tmp_path / "digits.zarr")
    report = run_extract(spec)
    assert report.status == "created" and report.rows == {"train": 1442, "test": 355} and report.dim == 192
    store = open_store(spec.out_path)
    data = open_dataset("digits")
    for split in ("train", "test"):
        src = data.split(split)
        images = np.stack([to_rgb_array(src.load(i), 8) for i in range(len(src))])
        want = ((images.astype(np.float32) / 255.0 - 0.5) / 0.5).reshape(len(src), -1)
        np.testing.assert_allclose(np.asarray(store.split(split).features[:]), want, atol=1e-6)
        np.testing.assert_array_equal(store.split(split).labels, src.labels)
        group = zarr.open_group(str(spec.out_path), mode="r")
        np.testing.assert_array_equal(group[f"{split}/index"][:], src.index)
        assert store.split(split).chunk_rows == 128
    meta = store.meta
    assert meta.complete and meta.dataset == "digits" and meta.classes == tuple(str(k) for k in range(10))
    assert meta.encoder["name"] == "pixels" and meta.encoder["image_size"] == 8
    assert meta.extra["progress"] == {"train": 1442, "test": 355}
    assert run_extract(spec).status == "complete"  # a second run has nothing to do


def test_vit_store_equals_encoding_images_directly(vit_reference, tiny_vit_checkpoint):
    store = open_store(vit_reference)
    enc = build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(tiny_vit_checkpoint), model_kwargs=TINY_VIT_KWARGS))
    enc.load("cpu")
    src = open_dataset("digits").test
    images = np.stack([to_rgb_array(src.load(i), 32, "bicubic") for i in range(40)])
    np.testing.assert_allclose(np.asarray(store.test.features[:40]), encode_numpy(enc, images), atol=1e-5)
    assert store.meta.encoder["name"] == "vit_tiny_patch16_224"  # a checkpoint: the architecture, not a hub tag
    assert store.meta.encoder["weights"]["source"] == "checkpoint"
    assert store.meta.encoder["precision"] == "fp32"


class Boom(Exception):
    pass


@pytest.mark.parametrize("fail_at", [0, 5, 13])  # before any chunk, mid train, in test (train has 12 chunks)
def test_resume_after_an_exception_gives_an_identical_store(tmp_path, monkeypatch, vit_reference, tiny_vit_checkpoint,
                                                             fail_at):
    spec = _vit(tmp_path / "digits.zarr", tiny_vit_checkpoint)
    real_write = interrupt_after(monkeypatch, fail_at, Boom)
    with pytest.raises(Boom):
        run_extract(spec)
    monkeypatch.setattr(st.FeatureWriter, "write", real_write)
    _, meta = read_meta(spec.out_path)
    assert not meta.complete
    expected = {"train": min(fail_at * 128, 1442), "test": max(0, fail_at - 12) * 128}
    assert meta.extra["progress"] == expected
    with pytest.raises(FoalPipeError, match="not complete"):
        open_store(spec.out_path)
    report = run_extract(spec)
    assert report.status == "resumed" and report.resumed_from == expected
    assert_identical_stores(vit_reference, spec.out_path)


KILLER = """
import json, os, signal, sys
import foal_pipe.extract.run as ex
fields = json.loads(sys.argv[1])
fields["model_kwargs"] = tuple(tuple(kv) for kv in fields["model_kwargs"])
real = ex.mark_progress
calls = []
def dying(path, split, rows):  # the 3rd chunk is on disk, its progress not yet recorded: SIGKILL now
    calls.append(rows)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    real(path, split, rows)
ex.mark_progress = dying
ex.run_extract(ex.ExtractSpec(**fields))
"""


def test_resume_after_sigkill_gives_an_identical_store(tmp_path, vit_reference, tiny_vit_checkpoint):
    spec = _vit(tmp_path / "digits.zarr", tiny_vit_checkpoint)
    proc = subprocess.run([sys.executable, "-c", KILLER, json.dumps(asdict(spec))], env=SUBPROCESS_ENV, capture_output=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    _, meta = read_meta(spec.out_path)
    assert meta.extra["progress"] == {"train": 256, "test": 0} and not meta.complete
    assert run_extract(spec).status == "resumed"
    assert_identical_stores(vit_reference, spec.out_path)


def test_distributed_style_out_of_order_ranges_give_the_same_store(tmp_path, vit_reference, tiny_vit_checkpoint):
    spec = _vit(tmp_path / "digits.zarr", tiny_vit_checkpoint)
    state = create_store(spec)
    assert state.status == "created" and state.progress == {"train": 0, "test": 0}
    for split in ("test", "train"):
        ranges = list(ex.chunk_ranges(state.rows[split], 256))  # two chunks per task, last one short
        for lo, hi in reversed(ranges):
            extract_rows(spec, split, lo, hi)
        ex.mark_progress(spec.out_path, split, state.rows[split])
    finish_store(state)
    assert_identical_stores(vit_reference, spec.out_path)
    with pytest.raises(FoalPipeError, match="not aligned"):
        extract_rows(spec, "train", 64, 128)


def test_interrupted_creation_leaves_nothing_at_out(tmp_path, monkeypatch):
    import foal_pipe.store.write as store_write

    spec = _pixels(tmp_path / "d.zarr")
    real = store_write.create_array

    def dies(group, name, *args):
        if name == "test/index":
            raise Boom
        return real(group, name, *args)

    monkeypatch.setattr(store_write, "create_array", dies)
    with pytest.raises(Boom):
        run_extract(spec)
    assert not spec.out_path.exists() and not (tmp_path / ".d.zarr.creating").exists()
    monkeypatch.setattr(store_write, "create_array", real)
    (tmp_path / ".d.zarr.creating").mkdir()  # as a SIGKILL during creation leaves it
    assert run_extract(spec).status == "created"
    assert not (tmp_path / ".d.zarr.creating").exists() and open_store(spec.out_path).meta.complete


def test_other_settings_are_refused_unless_overwrite(tmp_path, monkeypatch):
    spec = _pixels(tmp_path / "d.zarr")
    monkeypatch.setattr(st.FeatureWriter, "write", lambda *a: (_ for _ in ()).throw(Boom()))
    with pytest.raises(Boom):
        run_extract(spec)
    monkeypatch.undo()
    with pytest.raises(FoalPipeError, match=r"different settings \(dtype: 'float32' -> 'float16'\).*overwrite=True"):
        run_extract(replace(spec, dtype="float16"))
    with pytest.raises(FoalPipeError, match="encoder.image_size: 8 -> 16"):
        run_extract(replace(spec, image_size=16))
    with pytest.raises(FoalPipeError, match="chunk_rows: 128 -> 64"):
        run_extract(replace(spec, chunk_rows=64))
    report = run_extract(replace(spec, dtype="float16"), overwrite=True)
    assert report.status == "created"
    store = open_store(spec.out_path)
    assert store.train.features.dtype == np.float16 and store.meta.complete


def test_out_that_is_not_an_extracted_store_is_not_replaced(tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(FoalPipeError, match="is not a feature store; refusing to replace it"):
            run_extract(_pixels(other), overwrite=overwrite)
    assert (other / "keep.txt").read_text() == "mine"
    synthetic = write_store(tmp_path / "s.zarr", (np.zeros((2, 3)), np.zeros(2)), (np.zeros((1, 3)), np.zeros(1)), ["a"])
    with pytest.raises(FoalPipeError, match="not one written by `foal-pipe extract`"):
        run_extract(_pixels(synthetic))
    assert run_extract(_pixels(synthetic), overwrite=True).status == "created"
    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    assert run_extract(_pixels(empty)).status == "created"


def test_unreadable_image_stops_with_a_resumable_store(tmp_path, image_tree):
    bad = image_tree / "train" / "dog" / "img001.png"
    good = bad.read_bytes()
    bad.write_bytes(b"\x89PNG broken")
    spec = ExtractSpec(dataset="imagefolder", data_dir=str(image_tree), model="pixels", image_size=12,
                       out=str(tmp_path / "f.zarr"), chunk_rows=4, batch_size=3, workers=0, device="cpu")
    with pytest.raises(FoalPipeError, match=r"cannot read image .*train/dog/img001.png.*re-run the same command"):
        run_extract(spec)
    _, meta = read_meta(spec.out_path)
    assert meta.extra["progress"] == {"train": 4, "test": 0}  # rows 0-3 written; row 6 is the bad one
    bad.write_bytes(good)
    assert run_extract(spec).status == "resumed"
    fresh = run_extract(replace(spec, out=str(tmp_path / "g.zarr"), workers=2))  # worker processes give the same
    assert fresh.status == "created"
    assert_identical_stores(spec.out_path, tmp_path / "g.zarr")


def test_extraction_queues_batches_before_it_waits_for_them(tmp_path, monkeypatch):
    """Batch k's features are asked for only after batch k + BATCHES_AHEAD is queued (a GPU computes them while the
    host writes), in order, each once; the store is byte-identical to a batch-at-a-time run's."""
    from foal_pipe.encoders.pixels import PixelsEncoder
    from foal_pipe.extract.run import BATCHES_AHEAD

    run_extract(_pixels(tmp_path / "plain.zarr"))
    events: list[tuple[str, int]] = []
    queue_now = PixelsEncoder.submit

    def queued(self, images):
        k = sum(event == "queued" for event, _ in events)
        events.append(("queued", k))
        later = queue_now(self, images)

        def wait():
            events.append(("waited", k))
            return later()

        return wait

    monkeypatch.setattr(PixelsEncoder, "submit", queued)
    run_extract(_pixels(tmp_path / "ahead.zarr"))
    assert_identical_stores(tmp_path / "plain.zarr", tmp_path / "ahead.zarr")
    ahead = [("queued", k) for k in range(BATCHES_AHEAD + 1)]
    assert BATCHES_AHEAD >= 1 and events[: BATCHES_AHEAD + 3] == [*ahead, ("waited", 0), ("queued", BATCHES_AHEAD + 1)]
    waited = [k for event, k in events if event == "waited"]
    assert waited == list(range(len(waited))) == sorted({k for _, k in events})
    assert all(events.index(("queued", k)) < events.index(("waited", k)) for k in waited)


def test_float16_store(tmp_path, vit_reference, tiny_vit_checkpoint):
    spec = _vit(tmp_path / "h.zarr", tiny_vit_checkpoint, dtype="float16")
    run_extract(spec)
    half, full = open_store(spec.out_path), open_store(vit_reference)
    assert half.train.features.dtype == np.float16
    np.testing.assert_allclose(np.asarray(half.test.features[:]), np.asarray(full.test.features[:]), rtol=2e-3,
                               atol=2e-3)


# -- the command line -------------------------------------------------------------------------------------------
runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(app, list(args))


def test_cli_extract_and_info(tmp_path):
    out = tmp_path / "digits.zarr"
    result = _cli("extract", "--dataset", "digits", "--model", "pixels", "--out", str(out), "--workers", "0",
                  "--chunk-rows", "512")
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "train 1,442 x 192" in result.output
    again = _cli("extract", "--dataset", "digits", "--model", "pixels", "--out", str(out), "--workers", "0",
                 "--chunk-rows", "512")
    assert again.exit_code == 0 and "already complete" in again.output
    shown = _cli("info", str(out))
    assert shown.exit_code == 0, shown.output
    for text in ("complete", "yes", "1,442 x 192 float32", "pixels", "10: 0, 1, 2", "on disk"):
        assert text in shown.output
    as_json = _cli("info", str(out), "--json")
    summary = json.loads(as_json.stdout)
    assert summary["complete"] is True and summary["splits"]["test"]["rows"] == 355
    assert summary["encoder"]["name"] == "pixels" and summary["bytes_on_disk"] > 0


def test_cli_timm_checkpoint_on_an_imagefolder(tmp_path, image_tree, vit_tiny_32_checkpoint):
    out = tmp_path / "mine.zarr"
    result = _cli("extract", "--dataset", "imagefolder", "--data-dir", str(image_tree), "--model", TINY_VIT,
                  "--checkpoint", str(vit_tiny_32_checkpoint), "--image-size", "32", "--out", str(out),
                  "--workers", "0", "--fusion", "last", "--no-normalize")
    assert result.exit_code == 0, result.output
    store = open_store(out)
    assert store.train.n_rows == 15 and store.dim == 192 and store.classes == ("cat", "dog", "emu")
    enc = store.meta.encoder
    assert enc["fusion"] == "last" and enc["normalize"] is False and enc["image_size"] == 32
    assert enc["name"] == "vit_tiny_patch16_224" and enc["timm_version"]
    info = _cli("info", str(out))
    assert "sha256" in info.output and "fusion last" in info.output


def test_cli_incomplete_store_info(tmp_path, monkeypatch):
    spec = _pixels(tmp_path / "d.zarr")
    calls = []
    real = st.FeatureWriter.write

    def once(*args):
        if calls:
            raise Boom
        calls.append(1)
        real(*args)

    monkeypatch.setattr(st.FeatureWriter, "write", once)
    with pytest.raises(Boom):
        run_extract(spec)
    shown = _cli("info", str(spec.out_path))
    assert shown.exit_code == 0 and "no" in shown.output and "train 128/1,442" in shown.output


BAD_INPUTS = [
    (["--model", "vit_nope_patch16_224"], "unknown model 'vit_nope_patch16_224'"),
    (["--model", "resnet18"], "no transformer blocks"),
    (["--dataset", "imagefolder", "--data-dir", "{tmp}/missing"], "{tmp}/missing/train is not a folder"),
    (["--dataset", "cifar100", "--data-dir", "{tmp}"], "{tmp}/cifar-100-python"),
    (["--fusion", "max"], "unknown --fusion 'max'"),
    (["--chunk-rows", "0"], "--chunk-rows must be at least 1"),
    (["--checkpoint", "{tmp}/nope.safetensors", "--model", TINY_VIT], "does not exist"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS)
def test_cli_bad_input_is_one_clear_line(tmp_path, args, message):
    out = tmp_path / "x.zarr"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    defaults = ["--model", "pixels"] if "--model" not in args else []
    result = _cli("extract", *defaults, *args, "--out", str(out), "--workers", "0")
    assert result.exit_code == (2 if args[0] == "--fusion" else 1), result.output  # a spec that is none: a usage error
    text = result.output.strip()
    assert text.startswith("Error: ") and message.replace("{tmp}", str(tmp_path)) in text.replace("\n", "")
    assert "Traceback" not in text
    assert not out.exists()  # nothing was created


@pytest.mark.parametrize(("option", "value"), [("--dataset", "mnist"), ("--dtype", "float64"), ("--device", "tpu"),
                                             ("--precision", "int8"), ("--token", "max")])
def test_cli_values_outside_an_options_fixed_set_are_refused(tmp_path, option, value):
    """Options with a fixed set of values (listed in --help) refuse anything else before anything is created."""
    out = tmp_path / "x.zarr"
    result = _cli("extract", "--model", "pixels", option, value, "--out", str(out), "--workers", "0")
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_cli_info_on_a_store_written_by_other_code(tmp_path):
    store = write_store(tmp_path / "s.zarr", (np.zeros((4, 3)), np.zeros(4)), (np.zeros((2, 3)), np.zeros(2)), ["a"])
    shown = _cli("info", str(store))
    assert shown.exit_code == 0, shown.output
    assert "4 x 3 float32" in shown.output and "synthetic" in shown.output


def test_cli_cuda_without_cuda_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = _cli("extract", "--model", "pixels", "--device", "cuda", "--out", str(tmp_path / "c.zarr"))
    assert result.exit_code == 1 and "Error: --device cuda but CUDA is not available" in result.output


def test_cli_missing_weights_offline_leaves_no_store(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "w.zarr"
    result = _cli("extract", "--model", "vit_tiny_patch16_224.augreg_in21k_ft_in1k", "--image-size", "32", "--out",
                  str(out), "--workers", "0")
    assert result.exit_code == 1, result.output
    text = result.output.strip().replace("\n", "")
    assert text.startswith("Error: no weights for vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    assert "--checkpoint" in text and "HF_HUB_OFFLINE=1" in text
    assert not out.exists() and not (tmp_path / ".w.zarr.creating").exists()


def test_cli_settings_mismatch_and_unreadable_image(tmp_path, image_tree):
    (image_tree / "test" / "emu" / "img000.png").write_bytes(b"broken")
    out = tmp_path / "f.zarr"
    base = ["extract", "--dataset", "imagefolder", "--data-dir", str(image_tree), "--model", "pixels", "--out",
            str(out), "--workers", "0", "--chunk-rows", "4"]
    result = _cli(*base)
    assert result.exit_code == 1 and "Error: cannot read image" in result.output and "img000.png" in result.output
    mismatch = _cli(*base, "--image-size", "16")
    assert mismatch.exit_code == 1 and "different settings" in mismatch.output and "--overwrite" in mismatch.output
    missing = _cli("info", str(tmp_path / "nothing.zarr"))
    assert missing.exit_code == 1 and "Error:" in missing.output and "does not exist" in missing.output


def test_cli_test_split_of_a_folder_of_classes(tmp_path):
    folder = make_image_tree(tmp_path / "pets", {"cat": 6, "dog": 6, "emu": 4}, split=False)
    base = ["extract", "--dataset", "imagefolder", "--data-dir", str(folder), "--model", "pixels", "--image-size",
            "8", "--workers", "0", "--chunk-rows", "4", "--test-split", "0.25"]
    first = _cli(*base, "--out", str(tmp_path / "a.zarr"))
    assert first.exit_code == 0, first.output
    store = open_store(tmp_path / "a.zarr")
    assert (store.train.n_rows, store.test.n_rows) == (11, 5) and store.classes == ("cat", "dog", "emu")  # 2, 2, 1
    settings = read_meta(tmp_path / "a.zarr")[1].extra["extract"]
    assert settings["test_split"] == {"test_fraction": 0.25, "seed": 0}
    assert "test split drawn by extract --test-split 0.25 --split-seed 0" in _cli("info", str(tmp_path / "a.zarr")).output
    again = _cli(*base, "--split-seed", "0", "--out", str(tmp_path / "b.zarr"))
    assert again.exit_code == 0, again.output
    assert_identical_stores(tmp_path / "a.zarr", tmp_path / "b.zarr")  # same seed, same split, same bytes
    other = _cli(*base, "--split-seed", "3", "--out", str(tmp_path / "a.zarr"))  # another split: other settings
    assert other.exit_code == 1 and "different settings" in other.output and "--overwrite" in other.output


@pytest.mark.parametrize(("args", "message"), [
    (["--test-split", "0.2"], "already split into train/ and test/ folders; drop --test-split"),
    (["--test-split", "1"], "--test-split must be a fraction between 0 and 1"),
    (["--split-seed", "2"], "--split-seed draws the split of --test-split; pass --test-split FRACTION too"),
])
def test_cli_test_split_refusals(tmp_path, image_tree, args, message):
    out = tmp_path / "x.zarr"
    result = _cli("extract", "--dataset", "imagefolder", "--data-dir", str(image_tree), "--model", "pixels",
                  "--out", str(out), "--workers", "0", *args)
    assert result.exit_code == 1 and result.output.startswith("Error: "), result.output
    assert message in result.output.replace("\n", "") and "Traceback" not in result.output
    assert not out.exists()


def test_importing_the_cli_does_not_import_torch():
    code = "import sys, foal_pipe, foal_pipe.cli; assert not {'torch', 'timm', 'torchvision'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, env=SUBPROCESS_ENV, timeout=60)


def test_grayscale_and_small_images_become_rgb_squares():
    img = Image.fromarray(np.full((5, 7), 200, np.uint8))
    arr = to_rgb_array(img, 4)
    assert arr.shape == (3, 4, 4) and (arr == 200).all()


def test_docs_extraction_example_runs(tmp_path):
    section = (REPO / "docs" / "extract.md").read_text().split("\n## Extraction from Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = tmp_path / "digits.zarr"
    exec(code.replace("data/features/digits.zarr", str(out)).replace('model="pixels"', 'model="pixels", workers=0'), {})
    store = open_store(out)
    assert store.meta.complete and store.train.n_rows == 1442 and store.test.n_rows == 355
