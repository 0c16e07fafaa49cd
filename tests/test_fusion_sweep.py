"""``sweep --fusions``: every fusion x gamma from one walk of a blocks store equals a separate ``sweep --fusion``
per fusion, reads each blocks chunk as often as one such sweep does, and refuses what it cannot do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import CHUNK, assert_json_close, extract_one_thread, vit4_spec
from typer.testing import CliRunner

import foal_pipe.store as st
from foal_pipe.cli import app
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.memoryparts import memory_parts
from foal_pipe.protocol.run import prepare
from foal_pipe.store import write_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()
FUSIONS = ("mean-cls", "last", "mean:2-3")
GAMMAS = "1e-6,1e-4,1e-2,1,100"
D = "200"  # with these gammas, LOO and the test oracle pick different fusions: the criterion decides


@pytest.fixture(scope="module")
def blocks_store(tmp_path_factory, vit4_checkpoint) -> Path:  # noqa: F811
    """The 4-block tiny random ViT on digits, every block's CLS kept in float16."""
    spec = vit4_spec(tmp_path_factory.mktemp("fsweep") / "f16.zarr", vit4_checkpoint, keep_blocks=True)
    extract_one_thread(spec)
    return spec.out_path


def _sweep(store: Path, out: Path, *extra: str, ok: bool = True):
    args = ["sweep", "--features", str(store), "--out", str(out), "--tasks", "5", "--projection-dim", D,
            "--gammas", GAMMAS, *extra]
    result = runner.invoke(app, args)
    if ok:
        assert result.exit_code == 0, result.output
        return json.loads((out / "sweep.json").read_text())
    return result


@pytest.mark.parametrize("options", [(), ("--no-loo", "--no-fusion-norm"), ("--select", "test")],
                         ids=["loo", "gcv-no-norm", "test"])
def test_each_fusion_equals_a_separate_sweep_and_the_choice_is_over_every_fusion(blocks_store, tmp_path, options):
    both = _sweep(blocks_store, tmp_path / "all", "--fusions", ",".join(FUSIONS), *options)
    assert [e["fusion"] for e in both["fusions"]] == list(FUSIONS)
    alone = {}
    for i, spec in enumerate(FUSIONS):
        alone[spec] = _sweep(blocks_store, tmp_path / f"one{i}", "--fusion", spec, *options)
        entry = both["fusions"][i]
        # the same numbers, to the last bit: json of the floats compared as text
        assert json.dumps(entry["results"]) == json.dumps(alone[spec]["results"])
        assert (entry["best_gamma"], entry["best_gamma_test"]) == (alone[spec]["best_gamma"], alone[spec]["best_gamma_test"])
        assert alone[spec]["selected_by"] == both["selected_by"]
    # the overall choice, recomputed from the separate sweeps: the criterion at the last boundary over every pair
    key, larger = {"loo": ("loo_mse", False), "gcv": ("gcv", False), "test": ("A_avg", True)}[both["selected_by"]]
    pairs = [(spec, r["gamma"], r[key][-1] if isinstance(r[key], list) else r[key])
             for spec in FUSIONS for r in alone[spec]["results"]]
    values = np.array([v for _, _, v in pairs])
    best = pairs[int(np.argmax(values) if larger else np.argmin(values))]
    assert (both["best"]["fusion"], both["best"]["gamma"]) == best[:2]
    oracle = pairs[int(np.argmax([r["A_avg"] for spec in FUSIONS for r in alone[spec]["results"]]))]
    assert (both["best_test"]["fusion"], both["best_test"]["gamma"]) == oracle[:2]
    if both["selected_by"] == "loo":
        assert both["best"]["fusion"] != both["best_test"]["fusion"]  # so a choice by the oracle would show
    # the single-sweep keys hold the chosen fusion's sweep, so readers of one sweep read it unchanged
    chosen = alone[best[0]]
    assert both["fusion"] == best[0] and both["best_gamma"] == best[1]
    assert both["results"] == chosen["results"] and both["best_gamma_test"] == chosen["best_gamma_test"]
    assert both["fusion_norm"] is ("--no-fusion-norm" not in options)


