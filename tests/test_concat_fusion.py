"""``concat:A-B``: blocks A to B side by side (each token through the final norm), fused when reading a blocks
store; ``learn --fusion`` and ``sweep --fusions`` on it equal their closed forms and separate runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe
from foal_pipe.cli import app
from foal_pipe.encoders.config import EncoderConfig
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, write_store
from foal_pipe.store.blockfusion import FinalNorm, parse_fusion

runner = CliRunner()
N_TRAIN, N_TEST, L, d, EPS = 90, 30, 4, 6, 1e-5


@pytest.fixture(scope="module")
def blocks(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], FinalNorm]:
    """A 4-block store of 3 classes written directly (no ViT), with a LayerNorm of random weight and bias."""
    rng = np.random.default_rng(0)
    norm = FinalNorm("layernorm", EPS, rng.uniform(0.5, 1.5, d).astype(np.float32), rng.normal(size=d).astype(np.float32))
    data = {}
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        y = np.arange(n) % 3
        data[split] = (rng.normal(size=(n, L, d)) + y[:, None, None]).astype(np.float32)
        data[split + "_y"] = y
    mean = {s: data[s].mean(axis=1) for s in ("train", "test")}  # the stored features: any (n, d) rows
    path = write_store(tmp_path_factory.mktemp("concat") / "b.zarr", (mean["train"], data["train_y"]),
                       (mean["test"], data["test_y"]), ["a", "b", "c"], chunk_rows=32,
                       blocks=(data["train"], data["test"]), norm=norm)
    return path, data, norm


def by_hand(tokens: np.ndarray, first: int, last: int, norm: FinalNorm | None) -> np.ndarray:
    """Blocks first..last (1-based) of every row, each LayerNormed in float64 on its own, side by side."""
    out = []
    for b in range(first - 1, last):
        t = tokens[:, b].astype(np.float64)
        if norm is not None:
            centred = t - t.mean(axis=1, keepdims=True)
            t = centred / np.sqrt((centred**2).mean(axis=1, keepdims=True) + EPS) * norm.weight + norm.bias
        out.append(t)
    return np.concatenate(out, axis=1)


def test_specs_parse_to_canonical_concat_fusions():
    fusion = parse_fusion("concat:03-4")
    assert (fusion.text, fusion.first, fusion.last, fusion.concat) == ("concat:3-4", 3, 4, True)
    assert fusion.width(12, 768) == 2 * 768 and parse_fusion("mean:3-4").width(12, 768) == 768
    with pytest.raises(FoalPipeError, match="--fusion concat:4-3 starts at block 4, after its last block 3; write concat:A-B"):
        parse_fusion("concat:4-3", "--fusion")
    with pytest.raises(FoalPipeError, match="--fusion concat needs a block range; write concat:A-B"):
        parse_fusion("concat", "--fusion")


def test_read_time_concat_equals_its_definition(blocks):
    path, data, norm = blocks
    for spec, (a, b) in {"concat:2-3": (2, 3), "concat:1-4": (1, 4), "concat:4-4": (4, 4)}.items():
        store = open_store(path, fusion=spec)
        assert store.dim == (b - a + 1) * d and store.test.features.shape == (N_TEST, (b - a + 1) * d)
        got = np.concatenate([x for _, x in store.train.iter_chunks()])
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, by_hand(data["train"], a, b, norm), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(store.train.take(np.array([70, 3, 3])), got[[70, 3, 3]])
    raw = open_store(path, fusion="concat:2-3", fusion_norm=False).test.read(0, N_TEST)
    np.testing.assert_array_equal(raw, by_hand(data["test"], 2, 3, None).astype(np.float32))
    assert open_store(path, fusion="concat:3-4").meta.encoder["fusion"] == "concat:3-4"


def _learn(store: Path, out: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", "3", *extra])
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def test_learn_with_concat_is_ridge_on_the_concatenated_tokens(blocks, tmp_path):
    """The final W is closed-form ridge on the hand-made concatenation, through the model's own projection."""
    path, data, norm = blocks
    metrics = _learn(path, tmp_path / "run", "--fusion", "concat:3-4", "--projection-dim", "40", "--gamma", "0.5")
    assert metrics["encoder"]["fusion"] == "concat:3-4" and metrics["feature_dim"] == 2 * d
    model = foal_pipe.load_model(tmp_path / "run" / "model.safetensors")
    assert model.classifier.n_samples_seen_ == N_TRAIN and model.projection.n_features_in_ == 2 * d
    H = model.projection.transform(by_hand(data["train"], 3, 4, norm))
    Y = np.eye(3)[data["train_y"]]
    W = np.linalg.solve(H.T @ H + 0.5 * np.eye(H.shape[1]), H.T @ Y)
    np.testing.assert_allclose(model.classifier.weights_, W, atol=1e-6)  # the features are float32 (rounded)
    fused = open_store(path, fusion="concat:3-4")
    test_rows = np.concatenate([x for _, x in fused.test.iter_chunks()])
    right = np.argmax(model.projection.transform(test_rows) @ model.classifier.weights_, axis=1) == data["test_y"]
    assert metrics["A_last"] == pytest.approx(float(right.mean()))


