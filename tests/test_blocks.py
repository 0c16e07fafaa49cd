"""``extract --keep-blocks`` and fusions at read time (issue 13): every block's token stored once, any fusion
computed from them equals the encoder's own fusion, with the same resume and damage guarantees as features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CHUNK, KWARGS_4, TINY_VIT, extract_one_thread, store_files, vit4_spec, write_nonfinite_store
from typer.testing import CliRunner

import foal_pipe.store as st
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.store import create_array, open_store, verify_store, write_store
from foal_pipe.store.blockfusion import FUSION_FORMS, FinalNorm, FusedSplit, fuse, parse_fusion, parse_fusions
from foal_pipe.store.integrity import compute_generation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()
SPECS = ("mean-cls", "last", "mean:2-3", "block:2")


@pytest.fixture(scope="module")
def stores(tmp_path_factory, vit4_checkpoint) -> dict[str, Path]:
    """A float32 and a float16 blocks store, a plain store, and one ``extract --fusion SPEC`` store per spec."""
    root = tmp_path_factory.mktemp("blocks")
    out = {"f32": vit4_spec(root / "f32.zarr", vit4_checkpoint, keep_blocks=True, blocks_dtype="float32"),
           "f16": vit4_spec(root / "f16.zarr", vit4_checkpoint, keep_blocks=True),
           "plain": vit4_spec(root / "plain.zarr", vit4_checkpoint)}
    out |= {spec: vit4_spec(root / f"{spec.replace(':', '_')}.zarr", vit4_checkpoint, fusion=spec) for spec in SPECS}
    for spec in out.values():
        extract_one_thread(spec)
    return {name: spec.out_path for name, spec in out.items()}


def _all(split) -> np.ndarray:
    return np.concatenate([x for _, x in split.iter_chunks()])


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


def assert_identical(a: Path, b: Path) -> None:
    fa, fb = store_files(a), store_files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"


# -- specs --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,blocks", [
    ("mean-cls", [0, 1, 2, 3]), ("last", [3]), ("mean:2-3", [1, 2]), ("mean:1-4", [0, 1, 2, 3]),
    ("block:1", [0]), ("block:4", [3]), (" Mean:02-3 ", [1, 2]), ("mean:3-3", [2]),
])
def test_specs_choose_blocks(text, blocks):
    assert list(parse_fusion(text).blocks(4)) == blocks


def test_specs_are_canonical_and_lists_refuse_repeats():
    assert parse_fusion(" Mean:02-3 ").text == "mean:2-3" and parse_fusion("BLOCK:07").text == "block:7"
    assert [f.text for f in parse_fusions("mean-cls, last,mean:7-12")] == ["mean-cls", "last", "mean:7-12"]
    with pytest.raises(FoalPipeError, match="--fusions lists mean:2-3 twice"):
        parse_fusions("mean:2-3,mean:02-3", "--fusions")


@pytest.mark.parametrize("text,message", [
    ("mean:5-2", "--fusion mean:5-2 starts at block 5, after its last block 2; write mean:A-B with A <= B (e.g. "
                 "mean:2-5)"),
    ("block:0", "--fusion block:0: blocks are numbered from 1"),
    ("foo", "unknown --fusion 'foo'"),
    ("mean", "--fusion mean needs a block range; write mean:A-B"),
    ("mean:x-3", "--fusion mean:x-3: 'x' is not a block number"),
    ("mean:3", "--fusion mean:3 needs a block range"),
    ("block", "--fusion block needs a block number"),
    ("block:1.5", "'1.5' is not a block number"),
    ("last:2", "last takes no ':2'"),
    ("", "unknown --fusion ''"),
])
def test_bad_specs_are_one_line_naming_the_valid_forms(text, message):
    with pytest.raises(FoalPipeError) as info:
        parse_fusion(text, "--fusion")
    text = str(info.value)
    assert message in text and "\n" not in text
    assert FUSION_FORMS in text


def test_blocks_beyond_the_model_are_refused():
    with pytest.raises(FoalPipeError) as info:
        parse_fusion("block:99").blocks(4)
    assert str(info.value) == ("fusion 'block:99' needs block 99 but there are 4 blocks; choose blocks within 1-4 "
                               f"({FUSION_FORMS})")
    with pytest.raises(FoalPipeError, match="'mean:3-5' needs block 5 but there are 4 blocks"):
        parse_fusion("mean:3-5").blocks(4)


# -- the final norm, against torch and timm modules --------------------------------------------------------------
@pytest.mark.parametrize("layer", ["layernorm", "layernormfp32", "rmsnorm", "rmsnormfp32", "simplenorm", "torch-rms",
                                   "torch-ln-nobias", "identity"])
def test_final_norm_equals_the_module(layer):
    import torch
    from timm.layers import get_norm_layer

    from foal_pipe.encoders.fusion import norm_parameters

    torch.manual_seed(0)
    build = {"torch-rms": lambda: torch.nn.RMSNorm(24, eps=1e-5), "identity": torch.nn.Identity,
             "torch-ln-nobias": lambda: torch.nn.LayerNorm(24, bias=False)}.get(layer)
    module = build() if build else get_norm_layer(layer)(24, eps=1e-6)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-1.5, 1.5)
    x = (torch.randn(50, 24) * 3 + torch.linspace(-2, 2, 24)).float()
    params = norm_parameters(module)
    norm = FinalNorm(params.pop("kind"), params.pop("eps"), **params)
    with torch.no_grad():
        want = module(x).numpy()
    assert _relative(norm(x.numpy()), want) < 1e-6


def test_an_unsupported_norm_is_refused():
    import torch

    from foal_pipe.encoders.fusion import norm_parameters

    with pytest.raises(FoalPipeError, match="the final norm BatchNorm1d is not one foal-pipe can recompute"):
        norm_parameters(torch.nn.BatchNorm1d(8))


# -- exactness: fused at read time == fused by the encoder at extraction (req 4) ---------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_fused_from_float32_blocks_equals_extract_fusion(stores, spec):
    blocks, reference = open_store(stores["f32"]), open_store(stores[spec])
    fused = blocks.fused(spec)
    assert isinstance(fused.train, FusedSplit) and fused.dim == 32 and fused.train.chunk_rows == CHUNK
    assert fused.train.features.shape == (1442, 32) and fused.train.features.dtype == np.float32  # sized, not read
    for split in ("train", "test"):
        want = np.asarray(reference.split(split).features[:])
        got = _all(fused.split(split))
        assert got.dtype == np.float32 and got.shape == want.shape
        assert _relative(got, want) < 1e-6, spec
        rows = np.array([300, 3, 1000 % want.shape[0], 3, 17])
        np.testing.assert_array_equal(fused.split(split).take(rows), got[rows])
        np.testing.assert_array_equal(fused.split(split).labels, reference.split(split).labels)
    assert fused.meta.encoder["fusion"] == spec and fused.meta.encoder["blocks_dtype"] == "float32"


@pytest.mark.parametrize("spec", SPECS)
def test_fused_from_float16_blocks_is_close_to_extract_fusion(stores, spec):
    got = _all(open_store(stores["f16"]).fused(spec).test)
    want = np.asarray(open_store(stores[spec]).test.features[:])
    assert 1e-6 < _relative(got, want) < 2e-3  # float16 rounding of the tokens (~5e-4, docs/feature-store.md)


def test_keeping_blocks_does_not_change_the_features(stores):
    for kept in ("f32", "f16"):
        for split in ("train", "test"):
            assert store_files(stores[kept])[f"{split}/features/c/0/0"] == store_files(stores["plain"])[f"{split}/features/c/0/0"]
            np.testing.assert_array_equal(np.asarray(open_store(stores[kept]).split(split).features[:]),
                                          np.asarray(open_store(stores["plain"]).split(split).features[:]))


def test_stored_blocks_are_the_model_tokens(stores, vit4_checkpoint):
    """Independently of the hooks: block K's stored token is timm's intermediate output of block K, and
    ``last`` with the norm is timm's own forward_features CLS token."""
    import torch

    from foal_pipe.datasets import PreparedImages, open_dataset
    from foal_pipe.encoders import EncoderConfig, build_encoder

    enc = build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(vit4_checkpoint), model_kwargs=KWARGS_4)).load("cpu")
    images = PreparedImages(open_dataset("digits").test, enc.image_size, enc.interpolation)
    x = enc.preprocess(torch.from_numpy(np.stack([images[i][0] for i in range(20)])))
    with torch.inference_mode():
        inter = enc.model.forward_intermediates(x, return_prefix_tokens=True, norm=False, output_fmt="NLC",
                                                intermediates_only=True)
        want_blocks = torch.stack([prefix[:, 0] for _, prefix in inter], dim=1).numpy()
        want_last = enc.plain_features(x).numpy()
    store = open_store(stores["f32"])
    got = store.test.read_blocks(0, 20)
    assert got.shape == (20, 4, 32) and _relative(got, want_blocks) < 1e-6
    assert _relative(store.fused("last").test.read(0, 20), want_last) < 1e-6


