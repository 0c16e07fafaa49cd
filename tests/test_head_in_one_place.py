"""A head lives in one place (issue 30, item 4): a head registered by this test alone, with an option new to the
package, runs through the library's ``learn`` with ``ModelConfig.head_options`` and through the command line with
``--head-option NAME=VALUE``, both equal to its definition written plainly here; nothing else is edited for it.
Also: ``--head-option`` is read by the type of the head's ``Options`` field, agrees with the heads' own flags, and
``head_options`` is validated against the registry."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pytest
from array_api_compat import array_namespace
from helpers import assert_clean_error, build_store, invoke, read, written_copy

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, HeadBase, HeadEntry
from foal_pipe.heads.checks import FLOAT64, positive
from foal_pipe.heads.moments import ClassSums
from foal_pipe.protocol import ExecutionConfig, LearnSettings, ModelConfig, StreamConfig, learn


@dataclass(frozen=True)
class PNormOptions:
    """``power``: p of the distance, > 0."""

    power: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "power", positive("power", self.power))


class PNormScorer:
    def __init__(self, classes: np.ndarray, means: Any, power: float) -> None:
        self.classes, self.means, self.power = classes, means, power

    def scores(self, X: Any) -> Any:
        xp = array_namespace(X)
        gaps = xp.abs(X[:, None, :] - self.means[None, :, :]) ** self.power
        return -(xp.sum(gaps, axis=2) ** (1.0 / self.power))


class PNormHead(HeadBase):
    """The nearest class mean in the p-norm: a throw-away eighth head with an option no other head has."""

    name: ClassVar[str] = "pnorm"
    space: ClassVar[str] = "features"
    Options: ClassVar[type] = PNormOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"means": ("C", "d")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = ClassSums.TENSORS

    def __init__(self, *, xp: Any, dim: int, **options: Any) -> None:
        self.options = PNormOptions(**options)
        self.power = self.options.power
        self.sums = ClassSums(xp, dim)

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        return FLOAT64 * 2 * n_classes * dim

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * seen * dim

    def add(self, X: Any, labels: np.ndarray) -> None:
        self.sums.add(X, labels)

    def boundary(self) -> PNormScorer:
        return PNormScorer(self.sums.classes.copy(), self.sums.means(), self.power)

    def state_dict(self, scorer: PNormScorer) -> dict[str, Any]:
        return {"means": scorer.means, **self.sums.state_dict()}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        self.sums.load_state_dict(tensors)

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> PNormScorer:
        return PNormScorer(classes, tensors["means"], options.power)


@pytest.fixture
def pnorm(monkeypatch):
    """The eighth head, registered for one test: its one registry line, and nothing else."""
    monkeypatch.setitem(HEADS, "pnorm", HeadEntry(PNormHead, "a test's p-norm nearest mean", "none"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("pnorm") / "blobs.zarr")


def plain_pnorm_matrix(store, tasks, power):
    """acc[i][j]: class means of the train rows of tasks 1..i, each test row of those tasks' classes to the mean of the
    least p-norm distance (sum |t - m|^p)^(1/p), scored on task j's test rows: loops in float64."""
    x, y, xt, yt = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    matrix = []
    for i in range(len(tasks)):
        seen = sorted(c for task in tasks[: i + 1] for c in task)
        means = {c: x[y == c].mean(axis=0) for c in seen}
        test = np.isin(yt, seen)
        predicted = np.array([min(seen, key=lambda c: (np.abs(t - means[c]) ** power).sum() ** (1 / power))
                              for t in xt[test]])
        hit = predicted == yt[test]
        matrix.append([float(hit[np.isin(yt[test], tasks[j])].mean()) for j in range(i + 1)])
    return matrix


