"""Block fusions: which blocks' tokens are averaged (then the final norm), or set side by side (each block's
token normed, then concatenated) -- in NumPy, for stores that keep every block's token (``extract --keep-blocks``,
docs/feature-store.md).

The spec language (:func:`parse_fusion`) is shared with ``extract --fusion``, and both sides compute the
same way: float32 sums of the chosen blocks' tokens in block order, one float32 division, then the final
norm. So features fused here from float32 blocks equal those the encoder fuses in its forward pass (to the
norm's rounding, ~1e-7 relative), and a fusion ablation needs no new extraction. ``concat:A-B`` (LayUP's and
DINOv2's linear probes: the last blocks' tokens side by side, each through the final norm, as DINOv2's
``get_intermediate_layers(norm=True)``) is computed here only, at read time: its rows have (B-A+1) x d features.

:class:`FusedSplits` computes several fusions of a split from one read of each blocks chunk (``sweep
--fusions``); :class:`FusedSplit` is one fusion, with the interface of :class:`foal_pipe.store.Split`
(``iter_chunks``, ``take``, ``n_rows``, ``dim``, ``labels``, ``chunk_rows``, ``name``). NumPy only: the
learner stays torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from foal_pipe.errors import FoalPipeError, clipped, param

FUSION_FORMS = ("mean-cls (every block), last, mean:A-B (blocks A to B, 1-based, inclusive), block:K or concat:A-B "
                "(blocks A to B side by side)")
"""The valid spec forms, as error messages name them."""


# ---------------------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fusion:
    """A parsed fusion spec: blocks ``first`` to ``last`` (1-based, inclusive; 0 means the last block)
    are averaged, or with ``concat`` set side by side. ``text`` is the canonical spec (``mean:07-12`` becomes
    ``mean:7-12``)."""

    text: str
    first: int
    last: int
    concat: bool = False

    def blocks(self, n_blocks: int) -> range:
        """The 0-based indices of the averaged blocks of a model (or store) with ``n_blocks`` blocks."""
        first, last = self.first or n_blocks, self.last or n_blocks
        if last > n_blocks:
            raise FoalPipeError(f"fusion {self.text!r} needs block {last} but there are {n_blocks} blocks; choose "
                                f"blocks within 1-{n_blocks} ({FUSION_FORMS})")
        return range(first - 1, last)

    def width(self, n_blocks: int, dim: int) -> int:
        """Features a row of this fusion has, from blocks of ``dim`` features: ``dim``, or one ``dim`` a block
        for ``concat``."""
        return dim * len(self.blocks(n_blocks)) if self.concat else dim

    def __str__(self) -> str:
        return self.text

    @property
    def norm_note(self) -> str:
        """Where the final norm went, as the ``encoder``'s ``final_norm`` records it."""
        if self.concat:
            return "applied to each block's token"
        return "applied once to the block's token" if self.first == self.last else "applied once to the block average"


def _bare(name: str, first: int, last: int) -> Callable[[str | None, str], Fusion]:
    def parse(argument: str | None, option: str) -> Fusion:
        if argument is not None:
            raise FoalPipeError(f"{option} {name}:{argument}: {name} takes no ':{argument}'; write {name}, or one of "
                                f"{FUSION_FORMS}")
        return Fusion(name, first, last)

    return parse


def _number(text: str, spec: str, option: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):  # ASCII digits: `block:٣` reads as 3 to Python's int
        raise FoalPipeError(f"{option} {clipped(spec)}: {clipped(text)!r} is not a block number; write {FUSION_FORMS}")
    if len(text.lstrip("0")) > 6:  # past any model's blocks, and past int()'s 4,300 digits
        raise FoalPipeError(f"{option} {clipped(spec)}: block {clipped(text)} is past any model's blocks; write "
                            f"{FUSION_FORMS}")
    if int(text) < 1:
        raise FoalPipeError(f"{option} {spec}: blocks are numbered from 1 (block:1 is the first); write "
                            f"{FUSION_FORMS}")
    return int(text)


