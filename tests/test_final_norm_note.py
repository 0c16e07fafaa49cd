"""What extract, datasets and the fused encoder say. The ``final_norm`` a store's or a model's ``encoder``
records says where the norm went: on the block average only for fusions that average (it said so for ``last``,
``block:K`` and ``concat`` too)."""

from __future__ import annotations

import pytest

from foal_pipe.store.blockfusion import fused_encoder, parse_fusion


@pytest.mark.parametrize(("spec", "note"), [
    ("mean-cls", "applied once to the block average"),
    ("mean:2-4", "applied once to the block average"),
    ("last", "applied once to the block's token"),
    ("block:3", "applied once to the block's token"),
    ("mean:3-3", "applied once to the block's token"),
    ("concat:1-2", "applied to each block's token"),
])
def test_the_recorded_final_norm_follows_the_fusion(spec, note):
    fusion = parse_fusion(spec)
    assert fusion.norm_note == note
    assert fused_encoder({"name": "m"}, fusion, True, "float16")["final_norm"] == note
    assert fused_encoder({"name": "m"}, fusion, False, "float16")["final_norm"] == "not applied (--no-fusion-norm)"


def test_extract_says_the_features_dtype_beside_each_split_not_after_the_blocks(tmp_path):
    """'train 1,442 x 32, test 355 x 32, with every block's token (float16) float32' put the features' dtype last."""
    from helpers import invoke

    out = tmp_path / "d.zarr"
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", out)
    assert result.exit_code == 0, result.output
    assert "train 1,442 x 192 float32, test 355 x 192 float32, encoder" in " ".join(result.output.split()), result.output


def test_datasets_says_when_data_dir_is_no_folder(tmp_path):
    """Every dataset "no" in a folder that is not there read as a search that found nothing."""
    from helpers import invoke

    result = invoke("datasets", "--data-dir", tmp_path / "missing")
    assert result.exit_code == 0 and f"note: {tmp_path / 'missing'} is not a folder" in result.output, result.output
