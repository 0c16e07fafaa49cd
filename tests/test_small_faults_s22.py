"""Small faults of session 22: broken links given to ``--images``, ``table``'s silent walk per run, and the
leave-one-out sample of each order of ``sweep --order-seeds``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error, build_store, invoke, make_image_tree

from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.extract.encoding import find_images
from foal_pipe.protocol.classsums import class_statistics_bytes


@pytest.fixture(scope="module")
def model_and_images(tmp_path_factory):
    """A pixels model and a folder of one good image and one broken symbolic link."""
    root = tmp_path_factory.mktemp("links")
    tree = make_image_tree(root / "images", {"cat": 4, "dog": 4}, test_per_class=2)
    store = root / "pixels.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=8, out=str(store),
                            device="cpu", workers=0, batch_size=4, chunk_rows=8))
    result = invoke("learn", "--features", store, "--out", root / "run", "--tasks", "1", "--projection-dim", "16")
    assert result.exit_code == 0, result.output
    folder = root / "some"
    folder.mkdir()
    good = folder / "good.png"
    good.write_bytes((tree / "test" / "cat" / "img000.png").read_bytes())
    (folder / "gone.png").symlink_to(root / "nowhere.png")
    return root / "run" / "model.safetensors", folder


def test_a_broken_link_given_by_name_is_refused_naming_it(model_and_images, tmp_path):
    """It fell to the glob branch and was refused as "matches no image file", which it does not say of a file."""
    model, folder = model_and_images
    out = tmp_path / "pred.csv"
    link = folder / "gone.png"
    result = invoke("predict", "--model", model, "--images", folder / "good.png", "--images", link, "--out", out)
    assert_one_line_error(result, f"cannot read image {link} (a broken symbolic link to {folder.parent / 'nowhere.png'})",
                          "--skip-bad")
    assert not out.exists()
    skipped = invoke("predict", "--model", model, "--images", folder / "good.png", "--images", link, "--skip-bad",
                     "--out", out)
    assert skipped.exit_code == 0, skipped.output
    assert f"skipped {link} (a broken symbolic link to" in " ".join(skipped.output.split())
    assert [r["path"] for r in csv.DictReader(io.StringIO(out.read_text()))] == [str(folder / "good.png")]


def test_a_glob_lists_a_broken_link_as_a_folder_search_does(model_and_images):
    """A glob left the link out in silence, where the folder search lists it for reading to name."""
    _, folder = model_and_images
    assert find_images([folder]) == find_images([folder / "*.png"]) == [folder / "gone.png", folder / "good.png"]


def _table(store: Path, out: Path, *extra: str):
    result = invoke("table", "--features", store, "--out", out, "--tasks", "3", "--projection-dim", "24", *extra)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "table.json").read_text())


def test_table_says_when_ridge_walks_once_per_run(tmp_path):
    """`learn` and `sweep` say "running one walk per class order" when the per-class sums cannot be used;
    `table` fell back the same way without a word."""
    store = build_store(tmp_path / "s.zarr", n_train=240, n_test=60, n_classes=6, train_dim=8, test_dim=8)
    need = class_statistics_bytes(6, 24, "float64")
    low, low_table = _table(store, tmp_path / "low", "--order-seeds", "0,1", "--max-memory", str(need - 1))
    said = " ".join(low.output.split())
    assert f"{store}: running one ridge walk per run (2 walks over rows read once): the per-class statistics need" in said
    shared, shared_table = _table(store, tmp_path / "shared", "--order-seeds", "0,1")
    assert "walk per run" not in shared.output
    assert [r["A_avg"] for r in low_table["runs"]] == [r["A_avg"] for r in shared_table["runs"]]
    alone, _ = _table(store, tmp_path / "alone", "--order-seeds", "0", "--max-memory", str(need - 1))
    assert "walk per run" not in alone.output  # one run: no walk is shared whichever way


def test_sweep_records_each_orders_leave_one_out_sample(tmp_path):
    """`sweep --order-seeds --loo-sample M` kept only the first order's rows and bound: an order whose first task
    holds at most M rows scored them all, exactly (eps 0), which no record said."""
    store = build_store(tmp_path / "s.zarr", n_train=300, n_test=60, n_classes=6, train_dim=8, test_dim=8)
    labels = np.asarray(zarr.open_group(str(store), mode="r")["train/labels"][:])
    common = ["--tasks", "3", "--projection-dim", "24"]
    probe = invoke("sweep", "--features", store, "--out", tmp_path / "probe", *common, "--order-seeds", "0,1,2", "--no-loo")
    assert probe.exit_code == 0, probe.output
    orders = json.loads((tmp_path / "probe" / "sweep.json").read_text())["orders"]
    first = {o["order_seed"]: int(np.isin(labels, o["tasks"][0]).sum()) for o in orders}
    m = min(first.values())
    assert len(set(first.values())) > 1, first  # the orders' first tasks differ in size, so their samples do
    result = invoke("sweep", "--features", store, "--out", tmp_path / "many", *common, "--order-seeds", "0,1,2",
                    "--loo-sample", str(m))
    assert result.exit_code == 0, result.output
    many = json.loads((tmp_path / "many" / "sweep.json").read_text())
    for entry in many["orders"]:
        seed = entry["order_seed"]
        loo = entry["leave_one_out"]
        assert loo["sample_rows"][0] == m  # min(M, rows seen)
        assert (loo["sample_eps"][0] == 0) == (first[seed] == m)  # every row seen scored: exact there
        alone = invoke("sweep", "--features", store, "--out", tmp_path / f"alone{seed}", *common, "--order-seed",
                       str(seed), "--loo-sample", str(m))
        assert alone.exit_code == 0, alone.output
        assert loo == json.loads((tmp_path / f"alone{seed}" / "sweep.json").read_text())["leave_one_out"]
    assert many["leave_one_out"] == many["orders"][0]["leave_one_out"]


def test_learn_records_each_orders_leave_one_out_sample(tmp_path):
    """`learn --order-seeds --gamma auto --loo-sample M` recorded the first order's sample alone (``gamma_search``);
    an order whose first task held at most M rows scored them all, exactly, which no record said."""
    store = build_store(tmp_path / "s.zarr", n_train=300, n_test=60, n_classes=6, train_dim=8, test_dim=8)
    labels = np.asarray(zarr.open_group(str(store), mode="r")["train/labels"][:])
    common = ["--tasks", "3", "--projection-dim", "24", "--gamma", "auto"]
    probe = invoke("learn", "--features", store, "--out", tmp_path / "probe", *common, "--order-seeds", "0,1,2")
    assert probe.exit_code == 0, probe.output
    orders = json.loads((tmp_path / "probe" / "metrics.json").read_text())["orders"]
    first = {o["order_seed"]: int(np.isin(labels, o["tasks"][0]).sum()) for o in orders}
    m = min(first.values())
    assert len(set(first.values())) > 1, first
    result = invoke("learn", "--features", store, "--out", tmp_path / "many", *common, "--order-seeds", "0,1,2",
                    "--loo-sample", str(m))
    assert result.exit_code == 0, result.output
    many = json.loads((tmp_path / "many" / "metrics.json").read_text())
    for entry in many["orders"]:
        seed = entry["order_seed"]
        assert entry["sample_rows"][0] == m
        assert (entry["sample_eps"][0] == 0) == (first[seed] == m)
        alone = invoke("learn", "--features", store, "--out", tmp_path / f"alone{seed}", *common, "--order-seed",
                       str(seed), "--loo-sample", str(m))
        assert alone.exit_code == 0, alone.output
        search = json.loads((tmp_path / f"alone{seed}" / "metrics.json").read_text())["gamma_search"]
        assert (entry["sample_rows"], entry["sample_eps"]) == (search["sample_rows"], search["sample_eps"])
    assert many["gamma_search"]["sample_rows"] == many["orders"][0]["sample_rows"]
    fixed = invoke("learn", "--features", store, "--out", tmp_path / "fixed", "--tasks", "3", "--projection-dim", "24",
                   "--order-seeds", "0,1,2")
    assert fixed.exit_code == 0, fixed.output
    assert all("sample_rows" not in o for o in json.loads((tmp_path / "fixed" / "metrics.json").read_text())["orders"])
