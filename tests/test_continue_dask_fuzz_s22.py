"""Two routes that must give what one plain ``learn`` gives, over random small configurations.

Continuation (docs/deploy.md, Continuing a model; docs/heads.md, A head's model file): ``learn`` over T tasks of a
store S against ``learn`` over its first k tasks (a store A of those classes) continued with ``--init-model`` on a
store B of the rest. A and B are laid out so that their own streams (``--class-order``, ``--order-seed``) visit
exactly S's rows in S's stream order, batch for batch: the documents promise ridge's weights to 1e-9 in float64 and a
head's model "equal to the head fitted on both streams' rows in order"; the accuracies are the same decisions, so the
same counts of correct rows. Dask (docs/dask.md): ridge's metrics equal and W within 1e-9; a head's outputs the same
bytes as a local run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from helpers import documented_stream, invoke

import foal_pipe
from foal_pipe.store import write_store
from foal_pipe.store.blockfusion import FinalNorm

HEADS = ("ridge", "ncm", "slda", "fecam", "cosine", "balanced", "dual")
PROJECTED = ("ridge", "balanced", "dual")
N_BLOCKS = 3


@dataclass
class Case:
    """One random configuration; ``flags`` are the options every run of it takes (the continued one takes only those
    a continuation accepts)."""

    seed: int
    head: str
    n_classes: int
    tasks: int
    k: int
    order_seed: int
    batch: int
    dim: int
    flags: list[str] = field(default_factory=list)
    fusion: bool = False

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.head} C={self.n_classes} T={self.tasks} k={self.k} {' '.join(self.flags)}"


def draw_case(seed: int, head: str, heavy: bool = False) -> Case:
    rng = np.random.default_rng([22, seed])
    C = int(rng.integers(3, 8))
    T = int(rng.integers(2, min(C, 5) + 1))
    case = Case(seed, head, C, T, int(rng.integers(1, T)), int(rng.integers(0, 1000)), int(rng.choice([1, 3, 7, 10])),
                int(rng.integers(4, 10)))
    flags = ["--seed", str(int(rng.integers(0, 100)))]
    if head in PROJECTED or rng.random() < 0.3:
        flags += ["--projection-dim", str(int(rng.integers(8, 40 if not heavy else 120)))]
        if head != "dual" and rng.random() < 0.4:  # dual applies its own activations
            flags += ["--activation", str(rng.choice(["relu", "sigmoid"] + (["identity"] if head == "ridge" else [])))]
        if rng.random() < 0.3:
            flags += ["--projection-init", "normal"]
    if head in PROJECTED:
        flags += ["--gamma", repr(float(rng.choice([0.1, 0.5, 1.0, 3.0])))]
    if head == "ridge" and rng.random() < 0.25:
        flags[-1] = "auto"
        flags += ["--select", "gcv", "--gamma-grid", "0.01,0.1,1,10", "--per-decade", str(int(rng.choice([0, 2])))]
    if rng.random() < 0.2:
        flags += ["--dtype", "float32"]
        if head in PROJECTED and "auto" not in flags:
            flags[flags.index("--gamma") + 1] = "10.0"  # float32's resolution refuses a small gamma
            if "--gamma-grid" in flags:
                flags[flags.index("--gamma-grid") + 1] = "10,30"
    options = {"slda": [["shrinkage=oas"], ["shrinkage=0.01"], []], "fecam": [["shrinkage=0.5", "shrinkage_offdiag=0.2"], []],
               "dual": [["gamma_comp=2.0", "compensation=0.7"], []]}.get(head, [[]])
    for option in options[int(rng.integers(0, len(options)))]:
        flags += ["--head-option", option]
    case.fusion = bool(rng.random() < 0.3)
    if case.fusion:
        flags += ["--fusion", str(rng.choice(["mean-cls", "last", "mean:1-2", "concat:2-3"]))]
    case.flags = flags + ["--head", head]
    return case


# --- the stores -------------------------------------------------------------------------------------------------
@dataclass
class Data:
    X: np.ndarray  # train blocks (n, L, d) or features (n, d)
    y: np.ndarray
    T: np.ndarray
    yt: np.ndarray
    names: list[str]


def make_data(case: Case) -> Data:
    rng = np.random.default_rng([23, case.seed])
    C, d = case.n_classes, case.dim
    centres = rng.normal(size=(C, d)) * rng.uniform(0.5, 2.0)

    def split(low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.repeat(np.arange(C), rng.integers(low, high, C)))
        tokens = centres[y][:, None, :] + rng.normal(size=(y.size, N_BLOCKS, d)) * rng.uniform(0.8, 2.0, N_BLOCKS)[:, None]
        return tokens.astype(np.float32), y

    (X, y), (T, yt) = split(4, 16), split(1, 6)
    return Data(X, y, T, yt, [f"k{c}" for c in rng.permutation(C)])


def write(path: Path, data: Data, classes: list[int], order: list[int], rng: np.random.Generator, fusion: bool) -> Path:
    """A store of ``classes`` (label ids in that order, names kept), its train rows those of S at ``order``, its test
    rows S's of these classes."""
    relabel = np.full(len(data.names), -1)
    relabel[classes] = np.arange(len(classes))
    tests = np.flatnonzero(np.isin(data.yt, classes))
    X, T = data.X[order], data.T[tests]
    norm = FinalNorm("layernorm", 1e-6, np.linspace(0.5, 1.5, data.X.shape[2], dtype=np.float32),
                     np.linspace(-1, 1, data.X.shape[2], dtype=np.float32))
    return write_store(path, (X.mean(axis=1), relabel[data.y[order]]), (T.mean(axis=1), relabel[data.yt[tests]]),
                       [data.names[c] for c in classes], chunk_rows=int(rng.integers(5, 40)), dtype="float32",
                       blocks=(X, T) if fusion else None, norm=norm if fusion else None)