def test_no_fusion_norm_gives_the_plain_block_mean(stores):
    import torch

    store = open_store(stores["f32"])
    raw = store.fused("mean:2-3", norm=False).train.read(0, 100)
    blocks = store.train.read_blocks(0, 100).astype(np.float64)
    np.testing.assert_allclose(raw, blocks[:, 1:3].mean(axis=1), rtol=1e-6, atol=1e-6)
    norm = store.blocks.norm
    assert norm.kind == "layernorm" and norm.eps == 1e-6 and not np.allclose(norm.weight, 1)
    ln = torch.nn.functional.layer_norm(torch.from_numpy(raw), (32,), torch.from_numpy(norm.weight),
                                        torch.from_numpy(norm.bias), norm.eps).numpy()
    assert _relative(store.fused("mean:2-3").train.read(0, 100), ln) < 1e-6
    assert store.fused("mean:2-3", norm=False).meta.encoder["final_norm"].startswith("not applied")


def test_several_fusions_from_one_read_of_each_chunk(stores, monkeypatch):
    store = open_store(stores["f16"])
    reads = []
    real = st.Split.read_blocks
    monkeypatch.setattr(st.Split, "read_blocks", lambda self, lo, hi: reads.append((lo, hi)) or real(self, lo, hi))
    many = store.fusions("mean-cls,last,mean:2-3,block:2")["train"]
    assert many.specs == SPECS and many.n_rows == 1442 and many.chunk_rows == CHUNK
    chunks = list(many.iter_chunks())
    assert reads == [(lo, min(lo + CHUNK, 1442)) for lo in range(0, 1442, CHUNK)]
    for spec in SPECS:
        np.testing.assert_array_equal(np.concatenate([c[spec] for _, c in chunks]), _all(store.fused(spec).train))
    rows = np.array([5, 1400, 5, 0])
    taken = many.take(rows)
    np.testing.assert_array_equal(taken["last"], store.fused("last").train.take(rows))
    assert [lo for lo, _ in many.iter_chunks(300, 700)] == [300, 512]


