"""benchmarks/gpu_check.py --dry-run: the device check's every step at toy sizes on the CPU, so the script a lent
GPU session runs (one call, a short lease) is known to work before anyone spends device time on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert report["dry_run"] is True and set(report["parts"]) == {"refusals", "learner", "learn", "extract", "cifar",
                                                                      "startup", "heads", "online", "copies"}
    assert report["machine"]["commit"] == "0123abcd"  # the tree's commit as the caller names it
    assert not [name for name, part in report["parts"].items() if "error" in part]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]  # scratch files went elsewhere

    refusals = report["parts"]["refusals"]
    for backend in BACKENDS:
        def refused(r: dict) -> None:  # refused, or within 1e-4 of the closed form (relative, Frobenius: DRIFTS)
            assert r["cholesky_or_none_gives_none"] is True and r["solve_spd"] == "refused"
            assert r["rank_one_gamma_1e-06"] == "refused" and r["rank_one_gamma_1"] <= 1e-6
            assert r["rank_one_gamma_1e-05"] == "refused" or r["rank_one_gamma_1e-05"] <= 1e-4
        _skipped_or(refusals[backend], refused)
    assert "skipped" not in refusals["numpy"]

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


VIT_VARIANTS = ("eager", "no_sdpa", "channels_last", "eager_with_resize", "cuda_graph", "eager_again", "compile")


def test_gpu_check_vit_dry_run_measures_every_variant(tmp_path):
    """Part ``vit`` (issue 33's extraction at the model's speed) at toy sizes on the CPU: every variant has its row,
    numbers where it ran, the reason where it did not (CUDA graphs and the compile need a device run)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--parts", "vit",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["plan"]["parts"]["vit"]["deadline_s"] == 150 and report["plan"]["fits"] is True
    vit = report["parts"]["vit"]
    assert "error" not in vit, vit
    assert vit["device"] == "cpu" and vit["batch"] == 32 and vit["image_size"] == 64 and vit["from_px"] == 32
    assert vit["attention_modules"] == 2 and vit["fused_attn"] == [True]  # depth 2; flags restored after no_sdpa
    variants = vit["variants"]
    assert tuple(variants) == VIT_VARIANTS
    table = [line for line in proc.stdout.splitlines() if line.startswith("│ vit")]
    for name in VIT_VARIANTS:
        assert [line for line in table if f"│ {name} " in line], (name, proc.stdout)
    for name in ("eager", "no_sdpa", "channels_last", "eager_with_resize", "eager_again"):
        run = variants[name]
        assert "error" not in run and "skipped" not in run, (name, run)
        assert run["images_per_s"] > 0 and run["x_eager"] == run["images_per_s"] / variants["eager"]["images_per_s"]
    for name in ("eager", "no_sdpa", "channels_last", "eager_again"):
        run = variants[name]
        assert run["bit_identical"] == (run["max_abs_diff"] == 0) and run["max_abs_diff"] < 1e-4, (name, run)
    assert variants["eager"]["bit_identical"] is True and variants["eager"]["x_eager"] == 1.0  # fp32 CPU, one thread
    assert variants["eager_again"]["bit_identical"] is True  # after every variant: the model is as it was
    assert variants["no_sdpa"]["eager_after_restore_bit_identical"] is True
    assert variants["channels_last"]["eager_after_restore_bit_identical"] is True
    assert variants["channels_last"]["conv_weight_channels_last"] is True
    assert variants["cuda_graph"] == {"skipped": "needs CUDA"}
    assert "skipped" in variants["compile"] and "CUDA" in variants["compile"]["skipped"]


def _vit_run(tmp_path, seconds_left: float, compile_variant: bool = True) -> dict:
    """Part ``vit`` in this process at the dry run's sizes, with ``seconds_left`` before its deadline."""
    import time

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check
    import gpu_vit

    sz = gpu_check.DRY
    kit = gpu_vit.Kit(rate=gpu_check._rate, peak_reset=gpu_check._peak_reset, peak_gib=gpu_check._peak_gib,
                      one_line=gpu_check._one_line)
    out: dict = {}
    gpu_vit.part_vit(gpu_vit.VitSizes(model=sz.model, model_kwargs=sz.model_kwargs,
                                      checkpoint=gpu_check._checkpoint(sz, tmp_path / "vit.safetensors"),
                                      batch=sz.c_batch, repeats=sz.repeats,
                                      ends_at=time.perf_counter() + seconds_left, compile=compile_variant), out, kit)
    return out["variants"]


