"""Part ``vit`` of the GPU check (benchmarks/gpu_check.py): extraction at the model's speed (issue 33, item 3).

What PyTorch's fused attention (SDPA), channels-last, CUDA graphs and ``torch.compile`` give the fused encoder
exactly as extraction builds it (``build_encoder`` then ``load``: bf16 on CUDA, fp32 on the CPU), on a batch
already preprocessed on the device, and whether each keeps the features' bits: a store's bytes must not depend on
how the forward ran. TF32 matmuls are off, as in an ``extract`` process. Each variant records images/s (median of
the repeats after a warm-up, the device synchronized around each call), its speed against ``eager``, the largest
absolute difference of its features from eager's and whether they are bit-identical (``torch.equal``), and the
peak GPU memory:

- ``eager``: ``enc.features(x)`` as extraction runs it (timm's attention through SDPA where its ``fused_attn``
  is on: recorded), compared with a second eager call (run to run);
- ``no_sdpa``: every timm attention module's ``fused_attn`` off (softmax(QK^T)V written out), then restored and
  eager checked to give its first bits again: what SDPA gives;
- ``channels_last``: the model and the input in channels-last memory format (only the patch-embedding conv sees it);
- ``eager_with_resize``: the end-to-end ceiling, ``enc(images)`` from 32 px uint8 with the resize on the device;
- ``cuda_graph`` (CUDA only): ``enc.features`` (its block hooks are plain tensor ops) captured on a static input
  after a warm-up on a side stream, replayed with each batch copied into that input; captured on another batch,
  so equal bits also show that the replay reads the new one;
- ``eager_again``: eager once more, against its first bits and speed (the clocks' drift, to read the ratios by);
- ``compile`` (CUDA in a device run; last, with a time cap of its own): ``torch.compile(enc.features,
  fullgraph=True)``, mode default; if the hooks stop dynamo, why is recorded and timm's ``forward_features`` without
  the hooks is compiled instead and compared with ``enc.plain_features``: seconds of the first call (the compile),
  the steady rate, the difference from eager and whether two calls give the same bits.

Each variant runs in its own try; one that fails records ``{"error": one line}``, one that cannot run here
``{"skipped": why}``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SECONDS = 150
"""The part's deadline: ViT-B/16 at batch 256 on an H100, the compile included."""
COMPILE_CAP_S = 90
"""``torch.compile``'s own cap (the first call compiles: tens of seconds for ViT-B/16 with mode default)."""
COMPILE_MIN_S = 40
"""Fewer seconds than this left before the deadline (less :data:`MARGIN_S`): the compile is not started."""
MARGIN_S = 10
FROM_PX = 32
VARIANTS = ("eager", "no_sdpa", "channels_last", "eager_with_resize", "cuda_graph", "eager_again", "compile")
GOALS = {
    "eager": "bit-identical run to run",
    "eager_again": "1.00x eager (else the clocks drifted: read the ratios with it)",
    "eager_with_resize": "near eager (the resize's cost)",
    "no_sdpa": "slower than eager (what SDPA gives)",
}
"""The table's target column; any other variant: faster than eager and bit-identical to it."""


@dataclass(frozen=True)
class VitSizes:
    """The model, its checkpoint and the batch; ``ends_at`` is the ``time.perf_counter()`` of the deadline."""

    model: str
    model_kwargs: tuple[tuple[str, Any], ...]
    checkpoint: Path
    batch: int
    repeats: int
    ends_at: float
    compile: bool


@dataclass(frozen=True)
class Kit:
    """The GPU check's helpers: images/s of a call, the peak GPU memory, an exception in one line."""

    rate: Callable[[Callable[[], Any], int, int], float]
    peak_reset: Callable[[], None]
    peak_gib: Callable[[], float | None]
    one_line: Callable[[BaseException], str]


