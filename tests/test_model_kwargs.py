"""``--model-kwargs``: typed parsing, a custom architecture from the command line, recorded in the store,
compared on resume; and the same extraction twice gives the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import TINY_VIT, TINY_VIT_KWARGS
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.encoders import EncoderConfig, format_model_kwargs, parse_model_kwargs
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import FeatureWriter, open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()
TINY = format_model_kwargs(TINY_VIT_KWARGS)  # img_size=32,patch_size=8,depth=2,num_heads=2,embed_dim=32


def test_parse_gives_typed_values_sorted_by_name():
    got = parse_model_kwargs(" depth=2, drop_rate=0.25,qkv_bias=false, class_token=True,global_pool=avg,"
                             "init_values=1e-5,pos_drop_rate=-.5,offset=-3")
    assert got == (("class_token", True), ("depth", 2), ("drop_rate", 0.25), ("global_pool", "avg"),
                   ("init_values", 1e-5), ("offset", -3), ("pos_drop_rate", -0.5), ("qkv_bias", False))
    assert [type(v) for _, v in got] == [bool, int, float, str, float, int, float, bool]
    assert parse_model_kwargs("") == parse_model_kwargs(None) == parse_model_kwargs("  ") == ()
    assert parse_model_kwargs("b=1,a=x") == parse_model_kwargs("a=x,b=1")  # the order written does not matter
    assert parse_model_kwargs(format_model_kwargs(got)) == got


@pytest.mark.parametrize("text,message", [
    ("depth", "item 'depth' is not NAME=VALUE"),
    ("depth=2,", "item '' is not NAME=VALUE"),
    ("=2", "item '=2' is not NAME=VALUE"),
    ("depth=", "item 'depth=' is not NAME=VALUE"),
    ("depth=2,depth=3", "gives depth twice"),
    ("2depth=2", "name '2depth' is not an argument name"),
    ("num_classes=10", "model_kwargs num_classes is set by foal-pipe itself"),
    ("pretrained=true", "model_kwargs pretrained is set by foal-pipe itself"),
])
def test_malformed_items_are_refused(text, message):
    with pytest.raises(FoalPipeError) as info:
        EncoderConfig(TINY_VIT, model_kwargs=parse_model_kwargs(text))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_image_size_and_img_size_must_agree():
    with pytest.raises(FoalPipeError, match="image_size=64 and model_kwargs='img_size=32' disagree"):
        EncoderConfig(TINY_VIT, image_size=64, model_kwargs=(("img_size", 32),))
    assert EncoderConfig(TINY_VIT, image_size=32, model_kwargs=(("img_size", 32),)).image_size == 32


def _extract(out: Path, checkpoint: Path, kwargs: str = TINY, *extra: str):
    return runner.invoke(app, ["extract", "--dataset", "digits", "--model", TINY_VIT, "--model-kwargs", kwargs,
                               "--checkpoint", str(checkpoint), "--out", str(out), "--workers", "0", "--device",
                               "cpu", "--chunk-rows", "512", *extra])


def _array_files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and p.relative_to(store).as_posix() != "zarr.json"}


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory, tiny_vit_checkpoint) -> Path:
    import torch

    out = tmp_path_factory.mktemp("cli") / "digits.zarr"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the one_torch_thread fixture
    try:
        result = _extract(out, tiny_vit_checkpoint)
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return out


def test_a_custom_architecture_from_the_cli_is_recorded(tiny_store, tiny_vit_checkpoint):
    import hashlib

    store = open_store(tiny_store)
    assert store.dim == 32 and store.train.n_rows == 1442
    enc = store.meta.encoder
    assert enc["name"] == "vit_tiny_patch16_224" and enc["requested"] == TINY_VIT  # architecture, not a hub tag
    assert enc["model_kwargs"] == dict(TINY_VIT_KWARGS) and enc["blocks"] == 2 and enc["image_size"] == 32
    assert enc["weights"]["source"] == "checkpoint" and "id" not in enc["weights"]
    assert enc["weights"]["sha256"] == hashlib.sha256(tiny_vit_checkpoint.read_bytes()).hexdigest()
    settings = zarr.open_group(str(tiny_store), mode="r").attrs["extract"]
    assert settings["encoder"]["model_kwargs"] == dict(TINY_VIT_KWARGS)
    assert "path" not in settings["encoder"]["weights"]  # where the file lies is not a setting, its hash is


def test_the_same_extraction_twice_gives_the_same_bytes(tmp_path, tiny_store, tiny_vit_checkpoint):
    again = tmp_path / "again.zarr"
    reordered = ",".join(reversed(TINY.split(",")))  # the same arguments in another order
    result = _extract(again, tiny_vit_checkpoint, reordered)
    assert result.exit_code == 0, result.output
    first, second = _array_files(tiny_store), _array_files(again)
    assert sorted(first) == sorted(second) and any(name.startswith("train/features/c") for name in first)
    for name in first:
        assert first[name] == second[name], f"{name} differs"


def test_another_value_refuses_to_resume(tmp_path, tiny_vit_checkpoint):
    out = tmp_path / "d.zarr"
    assert _extract(out, tiny_vit_checkpoint, TINY + ",drop_path_rate=0.0").exit_code == 0
    changed = _extract(out, tiny_vit_checkpoint, TINY + ",drop_path_rate=0.1")
    assert changed.exit_code == 1
    text = changed.output.strip()
    assert text.startswith("Error: ") and "\n" not in text and "Traceback" not in text
    assert "encoder.model_kwargs.drop_path_rate: 0.0 -> 0.1" in text and "--overwrite" in text
    dropped = _extract(out, tiny_vit_checkpoint, TINY)
    assert dropped.exit_code == 1 and "encoder.model_kwargs.drop_path_rate: 0.0 -> None" in dropped.output
    same = _extract(out, tiny_vit_checkpoint, ",".join(reversed((TINY + ",drop_path_rate=0.0").split(","))))
    assert same.exit_code == 0 and "already complete" in same.output


class Boom(Exception):
    pass


def test_an_interrupted_custom_architecture_resumes(tmp_path, monkeypatch, tiny_store, tiny_vit_checkpoint):
    out = tmp_path / "r.zarr"
    real = FeatureWriter.write
    calls = []

    def once(*args):
        if calls:
            raise Boom
        calls.append(1)
        real(*args)

    monkeypatch.setattr(FeatureWriter, "write", once)
    assert isinstance(_extract(out, tiny_vit_checkpoint).exception, Boom)
    monkeypatch.setattr(FeatureWriter, "write", real)
    result = _extract(out, tiny_vit_checkpoint)
    assert result.exit_code == 0 and "resumed from train 512" in result.output, result.output
    np.testing.assert_array_equal(np.asarray(open_store(out).train.features[:]),
                                  np.asarray(open_store(tiny_store).train.features[:]))


@pytest.mark.parametrize("args,message", [
    (["--model-kwargs", "depth"], "--model-kwargs item 'depth' is not NAME=VALUE"),
    (["--model-kwargs", f"{TINY},depth=3"], "--model-kwargs gives depth twice"),
    (["--model-kwargs", "num_classes=3"], "--model-kwargs num_classes is set by foal-pipe itself"),
    (["--model-kwargs", TINY, "--image-size", "64"], "--image-size 64 and --model-kwargs img_size=32 disagree"),
    (["--model-kwargs", "depth=-1"], "cannot build timm model vit_tiny_patch16_224 built with depth=-1"),
    (["--model-kwargs", "img_size=32,patch_size=8,num_heads=2,embed_dim=32"],
     "does not fit vit_tiny_patch16_224 built with embed_dim=32,img_size=32,num_heads=2,patch_size=8: 120 missing "
     "keys"),
    (["--model", "pixels", "--model-kwargs", "depth=2"], "--model pixels has no weights or architecture, so "
     "--model-kwargs does not apply"),
])
def test_cli_model_kwargs_errors_are_one_line(tmp_path, tiny_vit_checkpoint, args, message):
    out = tmp_path / "x.zarr"
    base = ["extract", "--model", TINY_VIT, "--checkpoint", str(tiny_vit_checkpoint)]
    if "pixels" in args:
        base = ["extract"]
    result = runner.invoke(app, [*base, *args, "--out", str(out), "--workers", "0", "--device", "cpu"])
    assert result.exit_code == (2 if "is not NAME=VALUE" in message else 1), result.output  # text that is none: a usage error
    text = result.output.strip()
    assert text.startswith("Error: ") and "Traceback" not in text and "\n" not in text, text
    assert message in text
    assert not out.exists()