def _range(name: str) -> Callable[[str | None, str], Fusion]:
    """The parser of ``NAME:A-B``: ``mean`` averages blocks A..B, ``concat`` sets them side by side."""

    def parse(argument: str | None, option: str) -> Fusion:
        first, sep, last = (argument or "").partition("-")
        if argument is None or not sep:
            raise FoalPipeError(f"{option} {f'{name}:' + argument if argument else name} needs a block range; write "
                                f"{name}:A-B (e.g. {name}:7-12), or one of {FUSION_FORMS}")
        spec = f"{name}:{argument}"
        a, b = _number(first.strip(), spec, option), _number(last.strip(), spec, option)
        if a > b:
            raise FoalPipeError(f"{option} {spec} starts at block {a}, after its last block {b}; write {name}:A-B "
                                f"with A <= B (e.g. {name}:{b}-{a}), or one of {FUSION_FORMS}")
        return Fusion(f"{name}:{a}-{b}", a, b, concat=name == "concat")

    return parse


def _block(argument: str | None, option: str) -> Fusion:
    if argument is None:
        raise FoalPipeError(f"{option} block needs a block number; write block:K (e.g. block:12), or one of "
                            f"{FUSION_FORMS}")
    k = _number(argument.strip(), f"block:{argument}", option)
    return Fusion(f"block:{k}", k, k)


FORMS: dict[str, Callable[[str | None, str], Fusion]] = {
    "mean-cls": _bare("mean-cls", 1, 0),  # the paper: every block
    "last": _bare("last", 0, 0),  # the last block: timm's forward_features token
    "mean": _range("mean"),  # mean:A-B
    "block": _block,  # block:K
    "concat": _range("concat"),  # concat:A-B: LayUP, DINOv2's linear probes
}
"""Spec forms by their name (the text before ``:``): ``(argument after ':' or None, option) -> Fusion``."""


def parse_fusion(text: str | Fusion, option: str = "fusion") -> Fusion:
    """``"mean:7-12"`` -> ``Fusion("mean:7-12", 7, 12)``; a bad spec is one line naming the valid forms (and
    ``option``, e.g. ``--fusion``). Whether the blocks exist is checked against the model or store
    (:meth:`Fusion.blocks`)."""
    if isinstance(text, Fusion):
        return text
    name, sep, argument = str(text).strip().lower().partition(":")
    if name.strip() not in FORMS:
        raise FoalPipeError(f"unknown {option} {str(text)!r}; write {FUSION_FORMS}")
    return FORMS[name.strip()](argument if sep else None, option)


def parse_fusions(text: str | Sequence[str | Fusion], option: str = "fusions") -> tuple[Fusion, ...]:
    """``"mean-cls,last,mean:7-12"`` (or a sequence of specs) -> the parsed fusions; repeats are refused."""
    items = text.split(",") if isinstance(text, str) else list(text)
    fusions = tuple(parse_fusion(t, option) for t in items if not isinstance(t, str) or t.strip())
    if not fusions:
        raise FoalPipeError(f"{option} names no fusion; write a comma-separated list of {FUSION_FORMS}")
    seen: set[str] = set()
    for fusion in fusions:
        if fusion.text in seen:
            raise FoalPipeError(f"{option} lists {fusion.text} twice; list each fusion once")
        seen.add(fusion.text)
    return fusions


# ---------------------------------------------------------------------------------------------------------
# The final norm, recomputed from its stored parameters
# ---------------------------------------------------------------------------------------------------------
def _layer_norm(x: np.ndarray, norm: FinalNorm) -> np.ndarray:
    centred = x - x.mean(axis=1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=1, keepdims=True) + norm.eps) * norm.weight + norm.bias


def _rms_norm(x: np.ndarray, norm: FinalNorm) -> np.ndarray:
    return x / np.sqrt((x**2).mean(axis=1, keepdims=True) + norm.eps) * norm.weight


def _simple_norm(x: np.ndarray, norm: FinalNorm) -> np.ndarray:
    return x / np.sqrt(x.var(axis=1, ddof=1, keepdims=True) + norm.eps) * norm.weight  # timm: torch.var, unbiased


