"""``--order-seeds``: many class orders from one pass equal separate runs, the memory fallback, evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import build_store, read
from safetensors.numpy import load_file
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.core.metrics import summarize
from foal_pipe.errors import FoalPipeError
from foal_pipe.memory import parse_memory
from foal_pipe.protocol import runstate as run_module
from foal_pipe.protocol.classsums import class_statistics_bytes

runner = CliRunner()
SEEDS = (0, 3, 7)
COMMON = ["--tasks", "4", "--projection-dim", "24", "--batch-size", "7", "--seed", "5"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("orders") / "s.zarr")


def _invoke(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def _matrix(m: list[list[float]]) -> np.ndarray:
    T = len(m)
    return np.array([row + [np.nan] * (T - len(row)) for row in m])


def _separate(store: Path, tmp: Path, extra: list[str]) -> dict[int, dict]:
    out = {}
    for s in SEEDS:
        _invoke(["learn", "--features", str(store), "--out", str(tmp / f"one-{s}"), *COMMON, "--order-seed", str(s), *extra])
        out[s] = json.loads((tmp / f"one-{s}" / "metrics.json").read_text())
    return out


@pytest.mark.parametrize("extra", [["--gamma", "0.5"], ["--gamma", "auto", "--select", "gcv"]], ids=["fixed", "gcv"])
def test_order_seeds_equal_separate_runs(store: Path, tmp_path: Path, extra: list[str]) -> None:
    seeds = ",".join(map(str, SEEDS))
    result = _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "many"), *COMMON, "--order-seeds", seeds,
                      *extra])
    assert "one pass per class order" not in result.output
    many = json.loads((tmp_path / "many" / "metrics.json").read_text())
    separate = _separate(store, tmp_path, extra)
    assert many["one_pass"] is True and [o["order_seed"] for o in many["orders"]] == list(SEEDS)
    assert len({json.dumps(o["tasks"]) for o in many["orders"]}) == len(SEEDS)  # the orders differ
    for entry in many["orders"]:
        one = separate[entry["order_seed"]]
        assert entry["tasks"] == one["tasks"]
        np.testing.assert_allclose(_matrix(entry["accuracy_matrix"]), _matrix(one["accuracy_matrix"]), atol=1e-12, rtol=0)
        for key in ("A_avg", "A_last", "F"):
            assert entry[key] == pytest.approx(one[key], abs=1e-12)
        if "gammas_selected" in one:
            assert entry["gammas_selected"] == one["gammas_selected"]
    for key in ("A_avg", "A_last", "F"):
        values = np.array([separate[s][key] for s in SEEDS])
        assert many["mean"][key] == pytest.approx(values.mean(), abs=1e-12)
        assert many["std"][key] == pytest.approx(values.std(), abs=1e-12)
        assert many[key] == pytest.approx(values.mean(), abs=1e-12)
    steps = [summarize(separate[s]["accuracy_matrix"])["A_steps"] for s in SEEDS]
    assert many["A_steps"] == pytest.approx(np.mean(steps, axis=0))


def test_class_sums_over_several_blocks_equal_the_closed_form(store: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Each class's rows cut into several blocks (16 rows, about 50 a class): the per-class sums still add up to
    ``H^T H`` and ``H^T Y`` of every train row (the first order's final model), and each order equals its
    separate run."""
    monkeypatch.setattr(run_module, "block_rows", lambda dim: 16)
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "many"), *COMMON, "--gamma", "0.5",
             "--order-seeds", ",".join(map(str, SEEDS))])
    model = load_file(str(tmp_path / "many" / "model.safetensors"))
    X, y, _, _ = read(store)
    H = 1 / (1 + np.exp(-(X.astype(np.float64) @ model["projection"])))  # the default activation, sigmoid
    Y = (y[:, None] == np.arange(12)[None, :]).astype(np.float64)
    np.testing.assert_allclose(model["G"], H.T @ H, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(model["Q"], H.T @ Y, rtol=1e-10, atol=1e-9)
    assert model["counts"].tolist() == np.bincount(y, minlength=12).tolist()
    many = json.loads((tmp_path / "many" / "metrics.json").read_text())
    separate = _separate(store, tmp_path, ["--gamma", "0.5"])
    for entry in many["orders"]:
        np.testing.assert_array_equal(_matrix(entry["accuracy_matrix"]),
                                      _matrix(separate[entry["order_seed"]]["accuracy_matrix"]))


def test_order_seed_defaults_to_seed(store: Path, tmp_path: Path) -> None:
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "a"), *COMMON])
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "b"), *COMMON, "--order-seed", "5"])
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "c"), *COMMON, "--order-seed", "6"])
    a, b, c = (json.loads((tmp_path / x / "metrics.json").read_text()) for x in "abc")
    assert a["tasks"] == b["tasks"] and a["accuracy_matrix"] == b["accuracy_matrix"]
    assert a["tasks"] != c["tasks"]