def layout(rows: list[np.ndarray], seed: int, rng: np.random.Generator) -> np.ndarray:
    """The storage order of a store whose ``--class-order`` stream (task t: the classes of ``rows[t]``) with
    ``--order-seed seed`` visits ``rows`` in order: task t's positions, in storage order, are shuffled by
    default_rng(seed) as the run shuffles them, and the row the run visits i-th is put at the i-th shuffled position."""
    owner = rng.permutation(np.repeat(np.arange(len(rows)), [r.size for r in rows]))
    order, draw = np.empty(owner.size, dtype=np.int64), np.random.default_rng(seed)
    for t, task_rows in enumerate(rows):
        idx = np.flatnonzero(owner == t)
        draw.shuffle(idx)
        order[idx] = task_rows
    return order


# --- the comparison ---------------------------------------------------------------------------------------------
def run(*args) -> dict:
    result = invoke("learn", "--backend", "numpy", *args)
    assert result.exit_code == 0, f"learn {' '.join(map(str, args))}: {result.output}"
    return json.loads((Path(args[args.index("--out") + 1]) / "metrics.json").read_text())


#: The class axis of each tensor of a model file (docs/model-file.md, docs/heads.md); a tensor not named has none.
CLASS_AXIS = {"W": 1, "Q": 1, "Q_main": 1, "Q_comp": 1, "W_main": 1, "W_comp": 1, "b": 0, "counts": 0, "means": 0,
              "prototypes": 0, "grams": 0, "precisions": 0, "shifts": 0}
SUMS_AXIS = {"ncm": 1, "cosine": 1, "slda": 1, "fecam": 0, "balanced": 0}


def by_name(path: Path, head: str) -> dict[str, np.ndarray]:
    """The model's tensors with their class axis put in class-name order (ids differ between the routes, names not)."""
    from foal_pipe.model.modelfile import read_model

    tensors, meta = read_model(path)
    order = np.argsort(meta["class_names"])
    axes = {**CLASS_AXIS, "sums": SUMS_AXIS.get(head)}
    return {key: value if axes.get(key) is None else np.take(value, order, axis=axes[key])
            for key, value in tensors.items() if key != "classes"}


def hits(matrix: list[list[float]], ns: list[list[int]]) -> list[list[int]]:
    return [[round(a * n) for a, n in zip(row, nrow, strict=True)] for row, nrow in zip(matrix, ns, strict=True)]


