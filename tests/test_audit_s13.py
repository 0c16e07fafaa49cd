"""Faults found by auditing the float32 screen of ridge's test scoring and the shared lazy solve of the heads."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import blocks_store, build_store, held_in_threads, invoke

from foal_pipe.core.scoring import ModelScores, Rows
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.state import export_head
from foal_pipe.model.headestimator import FeCAMClassifier, head_classifier
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.ondemand import SolvesOnDemand

D = 64


def _overflowing() -> tuple[np.ndarray, np.ndarray]:
    """A row and two classes' weights, every entry finite in float32: class 0 scores 6.4e14; class 1's exact score,
    5e37, is the largest, but its float32 partial sums pass -3.4e38 (32 terms of -1e38 before the positive ones)."""
    h = np.full((1, D), 1.0e19)
    W = np.zeros((D, 2))
    W[:, 0] = 1e-6
    W[:32, 1], W[32:, 1] = -1.0e19, 1.0e19
    W[-1, 1] += 0.5e19
    return h, W


@pytest.mark.parametrize("unseen", [False, True])
def test_a_float32_score_that_overflows_is_scored_in_float64(unseen):
    """A rival whose float32 sums overflowed to -inf was taken as far below the top score and the row decided
    without float64 (the argmax 0 where the float64 scores rank class 1 first; with the unseen classes' zeros, both
    seen classes at -inf gave the first unseen column): the argmax is now the float64 product's."""
    h, W = _overflowing()
    if unseen:
        W[:, 0] = W[:, 1]
        W[-1, 0] -= 1.0e19  # class 0's exact score -5e37: only class 1 beats the unseen classes' 0
    with np.errstate(over="ignore", invalid="ignore"):
        low = h.astype(np.float32) @ W.astype(np.float32)
    if np.isfinite(low).all():
        pytest.skip("this BLAS sums the float32 product in an order that does not overflow")
    exact = np.zeros((1, 3)) if unseen else np.zeros((1, 2))
    exact[:, :2] = h @ W
    models = ModelScores(W, 1, np.array([0, 1]), 3) if unseen else ModelScores(W, 1)
    assert models.low is not None  # the float32 screen is in use
    with np.errstate(over="ignore", invalid="ignore"):
        got = models.argmax(Rows.of(h))
    assert got.tolist() == [[int(np.argmax(exact))]] == [[1]]


def _refused_at_once(monkeypatch, read, want, threads: int = 4) -> None:
    """``read()`` in ``threads`` threads at once after a call whose solve is refused: one thread solves (under the
    estimator's lock), is refused and restores; the others read the model it restored (before the lock, all solved at
    once and all but one raised a bare AssertionError)."""
    out, restores = held_in_threads(monkeypatch, SolvesOnDemand, "_restore", read, threads)
    refused = [o for o in out if isinstance(o, FoalPipeError)]
    assert len(refused) == restores == 1, out
    assert str(refused[0]).endswith("the rows of its last partial_fit call are undone"), out
    assert all(isinstance(o, np.ndarray) and np.array_equal(o, want) for o in out if o is not refused[0]), out


def _bad_call(est):
    est.partial_fit(np.ones((3, 3)), [5, 5, 5])  # class 5 has no variance: the solve is refused


def test_readers_refused_at_once_each_get_the_refusal_estimator(monkeypatch):
    """Readers at once after a call whose solve is refused: before, the first restored and the others raised a bare
    AssertionError; now one gets the one-line refusal, the others the last solved model it is back at."""
    r = np.random.default_rng(0)
    X, y = r.normal(size=(6, 3)), [0, 0, 1, 1, 2, 2]
    est = FeCAMClassifier(shrinkage=0.0).fit(X, y)
    want = est.predict(X)
    _bad_call(est)
    _refused_at_once(monkeypatch, lambda: est.predict(X), want)
    assert "_undo" not in vars(est) and np.array_equal(est.predict(X), want)


def test_readers_refused_at_once_each_get_the_refusal_head_file(monkeypatch):
    """The same for a head's model file (HeadClassifier, as DeployedModel holds it)."""
    r = np.random.default_rng(0)
    X, y = r.normal(size=(6, 3)), [0, 0, 1, 1, 2, 2]
    est = FeCAMClassifier(shrinkage=0.0).fit(X, y)
    model = HeadClassifier("fecam", {"shrinkage": 0.0}, export_head("fecam", est._head, est._solve()), 6)
    want = model.predict(X)
    model.partial_fit(np.ones((3, 3)), np.array([5, 5, 5]))
    _refused_at_once(monkeypatch, lambda: model.predict(X), want)
    assert model._undo is None and np.array_equal(model.predict(X), want)


