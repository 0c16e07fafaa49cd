"""metrics.json and sweep.json: each schema pinned by a literal file that reads and writes back to the same text
(plus the format and version it names), a file of another format or a newer version refused in one line, and a
malformed file refused in one line that names the key and the fix."""

from __future__ import annotations

import json

import pytest

from foal_pipe.errors import FoalPipeError
from foal_pipe.io import write_json
from foal_pipe.protocol.schema import LearnMetrics, SweepReport
from foal_pipe.report.readers import read_metrics, read_sweep

# Each literal is a file as foal-pipe wrote it before files named their format (version 1, sorted keys), cut to one
# task, one gamma, two orders or fusions; written back, it names its format and version, and metrics.json (version
# 2) keeps a continuation's keys in "continuation".
CONTINUATION_KEYS = ("init_model", "n_samples_seen_total", "label_ids", "task_names", "eval_features")
METRICS_CONTINUED_AUTO = (
    '{"A_avg": 0.603, "A_last": 0.559, "A_steps": [0.647], "F": 0.176, "F_published_code": 0.0882, '
    '"accuracy_matrix": [[0.647]], "activation": "sigmoid", "backend": "numpy", "batch_size": 10, "dataset": '
    '"synthetic", "drop_last": false, "drop_remainder": false, "dropped_classes": [], "dtype": "float64", '
    '"encoder": {"name": "synthetic"}, "engine": "gram", "eval_features": [{"accuracy": 0.5, "features": '
    '"old.zarr", "n_test": 30, "unknown_class_rows": 0}], "feature_dim": 12, "features": "a.zarr", "gamma": '
    '"auto", "gamma_grid": [0.0001], "gammas_at_grid_edge": [false], "gammas_selected": [1.0], "init_model": '
    '"run/model.safetensors", "label_ids": {"ant": 0, "bee": 1, "hen": 3, "ibis": 4}, "mask_unseen": true, '
    '"n_samples_seen_total": 190, "n_tasks": 2, "n_test": 34, "n_train_seen": 100, "order_seed": 0, '
    '"projection_dim": 40, "projection_init": "uniform", "seed": 0, "selected_by": "loo", "tasks": [[0]]}'
)

METRICS_ORDERS = (
    '{"A_avg": 0.722, "A_last": 0.661, "A_steps": [0.817], "F": 0.0917, "F_published_code": 0.0694, '
    '"accuracy_matrix": [[0.817]], "activation": "sigmoid", "backend": "numpy", "batch_size": 10, "dataset": '
    '"synthetic", "drop_last": false, "drop_remainder": false, "dropped_classes": [], "dtype": "float64", '
    '"encoder": {"name": "synthetic"}, "engine": "gram", "feature_dim": 12, "features": "a.zarr", "gamma": '
    '"auto", "gamma_grid": [0.0001], "gammas_at_grid_edge": [false], "gammas_selected": [1.0], "mask_unseen": '
    'true, "mean": {"A_avg": 0.722, "A_last": 0.661, "F": 0.0917}, "n_tasks": 3, "n_test": 70, "n_train_seen": '
    '210, "one_pass": true, "order_seeds": [0], "orders": [{"A_avg": 0.726, "A_last": 0.661, "A_steps": [0.833], '
    '"F": 0.075, "F_published_code": 0.0667, "accuracy_matrix": [[0.833]], "gammas_selected": [1.0], '
    '"order_seed": 0, "tasks": [[2]]}, {"A_avg": 0.718, "A_last": 0.661, "A_steps": [0.8], "F": 0.108, '
    '"F_published_code": 0.0722, "accuracy_matrix": [[0.8]], "gammas_selected": [1.0], "order_seed": 1, "tasks": '
    '[[0]]}], "projection_dim": 40, "projection_init": "uniform", "seed": 0, "selected_by": "gcv", "std": '
    '{"A_avg": 0.00417, "A_last": 0.0, "F": 0.0167}, "tasks": [[2]]}'
)