def test_memory_refusal_falls_back_to_one_pass_per_order(store: Path, tmp_path: Path) -> None:
    need = class_statistics_bytes(12, 24, "float64")
    result = _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "many"), *COMMON, "--gamma", "0.5",
                      "--order-seeds", "0,3,7", "--max-memory", str(need - 1)])
    assert "running one walk per class order (3 walks over rows read once)" in result.output
    assert "raise --max-memory to" in result.output and "per-class statistics need" in result.output
    many = json.loads((tmp_path / "many" / "metrics.json").read_text())
    assert many["one_pass"] is False
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == ["metrics.json", "model.safetensors", "timings.json"]
    separate = _separate(store, tmp_path, ["--gamma", "0.5"])
    for entry in many["orders"]:
        alone = separate[entry["order_seed"]]["accuracy_matrix"]
        np.testing.assert_array_equal(_matrix(entry["accuracy_matrix"]), _matrix(alone))


def test_sampled_leave_one_out_orders_choose_as_separate_runs(store: Path, tmp_path: Path) -> None:
    """``--gamma auto`` with leave-one-out on a sample smaller than the rows seen, every order from the per-class sums
    in one pass: the sample is drawn over the store's rows, so each boundary scores the rows its separate run's walk
    scores, and every boundary chooses the same gamma."""
    extra = ["--gamma", "auto", "--loo-sample", "16"]
    seeds = ",".join(map(str, SEEDS))
    result = _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "many"), *COMMON, "--order-seeds", seeds,
                      *extra])
    assert "one walk per class order" not in result.output
    many = json.loads((tmp_path / "many" / "metrics.json").read_text())
    assert many["one_pass"] is True
    separate = _separate(store, tmp_path, extra)
    for entry in many["orders"]:
        one = separate[entry["order_seed"]]
        assert 16 in one["gamma_search"]["sample_rows"] and max(one["gamma_search"]["sample_eps"]) > 0  # a true sample
        assert entry["gammas_selected"] == one["gammas_selected"]
        np.testing.assert_array_equal(_matrix(entry["accuracy_matrix"]), _matrix(one["accuracy_matrix"]))


def test_leave_one_out_over_every_row_falls_back(store: Path, tmp_path: Path) -> None:
    result = _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "every"), *COMMON, "--gamma", "auto",
                      "--loo-sample", "0", "--order-seeds", "0,3"])
    assert "the leave-one-out pass needs every row at every boundary (use --loo-sample M" in result.output
    assert json.loads((tmp_path / "every" / "metrics.json").read_text())["one_pass"] is False


def test_loo_and_rls_fall_back(store: Path, tmp_path: Path) -> None:
    result = _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "rls"), *COMMON, "--engine", "rls",
                      "--order-seeds", "0,3"])
    assert "--engine rls replays the rows" in result.output
    m = json.loads((tmp_path / "rls" / "metrics.json").read_text())
    assert len(m["orders"]) == 2


