"""A head's model file keeps learning lazily (``HeadClassifier.partial_fit``, which ``DeployedModel.partial_fit``
calls): the rows go to the head's statistics and the model is solved when a prediction, its tensors or saving need
it, once per run of calls, with the bits and the file bytes of a solve after every call; dual still solves at every
call; a refused solve returns to the last solved model, naming the calls undone, as the head estimators do."""

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import scores_in_threads

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, make_head
from foal_pipe.heads.state import export_head, file_heads
from foal_pipe.model.deploy import load_model
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.projection import SmoothProjection

D = 6
OPTIONS = {"ncm": {}, "slda": {"shrinkage": "oas"}, "fecam": {"shrinkage": 0.5, "shrinkage_offdiag": 0.3},
           "balanced": {"gamma": 0.5}, "dual": {"gamma": 0.5, "gamma_comp": 2.0, "compensation": 0.7, "batch_size": 4},
           "cosine": {}}
NAMES = list(file_heads())


def _calls(name, seed=0):
    """A first task (classes 0-2) and five calls of uneven sizes, classes new and recurring, two rows a class."""
    rng = np.random.default_rng(seed)
    calls = [(rng.normal(size=(2 * len(c), D)) + 0.2, np.repeat(c, 2)) for c in
             ([0, 1, 2, 0, 1, 2], [3, 1], [0, 4, 5, 3], [2], [6, 5, 1], [0, 6])]
    return [(np.tanh(x) if HEADS[name].space != "features" else x, y) for x, y in calls]


def _model(name, calls, options=None):
    """The head after ``calls[0]`` as a model file holds it, and the head that made it."""
    options = OPTIONS[name] if options is None else options
    head = make_head(name, options, xnp, D)
    head.add(*calls[0])
    tensors = {key: value.copy() for key, value in export_head(name, head, head.boundary()).items()}  # as a file's
    return HeadClassifier(name, options, tensors, calls[0][1].size), head


@pytest.fixture
def solves(monkeypatch):
    """The boundaries solved, counted per head class."""
    count = {name: 0 for name in NAMES}
    for name in NAMES:
        cls, solve = HEADS[name].head, HEADS[name].head.boundary

        def counted(self, solve=solve, name=name):
            count[name] += 1
            return solve(self)
        monkeypatch.setattr(cls, "boundary", counted)
    return count


@pytest.mark.parametrize("name", NAMES)
def test_k_calls_cost_one_solve(name, solves):
    """Five calls, then two predictions, the tensors and a save: one solve (dual: one per call, none after)."""
    calls = _calls(name)
    model = _model(name, calls)[0]
    solves[name] = 0
    for x, y in calls[1:]:
        model.partial_fit(x, y)
    assert solves[name] == (0 if HEADS[name].head.solve_on_demand else 5)
    model.predict(calls[0][0])
    model.class_scores(calls[1][0])
    assert model.tensors["classes"].tolist() == list(range(7))
    assert solves[name] == (1 if HEADS[name].head.solve_on_demand else 5)


@pytest.mark.parametrize("name", NAMES)
def test_predictions_tensors_and_bytes_are_those_of_a_solve_after_every_call(name, tmp_path):
    """Predictions after some calls, the tensors and the saved file equal, bit for bit, the head solved at every call
    (the model file it gives written by the per-call code's path: a HeadClassifier of its exported tensors)."""
    calls = _calls(name, 1)
    model, head = _model(name, calls)
    identity = SmoothProjection(n_components=0, activation="identity").fit(calls[0][0])
    test = np.concatenate([x for x, _ in calls])
    for k, (x, y) in enumerate(calls[1:], 1):
        model.partial_fit(x, y)
        head.add(x, y)
        scorer = head.boundary()
        assert model.classes_.tolist() == scorer.classes.tolist()
        if k in (2, 5):
            assert np.array_equal(model.class_scores(test), np.asarray(scorer.scores(test)))
    exported = export_head(name, head, scorer)
    assert model.tensors.keys() == exported.keys()
    for key, value in exported.items():
        assert np.array_equal(model.tensors[key], value) and model.tensors[key].dtype == value.dtype, key
    model.save(tmp_path / "lazy.safetensors", projection=identity)
    rows = sum(y.size for _, y in calls)
    HeadClassifier(name, OPTIONS[name], exported, rows).save(tmp_path / "eager.safetensors", projection=identity)
    assert (tmp_path / "lazy.safetensors").read_bytes() == (tmp_path / "eager.safetensors").read_bytes()