def _separable(tmp_path) -> Path:
    """Classes far apart: every gamma and every head scores every test row right, so every choice is a tie."""
    return build_store(tmp_path / "sep.zarr", n_train=240, n_test=96, noise=0.01, n_classes=4)


def _sweep(store: Path, out: Path, *extra: str) -> dict:
    result = invoke("sweep", "--features", str(store), "--tasks", "2", "--projection-dim", "24", "--loo-sample", "0",
                    "--out", str(out), *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "sweep.json").read_text())


def test_sweep_choices_at_ties_do_not_follow_the_order_of_gammas(tmp_path):
    """Every gamma scores 100%: the test oracle and a choice by test took the first gamma as listed (0.01 for
    0.01,1,100 and 100 for 100,1,0.01); both now take the smallest, as the criteria's ties do."""
    store = _separable(tmp_path)
    runs = [_sweep(store, tmp_path / f"s{k}", "--select", "test", "--gammas", gammas)
            for k, gammas in enumerate(("0.01,1,100", "100,1,0.01"))]
    assert all({r["A_last"] for r in run["results"]} == {1.0} for run in runs)
    assert [(run["best_gamma"], run["best_gamma_test"]) for run in runs] == [(0.01, 0.01)] * 2


def test_sweep_best_head_at_ties_does_not_follow_the_order_of_heads(tmp_path):
    """Every head scores 100% (and ridge and ncm their leave-one-out too): best_head and best_head_test took the
    first of --heads (ridge / ridge, then ncm / slda for slda,ncm,ridge); both now take the registry's first."""
    store = _separable(tmp_path)
    runs = [_sweep(store, tmp_path / f"h{k}", "--gammas", "1", "--heads", heads)
            for k, heads in enumerate(("ridge,ncm,slda", "slda,ncm,ridge"))]
    assert all({h["A_avg"] for h in run["heads"].values()} == {1.0} for run in runs)
    assert [(run["best_head"], run["best_head_test"]) for run in runs] == [("ridge", "ridge")] * 2


def test_dual_refuses_rows_its_recursion_overflows_in_one_line_without_numpy_warnings():
    """Rows of magnitude 1e150 at gamma 1e-12: dual's Woodbury products overflow; the call is refused in one line,
    as before, but NumPy's overflow and invalid-value warnings no longer come first."""
    X, y = np.random.default_rng(0).normal(size=(40, 6)) * 1e150, np.arange(40) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FoalPipeError, match="gamma"):
            head_classifier("dual", gamma=1e-12).partial_fit(X, y)


@pytest.mark.parametrize("leaf", ["features", "labels"])
def test_resuming_a_store_with_a_group_where_an_array_belongs_is_refused_in_one_line(tmp_path, leaf):
    """An interrupted store whose train/features was replaced by a group: the resume stopped with an IndexError's
    traceback; it is now refused as a damaged store, naming the path (train/labels was refused already, as not
    listed by the store's metadata)."""
    import zarr
    from test_extract_audit2 import _begun, _cli, _refused, _spec, _tree

    spec = _spec(_tree(tmp_path / "data"), tmp_path / "s.zarr")
    path = _begun(spec, "train", 8)
    group = zarr.open_group(str(path), mode="a")
    del group[f"train/{leaf}"]
    group.create_group(f"train/{leaf}")
    problem = "train/features is a group, not an array" if leaf == "features" else "train/labels: not listed"
    _refused(_cli(spec), "is damaged", problem, "--overwrite")


def test_a_class_name_with_a_line_break_keeps_summary_tables_whole(tmp_path):
    """A class named 'line\\none' split the per-class table's row (and the classes-per-task line) in two in
    summary.md; a line break in a name is now shown as a space."""
    store = build_store(tmp_path / "s.zarr", n_train=120, n_test=60, n_classes=4,
                        attrs={"classes": ["line\none", "b", "c", "d"]})
    run, out = tmp_path / "run", tmp_path / "ev"
    assert invoke("learn", "--features", str(store), "--out", str(run), "--projection-dim", "20", "--tasks", "2").exit_code == 0
    result = invoke("evaluate", "--run", str(run), "--out", str(out), "--model", str(run / "model.safetensors"), "--no-plots")
    assert result.exit_code == 0, result.output
    text = (out / "summary.md").read_text()
    assert "line one" in text and not any(line.startswith("one") for line in text.splitlines())
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows and all(line.rstrip().endswith("|") for line in rows)