NORMS: dict[str, tuple[Callable[[np.ndarray, FinalNorm], np.ndarray], tuple[str, ...]]] = {
    "layernorm": (_layer_norm, ("weight", "bias")),  # torch.nn.LayerNorm, timm LayerNorm(Fp32): ViT, DeiT, CLIP...
    "rmsnorm": (_rms_norm, ("weight",)),  # timm RmsNorm(Fp32), torch.nn.RMSNorm
    "simplenorm": (_simple_norm, ("weight",)),  # timm SimpleNorm(Fp32): x / sqrt(var + eps), no centring
    "identity": (lambda x, norm: x, ()),  # no final norm
}
"""Norm kinds by name: ``(function on float64 rows, the parameter arrays it needs)``."""


@dataclass(frozen=True, eq=False)
class FinalNorm:
    """The encoder's final norm: ``kind`` (:data:`NORMS`), ``eps``, and its ``weight``/``bias`` (``(d,)``
    float32, those the kind needs). Computed in float64 and returned as float32."""

    kind: str
    eps: float = 0.0
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.kind not in NORMS:
            raise FoalPipeError(f"unknown final norm kind {self.kind!r}; foal-pipe recomputes {', '.join(NORMS)}: "
                                "upgrade foal-pipe or re-extract the store")
        for name in NORMS[self.kind][1]:
            if getattr(self, name) is None:
                raise FoalPipeError(f"a {self.kind} final norm needs its {name}; re-extract the store")

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """The parameter arrays the kind uses, by name (``norm/<name>`` in the store)."""
        return {name: getattr(self, name) for name in NORMS[self.kind][1]}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return NORMS[self.kind][0](x.astype(np.float64), self).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# Fusing
# ---------------------------------------------------------------------------------------------------------
def average_blocks(blocks: np.ndarray, chosen: range) -> np.ndarray:
    """The float32 mean of ``blocks[:, chosen]`` (``blocks``: ``(n, L, d)``), summed in block order and
    divided once, exactly as the encoder's forward hooks do."""
    total = blocks[:, chosen[0]].astype(np.float32)  # a copy: never modifies the blocks read
    for k in chosen[1:]:
        total += blocks[:, k]
    total /= np.float32(len(chosen))
    return total


def concat_blocks(blocks: np.ndarray, chosen: range, norm: FinalNorm | None) -> np.ndarray:
    """``(n, k*d)`` float32: the tokens of ``blocks[:, chosen]`` (``k`` blocks), each through ``norm`` (None: as
    stored), side by side in block order -- row i is ``[norm(t_i,A), ..., norm(t_i,B)]``."""
    tokens = blocks[:, chosen.start:chosen.stop].astype(np.float32)  # a copy: never modifies the blocks read
    n, k, d = tokens.shape
    flat = tokens.reshape(n * k, d)  # the norm works row by row, so each block's token is normed on its own
    return (flat if norm is None else norm(flat)).reshape(n, k * d)


def fuse(blocks: np.ndarray, fusion: str | Fusion, norm: FinalNorm | None) -> np.ndarray:
    """Fused float32 features ``(n, d)`` (``concat``: ``(n, k*d)``) from per-block tokens ``(n, L, d)``;
    ``norm=None`` skips the norm."""
    fusion = parse_fusion(fusion)
    chosen = fusion.blocks(blocks.shape[1])
    if fusion.concat:
        return concat_blocks(blocks, chosen, norm)
    mean = average_blocks(blocks, chosen)
    return mean if norm is None else norm(mean)


@dataclass(frozen=True)
class FusedArray:
    """What a fused split looks like as an array (``shape``, ``chunks``, ``dtype``) for code that sizes reads."""

    shape: tuple[int, int]
    chunks: tuple[int, int]
    dtype: np.dtype = np.dtype(np.float32)
    ndim: int = 2