SWEEP_FUSIONS = (
    '{"activation": "sigmoid", "backend": "numpy", "batch_size": 10, "best": {"fusion": "last", "gamma": 0.1, '
    '"selected_by": "loo"}, "best_gamma": 0.1, "best_gamma_at_grid_edge": true, "best_gamma_test": 0.1, '
    '"best_test": {"fusion": "last", "gamma": 0.1, "selected_by": "test"}, "dataset": "digits", "drop_last": '
    'false, "drop_remainder": false, "dropped_classes": [], "dtype": "float64", "encoder": {"name": "synthetic"},'
    ' "feature_dim": 32, "features": "a.zarr", "fusion": "last", "fusion_norm": true, "fusions": [{"best_gamma": '
    '0.1, "best_gamma_test": 0.1, "fusion": "mean-cls", "results": [{"A_avg": 0.557, "A_last": 0.404, "A_steps": '
    '[0.75], "F": 0.209, "F_published_code": 0.167, "accuracy_matrix": [[0.75]], "gamma": 0.1, "gcv": [0.443], '
    '"loo_accuracy": [0.669], "loo_mse": [0.221]}, {"A_avg": 0.441, "A_last": 0.292, "A_steps": [0.611], "F": '
    '0.269, "F_published_code": 0.215, "accuracy_matrix": [[0.611]], "gamma": 1.0, "gcv": [0.487], '
    '"loo_accuracy": [0.576], "loo_mse": [0.243]}]}, {"best_gamma": 0.1, "best_gamma_test": 0.1, "fusion": '
    '"last", "results": [{"A_avg": 0.61, "A_last": 0.466, "A_steps": [0.792], "F": 0.146, "F_published_code": '
    '0.117, "accuracy_matrix": [[0.792]], "gamma": 0.1, "gcv": [0.383], "loo_accuracy": [0.755], "loo_mse": '
    '[0.192]}, {"A_avg": 0.502, "A_last": 0.326, "A_steps": [0.708], "F": 0.265, "F_published_code": 0.212, '
    '"accuracy_matrix": [[0.708]], "gamma": 1.0, "gcv": [0.473], "loo_accuracy": [0.648], "loo_mse": [0.236]}]}],'
    ' "gammas": [0.1], "mask_unseen": true, "n_tasks": 5, "n_test": 355, "n_train_seen": 1442, "order_seed": 0, '
    '"projection_dim": 40, "projection_init": "uniform", "results": [{"A_avg": 0.61, "A_last": 0.466, "A_steps": '
    '[0.792], "F": 0.146, "F_published_code": 0.117, "accuracy_matrix": [[0.792]], "gamma": 0.1, "gcv": [0.383], '
    '"loo_accuracy": [0.755], "loo_mse": [0.192]}, {"A_avg": 0.502, "A_last": 0.326, "A_steps": [0.708], "F": '
    '0.265, "F_published_code": 0.212, "accuracy_matrix": [[0.708]], "gamma": 1.0, "gcv": [0.473], '
    '"loo_accuracy": [0.648], "loo_mse": [0.236]}], "seed": 0, "selected_by": "loo", "tasks": [[4]]}'
)

SWEEP_ORDERS = (
    '{"activation": "sigmoid", "backend": "numpy", "batch_size": 10, "best_gamma": 0.1, '
    '"best_gamma_at_grid_edge": true, "best_gamma_test": 0.1, "dataset": "synthetic", "drop_last": false, '
    '"drop_remainder": false, "dropped_classes": [], "dtype": "float64", "encoder": {"name": "synthetic"}, '
    '"feature_dim": 12, "features": "a.zarr", "gammas": [0.1], "mask_unseen": true, "n_tasks": 3, "n_test": 70, '
    '"n_train_seen": 210, "one_pass": true, "order_seed": 0, "order_seeds": [0], "orders": [{"best_gamma": 0.1, '
    '"order_seed": 0, "results": [{"A_avg": 0.737, "A_last": 0.661, "A_steps": [0.867], "F": 0.0917, '
    '"F_published_code": 0.0778, "accuracy_matrix": [[0.867]], "gamma": 0.1, "gcv": [0.498], "loo_accuracy": '
    'null, "loo_mse": null}, {"A_avg": 0.688, "A_last": 0.572, "A_steps": [0.833], "F": 0.183, '
    '"F_published_code": 0.122, "accuracy_matrix": [[0.833]], "gamma": 1.0, "gcv": [0.496], "loo_accuracy": null,'
    ' "loo_mse": null}], "tasks": [[2]]}, {"best_gamma": 0.1, "order_seed": 1, "results": [{"A_avg": 0.74, '
    '"A_last": 0.661, "A_steps": [0.867], "F": 0.142, "F_published_code": 0.0944, "accuracy_matrix": [[0.867]], '
    '"gamma": 0.1, "gcv": [0.418], "loo_accuracy": null, "loo_mse": null}, {"A_avg": 0.652, "A_last": 0.556, '
    '"A_steps": [0.8], "F": 0.117, "F_published_code": 0.0778, "accuracy_matrix": [[0.8]], "gamma": 1.0, "gcv": '
    '[0.413], "loo_accuracy": null, "loo_mse": null}], "tasks": [[0]]}], "projection_dim": 40, "projection_init":'
    ' "uniform", "results": [{"A_avg": 0.738, "A_last": 0.661, "A_steps": [0.867], "F": 0.117, '
    '"F_published_code": 0.0778, "accuracy_matrix": [[0.867]], "gamma": 0.1, "gcv": [0.498], "loo_accuracy": '
    'null, "loo_mse": null, "std": {"A_avg": 0.00139, "A_last": 0.0, "F": 0.025}}, {"A_avg": 0.67, "A_last": '
    '0.564, "A_steps": [0.833], "F": 0.15, "F_published_code": 0.122, "accuracy_matrix": [[0.833]], "gamma": 1.0,'
    ' "gcv": [0.496], "loo_accuracy": null, "loo_mse": null, "std": {"A_avg": 0.0181, "A_last": 0.00833, "F": '
    '0.0333}}], "seed": 0, "selected_by": "test", "tasks": [[2]]}'
)

