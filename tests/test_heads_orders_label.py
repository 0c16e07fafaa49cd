"""``sweep --heads --order-seeds`` labels balanced's and dual's order means with each order's gamma (not the first
order's alone) in sweep.json, its console table, ``summary`` and summary.md; the docs say what ``best_gamma`` is
under each ``--select`` and that ``sweep --fusions`` refuses Si-Blurry; a ``--shrinkage`` that slda and fecam share
in one sweep is refused naming the way out."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, blocks_store, build_store, invoke

DOCS = Path(__file__).resolve().parent.parent / "docs"
SEEDS = (0, 1, 2, 3)
#: ``--drop-last`` drops rows that depend on each order's shuffle, so the orders choose different gammas.
STREAM = ["--tasks", 4, "--batch-size", 32, "--drop-last", "--seed", 5, "--backend", "numpy", "--projection-dim", 24]
GRID = "0.3,0.4,0.5,0.6,0.7,0.85,1,1.2,1.4,1.7,2,2.5,3"
CHOSEN = [0.7, 1.4, 0.3, 2.0]  # each order's gamma by loo_accuracy on its training rows (asserted below)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("label") / "s.zarr")


@pytest.fixture(scope="module")
def swept(store, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("swept") / "sw"
    result = invoke("sweep", "--features", store, "--out", out, *STREAM, "--heads", "ridge,ncm,balanced,dual",
                    "--gammas", GRID, "--select", "loo_accuracy", "--order-seeds", ",".join(map(str, SEEDS)))
    assert result.exit_code == 0, result.output
    return out, result.output


def _report(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def _learn(store: Path, out: Path, *extra) -> dict:
    result = invoke("learn", "--features", store, "--out", out, *STREAM, *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def test_balanced_and_dual_record_each_orders_gamma(store, swept, tmp_path):
    report = _report(swept[0])
    orders = report["orders"]
    assert [o["heads"]["ridge"]["options"]["gamma"] for o in orders] == CHOSEN  # the orders disagree
    heads = report["heads"]
    assert heads["ridge"]["options"] == {"gammas": CHOSEN, "selected_by": "loo_accuracy"}  # as before
    assert heads["balanced"]["options"] == {"gammas": CHOSEN}  # was {"gamma": 0.7}: the first order's
    assert heads["dual"]["options"] == {"compensation": 1.0, "gammas": CHOSEN, "gamma_comps": CHOSEN}
    assert heads["ncm"]["options"] == {}
    for name in ("balanced", "dual"):  # the mean is that of separate runs at each order's gamma, not at the first's
        runs = [_learn(store, tmp_path / f"{name}-{s}", "--head", name, "--gamma", g, "--order-seed", s)
                for s, g in zip(SEEDS, CHOSEN)]
        assert heads[name]["A_avg"] == pytest.approx(np.mean([r["A_avg"] for r in runs]), abs=1e-12)
        first = _learn(store, tmp_path / f"{name}-first", "--head", name, "--gamma", CHOSEN[0],
                       "--order-seeds", ",".join(map(str, SEEDS)))
        assert abs(first["A_avg"] - heads[name]["A_avg"]) > 1e-4  # what the old label "gamma 0.7" describes


def test_console_table_prints_per_order(swept):
    rows = {line.split("│")[1].strip(): line for line in swept[1].splitlines() if line.count("│") > 6}
    assert "gamma per order (0.7 1.4 0.3 2)" in rows["balanced"], swept[1]
    assert "gamma per order (0.7 1.4 0.3 2), gamma_comp per order (0.7 1.4 0.3 2)" in rows["dual"], swept[1]
    assert "gamma per order (0.7 1.4 0.3 2), selected_by loo_accuracy" in rows["ridge"], swept[1]


def _gamma_cells(out: Path) -> dict[str, str]:
    """``summary``'s gamma column of each sweep head's row."""
    shown = invoke("summary", out)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    cells = {}
    for i, line in enumerate(lines):
        if match := re.search(r"· head (\w+)", line):
            cells[match.group(1)] = re.split(r"\s{2,}", lines[i - 1].strip())[4]
    return cells


def test_summary_prints_per_order_or_the_common_gamma(swept, tmp_path):
    out = tmp_path / "sw"
    shutil.copytree(swept[0], out)
    assert _gamma_cells(out) == {"ridge": "per order", "ncm": "-", "balanced": "per order", "dual": "per order"}
    report = _report(out)
    for name in ("balanced", "dual"):  # every order at one gamma (each order's record too): that gamma
        report["heads"][name]["options"]["gammas"] = [1.2] * len(SEEDS)
        for order in report["orders"]:
            order["heads"][name]["options"]["gamma"] = 1.2
    (out / "sweep.json").write_text(json.dumps(report))
    assert _gamma_cells(out) == {"ridge": "per order", "ncm": "-", "balanced": "1.2", "dual": "1.2"}


def test_a_sweep_written_before_reads_and_names_the_first_orders_gamma(swept, tmp_path):
    out = tmp_path / "old"
    shutil.copytree(swept[0], out)
    report = _report(out)
    report["heads"]["balanced"]["options"] = {"gamma": 0.7}  # as sweep.json held it before
    report["heads"]["dual"]["options"] = {"compensation": 1.0, "gamma": 0.7, "gamma_comp": 0.7}
    (out / "sweep.json").write_text(json.dumps(report))
    cells = _gamma_cells(out)
    assert cells["balanced"] == cells["dual"] == "0.7 (order 0's)" and cells["ridge"] == "per order"


def test_summary_markdown_lists_each_orders_gamma(store, swept, tmp_path):
    run = tmp_path / "run"
    _learn(store, run, "--gamma", CHOSEN[0], "--order-seeds", ",".join(map(str, SEEDS)))
    result = invoke("evaluate", "--run", run, "--sweep", swept[0], "--no-plots")
    assert result.exit_code == 0, result.output
    text = (run / "eval" / "summary.md").read_text()
    each = "gamma 0.7 (order 0), 1.4 (order 1), 0.3 (order 2), 2 (order 3)"
    assert f"| {each} |" in text.split("| balanced |")[1].splitlines()[0]
    dual = text.split("| dual |")[1].splitlines()[0]
    assert f"| compensation 1, gamma_comp 0.7 (order 0), 1.4 (order 1), 0.3 (order 2), 2 (order 3), {each} |" in dual


# --- the docs -------------------------------------------------------------------------------------------------------

def _flat(name: str) -> str:
    return " ".join((DOCS / name).read_text().split())


def test_orders_doc_says_what_best_gamma_is_under_each_select(store, swept, tmp_path):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "t", *STREAM, "--gammas", GRID, "--select", "test",
                    "--order-seeds", "2,0,1,3")
    assert result.exit_code == 0, result.output
    report = _report(tmp_path / "t")  # the code: under test the oracle over the means, not the first order's choice
    assert report["best_gamma"] == report["best_gamma_test"] == 0.3 != report["orders"][0]["best_gamma"] == 0.5
    trained = _report(swept[0])  # under a training criterion the first order's choice
    assert trained["best_gamma"] == trained["orders"][0]["best_gamma"] == CHOSEN[0] != trained["best_gamma_test"]
    text = _flat("orders.md")
    assert "`best_gamma`, `selections` and `leave_one_out` are the first order's" not in text
    assert "under `--select test` it is the test oracle over the means" in text


def test_fusion_docs_state_the_si_blurry_refusal(tmp_path):
    store = blocks_store(tmp_path / "b.zarr")
    out = tmp_path / "f"
    result = invoke("sweep", "--features", store, "--out", out, "--fusions", "mean-cls,last", "--stream", "si-blurry",
                    "--tasks", 2, "--projection-dim", 8, "--gammas", 1)
    assert_clean_error(result, "compare fusions one at a time (--fusion X)", out)
    fusion = _flat("fusion.md")
    refusals = fusion.split("`--fusions` and `--fusion` exclude each other")[1].split("In the pipeline")[0]
    assert "`--stream si-blurry`" in refusals and "`--fusion X`" in refusals
    capabilities = _flat("heads.md").split("## Capabilities")[1].split("| capability |")[0]
    assert "`sweep --fusions` with `--stream si-blurry` is" in capabilities


# --- a shared --shrinkage -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "reason", "refuser", "other"), [
    ("oas", "fecam's --shrinkage must be a number >= 0, got 'oas'", "fecam", "slda"),
    ("2", "slda's --shrinkage must lie in [0, 1], got 2", "slda", "fecam"),
])
def test_a_shrinkage_slda_and_fecam_share_names_the_way_out(store, tmp_path, value, reason, refuser, other):
    out = tmp_path / "sw"
    result = invoke("sweep", "--features", store, "--out", out, *STREAM, "--gammas", "1", "--heads", "ridge,slda,fecam",
                    "--shrinkage", value)
    assert_clean_error(result, f"{reason}, and --heads gives {other} the same --shrinkage (one sets every head that takes "
                       "it)", out)
    assert f"run {refuser} and {other} in separate commands, each with its own --shrinkage, or drop one of them from " \
           "--heads" in result.output
    assert "try --shrinkage" not in result.output  # it would change the other head's shrinkage too
    alone = invoke("learn", "--features", store, "--out", tmp_path / "alone", *STREAM, "--head", refuser,
                   "--shrinkage", value)
    assert_clean_error(alone, "try --shrinkage", tmp_path / "alone")  # one head alone: its own refusal, as before