def test_predict_says_how_many_rows_are_of_classes_the_model_has_not_learned(tmp_path):
    """5 classes in 2 tasks with --drop-remainder: the dropped class's test rows can never be predicted right, and
    predict's accuracy counted them as wrong without a word; the line now says how many and the accuracy on the
    others, both recomputed here from the CSV."""
    store = build_store(tmp_path / "s.zarr", n_train=200, n_test=100, n_classes=5)
    run = tmp_path / "run"
    assert invoke("learn", "--features", str(store), "--out", str(run), "--projection-dim", "20", "--tasks", "2",
                  "--drop-remainder").exit_code == 0
    dropped = json.loads((run / "metrics.json").read_text())["dropped_classes"]
    assert len(dropped) == 1
    result = invoke("predict", "--model", str(run / "model.safetensors"), "--features", str(store),
                    "--out", str(tmp_path / "p.csv"))
    assert result.exit_code == 0, result.output
    rows = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1, usecols=(1, 4), dtype=np.int64)
    predicted, true = rows[:, 0], rows[:, 1]
    other = ~np.isin(true, dropped)
    want = (f"{true.size} rows, accuracy {100 * np.mean(predicted == true):.2f}% on test ({int((~other).sum())} rows of "
            f"classes the model has not learned count as wrong; {100 * np.mean((predicted == true)[other]):.2f}% on "
            f"the other {int(other.sum())})")
    assert want in " ".join(result.output.split())


def test_table_tex_escapes_every_special_character_of_a_store_label():
    """A store named 'open{brace^x' gave table.tex an unbalanced brace and a '^' outside math; a blank line in a
    name ended the paragraph inside \\multicolumn. Every LaTeX special character is now text, a line break a space."""
    from foal_pipe.report.resultstable import _tex_escape

    got = _tex_escape("open{brace^x~y}\n\nlines\r\\par_&%#$<>|")
    assert got == (r"open\{brace\textasciicircum{}x\textasciitilde{}y\}  lines \textbackslash{}par\_\&\%\#\$"
                   r"\textless{}\textgreater{}\textbar{}")
    unescaped = got.replace(r"\{", "").replace(r"\}", "").replace("{}", "")
    assert "{" not in unescaped and "}" not in unescaped and "\n" not in got and "\r" not in got


def test_markdown_names_escape_ampersand_and_dollar():
    """'x&lt;' rendered as 'x<' and 'a$x$b' as maths in GitHub's Markdown: both are escaped now."""
    from foal_pipe.report.markdown import md

    assert md("x&lt;") == r"x\&lt;" and md("a$x$b") == r"a\$x\$b"


def test_anytime_evaluation_refused_for_a_class_without_test_rows_names_dropping_it(tmp_path):
    """One test row and one task: learn scores it, but --eval-every scores every class seen and is refused; the
    refusal named only the store's test labels, though the run works without --eval-every."""
    store = build_store(tmp_path / "s.zarr", n_train=120, n_test=1, n_classes=4)
    common = ("learn", "--features", str(store), "--projection-dim", "10", "--tasks", "1")
    assert invoke(*common, "--out", str(tmp_path / "plain")).exit_code == 0
    result = invoke(*common, "--out", str(tmp_path / "any"), "--eval-every", "7")
    assert result.exit_code == 1 and "has no test rows" in result.output
    assert "or drop --eval-every" in " ".join(result.output.split())


@pytest.mark.parametrize("key", ["best_gamma", "best_gamma_test"])
def test_a_fusion_entry_without_its_own_choice_is_refused_in_one_line(tmp_path, key):
    """A sweep.json of `sweep --fusions` whose fusions[0] lost its own choice was read, and evaluate then stopped on
    an assertion (a traceback); the reader now refuses it in one line, naming the entry and the key."""
    from foal_pipe.report.readers import read_sweep

    blocks = blocks_store(tmp_path / "b.zarr")
    result = invoke("sweep", "--features", blocks, "--out", tmp_path / "sw", "--fusions", "last,mean-cls", "--gammas",
                    "0.1,1", "--tasks", "2", "--projection-dim", "16")
    assert result.exit_code == 0, result.output
    path = tmp_path / "sw" / "sweep.json"
    assert read_sweep(path).fusions is not None  # as written: read
    sweep = json.loads(path.read_text())
    del sweep["fusions"][0][key]
    path.write_text(json.dumps(sweep))
    with pytest.raises(FoalPipeError, match=rf"fusions\[0\] should record '{key}', one of its gammas"):
        read_sweep(path)