def test_token_mean_blocks_fuse_like_extract(tmp_path, vit4_checkpoint):
    kept = vit4_spec(tmp_path / "k.zarr", vit4_checkpoint, token="mean", keep_blocks=True, blocks_dtype="float32")
    ref = vit4_spec(tmp_path / "r.zarr", vit4_checkpoint, token="mean", fusion="mean:3-4")
    extract_one_thread(kept), extract_one_thread(ref)
    got = _all(open_store(kept.out_path).fused("mean:3-4").test)
    assert _relative(got, np.asarray(open_store(ref.out_path).test.features[:])) < 1e-6


@pytest.mark.slow  # builds a timm ViT
def test_rmsnorm_model_fuses_like_extract(tmp_path):
    kwargs = (*KWARGS_4, ("norm_layer", "rmsnorm"))
    base = dict(dataset="digits", model=TINY_VIT, pretrained=False, model_kwargs=tuple(sorted(kwargs)), workers=0,
                chunk_rows=512, batch_size=128, device="cpu")
    kept = ExtractSpec(out=str(tmp_path / "k.zarr"), keep_blocks=True, blocks_dtype="float32", **base)
    ref = ExtractSpec(out=str(tmp_path / "r.zarr"), fusion="mean:1-3", **base)
    extract_one_thread(kept), extract_one_thread(ref)
    store = open_store(kept.out_path)
    assert store.blocks.norm.kind == "rmsnorm" and store.meta.extra["blocks"]["norm"]["kind"] == "rmsnorm"
    assert _relative(_all(store.fused("mean:1-3").test), np.asarray(open_store(ref.out_path).test.features[:])) < 1e-6


