"""benchmarks/gpu_check.py --dry-run: the device check's every step at toy sizes on the CPU, so the script a lent
GPU session runs (one call, a short lease) is known to work before anyone spends device time on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKENDS, ENGINES = ("numpy", "cupy", "torch"), ("gram", "rls")


def _skipped_or(run: dict, check) -> None:
    """A backend that cannot run here says why; one that ran must pass ``check``."""
    if "skipped" in run:
        assert isinstance(run["skipped"], str) and len(run["skipped"]) > 10, run
    else:
        assert "error" not in run, run
        check(run)


def test_gpu_check_dry_run_writes_every_part(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "FOAL_PIPE_COMMIT": "0123abcd"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPU check on" in proc.stdout and "(dry run)" in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] is True and set(report["parts"]) == {"learner", "learn", "extract", "cifar", "startup",
                                                                      "heads", "online", "copies"}
    assert report["machine"]["commit"] == "0123abcd"  # the tree's commit as the caller names it
    assert not [name for name, part in report["parts"].items() if "error" in part]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]  # scratch files went elsewhere

    learner = report["parts"]["learner"]["runs"]
    assert set(learner) == {f"{b}/{e}" for b in BACKENDS for e in ENGINES}
    for run in learner.values():
        def exact(r: dict) -> None:
            assert r["W_vs_closed_form"] <= 1e-9 and r["W_vs_numpy"] <= 1e-9 and r["exact"] is True
            assert r["predictions_equal_numpy"] == 1.0
        _skipped_or(run, exact)
    assert "skipped" not in learner["numpy/gram"] and "skipped" not in learner["numpy/rls"]

    learn = report["parts"]["learn"]["runs"]
    ran = [b for b in BACKENDS if "skipped" not in learn[f"{b}/gram"]]
    assert set(learn) == {f"{b}/{e}" for b in BACKENDS for e in ENGINES} | {f"{b}/gram (warm)" for b in ran}
    host = learn["numpy/gram"]
    assert 0 < host["A_avg"] <= 1 and host["wall_s"] > 0
    for run in learn.values():
        def agrees(r: dict) -> None:
            assert r["wall_s"] > 0 and 0 < r["in_process_s"] < r["wall_s"]
            assert abs(r["A_avg_minus_numpy"]) < 1e-9 and r["W_vs_numpy"] <= 1e-9
        _skipped_or(run, agrees)
    assert "skipped" not in learn["numpy/rls"]

    extract = report["parts"]["extract"]
    for where in ("device", "workers"):
        run = extract[f"end_to_end_resize_on_{where}"]
        assert run["images_per_s"] > 0 and run["wall_s"] > 0
    assert extract["model_alone_images_per_s"] > 0 and extract["model_with_device_resize_images_per_s"] > 0
    assert extract["device_resize_vs_pil_max_levels"] == 0 and extract["features_device_vs_workers_max_abs"] == 0
    assert extract["images"] == 256 and extract["from_px"] == 32 and extract["image_size"] == 64

    cifar = report["parts"]["cifar"]
    assert cifar["images"] == 500 and set(cifar["seconds"]) == {"extract", "learn", "sweep"}
    assert cifar["total_s"] == sum(cifar["seconds"].values()) > 0
    assert cifar["n_train_seen"] == 400 and 0 <= cifar["A_avg"] <= 1  # random images: chance or below
    startup = report["parts"]["startup"]
    assert startup["help_s"] > 0 and len(startup["slowest_imports_ms"]) > 0

    heads = report["parts"]["heads"]["runs"]
    assert {key for key in heads if key.endswith("/numpy")} == {f"{h}/numpy" for h in ("ncm", "slda", "fecam",
                                                                                      "balanced", "dual")}
    assert all(0 <= run["A_last"] <= 1 and run["wall_s"] > 0 for run in heads.values())
    online = report["parts"]["online"]["runs"]
    assert 0 <= online["si-blurry --eval-every/numpy"]["A_auc"] <= 1
    for name in ("si-blurry --eval-every", "gamma auto"):
        torch_run = online[f"{name}/torch"]
        assert "skipped" in torch_run or torch_run["matrix_vs_numpy"] <= 1e-12

    copies = report["parts"]["copies"]["runs"]
    assert "skipped" in copies["cupy"]  # no GPU here
    if "skipped" not in copies["torch"]:  # torch on the CPU stands in for a device: both copies are synchronous
        run = copies["torch"]
        assert run["copy_mode"] == {"sync": "sync", "staged": "sync"}
        assert run["rows_equal_host"] == {"sync": True, "staged": True}
        assert set(run["fill_s"]) == {"host", "sync", "staged"} and min(run["fill_s"].values()) > 0


def test_gpu_check_scale_and_cifar_dry_run_plans_one_device_call(tmp_path):
    """Issue 33's device call (``--parts scale,cifar``): every run of ``scale`` at toy sizes, and a plan at the
    device's sizes that holds learn, sweep, auto and slda and fits one call with time to spare."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--parts",
                           "scale,cifar", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(report["parts"]) == ["scale", "cifar"]
    assert not [name for name, part in report["parts"].items() if "error" in part]

    plan = report["plan"]
    scale_plan = plan["parts"]["scale"]
    assert set(scale_plan["commands"]) == {"learn", "sweep", "auto", "slda"}
    assert scale_plan["commands"]["auto"][1:3] == ["learn", "--features"] and "auto" in scale_plan["commands"]["auto"]
    assert scale_plan["commands"]["sweep"][1] == "sweep" and "slda" in scale_plan["commands"]["slda"]
    assert "300,000 x 768 float16" in scale_plan["store"] and "1,000 classes" in scale_plan["store"]
    assert "2000" in scale_plan["commands"]["learn"]
    assert scale_plan["expected_s"] <= scale_plan["deadline_s"]  # the expected runs are not cut by the deadline
    assert plan["worst_s"] == plan["setup_s"] + sum(p["deadline_s"] for p in plan["parts"].values())
    assert plan["fits"] is True and plan["worst_s"] <= plan["device_call_s"] - 60

    scale = report["parts"]["scale"]
    assert "x 768 float16" in scale["store"] and scale["store_s"] > 0
    runs = scale["runs"]
    assert set(runs) == {f"{c}/{r}" for c, passes in scale_plan["runs"].items() for r in passes}
    assert all("cupy" not in key or "skipped" in run for key, run in runs.items())  # no GPU here
    for name in ("learn", "auto", "slda", "sweep"):
        host = runs[f"{name}/numpy"]
        assert "error" not in host and "skipped" not in host, host
        assert 0 < host["in_process_s"] < host["wall_s"] and host["timings"]["total"] == host["in_process_s"]
        torch_run = runs[f"{name}/torch warm"]
        if "skipped" not in torch_run:
            assert "error" not in torch_run, torch_run
            if name == "sweep":
                assert torch_run["best_gamma_equals_numpy"] is True
            else:
                assert abs(torch_run["A_avg_minus_numpy"]) < 1e-9 and 0 < host["A_avg"] <= 1
    cifar = report["parts"]["cifar"]
    assert set(cifar["seconds"]) == {"extract", "learn", "sweep"} and cifar["total_s"] > 0