def test_sweep_order_seeds_record_the_means_of_separate_runs(store: Path, tmp_path: Path) -> None:
    """Each gamma's top-level result holds, as ``learn --order-seeds`` does, the means over the orders of separate
    ``learn --order-seed S --gamma G`` runs: A_avg, A_last, F (std beside them) and, position-wise, the accuracy
    matrix and A_steps (so A_avg is the mean of A_steps); each order's own results are its run's. ``evaluate`` reads
    the sweep beside a ``learn --order-seeds`` run and shows the means."""
    from foal_pipe.report import evaluate

    sweep_dir = tmp_path / "run-sweep"
    _invoke(["sweep", "--features", str(store), "--out", str(sweep_dir), *COMMON, "--gammas", "0.1,1,10",
             "--no-loo", "--order-seeds", "0,3"])
    report = json.loads((sweep_dir / "sweep.json").read_text())
    assert report["one_pass"] is True and "order_seed" not in report  # the top level is no one order's
    for i, g in enumerate((0.1, 1.0, 10.0)):
        separate = []
        for s in (0, 3):
            _invoke(["learn", "--features", str(store), "--out", str(tmp_path / f"l{s}-{g}"), *COMMON, "--gamma", str(g),
                     "--order-seed", str(s)])
            separate.append(json.loads((tmp_path / f"l{s}-{g}" / "metrics.json").read_text()))
        got = report["results"][i]
        for key in ("A_avg", "A_last", "F", "F_published_code"):
            values = [m[key] for m in separate]
            assert got[key] == pytest.approx(np.mean(values), abs=1e-12)
            if key != "F_published_code":
                assert got["std"][key] == pytest.approx(np.std(values), abs=1e-12)
        np.testing.assert_allclose(_matrix(got["accuracy_matrix"]),
                                   np.mean([_matrix(m["accuracy_matrix"]) for m in separate], axis=0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(got["A_steps"], np.mean([m["A_steps"] for m in separate], axis=0), rtol=0, atol=1e-12)
        assert got["A_avg"] == pytest.approx(np.mean(got["A_steps"]), abs=1e-12)
        for entry, alone in zip(report["orders"], separate, strict=True):
            np.testing.assert_allclose(_matrix(entry["results"][i]["accuracy_matrix"]), _matrix(alone["accuracy_matrix"]),
                                       rtol=0, atol=1e-12)
            assert "std" not in entry["results"][i]
    run = tmp_path / "run"
    _invoke(["learn", "--features", str(store), "--out", str(run), *COMMON, "--gamma", "1", "--order-seeds", "0,3"])
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    for r in report["results"]:
        assert f"| {r['gamma']:g} | {100 * r['A_avg']:.2f} | {100 * r['A_last']:.2f} | {100 * r['F']:.2f} |" in text


def test_sweep_sampled_leave_one_out_orders_in_one_pass_equal_separate_sweeps(store: Path, tmp_path: Path) -> None:
    """``sweep --order-seeds`` with leave-one-out on a sample (the default pass) from the per-class sums: each
    order's per-gamma LOO accuracy, refined selections and rows scored equal its separate sweep's."""
    extra = ["--gammas", "0.1,1,10", "--loo-sample", "16"]
    _invoke(["sweep", "--features", str(store), "--out", str(tmp_path / "sw"), *COMMON, *extra, "--order-seeds", "0,3"])
    report = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert report["one_pass"] is True
    assert report["leave_one_out"]["exact"] is False and report["selections"]
    for entry in report["orders"]:
        out = tmp_path / f"one-{entry['order_seed']}"
        _invoke(["sweep", "--features", str(store), "--out", str(out), *COMMON, *extra, "--order-seed",
                 str(entry["order_seed"])])
        alone = json.loads((out / "sweep.json").read_text())
        assert entry["best_gamma"] == alone["best_gamma"]
        for got, ref in zip(entry["results"], alone["results"], strict=True):
            assert got["loo_accuracy"] == ref["loo_accuracy"] and got["accuracy_matrix"] == ref["accuracy_matrix"]
            np.testing.assert_allclose(got["loo_mse"], ref["loo_mse"], rtol=1e-9)
        if entry["order_seed"] == 0:  # the top-level report is the first order's, with the means
            assert report["leave_one_out"] == alone["leave_one_out"]
            assert [s["gammas_selected"] for s in report["selections"]] == [s["gammas_selected"]
                                                                            for s in alone["selections"]]


def test_sweep_orders_refuse_a_leave_one_out_select_without_the_pass(store: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sweep", "--features", str(store), "--out", str(tmp_path / "o"), *COMMON, "--gammas",
                                 "0.1,1", "--no-loo", "--select", "loo", "--order-seeds", "0,3"])
    assert result.exit_code == 1 and "needs the leave-one-out pass" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


#: On the module's store, Si-Blurry order 0 streams all 6 tasks and order 1 only 5 (one task receives no row).
BLURRY = ["--projection-dim", "24", "--batch-size", "7", "--seed", "5", "--backend", "numpy", "--stream", "si-blurry",
          "--tasks", "6"]


@pytest.mark.parametrize("command", [["learn"], ["learn", "--head", "ncm"], ["sweep", "--gammas", "0.1,1"]],
                         ids=["learn", "head", "sweep"])
def test_orders_of_different_task_counts_are_refused(store: Path, tmp_path: Path, command: list[str]) -> None:
    """Si-Blurry leaves out a task that receives no row, so orders may stream different numbers of tasks: their
    matrices have no position-wise mean, and ``--order-seeds`` refuses them in one line naming each order's count
    (the counts of separate ``learn --order-seed S`` runs) instead of failing inside NumPy or keeping one order's."""
    counts = {}
    for s in (0, 1):
        _invoke(["learn", "--features", str(store), "--out", str(tmp_path / f"one-{s}"), *BLURRY, "--order-seed", str(s)])
        counts[s] = json.loads((tmp_path / f"one-{s}" / "metrics.json").read_text())["n_tasks"]
    assert counts[0] != counts[1]
    result = runner.invoke(app, [*command, "--features", str(store), "--out", str(tmp_path / "o"), *BLURRY,
                                 "--order-seeds", "0,1"])
    assert result.exit_code == 1 and "Traceback" not in result.output and not (tmp_path / "o").exists()
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error == [f"Error: --order-seeds 0,1 stream different numbers of tasks (0: {counts[0]}, 1: {counts[1]}; "
                     "--stream si-blurry leaves out a task that receives no row), so their accuracy matrices have no "
                     "position-wise mean; pass order seeds that stream as many tasks each, or run each seed alone with "
                     "--order-seed"]


@pytest.mark.parametrize("args, message", [
    (["--order-seeds", "0,x"], "not a comma-separated list"),
    (["--order-seeds", "0,0"], "repeats a seed"),
    (["--order-seeds", "0,1", "--order-seed", "2"], "not both"),
    (["--order-seeds", "0,1", "--max-memory", "lots"], "is not a size"),
])
def test_bad_order_options(store: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "o"), *COMMON, *args])
    usage = message in ("not a comma-separated list", "is not a size")  # a usage error (tests/test_usage_exit_codes.py)
    assert result.exit_code == (2 if usage else 1) and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_parse_memory() -> None:
    assert parse_memory("8GiB") == 8 * 2**30 and parse_memory("512M") == 512 * 2**20 and parse_memory("100") == 100
    for zero in ("0", "0GiB", "-1MiB"):  # a size, but none: said so (it read "is not a size", which 0 is)
        with pytest.raises(FoalPipeError, match="leaves nothing to hold; write a size above 0"):
            parse_memory(zero)


