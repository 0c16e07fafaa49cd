"""Options that `extract` and `table` (and `learn`) accepted and then silently ignored (audit s23, ign2).

The rule: an option the user sets that cannot affect the result is refused in one line ("--X ... would be ignored;
drop --X ..."), never silently ignored. Each case below ran exit 0 with every output byte-identical (settings records
aside) to the same command without the option; each test expects the one-line refusal, with nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_one_line_error, cluster_store, make_image_tree, runner

from foal_pipe.cli import app


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six classes of 16 features, 300 training rows, chunks of 100."""
    return cluster_store(tmp_path_factory.mktemp("ign2") / "s.zarr", 6, 16, 120, 100, 0, n_train=300)


# --- extract --download: only torchvision's datasets download; every other dataset ignored it -------------------------

def _extract(out: Path, *args: str):
    return runner.invoke(app, ["extract", "--model", "pixels", "--chunk-rows", "256", "--workers", "0", "--device", "cpu",
                               "--out", str(out), *args])


def test_extract_download_refused_for_bundled_digits(tmp_path: Path) -> None:
    """`extract --dataset digits --model pixels --download`: digits ships with scikit-learn (--data-dir is refused for
    it for that reason) and load_digits never reads ``download``; the store was written exactly as without it."""
    out = tmp_path / "d.zarr"
    result = _extract(out, "--dataset", "digits", "--download")
    assert_one_line_error(result, "--download", "drop --download")
    assert not out.exists()


def test_extract_download_refused_for_image_folder(tmp_path: Path) -> None:
    """`extract --dataset imagefolder --data-dir TREE --download`: a local tree has nothing to download
    (load_imagefolder ignores ``download``); the store was byte-identical to the one without it."""
    tree = make_image_tree(tmp_path / "tree", {"a": 3, "b": 3})
    out = tmp_path / "i.zarr"
    result = _extract(out, "--dataset", "imagefolder", "--data-dir", str(tree), "--image-size", "8", "--download")
    assert_one_line_error(result, "--download", "drop --download")
    assert not out.exists()


# --- --blurry-ratio with --disjoint-ratio 100: no blurry class is left to deal rows from --------------------------------

@pytest.mark.parametrize("command", ["table", "learn"])
def test_blurry_ratio_refused_when_every_class_is_disjoint(store: Path, tmp_path: Path, command: str) -> None:
    """--stream si-blurry --disjoint-ratio 100 makes every class disjoint (stream.si_blurry: C * 100 // 100 = C), so
    ``blurry_ratio`` % of the blurry classes' rows is % of none: --blurry-ratio 30 (or 90, or 0) gave the same table
    and the same model as the default, only its settings record differing."""
    out = tmp_path / "out"
    head = ["--heads", "ncm", "--order-seeds", "0"] if command == "table" else ["--head", "ncm", "--order-seed", "0"]
    result = runner.invoke(app, [command, "--features", str(store), "--out", str(out), *head, "--tasks", "3",
                                 "--stream", "si-blurry", "--disjoint-ratio", "100", "--blurry-ratio", "30"])
    assert_one_line_error(result, "--blurry-ratio", "drop --blurry-ratio")
    assert not out.exists()


# --- table --batch-size: only dual's recursion reads the mini-batches (the others ignore it: left, see the s23 note) --

def test_table_batch_size_taken_with_dual(store: Path, tmp_path: Path) -> None:
    """The counterpart that must keep working: dual's recursion runs on the stream's mini-batches."""
    result = runner.invoke(app, ["table", "--features", str(store), "--out", str(tmp_path / "t"), "--heads", "dual",
                                 "--tasks", "3", "--order-seeds", "0", "--projection-dim", "20", "--gamma", "1",
                                 "--batch-size", "7"])
    assert result.exit_code == 0, result.output