def continuation_check(tmp: Path, case: Case, *extra: str) -> list[str]:
    """Run the three learns of ``case`` (``extra``: options of the continued one) and return what disagrees (empty:
    all agree)."""
    data, rng = make_data(case), np.random.default_rng([24, case.seed])
    C, k, T = case.n_classes, case.k, case.tasks
    S = write(tmp / "s.zarr", data, list(range(C)), list(range(data.y.size)), rng, case.fusion)
    tasks, rows = documented_stream(data.y, C, T, case.order_seed)
    full = run("--features", S, "--out", tmp / "full", "--tasks", T, "--order-seed", case.order_seed,
               "--batch-size", case.batch, *case.flags)
    assert full["tasks"] == tasks, f"{case}: the stream drawn here is not the run's"
    parts, problems = [], []
    for name, lo, hi in (("a", 0, k), ("b", k, T)):
        classes = sorted(c for t in tasks[lo:hi] for c in t)
        seed = int(rng.integers(0, 1000))
        order = layout(rows[lo:hi], seed, rng)
        path = write(tmp / f"{name}.zarr", data, classes, order, rng, case.fusion)
        (tmp / f"{name}.json").write_text(json.dumps([[classes.index(c) for c in t] for t in tasks[lo:hi]]))
        parts.append((path, seed))
    (A, seed_a), (B, seed_b) = parts
    first = run("--features", A, "--out", tmp / "first", "--tasks", k, "--class-order", tmp / "a.json", "--order-seed",
                seed_a, "--batch-size", case.batch, *case.flags)
    kept = [f for i, f in enumerate(case.flags) if f in ("--dtype", "--head-option")
            or (i and case.flags[i - 1] in ("--dtype", "--head-option"))]
    cont = run("--init-model", tmp / "first" / "model.safetensors", "--features", B, "--out", tmp / "cont", "--tasks",
               T - k, "--class-order", tmp / "b.json", "--order-seed", seed_b, "--batch-size", case.batch,
               "--eval-features", A, *kept, *extra)
    # the accuracies: counts of correct test rows, task by task
    n_test = [int(np.isin(data.yt, t).sum()) for t in tasks]
    got_full = hits(full["accuracy_matrix"], [n_test[:i + 1] for i in range(T)])
    got_first = hits(first["accuracy_matrix"], [n_test[:i + 1] for i in range(k)])
    got_cont = hits(cont["accuracy_matrix"], [n_test[k:k + i + 1] for i in range(T - k)])
    if got_first != [row[:k] for row in got_full[:k]]:
        problems.append(f"first k tasks: {got_first} != full {got_full[:k]}")
    if got_cont != [row[k:] for row in got_full[k:]]:
        problems.append(f"continued tasks: {got_cont} != full {[row[k:] for row in got_full[k:]]}")
    every = cont["continuation"]["all_classes"]
    old = {p["task"]: p for p in every["tasks"]}["eval"]
    if round(old["accuracy"] * old["n_test"]) != sum(got_full[-1][:k]) or old["n_test"] != sum(n_test[:k]):
        problems.append(f"old store scored {old} after the continuation, full run's last row {got_full[-1][:k]}")
    if every["n_test"] != sum(n_test) or abs(every["A_last"] * every["n_test"] - sum(got_full[-1])) > 1e-6:
        problems.append(f"all_classes {every['A_last']} of {every['n_test']}, full run {sum(got_full[-1])} of {sum(n_test)}")
    if full.get("gammas_selected") and cont.get("gammas_selected") != full["gammas_selected"][k:]:
        problems.append(f"gammas chosen {first.get('gammas_selected')} + {cont.get('gammas_selected')} != "
                        f"{full['gammas_selected']}")
    if not case.fusion:  # docs/deploy.md, From Python: load_model(...).partial_fit, each call one task, is exact too
        model = foal_pipe.load_model(tmp / "first" / "model.safetensors")
        features = np.asarray(zarr.open_group(str(S), mode="r")["train/features"][:])
        for t in range(k, T):
            model.partial_fit(features[rows[t]], [data.names[c] for c in data.y[rows[t]]])
        model.save(tmp / "api.safetensors")
        problems += [f"Python: {p}" for p in same_model(tmp / "full" / "model.safetensors", tmp / "api.safetensors", case)]
    if case.head == "ridge" and "auto" not in case.flags and "--dtype" not in case.flags:  # the paper's recursion: exact too
        rls = run("--features", S, "--out", tmp / "rls", "--tasks", T, "--order-seed", case.order_seed, "--batch-size",
                  case.batch, "--engine", "rls", *case.flags)
        if hits(rls["accuracy_matrix"], [n_test[:i + 1] for i in range(T)]) != got_full:
            problems.append(f"--engine rls: {rls['accuracy_matrix']} != {full['accuracy_matrix']}")
        W = [by_name(tmp / run_ / "model.safetensors", "ridge")["W"] for run_ in ("rls", "cont")]
        if np.abs(W[0] - W[1]).max() > (1e-2 if "--dtype" in case.flags else 1e-9) * max(np.abs(W[0]).max(), 1.0):
            problems.append(f"--engine rls: W differs by {np.abs(W[0] - W[1]).max():.3g}")
    return problems + same_model(tmp / "full" / "model.safetensors", tmp / "cont" / "model.safetensors", case)


