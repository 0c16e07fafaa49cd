"""Odd image files through `extract --dataset imagefolder` (and `images`) and `predict --images`.

Checked by hand and passing, not kept here (the pixels model at 8 px, features compared with Pillow's own conversion
computed independently, and `predict --images` / DeployedModel.encode_images compared with the store row by row, alone
and in batches): CMYK JPEG and TIFF, 16-bit grey PNG and TIFF ('I;16'), palette PNG with transparency, LA and RGBA PNG,
RGBA WebP, 1-bit PNG and BMP, EXIF orientation 6 (ignored, as documented), progressive JPEG, animated GIF/PNG/WebP and
multi-page TIFF (first frame), LAB TIFF, 1x400 and 400x1 images, uppercase .JPG, PPM/PGM (maxval 15, 1000, 65535,
plain P2/P3, P4), BMP/TIFF; two extractions (workers 1 and 2) byte-identical. Refused by name in one line: empty file,
text named x.png, truncated JPEG/WebP/TIFF/BMP/GIF/PPM, a 32-bit TIFF, a self link, a link loop, an image over twice
Pillow's bomb limit; over the limit once, a note. Hidden files: `.DS_Store` ignored, `.hidden.png` and `.thumbs/`
read as images (as documented: every image), `._x.jpg` stops extract by name.

Checked here:
- imagefolder refuses one folder reached twice across class folders or across the splits (a link in test/a to
  train/a would leak training images into the test split; a link in train/a to train/b would give b's images two
  labels), as docs/datasets.md says and as `predict --images` on the same folder does, naming the link to remove;
- a folder that cannot be listed (permissions) is refused by name with "Permission denied", in extract and in
  `predict --images DIR`, rather than left out (and an unreadable class folder is not called a class without images);
- extract's error for a file Pillow cannot identify names the file and no in-memory object, the same line each run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import helpers
import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app

runner = CliRunner()
PIXELS = ("--model", "pixels", "--image-size", "8", "--workers", "0", "--device", "cpu")
NOCAP = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable", "--"]
CLI = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"


def _png(path: Path, seed: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(path)


def _tree(root: Path, classes: tuple[str, ...] = ("a", "b"), sub: bool = False) -> Path:
    """root/{train,test}/<class>/ok{1,2}.png (and sub/deep.png with ``sub``), each image distinct."""
    seed = 0
    for split in ("train", "test"):
        for cls in classes:
            for name in ("ok1.png", "ok2.png", *(("sub/deep.png",) if sub else ())):
                seed += 1
                _png(root / split / cls / name, seed)
    return root


def _extract(tree: Path, out: Path, *extra: str):
    return runner.invoke(app, ["extract", "--dataset", "imagefolder", "--data-dir", str(tree), "--out", str(out),
                               *PIXELS, *extra])


def _model(tmp_path: Path) -> Path:
    tree = _tree(tmp_path / "plain")
    assert _extract(tree, tmp_path / "plain.zarr").exit_code == 0
    result = runner.invoke(app, ["learn", "--features", str(tmp_path / "plain.zarr"), "--out", str(tmp_path / "run"),
                                 "--tasks", "1", "--projection-dim", "16"])
    assert result.exit_code == 0, result.output
    return tmp_path / "run" / "model.safetensors"


# -- one folder reached twice across class folders or splits ------------------------------------------------------
def _link_across_classes(t: Path) -> Path:
    (t / "train" / "a" / "linkb").symlink_to("../b")  # b's images as rows of a and of b
    return t / "train" / "a" / "linkb"


def _link_into_test(t: Path) -> Path:
    (t / "test" / "a" / "leak").symlink_to("../../train/a")  # training images as test rows: a leak
    return t / "test" / "a" / "leak"


def _one_folder_two_classes(t: Path) -> Path:
    for split in ("train", "test"):
        _png(t / "shared" / split / "s.png", 99 if split == "train" else 98)
    (t / "train" / "a" / "l1").symlink_to(t / "shared" / "train")
    (t / "train" / "b" / "l2").symlink_to(t / "shared" / "train")
    return t / "train" / "b" / "l2"


def _class_linked_in_both_splits(t: Path) -> Path:
    _png(t / "elsewhere" / "e1.png", 97)
    _png(t / "elsewhere" / "e2.png", 96)
    (t / "train" / "c").symlink_to(t / "elsewhere")
    (t / "test" / "c").symlink_to(t / "elsewhere")  # every test image of c is one of its training images
    return t / "test" / "c"


@pytest.mark.parametrize("make", [_link_across_classes, _link_into_test, _one_folder_two_classes,
                                  _class_linked_in_both_splits])
def test_imagefolder_refuses_a_folder_reached_twice_across_classes_and_splits(tmp_path, make):
    """docs/datasets.md: "a folder reached twice (two links to it, or a link to a folder also searched without it)"
    is refused, naming both paths: across class folders and across train/ and test/ too (one record of the folders
    searched per dataset), with the duplicate link named and nothing written."""
    tree = _tree(tmp_path / "t")
    link = make(tree)
    out = tmp_path / "s.zarr"
    result = _extract(tree, out)
    helpers.assert_one_line_error(result, "reached twice", f"remove the duplicate link {link}")
    assert not out.exists()


def test_imagefolder_with_test_split_refuses_a_folder_linked_from_another_class(tmp_path):
    """The same with --test-split, DIR/<class>/ folders: a link in a/ to b/ (b's images as rows of both classes) is
    refused, naming the link."""
    for cls, seed in (("a", 0), ("b", 10)):
        for i in range(3):
            _png(tmp_path / "t" / cls / f"x{i}.png", seed + i)
    (tmp_path / "t" / "a" / "linkb").symlink_to("../b")
    result = _extract(tmp_path / "t", tmp_path / "s.zarr", "--test-split", "0.3")
    helpers.assert_one_line_error(result, "linkb", "reached twice")


def test_a_linked_data_dir_names_the_duplicate_link_inside_it(tmp_path):
    """--data-dir a symbolic link to the tree: the link to remove is the one in train/a, not the data dir itself
    (the nearest link below the folder that holds both paths)."""
    tree = _tree(tmp_path / "t")
    _link_across_classes(tree)
    (tmp_path / "linked").symlink_to(tree)
    result = _extract(tmp_path / "linked", tmp_path / "s.zarr")
    helpers.assert_one_line_error(result, f"remove the duplicate link {tmp_path / 'linked' / 'train' / 'a' / 'linkb'}")


def test_predict_images_and_extract_agree_on_a_folder_reached_twice(tmp_path):
    """`predict --images train/` refuses the link in train/a to train/b, and extract of the same tree refuses it too."""
    model = _model(tmp_path)
    tree = _tree(tmp_path / "t")
    _link_across_classes(tree)
    predicted = runner.invoke(app, ["predict", "--model", str(model), "--images", str(tree / "train")])
    helpers.assert_one_line_error(predicted, "reached twice")
    extracted = _extract(tree, tmp_path / "s.zarr")
    assert extracted.exit_code == predicted.exit_code == 1, extracted.output


# -- folders that cannot be read ------------------------------------------------------------------------------------
def _bound(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """``foal-pipe ARGS`` without root's override of file permissions."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's DAC override")
    prefix = NOCAP if os.geteuid() == 0 else []
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="400")
    return subprocess.run([*prefix, sys.executable, "-c", CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_an_unreadable_subfolder_is_not_left_out_in_silence(tmp_path):
    """train/a/sub/ with mode 000: extract and `predict --images` refuse in one line naming the folder and the
    permission (not 5 rows of the 6 images, exit 0), and extract writes nothing."""
    tree = _tree(tmp_path / "t", sub=True)
    model = _model(tmp_path)
    (tree / "train" / "a" / "sub").chmod(0)
    try:
        out = tmp_path / "s.zarr"
        proc = _bound("extract", "--dataset", "imagefolder", "--data-dir", tree, "--out", out, *PIXELS, cwd=tmp_path)
        assert proc.returncode == 1 and not out.exists(), proc.stdout + proc.stderr
        assert str(tree / "train" / "a" / "sub") in proc.stderr and "permission denied" in proc.stderr.lower(), proc.stderr
        proc = _bound("predict", "--model", model, "--images", tree / "train", cwd=tmp_path)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert str(tree / "train" / "a" / "sub") in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    finally:
        (tree / "train" / "a" / "sub").chmod(0o755)


def test_an_unreadable_class_folder_is_named_for_its_permissions(tmp_path):
    """train/b/ with mode 000 is refused naming the folder and "Permission denied", in extract and in `predict
    --images train/b`, not as a class without images in train/ ("add them") nor as a folder that "holds no images"."""
    tree = _tree(tmp_path / "t")
    model = _model(tmp_path)
    (tree / "train" / "b").chmod(0)
    try:
        proc = _bound("extract", "--dataset", "imagefolder", "--data-dir", tree, "--out", tmp_path / "s.zarr", *PIXELS,
                      cwd=tmp_path)
        predicted = _bound("predict", "--model", model, "--images", tree / "train" / "b", cwd=tmp_path)
    finally:
        (tree / "train" / "b").chmod(0o755)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(tree / "train" / "b") in proc.stderr and "permission denied" in proc.stderr.lower(), proc.stderr
    assert "add them" not in proc.stderr, proc.stderr
    assert predicted.returncode == 1 and "Traceback" not in predicted.stderr, predicted.stderr
    assert "permission denied" in predicted.stderr.lower() and "holds no images" not in predicted.stderr, predicted.stderr


# -- the error for a file Pillow cannot identify --------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["imagefolder", "images"])
def test_an_unidentified_image_is_named_without_a_memory_address(tmp_path, dataset):
    """x.png holding text, or an AppleDouble ._ok1.png a macOS copy leaves: extract names the file and says it is not
    an image Pillow can read, with no object repr (FileSource.load decodes the hashed bytes from a BytesIO, which
    Pillow's own error would name with its address), the same line twice."""
    tree = _tree(tmp_path / "t")
    (tree / "train" / "a" / "x.png").write_text("hello, not an image\n")
    data_dir = tree if dataset == "imagefolder" else tree / "train"
    lines = []
    for k in range(2):
        result = runner.invoke(app, ["extract", "--dataset", dataset, "--data-dir", str(data_dir),
                                     "--out", str(tmp_path / f"s{k}.zarr"), *PIXELS])
        helpers.assert_one_line_error(result, str(tree / "train" / "a" / "x.png"))
        lines.append(result.output.replace(f"s{k}.zarr", "s.zarr"))
    assert "BytesIO" not in lines[0] and " at 0x" not in lines[0], lines[0]
    assert "not an image Pillow can read" in lines[0], lines[0]
    assert lines[0] == lines[1]
