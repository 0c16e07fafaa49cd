"""predict --images: the encoder rebuilt from the model's provenance gives the store's predictions."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from helpers import assert_one_line_error, make_image_tree
from typer.testing import CliRunner

import foal_pipe
from foal_pipe.cli import app
from foal_pipe.extract import ExtractSpec, run_extract

runner = CliRunner()


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    tree = make_image_tree(root / "images", {"cat": 6, "dog": 6, "emu": 6}, test_per_class=3)
    store = root / "pixels.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=12, out=str(store),
                            device="cpu", workers=0, batch_size=5, chunk_rows=8))
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(root / "run"), "--tasks", "1",
                                 "--projection-dim", "40"])
    assert result.exit_code == 0, result.output
    return root, tree, store, root / "run" / "model.safetensors"


def test_images_equal_store_predictions(deployed):
    root, tree, store, model = deployed
    by_store = runner.invoke(app, ["predict", "--model", str(model), "--features", str(store)])
    by_images = runner.invoke(app, ["predict", "--model", str(model), "--images", str(tree / "test"),
                                    "--top-k", "2", "--batch-size", "4"])
    assert by_store.exit_code == 0 and by_images.exit_code == 0, by_images.output
    a, b = rows(by_store.stdout), rows(by_images.stdout)
    assert len(a) == len(b) == 9
    assert [r["predicted_class"] for r in a] == [r["predicted_class"] for r in b]
    np.testing.assert_allclose([float(r["score"]) for r in a], [float(r["score"]) for r in b], rtol=1e-6)
    # the best class is predicted_name and score, not repeated as top1_*
    assert list(b[0]) == ["path", "predicted_class", "predicted_name", "score", "top2_name", "top2_score"]
    assert all(r["top2_name"] != r["predicted_name"] and float(r["top2_score"]) <= float(r["score"]) for r in b)
    assert b[0]["path"].endswith("cat/img000.png")


def test_predict_images_python_api(deployed):
    root, tree, store, model = deployed
    m = foal_pipe.load_model(model)
    from foal_pipe.store import open_store

    s = open_store(store)
    X = np.concatenate([x for _, x in s.test.iter_chunks()])
    paths = sorted((tree / "test").rglob("*.png"))
    np.testing.assert_array_equal(m.predict_images(paths), m.predict(X))
    assert m.predict_image_names(paths) == m.predict_names(X)


def test_glob_and_files(deployed):
    root, tree, _, model = deployed
    result = runner.invoke(app, ["predict", "--model", str(model), "--images", str(tree / "test" / "*" / "img001.png"),
                                 "--images", str(tree / "train" / "dog" / "img000.png")])
    assert result.exit_code == 0, result.output
    assert len(rows(result.stdout)) == 4


def test_images_takes_several_paths(deployed):
    """`--images A B` and a shell-expanded `--images dir/*.png` give what `--images A --images B` gives."""
    root, tree, _, model = deployed
    files = [str(p) for p in sorted((tree / "test" / "cat").glob("*.png"))] + [str(tree / "test" / "dog")]
    repeated = runner.invoke(app, ["predict", "--model", str(model), *[a for f in files for a in ("--images", f)]])
    several = runner.invoke(app, ["predict", "--model", str(model), "--images", *files])
    after_options = runner.invoke(app, ["predict", "--images", *files[:2], "--model", str(model), *files[2:]])
    for result in (repeated, several, after_options):
        assert result.exit_code == 0, result.output
    assert len(rows(repeated.stdout)) == 6
    assert several.stdout == repeated.stdout == after_options.stdout
    assert_one_line_error(runner.invoke(app, ["predict", "--model", str(model), "--features", "s.zarr", files[0]]),
                          "pass exactly one of --features STORE or --images PATH")


def test_bad_inputs(deployed, tmp_path):
    root, tree, _, model = deployed
    out = tmp_path / "pred.csv"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(runner.invoke(app, ["predict", "--model", str(model), "--images", str(empty), "--out",
                                              str(out)]), "holds no images")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.png").write_bytes(b"not a png")
    import shutil

    shutil.copy(tree / "test" / "cat" / "img000.png", bad / "good.png")
    assert_one_line_error(runner.invoke(app, ["predict", "--model", str(model), "--images", str(bad), "--out",
                                              str(out)]), "cannot read image", "broken.png", "--skip-bad")
    assert not out.exists()
    skipped = runner.invoke(app, ["predict", "--model", str(model), "--images", str(bad), "--skip-bad", "--out",
                                  str(out)])
    assert skipped.exit_code == 0, skipped.output
    assert "skipped" in skipped.output and "broken.png" in skipped.output
    assert [r["path"] for r in rows(out.read_text())] == [str(bad / "good.png")]
    out.unlink()
    from safetensors.numpy import save_file

    save_file({"W": np.zeros((2, 2))}, str(tmp_path / "other.safetensors"))
    assert_one_line_error(runner.invoke(app, ["predict", "--model", str(tmp_path / "other.safetensors"), "--images",
                                              str(bad), "--out", str(out)]), "another tool")
    assert_one_line_error(runner.invoke(app, ["predict", "--model", str(model), "--out", str(out)]),
                          "exactly one of --features")
    assert not out.exists()


def test_tiny_vit_from_checkpoint(tmp_path, tiny_vit_checkpoint, one_torch_thread):
    from helpers import TINY_VIT, TINY_VIT_KWARGS

    tree = make_image_tree(tmp_path / "images", {"cat": 4, "dog": 4}, test_per_class=3)
    store = tmp_path / "vit.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model=TINY_VIT, model_kwargs=TINY_VIT_KWARGS,
                            checkpoint=str(tiny_vit_checkpoint), out=str(store), device="cpu", workers=0,
                            batch_size=4, chunk_rows=8))
    learned = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "1",
                                  "--projection-dim", "30"])
    assert learned.exit_code == 0, learned.output
    model = str(tmp_path / "run" / "model.safetensors")
    by_store = runner.invoke(app, ["predict", "--model", model, "--features", str(store)])
    by_images = runner.invoke(app, ["predict", "--model", model, "--images", str(tree / "test"),
                                    "--checkpoint", str(tiny_vit_checkpoint)])
    assert by_images.exit_code == 0, by_images.output
    a, b = rows(by_store.stdout), rows(by_images.stdout)
    assert [r["predicted_class"] for r in a] == [r["predicted_class"] for r in b]
    np.testing.assert_allclose([float(r["score"]) for r in a], [float(r["score"]) for r in b], rtol=1e-5)
    out = tmp_path / "pred.csv"
    assert_one_line_error(runner.invoke(app, ["predict", "--model", model, "--images", str(tree / "test"), "--out",
                                              str(out)]), "pass --checkpoint FILE")
    other = tmp_path / "other.safetensors"
    import safetensors.numpy as stn

    tensors = stn.load_file(str(tiny_vit_checkpoint))
    tensors["cls_token"] = tensors["cls_token"] + 1
    stn.save_file(tensors, str(other))
    assert_one_line_error(runner.invoke(app, ["predict", "--model", model, "--images", str(tree / "test"),
                                              "--checkpoint", str(other), "--out", str(out)]), "has sha256")
    assert not out.exists()


def test_unlabelled_images_store(deployed, tmp_path):
    root, tree, labelled, model = deployed
    store = tmp_path / "unlabelled.zarr"
    run_extract(ExtractSpec(dataset="images", data_dir=str(tree / "test"), model="pixels", image_size=12,
                            out=str(store), device="cpu", workers=0, batch_size=5, chunk_rows=8))
    from foal_pipe.store import open_store

    s = open_store(store)
    assert s.train.n_rows == 0 and s.test.labels.tolist() == [-1] * 9
    by_store = runner.invoke(app, ["predict", "--model", str(model), "--features", str(store)])
    by_labelled = runner.invoke(app, ["predict", "--model", str(model), "--features", str(labelled)])
    assert by_store.exit_code == 0, by_store.output
    assert "unlabelled" in by_store.stderr
    a, b = rows(by_store.stdout), rows(by_labelled.stdout)
    assert [r["predicted_class"] for r in a] == [r["predicted_class"] for r in b]
    assert {r["true_class"] for r in a} == {"-1"}
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run")])
    assert_one_line_error(result, "no train rows", "--dataset imagefolder")
    assert not (tmp_path / "run").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(foal_pipe.FoalPipeError, match="no images"):
        run_extract(ExtractSpec(dataset="images", data_dir=str(empty), model="pixels", out=str(tmp_path / "e.zarr")))


def test_a_top_k_beyond_the_models_classes_is_refused(deployed):
    """The model knows 3 classes: --top-k 5 gave three columns without a word; it is refused, naming the most."""
    root, tree, store, model = deployed
    result = runner.invoke(app, ["predict", "--model", str(model), "--images", str(tree / "test"), "--top-k", "5"])
    assert_one_line_error(result, "--top-k 5 asks for more classes than the model's 3; pass --top-k 3 or fewer")
    assert runner.invoke(app, ["predict", "--model", str(model), "--images", str(tree / "test"), "--top-k", "3"]).exit_code == 0
