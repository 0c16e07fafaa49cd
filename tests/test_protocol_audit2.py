"""Audit 2 of the protocol: ties documented where routes are promised equal, summarize's input checked, refusals
under --order-seeds that name the order and suggest a fix for every order, summary's per-order ridge gamma, and
warnings said once over the orders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.core.metrics import summarize, summarize_seen
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.stream import make_stream
from foal_pipe.store import write_store

DOCS = Path(__file__).resolve().parent.parent / "docs"


def make_store(path: Path, train: list[int], test: list[int], d: int = 16, seed: int = 0, noise: float = 1.0) -> Path:
    """A store of ``train[c]`` / ``test[c]`` rows of class c around its own mean."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, size=(len(train), d))

    def split(counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        y = np.concatenate([np.full(n, c) for c, n in enumerate(counts)]).astype(np.int64)
        y = y[rng.permutation(len(y))]
        return (means[y] + rng.normal(0, noise, size=(len(y), d))).astype(np.float32), y

    write_store(path, split(train), split(test), [f"c{i}" for i in range(len(train))], chunk_rows=64)
    return path


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """Nine classes of very different sizes: fecam's short points at --eval-every differ by order."""
    return make_store(tmp_path_factory.mktemp("uneven") / "s.zarr", [30, 5, 12, 40, 2, 25, 9, 17, 3],
                      [7, 3, 9, 5, 4, 11, 6, 2, 8], seed=3, noise=1.5)


def error_line(result) -> str:
    return [line for line in result.output.strip().splitlines() if line.strip()][-1]


# --- 1: exact ties are the documented exception to "equals a separate run" --------------------------------------

@pytest.mark.parametrize(("page", "promise"), [
    ("orders.md", "Each order's accuracy matrix equals a separate `learn --order-seed S`"),
    ("learn.md", "Every gamma's test numbers equal\n`learn --gamma G`"),
])
def test_equal_routes_promises_name_the_exact_tie_exception(page, promise):
    text = (DOCS / page).read_text()
    assert promise in text
    sentence = text[text.index(promise):].split(". ")[0]
    assert re.search(r"exact scores? ties?", sentence.replace("\n", " ")), sentence
    exactness = (DOCS / "learn.md").read_text().split("## Exactness")[1].split("\n## ")[0]
    assert "identical training rows" in exactness and "differently by route" in exactness


# --- 2: summarize and summarize_seen check their matrix -----------------------------------------------------------

@pytest.mark.parametrize("function", [summarize, summarize_seen])
@pytest.mark.parametrize(("matrix", "fragment"), [
    ([[0.5], [0.5]], "row 1 of the accuracy matrix has 1 entries, not 2"),
    ([], "not a non-empty list of rows"),
    (None, "not a non-empty list of rows"),
    ([0.5], "not a non-empty list of rows"),
    ([[1.5]], "holds 1.5, not a fraction in [0, 1]"),
    ([[float("nan")]], "holds nan, not a fraction in [0, 1]"),
    ([[0.5], [0.4, -0.1]], "row 1 of the accuracy matrix holds -0.1"),
    ([[0.5, 0.9]], "row 0 of the accuracy matrix has 2 entries, not 1"),
    ([["x"]], "row 0 of the accuracy matrix is not all numbers"),
])
def test_summaries_refuse_a_malformed_matrix_in_one_line(function, matrix, fragment):
    with pytest.raises(FoalPipeError) as info:
        function(matrix)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_summaries_of_good_matrices_are_unchanged():
    ragged = [[0.9], [0.8, 0.95], [0.85, 0.9, 0.92]]
    square = np.array([[0.9, np.nan, 7.0], [0.8, 0.95, np.nan], [0.85, 0.9, 0.92]])  # above the diagonal: ignored
    for acc in (ragged, square):
        m = summarize(acc)
        assert m["A_steps"] == pytest.approx([0.9, 0.875, (0.85 + 0.9 + 0.92) / 3])
        assert m["F"] == pytest.approx(((0.9 - 0.85) + (0.95 - 0.9)) / 2)
        assert summarize_seen(acc) == {"A_steps": [0.9, 0.95, 0.92], "A_avg": pytest.approx((0.9 + 0.95 + 0.92) / 3),
                                       "A_last": 0.92}


# --- 3: refusals under --order-seeds name the order; fecam's suggestion suits every order ------------------------

def fixes_for_all(store: Path, seeds: list[int], every: int) -> int:
    """The least --eval-every above ``every`` at whose points every order's seen classes have 2 rows (fecam)."""
    from foal_pipe.store import open_store

    s = open_store(store)
    train, test = np.asarray(s.train.labels), np.asarray(s.test.labels)
    streams = [train[np.concatenate(make_stream("disjoint", train, len(s.classes), 3, 10, seed, test_labels=test).rows)]
               for seed in seeds]

    def fine(labels: np.ndarray, e: int) -> bool:
        return all(np.bincount(labels[:n])[np.unique(labels[:n])].min() >= 2 for n in range(e, labels.size + 1, e))

    return next(e for e in range(every + 1, train.size + 1) if all(fine(labels, e) for labels in streams))


def test_fecam_eval_every_suggestion_works_for_every_order(tmp_path, uneven):
    seeds = [1, 2, 3]
    result = invoke("learn", "--features", uneven, "--out", tmp_path / "o", "--tasks", 3, "--head", "fecam",
                    "--eval-every", 7, "--order-seeds", "1,2,3")
    assert_clean_error(result, "in class order seed 1 at the point after 7 rows class", tmp_path / "o")
    suggested = int(re.search(r"pass --eval-every (\d+)", error_line(result)).group(1))
    assert suggested == fixes_for_all(uneven, seeds, 7)
    ok = invoke("learn", "--features", uneven, "--out", tmp_path / "ok", "--tasks", 3, "--head", "fecam",
                "--eval-every", suggested, "--order-seeds", "1,2,3")
    assert ok.exit_code == 0, ok.output
    alone = invoke("learn", "--features", uneven, "--out", tmp_path / "a", "--tasks", 3, "--head", "fecam",
                   "--eval-every", 7, "--order-seed", 1)
    assert_clean_error(alone, "but at the point after 7 rows class", tmp_path / "a")  # one order: no seed to name
    assert "order seed" not in error_line(alone)


def test_a_task_without_training_rows_names_its_order(tmp_path):
    store = make_store(tmp_path / "s.zarr", [20, 0, 20, 20, 20, 20], [10] * 6)
    result = invoke("learn", "--features", store, "--out", tmp_path / "o", "--tasks", 5, "--head", "ncm",
                    "--order-seeds", "0,1,2,3")
    assert_clean_error(result, "(classes 1) has no training rows", tmp_path / "o")
    seed = int(re.search(r"class order seed (\d+); --order-seed \1 alone is refused too", error_line(result)).group(1))
    alone = invoke("learn", "--features", store, "--out", tmp_path / "a", "--tasks", 5, "--head", "ncm",
                   "--order-seed", seed)
    assert_clean_error(alone, "(classes 1) has no training rows", tmp_path / "a")
    assert error_line(result).startswith(error_line(alone).rstrip())


def test_drop_last_emptying_a_task_names_its_order(tmp_path):
    store = make_store(tmp_path / "s.zarr", [3, 30, 30, 30], [5] * 4)
    result = invoke("learn", "--features", store, "--out", tmp_path / "o", "--tasks", 4, "--projection-dim", 8,
                    "--drop-last", "--order-seeds", "5,6")
    assert_clean_error(result, "--drop-last would drop all 3 rows of task", tmp_path / "o")
    assert "(class order seed 5; --order-seed 5 alone is refused too)" in error_line(result)


def test_a_task_without_test_rows_lists_its_classes_as_the_training_refusal_does(tmp_path):
    store = make_store(tmp_path / "s.zarr", [20] * 4, [10, 0, 10, 10])
    result = invoke("learn", "--features", store, "--out", tmp_path / "o", "--tasks", 4, "--projection-dim", 8)
    assert_clean_error(result, "(classes 1) has no test rows", tmp_path / "o")


# --- 4: the Si-Blurry refusal of a class without test rows is documented -----------------------------------------

def test_blurry_refusal_of_a_class_without_test_rows_is_documented(tmp_path):
    store = make_store(tmp_path / "s.zarr", [20] * 6, [10, 0, 10, 10, 0, 10])
    ok = invoke("learn", "--features", store, "--out", tmp_path / "d", "--tasks", 3, "--projection-dim", 8)
    assert ok.exit_code == 0, ok.output
    blurry = invoke("learn", "--features", store, "--out", tmp_path / "b", "--tasks", 3, "--projection-dim", 8,
                    "--stream", "si-blurry")
    assert_clean_error(blurry, "class 1 is trained on but has no test rows", tmp_path / "b")
    section = (DOCS / "streams.md").read_text().split("## Classes left out")[1].split("\n## ")[0]
    assert re.search(r"training rows but no test\s+row", section) and "`--stream si-blurry`" in section


# --- 5: summary shows the ridge head's gamma of a sweep over orders ----------------------------------------------

def test_summary_shows_ridge_gamma_of_a_heads_sweep_over_orders(tmp_path, uneven):
    out = tmp_path / "sw"
    result = invoke("sweep", "--features", uneven, "--out", out, "--tasks", 3, "--projection-dim", 24,
                    "--gammas", "1,10", "--heads", "ridge,ncm", "--order-seeds", "1,4")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "sweep.json").read_text())
    gammas = report["heads"]["ridge"]["options"]["gammas"]
    assert len(set(gammas)) == 1  # both orders chose one gamma

    def ridge_row() -> str:
        shown = invoke("summary", out)
        assert shown.exit_code == 0, shown.output
        lines = shown.output.splitlines()
        return next(lines[i - 1] for i, line in enumerate(lines) if "· head ridge" in line)

    assert ridge_row().split()[4] == f"{gammas[0]:g}"
    report["heads"]["ridge"]["options"]["gammas"] = [gammas[0], gammas[0] * 10]  # not what order 4 chose
    (out / "sweep.json").write_text(json.dumps(report))
    shown = invoke("summary", out)
    assert shown.exit_code != 0 and "gammas" in shown.output and "sweep.json" in shown.output, shown.output
    assert "that can be read: 1 skipped (above, each with its fix)" in shown.output  # not "run learn first"


