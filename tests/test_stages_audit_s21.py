"""The stages audit of session 21: settings@NAME refuses, in one line and before writing anything, a gamma too large for
a float, a dataset setting extract or learn would refuse whatever the files (a test_split for a dataset with its own
splits, no data_dir for your own files, unlabelled `images`) and run names whose folders coincide; and gammas equal in
value give the same settings bytes, so DVC reruns nothing for a gamma spelled another way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import STAGES, params_with, stage_module


def _settings(tmp_path: Path, monkeypatch, text: str, name: str = "digits") -> str | None:
    """settings@NAME on params.yaml ``text``, in this process in ``tmp_path``: its error line, having written nothing,
    or None when it wrote the settings files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(text)
    monkeypatch.setattr(sys, "argv", ["settings.py", name])
    try:
        stage_module("settings").main()
    except SystemExit as exc:
        assert not (tmp_path / "runs").exists()
        return str(exc.code)
    assert (tmp_path / "runs" / f"{name}-settings" / "learn.settings.json").is_file()
    return None


def _dump(params: dict) -> str:
    return yaml.safe_dump(params, sort_keys=False)


@pytest.mark.parametrize(("section", "key", "value", "expected"), [
    pytest.param("learn", "gamma", 10**400, "learn.gamma in params.yaml must be a positive number or auto", id="gamma"),
    pytest.param("sweep", "gammas", [0.1, 10**400], "sweep.gammas in params.yaml must be a YAML list of positive numbers",
                 id="gammas"),
])
def test_a_gamma_past_floats_range_is_one_line(tmp_path, monkeypatch, section, key, value, expected):
    """An integer too large for a float ended settings@NAME in an OverflowError traceback."""
    error = _settings(tmp_path, monkeypatch, _dump(params_with(**{section: {key: value}})))
    assert error is not None and "\n" not in error and error.startswith(f"Error: {expected}"), error


def _entry(**entry) -> str:
    params = params_with()
    params["datasets"] = {"digits": entry}
    return _dump(params)


@pytest.mark.parametrize(("entry", "fragments"), [
    ({"extract": {"test_split": 0.2}}, ["the run `digits` (dataset digits) comes with its own train and test splits",
                                        "set datasets.digits.extract.test_split: null"]),
    ({"dataset": "cifar100", "extract": {"test_split": 0.2}}, ["datasets.digits.dataset: cifar100 comes with its own"]),
    ({"dataset": "imagefolder"}, ["datasets.digits.dataset: imagefolder reads your own files, from extract.data_dir, "
                                  "which is null; set it"]),
    ({"dataset": "hdf5"}, ["datasets.digits.dataset: hdf5 reads your own files"]),
    ({"dataset": "images", "extract": {"data_dir": "pictures"}}, ["datasets.digits.dataset: images extracts unlabelled",
                                                                  "use dataset imagefolder"]),
])
def test_what_extract_or_learn_refuses_of_the_dataset_is_refused_first(tmp_path, monkeypatch, entry, fragments):
    """Each was accepted by settings@NAME (settings files and dvc.lock updated), then refused by extract@NAME, or, for
    `images`, extracted in full before learn, sweep and table all refused its store's missing train split."""
    error = _settings(tmp_path, monkeypatch, _entry(**entry))
    assert error is not None and "\n" not in error and error.startswith("Error: in params.yaml, "), error
    for fragment in fragments:
        assert fragment in error, error


def test_your_own_folder_with_a_test_split_passes(tmp_path, monkeypatch):
    assert _settings(tmp_path, monkeypatch, _entry(dataset="imagefolder", extract={"data_dir": "shapes",
                                                                                  "test_split": 0.25})) is None


@pytest.mark.parametrize("other", ["digits-sweep", "digits-table", "digits-settings"])
@pytest.mark.parametrize("run", ["digits", "other"])
def test_runs_whose_folders_coincide_are_refused(tmp_path, monkeypatch, other, run):
    """`digits` and `digits-sweep` both ran: learn@digits-sweep's run and sweep@digits's sweep.json shared
    runs/digits-sweep/ (and one timings.json). Either run's settings@NAME refuses the pair."""
    params = params_with()
    params["datasets"] = {"digits": {}, other: {"dataset": "digits"}}
    error = _settings(tmp_path, monkeypatch, _dump(params), "digits" if run == "digits" else other)
    assert error == (f"Error: the runs `digits` and `{other}` under `datasets` in params.yaml share the folder "
                     f"runs/{other}/ (the {other.split('-')[1]} folder of `digits`); rename `{other}`")


def test_runs_with_distinct_folders_pass(tmp_path, monkeypatch):
    params = params_with()
    params["datasets"] = {"digits": {}, "digits-relu": {"dataset": "digits"}, "sweep": {"dataset": "digits"}}
    assert _settings(tmp_path, monkeypatch, _dump(params), "digits-relu") is None


def _files(tmp_path: Path, monkeypatch, gamma: str, gammas: str) -> dict[str, bytes]:
    text = (STAGES.parent / "params.yaml").read_text()
    text = text.replace("  gamma: 1.0 ", f"  gamma: {gamma} ", 1).replace("  gammas: null", f"  gammas: {gammas}", 1)
    assert f"gamma: {gamma} " in text and f"gammas: {gammas}" in text
    work = tmp_path / f"{gamma}-{gammas}"
    work.mkdir()
    assert _settings(work, monkeypatch, text) is None
    return {stage: (work / "runs/digits-settings" / f"{stage}.settings.json").read_bytes() for stage in ("learn", "sweep")}


def test_gammas_equal_in_value_give_the_same_settings_bytes(tmp_path, monkeypatch):
    """`gamma: 1` and `gamma: 1.0` (or `1e-3`, a string to PyYAML, and `0.001`) wrote different learn.settings.json
    bytes, so DVC reran learn for a setting it had already run (`dvc exp run -S learn.gamma=1` writes `1`)."""
    first = _files(tmp_path, monkeypatch, "1.0", "[0.001, 10.0]")
    assert _files(tmp_path, monkeypatch, "1", "[1e-3, 10]") == first
    assert _files(tmp_path, monkeypatch, "1e0", "[1.0e-3, 1e+1]") == first
    assert json.loads(first["learn"])["learn"]["gamma"] == 1.0 and json.loads(first["sweep"])["sweep"]["gammas"] == [0.001, 10.0]
    assert _files(tmp_path, monkeypatch, "2", "[1e-3, 10]")["learn"] != first["learn"]


def test_the_learn_command_spells_the_recorded_gamma_exactly(tmp_path, monkeypatch):
    """The float written to learn.settings.json reaches `foal-pipe learn --gamma` as the same float."""
    files = _files(tmp_path, monkeypatch, "1.2345678901234567e-3", "null")
    settings = json.loads(files["learn"])
    args = [str(a) for a in stage_module("learn").command("digits", settings)]
    assert float(args[args.index("--gamma") + 1]) == 1.2345678901234567e-3
