"""The values of a model's weights, checked before any image is encoded: a checkpoint's tensors against the model's
(kind, layout, finiteness once cast) and pretrained weights' finiteness (a damaged file in the Hugging Face cache).
torch is imported inside the functions: importing this module costs nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foal_pipe.errors import FoalPipeError, param


def check_values(state: dict[str, Any], model_state: dict[str, Any], path: Path) -> None:
    """Refuse a tensor whose kind (floating point or not) differs from the model's, a sparse one, or a float not finite
    once cast to the model's dtype as loading casts it (float64's 1e39 is float32's inf; fp8 has no ``isfinite``)."""
    import torch

    for key, value in state.items():
        kind = model_state[key].dtype
        if value.layout != torch.strided:
            raise FoalPipeError(f"{param('checkpoint')} {path} holds {key} as a {str(value.layout).removeprefix('torch.')} "
                                f"tensor, but the model's {key} is dense; save it dense (tensor.to_dense())")
        if value.dtype.is_floating_point != kind.is_floating_point or value.dtype.is_complex != kind.is_complex:
            raise FoalPipeError(f"{param('checkpoint')} {path} holds {key} as {value.dtype}, but the model's {key} is "
                                f"{kind}: loading would cast it; save the model's own tensors (its state_dict) unconverted")
        if not value.dtype.is_floating_point:
            continue
        try:
            cast = value.to(kind)
        except (RuntimeError, NotImplementedError):  # fp4
            raise FoalPipeError(f"{param('checkpoint')} {path} holds {key} as {value.dtype}, which torch cannot cast "
                                f"to the model's {kind}; save the model's own tensors (its state_dict) unconverted") from None
        if not bool(torch.isfinite(cast).all()):
            wide = cast.dtype != value.dtype and value.dtype.itemsize > 1 and bool(torch.isfinite(value).all())
            raise FoalPipeError(f"{param('checkpoint')} {path} holds " + (f"values beyond the range of the model's {kind} "
                                "(inf once cast)" if wide else "non-finite values (NaN or inf)") + f" in {key}; the weights "
                                "are damaged: save them again from a working model")


def check_finite(model: Any, label: str) -> None:
    """Refuse pretrained weights holding NaN or inf (a damaged downloaded file), as a checkpoint's are refused."""
    import torch
    from huggingface_hub import constants

    damaged = next((key for key, value in model.state_dict().items()
                    if value.is_floating_point() and not bool(torch.isfinite(value).all())), None)
    if damaged is not None:
        raise FoalPipeError(f"the pretrained weights of {label} hold non-finite values (NaN or inf) in {damaged}: the "
                            f"file is damaged; delete it from the Hugging Face cache ({constants.HF_HUB_CACHE}; for "
                            f"weights from a URL, torch's hub cache, {torch.hub.get_dir()}) to download it again, or "
                            f"pass a {param('checkpoint')} saved from a working model")
