"""Randomized audit of fusion specs: parsing (random valid spellings and invalid ones), the equivalences the
docs imply (mean:K-K, concat:K-K and block:K; the last block and ``last``; every block and ``mean-cls``), the
canonical spec in metrics.json, sweep.json and the model, and ``predict`` / ``learn --init-model`` re-applying
a fused model's fusion -- each checked against rows fused by hand from the stored blocks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store
from foal_pipe.store.blockfusion import FinalNorm, parse_fusion, parse_fusions

runner = CliRunner()
L, d, EPS, N_TRAIN, N_TEST, GAMMA, D = 4, 6, 1e-5, 48, 24, 0.5, "20"


def _norm() -> FinalNorm:
    rng = np.random.default_rng(11)
    return FinalNorm("layernorm", EPS, rng.uniform(0.5, 1.5, d).astype(np.float32), rng.normal(size=d).astype(np.float32))


def _store(path: Path, seed: int, dtype: str) -> tuple[Path, dict[str, np.ndarray]]:
    """A 4-block store of 3 classes written directly, blocks in ``dtype``; its ``features`` are any (n, d) rows."""
    rng = np.random.default_rng(seed)
    data = {}
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        y = np.arange(n) % 3
        data[split] = (rng.normal(size=(n, L, d)) + y[:, None, None]).astype(dtype)
        data[split + "_y"] = y
    feats = {s: data[s].astype(np.float32).mean(axis=1) for s in ("train", "test")}
    write_store(path, (feats["train"], data["train_y"]), (feats["test"], data["test_y"]), ["a", "b", "c"], chunk_rows=16,
                blocks=(data["train"], data["test"]), norm=_norm())
    return path, data


@pytest.fixture(scope="module", params=["float32", "float16"])
def stores(request, tmp_path_factory) -> tuple[tuple[Path, dict], tuple[Path, dict]]:
    """Two stores of the same encoder and norm (the second: new rows, for ``--init-model``)."""
    root = tmp_path_factory.mktemp(f"fz-{request.param}")
    return _store(root / "a.zarr", 1, request.param), _store(root / "b.zarr", 2, request.param)


def by_hand(tokens: np.ndarray, first: int, last: int, concat: bool, norm: bool) -> np.ndarray:
    """The docs' definition: float32 tokens of blocks first..last (1-based) summed in block order and divided once
    (or set side by side), each result LayerNormed in float64."""
    t = tokens.astype(np.float32)
    w, b = _norm().weight.astype(np.float64), _norm().bias.astype(np.float64)

    def ln(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        if not norm:
            return x
        c = x - x.mean(axis=1, keepdims=True)
        return c / np.sqrt((c**2).mean(axis=1, keepdims=True) + EPS) * w + b

    if concat:
        return np.concatenate([ln(t[:, k]) for k in range(first - 1, last)], axis=1)
    total = t[:, first - 1].copy()
    for k in range(first, last):
        total += t[:, k]
    return ln(total / np.float32(last - first + 1))


def _blocks_of(spec: str) -> tuple[int, int, bool]:
    fusion = parse_fusion(spec)
    return fusion.first or L, fusion.last or L, fusion.concat


def _respell(spec: str, rng: np.random.Generator) -> str:
    """An equivalent spelling of a canonical spec: random case, leading zeros, spaces around the parts."""
    out = "".join(c.upper() if rng.random() < 0.5 else c for c in spec)
    out = "".join(f"{'0' * int(rng.integers(0, 3))}{c}" if c.isdigit() and (i == 0 or not out[i - 1].isdigit()) else c
                  for i, c in enumerate(out))
    pad = " " * int(rng.integers(0, 3))
    return pad + out.replace(":", pad + ":" + pad).replace("-", pad + "-" + pad) + pad if "-cls" not in spec.lower() \
        else pad + out + pad


def _random_valid(rng: np.random.Generator, n_blocks: int = L) -> str:
    kind = rng.choice(["mean-cls", "last", "mean", "block", "concat"])
    a, b = sorted(rng.integers(1, n_blocks + 1, size=2))
    return {"mean-cls": "mean-cls", "last": "last", "mean": f"mean:{a}-{b}", "block": f"block:{a}",
            "concat": f"concat:{a}-{b}"}[str(kind)]


# ---------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------
def test_random_respellings_parse_to_the_canonical_spec():
    rng = np.random.default_rng(0)
    for _ in range(300):
        spec = _random_valid(rng, 24)
        spelled = _respell(spec, rng)
        fusion = parse_fusion(spelled, "--fusion")
        assert fusion.text == spec, (spelled, fusion.text)
        assert parse_fusion(fusion.text) == fusion


INVALID = ["", " ", ":", "foo", "mean", "mean:", "mean:2-1", "mean:0-2", "mean:1--2", "mean:-1-2", "mean:1-2-3",
           "mean:1_0-2", "block", "block:", "block:0", "block:-1", "block:+3", "block:1.0", "block:³", "block:1e3",
           "concat", "concat:1-", "concat:4-3", "last:", "last:4", "mean-cls:1", "mean:1-2,last", "mean:1-2;last",
           "mean-cls\x00", "blocks:1", "cls", "concat:0-0"]


@pytest.mark.parametrize("spec", INVALID)
def test_an_invalid_spec_is_one_line_naming_the_forms(spec):
    with pytest.raises(FoalPipeError) as info:
        parse_fusion(spec, "--fusion")
    message = str(info.value)
    assert "\n" not in message and "--fusion" in message and "mean:A-B" in message


@pytest.mark.parametrize("spec", ["mean:0-2", "block:-1", "mean:2-1", "foo", "", "last:4", "block:5", "mean:3-9",
                                  "concat:2-7", "block:99999999999999999999"])
def test_learn_refuses_a_bad_fusion_in_one_line_and_writes_nothing(stores, tmp_path, spec):
    (path, _), _ = stores
    out = tmp_path / "x"
    result = runner.invoke(app, ["learn", "--features", str(path), "--out", str(out), "--tasks", "3", "--fusion", spec])
    assert result.exit_code in (1, 2) and not isinstance(result.exception, (ValueError, TypeError)), result.output
    assert result.output.startswith("Error: ") and result.output.strip().count("\n") == 0, result.output
    assert ("starts at block" in result.output or "needs block" in result.output or "not a block number" in result.output
            or "numbered from 1" in result.output or "unknown --fusion" in result.output or "takes no" in result.output
            or "past any model's blocks" in result.output)
    assert not out.exists()


def test_a_block_number_too_long_for_int_is_refused_in_one_line(stores, tmp_path):
    (path, _), _ = stores
    spec = "block:" + "9" * 5000
    result = runner.invoke(app, ["learn", "--features", str(path), "--out", str(tmp_path / "x"), "--tasks", "3",
                                 "--fusion", spec])
    assert result.exit_code in (1, 2) and result.output.startswith("Error: "), result.output
    assert len(result.output.strip().splitlines()) == 1 and len(result.output) < 400, result.output
    with pytest.raises(FoalPipeError):
        parse_fusion(spec, "--fusion")


@pytest.mark.parametrize("digit", ["\uff11", "\u0663"])  # fullwidth 1, Arabic-Indic 3: Python's int reads them
def test_a_block_number_in_other_scripts_digits_is_refused(digit):
    with pytest.raises(FoalPipeError, match="is not a block number"):
        parse_fusion(f"block:{digit}", "--fusion")


@pytest.mark.parametrize(("specs", "message"), [
    ("LAST,last", "--fusions lists last twice"),
    ("mean:01-2, MEAN:1-2", "--fusions lists mean:1-2 twice"),
    ("last,block:4", "--fusions lists last and block:4, the same features"),
    ("mean:3-3,block:3", "--fusions lists mean:3-3 and block:3, the same features"),
    ("concat:2-2,block:2", "--fusions lists concat:2-2 and block:2, the same features"),
    ("mean-cls,mean:1-4", "--fusions lists mean-cls and mean:1-4, the same features"),
    ("last,,mean:1-2", "has an empty item between commas"),
    (",", "--fusions names no fusion"),
    ("last,foo", "unknown --fusions 'foo'"),
    ("block:5,last", "fusion 'block:5' needs block 5 but there are 4 blocks"),
])
def test_sweep_fusions_lists_that_repeat_or_break_are_refused_in_one_line(stores, tmp_path, specs, message):
    (path, _), _ = stores
    out = tmp_path / "x"
    result = runner.invoke(app, ["sweep", "--features", str(path), "--out", str(out), "--tasks", "3", "--fusions", specs])
    assert result.exit_code in (1, 2) and message in result.output, result.output
    assert result.output.startswith("Error: ") and result.output.strip().count("\n") == 0
    assert not out.exists()


def test_repeats_are_found_after_canonicalising():
    with pytest.raises(FoalPipeError, match="lists concat:1-2 twice"):
        parse_fusions([" Concat:1-2", "concat:001-2"], "--fusions")


# ---------------------------------------------------------------------------------------------------------
# Results: equivalent fusions, hand-fused rows, sweep against learn
# ---------------------------------------------------------------------------------------------------------
def _learn(path: Path, out: Path, *extra: str) -> tuple[dict, np.ndarray, bytes]:
    result = runner.invoke(app, ["learn", "--features", str(path), "--out", str(out), "--tasks", "3",
                                 "--projection-dim", D, "--gamma", str(GAMMA), *extra])
    assert result.exit_code == 0, result.output
    model = foal_pipe.load_model(out / "model.safetensors")
    return json.loads((out / "metrics.json").read_text()), model.classifier.weights_, (out / "metrics.json").read_bytes()


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "no-norm"])
def test_equivalent_fusions_give_the_same_model_and_the_ridge_of_the_hand_fused_rows(stores, tmp_path, norm):
    (path, data), _ = stores
    flag = () if norm else ("--no-fusion-norm",)
    k = int(np.random.default_rng(3).integers(1, L + 1))
    groups = [[f"block:{k}", f"mean:{k}-{k}", f"concat:{k}-{k}"], [f"block:{L}", "last", f"mean:{L}-{L}"],
              [f"mean:1-{L}", "mean-cls"]]
    for g, group in enumerate(groups):
        runs = [_learn(path, tmp_path / f"{g}-{i}", "--fusion", spec, *flag) for i, spec in enumerate(group)]
        for (metrics, weights, _), spec in zip(runs, group):
            np.testing.assert_array_equal(weights, runs[0][1], err_msg=f"{spec} against {group[0]}")
            assert metrics["accuracy_matrix"] == runs[0][0]["accuracy_matrix"]
            assert metrics["encoder"]["fusion"] == spec
        model = foal_pipe.load_model(tmp_path / f"{g}-0" / "model.safetensors")
        H = model.projection.transform(by_hand(data["train"], *_blocks_of(group[0]), norm))
        W = np.linalg.solve(H.T @ H + GAMMA * np.eye(H.shape[1]), H.T @ np.eye(3)[data["train_y"]])
        np.testing.assert_allclose(runs[0][1], W, atol=1e-6)  # the fused features are float32 (rounded)


def test_respelled_specs_write_the_same_bytes(stores, tmp_path):
    (path, _), _ = stores
    rng = np.random.default_rng(5)
    for i in range(4):
        spec = _random_valid(rng)
        _, wa, a = _learn(path, tmp_path / f"a{i}", "--fusion", spec)
        _, wb, b = _learn(path, tmp_path / f"b{i}", "--fusion", _respell(spec, rng))
        assert a.replace(str(tmp_path / f"a{i}").encode(), b"OUT") == b.replace(str(tmp_path / f"b{i}").encode(), b"OUT")
        np.testing.assert_array_equal(wa, wb)
        assert (tmp_path / f"a{i}" / "model.safetensors").read_bytes() == (tmp_path / f"b{i}" / "model.safetensors").read_bytes()


def _sweep(path: Path, out: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["sweep", "--features", str(path), "--out", str(out), "--tasks", "3",
                                 "--projection-dim", D, "--gammas", "0.01,0.5,30", *extra])
    assert result.exit_code == 0, result.output
    return json.loads((out / "sweep.json").read_text())


def _sweep_matches_learns(path: Path, tmp_path: Path, specs: list[str], flag: tuple[str, ...]) -> None:
    both = _sweep(path, tmp_path / "all", "--fusions", ",".join(specs), *flag)
    assert [e["fusion"] for e in both["fusions"]] == specs and both["fusion_norm"] is not bool(flag)
    for entry in both["fusions"]:
        for scored in entry["results"]:
            gamma = scored["gamma"]
            run = tmp_path / f"{entry['fusion'].replace(':', '')}-{gamma}"
            result = runner.invoke(app, ["learn", "--features", str(path), "--out", str(run), "--tasks", "3",
                                         "--projection-dim", D, "--gamma", repr(gamma), "--fusion", entry["fusion"], *flag])
            assert result.exit_code == 0, result.output
            metrics = json.loads((run / "metrics.json").read_text())
            assert {k: metrics[k] for k in ("A_avg", "A_last", "F", "accuracy_matrix")} == \
                   {k: scored[k] for k in ("A_avg", "A_last", "F", "accuracy_matrix")}, (entry["fusion"], gamma)


def test_sweep_fusions_equal_separate_learns(stores, tmp_path):
    (path, _), _ = stores
    _sweep_matches_learns(path, tmp_path, ["last", "mean:2-3"], ())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_random_sweep_fusions_equal_separate_learns(stores, tmp_path, seed):
    (path, _), _ = stores
    rng = np.random.default_rng(seed)
    concat = bool(seed % 2)
    width = int(rng.integers(2, 4))
    if concat:
        specs = [f"concat:{a}-{a + width - 1}" for a in sorted(rng.choice(L - width + 1, 2, replace=False) + 1)]
    else:
        specs = ["mean-cls", f"block:{int(rng.integers(1, L))}", "mean:2-4"]
    _sweep_matches_learns(path, tmp_path, specs, ("--no-fusion-norm",) if rng.random() < 0.5 else ())


def test_respelled_sweep_fusions_write_the_same_sweep_json(stores, tmp_path):
    (path, _), _ = stores
    a = _sweep(path, tmp_path / "a", "--fusions", "last,mean:1-2")
    b = _sweep(path, tmp_path / "b", "--fusions", " LAST , Mean: 01 -2 ")
    assert json.dumps(a) == json.dumps(b)
    one = _sweep(path, tmp_path / "c", "--fusion", " Concat:03-4", "--no-fusion-norm")
    assert (one["encoder"]["fusion"], one["encoder"]["final_norm"]) == ("concat:3-4", "not applied (--no-fusion-norm)")


# ---------------------------------------------------------------------------------------------------------
# A fused model applied again: predict and learn --init-model
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "norm"), [("last", True), ("concat:2-3", True), ("mean:2-4", False), ("block:1", True)])
def test_predict_and_init_model_apply_the_models_fusion(stores, tmp_path, spec, norm):
    (path_a, data_a), (path_b, data_b) = stores
    flag = () if norm else ("--no-fusion-norm",)
    _learn(path_a, tmp_path / "m", "--fusion", spec, *flag)
    model_path = tmp_path / "m" / "model.safetensors"
    model = foal_pipe.load_model(model_path)
    result = runner.invoke(app, ["predict", "--model", str(model_path), "--features", str(path_b), "--out",
                                 str(tmp_path / "p.csv")])
    assert result.exit_code == 0, result.output
    got = [int(row["predicted_class"]) for row in csv.DictReader((tmp_path / "p.csv").open())]
    scores = model.projection.transform(by_hand(data_b["test"], *_blocks_of(spec), norm)) @ model.classifier.weights_
    margin = np.sort(scores, axis=1)
    assert (margin[:, -1] - margin[:, -2] > 1e-6).all()  # no near-tie: the argmax is decided by the fusion alone
    assert got == np.argmax(scores, axis=1).tolist()
    for i, again in enumerate([(), ("--fusion", _respell(spec, np.random.default_rng(len(spec))), *flag)]):
        out = tmp_path / f"c{i}"
        result = runner.invoke(app, ["learn", "--features", str(path_b), "--out", str(out), "--tasks", "3",
                                     "--init-model", str(model_path), *again])
        assert result.exit_code == 0, result.output
        continued = foal_pipe.load_model(out / "model.safetensors")
        rows = np.concatenate([by_hand(data["train"], *_blocks_of(spec), norm) for data in (data_a, data_b)])
        H = continued.projection.transform(rows)
        Y = np.eye(3)[np.concatenate([data_a["train_y"], data_b["train_y"]])]
        W = np.linalg.solve(H.T @ H + GAMMA * np.eye(H.shape[1]), H.T @ Y)
        np.testing.assert_allclose(continued.classifier.weights_, W, atol=1e-6)
        encoder = json.loads((out / "metrics.json").read_text())["encoder"]
        assert encoder["fusion"] == spec and encoder["final_norm"].startswith("applied") is norm
    other = "mean-cls" if spec != "mean-cls" else "last"
    for wrong in [("--fusion", other, *flag), ("--no-fusion-norm",) if norm else ("--fusion", spec)]:
        result = runner.invoke(app, ["learn", "--features", str(path_b), "--out", str(tmp_path / "w"), "--tasks", "3",
                                     "--init-model", str(model_path), *wrong])
        assert result.exit_code == 1, result.output
        if wrong == ("--fusion", spec):  # the model's own spec, without its --no-fusion-norm: the norm is named
            assert "applies the final norm, which the model's fusion" in result.output, result.output
            assert "or add --no-fusion-norm" in result.output, result.output
        else:
            assert "conflicts with the model's fusion" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / "w").exists()