def test_the_blocks_are_read_once_per_walk_not_once_per_fusion(blocks_store, tmp_path, monkeypatch):
    reads: list[tuple[str, int, int]] = []
    real = st.Split.read_blocks
    monkeypatch.setattr(st.Split, "read_blocks", lambda self, lo, hi: reads.append((self.name, lo, hi)) or real(self, lo, hi))
    _sweep(blocks_store, tmp_path / "one", "--fusion", "last")
    one = list(reads)
    reads.clear()
    _sweep(blocks_store, tmp_path / "all", "--fusions", ",".join(FUSIONS))
    assert sorted(reads) == sorted(one)  # three fusions, the reads of one
    chunks = -(-1442 // CHUNK)
    train = [r for r in reads if r[0] == "train"]
    assert len(train) <= (5 + 1) * chunks  # a pass per task, and the last boundary's leave-one-out pass
    assert sorted({r for r in reads if r[0] == "test"}) == [r for r in reads if r[0] == "test"]  # each test chunk once


def test_memory_counts_one_set_of_statistics_per_fusion(blocks_store):
    settings = (StreamConfig(tasks=5), ModelConfig(projection_dim=48), EvaluationConfig(), ExecutionConfig(backend="numpy"))
    one = memory_parts(prepare(blocks_store, *settings, n_models=13, loo=True, command="sweep"), 13, True)
    three = memory_parts(prepare(blocks_store, *settings, n_models=13, loo=True, command="sweep", fusions=FUSIONS), 13, True)
    assert three["state at D=48 x 3 fusions"] == 3 * one["state at D=48"]
    assert three["weights of every boundary x 3 fusions"] == 3 * one["weights of every boundary"]


@pytest.fixture
def plain_store(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 8)).astype(np.float32), np.repeat(np.arange(5), 12)
    return write_store(tmp_path / "plain.zarr", (x, y), (x, y), [str(c) for c in range(5)])


@pytest.mark.parametrize(("extra", "message"), [
    (("--fusion", "last", "--fusions", "mean-cls,last"), "pass --fusion (one fusion) or --fusions (several, one walk), not both"),
    (("--fusions", "mean-cls,last", "--scheduler", "dask"), "use --scheduler local with --fusions"),
    (("--fusions", "mean-cls,last", "--order-seeds", "0,1"), "leave out --order-seeds"),
    (("--fusions", "last,mean:3-2"), "--fusions mean:3-2 starts at block 3, after its last block 2"),
    (("--fusions", "last,block:9"), "fusion 'block:9' needs block 9 but there are 4 blocks"),
    (("--fusions", "last,last"), "--fusions lists last twice"),
    (("--fusions", ","), "--fusions names no fusion"),
])
def test_refusals_are_one_line_and_write_nothing(blocks_store, tmp_path, extra, message):
    result = _sweep(blocks_store, tmp_path / "x", *extra, ok=False)
    usage = "starts at block" in message or "names no fusion" in message  # a usage error (tests/test_usage_exit_codes.py)
    assert result.exit_code == (2 if usage else 1), result.output
    assert message in result.output and "Traceback" not in result.output
    assert result.output.startswith("Error: ") and result.output.strip().count("\n") == 0
    assert not (tmp_path / "x").exists()