def _deployed(name, path, calls, options=None):
    """The head after ``calls[0]`` saved to ``path`` with class names, loaded."""
    identity = SmoothProjection(n_components=0, activation="identity").fit(calls[0][0])
    _model(name, calls, options)[0].save(path, projection=identity, class_names=["ant", "bee", "cow"])
    return load_model(path)


@pytest.mark.parametrize(("name", "options", "bad", "problem"), [
    ("fecam", None, (np.ones((3, D)), ["emu"] * 3), "no variance"),
    ("balanced", {"gamma": 1e-13}, (np.tanh(np.random.default_rng(5).normal(size=(4, D))) * 1e9, ["emu", "ant"] * 2),
     "gamma"),
])
def test_a_refused_solve_returns_to_the_last_solved_model(name, options, bad, problem, tmp_path):
    """A task the head cannot solve, then a good one: the prediction that needs the solve is refused, naming the two
    calls undone; the model (classes, names, rows seen, tensors, file) is back at its last solved one and keeps
    learning from it exactly."""
    calls = _calls(name)
    deployed = _deployed(name, tmp_path / "m.safetensors", calls, options)
    before = dict(deployed.classifier.tensors)
    deployed.partial_fit(*bad).partial_fit(calls[1][0], ["ant", "bee"] * 2)
    assert deployed.class_names == ["ant", "bee", "cow", "emu"]
    with pytest.raises(FoalPipeError, match=rf"{problem}.*; this HeadClassifier is back at its last solved model: "
                                            r"the rows of its last 2 partial_fit calls are undone$"):
        deployed.predict(calls[0][0])
    model = deployed.classifier
    assert model.classes_.tolist() == [0, 1, 2] and deployed.class_names == ["ant", "bee", "cow"]
    assert model.n_samples_seen_ == 12
    assert model.tensors.keys() == before.keys() and all(np.array_equal(model.tensors[k], v) for k, v in before.items())
    deployed.save(tmp_path / "back.safetensors")
    assert (tmp_path / "back.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()
    names = ["ant", "emu", "fox", "ant", "bee", "fox", "emu", "bee"]
    deployed.partial_fit(calls[2][0], names)
    fresh = _deployed(name, tmp_path / "fresh.safetensors", calls, options).partial_fit(calls[2][0], names)
    assert np.array_equal(deployed.scores(calls[0][0]), fresh.scores(calls[0][0]))
    assert deployed.class_names == fresh.class_names == ["ant", "bee", "cow", "emu", "fox"]


def test_a_class_the_head_cannot_fit_is_refused_by_its_call(tmp_path):
    """fecam given a new class of one row: refused by that call, which changes nothing (its row is not kept in the
    statistics), so the next call continues exactly."""
    calls = _calls("fecam")
    deployed = _deployed("fecam", tmp_path / "m.safetensors", calls)
    deployed.partial_fit(calls[1][0], ["ant", "bee"] * 2)
    with pytest.raises(FoalPipeError, match=r"^fecam needs at least 2 training rows per class .* class 'emu' has 1"):
        deployed.partial_fit(calls[2][0][:3], ["cow", "emu", "cow"])
    assert deployed.class_names == ["ant", "bee", "cow"] and deployed.classifier.n_samples_seen_ == 16
    deployed.partial_fit(calls[3][0], ["cow", "cow"])
    head = make_head("fecam", OPTIONS["fecam"], xnp, D)
    head.add(*calls[0])
    head.add(calls[1][0], np.array([0, 1] * 2))
    head.add(calls[3][0], np.array([2, 2]))
    assert np.array_equal(deployed.scores(calls[0][0]), np.asarray(head.boundary().scores(calls[0][0])))


@pytest.mark.parametrize("name", NAMES)
def test_the_tensors_it_is_given_stay_as_they_are(name):
    """The tensors a HeadClassifier is made of (a live head's export shares its arrays) are never written: the rows of
    a call go to a head of its own, so the head that gave them and the tensors read before are unchanged."""
    calls = _calls(name, 2)
    head = make_head(name, OPTIONS[name], xnp, D)
    head.add(*calls[0])
    given = export_head(name, head, head.boundary())
    kept = {key: value.copy() for key, value in given.items()}
    model = HeadClassifier(name, OPTIONS[name], given, calls[0][1].size)
    model.partial_fit(*calls[1]).predict(calls[0][0])
    assert all(np.array_equal(given[key], value) for key, value in kept.items())
    assert all(np.array_equal(export_head(name, head, head.boundary())[key], value) for key, value in kept.items())


@pytest.mark.parametrize("name", NAMES)
def test_a_refused_batch_keeps_the_calls_before_it(name):
    """Rows one column too wide after two calls not yet solved: refused by that call in one line, which keeps the two
    (before, the head's refusal undid them, or ncm's and the others' rows broke the head half-way)."""
    calls = _calls(name)
    model = _model(name, calls)[0].partial_fit(*calls[1]).partial_fit(*calls[2])
    with pytest.raises(FoalPipeError, match=rf"^rows have shape \(4, {D + 1}\) but the {name} head takes \(n, {D}\)"):
        model.partial_fit(np.ones((4, D + 1)), np.array([0, 1, 7, 7]))
    fresh = _model(name, calls)[0].partial_fit(*calls[1]).partial_fit(*calls[2])
    assert model.n_samples_seen_ == fresh.n_samples_seen_ == 24
    assert model.classes_.tolist() == fresh.classes_.tolist() == [0, 1, 2, 3, 4, 5]
    model.partial_fit(*calls[3])
    fresh.partial_fit(*calls[3])
    assert np.array_equal(model.class_scores(calls[0][0]), fresh.class_scores(calls[0][0]))


@pytest.mark.parametrize("name", [n for n in NAMES if HEADS[n].head.solve_on_demand])
def test_readers_in_threads_get_the_model_of_every_row(monkeypatch, name):
    """Four threads score at once after calls not yet solved: each gets the model of every row, solved once for all."""
    calls = _calls(name)
    model = _model(name, calls)[0].partial_fit(*calls[1]).partial_fit(*calls[2])
    want = _model(name, calls)[0].partial_fit(*calls[1]).partial_fit(*calls[2]).class_scores(calls[0][0])
    out, solves = scores_in_threads(monkeypatch, name, lambda: model.class_scores(calls[0][0]))
    assert all(isinstance(o, np.ndarray) and np.array_equal(o, want) for o in out), out
    assert solves == 1
    assert model._undo is None


def test_a_name_changed_in_class_names_is_saved(tmp_path):
    """class_names is one list: a name changed in it is what predict_names gives and save writes (before, a list
    computed at every access took the change nowhere)."""
    deployed = _deployed("ncm", tmp_path / "m.safetensors", _calls("ncm"))
    deployed.class_names[0] = "renamed"
    assert deployed.class_names == ["renamed", "bee", "cow"]
    row = _calls("ncm")[0][0][:1]
    assert deployed.predict_names(row)[0] == ["renamed", "bee", "cow"][int(deployed.predict(row)[0])]
    deployed.save(tmp_path / "renamed.safetensors")
    assert load_model(tmp_path / "renamed.safetensors").class_names == ["renamed", "bee", "cow"]


def test_class_names_of_another_length_are_refused(tmp_path):
    from foal_pipe.model.deploy import DeployedModel

    deployed = _deployed("ncm", tmp_path / "m.safetensors", _calls("ncm"))
    problem = r"^class_names has {} names but the model has 3 classes; pass one name per class of classifier.classes_"
    with pytest.raises(FoalPipeError, match=problem.format(2)):
        deployed.class_names = ["a", "b"]
    assert deployed.class_names == ["ant", "bee", "cow"]
    with pytest.raises(FoalPipeError, match=problem.format(4)):
        DeployedModel(deployed.classifier, deployed.projection, ["a", "b", "c", "d"])


def test_a_refused_solve_takes_the_undone_names_out_of_the_same_list(tmp_path):
    """The undone classes' names leave the list the caller holds, whose other names keep their edits."""
    calls = _calls("fecam")
    deployed = _deployed("fecam", tmp_path / "m.safetensors", calls)
    deployed.partial_fit(np.ones((3, D)), ["emu"] * 3)
    names = deployed.class_names
    names[1] = "bumblebee"
    with pytest.raises(FoalPipeError, match="no variance"):
        deployed.predict(calls[0][0])
    assert deployed.class_names is names and names == ["ant", "bumblebee", "cow"]