STAMPS = {LearnMetrics: {"format": "foal-pipe/metrics", "format_version": 3},
          SweepReport: {"format": "foal-pipe/sweep", "format_version": 2}}
LITERALS = {"metrics continued, gamma auto": (LearnMetrics, METRICS_CONTINUED_AUTO),
            "metrics of class orders": (LearnMetrics, METRICS_ORDERS),
            "sweep of fusions": (SweepReport, SWEEP_FUSIONS),
            "sweep of class orders, no LOO": (SweepReport, SWEEP_ORDERS)}


@pytest.mark.parametrize(("kind", "text"), LITERALS.values(), ids=LITERALS)
def test_literal_file_reads_and_writes_back_to_the_same_text(kind, text, tmp_path):
    record = kind.from_dict(json.loads(text))
    assert record.extra == {}  # every key is a field of the record
    stamped = {**as_version_2(kind, json.loads(text)), **STAMPS[kind]}
    assert json.dumps(record.to_dict(), sort_keys=True) == json.dumps(stamped, sort_keys=True)
    write_json(tmp_path / "out.json", record.to_dict())  # the writers' path: indented, sorted keys
    assert (tmp_path / "out.json").read_text() == json.dumps(stamped, indent=2, sort_keys=True) + "\n"
    again = kind.from_dict(json.loads((tmp_path / "out.json").read_text()))
    assert again == record and again.extra == {}  # the format and version are read, not kept as unknown keys


def as_version_2(kind, data: dict) -> dict:
    """A version 1 file as version 2 writes it: metrics.json's continuation keys moved into "continuation"."""
    moved = {k: data[k] for k in CONTINUATION_KEYS if k in data} if kind is LearnMetrics else {}
    return {**{k: v for k, v in data.items() if k not in moved}, **({"continuation": moved} if moved else {})}


def test_a_version_1_continuation_reads_into_its_record():
    data = json.loads(METRICS_CONTINUED_AUTO)
    for version in ({}, {"format": "foal-pipe/metrics", "format_version": 1}):
        metrics = LearnMetrics.from_dict({**data, **version})
        assert metrics.continuation.init_model == "run/model.safetensors" and metrics.extra == {}
        assert metrics.continuation.label_ids == {"ant": 0, "bee": 1, "hen": 3, "ibis": 4}
        assert metrics.continuation.eval_features[0].accuracy == 0.5 and metrics.continuation.n_samples_seen_total == 190
    written = metrics.to_dict()
    assert written["continuation"] == {k: data[k] for k in CONTINUATION_KEYS if k in data}  # this one has no task_names
    assert not written.keys() & set(CONTINUATION_KEYS)
    assert LearnMetrics.from_dict(written) == metrics  # version 2 reads back as written
    assert LearnMetrics.from_dict(json.loads(METRICS_ORDERS)).continuation is None  # not a continuation: absent


@pytest.mark.parametrize(("kind", "text"), [(LearnMetrics, METRICS_ORDERS), (SweepReport, SWEEP_ORDERS)],
                         ids=["metrics", "sweep"])
@pytest.mark.parametrize("version", [99, 0, "1", None, 1.5])
def test_a_version_this_foal_pipe_does_not_read_is_refused_in_one_line(kind, text, version, tmp_path):
    data = {**json.loads(text), "format": STAMPS[kind]["format"], "format_version": version}
    with pytest.raises(FoalPipeError) as info:
        kind.from_dict(data, "runs/x/f.json")
    reads = f"{STAMPS[kind]['format']} versions 1 to {STAMPS[kind]['format_version']}"
    assert str(info.value) == (f"runs/x/f.json has format_version {json.dumps(version)}, which this foal-pipe does not "
                               f"read (it reads {reads}); upgrade foal-pipe to read it")
    path = tmp_path / kind.NAME
    path.write_text(json.dumps(data))
    with pytest.raises(FoalPipeError, match=f"^{path} has format_version"):
        (read_metrics if kind is LearnMetrics else read_sweep)(path)