# --- 6: timings, warnings said once, the default ratio suggested -------------------------------------------------

def test_one_pass_learn_over_orders_times_its_write(tmp_path, uneven):
    result = invoke("learn", "--features", uneven, "--out", tmp_path / "o", "--tasks", 3, "--projection-dim", 24,
                    "--order-seeds", "1,4")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["one_pass"] is True
    assert "write" in json.loads((tmp_path / "o" / "timings.json").read_text())


def warnings_of(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if "warning:" in line]


def test_sweep_grid_edge_warning_is_said_once_over_orders(tmp_path, uneven):
    args = ["--features", uneven, "--tasks", 3, "--projection-dim", 24, "--gammas", "1,10", "--heads", "ridge,ncm"]
    alone = [[w for w in warnings_of(invoke("sweep", *args, "--out", tmp_path / f"a{s}", "--order-seed", s))
              if "best gamma by" in w] for s in (1, 4)]
    assert alone[0] == alone[1] and len(alone[0]) == 1  # each order alone: the same one warning
    both = [w for w in warnings_of(invoke("sweep", *args, "--out", tmp_path / "b", "--order-seeds", "1,4"))
            if "best gamma by" in w]
    assert both == alone[0]


def test_learn_auto_edge_warnings_are_each_orders_own(tmp_path, uneven):
    args = ["--features", uneven, "--tasks", 3, "--projection-dim", 24, "--gamma", "auto", "--gamma-grid", "1,10"]
    alone = {s: [w for w in warnings_of(invoke("learn", *args, "--out", tmp_path / f"a{s}", "--order-seed", s))
                 if "--gamma auto chose" in w] for s in (1, 4)}
    assert alone[1] != alone[4] and all(len(w) == 1 for w in alone.values())  # the orders differ
    both = [w for w in warnings_of(invoke("learn", *args, "--out", tmp_path / "b", "--order-seeds", "1,4"))
            if "--gamma auto chose" in w]
    assert both == [f"order seed {s}: {alone[s][0]}" for s in (1, 4)]


@pytest.mark.parametrize(("name", "default"), [("blurry-ratio", 10), ("disjoint-ratio", 50)])
def test_a_bad_ratio_suggests_its_default(tmp_path, uneven, name, default):
    result = invoke("learn", "--features", uneven, "--out", tmp_path / "o", "--stream", "si-blurry", f"--{name}", -1)
    assert_clean_error(result, f"pass e.g. --{name} {default} (the default)", tmp_path / "o")
