"""Gammas as the messages show them: a range whose ends ``%g`` would show alike is written in full; a ``--gamma``
that reads as 0 or inf is named as typed; a ``learn --gamma auto`` run whose leave-one-out was sampled says so in
summary.md."""

from __future__ import annotations

import pytest
from helpers import assert_clean_error, build_store, invoke

from foal_pipe.protocol.learnkinds import shown


def test_shown_writes_in_full_only_ends_g_would_merge():
    assert shown(1.0, 1e-3, 10.0) == ["1", "0.001", "10"]
    assert shown(1.0, 1.0, 1.0000000000000002) == ["1.0", "1.0", "1.0000000000000002"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("words") / "a.zarr", n_train=80, noise=0.5)


def test_a_sweeps_range_warning_tells_its_ends_apart(store, tmp_path):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "s", "--gammas", "1,1.0000000000000002",
                    "--tasks", 2, "--projection-dim", 16, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert "(1.0 .. 1.0000000000000002)" in result.output and "(1 .. 1)" not in result.output


@pytest.mark.parametrize(("typed", "reads"), [("1e-3000", "0"), ("1e999", "inf")])
def test_a_gamma_beyond_float64_is_named_as_typed(store, tmp_path, typed, reads):
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, f"--gamma={typed}")
    assert_clean_error(result, f"--gamma {typed} reads as {reads}, beyond float64's range", out)


@pytest.mark.parametrize(("sample", "word"), [("20", "by sampled leave-one-out"), ("0", "by leave-one-out")])
def test_learn_auto_says_when_its_leave_one_out_was_sampled(store, tmp_path, sample, word):
    run = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", run, "--gamma", "auto", "--loo-sample", sample, "--tasks", 2,
                    "--projection-dim", 16, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert invoke("evaluate", "--run", run).exit_code == 0
    assert f"from the data seen so far, {word}" in (run / "eval" / "summary.md").read_text()


def test_a_walk_per_order_names_the_order_of_each_warning(store, tmp_path):
    """--heads walks every order apart: each order's warnings name its seed, as the one-pass notes do."""
    result = invoke("sweep", "--features", store, "--out", tmp_path / "s", "--order-seeds", "0,1", "--gammas", "1e3,1e4",
                    "--heads", "ridge,ncm", "--tasks", 2, "--projection-dim", 16, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if "refined choice" in line]
    assert {line.split(":")[0] for line in warned} == {"order seed 0", "order seed 1"}, result.output