def test_a_file_of_the_other_format_is_refused_in_one_line():
    sweep = SweepReport.from_dict(json.loads(SWEEP_ORDERS)).to_dict()
    with pytest.raises(FoalPipeError) as info:
        LearnMetrics.from_dict(sweep, "runs/x/metrics.json")
    assert str(info.value) == ('runs/x/metrics.json is a "foal-pipe/sweep" file, not a foal-pipe/metrics file '
                               "(metrics.json); pass the metrics.json of a foal-pipe run")


def test_the_cli_refuses_a_newer_metrics_file_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from foal_pipe.cli import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({**json.loads(METRICS_ORDERS), "format_version": 9}))
    result = CliRunner().invoke(app, ["summary", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "has format_version 9, which this foal-pipe does not read" in result.output


def test_fields_are_typed_and_nested_records_are_records():
    sweep = SweepReport.from_dict(json.loads(SWEEP_FUSIONS))
    assert sweep.best.fusion == "last" and sweep.fusions[1].results[0].gamma == 0.1
    orders = SweepReport.from_dict(json.loads(SWEEP_ORDERS))
    assert orders.results[0].loo_mse is None and orders.results[0].to_dict()["loo_mse"] is None  # null, not absent
    metrics = LearnMetrics.from_dict(json.loads(METRICS_CONTINUED_AUTO))
    assert metrics.continuation.eval_features[0].unknown_class_rows == 0 and metrics.gamma == "auto"


def test_keys_of_other_versions_are_kept_and_absent_keys_stay_absent():
    old = {"accuracy_matrix": [[0.5]], "A_avg": 0.5, "A_last": 0.5, "F": 0.0, "seconds": 2.0, "later_key": [1]}
    record = LearnMetrics.from_dict(old)
    assert record.seconds == 2.0 and record.extra == {"later_key": [1]} and record.gamma is None
    assert record.to_dict() == {**old, **STAMPS[LearnMetrics]}


@pytest.mark.parametrize(
    ("kind", "text", "change", "message"),
    [
        (LearnMetrics, METRICS_ORDERS, {"A_avg": "high"}, "metrics.json has no number in [0, 1] under 'A_avg' (found \"high\")"),
        (LearnMetrics, METRICS_ORDERS, {"one_pass": 1}, "has no boolean under 'one_pass' (found 1)"),
        (LearnMetrics, METRICS_ORDERS, {"tasks": [[0.5]]}, "has no list of lists of label ids under 'tasks'"),
        (LearnMetrics, METRICS_ORDERS, {"gamma": 0}, "has no number > 0 or \"auto\" under 'gamma' (found 0)"),
        (LearnMetrics, METRICS_ORDERS, {"F": None}, "has no number under 'F' (found null)"),
        (LearnMetrics, METRICS_ORDERS, {"accuracy_matrix": [[0.5], [1]]},
         "row 1 of 'accuracy_matrix' should have 2 entries"),
        (SweepReport, SWEEP_ORDERS, {"selected_by": "magic"},
         "has no criterion (loo, gcv, loo_accuracy, test) under 'selected_by'"),
        (SweepReport, SWEEP_FUSIONS, {"best": {"fusion": "last"}}, "sweep.json: best has no 'gamma' number"),
    ],
)
def test_a_wrong_type_is_refused_in_one_line(kind, text, change, message):
    with pytest.raises(FoalPipeError) as info:
        kind.from_dict({**json.loads(text), **change})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).endswith("to write it")  # names the fix


@pytest.mark.parametrize(("kind", "text", "missing"), [(LearnMetrics, METRICS_ORDERS, "accuracy_matrix"),
                                                       (LearnMetrics, METRICS_ORDERS, "F"),
                                                       (SweepReport, SWEEP_ORDERS, "results")])
def test_a_missing_key_is_refused_in_one_line(kind, text, missing):
    data = json.loads(text)
    del data[missing]
    with pytest.raises(FoalPipeError, match=f"^{kind.NAME} has no '{missing}' .*; re-run `foal-pipe [a-z]+ --out DIR`"):
        kind.from_dict(data)


def test_a_malformed_nested_record_names_its_place():
    data = json.loads(SWEEP_ORDERS)
    data["orders"][1]["results"][0]["gcv"] = 0.5
    with pytest.raises(FoalPipeError, match=r"^runs/x/sweep.json: orders\[1\]: results\[0\] has no list of numbers or "
                                            r"nulls .* under 'gcv' \(found 0.5\)"):
        SweepReport.from_dict(data, "runs/x/sweep.json")
