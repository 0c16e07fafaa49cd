"""params.yaml's values are checked by `settings@NAME`, the pipeline's first stage, before anything is written: a
wrong type or an unknown value is one line naming the key and what it takes (stages/_params.py `check`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import STAGES, params_with

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def resolve():
    if str(STAGES) not in sys.path:
        sys.path.insert(0, str(STAGES))
    import _params

    return _params.resolve, _params.ParamsError


@pytest.mark.parametrize(("section", "key"), [("extract", "normalize"), ("extract", "keep_blocks"), ("extract", "download"),
                                              ("learn", "drop_last"), ("learn", "drop_remainder"), ("learn", "mask_unseen")])
@pytest.mark.parametrize("value", ["false", "true", "maybe", 0])
def test_quoted_booleans_are_refused(resolve, section, key, value):
    """`normalize: "false"` ran with --normalize (a non-empty string is true); a boolean must be a YAML boolean."""
    resolve, error = resolve
    with pytest.raises(error, match=re.escape(f"{section}.{key} in params.yaml must be a YAML boolean, true or false "
                                              f"(unquoted), got {value!r}")):
        resolve(params_with(**{section: {key: value}}), "digits")


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("learn", "order_seeds", 3, "a YAML list of non-negative integers"),
        ("learn", "order_seeds", [0, "x"], "a YAML list of non-negative integers"),
        ("learn", "tasks", "five", "a positive integer, or null"),
        ("learn", "tasks", 0, "a positive integer, or null"),
        ("learn", "activation", "bogus", "one of sigmoid, relu, identity, cos"),
        ("learn", "batch_size", [10], "a positive integer"),
        ("learn", "projection_dim", -1, "a non-negative integer"),
        ("learn", "gamma", "small", "a positive number or auto"),
        ("learn", "gamma", "-1e-3", "a positive number or auto"),
        ("learn", "gamma", 0, "a positive number or auto"),
        ("learn", "engine", "fast", "one of gram, rls"),
        ("learn", "seed", True, "a non-negative integer"),
        ("extract", "fusion", "nope", "a fusion spec string"),
        ("extract", "dtype", "float64", "one of float32, float16"),
        ("extract", "test_split", 1.5, "a fraction between 0 and 1, or null"),
        ("extract", "model_kwargs", "img_size=32", "a YAML mapping"),
        ("sweep", "gammas", [0.1, -1], "a YAML list of positive numbers, not empty, or null"),
        ("sweep", "select", "best", "one of loo, gcv, loo_accuracy, test"),
        ("sweep", "fusions", "last", "a YAML list of fusion specs"),
        ("table", "heads", ["ridge", "nope"], "a YAML list of heads (ridge, "),
        ("table", "tasks", 5, "a YAML list of positive integers, not empty"),
    ],
)
def test_wrong_types_and_values_are_refused(resolve, section, key, value, expected):
    resolve, error = resolve
    with pytest.raises(error, match=re.escape(f"{section}.{key} in params.yaml must be {expected}")):
        resolve(params_with(**{section: {key: value}}), "digits")


def test_gammas_in_exponent_form_are_numbers(resolve):
    """PyYAML reads `1e-3` (no dot) as a string; the stages pass it on as the number it spells, so it is accepted."""
    resolve, _ = resolve
    text = yaml.safe_load("learn: {gamma: 1e-3}\nsweep: {gammas: [1e-3, 1]}")
    assert text["learn"]["gamma"] == "1e-3"  # what the check sees
    settings = resolve(params_with(learn=text["learn"], sweep=text["sweep"]), "digits")
    assert settings["learn"]["gamma"] == "1e-3" and settings["sweep"]["gammas"] == ["1e-3", 1]


def test_an_entry_override_is_named_by_its_own_key(resolve):
    resolve, error = resolve
    params = params_with()
    params["datasets"] = {"digits": {}, "small": {"dataset": "digits", "learn": {"tasks": "five"}}}
    resolve(params, "digits")
    with pytest.raises(error, match=re.escape("datasets.small.learn.tasks in params.yaml must be a positive integer")):
        resolve(params, "small")


@pytest.mark.parametrize(("entries", "message"), [
    ({"digits": {"dataset": "nosuch"}}, "datasets.digits.dataset in params.yaml names no registered dataset ('nosuch')"),
    ({"foo": {}}, "the run name `foo` (no `dataset` key) in params.yaml names no registered dataset ('foo'); set "
                  "datasets.foo.dataset to one of: digits, "),
])
def test_an_unregistered_dataset_is_refused(resolve, entries, message):
    resolve, error = resolve
    params = params_with()
    params["datasets"] = entries
    with pytest.raises(error, match=re.escape(message)):
        resolve(params, next(iter(entries)))


def test_an_unknown_top_level_section_is_refused(resolve):
    resolve, error = resolve
    params = {**params_with(), "learnn": {"gamma": 2}}
    with pytest.raises(error, match=re.escape("params.yaml has unknown top-level sections ['learnn']; its sections "
                                              "are: datasets, extract, learn, sweep, table")):
        resolve(params, "digits")


@pytest.mark.parametrize("entries", [{}, None])
def test_an_empty_datasets_mapping_is_refused(resolve, entries):
    resolve, error = resolve
    with pytest.raises(error, match=re.escape("`datasets` in params.yaml must map run names to overrides")):
        resolve({**params_with(), "datasets": entries}, "digits")


def test_an_entry_that_is_not_a_mapping_is_refused(resolve):
    resolve, error = resolve
    params = params_with()
    params["datasets"] = {"digits": {"learn": 5}}
    with pytest.raises(error, match=re.escape("datasets.digits.learn in params.yaml must map keys of `learn` to values")):
        resolve(params, "digits")


def test_the_repository_params_pass(resolve):
    resolve, _ = resolve
    assert resolve(params_with(), "digits")["learn"]["mask_unseen"] is True


@pytest.mark.parametrize(("edit", "message"), [
    ({"extract": {"normalize": "false"}}, "Error: extract.normalize in params.yaml must be a YAML boolean"),
    ({"learn": {"order_seeds": 3}}, "Error: learn.order_seeds in params.yaml must be a YAML list"),
])
def test_the_settings_stage_refuses_in_one_line_before_writing(tmp_path, edit, message):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(**edit)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(STAGES / "settings.py"), "digits"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert not (tmp_path / "runs").exists()