@pytest.mark.slow  # 20 s: dynamo traces the toy ViT twice
def test_gpu_vit_compile_variant_fused_then_without_hooks(tmp_path, monkeypatch):
    """The compile variant's two paths, with dynamo's ``eager`` backend (the tracing without inductor's minutes):
    the fused forward with its hooks in one graph, against eager's bits; where that is refused, timm's
    ``forward_features`` without the hooks against ``plain_features``; and no compile without the time for it."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager"}))
    fused = _vit_run(tmp_path, 150)["compile"]
    assert "error" not in fused and "hooks_not_compiled" not in fused, fused
    assert fused["compiled"].startswith("enc.features") and fused["compile_s"] > 0 and fused["images_per_s"] > 0
    assert fused["bit_identical"] is True and fused["max_abs_diff"] == 0 and fused["two_calls_bit_identical"] is True

    def refusing(fn, **kw):
        if kw.get("fullgraph"):
            raise RuntimeError("graph break in a hook")
        return real(fn, **{**kw, "backend": "eager"})

    monkeypatch.setattr(torch, "compile", refusing)
    plain = _vit_run(tmp_path, 150)["compile"]
    assert "error" not in plain and plain["hooks_not_compiled"] == "RuntimeError: graph break in a hook", plain
    assert plain["compiled"].startswith("model.forward_features") and plain["plain_eager_images_per_s"] > 0
    assert plain["bit_identical"] is True and plain["two_calls_bit_identical"] is True

    def inductor_fails(fn, **kw):
        def first_call(*args):
            raise torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, RuntimeError("no C compiler"), None)
        return first_call

    monkeypatch.setattr(torch, "compile", inductor_fails)  # not the hooks: no second compile, the reason kept
    failed = _vit_run(tmp_path, 150)["compile"]
    assert "no C compiler" in failed["error"] and "hooks_not_compiled" not in failed and "images_per_s" not in failed
    late = _vit_run(tmp_path, 20)
    assert late["compile"]["skipped"].startswith("not run: no time") and late["eager"]["bit_identical"] is True


def test_gpu_vit_time_cap_stops_its_block_and_rearms_the_part_deadline():
    import signal
    import time

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check
    import gpu_vit

    with gpu_check.deadline(30):
        handler = signal.getsignal(signal.SIGALRM)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="cap of 1 s"), gpu_vit.time_cap(1):
            time.sleep(10)
        assert time.monotonic() - start < 5
        assert signal.getsignal(signal.SIGALRM) is handler
        left = signal.alarm(0)  # reading the alarm cancels it: the deadline's finally disarms it anyway
        assert 25 <= left <= 30


def test_gpu_vit_rows_say_each_variant_in_one_line():
    """The table's rows from a device-like result: rates, ratios, bits, a skip, a fallback and a compile cut short."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_vit

    result = {"timm_use_fused_attn": True, "attention_modules": 12, "fused_attn": [True],
              "sdpa_backends_enabled": ["flash", "math"], "variants": {
                  "eager": {"images_per_s": 9050.4, "x_eager": 1.0, "max_abs_diff": 0.0, "bit_identical": True,
                            "peak_gpu_gib": 1.834},
                  "no_sdpa": {"images_per_s": 6000.0, "x_eager": 0.663, "max_abs_diff": 0.0078125,
                              "bit_identical": False},
                  "cuda_graph": {"skipped": "needs CUDA"},
                  "compile": {"hooks_not_compiled": "Unsupported: hook", "compile_s": 41.26, "images_per_s": 9500.0,
                              "x_eager": 1.05, "max_abs_diff": 0.0, "bit_identical": True,
                              "two_calls_bit_identical": True}}}
    rows = {what: text for what, text, _target in gpu_vit.rows(result)}
    assert rows["attention"] == ("timm use_fused_attn True, 12 modules with fused_attn [True]; SDPA backends: flash, "
                                 "math")
    assert rows["eager"] == "9,050 images/s, 1.00x eager, bit-identical, peak 1.83 GiB"
    assert rows["no_sdpa"] == "6,000 images/s, 0.66x eager, max diff 0.00781"
    assert rows["cuda_graph"] == "skipped: needs CUDA"
    assert rows["compile"] == ("9,500 images/s, 1.05x plain eager (timm's forward_features), bit-identical, compile "
                               "41.3 s, two calls bit-identical, the hooked forward did not compile: Unsupported: hook")
    cut = {"variants": {"compile": {"compile_s": 90.0, "error": "TimeoutError: stopped at its cap of 90 s"}}}
    assert list(gpu_vit.rows(cut)) == [("compile", "compile 90.0 s, error: TimeoutError: stopped at its cap of 90 s",
                                        "faster than eager, bit-identical to it")]


def test_part_vit_runs_after_every_other_part_asked_for(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from gpu_check import run_order

    assert run_order(["extract", "vit", "cifar", "copies"]) == ["extract", "cifar", "copies", "vit"]
    assert run_order(["scale", "cifar"]) == ["scale", "cifar"]
