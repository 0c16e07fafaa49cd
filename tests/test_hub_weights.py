"""timm's pretrained weights through the Hugging Face cache: strict, network-free when cached, and a clear
error within seconds when they cannot be had (huggingface_hub's offline mode, or one bounded request)."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_VIT_KWARGS
from safetensors.torch import load_file, save_file

import foal_pipe.encoders.weights as weights
from foal_pipe.encoders import EncoderConfig, build_encoder
from foal_pipe.errors import FoalPipeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TAG = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
REPO = "timm/" + TAG
NO_DEPTH = tuple(kv for kv in TINY_VIT_KWARGS if kv[0] != "depth")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline mode off, and any real connection attempt a test failure."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return constants


def _no_network(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the network was used")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(weights, "_probe_hub", refuse)


def _cache(cache_dir: str, state: dict[str, torch.Tensor]) -> Path:
    """``state`` as the cached ``model.safetensors`` of REPO at revision main, as huggingface_hub lays it out."""
    root = Path(cache_dir) / ("models--" + REPO.replace("/", "--"))
    commit = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    save_file(state, str(snapshot / "model.safetensors"))
    return snapshot / "model.safetensors"


def test_cached_weights_load_without_any_network(hub, monkeypatch, tiny_vit_checkpoint):
    state = load_file(str(tiny_vit_checkpoint))
    _cache(hub.HF_HUB_CACHE, state)
    _no_network(monkeypatch)
    enc = build_encoder(EncoderConfig(TAG, model_kwargs=TINY_VIT_KWARGS)).load("cpu")
    torch.testing.assert_close(enc.model.blocks[1].attn.qkv.weight, state["blocks.1.attn.qkv.weight"])
    assert enc.name == TAG and enc.provenance()["weights"] == {"source": "hf-hub", "id": REPO}
    assert hub.HF_HUB_OFFLINE is False  # the offline switch was restored


def test_hub_weights_that_do_not_fit_the_architecture_are_refused(hub, monkeypatch, tiny_vit_checkpoint):
    """--model-kwargs that change the depth: timm alone leaves 10 of 12 blocks random; foal-pipe refuses."""
    import timm

    _cache(hub.HF_HUB_CACHE, load_file(str(tiny_vit_checkpoint)))
    _no_network(monkeypatch)
    with weights.hf_offline():
        assert len(timm.create_model(TAG, pretrained=True, num_classes=0, **dict(NO_DEPTH)).blocks) == 12
    with pytest.raises(FoalPipeError) as info:
        build_encoder(EncoderConfig(TAG, model_kwargs=NO_DEPTH)).load("cpu")
    message = str(info.value)
    assert message.startswith(f"the pretrained weights of {TAG} do not fit {TAG} built with embed_dim=32,")
    assert "120 missing keys (blocks.2.norm1.weight, blocks.2.norm1.bias, blocks.2.attn.qkv.weight, ...)" in message
    assert "drop the model_kwargs that change the architecture" in message and "\n" not in message


def _assert_fixes(message: str) -> None:
    assert message.startswith(f"no weights for {TAG}: ") and "\n" not in message
    for fix in ("pass checkpoint='FILE'", "Hugging Face cache", "HF_HUB_OFFLINE=1", "model='pixels'"):
        assert fix in message


def test_offline_and_not_cached_fails_at_once(hub, monkeypatch):
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    _no_network(monkeypatch)
    enc = build_encoder(EncoderConfig(TAG, image_size=32))
    start = time.perf_counter()
    with pytest.raises(FoalPipeError) as info:
        enc.load("cpu")
    assert time.perf_counter() - start < 5
    _assert_fixes(str(info.value))
    assert "not in the Hugging Face cache and HF_HUB_OFFLINE is set" in str(info.value)


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def _point_hub_at(hub, monkeypatch, port: int) -> None:
    template = f"http://127.0.0.1:{port}" + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(hub, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{port}")


def test_a_hub_that_never_answers_fails_within_the_probe_time(hub, monkeypatch, silent_server):
    _point_hub_at(hub, monkeypatch, silent_server)
    monkeypatch.setattr(weights, "HUB_PROBE_SECONDS", 0.5)
    enc = build_encoder(EncoderConfig(TAG, image_size=32))
    start = time.perf_counter()
    with pytest.raises(FoalPipeError) as info:
        enc.load("cpu")
    assert time.perf_counter() - start < 5  # huggingface_hub alone retries for about a minute
    _assert_fixes(str(info.value))
    assert f"127.0.0.1:{silent_server} did not answer (timed out)" in str(info.value)


def test_a_refused_connection_fails_at_once(hub, monkeypatch):
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _point_hub_at(hub, monkeypatch, port)
    start = time.perf_counter()
    with pytest.raises(FoalPipeError) as info:
        build_encoder(EncoderConfig(TAG, image_size=32)).load("cpu")
    assert time.perf_counter() - start < 5
    _assert_fixes(str(info.value))
    assert "did not answer" in str(info.value)


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802 (http.server's naming)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, *args):
        pass


def test_a_hub_that_answers_without_the_file_names_the_failed_download(hub, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _point_hub_at(hub, monkeypatch, server.server_address[1])
        with pytest.raises(FoalPipeError) as info:
            build_encoder(EncoderConfig(TAG, image_size=32)).load("cpu")
    finally:
        server.shutdown()
        server.server_close()
    _assert_fixes(str(info.value))
    assert "loading them failed (" in str(info.value)


def test_cached_weights_with_a_nan_are_refused(hub, monkeypatch, tiny_vit_checkpoint):
    """A damaged cached file (a NaN in one tensor) was loaded and extracted with finite, wrong features; a
    --checkpoint with the same NaN is refused, and so are they now."""
    state = load_file(str(tiny_vit_checkpoint))
    state["blocks.0.attn.qkv.weight"][0, 0] = float("nan")
    _cache(hub.HF_HUB_CACHE, state)
    _no_network(monkeypatch)
    with pytest.raises(FoalPipeError, match=rf"^the pretrained weights of {TAG} hold non-finite values \(NaN or inf\) "
                                            r"in blocks\.0\.attn\.qkv\.weight: the file is damaged; delete it from the "
                                            r"Hugging Face cache"):
        build_encoder(EncoderConfig(TAG, model_kwargs=TINY_VIT_KWARGS)).load("cpu")