@contextmanager
def time_cap(seconds: int) -> Iterator[None]:
    """Raise TimeoutError after ``seconds`` (sooner when the enclosing alarm, the part's deadline, comes first),
    then re-arm the enclosing alarm with what is left of it."""
    outer_left = signal.alarm(0)
    outer = signal.getsignal(signal.SIGALRM)
    cap = max(1, min(seconds, outer_left) if outer_left else seconds)
    start = time.monotonic()

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"stopped at its cap of {cap} s")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(cap)
    try:
        yield
    finally:
        signal.alarm(0)
        if outer is not None:  # None: a handler not installed from Python (none is, in the GPU check)
            signal.signal(signal.SIGALRM, outer)
        if outer_left:
            signal.alarm(max(1, outer_left - int(time.monotonic() - start)))


def _compare(features: Any, reference: Any) -> dict[str, Any]:
    import torch

    return {"max_abs_diff": float((features.float() - reference).abs().max()),
            "bit_identical": bool(torch.equal(features, reference))}


@contextmanager
def _unfused(modules: list[Any]) -> Iterator[None]:
    """timm's attention written out (``fused_attn = False``) in ``modules``, restored after."""
    before = [m.fused_attn for m in modules]
    for m in modules:
        m.fused_attn = False
    try:
        yield
    finally:
        for m, value in zip(modules, before):
            m.fused_attn = value


@contextmanager
def _channels_last(model: Any) -> Iterator[None]:
    import torch

    with torch.inference_mode(False):  # the parameters stay ordinary tensors
        model.to(memory_format=torch.channels_last)
    try:
        yield
    finally:
        with torch.inference_mode(False):
            model.to(memory_format=torch.contiguous_format)


def _graphed(fn: Callable[[Any], Any], capture_on: Any) -> Callable[[Any], Any]:
    """``fn`` captured in a CUDA graph on a static copy of ``capture_on`` (warmed up on a side stream first, as
    PyTorch's documentation says); the returned function copies its batch in and replays."""
    import torch

    static_in = capture_on.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_in)

    def replay(batch: Any) -> Any:
        static_in.copy_(batch)
        graph.replay()
        return static_out

    return replay


def _timed_compile(compiled: Callable[[Any], Any], x: Any, reference: Any, eager_rate: float, sz: VitSizes,
                   kit: Kit, run: dict[str, Any]) -> None:
    """The first call's seconds (the compile), the steady rate, the difference from ``reference`` and whether two
    calls give the same bits, into ``run``."""
    import torch

    start = time.perf_counter()
    first = compiled(x).clone()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    run["compile_s"] = time.perf_counter() - start
    run["images_per_s"] = kit.rate(lambda: compiled(x), sz.batch, sz.repeats)
    run["x_eager"] = run["images_per_s"] / eager_rate
    run.update(_compare(first, reference), two_calls_bit_identical=bool(torch.equal(compiled(x), first)))


def _compile(enc: Any, x: Any, reference: Any, eager_rate: float, sz: VitSizes, kit: Kit) -> dict[str, Any]:
    """``torch.compile`` of the fused forward, or of timm's ``forward_features`` without the hooks where dynamo
    cannot take the hooks whole (``fullgraph=True`` refuses a graph break)."""
    import torch

    from foal_pipe.encoders.runtime import autocast

    left = sz.ends_at - time.perf_counter() - MARGIN_S
    if left < COMPILE_MIN_S:
        return {"skipped": f"not run: no time ({left:.0f} s left before the part's deadline, {COMPILE_MIN_S} s needed)"}
    run: dict[str, Any] = {"mode": "default", "cap_s": int(min(COMPILE_CAP_S, left))}
    try:
        with time_cap(run["cap_s"]):
            torch._dynamo.reset()
            try:
                run["compiled"] = "enc.features (the fused forward, block hooks included), fullgraph"
                _timed_compile(torch.compile(enc.features, mode="default", fullgraph=True), x, reference,
                               eager_rate, sz, kit, run)
                return run
            except (TimeoutError, getattr(torch._dynamo.exc, "BackendCompilerFailed", TimeoutError)):
                raise  # out of time, or inductor failed: without the hooks it would fail alike
            except Exception as exc:  # dynamo refused the hooked forward (a graph break under fullgraph)
                run["hooks_not_compiled"] = kit.one_line(exc)
            torch._dynamo.reset()
            plain_reference = enc.plain_features(x).clone()  # before `detached` below: it re-attaches the hooks
            run["compiled"] = "model.forward_features without the hooks (CLS after the norm), vs enc.plain_features"
            run["plain_eager_images_per_s"] = kit.rate(lambda: enc.plain_features(x), sz.batch, sz.repeats)

            def plain(batch: Any) -> Any:
                with autocast(enc.device, enc.precision):
                    return enc.model.forward_features(batch)[:, 0].float()

            with enc.fusion.detached():
                _timed_compile(torch.compile(plain, mode="default"), x, plain_reference,
                               run["plain_eager_images_per_s"], sz, kit, run)
    except Exception as exc:
        run["error"] = kit.one_line(exc)
    finally:
        torch._dynamo.reset()
    return run