# -- the store layout -----------------------------------------------------------------------------------------
def test_layout_attributes_and_settings(stores):
    group = zarr.open_group(str(stores["f16"]), mode="r")
    attrs = dict(group.attrs)
    assert attrs["format_version"] == 5
    assert attrs["blocks"] == {"count": 4, "dtype": "float16", "norm": {"kind": "layernorm", "eps": 1e-6}}
    assert attrs["extract"]["keep_blocks"] is True and attrs["extract"]["blocks_dtype"] == "float16"
    plain = dict(zarr.open_group(str(stores["plain"]), mode="r").attrs)
    assert "blocks" not in plain and plain["extract"]["keep_blocks"] is False
    assert plain["extract"]["blocks_dtype"] is None
    for split, n in (("train", 1442), ("test", 355)):
        blocks = group[f"{split}/blocks"]
        assert blocks.shape == (n, 4, 32) and blocks.chunks == (CHUNK, 4, 32) and blocks.dtype == np.float16
        assert st.has_checksums(blocks)
    assert group["norm/weight"].shape == (32,) and group["norm/bias"].dtype == np.float32
    assert verify_store(stores["f16"]).problems == []


def test_stores_without_blocks_refuse_a_fusion_with_the_command_that_makes_one(stores):
    for path in (stores["plain"], stores["last"]):
        with pytest.raises(FoalPipeError) as info:
            open_store(path, fusion="last")
        text = str(info.value)
        assert "keeps no per-block tokens, so fusion 'last' cannot be computed" in text
        assert "`foal-pipe extract ... --keep-blocks`" in text and "\n" not in text
    with pytest.raises(FoalPipeError, match="fusion 'block:5' needs block 5 but there are 4 blocks"):
        open_store(stores["f16"], fusion="block:5")
    with pytest.raises(FoalPipeError, match="keeps no per-block tokens"):
        open_store(stores["f16"]).fused("last").fused("last")  # fused features are not blocks


def test_write_store_with_blocks_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    blocks = rng.normal(size=(40, 3, 5)).astype(np.float32)
    y = rng.integers(0, 2, 40)
    norm = FinalNorm("layernorm", 1e-5, rng.uniform(0.5, 1.5, 5).astype(np.float32), np.ones(5, np.float32))
    feats = fuse(blocks, "mean-cls", norm)
    path = write_store(tmp_path / "s.zarr", (feats, y), (feats[:10], y[:10]), ["a", "b"], chunk_rows=16,
                       blocks=(blocks, blocks[:10]), norm=norm)
    store = open_store(path, fusion="mean-cls")
    np.testing.assert_array_equal(_all(store.train), feats)
    np.testing.assert_array_equal(store.blocks.norm.weight, norm.weight)
    centred = blocks.astype(np.float64).mean(axis=1) - blocks.astype(np.float64).mean(axis=(1, 2))[:, None]
    by_hand = centred / np.sqrt((centred**2).mean(axis=1, keepdims=True) + 1e-5) * norm.weight + 1
    assert _relative(feats, by_hand) < 1e-6


def _edit_blocks(path: Path, **attrs) -> None:
    group = zarr.open_group(str(path), mode="r+")
    group.attrs.put({**dict(group.attrs), "blocks": {**dict(group.attrs)["blocks"], **attrs}})


@pytest.mark.parametrize("change,message", [
    ({"count": 3}, "train/blocks in {path} is float16 (40, 2, 5) in chunks of (16, 2, 5), expected float16 (40, 3, 5)"),
    ({"count": "2"}, "attribute 'blocks' is"),
    ({"dtype": "float64"}, "attribute 'blocks' is"),
    ({"norm": {"kind": "batchnorm", "eps": 0.1}}, "final norm kind 'batchnorm' is not one foal-pipe recomputes"),
    ({"norm": {"kind": "layernorm", "eps": -1}}, "attribute 'blocks' is"),
])
def test_a_bad_blocks_layout_is_refused(tmp_path, change, message):
    rng = np.random.default_rng(1)
    blocks = rng.normal(size=(40, 2, 5)).astype(np.float16)
    x, y = blocks[:, -1].astype(np.float32), rng.integers(0, 2, 40)
    path = write_store(tmp_path / "s.zarr", (x, y), (x, y), ["a", "b"], chunk_rows=16, blocks=(blocks, blocks))
    _edit_blocks(path, **change)
    with pytest.raises(FoalPipeError) as info:
        open_store(path)
    assert message.format(path=path) in str(info.value) and "\n" not in str(info.value)


