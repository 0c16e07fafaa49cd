"""Resizing in the workers (PIL) vs on the encoder's device (`--resize-on device`): difference and speed.

Difference, for each case the largest absolute difference of the resized pixels (grey levels) and of the
features (and relative to the largest feature), device path against the PIL path:

* `--model pixels` on digits, 8 -> 32 px (all 1,797 images);
* the tests' tiny ViT (2 blocks, 32-dim) on digits, 8 -> 32 px (all 1,797 images);
* random 32 px uint8 images -> 224 px (the paper's CIFAR case), pixels (bilinear) and a tiny ViT at 224 px
  (bicubic), and -> 64 px through a tiny ViT;
* beside each, what torch's own `interpolate(mode=..., antialias=True)` (one float pass, then rounded and
  clipped) would have given: why the device path reimplements PIL's fixed-point passes.

Speed (images/s, 32 -> 224 px bicubic, uint8 in, float32 out): PIL via `to_rgb_array` one image at a time in
one process (what each DataLoader worker does), and `resize_on_device` on batches of 256 on the CPU (and on
CUDA when torch sees a GPU), medians of --repeats.

Usage: python benchmarks/resize_bench.py [--repeats 5] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_VIT = "vit_tiny_patch16_224"
TINY_KWARGS = (("depth", 2), ("embed_dim", 32), ("num_heads", 2), ("patch_size", 8))


def _pil_batch(images: np.ndarray, size: int, interpolation: str) -> np.ndarray:
    """uint8 ``(N, 3, h, w)`` -> uint8 ``(N, 3, size, size)`` as the workers resize (PIL, one image at a time)."""
    from foal_pipe.datasets import to_rgb_array

    return np.stack([to_rgb_array(np.ascontiguousarray(im.transpose(1, 2, 0)), size, interpolation) for im in images])


def _torch_plain(images: np.ndarray, size: int, interpolation: str) -> np.ndarray:
    import torch

    x = torch.from_numpy(images).float()
    y = torch.nn.functional.interpolate(x, size=(size, size), mode=interpolation, antialias=True)
    return y.round().clamp(0, 255).numpy()


def _device(images: np.ndarray, size: int, interpolation: str, device: str = "cpu") -> np.ndarray:
    import torch

    from foal_pipe.encoders import resize_on_device

    return resize_on_device(torch.from_numpy(images).to(device), size, interpolation).cpu().numpy()


def _encoder(name: str, size: int) -> Any:
    from foal_pipe.encoders import EncoderConfig, build_encoder

    if name == "pixels":
        return build_encoder(EncoderConfig("pixels", image_size=size)).load("cpu")
    kwargs = tuple(sorted((*TINY_KWARGS, ("img_size", size))))
    return build_encoder(EncoderConfig(TINY_VIT, pretrained=False, model_kwargs=kwargs)).load("cpu")


def difference(label: str, images: np.ndarray, encoder_name: str, size: int) -> dict[str, Any]:
    """Pixels and features of the device path and of plain torch, each against the PIL path."""
    enc = _encoder(encoder_name, size)
    pil = _pil_batch(images, size, enc.interpolation)
    want = enc.encode(pil)
    scale = float(np.abs(want).max())
    out: dict[str, Any] = {"case": label, "encoder": encoder_name, "interpolation": enc.interpolation,
                           "images": len(images), "from": int(images.shape[-1]), "to": size}
    for path, resized in (("device", _device(images, size, enc.interpolation)),
                          ("torch_interpolate", _torch_plain(images, size, enc.interpolation))):
        feats = enc.encode(images) if path == "device" else enc.encode(resized.astype(np.uint8))
        pixel_diff = np.abs(resized - pil.astype(np.float32))
        feat_diff = float(np.abs(feats - want).max())
        out[path] = {"max_abs_pixel_levels": float(pixel_diff.max()),
                     "pixels_differing": float((pixel_diff > 0).mean()),
                     "max_abs_feature": feat_diff, "max_rel_feature": feat_diff / scale}
    return out


def _median_rate(fn: Any, n: int, repeats: int, sync: Any = lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def speed(repeats: int) -> dict[str, Any]:
    import torch

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (256, 3, 32, 32), dtype=np.uint8)
    out = {"pil_one_process_images_per_s": _median_rate(lambda: _pil_batch(images, 224, "bicubic"), 256, repeats),
           "device_cpu_images_per_s": _median_rate(lambda: _device(images, 224, "bicubic"), 256, repeats),
           "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        x = torch.from_numpy(images).cuda()
        from foal_pipe.encoders import resize_on_device

        out["device_cuda_images_per_s"] = _median_rate(lambda: resize_on_device(x, 224, "bicubic"), 256,
                                                       max(repeats, 20), torch.cuda.synchronize)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    import torch

    from foal_pipe.datasets import open_dataset, to_rgb_array

    torch.set_num_threads(args.threads)
    digits = open_dataset("digits")
    native = np.stack([to_rgb_array(digits.split(s).load(i), 8) for s in ("train", "test")
                       for i in range(len(digits.split(s)))])
    rng = np.random.default_rng(0)
    random32 = rng.integers(0, 256, (256, 3, 32, 32), dtype=np.uint8)
    cases = [difference("digits 8 -> 32, pixels", native, "pixels", 32),
             difference("digits 8 -> 32, tiny ViT", native, "tiny", 32),
             difference("random 32 -> 224, pixels", random32, "pixels", 224),
             difference("random 32 -> 64, tiny ViT", random32, "tiny", 64),
             difference("random 32 -> 224, tiny ViT", random32[:64], "tiny", 224)]
    for c in cases:
        print(f"{c['case']:28s} device: {c['device']['max_abs_pixel_levels']:g} levels, features "
              f"{c['device']['max_abs_feature']:.3g} (rel {c['device']['max_rel_feature']:.3g}) | torch interpolate: "
              f"{c['torch_interpolate']['max_abs_pixel_levels']:g} levels on "
              f"{100 * c['torch_interpolate']['pixels_differing']:.1f}% of pixels, features "
              f"{c['torch_interpolate']['max_abs_feature']:.3g} (rel {c['torch_interpolate']['max_rel_feature']:.3g})")
    rates = speed(args.repeats)
    print("32 -> 224 bicubic, images/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items()))
    machine = {"python": platform.python_version(), "torch": torch.__version__, "nproc": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "loadavg": os.getloadavg()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "difference": cases, "speed": rates}, f, indent=2)


if __name__ == "__main__":
    main()
