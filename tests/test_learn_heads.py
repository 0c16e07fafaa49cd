"""``learn --head`` and ``sweep --heads`` end to end: every accuracy matrix equals the heads' definitions written
plainly (tests/helpers.py) at every task boundary, sweep's heads equal learn's, ridge's outputs are unchanged, and
what a head cannot take is refused in one line before any work."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import assert_clean_error, build_store, invoke, read, ref_fecam, ref_ncm, ref_ncm_loo, ref_slda, written_copy

from foal_pipe import memory
from foal_pipe.errors import FoalPipeError

REFERENCES = {
    ("ncm",): ref_ncm,
    ("slda",): ref_slda,
    ("slda", "--shrinkage", "oas"): lambda X, y, T: ref_slda(X, y, T, "oas"),
    ("slda", "--shrinkage", "0.25"): lambda X, y, T: ref_slda(X, y, T, 0.25),
    ("fecam",): ref_fecam,
    ("fecam", "--shrinkage", "0.5", "--shrinkage-offdiag", "0.3"): lambda X, y, T: ref_fecam(X, y, T, 0.5, 0.3),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("heads") / "blobs.zarr")


def reference_matrix(store, tasks, reference):
    """acc[i][j]: the definition fitted on the train rows of tasks 1..i, argmax over those classes, on task j's test
    rows."""
    x, y, xt, yt = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    matrix = []
    for i in range(len(tasks)):
        seen = np.concatenate(tasks[: i + 1])
        train = np.isin(y, seen)
        test = np.isin(yt, seen)
        classes, scores = reference(x[train], y[train], xt[test])
        top2 = np.sort(scores, axis=1)[:, -2:]
        assert ((top2[:, 1] - top2[:, 0]) > 1e-9 * np.abs(scores).max()).all(), "a near-tie: pick another seed"
        hit = classes[scores.argmax(axis=1)] == yt[test]
        matrix.append([float(hit[np.isin(yt[test], tasks[j])].mean()) for j in range(i + 1)])
    return matrix


@pytest.mark.parametrize("args", list(REFERENCES), ids=" ".join)
def test_learn_head_equals_its_definition_at_every_boundary(store, tmp_path, args):
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--head", *args, "--tasks", 4,
                    "--seed", 2, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    expected = reference_matrix(store, metrics["tasks"], REFERENCES[args])
    assert metrics["accuracy_matrix"] == expected
    assert metrics["head"] == args[0] and metrics["n_tasks"] == 4
    defaults = {"ncm": {}, "slda": {"shrinkage": 1e-4}, "fecam": {"shrinkage": 1.0, "shrinkage_offdiag": 0.0}}
    given = dict(zip([a.lstrip("-").replace("-", "_") for a in args[1::2]], args[2::2], strict=True))
    options = {**defaults[args[0]], **{k: v if v == "oas" else float(v) for k, v in given.items()}}
    assert metrics["head_options"] == options


def test_learn_head_ridge_is_todays_learner_byte_for_byte(store, tmp_path):
    base = ["--features", store, "--tasks", 4, "--projection-dim", 32, "--seed", 2, "--backend", "numpy"]
    for out, extra in (("plain", []), ("ridge", ["--head", "ridge"])):
        assert invoke("learn", *base, "--out", tmp_path / out, *extra).exit_code == 0
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "ridge" / name).read_bytes()


def test_sweep_heads_equal_learn_and_keep_the_gamma_sweep(store, tmp_path):
    base = ["--features", store, "--tasks", 4, "--seed", 2, "--backend", "numpy"]
    sweep = ["sweep", *base, "--projection-dim", 32, "--gammas", "0.1,1,10"]
    assert invoke(*sweep, "--out", tmp_path / "plain").exit_code == 0
    result = invoke(*sweep, "--out", tmp_path / "heads", "--heads", "ridge,ncm,slda,fecam", "--shrinkage", "0.25")
    assert result.exit_code == 0, result.output
    plain = json.loads((tmp_path / "plain" / "sweep.json").read_text())
    report = json.loads((tmp_path / "heads" / "sweep.json").read_text())
    added = {"heads", "best_head", "best_head_selected_by", "best_head_test"}
    assert {k: v for k, v in report.items() if k not in added} == plain
    heads = report["heads"]
    assert sorted(heads) == ["fecam", "ncm", "ridge", "slda"]  # written with sorted keys
    # the rows each ran on: the store's features for the features heads, though --projection-dim is typed (ridge's)
    assert {n: h["rows"] for n, h in heads.items()} == {"ridge": "activations", "ncm": "features", "slda": "features",
                                                         "fecam": "features"}
    chosen = next(r for r in plain["results"] if r["gamma"] == plain["best_gamma"])
    assert heads["ridge"]["accuracy_matrix"] == chosen["accuracy_matrix"]
    assert heads["ridge"]["loo_accuracy"] == chosen["loo_accuracy"][-1]
    assert heads["ridge"]["options"] == {"gamma": plain["best_gamma"], "selected_by": "loo"}
    for name, args in (("ncm", []), ("slda", ["--shrinkage", "0.25"]), ("fecam", ["--shrinkage", "0.25"])):
        out = tmp_path / name
        assert invoke("learn", *base, "--out", out, "--head", name, *args).exit_code == 0
        learned = json.loads((out / "metrics.json").read_text())
        assert heads[name]["accuracy_matrix"] == learned["accuracy_matrix"]
        assert heads[name]["options"] == learned["head_options"]
    assert "loo_accuracy" not in heads["slda"] and "loo_accuracy" not in heads["fecam"]  # no exact LOO for them
    x, y, _, _ = read(store)
    assert heads["ncm"]["loo_accuracy"] == ref_ncm_loo(x.astype(np.float64), y)  # every class is in the stream
    ranked = {"ridge": heads["ridge"]["loo_accuracy"], "ncm": heads["ncm"]["loo_accuracy"]}
    assert report["best_head"] == max(ranked, key=ranked.get) and report["best_head_selected_by"] == "loo_accuracy"
    assert report["best_head_test"] == max(heads, key=lambda h: heads[h]["A_avg"])


def test_sweep_heads_without_loo_names_no_best_head(store, tmp_path):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "s", "--tasks", 3, "--projection-dim", 16,
                    "--gammas", "1", "--no-loo", "--heads", "ridge,ncm", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert "best_head" not in report and report["best_head_test"] in ("ridge", "ncm")
    assert "loo_accuracy" not in report["heads"]["ncm"] and "loo_accuracy" not in report["heads"]["ridge"]


@pytest.mark.parametrize(("args", "message"), [
    (["learn", "--head", "ncm", "--head-rows", "features", "--projection-dim", "100"], "drop --projection-dim"),
    (["learn", "--head", "slda", "--head-rows", "features", "--projection-dim", "1000"],
     "drop --projection-dim"),  # typed, even at its default
    (["learn", "--head", "fecam", "--gamma", "2"], "drop --gamma"),
    (["learn", "--head", "ncm", "--shrinkage", "0.1"], "--shrinkage is an option of slda and fecam"),
    (["learn", "--shrinkage", "0.1"], "--shrinkage is an option of slda and fecam"),
    (["learn", "--head", "slda", "--shrinkage-offdiag", "0.1"], "--shrinkage-offdiag is an option of fecam"),
    (["learn", "--head", "slda", "--shrinkage", "2"], "must lie in [0, 1]"),
    (["learn", "--head", "slda", "--shrinkage", "much"], "neither a number nor 'oas'"),
    (["learn", "--head", "fecam", "--shrinkage", "oas"], "fecam's --shrinkage must be a number"),
    (["learn", "--head", "ncm", "--no-mask-unseen"], "drop --no-mask-unseen"),
    (["learn", "--head", "dual", "--activation", "relu"], "its own activations to the projected rows"),
    (["learn", "--head", "balanced", "--gamma", "auto"], "has no search over gamma"),
    (["learn", "--head", "balanced", "--engine", "rls"], "sets ridge's solver"),
    (["learn", "--head", "ncm", "--compensation", "2"], "--compensation is an option of dual"),
    (["learn", "--head", "dual", "--gamma-comp", "-1"], "--gamma-comp must be a positive number"),
    (["learn", "--head", "dual", "--eval-every", "100"], "drop --eval-every"),
    (["sweep", "--heads", "ncm,slda"], "add ridge"),
    (["sweep", "--heads", "ridge,knn"], "unknown --heads 'knn'"),
    (["sweep", "--heads", "ridge,ncm,ncm"], "names a head twice"),
    (["sweep", "--shrinkage", "0.1"], "--shrinkage is an option of slda and fecam"),
    (["sweep", "--heads", "ridge,slda,fecam", "--shrinkage", "oas"], "fecam's --shrinkage must be a number"),
])
def test_what_a_head_cannot_take_is_refused_in_one_line(store, tmp_path, args, message):
    out = tmp_path / "out"
    result = invoke(*args, "--features", store, "--out", out, "--tasks", 3, "--backend", "numpy")
    if message in ("neither a number nor 'oas'", "unknown --heads 'knn'"):  # a usage error (tests/test_usage_exit_codes.py)
        assert result.exit_code == 2 and message in result.output and not out.exists(), result.output
    else:
        assert_clean_error(result, message, out)


@pytest.mark.parametrize("head, dim, extra, continued", [
    ("fecam", 1200, (), False),  # C = 12 precisions of 1200 x 1200; the model file copies them and the Grams
    ("fecam", 1200, ("--stream", "si-blurry"), False),  # classes recur: earlier boundaries keep their precisions
    ("balanced", 300, ("--projection-dim", 2000), False),  # 12 Grams of 2000 x 2000, and their copies in the file
    ("fecam", 1200, (), True),  # the loaded model's tensors, and its classes solved again at the first boundary
    ("balanced", 300, ("--projection-dim", 2000), True),
], ids=["fecam", "fecam-si-blurry", "balanced", "fecam-init-model", "balanced-init-model"])
def test_the_memory_estimate_bounds_what_learn_head_allocates(tmp_path, monkeypatch, head, dim, extra, continued):
    """The estimate ``learn --head`` (or ``learn --init-model`` of its model) checks before its walk bounds the peak
    of what the command allocates (traced by tracemalloc: every NumPy array), to the written model file."""
    import tracemalloc

    from foal_pipe.protocol import run as run_module

    store = build_store(tmp_path / "wide.zarr", n_train=1200 if "si-blurry" in extra else 240, n_test=48,
                        train_dim=dim, test_dim=dim, chunk=60)
    command = ["--head", head, *extra]
    if continued:  # stores continuing can tell apart (a generation id each)
        store = written_copy(store, tmp_path / "wide5.zarr", chunk=60)
        first = invoke("learn", "--features", store, "--out", tmp_path / "first", "--tasks", 3, "--backend", "numpy",
                       *command)
        assert first.exit_code == 0, first.output
        store = written_copy(build_store(tmp_path / "more.zarr", n_train=240, n_test=48, train_dim=dim, test_dim=dim,
                                         chunk=60, seed=1), tmp_path / "more5.zarr", chunk=60)
        command = ["--init-model", tmp_path / "first" / "model.safetensors"]
    estimates = []
    check = run_module.check_memory
    monkeypatch.setattr(run_module, "check_memory", lambda command, parts, fix: estimates.append(dict(parts))
                        or check(command, parts, fix))
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = invoke("learn", "--features", store, "--out", tmp_path / "out", "--tasks", 3, "--backend", "numpy",
                        *command)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0, result.output
    (parts,) = estimates
    assert f"{head} model file" in parts and ("the --init-model's tensors" in parts) == continued
    assert peak <= sum(parts.values()), (memory.human(peak), {k: memory.human(v) for k, v in parts.items()})


def test_per_class_statistics_beyond_memory_are_refused_with_the_figure(tmp_path, monkeypatch):
    store = build_store(tmp_path / "wide.zarr", n_train=60, n_test=24, train_dim=3000, test_dim=3000, chunk=30)
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 2**30)
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--head", "fecam", "--tasks", 3, "--backend", "numpy")
    state = 8 * (12 * (3000**2 + 2 * 3000) + 4 * 3000**2)  # every class's Gram, sums and shift; a boundary's solve
    assert_clean_error(result, f"fecam state (12 classes, d=3000) {memory.human(state)}", out)
    present = np.unique(read(store)[1]).size  # disjoint tasks: each class of the stream solved once
    kept = 8 * present * (2 * 3000**2 + 3000)  # its precision, factor and mean
    assert f"fecam scorers of every boundary {memory.human(kept)}" in result.output
    written = 8 * (2 * 12 * 3000**2 + 3 * 12 * 3000 + 2 * 12) + 12 * 3000**2  # stacked tensors, a finiteness mask
    assert f"fecam model file {memory.human(written)}" in result.output
    assert "state at D" not in result.output  # ridge's state is not held
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * 2**30)
    assert invoke("learn", "--features", store, "--out", out, "--head", "ncm", "--tasks", 3,
                  "--backend", "numpy").exit_code == 0
    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)
    out = tmp_path / "balanced"
    result = invoke("learn", "--features", store, "--out", out, "--head", "balanced", "--projection-dim", 3000,
                    "--tasks", 3, "--backend", "numpy")
    # a Gram per class, and what a boundary or the leave-one-out pass holds besides (BalancedHead.memory's terms)
    state = 8 * (12 * (3000**2 + 3000 + 1) + 12**2 * 3000 + 5 * 3000**2 + 2 * 3000 * 12)
    assert_clean_error(result, f"balanced state (12 classes, d=3000) {memory.human(state)}", out)


def test_evaluate_draws_the_heads_and_the_report_reads_back(store, tmp_path):
    from foal_pipe.protocol.schema import SweepReport

    base = ["--features", store, "--tasks", 3, "--seed", 2, "--backend", "numpy", "--projection-dim", 16]
    assert invoke("learn", *base, "--out", tmp_path / "run").exit_code == 0
    result = invoke("sweep", *base, "--gammas", "0.1,1", "--heads", "ridge,slda,ncm", "--out", tmp_path / "run-sweep")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "run-sweep" / "sweep.json").read_text())
    report = SweepReport.from_dict(data)
    assert report.to_dict() == data
    assert report.heads["slda"].options == {"shrinkage": 1e-4}
    evaluated = invoke("evaluate", "--run", tmp_path / "run", "--no-plots")
    assert evaluated.exit_code == 0, evaluated.output
    assert not (tmp_path / "run" / "eval" / "heads.png").exists()
    evaluated = invoke("evaluate", "--run", tmp_path / "run")
    assert evaluated.exit_code == 0, evaluated.output
    assert (tmp_path / "run" / "eval" / "heads.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = {**data, "heads": {"slda": {**data["heads"]["slda"], "accuracy_matrix": [[2.0]]}}}
    with pytest.raises(FoalPipeError, match="heads\\['slda'\\]"):
        SweepReport.from_dict(bad)


@pytest.mark.parametrize("head", ["ncm", "slda", "fecam"])
def test_learn_head_on_torch_equals_numpy(store, tmp_path, head):
    pytest.importorskip("torch")
    matrices = {}
    for backend in ("numpy", "torch"):
        out = tmp_path / backend
        result = invoke("learn", "--features", store, "--out", out, "--head", head, "--tasks", 4, "--seed", 2,
                        "--backend", backend)
        assert result.exit_code == 0, result.output
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["backend"] == backend
        matrices[backend] = metrics["accuracy_matrix"]
    assert matrices["torch"] == matrices["numpy"]


def test_sweep_heads_on_torch_equals_numpy(store, tmp_path):
    pytest.importorskip("torch")
    reports = {}
    for backend in ("numpy", "torch"):
        result = invoke("sweep", "--features", store, "--out", tmp_path / backend, "--tasks", 3, "--seed", 2,
                        "--projection-dim", 16, "--gammas", "0.1,1", "--heads", "ridge,ncm,slda,fecam",
                        "--backend", backend)
        assert result.exit_code == 0, result.output
        reports[backend] = json.loads((tmp_path / backend / "sweep.json").read_text())["heads"]
    for name, entry in reports["numpy"].items():
        assert reports["torch"][name]["accuracy_matrix"] == entry["accuracy_matrix"], name
        assert reports["torch"][name].get("loo_accuracy") == entry.get("loo_accuracy"), name


@pytest.mark.parametrize("head", ["ncm", "slda", "fecam", "balanced", "dual"])
def test_the_walk_feeds_each_head_its_rows_in_stream_order(store, head):
    """The walk's models equal the head fed by hand, task by task in stream order, with its rows computed plainly:
    the store's features, the projected rows (dual, in the stream's batches) or their sigmoid (balanced)."""
    import array_api_compat.numpy as xnp

    from foal_pipe.heads import HEADS, make_head
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.headscores import build_heads
    from foal_pipe.protocol.learners.heads import HeadsLearner
    from foal_pipe.protocol.run import prepare
    from foal_pipe.protocol.walk import walk

    space = HEADS[head].space
    model = ModelConfig(projection_dim=0 if space == "features" else 24, gamma=0.5)
    run = prepare(store, StreamConfig(tasks=4, seed=2, batch_size=7), model, EvaluationConfig(),
                  ExecutionConfig(backend="numpy"), heads=[head])
    walked = walk(run, [HeadsLearner(run, build_heads(run, [head], {"gamma": 0.5}))])[0].boundaries[head]
    x, y, xt, _ = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    P = np.asarray(run.projection.components_, dtype=np.float64)
    plain = {"features": lambda X: X, "projected": lambda X: X @ P, "activations": lambda X: 1 / (1 + np.exp(-(X @ P)))}
    by_hand = make_head(head, {"gamma": 0.5, **({"batch_size": 7} if head == "dual" else {})}, xnp,
                        x.shape[1] if space == "features" else 24)
    for k, task in enumerate(run.stream.rows):
        by_hand.add(plain[space](x[task]), y[task])
        expected = by_hand.boundary()
        np.testing.assert_array_equal(walked[k].classes, expected.classes)
        T = plain[space](xt)
        np.testing.assert_allclose(walked[k].scores(T), expected.scores(T), rtol=1e-9, atol=1e-9)


def test_a_head_run_has_a_model_file_and_an_older_run_says_why_it_has_none(store, tmp_path):
    run = tmp_path / "ncm"
    assert invoke("learn", "--features", store, "--out", run, "--head", "ncm", "--tasks", 3).exit_code == 0
    assert sorted(p.name for p in run.iterdir()) == ["metrics.json", "model.safetensors", "timings.json"]
    older = tmp_path / "older"
    older.mkdir()
    (older / "metrics.json").write_bytes((run / "metrics.json").read_bytes())  # a run from before heads had models
    result = invoke("predict", "--model", older / "model.safetensors", "--features", store)
    assert_clean_error(result, "its run learned --head ncm with a foal-pipe that wrote metrics.json only for heads",
                       tmp_path / "more")
    evaluated = invoke("evaluate", "--run", run)
    assert evaluated.exit_code == 0, evaluated.output
    assert (run / "eval" / "accuracy_matrix.png").exists()
    summarized = invoke("summary", run)
    assert summarized.exit_code == 0, summarized.output
    assert "head ncm" in summarized.output
    assert re.search(r"\s-\s+" + f"{100 * json.loads((run / 'metrics.json').read_text())['A_avg']:.2f}",
                     summarized.output)  # no gamma: ncm has none