# -- resume, damage, settings ---------------------------------------------------------------------------------
class Boom(Exception):
    pass


@pytest.mark.parametrize("fail_at,half", [(0, False), (3, False), (7, False), (3, True)])
def test_resume_gives_a_byte_identical_blocks_store(tmp_path, monkeypatch, stores, vit4_checkpoint, fail_at, half):
    """Killed before the chunk ``fail_at`` (train has 6 chunks, so 7 is in test); ``half``: that chunk's blocks
    are on disk, its features not (the kill came between the two writes)."""
    spec = vit4_spec(tmp_path / "b.zarr", vit4_checkpoint, keep_blocks=True)
    real, calls = st.FeatureWriter.write, []

    def failing(writer, lo, block, *blocks):
        if len(calls) == fail_at:
            if half:
                writer.blocks[lo : lo + len(block)] = blocks[0]
            raise Boom
        calls.append(lo)
        real(writer, lo, block, *blocks)

    monkeypatch.setattr(st.FeatureWriter, "write", failing)
    with pytest.raises(Boom):
        run_extract(spec)
    monkeypatch.setattr(st.FeatureWriter, "write", real)
    progress = st.read_meta(spec.out_path)[1].extra["progress"]
    assert progress == {"train": min(fail_at * CHUNK, 1442), "test": max(0, fail_at - 6) * CHUNK}
    report = run_extract(spec)
    assert report.status == "resumed" and report.resumed_from == progress
    assert_identical(stores["f16"], spec.out_path)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_missing_blocks_chunk_is_found_and_re_extracted(tmp_path, stores, vit4_checkpoint):
    path = _copy(stores["f16"], tmp_path / "b.zarr")
    (path / "train" / "blocks" / "c" / "2" / "0" / "0").unlink()
    with pytest.raises(FoalPipeError, match=r"train/blocks has 1 of 6 chunk files missing \(first at rows 512-767\)"):
        open_store(path)
    assert [str(p) for p in verify_store(path, read=False).problems] == ["train/blocks rows 512-767: missing"]
    shown = runner.invoke(app, ["info", str(path)])
    assert shown.exit_code == 1 and "train/blocks rows 512-767: missing" in shown.output
    report = run_extract(vit4_spec(path, vit4_checkpoint, keep_blocks=True))
    assert report.status == "resumed" and report.holes == {"train": 512}
    assert_identical(stores["f16"], path)
    (path / "train" / "blocks" / "c" / "4" / "0" / "0").unlink()  # a later blocks hole, an earlier features one:
    (path / "train" / "features" / "c" / "1" / "0").unlink()  # extraction resumes at the first of either
    report = run_extract(vit4_spec(path, vit4_checkpoint, keep_blocks=True))
    assert report.status == "resumed" and report.holes == {"train": 256}
    assert_identical(stores["f16"], path)


def test_a_damaged_blocks_chunk_is_named(tmp_path, stores):
    path = _copy(stores["f32"], tmp_path / "b.zarr")
    chunk = path / "test" / "blocks" / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    store = open_store(path, fusion="last")
    assert store.test.read(0, 10).shape == (10, 32)  # the first chunk is intact
    with pytest.raises(FoalPipeError, match=r"test/blocks chunk at rows 256-354 is damaged \(checksum mismatch\)"):
        list(store.test.iter_chunks())
    with pytest.raises(FoalPipeError, match=r"test/blocks chunk at rows 256-354 is damaged"):
        store.test.take(np.array([3, 300]))
    assert [str(p) for p in verify_store(path).problems] == ["test/blocks rows 256-354: damaged (checksum mismatch)"]


def test_nan_in_blocks_is_named(tmp_path):
    blocks = np.ones((20, 2, 3), np.float16)
    blocks[13, 1, 2] = np.inf
    x, y = np.ones((20, 3), np.float32), np.zeros(20, int)
    path = write_nonfinite_store(tmp_path / "s.zarr", (x, y), (x, y), ["a"], chunk_rows=8, blocks=(blocks, blocks))
    with pytest.raises(FoalPipeError, match=r"train/blocks has NaN or inf values \(first bad row: 13\).*blocks_dtype='float32'"):
        list(open_store(path, fusion="mean-cls").train.iter_chunks())
    problems = [str(p) for p in verify_store(path).problems]
    assert problems[0] == "test/blocks rows 8-15: NaN or inf values (first at row 13)"