def test_learn_with_concat_equals_learn_on_a_store_of_those_features(blocks, tmp_path):
    path, _, _ = blocks
    fused = open_store(path, fusion="concat:2-4")
    rows = {s: np.concatenate([x for _, x in getattr(fused, s).iter_chunks()]) for s in ("train", "test")}
    plain = write_store(tmp_path / "plain.zarr", (rows["train"], fused.train.labels), (rows["test"], fused.test.labels),
                        list(fused.classes), encoder=fused.meta.encoder)
    a = _learn(path, tmp_path / "a", "--fusion", "concat:2-4", "--projection-dim", "30")
    b = _learn(plain, tmp_path / "b", "--projection-dim", "30")
    assert a["accuracy_matrix"] == b["accuracy_matrix"]
    wa = foal_pipe.load_model(tmp_path / "a" / "model.safetensors").classifier.weights_
    wb = foal_pipe.load_model(tmp_path / "b" / "model.safetensors").classifier.weights_
    np.testing.assert_allclose(wa, wb, rtol=1e-12, atol=1e-12)


def _sweep(store: Path, out: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["sweep", "--features", str(store), "--out", str(out), "--tasks", "3",
                                 "--projection-dim", "30", "--gammas", "0.01,1,100", *extra])
    assert result.exit_code == 0, result.output
    return json.loads((out / "sweep.json").read_text())


def test_sweep_fusions_of_concat_equal_separate_sweeps(blocks, tmp_path):
    path, _, _ = blocks
    specs = ("concat:1-2", "concat:3-4", "concat:2-3")
    both = _sweep(path, tmp_path / "all", "--fusions", ",".join(specs))
    assert [e["fusion"] for e in both["fusions"]] == list(specs)
    for i, spec in enumerate(specs):
        alone = _sweep(path, tmp_path / f"one{i}", "--fusion", spec)
        assert json.dumps(both["fusions"][i]["results"]) == json.dumps(alone["results"])


def test_sweep_fusions_of_different_widths_are_refused_in_one_line(blocks, tmp_path):
    path, _, _ = blocks
    result = runner.invoke(app, ["sweep", "--features", str(path), "--out", str(tmp_path / "x"), "--tasks", "3",
                                 "--fusions", "mean-cls,concat:3-4"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert ("--fusions mean-cls gives rows of 6 features and concat:3-4 of 12; one walk projects every fusion with one "
            "matrix, so list fusions of one width") in result.output
    assert "run concat:3-4 with --fusion concat:3-4" in result.output
    assert not (tmp_path / "x").exists()


def test_extract_refuses_concat_naming_the_read_time_route():
    with pytest.raises(FoalPipeError) as info:
        EncoderConfig(fusion="concat:11-12")
    assert "extract with keep_blocks=True, then learn or sweep with fusion='concat:11-12'" in str(info.value)