def same_model(one: Path, other: Path, case: Case) -> list[str]:
    """The tensors of two model files, class axes in name order, within 1e-9 of their largest entry (float64; the
    documents' bound for ridge, and rounding for a head's sums added in other groups), float32 state 1%."""
    a, b = by_name(one, case.head), by_name(other, case.head)
    problems = [] if sorted(a) == sorted(b) else [f"tensors {sorted(a)} != {sorted(b)}"]
    for key in sorted(set(a) & set(b)):
        x, z = a[key].astype(np.float64), b[key].astype(np.float64)
        if x.shape != z.shape:
            problems.append(f"{key}: shape {x.shape} != {z.shape}")
            continue
        err = np.abs(x - z).max() / max(np.abs(x).max(), 1.0) if x.size else 0.0
        if err > (1e-2 if "--dtype" in case.flags else 1e-9):  # float32: docs/guarantees.md refuses a gamma at 1%
            problems.append(f"{key}: differs by {err:.3g} of its largest entry")
    return problems


CASES = [(seed, HEADS[seed % len(HEADS)]) for seed in range(21)]


@pytest.mark.parametrize("seed,head", CASES)
def test_continuation_equals_one_run(tmp_path, seed, head):
    case = draw_case(seed, head)
    problems = continuation_check(tmp_path, case)
    assert not problems, f"{case}: " + "; ".join(problems)


def test_an_rls_model_is_refused_and_nothing_is_written(tmp_path):
    """docs/deploy.md: only --engine gram models continue (the RLS state is not additive)."""
    case = draw_case(3, "ridge")
    data, rng = make_data(case), np.random.default_rng(0)
    A = write(tmp_path / "a.zarr", data, [0, 1], list(np.flatnonzero(data.y < 2)), rng, False)
    B = write(tmp_path / "b.zarr", data, [2], list(np.flatnonzero(data.y == 2)), rng, False)
    run("--features", A, "--out", tmp_path / "rls", "--tasks", 2, "--engine", "rls", "--projection-dim", 12)
    result = invoke("learn", "--init-model", tmp_path / "rls" / "model.safetensors", "--features", B, "--out",
                    tmp_path / "cont", "--tasks", 1)
    assert result.exit_code == 1 and result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1, \
        result.output
    assert "--engine gram" in result.output and not (tmp_path / "cont").exists()


# --- Dask -------------------------------------------------------------------------------------------------------
def dask_flags(seed: int, head: str) -> tuple[Case, list[str]]:
    """A random configuration for a Dask run: draw_case's, without --fusion (refused with Dask), with --order-seeds
    and, for ridge, the other --gamma auto criteria."""
    case = draw_case(seed, head, heavy=True)
    flags = case.flags
    if case.fusion:
        i = flags.index("--fusion")
        flags = flags[:i] + flags[i + 2:]
    rng = np.random.default_rng([25, seed])
    if rng.random() < 0.4:
        flags += ["--order-seeds", ",".join(map(str, rng.choice(50, int(rng.integers(2, 4)), replace=False)))]
    else:
        flags += ["--order-seed", str(case.order_seed)]
    if "auto" in flags and rng.random() < 0.5:
        flags[flags.index("--select") + 1] = str(rng.choice(["loo", "loo_accuracy"]))
    return case, flags + ["--tasks", str(case.tasks), "--batch-size", str(case.batch)]