def test_other_block_settings_refuse_to_resume(tmp_path, monkeypatch, vit4_checkpoint):
    spec = vit4_spec(tmp_path / "b.zarr", vit4_checkpoint, keep_blocks=True)
    monkeypatch.setattr(st.FeatureWriter, "write", lambda *a: (_ for _ in ()).throw(Boom()))
    with pytest.raises(Boom):
        run_extract(spec)
    monkeypatch.undo()
    with pytest.raises(FoalPipeError, match=r"different settings \(blocks_dtype: 'float16' -> 'float32'\)"):
        run_extract(vit4_spec(spec.out_path, vit4_checkpoint, keep_blocks=True, blocks_dtype="float32"))
    with pytest.raises(FoalPipeError, match=r"blocks_dtype: 'float16' -> None; keep_blocks: True -> False"):
        run_extract(vit4_spec(spec.out_path, vit4_checkpoint))


# -- older stores still read ----------------------------------------------------------------------------------
def test_a_version_2_store_still_reads(tmp_path):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(50, 6)).astype(np.float32), np.tile(np.arange(5), 10)
    path = tmp_path / "v2.zarr"
    group = zarr.open_group(str(path), mode="w")
    for split, rows in (("train", slice(0, 40)), ("test", slice(40, 50))):
        create_array(group, f"{split}/features", x[rows].shape, (16, 6), "float32")[:] = x[rows]
        create_array(group, f"{split}/labels", y[rows].shape, (40,), "int64")[:] = y[rows]
    attrs = {"format": "foal-pipe/features", "format_version": 2, "classes": list("abcde"), "dataset": "v2",
             "encoder": {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}, "complete": True}
    group.attrs.put(attrs)
    group.attrs.put({**attrs, "generation": compute_generation(path)})  # checked on open: it must be the store's
    store = open_store(path)
    assert store.meta.format_version == 2 and store.blocks is None and store.train.blocks is None
    np.testing.assert_array_equal(_all(store.train), x[:40])
    with pytest.raises(FoalPipeError, match="keeps no per-block tokens.*--keep-blocks"):
        store.fused("mean-cls")
    shown = runner.invoke(app, ["info", str(path)])
    assert shown.exit_code == 0 and "2, crc32c checksum on every chunk" in shown.output


# -- the command line -----------------------------------------------------------------------------------------
def test_cli_keep_blocks_and_info(tmp_path, vit4_checkpoint, stores):
    from helpers import TINY_VIT as MODEL

    from foal_pipe.encoders import format_model_kwargs

    out = tmp_path / "c.zarr"
    result = runner.invoke(app, ["extract", "--model", MODEL, "--model-kwargs", format_model_kwargs(KWARGS_4),
                                 "--checkpoint", str(vit4_checkpoint), "--out", str(out), "--workers", "0",
                                 "--device", "cpu", "--chunk-rows", str(CHUNK), "--batch-size", "100",
                                 "--keep-blocks"])
    assert result.exit_code == 0, result.output
    assert "with every block's token (float16)" in result.output
    assert_identical(stores["f16"], out)  # the CLI writes what the API writes
    shown = runner.invoke(app, ["info", str(out)])
    assert shown.exit_code == 0 and "4 block tokens per row, float16, final norm layernorm" in shown.output
    as_json = json.loads(runner.invoke(app, ["info", str(out), "--json"]).stdout)
    assert as_json["blocks"] == {"count": 4, "dtype": "float16", "norm": {"kind": "layernorm", "eps": 1e-6}}


@pytest.mark.parametrize("args,message", [
    (["--model", "pixels", "--keep-blocks"], "--model pixels has no transformer blocks, so --keep-blocks does not "
     "apply; drop --keep-blocks or choose a timm ViT --model"),
    (["--fusion", "block:99", "--model", TINY_VIT], "fusion 'block:99' needs block 99 but there are 4 blocks"),
    (["--fusion", "mean:5-2", "--model", TINY_VIT], "--fusion mean:5-2 starts at block 5, after its last block 2"),
])
def test_cli_refusals_are_one_line_and_write_nothing(tmp_path, vit4_checkpoint, args, message):
    from foal_pipe.encoders import format_model_kwargs

    out = tmp_path / "x.zarr"
    vit = ["--model-kwargs", format_model_kwargs(KWARGS_4), "--checkpoint", str(vit4_checkpoint)]
    base = ["extract", *(vit if TINY_VIT in args else []), *([] if "--model" in args else ["--model", "pixels"])]
    result = runner.invoke(app, [*base, *args, "--out", str(out), "--workers", "0", "--device", "cpu"])
    assert result.exit_code == (2 if "mean:5-2" in args else 1), result.output  # a spec that is none: a usage error
    text = result.output.strip()
    assert text.startswith("Error: ") and "\n" not in text and "Traceback" not in text, text
    assert message in text
    assert not out.exists()


