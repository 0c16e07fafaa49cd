"""Inputs `extract` and `predict --images` read: unusual checkpoints (fp8, sparse, misnamed, non-string keys), 16-bit
grey PGMs, symbolic links to folders, NFD file names, stray images, library warnings, and the advice after an
unreadable image; each was a traceback, a silent difference or untrue advice."""

from __future__ import annotations

import io
import pickle
import unicodedata
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_VIT, TINY_VIT_KWARGS, make_image_tree

from foal_pipe.datasets.loaders import load_imagefolder, load_images
from foal_pipe.datasets.manifest import apply_manifest, build_manifest
from foal_pipe.datasets.sources import FileSource, images_in, to_rgb_array
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.extract.encoding import find_images

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _png(path: Path, pixels: np.ndarray) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def _rgb(seed: int, h: int = 10, w: int = 12) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# -- checkpoints -------------------------------------------------------------------------------------------------
def _load(path: Path):
    from foal_pipe.encoders import EncoderConfig, build_encoder

    return build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(path), model_kwargs=TINY_VIT_KWARGS)).load("cpu")


def _saved(tmp_path: Path, checkpoint: Path, name: str, change) -> Path:
    import torch
    from safetensors.torch import load_file

    state = load_file(str(checkpoint))
    change(state)
    torch.save(state, tmp_path / name)
    return tmp_path / name


def test_an_fp8_checkpoint_is_checked_as_float32_and_loads_exactly(tmp_path, tiny_vit_checkpoint, one_torch_thread):
    import torch

    def fp8(state):
        state["pos_embed"] = state["pos_embed"].to(torch.float8_e4m3fn)

    path = _saved(tmp_path, tiny_vit_checkpoint, "fp8.pth", fp8)
    model = _load(path).model
    expected = torch.load(path, weights_only=True)["pos_embed"].to(torch.float32)
    assert torch.equal(model.pos_embed.detach(), expected)

    def nan(state):
        fp8(state)
        state["pos_embed"].view(torch.uint8)[0, 0, 0] = 0x7F  # NaN in float8_e4m3fn

    with pytest.raises(FoalPipeError, match="holds non-finite values .* in pos_embed"):
        _load(_saved(tmp_path, tiny_vit_checkpoint, "nan.pth", nan))


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_a_sparse_checkpoint_tensor_is_refused_by_name(tmp_path, tiny_vit_checkpoint, layout, one_torch_thread):
    def sparse(state):
        weight = state["blocks.0.attn.qkv.weight"]
        state["blocks.0.attn.qkv.weight"] = weight.to_sparse() if layout == "sparse_coo" else weight.to_sparse_csr()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "Sparse CSR tensor support is in beta state"
        path = _saved(tmp_path, tiny_vit_checkpoint, "sparse.pth", sparse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FoalPipeError) as info:
            _load(path)
    message = str(info.value)
    assert "\n" not in message and f"holds blocks.0.attn.qkv.weight as a {layout} tensor" in message
    assert "to_dense()" in message
    assert not [w for w in caught if "sparse" in str(w.message)], [str(w.message) for w in caught]


def test_a_safetensors_file_named_pth_is_named_for_what_it_is(tmp_path, tiny_vit_checkpoint):
    path = tmp_path / "weights.pth"
    path.write_bytes(tiny_vit_checkpoint.read_bytes())
    with pytest.raises(FoalPipeError, match=r"weights\.pth is a safetensors file, not what its suffix '\.pth' says; "
                                            r"rename it to weights\.safetensors"):
        _load(path)


def test_a_key_that_is_not_a_string_is_named_so(tmp_path):
    import torch

    path = tmp_path / "intkey.pth"
    torch.save({"pos_embed": torch.zeros(1), 5: torch.zeros(1)}, path)
    with pytest.raises(FoalPipeError, match=r"key 5 \(int\) is not a string \(1 such keys\)"):
        _load(path)


