"""Audit s25: backward compatibility -- files older foal-pipe versions wrote, read by this one.

Method (scratch, not kept here): stores of formats 1-4 made from a format-5 digits store (the manifest dropped,
chunk records removed, the generation id recomputed as each format computed it) gave learn, predict, evaluate and
continuation refusals equal to the format-5 store's; source trees of eff8f8b (2026-11-26, before model files named
their format and before sweep criteria), 04180d0^ (model format 1), c8a5c7b (the first head files) and 17e6a56^ (sweep
--heads --order-seeds before per-order gammas) wrote stores, runs, sweeps and model files that this tree read as the
docs say (a pre-format model refused in one line, an old sweep labelled "test A_avg (old sweep)", predictions equal
to a fresh model's, evaluations equal but for the rounding of the newer solve). Every learn run of ridge (rls,
--gamma auto, float32, relu, another seed or init, D = 0, --order-seeds) and of every head but dual, its
metrics.json rewritten as format 1 or 2 without ``model_checksum``, evaluated to the same files as the current run.

Faults found, fixed (each test failed for its reason before the fix):

1. A dual run whose metrics.json predates ``model_checksum`` (format_version 1 or 2: every dual run written before
   88d81f5, 2026-11-26 23:58, and ``tests/helpers.as_old_run`` of one today) cannot be evaluated: evaluate refuses the run's own
   model file as "not the model run DIR wrote: head options {'batch_size': 10, ...} in the file, {...} in the run's
   metrics.json". The model file records dual's ``batch_size`` among its head options (docs/model-file.md: "dual's
   `batch_size` included"); metrics.json records it as the run's ``batch_size``, never in ``head_options``, so the
   exact comparison of the two dicts in ``foal_pipe/report/discovery.py`` (``_other_model``) can never match for
   dual. docs/evaluate.md: a run written before that key "is compared by what both files record".
2. A sweep.json written before ``--activation`` (foal-pipe before 08b17c9, 2026-11-26 03:38, e.g. eff8f8b: no ``activation``
   key, every sweep the sigmoid) is taken by evaluate as the sweep of a ``--activation relu`` run of the same store and
   settings: its sigmoid gamma curve is written to gamma.csv and summary.md as the run's. The same sweep in the current
   format is left out with a note ("its activation is 'sigmoid' but the run's metrics.json has 'relu'"). evaluate
   compares SWEPT_SETTINGS only where both files record them (``foal_pipe/report/discovery.py``, ``_setting``), and a
   missing ``activation`` is not read as the sigmoid it was (as ``report/paper.py`` reads it, and as ``_setting``
   already reads a missing ``stream`` as ``disjoint``). The reverse (a pre-activation run, a current relu sweep) pairs
   alike. Checked on genuine files: eff8f8b's sweep beside a relu run of this tree; fault 1 on
   c8a5c7b's dual run.

Not faults (documented): a model file older than format 1 (no ``format``) is refused, so ``evaluate`` of such a run
refuses the whole run; ``summary --group activation`` puts a run written before ``--activation`` in a cell ``-`` of
its own ("runs that do not record a key are not compared on it").
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

from helpers import as_old_run, cluster_store, invoke


def _evaluation(run: Path, out: Path):
    return invoke("evaluate", "--run", run, "--out", out, "--no-plots")


def test_dual_run_from_before_model_checksum_evaluates_with_its_own_model(tmp_path):
    store = cluster_store(tmp_path / "s.zarr", n_classes=4, dim=8, n_test=40, chunk_rows=64, seed=1, n_train=160)
    run = tmp_path / "run"
    learned = invoke("learn", "--features", store, "--out", run, "--head", "dual", "--projection-dim", 16, "--tasks", 2)
    assert learned.exit_code == 0, learned.output
    current = _evaluation(run, tmp_path / "now")
    assert current.exit_code == 0, current.output  # the premise: the same run, in the current format, evaluates
    old = tmp_path / "old"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("eval"))
    metrics = as_old_run(old)  # as dual runs were written before model_checksum (the same keys otherwise)
    assert metrics["head"] == "dual" and "batch_size" not in metrics["head_options"]
    result = _evaluation(old, tmp_path / "then")
    assert result.exit_code == 0, " ".join(result.output.split())
    compared = filecmp.dircmp(tmp_path / "now", tmp_path / "then")
    assert sorted(compared.left_list) == sorted(compared.right_list)
    assert [f for f in compared.diff_files if f != "summary.md"] == []  # summary.md names the run's folder
    now, then = (json.loads((tmp_path / d / "scores.json").read_text()) for d in ("now", "then"))
    assert now == then


#: The keys of a sweep.json as foal-pipe wrote it before ``--activation`` (eff8f8b, 2026-11-26: every run the sigmoid),
#: and of each of its results.
PRE_ACTIVATION_SWEEP = ("backend", "batch_size", "best_gamma", "dataset", "drop_last", "dropped_classes", "dtype", "encoder",
                        "features", "gammas", "mask_unseen", "n_tasks", "n_train_seen", "projection_dim", "projection_init",
                        "results", "seed", "tasks")
PRE_ACTIVATION_RESULT = ("A_avg", "A_last", "A_steps", "F", "F_published_code", "accuracy_matrix", "gamma")


def test_sweep_from_before_activation_is_not_taken_for_a_relu_runs_sweep(tmp_path):
    """Fault 2: a sweep written before ``--activation`` swept the sigmoid (docs/learn.md: the default; paper.py reads
    such files as the sigmoid), but evaluate pairs it with a ``--activation relu`` run of the same store and settings
    and reports its sigmoid gamma curve as the run's (gamma.csv, summary.md), where the same sweep in the current
    format is left out with a note naming the activation."""
    store = cluster_store(tmp_path / "s.zarr", n_classes=4, dim=8, n_test=40, chunk_rows=64, seed=1, n_train=160)
    run, sweep = tmp_path / "run", tmp_path / "run-sweep"
    common = ("--features", store, "--projection-dim", 16, "--tasks", 2)
    assert invoke("learn", *common, "--out", run, "--gamma", 1, "--activation", "relu").exit_code == 0
    assert invoke("sweep", *common, "--out", sweep, "--gammas", "0.1,1,10").exit_code == 0
    now = _evaluation(run, tmp_path / "now")
    assert now.exit_code == 0, now.output
    said = " ".join(now.output.split())
    assert "activation is 'sigmoid'" in said and not (tmp_path / "now" / "gamma.csv").exists(), said  # the premise
    data = json.loads((sweep / "sweep.json").read_text())
    results = [{k: r[k] for k in PRE_ACTIVATION_RESULT} for r in data["results"]]
    old = {k: data[k] for k in PRE_ACTIVATION_SWEEP} | {"results": results,
                                                         "best_gamma": max(results, key=lambda r: r["A_avg"])["gamma"]}
    (sweep / "sweep.json").write_text(json.dumps(old, sort_keys=True))
    then = _evaluation(run, tmp_path / "then")
    assert then.exit_code == 0, then.output
    said = " ".join(then.output.split())
    assert not (tmp_path / "then" / "gamma.csv").exists(), "a sigmoid sweep's curve given as the relu run's: " + said
    assert "Gamma sweep" not in (tmp_path / "then" / "summary.md").read_text()
