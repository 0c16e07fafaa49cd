"""timings.json names the record written with it by its SHA-256, so a run whose metrics.json (or sweep.json) was
restored without its times (``dvc checkout``: timings.json is not a pipeline output; a copy) shows no wall time
rather than another run's."""

from __future__ import annotations

import hashlib
import json
import shutil

from helpers import build_store, invoke

from foal_pipe.report.discovery import RunSummary
from foal_pipe.report.readers import read_metrics

ARGS = ("--projection-dim", "20", "--tasks", "3", "--seed", "3", "--backend", "numpy")


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_timings_name_their_record_and_another_records_times_are_not_shown(tmp_path):
    store = build_store(tmp_path / "a.zarr")
    for name, gamma in (("one", "1"), ("two", "0.1")):
        result = invoke("learn", "--features", store, "--out", tmp_path / name, "--gamma", gamma, *ARGS)
        assert result.exit_code == 0, result.output
    one, two = tmp_path / "one", tmp_path / "two"
    timings = json.loads((one / "timings.json").read_text())
    assert timings["of"] == {"file": "metrics.json", "sha256": _sha256(one / "metrics.json")}
    assert RunSummary(one, metrics=read_metrics(one)).seconds == timings["total"]
    shutil.copy(two / "metrics.json", one / "metrics.json")  # the record restored, its times not
    shutil.copy(two / "model.safetensors", one / "model.safetensors")
    restored = RunSummary(one, metrics=read_metrics(one))
    assert restored.timings_of_another and restored.seconds is None
    result = invoke("summary", one)
    assert result.exit_code == 0, result.output
    assert "timings.json is of another record" in " ".join(result.output.split())
    (row,) = [line.split() for line in result.output.splitlines() if line.split()[:1] == [str(one)]]
    assert row[-1] == "?"  # the time column


def test_a_sweeps_timings_name_the_sweep(tmp_path):
    store = build_store(tmp_path / "a.zarr")
    result = invoke("sweep", "--features", store, "--out", tmp_path / "s", "--gammas", "0.1,1", "--no-loo", *ARGS)
    assert result.exit_code == 0, result.output
    timings = json.loads((tmp_path / "s" / "timings.json").read_text())
    assert timings["of"] == {"file": "sweep.json", "sha256": _sha256(tmp_path / "s" / "sweep.json")}
    for seeds in ("0,1",):
        out = tmp_path / f"o{seeds}"
        result = invoke("sweep", "--features", store, "--out", out, "--gammas", "0.1,1", "--no-loo",
                        "--order-seeds", seeds, *ARGS)
        assert result.exit_code == 0, result.output
        assert json.loads((out / "timings.json").read_text())["of"]["sha256"] == _sha256(out / "sweep.json")
        result = invoke("learn", "--features", store, "--out", out / "l", "--order-seeds", seeds, *ARGS)
        assert result.exit_code == 0, result.output
        of = json.loads((out / "l" / "timings.json").read_text())["of"]
        assert of == {"file": "metrics.json", "sha256": _sha256(out / "l" / "metrics.json")}