# --------------------------------------------------------------------------------------------------
# learn / sweep / predict --fusion


def _learn(store: Path, out: Path, *extra: str):
    from typer.testing import CliRunner

    from foal_pipe.cli import app

    args = ["learn", "--features", str(store), "--out", str(out), "--tasks", "5", "--projection-dim", "64", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def test_learn_with_a_read_time_fusion_equals_learn_on_those_features(stores, tmp_path):
    """`learn --fusion last` on a blocks store is `learn` on a plain store holding the same fused features."""
    from foal_pipe.model.modelfile import read_model
    from foal_pipe.store import open_store, write_store

    fused = open_store(stores["f32"], fusion="last")
    plain = write_store(tmp_path / "fused.zarr", (_all(fused.train), fused.train.labels),
                        (_all(fused.test), fused.test.labels), list(fused.classes), dataset="digits",
                        encoder=fused.meta.encoder)
    a = _learn(stores["f32"], tmp_path / "a", "--fusion", "last")
    b = _learn(plain, tmp_path / "b")
    assert a["accuracy_matrix"] == b["accuracy_matrix"] and a["encoder"]["fusion"] == "last"
    wa, wb = read_model(tmp_path / "a/model.safetensors")[0]["W"], read_model(tmp_path / "b/model.safetensors")[0]["W"]
    np.testing.assert_allclose(wa, wb, rtol=1e-12, atol=1e-12)
    other = _learn(stores["f32"], tmp_path / "c", "--fusion", "last", "--no-fusion-norm")
    assert other["encoder"]["final_norm"].startswith("not applied")


def test_predict_rebuilds_the_models_fusion(stores, tmp_path):
    from typer.testing import CliRunner

    from foal_pipe.cli import app

    _learn(stores["f32"], tmp_path / "run", "--fusion", "mean:2-3")
    result = CliRunner().invoke(app, ["predict", "--model", str(tmp_path / "run/model.safetensors"), "--features",
                                      str(stores["f32"]), "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 0, result.output
    refused = CliRunner().invoke(app, ["predict", "--model", str(tmp_path / "run/model.safetensors"), "--features",
                                       str(stores["plain"])])
    assert refused.exit_code == 1 and "--keep-blocks" in refused.output


def test_learn_fusion_on_a_store_without_blocks_is_one_line(stores, tmp_path):
    from typer.testing import CliRunner

    from foal_pipe.cli import app

    result = CliRunner().invoke(app, ["learn", "--features", str(stores["plain"]), "--out", str(tmp_path / "x"),
                                      "--tasks", "5", "--fusion", "last"])
    assert result.exit_code == 1 and "--keep-blocks" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_learn_fusion_with_dask_is_refused_not_run_on_the_stored_features(stores, tmp_path):
    from typer.testing import CliRunner

    from foal_pipe.cli import app

    result = CliRunner().invoke(app, ["learn", "--features", str(stores["f32"]), "--out", str(tmp_path / "x"),
                                      "--tasks", "5", "--fusion", "last", "--scheduler", "dask"])
    assert result.exit_code == 1 and "use --scheduler local with --fusion" in result.output
    assert not (tmp_path / "x").exists()


def test_fusing_at_read_time_needs_no_torch(stores):
    import os
    import subprocess
    import sys

    code = f"""
import sys
class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "timm", "torchvision"):
            raise ModuleNotFoundError(name, name=name)
sys.meta_path.insert(0, Hidden())
from foal_pipe.store import open_store
several = open_store({str(stores["f16"])!r}).fusions("mean-cls,mean:2-3")
print(sum(len(d["mean:2-3"]) for _, d in several["test"].iter_chunks()))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "355", proc.stderr[-2000:]