def test_stage_command_lines_pass_order_seeds() -> None:
    import sys

    from helpers import STAGES

    sys.path.insert(0, str(STAGES))
    import yaml
    from _params import stream_args

    learn = yaml.safe_load((STAGES.parent / "params.yaml").read_text())["learn"]
    assert learn["order_seeds"] == [] and "--order-seed" not in stream_args(learn) and "--order-seeds" not in stream_args(learn)
    one = stream_args({**learn, "order_seeds": [3]})
    assert one[one.index("--order-seed") + 1] == 3
    many = stream_args({**learn, "order_seeds": [0, 1, 2]})
    assert many[many.index("--order-seeds") + 1] == "0,1,2"


def test_evaluate_with_orders(store: Path, tmp_path: Path) -> None:
    from foal_pipe.report import evaluate

    run = tmp_path / "many"
    _invoke(["learn", "--features", str(store), "--out", str(run), *COMMON, "--gamma", "0.5", "--order-seeds", "0,3,7"])
    evaluate(run)
    text = (run / "eval" / "summary.md").read_text()
    m = json.loads((run / "metrics.json").read_text())
    assert "**Warning:**" not in text  # the mean F is not the mean matrix's F: no false inconsistency
    for label, key in (("A_avg (%)", "A_avg"), ("A_last (%)", "A_last"), ("F (%)", "F")):
        assert f"| {label} | {100 * m['mean'][key]:.2f} ± {100 * m['std'][key]:.2f} |" in text
    for entry in m["orders"]:
        assert f"| {entry['order_seed']} | {100 * entry['A_avg']:.2f} | {100 * entry['A_last']:.2f} |" in text
    from types import SimpleNamespace

    from foal_pipe.protocol.schema import LearnMetrics
    from foal_pipe.report.plots import order_band

    mean, std = order_band(SimpleNamespace(metrics=LearnMetrics.from_dict(m)))
    steps = np.array([summarize(o["accuracy_matrix"])["A_steps"] for o in m["orders"]]) * 100
    np.testing.assert_allclose(mean, steps.mean(axis=0))
    np.testing.assert_allclose(std, steps.std(axis=0))
    assert std.max() > 0 and (run / "eval" / "steps.png").stat().st_size > 0


def test_evaluate_flags_an_order_inconsistent_with_its_matrix(store: Path, tmp_path: Path) -> None:
    from foal_pipe.report import evaluate

    run = tmp_path / "many"
    _invoke(["learn", "--features", str(store), "--out", str(run), *COMMON, "--gamma", "0.5", "--order-seeds", "0,3"])
    m = json.loads((run / "metrics.json").read_text())
    m["orders"][1]["A_last"] += 0.1
    (run / "metrics.json").write_text(json.dumps(m))
    evaluate(run)
    assert "A_last of order 3 in metrics.json" in (run / "eval" / "summary.md").read_text()