def without_scheduler(metrics: dict) -> dict:
    """metrics.json less what names the execution (one_pass: a walk per order on Dask) and the checksum of a model
    whose bits may differ (ridge, compared apart)."""
    return {k: without_scheduler(v) if isinstance(v, dict) else v for k, v in metrics.items()
            if k not in ("scheduler", "dask_address", "workers", "one_pass", "model_checksum")}


def flat(values: Any) -> list[float]:
    """Nested lists (ragged too) of numbers, in order."""
    return [x for v in values for x in flat(v)] if isinstance(values, list) else [float(values)]


def dask_check(tmp: Path, seed: int, head: str, address: str) -> list[str]:
    case, flags = dask_flags(seed, head)
    data, rng = make_data(case), np.random.default_rng([24, seed])
    S = write(tmp / "s.zarr", data, list(range(case.n_classes)), list(range(data.y.size)), rng, False)
    local = run("--features", S, "--out", tmp / "local", *flags)
    dask = run("--features", S, "--out", tmp / "dask", *flags, "--scheduler", "dask", "--dask-address", address)
    files = [(tmp / run_ / "model.safetensors").read_bytes() for run_ in ("local", "dask")]
    if head != "ridge":  # docs/dask.md: a head's outputs are the same bytes as a local run
        problems = [] if files[0] == files[1] else ["model.safetensors differs"]
        texts = [(tmp / run_ / "metrics.json").read_text() for run_ in ("local", "dask")]
        if texts[0] != texts[1] and without_scheduler(local) != without_scheduler(dask):
            problems.append("metrics.json differs")
        return problems
    # ridge: the metrics equal (gamma_search's criterion values come from the sums: to rounding), W, G and Q within
    # 1e-9 (float64; float32: the refusal bound, 1%)
    searches = [run_.pop("gamma_search", {}) for run_ in (local, dask)]
    problems = [] if without_scheduler(local) == without_scheduler(dask) or "--dtype" in flags else [
        f"metrics differ: {sorted(k for k in local if local[k] != dask.get(k))}"]
    values = [np.asarray(flat(search.pop("values", [])), dtype=float) for search in searches]
    if searches[0] != searches[1] or not np.allclose(values[0], values[1], rtol=1e-9, atol=0):
        problems.append(f"gamma_search differs: {searches}, {values}")
    return problems + same_model(tmp / "local" / "model.safetensors", tmp / "dask" / "model.safetensors", case)


SLOW = pytest.mark.slow
DASK_CASES = [pytest.param(seed, HEADS[seed % len(HEADS)], marks=() if seed < 107 else SLOW) for seed in range(100, 121)]


@pytest.mark.parametrize("seed,head", DASK_CASES)
def test_dask_equals_local(tmp_path, threads_cluster, seed, head):
    problems = dask_check(tmp_path, seed, head, threads_cluster.scheduler_address)
    assert not problems, f"seed {seed} {head}: " + "; ".join(problems)


@pytest.mark.parametrize("seed", [pytest.param(seed, marks=() if seed < 202 else SLOW) for seed in range(200, 208)])
def test_a_continuation_on_dask_equals_one_run(tmp_path, threads_cluster, seed):
    """docs/deploy.md: --scheduler dask continues ridge too (the sums add), to the same bound."""
    case = draw_case(seed, "ridge")
    if case.fusion:  # read-time fusion runs in one process (docs/dask.md)
        i = case.flags.index("--fusion")
        case.flags, case.fusion = case.flags[:i] + case.flags[i + 2:], False
    problems = continuation_check(tmp_path, case, "--scheduler", "dask", "--dask-address", threads_cluster.scheduler_address)
    assert not problems, f"{case}: " + "; ".join(problems)