def test_a_new_head_with_a_new_option_runs_from_python_and_the_command_line(pnorm, store, tmp_path):
    settings = LearnSettings(stream=StreamConfig(tasks=4, seed=2), execution=ExecutionConfig(backend="numpy"),
                             model=ModelConfig(head="pnorm", head_options={"power": 1.0}))
    metrics = learn(store, tmp_path / "python", settings, log=lambda _: None).metrics
    expected = plain_pnorm_matrix(store, metrics.tasks, 1.0)
    assert expected != plain_pnorm_matrix(store, metrics.tasks, 2.0)  # the option changes the predictions here
    assert metrics.accuracy_matrix == expected
    assert (metrics.head, metrics.head_options) == ("pnorm", {"power": 1.0})

    result = invoke("sweep", "--features", store, "--out", tmp_path / "cli", "--tasks", 4, "--seed", 2, "--gammas", 1,
                    "--projection-dim", 16, "--heads", "ridge,pnorm", "--head-option", "power=1", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    heads = json.loads((tmp_path / "cli" / "sweep.json").read_text())["heads"]
    assert heads["pnorm"]["accuracy_matrix"] == expected and heads["pnorm"]["options"] == {"power": 1.0}


@pytest.mark.parametrize(("args", "message"), [
    (["learn", "--head", "ncm", "--head-option", "power=1"], "--head-option power is an option of pnorm, not of ncm"),
    (["sweep", "--heads", "ridge,pnorm", "--head-option", "power=abc"],
     "--head-option 'power=abc': power of pnorm takes a number; write e.g. --head-option power=2.0"),
    (["sweep", "--heads", "ridge,pnorm", "--head-option", "power=-1"], "power must be a positive number"),
    (["learn", "--head", "ncm", "--head-option", "temperature=1"], "no head takes an option 'temperature'"),
    (["learn", "--head", "ncm", "--head-option", "power"], "--head-option 'power' is not NAME=VALUE"),
    (["learn", "--head", "balanced", "--head-option", "gamma=2"], "gamma is a setting of its own"),
    (["learn", "--head", "dual", "--head-option", "gamma_comp=none"],
     "gamma_comp of dual takes a number; write e.g. --head-option gamma_comp=1.0"),  # its default, None, is no example
])
def test_a_new_heads_option_is_checked_like_the_others(pnorm, store, tmp_path, args, message):
    out = tmp_path / "out"
    result = invoke(*args, "--features", store, "--out", out, "--tasks", 3, "--backend", "numpy")
    if "is an option of" in message or "must be" in message:  # a value that reads, refused by the command
        assert_clean_error(result, message, out)
    else:  # a usage error (tests/test_usage_exit_codes.py)
        assert result.exit_code == 2 and message in result.output and not out.exists(), result.output


def test_head_option_and_the_heads_own_flags_are_one_mapping(store, tmp_path):
    base = ["learn", "--features", store, "--tasks", 3, "--seed", 1, "--backend", "numpy"]
    runs = {"flags": ["--head", "fecam", "--shrinkage", "0.5", "--shrinkage-offdiag", "0.3"],
            "option": ["--head", "fecam", "--head-option", "shrinkage=0.5", "--head-option", "shrinkage_offdiag=0.3"],
            "both": ["--head", "fecam", "--shrinkage", "0.5", "--head-option", "shrinkage=0.5",
                     "--head-option", "shrinkage_offdiag=0.3"],
            "oas": ["--head", "slda", "--head-option", "shrinkage=oas"], "oas-flag": ["--head", "slda", "--shrinkage", "oas"]}
    for name, args in runs.items():
        result = invoke(*base, "--out", tmp_path / name, *args)
        assert result.exit_code == 0, result.output
    for a, b in (("flags", "option"), ("flags", "both"), ("oas", "oas-flag")):
        for file in ("metrics.json", "model.safetensors"):
            assert (tmp_path / a / file).read_bytes() == (tmp_path / b / file).read_bytes(), (a, b, file)
    metrics = json.loads((tmp_path / "option" / "metrics.json").read_text())
    assert metrics["head_options"] == {"shrinkage": 0.5, "shrinkage_offdiag": 0.3}
    out = tmp_path / "twice"
    assert_clean_error(invoke(*base, "--out", out, "--head", "slda", "--shrinkage", "0.1", "--head-option", "shrinkage=0.2"),
                       "--shrinkage 0.1 and --head-option shrinkage=0.2 give shrinkage two values; give it once", out)
    assert_clean_error(invoke(*base, "--out", out, "--head", "slda", "--head-option", "shrinkage=0.1",
                              "--head-option", "shrinkage=oas"), "give shrinkage two values", out)


def test_a_python_callers_head_option_is_checked_against_a_continued_model(store, tmp_path):
    base = LearnSettings(stream=StreamConfig(tasks=3), execution=ExecutionConfig(backend="numpy"),
                         model=ModelConfig(head="slda", head_options={"shrinkage": 0.25}))
    store = written_copy(store, tmp_path / "current.zarr")  # a store continuing can tell from new rows
    learn(store, tmp_path / "first", base, log=lambda _: None)
    model = tmp_path / "first" / "model.safetensors"
    again = LearnSettings(stream=StreamConfig(tasks=3), init_model=model,
                          model=ModelConfig(head_options={"shrinkage": 0.5}))  # no `given`: still the caller's
    with pytest.raises(FoalPipeError, match=r"shrinkage=0.5 conflicts with the model's slda head \(its 0.25\)"):
        learn(store, tmp_path / "second", again, log=lambda _: None)
    same = LearnSettings(stream=StreamConfig(tasks=3), init_model=model, model=ModelConfig(head_options={"shrinkage": 0.25}))
    new_rows = written_copy(build_store(tmp_path / "new0.zarr", seed=1), tmp_path / "new.zarr")
    assert learn(new_rows, tmp_path / "third", same, log=lambda _: None).metrics.head_options == {"shrinkage": 0.25}


def test_head_options_are_a_read_only_hashable_mapping_checked_against_the_registry():
    config = ModelConfig(head="slda", head_options={"shrinkage": "oas", "compensation": None})
    assert dict(config.head_options) == {"shrinkage": "oas"}  # None: the head's default
    assert config == ModelConfig(head="slda", head_options={"shrinkage": "oas"})
    assert hash(config) == hash(ModelConfig(head="slda", head_options={"shrinkage": "oas"}))
    with pytest.raises(TypeError):
        config.head_options["shrinkage"] = 0.1  # type: ignore[index]
    with pytest.raises(FoalPipeError, match="no head takes an option 'temperature'; the heads' options are: "
                                            "shrinkage \\(slda, fecam\\); shrinkage_offdiag \\(fecam\\)"):
        ModelConfig(head_options={"temperature": 1.0})
    with pytest.raises(FoalPipeError, match="batch_size is a setting of its own"):
        ModelConfig(head="dual", head_options={"batch_size": 5})
    with pytest.raises(FoalPipeError, match="head_options must map head option names to values"):
        ModelConfig(head_options=[("shrinkage", 0.1)])  # type: ignore[arg-type]


def test_head_option_text_is_read_by_the_options_field_type():
    from foal_pipe.cli.headoptions import parse_value

    assert parse_value("0.25", [float, str]) == 0.25 and parse_value("oas", [float, str]) == "oas"
    assert parse_value("3", [int]) == 3 and isinstance(parse_value("3", [float]), float)
    assert parse_value("2.5", [int]) is None and parse_value("x", [float]) is None
    assert parse_value("false", [bool]) is False and parse_value("maybe", [bool]) is None
    assert parse_value("b", [Literal["a", "b"]]) == "b" and parse_value("c", [Literal["a", "b"]]) is None


def test_table_gives_each_head_its_options_beside_ridge(store, tmp_path):
    """``table --heads ridge,slda --shrinkage``: ridge takes none of the heads' options, slda its own (refused before,
    at ridge's run with ``--gamma auto``); ``--head-option`` writes the same bytes; table.json's settings keep one key
    per head option."""
    base = ["table", "--features", store, "--tasks", 3, "--order-seeds", 0, "--projection-dim", 16, "--heads",
            "ridge,slda", "--backend", "numpy"]
    for out, args in (("flag", ["--shrinkage", "0.25"]), ("option", ["--head-option", "shrinkage=0.25"])):
        result = invoke(*base, "--out", tmp_path / out, *args)
        assert result.exit_code == 0, result.output
    assert (tmp_path / "flag" / "table.json").read_bytes() == (tmp_path / "option" / "table.json").read_bytes()
    table = json.loads((tmp_path / "flag" / "table.json").read_text())
    model = table["settings"]["model"]
    assert "head_options" not in model
    assert {k: model[k] for k in ("shrinkage", "shrinkage_offdiag", "compensation", "gamma_comp")} == {
        "shrinkage": 0.25, "shrinkage_offdiag": None, "compensation": None, "gamma_comp": None}
    result = invoke("learn", "--features", store, "--out", tmp_path / "slda", "--tasks", 3, "--order-seed", 0,
                    "--head", "slda", "--shrinkage", "0.25", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    learned = json.loads((tmp_path / "slda" / "metrics.json").read_text())
    run = next(r for r in table["runs"] if r["head"] == "slda")
    assert (run["accuracy_matrix"], run["options"]) == (learned["accuracy_matrix"], {"shrinkage": 0.25})
    assert next(r for r in table["runs"] if r["head"] == "ridge")["options"]["selected_by"] == "loo_accuracy"


@pytest.mark.parametrize("command", ["learn", "sweep", "table"])
def test_help_explains_head_option_with_the_registrys_options(command):
    import re

    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    assert "--head-option NAME=VALUE" in text
    assert "the heads' options: shrinkage (slda, fecam); shrinkage_offdiag (fecam); gamma_comp (dual); compensation " \
           "(dual)" in text and "Default: none (each head's defaults)" in text
