"""The import graph of foal_pipe has no cycle and runs down the layers (:data:`LAYERS`), counting imports inside
functions and TYPE_CHECKING blocks too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import build_store, written_copy

PACKAGE = Path(__file__).resolve().parents[1] / "foal_pipe"
#: foal_pipe's packages and top-level modules, bottom first. A module imports its own package and the layers
#: below its own, never a layer above nor a sibling of its layer (siblings stay independent: ``datasets`` makes
#: rows without the store's Zarr, the heads solve without either). ``foal_pipe`` itself is the facade: it
#: re-exports the public names and nothing imports it.
LAYERS = (
    ("errors", "progress", "lazy", "version", "cupyenv", "blasenv", "durable"),  # no foal_pipe imports but errors
    ("core", "io", "memory", "cluster"),  # the maths (array API, no scikit-learn), files, memory, the Dask client
    ("datasets", "store", "heads"),  # image sources, the feature store, the heads over statistics
    ("encoders",),
    ("extract",),
    ("model",),  # the scikit-learn estimators, the model file, deployment
    ("protocol",),  # the walks, the configs and the records
    ("report",),
    ("cli",),
    ("foal_pipe",),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """foal_pipe modules that ``path`` imports anywhere (module level, functions, TYPE_CHECKING blocks)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from foal_pipe import extract` names a module; `from x import f` a member
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
    return {name for name in found if name in modules}


def layer_of(module: str) -> str:
    """The layer table's name for a module: its top-level package or module under foal_pipe, or the facade."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import that runs up the layers or across to a sibling, as ``importer -> imported``."""
    rank = {name: i for i, names in enumerate(layers) for name in names}
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if layer_of(module) != layer_of(target) and rank[layer_of(target)] >= rank[layer_of(module)])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_import_graph_has_no_cycle():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = {module_name(f): imports(f, modules) - {module_name(f)} for f in files}
    rls, gram = graph["foal_pipe.protocol.learners.rls"], graph["foal_pipe.protocol.learners.gram"]
    assert rls >= {"foal_pipe.core.engines", "foal_pipe.model.ridgemodel"}  # the parser sees imports
    assert "foal_pipe.protocol.distributed" in gram  # ... also those inside functions
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_imports_run_down_the_layers():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    assert {layer_of(m) for m in modules} == {name for names in LAYERS for name in names}, "add new packages to LAYERS"
    graph = {module_name(f): imports(f, modules) - {module_name(f)} for f in files}
    assert "foal_pipe.store.blockfusion" in graph["foal_pipe.extract.spec"]  # the graph holds cross-layer imports
    assert layer_violations(graph, LAYERS) == []


def test_layer_check_finds_upward_and_sibling_imports():
    layers = (("errors",), ("core", "io"), ("store",), ("foal_pipe",))
    graph = {"foal_pipe.store.meta": {"foal_pipe.io", "foal_pipe.errors", "foal_pipe.store.read"},
             "foal_pipe.core.linalg": {"foal_pipe.io"}, "foal_pipe.io": {"foal_pipe.store"},
             "foal_pipe.errors": {"foal_pipe"}, "foal_pipe": {"foal_pipe.store.meta"}}
    assert layer_violations(graph, layers) == ["foal_pipe.core.linalg -> foal_pipe.io", "foal_pipe.errors -> foal_pipe",
                                               "foal_pipe.io -> foal_pipe.store"]


def test_core_imports_no_scikit_learn():
    """The maths runs without scikit-learn: its estimators (:mod:`foal_pipe.model`) wrap it."""
    found = {path.name for path in (PACKAGE / "core").glob("*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
             for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
             if name.split(".")[0] == "sklearn"}
    assert found == set()


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_the_cli_starts_without_the_heavy_modules():
    """`foal-pipe --help` imports no scikit-learn, SciPy, zarr, matplotlib or torch: they load with the commands
    that use them (benchmarks/cli_startup_bench.py measures the start-up time)."""
    code = ("import sys; from foal_pipe.cli import app; app(['--help'], standalone_mode=False); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy', 'zarr', 'matplotlib', 'torch'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("args", [["learn"], ["learn", "--gamma", "auto"], ["learn", "--engine", "rls"],
                                  ["learn", "--eval-every", "150"], ["learn", "--gamma", "auto", "--eval-every", "150"],
                                  ["learn", "--engine", "rls", "--eval-every", "150"], ["sweep"], ["sweep", "--no-loo"]],
                         ids=" ".join)
def test_learn_and_sweep_with_ridge_run_without_scikit_learn(tmp_path, args):
    """Ridge's `learn` and `sweep` solve through the engines and write the model file through
    :class:`~foal_pipe.model.ridgemodel.RidgeModel` and the projection through
    :class:`~foal_pipe.core.expansion.Expansion`: scikit-learn loads with the Python API's estimators, not with
    these commands."""
    store = build_store(tmp_path / "blobs.zarr")
    out = tmp_path / "out"
    code = ("import sys; from foal_pipe.cli import app; app(sys.argv[1:], standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    proc = subprocess.run([sys.executable, "-c", code, *args, "--features", str(store), "--out", str(out), "--tasks", "3",
                           "--projection-dim", "32"], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert (out / ("model.safetensors" if args[0] == "learn" else "sweep.json")).is_file()
    assert proc.stdout.splitlines()[-1] == "[]"


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    """A store and two runs of it: ridge (gamma auto, so predict reads a grid) and the ncm head."""
    from foal_pipe.cli import app

    root = tmp_path_factory.mktemp("deploy")
    store = written_copy(build_store(root / "blobs.zarr"), root / "current.zarr")
    written_copy(build_store(root / "more.zarr", seed=1), root / "new.zarr")  # new rows to continue on
    for name, options in {"ridge": ["--gamma", "auto", "--select", "gcv", "--projection-dim", "32"],
                          "ncm": ["--head", "ncm"]}.items():
        app(["learn", "--features", str(store), "--out", str(root / name), "--tasks", "3", *options],
            standalone_mode=False)
    return store, root


@pytest.mark.parametrize("head", ["ridge", "ncm"])
@pytest.mark.parametrize("command", ["predict", "evaluate", "learn --init-model"])
def test_predict_evaluate_and_continue_run_without_scikit_learn(saved_runs, tmp_path, command, head):
    """`predict`, `evaluate` and `learn --init-model` load a model file as a
    :class:`~foal_pipe.model.ridgemodel.SavedRidge` (or a head's classifier) and an
    :class:`~foal_pipe.core.expansion.Expansion`: an engineer's repeated `predict` starts without scikit-learn."""
    store, root = saved_runs
    model = root / head / "model.safetensors"
    out = tmp_path / "out"
    args = {"predict": ["predict", "--model", str(model), "--features", str(store), "--out", str(tmp_path / "p.csv")],
            "evaluate": ["evaluate", "--run", str(root / head), "--out", str(out)],
            "learn --init-model": ["learn", "--init-model", str(model), "--features", str(root / "new.zarr"), "--out", str(out),
                                   "--tasks", "2"]}[command]
    code = ("import sys; from foal_pipe.cli import app; app(sys.argv[1:], standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p.csv").is_file() if command == "predict" else out.is_dir()
    assert proc.stdout.splitlines()[-1] == "[]"


def test_no_module_is_over_500_lines():
    """The house rule: small modules, each holding one thing (a module near the limit is split by what it holds)."""
    lengths = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
               for path in sorted(PACKAGE.rglob("*.py"))}
    assert lengths["protocol/walk.py"] > 0 and len(lengths) > 50  # it sees the package
    assert {name: n for name, n in lengths.items() if n > 500} == {}
