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