class FusedSplits:
    """Several fusions of one split, each chunk of its blocks read once (``sweep --fusions``).

    ``split`` is a :class:`foal_pipe.store.Split` with blocks; ``norm`` the store's final norm (``None``: none
    applied). ``read``/``iter_chunks``/``take`` return ``{spec text: float32 (n, dim)}``. Every fusion has the same
    width ``dim`` (one walk projects them all with one matrix): ``concat`` fusions of other widths are refused.
    """

    def __init__(self, split: Any, fusions: Sequence[str | Fusion], norm: FinalNorm | None):
        if split.blocks is None:
            raise FoalPipeError(f"{split.name} has no blocks array; extract the store with {param('keep_blocks', True)}")
        self.source, self.norm = split, norm
        self.fusions = parse_fusions(list(fusions))
        n_blocks = int(split.blocks.shape[1])
        self.chosen = {f.text: f.blocks(n_blocks) for f in self.fusions}  # refuses blocks the store lacks
        features: dict[tuple[Any, ...], str] = {}  # what each fusion computes here: its blocks, and set side by side
        for f in self.fusions:
            blocks = self.chosen[f.text]
            key = (blocks.start, blocks.stop, f.concat and len(blocks) > 1)
            if key in features:
                raise FoalPipeError(f"{param('fusions')} lists {features[key]} and {f.text}, the same features of this "
                                    f"store's {n_blocks} blocks; list each fusion once")
            features[key] = f.text
        self.concat = {f.text for f in self.fusions if f.concat}
        widths = {f.text: f.width(n_blocks, int(split.blocks.shape[2])) for f in self.fusions}
        if len(set(widths.values())) > 1:
            a, wa = next(iter(widths.items()))
            b, wb = next((t, w) for t, w in widths.items() if w != wa)
            raise FoalPipeError(f"{param('fusions')} {a} gives rows of {wa:,} features and {b} of {wb:,}; one walk "
                                f"projects every fusion with one matrix, so list fusions of one width (concat:A-B of "
                                f"k blocks: k x {int(split.blocks.shape[2])}), and run {b} with {param('fusion', b)}")
        self._width = widths[self.fusions[0].text]
        self.name, self.labels = split.name, split.labels
        self.root, self.fingerprint = split.root, split.fingerprint

    @property
    def specs(self) -> tuple[str, ...]:
        return tuple(self.chosen)

    @property
    def n_rows(self) -> int:
        return self.source.n_rows

    @property
    def dim(self) -> int:
        return self._width

    @property
    def chunk_rows(self) -> int:
        return int(self.source.blocks.chunks[0])

    @property
    def chunk_bytes(self) -> int:
        """Memory a reading thread takes for one chunk (:meth:`read_raw`, then :meth:`rows_of` fusion by fusion),
        besides the fused float32 rows it returns: reading, the blocks, zarr's decoded copy and their compressed
        bytes (3x the blocks); fusing, the blocks and the rows a fusion takes from them (2x), and one fusion at a
        time its float32 mean (or concatenation), the four float64 arrays of its norm and their per-row statistics
        (a fifth at most: 44 bytes a value)."""
        n, (L, d) = self.chunk_rows, self.source.blocks.shape[1:]
        blocks = n * L * d * self.source.blocks.dtype.itemsize
        return max(3 * blocks, 2 * blocks + n * self.dim * (4 + 8 * 5))

    def _fused(self, blocks: np.ndarray, rows: np.ndarray | int) -> dict[str, np.ndarray]:
        if sum(map(len, self.chosen.values())) > blocks.shape[1]:  # blocks used twice: widen each once (exact)
            blocks = blocks.astype(np.float32, copy=False)
        return {text: self._fuse(text, blocks, rows) for text in self.chosen}

    def _fuse(self, text: str, blocks: np.ndarray, rows: np.ndarray | int) -> np.ndarray:
        with np.errstate(all="ignore"):  # a non-finite row is refused below, by name, not warned about
            if text in self.concat:
                fused = concat_blocks(blocks, self.chosen[text], self.norm)
            else:
                mean = average_blocks(blocks, self.chosen[text])
                fused = mean if self.norm is None else self.norm(mean)
        finite = np.isfinite(fused).all(axis=1)
        if not finite.all():  # the blocks read are finite (checked): the sum or the norm is not
            bad = int(np.flatnonzero(~finite)[0])
            row = int(rows + bad) if isinstance(rows, int) else int(rows[bad])
            why, fix = "their float32 sum overflows", "choose another fusion"
            if self.norm is not None:
                why += f", or the final norm ({self.norm.kind}, eps {self.norm.eps:g}) divides by zero (a constant token)"
                fix += f", or fuse without the norm ({param('fusion_norm', False)})"
            raise FoalPipeError(f"fusion {text} of {self.name} row {row} is NaN or inf although its blocks are finite "
                                f"({why}); {fix}")
        return fused

    def read_raw(self, lo: int, hi: int) -> np.ndarray:
        """The stored blocks of rows ``[lo, hi)``, for :meth:`rows_of` (a pass that needs a few of a chunk's rows
        fuses only those)."""
        return self.source.read_blocks(lo, hi)

    def rows_of(self, raw: np.ndarray, lo: int, sel: np.ndarray, fusion: str) -> np.ndarray:
        """Fusion ``fusion`` of rows ``lo + sel``, from the chunk ``raw`` that :meth:`read_raw` read at ``lo``.
        Each row is fused on its own (a mean or concatenation over blocks, a norm over features), so this equals those rows of
        :meth:`read`."""
        return self._fuse(fusion, raw[sel], lo + sel)

    def read(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Rows ``[lo, hi)`` of every fusion."""
        return self._fused(self.source.read_blocks(lo, hi), lo)

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Yield ``(first_row, {spec: features})`` for each stored chunk in ``[start, stop)``, in row order."""
        from foal_pipe.store.chunks import chunk_spans

        for lo, hi in chunk_spans(self.n_rows, self.chunk_rows, start, stop):
            yield lo, self.read(lo, hi)

    def take(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Rows in the given order, each touched blocks chunk read once."""
        return self._fused(self.source.take_blocks(rows), rows)

    def split(self, fusion: str | Fusion) -> FusedSplit:
        """One of the fusions as a split."""
        return FusedSplit(self.source, parse_fusion(fusion), self.norm)


class FusedSplit:
    """One fusion of a split's blocks, read like a :class:`foal_pipe.store.Split`: ``iter_chunks``, ``take``,
    ``read``, ``n_rows``, ``dim``, ``labels``, ``chunk_rows``, ``name``. ``features`` describes the fused
    array (shape, chunks, float32) but is not on disk: read through the methods."""

    def __init__(self, split: Any, fusion: str | Fusion, norm: FinalNorm | None):
        self.fusion = parse_fusion(fusion)
        self._many = FusedSplits(split, [self.fusion], norm)
        self.name, self.labels = split.name, split.labels
        self.root, self.fingerprint = split.root, split.fingerprint
        self.features = FusedArray((self.n_rows, self.dim), (self.chunk_rows, self.dim))

    @property
    def n_rows(self) -> int:
        return self._many.n_rows

    @property
    def dim(self) -> int:
        return self._many.dim

    @property
    def chunk_rows(self) -> int:
        return self._many.chunk_rows

    @property
    def chunk_bytes(self) -> int:
        return self._many.chunk_bytes

    def read(self, lo: int, hi: int) -> np.ndarray:
        return self._many.read(lo, hi)[self.fusion.text]

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        for lo, fused in self._many.iter_chunks(start, stop):
            yield lo, fused[self.fusion.text]

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self._many.take(rows)[self.fusion.text]

    def read_raw(self, lo: int, hi: int) -> np.ndarray:
        return self._many.read_raw(lo, hi)

    def rows_of(self, raw: np.ndarray, lo: int, sel: np.ndarray, fusion: str | None = None) -> np.ndarray:
        return self._many.rows_of(raw, lo, sel, self.fusion.text)


def fused_encoder(encoder: dict[str, Any], fusion: Fusion, norm: bool, blocks_dtype: str) -> dict[str, Any]:
    """The ``encoder`` provenance of features fused at read time: the fusion, whether the norm was applied, and
    the dtype of the blocks they came from (a model trained on them is refused on other features)."""
    return {**encoder, "fusion": fusion.text, "blocks_dtype": blocks_dtype,
            "final_norm": fusion.norm_note if norm else "not applied (--no-fusion-norm)"}


def read_time_fusion(encoder: dict[str, Any] | None) -> dict[str, Any]:
    """The ``open_store`` arguments that fuse a blocks store as :func:`fused_encoder` recorded it in ``encoder``
    (a model's provenance): ``{}`` for features read as stored."""
    if not encoder or "blocks_dtype" not in encoder:
        return {}
    return {"fusion": encoder["fusion"], "fusion_norm": str(encoder.get("final_norm", "")).startswith("applied")}