# --- the Python estimators ----------------------------------------------------------------------------------------
def api_tasks(seed: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Random tasks of rows (classes disjoint, random sizes) in the head's space, and test rows."""
    rng = np.random.default_rng([26, seed])
    C, d = int(rng.integers(3, 8)), int(rng.integers(4, 20))
    centres = rng.normal(size=(C, d)) * 2
    order, T = rng.permutation(C), int(rng.integers(2, C + 1))
    tasks = []
    for classes in np.array_split(order, T):
        y = rng.permutation(np.repeat(classes, rng.integers(3, 12, classes.size)))
        tasks.append((np.tanh(centres[y] + rng.normal(size=(y.size, d))), y))
    return tasks, np.tanh(rng.normal(size=(20, d)) * 2)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("engine,dtype,gamma", [("gram", "float64", 0.5), ("rls", "float64", 2.0),
                                                ("gram", "float32", 20.0), ("gram", "float64", "auto")])
def test_analytic_classifier_saved_and_continued_equals_one_fit(tmp_path, seed, engine, dtype, gamma):
    """docs/python-api.md: load, partial_fit and save lose nothing; partial_fit is exact over every row so far."""
    from foal_pipe import AnalyticClassifier

    tasks, test = api_tasks(seed)
    k = int(np.random.default_rng(seed).integers(1, len(tasks)))
    kw = dict(engine=engine, dtype=dtype, gamma=gamma) | ({"gamma_grid": [0.1, 1, 10]} if gamma == "auto" else {})
    whole = AnalyticClassifier(**kw)
    for X, y in tasks:
        whole.partial_fit(X, y)
    first = AnalyticClassifier(**kw)
    for X, y in tasks[:k]:
        first.partial_fit(X, y)
    first.save(tmp_path / "m.safetensors")
    again = AnalyticClassifier.load(tmp_path / "m.safetensors")
    for X, y in tasks[k:]:
        again.partial_fit(X, y)
    assert again.classes_.tolist() == whole.classes_.tolist() and again.gamma_ == whole.gamma_
    scale = np.abs(whole.weights_).max()
    assert np.abs(again.weights_ - whole.weights_).max() <= (1e-5 if dtype == "float32" else 1e-12) * scale
    np.testing.assert_array_equal(again.predict(test), whole.predict(test))
    if gamma != "auto":
        X, y = np.concatenate([t[0] for t in tasks]), np.concatenate([t[1] for t in tasks])
        Y = (y[:, None] == whole.classes_[None]).astype(float)
        W = np.linalg.solve(X.T @ X + gamma * np.eye(X.shape[1]), X.T @ Y)
        assert np.abs(again.weights_ - W).max() <= (1e-4 if dtype == "float32" else 1e-9) * np.abs(W).max()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("head", HEADS[1:])
def test_a_head_estimator_pickled_between_tasks_continues_bit_for_bit(seed, head):
    """docs/python-api.md: a head pickles as its model-file tensors, and partial_fit (one task a call) continues it:
    pickled after task k and given the rest, it equals the one that was never pickled, bit for bit; the heads whose
    model has no order (all but dual) equal ``fit`` on every row to rounding."""
    import pickle

    from foal_pipe import head_classifier

    tasks, test = api_tasks(seed)
    k = int(np.random.default_rng(seed).integers(1, len(tasks)))
    options = {"fecam": {"shrinkage": 0.5, "shrinkage_offdiag": 0.2}, "dual": {"gamma": 0.5, "batch_size": 4},
               "balanced": {"gamma": 0.5}, "slda": {"shrinkage": "oas"}}.get(head, {})
    whole, first = head_classifier(head, **options), head_classifier(head, **options)
    for X, y in tasks:
        whole.partial_fit(X, y)
    for X, y in tasks[:k]:
        first.partial_fit(X, y)
    first.class_scores(test)  # solved, as a saved one is
    again = pickle.loads(pickle.dumps(first))
    for X, y in tasks[k:]:
        again.partial_fit(X, y)
    np.testing.assert_array_equal(again.class_scores(test), whole.class_scores(test))
    if head != "dual":
        once = head_classifier(head, **options).fit(np.concatenate([t[0] for t in tasks]),
                                                     np.concatenate([t[1] for t in tasks]))
        np.testing.assert_allclose(again.class_scores(test), once.class_scores(test), rtol=1e-9, atol=1e-9)