def test_fusions_on_a_store_without_blocks_names_the_command_that_makes_one(plain_store, tmp_path):
    result = _sweep(plain_store, tmp_path / "x", "--fusions", "mean-cls,last", ok=False)
    assert result.exit_code == 1 and "`foal-pipe extract ... --keep-blocks`" in result.output
    assert "fusion 'mean-cls', 'last' cannot be computed" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_evaluate_plots_a_avg_per_fusion_and_summarises_each_choice(blocks_store, tmp_path):
    learned = runner.invoke(app, ["learn", "--features", str(blocks_store), "--out", str(tmp_path / "run"), "--tasks", "5",
                                  "--projection-dim", D, "--fusion", "last"])
    assert learned.exit_code == 0, learned.output
    sweep = _sweep(blocks_store, tmp_path / "run-sweep", "--fusions", ",".join(FUSIONS))
    result = runner.invoke(app, ["evaluate", "--run", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    out = tmp_path / "run" / "eval"
    assert (out / "fusions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "class_accuracy.csv").exists() and "could not be read" not in result.output  # the store fused
    text = (out / "summary.md").read_text()
    assert "## Fusion ablation" in text
    for entry in sweep["fusions"]:
        at = next(r for r in entry["results"] if r["gamma"] == entry["best_gamma"])
        top = next(r for r in entry["results"] if r["gamma"] == entry["best_gamma_test"])
        row = (f"| {entry['fusion']} | {entry['best_gamma']:g} | {100 * at['A_avg']:.2f} | {100 * at['A_last']:.2f} | "
               f"{100 * at['F']:.2f} | {entry['best_gamma_test']:g} | {100 * top['A_avg']:.2f} |")
        assert row in text, row
    best, oracle = sweep["best"], sweep["best_test"]
    assert f"Selected fusion: {best['fusion']} with gamma {best['gamma']:g}, by leave-one-out MSE" in text
    assert f"The test-set oracle would pick {oracle['fusion']} with gamma {oracle['gamma']:g}" in text
    # a later sweep of one fusion: no fusion plot left behind beside the new summary
    _sweep(blocks_store, tmp_path / "one", "--fusion", "last")
    again = runner.invoke(app, ["evaluate", "--run", str(tmp_path / "run"), "--sweep", str(tmp_path / "one")])
    assert again.exit_code == 0, again.output
    assert not (out / "fusions.png").exists() and "## Fusion ablation" not in (out / "summary.md").read_text()


def test_a_fusions_entry_that_names_no_fusion_is_refused(blocks_store, tmp_path):
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.report import read_sweep

    sweep = _sweep(blocks_store, tmp_path / "s", "--fusions", "last,mean-cls", "--no-loo")
    assert read_sweep(tmp_path / "s").best.to_dict() == sweep["best"]
    sweep["best"]["fusion"] = "block:3"
    (tmp_path / "s" / "sweep.json").write_text(json.dumps(sweep))
    with pytest.raises(FoalPipeError, match="'best' should name a fusion of 'fusions' and one of its gammas"):
        read_sweep(tmp_path / "s")


def test_each_fusion_keeps_its_activations_with_the_same_results_as_projecting_again(blocks_store, tmp_path):
    _sweep(blocks_store, tmp_path / "kept", "--fusions", ",".join(FUSIONS))
    result = _sweep(blocks_store, tmp_path / "again", "--fusions", ",".join(FUSIONS), "--max-memory", "1KiB", ok=False)
    assert result.exit_code == 0 and "projects the rows seen so far again" in result.output, result.output
    kept, again = (json.loads((tmp_path / name / "sweep.json").read_text()) for name in ("kept", "again"))
    # floats within 1e-12 relative (an accuracy, a count of rows over the split's, would differ by far more): the rows
    # projected again come in other blocks, and a multi-threaded BLAS may round a product differently with the
    # block (leave-one-out's squared residuals then differ in their last bits; the accuracies and choices do not)
    assert_json_close(kept, again, rel=1e-12, abs_=1e-300)


def test_heads_on_every_fusion_equal_a_learn_of_each_head_on_that_fusion(blocks_store, tmp_path):
    """``sweep --fusions --heads``: each fusion's head entries equal ``learn --head H --fusion F`` (the same rows, in
    the same order and blocks: equal matrices); ridge's results are those of the sweep without ``--heads``."""
    fusions = ("mean-cls", "last")
    heads = _sweep(blocks_store, tmp_path / "heads", "--fusions", ",".join(fusions), "--heads", "ridge,ncm,slda,balanced")
    plain = _sweep(blocks_store, tmp_path / "plain", "--fusions", ",".join(fusions))
    added = {"heads", "best_head", "best_head_selected_by", "best_head_test"}
    assert {k: v for k, v in heads.items() if k not in added | {"fusions"}} == \
        {k: v for k, v in plain.items() if k != "fusions"}
    for entry, alone in zip(heads["fusions"], plain["fusions"], strict=True):
        assert {k: v for k, v in entry.items() if k != "heads"} == alone
        assert entry["heads"]["ridge"]["options"]["gamma"] == alone["best_gamma"]
        for name in ("ncm", "slda", "balanced"):
            out = tmp_path / f"{name}-{entry['fusion']}"
            extra = ["--projection-dim", D, "--gamma", str(entry["heads"]["ridge"]["options"]["gamma"])] \
                if name == "balanced" else []
            result = runner.invoke(app, ["learn", "--features", str(blocks_store), "--out", str(out), "--tasks", "5",
                                         "--head", name, "--fusion", entry["fusion"], *extra])
            assert result.exit_code == 0, result.output
            learned = json.loads((out / "metrics.json").read_text())
            assert entry["heads"][name]["accuracy_matrix"] == learned["accuracy_matrix"], (name, entry["fusion"])
    chosen = next(e for e in heads["fusions"] if e["fusion"] == heads["fusion"])
    assert heads["heads"] == chosen["heads"]  # the top-level heads: the fusion chosen overall