def part_vit(sz: VitSizes, out: dict[str, Any], kit: Kit) -> None:
    """Every variant (see the module's docstring) on one encoder and one batch, into ``out["variants"]``."""
    import timm
    import torch

    from foal_pipe.encoders import EncoderConfig, build_encoder

    cuda = torch.cuda.is_available()
    device, precision = ("cuda", "bf16") if cuda else ("cpu", "fp32")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # as an extract process has it (part extract turns it on)
    try:
        enc: Any = build_encoder(EncoderConfig(sz.model, checkpoint=str(sz.checkpoint), model_kwargs=sz.model_kwargs))
        enc.load(device, precision)
        attention = [m for m in enc.model.modules() if isinstance(getattr(m, "fused_attn", None), bool)]
        use_fused = getattr(timm.layers, "use_fused_attn", None)
        backends = ("flash", "mem_efficient", "math", "cudnn")
        out.update(model=sz.model, model_kwargs=dict(sz.model_kwargs), weights="random (seed 0)", device=device,
                   precision=precision, batch=sz.batch, repeats=sz.repeats, image_size=enc.image_size,
                   from_px=FROM_PX, timm_use_fused_attn=use_fused() if use_fused else "unknown",
                   attention_modules=len(attention), fused_attn=sorted({m.fused_attn for m in attention}),
                   sdpa_backends_enabled=[b for b in backends
                                          if getattr(torch.backends.cuda, f"{b}_sdp_enabled", lambda: False)()],
                   variants={})
        _variants(enc, attention, sz, kit, out["variants"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _variants(enc: Any, attention: list[Any], sz: VitSizes, kit: Kit, variants: dict[str, Any]) -> None:
    import torch

    rng = np.random.default_rng(1)
    side = enc.image_size
    full = torch.from_numpy(rng.integers(0, 256, (2, sz.batch, 3, side, side), dtype=np.uint8)).to(enc.device)
    native = torch.from_numpy(rng.integers(0, 256, (sz.batch, 3, FROM_PX, FROM_PX), dtype=np.uint8)).to(enc.device)
    with torch.inference_mode():
        x, other = enc.preprocess(full[0]), enc.preprocess(full[1])
        reference = enc.features(x).clone()

    def variant(name: str, measure: Callable[[], dict[str, Any]]) -> None:
        kit.peak_reset()
        try:
            with torch.inference_mode():
                run = measure()
            variants[name] = run if "skipped" in run else {**run, "peak_gpu_gib": kit.peak_gib()}
        except Exception as exc:
            variants[name] = {"error": kit.one_line(exc)}

    def rate(fn: Callable[[], Any]) -> float:
        return kit.rate(fn, sz.batch, sz.repeats)

    def eager() -> dict[str, Any]:
        ips = rate(lambda: enc.features(x))
        return {"images_per_s": ips, "x_eager": 1.0, **_compare(enc.features(x), reference),
                "compared_with": "a second eager call"}

    variant("eager", eager)
    if "error" in variants["eager"]:
        variants.update({name: {"skipped": "eager failed: nothing to compare with"} for name in VARIANTS[1:]})
        return
    eager_rate = variants["eager"]["images_per_s"]

    def no_sdpa() -> dict[str, Any]:
        if not attention:
            return {"skipped": "no timm attention module with a fused_attn flag in this model"}
        with _unfused(attention):
            run = {"images_per_s": rate(lambda: enc.features(x)), **_compare(enc.features(x), reference)}
        return {**run, "x_eager": run["images_per_s"] / eager_rate,
                "eager_after_restore_bit_identical": bool(torch.equal(enc.features(x), reference))}

    def channels_last() -> dict[str, Any]:
        x_last = x.contiguous(memory_format=torch.channels_last)
        with _channels_last(enc.model):
            run = {"images_per_s": rate(lambda: enc.features(x_last)), **_compare(enc.features(x_last), reference),
                   "conv_weight_channels_last": enc.model.patch_embed.proj.weight.is_contiguous(
                       memory_format=torch.channels_last)}
        return {**run, "x_eager": run["images_per_s"] / eager_rate,
                "eager_after_restore_bit_identical": bool(torch.equal(enc.features(x), reference))}

    def cuda_graph() -> dict[str, Any]:
        if enc.device != "cuda":
            return {"skipped": "needs CUDA"}
        replay = _graphed(enc.features, other)
        ips = rate(lambda: replay(x))
        return {"images_per_s": ips, "x_eager": ips / eager_rate, **_compare(replay(x).clone(), reference),
                "captured_on": "another batch"}

    def eager_again() -> dict[str, Any]:
        ips = rate(lambda: enc.features(x))
        return {"images_per_s": ips, "x_eager": ips / eager_rate, **_compare(enc.features(x), reference),
                "compared_with": "eager's first call, after every other variant but compile"}

    def with_resize() -> dict[str, Any]:
        ips = rate(lambda: enc(native))
        return {"images_per_s": ips, "x_eager": ips / eager_rate, "input": f"uint8 {FROM_PX} px, resized on the device"}

    variant("no_sdpa", no_sdpa)
    variant("channels_last", channels_last)
    variant("eager_with_resize", with_resize)
    variant("cuda_graph", cuda_graph)  # after the eager runs: a capture that fails can leave the device unusable
    variant("eager_again", eager_again)
    if not sz.compile:
        variants["compile"] = {"skipped": "compile runs on CUDA in a device run only (minutes on a CPU)"}
    else:
        variant("compile", lambda: _compile(enc, x, reference, eager_rate, sz, kit))


def rows(result: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(variant, result, target)`` for gpu_check's table: images/s, the speed against eager, the bits."""
    if "attention_modules" in result:
        yield ("attention", f"timm use_fused_attn {result['timm_use_fused_attn']}, {result['attention_modules']} "
               f"modules with fused_attn {result['fused_attn']}; SDPA backends: "
               f"{', '.join(result['sdpa_backends_enabled']) or 'none'}", "")
    for name, run in result.get("variants", {}).items():
        target = GOALS.get(name, "faster than eager, bit-identical to it")
        if "skipped" in run:
            yield name, "skipped: " + run["skipped"], target
            continue
        against = "plain eager (timm's forward_features)" if "hooks_not_compiled" in run else "eager"
        cells = [f"{run['images_per_s']:,.0f} images/s" if "images_per_s" in run else "",
                 f"{run['x_eager']:.2f}x {against}" if "x_eager" in run else ""]
        if "bit_identical" in run:
            cells.append("bit-identical" if run["bit_identical"] else f"max diff {run['max_abs_diff']:.3g}")
        if "compile_s" in run:
            cells.append(f"compile {run['compile_s']:.1f} s")
        if "two_calls_bit_identical" in run:
            cells.append(f"two calls {'bit-identical' if run['two_calls_bit_identical'] else 'differ'}")
        if "hooks_not_compiled" in run:
            cells.append("the hooked forward did not compile: " + run["hooks_not_compiled"])
        if run.get("peak_gpu_gib") is not None:
            cells.append(f"peak {run['peak_gpu_gib']:.2f} GiB")
        if "error" in run:
            cells.append("error: " + run["error"])
        yield name, ", ".join(c for c in cells if c), target