def test_gpu_cold_traces_a_command_and_summarises_its_samples(tmp_path):
    """Part ``cold``'s wrapper runs a real command and reports its marks; the summary adds the sampled seconds."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_cold

    run = gpu_cold.traced(["--version"], tmp_path, "version", {"PYTHONPATH": str(REPO)}, 120)
    assert "error" not in run, run
    assert 0 < run["to_cli_imported_s"] <= run["to_atexit_s"] <= run["wall_s"]
    trace = {"marks": {"wrapper_start": 100.0, "atexit": 103.0}, "period": 0.5, "samples": [
        [0.2, "main", "core/linalg.py:149(solve_spd)", "x", True, False],
        [0.7, "main", "core/linalg.py:149(solve_spd)", "x", True, False],
        [1.2, "main", None, "['a', 'b.py']:f", False, True],
        [1.3, "reader", "protocol/rowcache.py:1(f)", "x", False, False]]}
    summary = gpu_cold.summarise(trace, 99.5, 104.0)
    assert summary["to_wrapper_s"] == 0.5 and summary["to_atexit_s"] == 3.5 and summary["after_atexit_s"] == 1.0
    assert summary["compiling_by_line"] == {"core/linalg.py:149(solve_spd)": 1.0} and summary["compiling_s"] == 1.0
    assert summary["importing_s"] == 0.5 and summary["thread_seconds"] == {"main": 1.5, "reader": 0.5}
    assert summary["main_timeline"] == {0: {"compile": 1.0}, 1: {"import": 0.5}}
