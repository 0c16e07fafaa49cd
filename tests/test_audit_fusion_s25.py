"""Audit of block fusions end to end (session 25): a fused model applied to image files, and evaluate's pairing of a
run with a ``sweep --fusions``. Each expectation is computed from the stored blocks with NumPy (the docs'
definition: float32 tokens summed in block order, divided once, LayerNorm in float64 unless --no-fusion-norm) or
taken from the rule the single-fusion sweep already follows; none is compared with the current output."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import KWARGS_4, TINY_VIT, blocks_store, make_image_tree
from safetensors.numpy import load_file
from typer.testing import CliRunner

from foal_pipe.cli import app

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()


def _ok(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def _one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    text = result.output.strip()
    assert text.startswith("Error: ") and "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text
    return text


# ---------------------------------------------------------------------------------------------------------------
# A fused model applied to image files (predict --images, DeployedModel.predict_images)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_blocks(tmp_path_factory, vit4_checkpoint) -> tuple[Path, Path, Path]:
    """Image tree (4 classes, 12 train / 6 test images each) and its --keep-blocks store, blocks in float32 (so
    that the store's fused rows equal the images' to ~1e-6)."""
    from foal_pipe.encoders import format_model_kwargs

    root = tmp_path_factory.mktemp("fusion-images")
    images = make_image_tree(root / "imgs", {"ant": 12, "bee": 12, "cat": 12, "dog": 12}, test_per_class=6, seed=1)
    store = root / "img.zarr"
    _ok("extract", "--dataset", "imagefolder", "--data-dir", images, "--model", TINY_VIT, "--model-kwargs",
        format_model_kwargs(KWARGS_4), "--checkpoint", vit4_checkpoint, "--out", store, "--workers", "0",
        "--device", "cpu", "--keep-blocks", "--blocks-dtype", "float32")
    return images, store, vit4_checkpoint


def _fused_test_rows(store: Path, first: int, last: int, norm: bool) -> np.ndarray:
    """The docs' mean:first-last of the test split from the stored blocks, the final LayerNorm only if ``norm``."""
    group = zarr.open_group(str(store), mode="r")
    tokens = np.asarray(group["test/blocks"][:]).astype(np.float32)
    total = tokens[:, first - 1].copy()
    for k in range(first, last):
        total = total + tokens[:, k]
    x = (total / np.float32(last - first + 1)).astype(np.float64)
    if norm:
        eps = dict(group.attrs)["blocks"]["norm"]["eps"]
        w, b = (np.asarray(group[f"norm/{k}"][:]).astype(np.float64) for k in ("weight", "bias"))
        x = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps) * w + b
    return x.astype(np.float32)


def test_predict_images_of_a_no_fusion_norm_model_skips_the_norm_as_it_learned(image_blocks, tmp_path):
    """`learn --fusion last --no-fusion-norm`, then `predict --images`: the images are fused from their block tokens
    without the final norm, as the model learned (build_recorded_encoder reads the model's final_norm), so the scores
    are those of the model's own features, the store's last block as stored (or a one-line refusal)."""
    images, store, checkpoint = image_blocks
    run = tmp_path / "run"
    _ok("learn", "--features", store, "--out", run, "--tasks", "2", "--projection-dim", "16", "--gamma", "0.1",
        "--fusion", "last", "--no-fusion-norm")
    model = run / "model.safetensors"
    result = runner.invoke(app, ["predict", "--model", str(model), "--checkpoint", str(checkpoint), "--images",
                                 str(images / "test"), "--out", str(tmp_path / "p.csv")])
    if result.exit_code != 0:  # a refusal is acceptable, if it is one line naming the route that works
        _one_line_error(result, "--features")
        return
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    tensors = load_file(str(model))
    H = 1 / (1 + np.exp(-(_fused_test_rows(store, 4, 4, norm=False).astype(np.float64) @ tensors["projection"])))
    scores = H @ tensors["W"]  # the test split is written in the image tree's order (class folder, file name)
    got = np.array([float(r["score"]) for r in rows])
    np.testing.assert_allclose(got, scores.max(axis=1), atol=1e-5)