def test_a_pickle_checkpoint_is_refused_without_torch_warnings(tmp_path):
    path = tmp_path / "raw.pth"
    path.write_bytes(pickle.dumps({"pos_embed": [1.0]}, protocol=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FoalPipeError):
            _load(path)
    assert not [w for w in caught if "pickle protocol" in str(w.message)]


# -- pixels --------------------------------------------------------------------------------------------------------
def test_a_16_bit_pgm_is_16_bit_grey(tmp_path):
    from PIL import Image

    values = np.arange(121, dtype=np.uint16).reshape(11, 11) * 541
    path = tmp_path / "sixteen.pgm"
    Image.fromarray(values).save(path)
    img = FileSource([path], [0]).load(0)
    assert (img.mode, img.format) == ("I", "PPM")
    assert np.array_equal(to_rgb_array(img, 11)[0], np.rint(values / 257.0).astype(np.uint8))


def test_16_bit_colour_follows_the_documented_rule():
    """Pillow decodes 16-bit RGB PNGs to the high byte of each sample; docs/extract.md says so."""
    import struct
    import zlib

    from PIL import Image

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    value = 257 * 200 + 128  # high byte 201, divided by 257 and rounded 200
    raw = b"".join(b"\x00" + np.full(12, value, ">u2").tobytes() for _ in range(4))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 16, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    assert to_rgb_array(Image.open(io.BytesIO(png)), 4)[0, 0, 0] == value >> 8
    text = " ".join((DOCS / "extract.md").read_text().split())
    assert "16-bit grey" in text and "high byte" in text


# -- folders -------------------------------------------------------------------------------------------------------
def test_symbolic_links_to_folders_are_followed_alike(tmp_path):
    tree = make_image_tree(tmp_path / "tree", {"a": 1, "b": 1}, test_per_class=1)
    elsewhere = tmp_path / "elsewhere"
    _png(elsewhere / "more.png", _rgb(1))
    _png(elsewhere / "d" / "deep.png", _rgb(2))
    (tree / "train" / "a" / "linked").symlink_to(elsewhere)
    for split in ("train", "test"):
        _png(tmp_path / f"c-{split}" / "c.png", _rgb(3))
        (tree / split / "c").symlink_to(tmp_path / f"c-{split}")
    assert [p.relative_to(tree / "train" / "a").as_posix() for p in images_in(tree / "train" / "a")] == \
        ["img000.png", "linked/d/deep.png", "linked/more.png"]
    folder = load_imagefolder(tree, False)
    assert folder.classes == ["a", "b", "c"] and len(folder.train) == 5 and len(folder.test) == 3
    names = sorted(load_images(tree, False).test.names)
    assert names == sorted(f"{s}/{n}" for s in ("train", "test") for n in folder.split(s).names)
    assert sorted(find_images([tree])) == sorted(tree / name for name in names)
    (tree / "test" / "c").unlink()
    (tree / "test" / "c").symlink_to(elsewhere / "d")  # one folder reached twice in the tree: its images listed twice
    with pytest.raises(FoalPipeError, match=r"one folder .*reached twice"):
        load_images(tree, False)


def test_a_link_loop_is_refused_by_name(tmp_path):
    tree = make_image_tree(tmp_path / "tree", {"a": 1}, test_per_class=1)
    (tree / "train" / "a" / "up").symlink_to(tree / "train")
    with pytest.raises(FoalPipeError, match=r"train/a/up is a symbolic link to .*train, which leads back to a folder "
                                            r"that holds it"):
        load_images(tree, False)


def test_images_beside_the_class_folders_are_refused(tmp_path):
    tree = make_image_tree(tmp_path / "tree", {"a": 2, "b": 2})
    _png(tree / "train" / "stray.png", _rgb(3))
    with pytest.raises(FoalPipeError, match=r"image .*train/stray\.png lies directly in .*train, outside the class "
                                            r"folders"):
        load_imagefolder(tree, False)
    (tree / "train" / "stray.png").unlink()
    _png(tmp_path / "flat" / "a" / "x1.png", _rgb(4))
    _png(tmp_path / "flat" / "a" / "x2.png", _rgb(5))
    _png(tmp_path / "flat" / "top.png", _rgb(6))
    with pytest.raises(FoalPipeError, match=r"flat/top\.png lies directly in"):
        load_imagefolder(tmp_path / "flat", False, test_split=0.5)


def test_nfd_names_match_a_manifest_of_nfc_names_and_sort_alike(tmp_path):
    for form in ("NFC", "NFD"):
        for k, split in enumerate(("train", "test")):
            for cls in ("étoile", "fleur"):
                name = unicodedata.normalize(form, f"{cls}/é{k}.png")
                _png(tmp_path / form / split / name, _rgb(len(cls) + k))
    nfc, nfd = load_imagefolder(tmp_path / "NFC", False), load_imagefolder(tmp_path / "NFD", False)
    assert nfc.classes == ["fleur", "étoile"] and [unicodedata.normalize("NFC", c) for c in nfd.classes] == nfc.classes
    applied = apply_manifest(nfd, build_manifest(nfc), "nfc.zarr")
    assert applied.train.names == nfc.train.names and applied.train.labels.tolist() == nfc.train.labels.tolist()
    assert [Path(p).parent.name for p in applied.test.paths] == [unicodedata.normalize("NFD", c) for c in ("fleur", "étoile")]


# -- reading images ------------------------------------------------------------------------------------------------
def test_pillow_warnings_become_one_note_naming_the_file(tmp_path, monkeypatch, capfd):
    from PIL import Image

    path = _png(tmp_path / "big.png", _rgb(7, 20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # 400 pixels: warned; over 600 would be refused
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FileSource([path], [0]).load(0)
    assert not caught, [str(w.message) for w in caught]
    err = capfd.readouterr().err
    assert err == f"note: {path}: 400 pixels, more than Pillow's decompression-bomb limit of 300; decoded anyway " \
                  "(PIL.Image.MAX_IMAGE_PIXELS sets the limit)\n"
    tiff = io.BytesIO()
    Image.fromarray(_rgb(8, 40, 40)).save(tiff, "TIFF", compression="tiff_deflate")
    cut = tmp_path / "cut.tif"
    cut.write_bytes(tiff.getvalue()[: int(len(tiff.getvalue()) * 0.8)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OSError):  # refused by its row: the EXIF warning adds nothing
            FileSource([cut], [0]).load(0)
    assert not [w for w in caught if "EXIF" in str(w.message)]
    assert capfd.readouterr().err == ""


def test_the_advice_after_an_unreadable_image_holds_for_removing_it(tmp_path):
    tree = make_image_tree(tmp_path / "tree", {"a": 3, "b": 3})
    bad = tree / "train" / "b" / "img001.png"
    bad.write_bytes(b"not an image")
    spec = ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=8, out=str(tmp_path / "s.zarr"),
                       chunk_rows=2, batch_size=2, workers=0, device="cpu")
    with pytest.raises(FoalPipeError) as info:
        run_extract(spec)
    assert "replace it with a readable image and re-run the same command to resume" in str(info.value)
    assert "or remove it and re-run with overwrite=True" in str(info.value)
    bad.unlink()
    with pytest.raises(FoalPipeError, match="different settings"):
        run_extract(spec)  # removing changes the rows: the same command alone is refused, as the advice says
    assert run_extract(spec, overwrite=True).status == "created"


def test_known_limits_are_documented():
    text = " ".join((DOCS / "extract.md").read_text().split())
    for fragment in ("EXIF orientation", "first frame", "JPEG whose data", "float64", "symbolic links"):
        assert fragment in text, fragment
