"""Every head's capabilities: ``--eval-every`` points equal the head's definition on the rows seen there (dual stays
refused with its reason), the capability table refuses in one line and docs/heads.md holds the generated table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import N_CLASSES, assert_clean_error, assert_same_matrix, build_store, invoke, read, ref_fecam, ref_ncm, ref_slda

from foal_pipe.protocol.stream import build_stream, si_blurry

DOCS = Path(__file__).resolve().parent.parent / "docs"
STREAM = ["--tasks", 4, "--batch-size", 10, "--seed", 3, "--backend", "numpy"]
REFERENCES = {"ncm": ref_ncm, "slda": ref_slda, "fecam": ref_fecam}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("capabilities") / "s.zarr")


def _learn(store: Path, out: Path, *extra) -> dict:
    result = invoke("learn", "--features", store, "--out", out, *STREAM, *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("head", list(REFERENCES))
def test_eval_every_points_equal_the_head_on_the_rows_seen(store, tmp_path, head):
    """Each point's accuracy is the head's definition (tests/helpers.py, written plainly) fitted on the first n rows
    of the stream, predicting among the classes seen so far, on their test rows: a learn stopped there."""
    every = 100 if head == "fecam" else 50  # fecam: 2 rows of every class seen at each point (below)
    metrics = _learn(store, tmp_path / "run", "--head", head, "--eval-every", every)
    x, y, xt, yt = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    order = np.concatenate(build_stream(y, N_CLASSES, 4, 10, 3).rows)
    curve = metrics["anytime"]
    assert curve["eval_every"] == every and curve["samples_seen"] == list(range(every, 601, every))
    expected = []
    for n in curve["samples_seen"]:
        rows = order[:n]
        classes, scores = REFERENCES[head](x[rows], y[rows], xt[np.isin(yt, y[rows])])
        expected.append(float(np.mean(classes[scores.argmax(axis=1)] == yt[np.isin(yt, y[rows])])))
    np.testing.assert_allclose(curve["accuracy"], expected, rtol=0, atol=1e-12)
    assert metrics["A_auc"] == pytest.approx(float(np.mean(expected)), abs=1e-12)
    assert "gammas" not in curve


@pytest.mark.parametrize("head", ["ncm", "slda"])
def test_eval_every_points_on_a_si_blurry_stream_equal_the_definition(store, tmp_path, head):
    metrics = _learn(store, tmp_path / "run", "--head", head, "--eval-every", 70, "--stream", "si-blurry")
    x, y, xt, yt = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    stream = si_blurry(y, N_CLASSES, 4, 10, metrics["order_seed"], metrics["disjoint_ratio"], metrics["blurry_ratio"])
    assert stream.tasks == metrics["tasks"]
    order = np.concatenate(stream.rows)
    expected = []
    for n in metrics["anytime"]["samples_seen"]:
        rows, test = order[:n], np.isin(yt, y[order[:n]])
        classes, scores = REFERENCES[head](x[rows], y[rows], xt[test])
        expected.append(float(np.mean(classes[scores.argmax(axis=1)] == yt[test])))
    np.testing.assert_allclose(metrics["anytime"]["accuracy"], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("head", ["ncm", "slda", "fecam", "balanced"])
def test_eval_every_keeps_each_heads_task_end_matrix(store, tmp_path, head):
    extra = ["--projection-dim", 24] if head == "balanced" else []
    plain = _learn(store, tmp_path / "plain", "--head", head, *extra)
    anytime = _learn(store, tmp_path / "anytime", "--head", head, *extra, "--eval-every", 60)
    assert_same_matrix(anytime["accuracy_matrix"], plain["accuracy_matrix"])
    assert anytime["anytime"]["samples_seen"] == list(range(60, 601, 60))


@pytest.mark.parametrize(("args", "message"), [
    (["--head", "dual", "--eval-every", "50"], "--head dual solves its compensation stream once per task"),
    (["--head", "fecam", "--eval-every", "50"], "--head fecam needs 2 training rows of every class seen, but at the "
                                                "point after 450 rows class"),
    (["--head", "balanced", "--gamma", "auto"], "compare gammas with `sweep --heads ridge,balanced`"),
])
def test_a_refused_combination_says_why_in_one_line(store, tmp_path, args, message):
    out = tmp_path / "out"
    assert_clean_error(invoke("learn", "--features", store, "--out", out, *STREAM, *args), message, out)


@pytest.mark.parametrize(("args", "message"), [
    (["--no-mask-unseen"], "--head ncm predicts among the classes seen so far"),
])
def test_sweep_heads_refuse_what_only_ridge_takes(store, tmp_path, args, message):
    """They ran the heads in float64, masked, while sweep.json recorded the option: now refused, as learn --head."""
    out = tmp_path / "out"
    result = invoke("sweep", "--features", store, "--out", out, *STREAM, "--projection-dim", 16, "--gammas", "1",
                    "--heads", "ridge,ncm", *args)
    assert_clean_error(result, message, out)


def test_docs_hold_the_capability_table_generated_from_the_registry():
    from foal_pipe.cli.flags import cli_form
    from foal_pipe.heads import HEADS
    from foal_pipe.protocol.capabilities import CAPABILITIES, capability_table

    table = capability_table(cli_form)
    assert table in (DOCS / "heads.md").read_text()
    header = table.splitlines()[0]
    assert all(f" {name} " in header for name in HEADS)  # every head of the registry has a column
    assert len([line for line in table.splitlines() if line.startswith("| `")]) == len(CAPABILITIES)


def test_the_memory_estimate_counts_the_scorers_of_every_point(store):
    """With ``--eval-every`` a head's scorers wait for the test read at every point too: the estimate sums each
    snapshot's ``kept`` bytes over the stream cut at task ends and points, computed here by hand."""
    from foal_pipe.heads import HEADS
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.memoryparts import head_parts
    from foal_pipe.protocol.run import prepare

    stream, model = StreamConfig(tasks=4, batch_size=10, seed=3), ModelConfig(head="fecam", projection_dim=0)
    parts = {}
    for every in (None, 100):
        run = prepare(store, stream, model, EvaluationConfig(eval_every=every), ExecutionConfig(backend="numpy"),
                      heads=["fecam"], ridge=False)
        parts[every] = head_parts(run, ["fecam"])["fecam scorers of every boundary"]
    _, y, _, _ = read(store)
    order = np.concatenate(build_stream(y, N_CLASSES, 4, 10, 3).rows)
    ends = np.cumsum([r.size for r in build_stream(y, N_CLASSES, 4, 10, 3).rows])
    cuts = sorted({*ends.tolist(), *range(100, order.size + 1, 100)})
    expected, seen, lo = 0, set(), 0
    for hi in cuts:
        changed = set(y[order[lo:hi]].tolist())
        seen |= changed
        expected += HEADS["fecam"].kept(len(changed), len(seen), 16)
        lo = hi
    assert parts[100] == expected > parts[None]