def test_predict_images_of_a_concat_model_is_not_told_to_extract_and_learn_again(image_blocks, tmp_path):
    """A `learn --fusion concat:2-3` model with `predict --images`: the images are predicted with the concat fusion
    of their block tokens (each block's token through the norm, side by side), as the model learned, not refused
    with extract's message; a refusal would be one line naming the route that works (predict --features)."""
    images, store, checkpoint = image_blocks
    run = tmp_path / "run"
    _ok("learn", "--features", store, "--out", run, "--tasks", "2", "--projection-dim", "16", "--gamma", "0.1",
        "--fusion", "concat:2-3")
    result = runner.invoke(app, ["predict", "--model", str(run / "model.safetensors"), "--checkpoint",
                                 str(checkpoint), "--images", str(images / "test"), "--out", str(tmp_path / "p.csv")])
    if result.exit_code == 0:
        tensors = load_file(str(run / "model.safetensors"))
        rows = np.concatenate([_fused_test_rows(store, k, k, True) for k in (2, 3)], axis=1).astype(np.float64)
        scores = (1 / (1 + np.exp(-(rows @ tensors["projection"])))) @ tensors["W"]
        got = np.array([float(r["score"]) for r in csv.DictReader((tmp_path / "p.csv").open())])
        np.testing.assert_allclose(got, scores.max(axis=1), atol=1e-5)
        return
    text = _one_line_error(result, "--features")
    assert "then learn or sweep" not in text and "extract with" not in text, text
    assert not (tmp_path / "p.csv").exists()


# ---------------------------------------------------------------------------------------------------------------
# evaluate: a `sweep --fusions` is the run's only if it swept the run's features (norm and blocks included)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fused_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fusion-eval")
    store = blocks_store(root / "b.zarr")
    common = ("--tasks", "2", "--projection-dim", "24")
    out = {"store": store}
    for name, extra in {"last": ("--fusion", "last"), "last-nn": ("--fusion", "last", "--no-fusion-norm")}.items():
        out[name] = root / name
        _ok("learn", "--features", store, "--out", out[name], *common, *extra)
    for name, extra in {"sweep": (), "sweep-nn": ("--no-fusion-norm",)}.items():
        out[name] = root / name
        _ok("sweep", "--features", store, "--out", out[name], *common, "--gammas", "0.1,1,10",
            "--fusions", "mean-cls,last", *extra)
    return out


@pytest.mark.parametrize(("run", "sweep", "named"), [("last-nn", "sweep", "norm"), ("last", "sweep-nn", "norm")],
                         ids=["run-no-norm-sweep-norm", "run-norm-sweep-no-norm"])
def test_evaluate_refuses_a_fusions_sweep_of_other_features(fused_runs, tmp_path, run, sweep, named):
    """Was a fault: evaluate --sweep took a `sweep --fusions` whose fusion name matches the run's but whose features
    do not (report/discovery.py:_other_data skipped every FUSION_KEY for a --fusions sweep and checked only the name):
    a --no-fusion-norm run was shown beside the normed sweep's rows as its own fusion's (and vice versa). Now the
    sweep's fusion_norm must match the run's final norm. A
    single-fusion `sweep --fusion last` of the same mismatch is refused ("its encoder's final_norm is ...");
    docs/evaluate.md: a sweep is the run's only if it swept the run's features."""
    result = runner.invoke(app, ["evaluate", "--run", str(fused_runs[run]), "--sweep",
                                 str(fused_runs[sweep] / "sweep.json"), "--out", str(tmp_path / "ev")])
    _one_line_error(result, "swept other features")
    assert named in result.output
    assert not (tmp_path / "ev").exists()


def test_a_single_fusion_sweep_of_the_other_norm_is_refused_already(fused_runs, tmp_path):
    """The rule the --fusions case should follow (passes now; the reference for the test above)."""
    one = tmp_path / "one"
    _ok("sweep", "--features", fused_runs["store"], "--out", one, "--tasks", "2", "--projection-dim", "24",
        "--gammas", "0.1,1,10", "--fusion", "last")
    result = runner.invoke(app, ["evaluate", "--run", str(fused_runs["last-nn"]), "--sweep", str(one / "sweep.json"),
                                 "--out", str(tmp_path / "ev")])
    _one_line_error(result, "swept other features", "final_norm")


def test_evaluate_summary_names_a_no_fusion_norm_run_as_such(fused_runs, tmp_path):
    """Was a naming fault: summary.md's settings line of a `learn --fusion last --no-fusion-norm` run read
    '(fusion last, image_size 0, ...)', the same as a normed run, where `foal-pipe summary` labels it 'last, no norm'.
    The header now says the norm was skipped (report/markdown.py, describe), as `summary` does."""
    _ok("evaluate", "--run", fused_runs["last-nn"], "--out", tmp_path / "ev")
    header = next(line for line in (tmp_path / "ev" / "summary.md").read_text().splitlines() if "fusion last" in line)
    assert "no norm" in header or "no-fusion-norm" in header or "not applied" in header, header
    _ok("evaluate", "--run", fused_runs["last"], "--out", tmp_path / "ev2")
    normed = (tmp_path / "ev2" / "summary.md").read_text()
    assert "no norm" not in normed and "not applied" not in normed
    metrics = json.loads((fused_runs["last-nn"] / "metrics.json").read_text())
    assert metrics["encoder"]["final_norm"].startswith("not applied")