def test_small_blocks_and_spilled_rows_give_the_same_orders(store: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 16 rows (many per class) of rows held in a temporary file sum to the same statistics."""
    import foal_pipe.protocol.rowcache as rowcache

    args = [*COMMON, "--gamma", "0.5", "--order-seeds", "0,3"]
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "big"), *args])
    monkeypatch.setattr(rowcache, "BLOCK_ROWS", 16)
    monkeypatch.setattr(rowcache, "RAM_BYTES", 0)
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "small"), *args])
    big, small = (json.loads((tmp_path / x / "metrics.json").read_text()) for x in ("big", "small"))
    for a, b in zip(big["orders"], small["orders"]):
        np.testing.assert_allclose(_matrix(a["accuracy_matrix"]), _matrix(b["accuracy_matrix"]), atol=1e-12, rtol=0)


def test_class_order_pilot_is_lamda_pilots_seeded_shuffle_cut_into_tasks(store, tmp_path):
    """``--class-order pilot``: LAMDA-PILOT's order (``np.random.seed(1993); np.random.permutation(C)``) cut into
    --tasks of consecutive classes; the same run as the explicit task file of that order."""
    n_classes = len(json.loads((store / "zarr.json").read_text())["attributes"]["classes"])
    np.random.seed(1993)
    permutation = np.random.permutation(n_classes).tolist()
    size = n_classes // 4
    expected = [sorted(permutation[t * size:(t + 1) * size]) for t in range(4)]
    assert n_classes % 4 == 0
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "pilot"), *COMMON, "--class-order", "pilot"])
    named = json.loads((tmp_path / "pilot" / "metrics.json").read_text())
    assert named["tasks"] == expected
    order_file = tmp_path / "order.json"
    order_file.write_text(json.dumps(expected))
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "file"), *COMMON, "--class-order", str(order_file)])
    explicit = json.loads((tmp_path / "file" / "metrics.json").read_text())
    assert named["accuracy_matrix"] == explicit["accuracy_matrix"] and named["A_last"] == explicit["A_last"]
    np.random.seed(7)
    other = np.random.permutation(n_classes).tolist()
    _invoke(["learn", "--features", str(store), "--out", str(tmp_path / "seven"), *COMMON, "--class-order", "pilot:7"])
    seven = json.loads((tmp_path / "seven" / "metrics.json").read_text())
    assert seven["tasks"] == [sorted(other[t * size:(t + 1) * size]) for t in range(4)] != expected


def test_class_order_pilot_refusals(store, tmp_path, monkeypatch):
    base = ["learn", "--features", str(store), *COMMON]
    cases = [(["--class-order", "pilot:x"], "--class-order pilot:x is not pilot with a seed (the seed after the colon "
                                             "must be a non-negative integer); pass e.g. --class-order pilot:1993"),
             (["--class-order", "pilot", "--drop-remainder"], "--class-order pilot streams every class"),
             (["--class-order", "pilot", "--order-seeds", "0,1"], "--class-order fixes the class order")]
    monkeypatch.chdir(tmp_path)
    for extra, message in cases:
        result = runner.invoke(app, [*base, "--out", "run", *extra])
        usage = extra == ["--class-order", "pilot:x"]  # a usage error (tests/test_usage_exit_codes.py)
        assert result.exit_code == (2 if usage else 1) and message in " ".join(result.output.split()), result.output
    Path("pilot").write_text("[[0]]")
    result = runner.invoke(app, [*base, "--out", "run", "--class-order", "pilot"])
    assert result.exit_code == 1 and "names both the class order pilot and the file pilot" in result.output, result.output
    assert not Path("run").exists()


def test_a_table_of_orders_of_different_task_counts_is_refused(store: Path, tmp_path: Path) -> None:
    """``table``'s cell averages its orders under one task count: orders that stream different numbers of tasks
    (Si-Blurry) are refused before any run, naming each order's count (the cell recorded the first order's)."""
    counts = {}
    for s in (0, 1):
        _invoke(["learn", "--features", str(store), "--out", str(tmp_path / f"one-{s}"), *BLURRY, "--order-seed", str(s)])
        counts[s] = json.loads((tmp_path / f"one-{s}" / "metrics.json").read_text())["n_tasks"]
    assert counts[0] != counts[1]
    result = runner.invoke(app, ["table", "--features", str(store), "--out", str(tmp_path / "t"), *BLURRY,
                                 "--gamma", "1", "--order-seeds", "0,1"])
    assert result.exit_code == 1 and "Traceback" not in result.output and not (tmp_path / "t").exists()
    assert (f"at --tasks 6 the class orders stream different numbers of tasks (0: {counts[0]}, 1: {counts[1]}; "
            "--stream si-blurry" in " ".join(result.output.split())), result.output
