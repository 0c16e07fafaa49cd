"""Routes to the same answer agree, over random small stores and options: `sweep` against one `learn` per gamma, head,
order and fusion; sweep's `best_gamma` against the argmax the docs define over its recorded criteria; `learn --gamma
auto` against sweep's refined selection; `table` against its separate `learn`s and its cells against their runs;
`evaluate --run` against metrics.json and against the saved model's own predictions.

docs/learn.md (Exactness; sweep): every gamma's test numbers equal `learn --gamma G`, except at exact score ties; a
tie would show as a mismatch here and is checked by hand, so no tolerance is allowed on an accuracy matrix.
docs/results-table.md: each table run is exactly the separate `learn --head H --order-seed S --tasks T`."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import blob_store, invoke
from safetensors.numpy import load_file

from foal_pipe.store import open_store

FEATURE_HEADS = ("ncm", "slda", "fecam", "cosine")
ACCURACY = ("accuracy_matrix", "A_steps", "A_avg", "A_last", "F", "F_published_code")
GRID = (1e-3, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
N_BLOCKS = 3


def random_store(path: Path, rng: np.random.Generator, blocks: bool = False) -> Path:
    """Gaussian blobs (:func:`helpers.blob_store`), 3-7 classes of uneven sizes, 6-20 features, float16 or float32;
    ``blocks``: 3 per-block tokens and a layer norm for ``--fusion(s)``."""
    n_classes, dim = int(rng.integers(3, 8)), int(rng.integers(6, 21))
    dtype = str(rng.choice(["float16", "float32"]))
    weights = rng.dirichlet(np.full(n_classes, 0.8))
    centres = rng.normal(size=(n_classes, dim)) * rng.uniform(0.4, 1.5)
    return blob_store(path, rng, centres, weights, dtype, (80, 220), (40, 100), (16, 90), blocks, N_BLOCKS)


def n_classes_of(store: Path) -> int:
    return len(open_store(store).classes)


def ok(*args: Any) -> None:
    """Run a command that must succeed."""
    result = invoke(*args)
    assert result.exit_code == 0, f"{' '.join(map(str, args))}\n{result.output}"


def learned(store: Path, out: Path, *args: Any) -> dict:
    ok("learn", "--features", store, "--out", out, "--backend", "numpy", *args)
    return json.loads((out / "metrics.json").read_text())


def assert_same_accuracy(got: dict, expected: dict, where: str, keys: tuple[str, ...] = ACCURACY) -> None:
    """The same test numbers to the bit (docs/learn.md: every route to the same weights predicts alike)."""
    for key in (k for k in keys if k in got or k in expected):  # F_published_code: disjoint streams only
        assert got.get(key) == expected.get(key), f"{where}: {key} {got.get(key)} != {expected.get(key)}"


# --- the selection rule, written from docs/gamma.md and docs/learn.md ------------------------------------------
LARGER = {"loo": False, "gcv": False, "loo_accuracy": True, "test": True}
#: How far one criterion value may move by route (docs/learn.md, sweep: GCV within 0.1% of the exact value, LOO MSE
#: about 1e-6 near the gamma floor; LOO accuracy is a count of rows).
ROUTE_RTOL = {"gcv": 1e-3, "loo": 1e-6, "loo_accuracy": 1e-12}
KEY = {"loo": "loo_mse", "gcv": "gcv", "loo_accuracy": "loo_accuracy", "test": "A_avg"}


def criterion(result: dict, name: str) -> float | None:
    value = result[KEY[name]]
    return value[-1] if isinstance(value, list) else value


def rank(r: dict, select: str) -> tuple[float, float, float]:
    """Larger is preferred at the last task boundary: least LOO MSE or GCV, most LOO accuracy (of equals the least LOO
    MSE) or test A_avg; of equals the smallest gamma. Null (infinite) values never win."""
    v = criterion(r, select)
    primary = -np.inf if v is None else (v if LARGER[select] else -v)
    return (primary, -(criterion(r, "loo") or np.inf) if select == "loo_accuracy" else 0.0, -r["gamma"])


def best_of(results: list[dict], select: str) -> float:
    return max(results, key=lambda r: rank(r, select))["gamma"]


# --- sweep against learn ----------------------------------------------------------------------------------------
@dataclass
class SweepCase:
    tasks: int
    D: int
    gammas: list[float]
    orders: list[int]
    seed: int = 0
    batch: int = 10
    activation: str | None = None
    init: str = "uniform"
    select: str | None = None
    loo: str = "default"  # default | none | sample (a --loo-sample below the rows seen) | exact
    per_decade: int = 8
    heads: list[str] = field(default_factory=list)
    fusions: list[str] = field(default_factory=list)
    no_fusion_norm: bool = False
    stream: list[str] = field(default_factory=list)  # --drop-last / --no-mask-unseen / --stream si-blurry ...
    class_order: list[list[int]] = field(default_factory=list)  # written to a file, --class-order FILE
    engine: str = "gram"  # learn's engine on the fixed-gamma route (sweep sums Gram statistics)
    order_file: str = ""

    def common(self) -> list[str]:
        """What sweep and learn share (the stream, the projection)."""
        out = ["--tasks", str(self.tasks), "--projection-dim", str(self.D), "--batch-size", str(self.batch),
               "--seed", str(self.seed), *self.stream]
        out += ["--activation", self.activation] if self.activation else []
        out += ["--projection-init", self.init] if self.init != "uniform" else []
        out += ["--class-order", self.order_file] if self.class_order else []
        return out

    def per_decade_args(self) -> list[str]:
        """``--per-decade``, refused over one gamma (no range to refine)."""
        return ["--per-decade", str(self.per_decade)] if len(self.gammas) > 1 else []

    def loo_args(self) -> list[str]:
        return {"none": [], "default": [], "sample": ["--loo-sample", "25"], "exact": ["--loo-sample", "0"]}[self.loo]

    def sweep_args(self) -> list[str]:
        out = [*self.common(), "--gammas", ",".join(map(repr, self.gammas)), *self.per_decade_args(),
               *self.loo_args(), "--backend", "numpy"]
        seeds = ",".join(map(str, self.orders))
        out += ["--order-seeds", seeds] if len(self.orders) > 1 else ["--order-seed", seeds]
        out += ["--no-loo"] if self.loo == "none" else []
        out += ["--select", self.select] if self.select else []
        out += ["--heads", ",".join(self.heads)] if self.heads else []
        out += ["--fusions", ",".join(self.fusions)] if self.fusions else []
        out += ["--no-fusion-norm"] if self.no_fusion_norm else []
        return out

    def fusion_args(self, fusion: str | None) -> list[str]:
        return [] if fusion is None else ["--fusion", fusion, *(["--no-fusion-norm"] if self.no_fusion_norm else [])]


def random_sweep_case(rng: np.random.Generator, n_classes: int, blocks: bool) -> SweepCase:
    D = int(rng.choice([0, 8, 16, 30]))
    case = SweepCase(tasks=int(rng.integers(1, min(n_classes, 4) + 1)), D=D,
                     gammas=[float(g) for g in rng.permutation(rng.choice(GRID, int(rng.integers(2, 6)), replace=False))],
                     orders=[int(s) for s in rng.choice(20, int(rng.choice([1, 1, 2, 3])), replace=False)],
                     seed=int(rng.integers(0, 30)), batch=int(rng.choice([1, 7, 10, 32])),
                     per_decade=int(rng.choice([0, 2, 8])))
    if D and rng.random() < 0.5:
        case.activation = str(rng.choice(["sigmoid", "relu", "identity"]))
    if D and rng.random() < 0.2:
        case.init = "normal"
    case.loo = str(rng.choice(["default", "none", "sample", "exact"]))
    choices = ["gcv", "test"] if case.loo == "none" else ["loo", "gcv", "loo_accuracy", "test"]
    case.select = str(rng.choice(choices)) if rng.random() < 0.7 else None
    if D and rng.random() < 0.5:
        case.heads = ["ridge", *[str(h) for h in rng.choice(["ncm", "slda", "cosine", "balanced", "dual", "fecam"],
                                                            int(rng.integers(1, 4)), replace=False)]]
    extra = rng.random()
    if extra < 0.15:
        case.stream, case.heads = ["--no-mask-unseen"], []  # the other heads predict among the classes seen
    elif extra < 0.25:
        case.stream, case.orders = ["--stream", "si-blurry"], case.orders[:1]
        case.heads = [h for h in case.heads if h != "fecam"]
    elif extra < 0.35 and n_classes % case.tasks:
        case.stream = ["--drop-remainder"]
    elif extra < 0.45:
        case.stream = ["--drop-last"]
    elif extra < 0.55:
        chosen = rng.permutation(n_classes)[:int(rng.integers(max(case.tasks, 2), n_classes + 1))]
        case.class_order = [[int(c) for c in part] for part in np.array_split(chosen, case.tasks)]
        case.orders = case.orders[:1]
    elif extra < 0.65:
        case.stream, case.gammas = ["--dtype", "float32"], [g for g in case.gammas if g >= 1] or [1.0, 10.0]
        case.heads = [h for h in case.heads if h not in ("balanced", "dual")]
    if blocks and rng.random() < 0.5 and "si-blurry" not in case.stream:  # --fusions: disjoint tasks, one class order
        case.fusions = [str(f) for f in rng.choice(["mean-cls", "last", "mean:1-2", "block:2", "mean:2-3"],
                                                   int(rng.integers(2, 4)), replace=False)]
        case.no_fusion_norm, case.orders = bool(rng.random() < 0.3), case.orders[:1]
    case.engine = "rls" if rng.random() < 0.25 and "float32" not in case.stream else "gram"
    if blocks and not case.fusions and rng.random() < 0.5:
        case.stream += ["--fusion", str(rng.choice(["last", "mean:1-2", "block:3"]))]
    return case


def head_args(case: SweepCase, head: str, gamma: float) -> list[str]:
    """`learn --head H` as sweep --heads runs it (docs/heads.md): ncm, slda, fecam, cosine on the store's features;
    balanced on the activations, dual on the projected rows, both at ridge's gamma."""
    if head in FEATURE_HEADS:
        return ["--head", head]
    out = ["--head", head, "--gamma", repr(gamma)]
    return out + (["--activation", case.activation] if case.activation and head == "balanced" else [])


def common_without_projection(case: SweepCase, head: str) -> list[str]:
    """The shared options, less the projection's for a head on the store's features (it would move the head onto
    the activations) and less --activation for dual (which takes the projected rows)."""
    skip = {"--projection-dim", "--activation", "--projection-init", "--seed"} if head in FEATURE_HEADS else {"--activation"}
    args = case.common()
    return [a for i, a in enumerate(args) if a not in skip and (i == 0 or args[i - 1] not in skip)]


def check_selection(report: dict, select: str, where: str) -> None:
    """best_gamma and best_gamma_test are the argmax docs/gamma.md defines over the recorded results."""
    results = report["results"]
    assert report["best_gamma_test"] == best_of(results, "test"), f"{where}: best_gamma_test"
    if "orders" in report and select != "test":
        assert report["best_gamma"] == report["orders"][0]["best_gamma"], f"{where}: best_gamma is the first order's"
    else:
        assert report["best_gamma"] == best_of(results, select), f"{where}: best_gamma by {select}"
    for i, order in enumerate(report.get("orders") or []):
        assert order["best_gamma"] == best_of(order["results"], select), f"{where}: orders[{i}].best_gamma"


def check_one_sweep(store: Path, root: Path, case: SweepCase, report: dict, fusion: str | None, tasks: list) -> None:
    """One fusion's sweep (or the sweep of the store's features) against learn, route by route."""
    where = f"sweep {' '.join(case.sweep_args())} (fusion {fusion})"
    select = case.select or ("gcv" if case.loo == "none" else "loo")
    check_selection(report, select, where)
    orders = report.get("orders") or [{"order_seed": case.orders[0], "results": report["results"],
                                       "best_gamma": report["best_gamma"], "heads": report.get("heads")}]
    tag = fusion.replace(":", "_") if fusion else "features"
    for order in orders:
        seed = order["order_seed"]
        by_gamma = {r["gamma"]: r for r in order["results"]}
        for g in case.gammas:  # 1. each gamma's numbers are learn --gamma G's
            metrics = learned(store, root / f"l-{tag}-{seed}-{g}", *case.common(), *case.fusion_args(fusion),
                              "--gamma", repr(g), "--order-seed", str(seed), "--engine", case.engine)
            assert_same_accuracy(by_gamma[g], metrics, f"{where}, order {seed}, gamma {g}")
            assert metrics["tasks"] == order.get("tasks", tasks), where
        heads = order.get("heads") or {}
        if heads:  # ridge's head is its chosen gamma's result; the others are learn --head H
            assert_same_accuracy(heads["ridge"], by_gamma[order["best_gamma"]], f"{where}: ridge head, order {seed}")
        # docs/heads.md: balanced and dual run at ridge's choice on the training rows, never the test oracle's
        training = select if select != "test" else ("gcv" if case.loo == "none" else "loo")
        for head in (h for h in heads if h != "ridge"):
            args = [*common_without_projection(case, head), *case.fusion_args(fusion),
                    *head_args(case, head, best_of(order["results"], training)), "--order-seed", str(seed)]
            metrics = learned(store, root / f"h-{tag}-{seed}-{head}", *args)
            assert_same_accuracy(heads[head], metrics, f"{where}: head {head}, order {seed}; learn {' '.join(args)}")
    if len(case.orders) > 1:  # the means over the orders are learn --order-seeds', and the orders' means
        check_means(report, where)
        g = case.gammas[0]
        metrics = learned(store, root / f"m-{tag}", *case.common(), *case.fusion_args(fusion), "--gamma", repr(g),
                          "--order-seeds", ",".join(map(str, case.orders)))
        result = next(r for r in report["results"] if r["gamma"] == g)
        assert_same_accuracy(result, metrics, f"{where}: mean over orders at gamma {g}", ("A_avg", "A_last", "F"))
    check_auto(store, root / f"auto-{tag}", case, report, fusion, where)


def check_means(report: dict, where: str) -> None:
    """docs/orders.md: each gamma's and each head's top-level numbers are the mean (std: population) over the orders,
    the accuracy matrix the position-wise mean."""
    orders = report["orders"]
    pairs = [(r, [next(x for x in o["results"] if x["gamma"] == r["gamma"]) for o in orders]) for r in report["results"]]
    pairs += [(h, [o["heads"][name] for o in orders]) for name, h in (report.get("heads") or {}).items()]
    for top, each in pairs:
        for key in ("A_avg", "A_last", "F"):
            values = [e[key] for e in each]
            assert top[key] == pytest.approx(float(np.mean(values)), rel=1e-14, abs=1e-15), f"{where}: mean {key}"
            assert top["std"][key] == pytest.approx(float(np.std(values)), rel=1e-10, abs=1e-14), f"{where}: std {key}"
        for i, row in enumerate(top["accuracy_matrix"]):
            expected = np.mean([e["accuracy_matrix"][i] for e in each], axis=0)
            np.testing.assert_allclose(row, expected, rtol=1e-14, atol=1e-15, err_msg=f"{where}: mean matrix row {i}")


def check_auto(store: Path, root: Path, case: SweepCase, report: dict, fusion: str | None, where: str) -> None:
    """3. learn --gamma auto --select C on the sweep's grid chooses sweep's selections[C] (the first order's) and
    scores its models alike."""
    grid = ",".join(map(repr, case.gammas))
    for selection in report.get("selections") or []:
        name = selection["criterion"]
        args = [*case.common(), *case.fusion_args(fusion), "--gamma", "auto", "--select", name, "--gamma-grid", grid,
                *case.per_decade_args(), "--order-seed", str(case.orders[0])]
        args += case.loo_args() if name != "gcv" else []
        metrics = learned(store, root / name, *args)
        search = metrics["gamma_search"]
        said = f"{where}: selections[{name}] against learn {' '.join(args)}"
        for b, (mine, theirs) in enumerate(zip(metrics["gammas_selected"], selection["gammas_selected"], strict=True)):
            if mine != theirs and name == "gcv":  # GCV tied to its rounding (one class seen): either may win
                i, j = search["gammas"].index(mine), search["gammas"].index(theirs)
                tied = [abs(v[b][i] - v[b][j]) <= 1e-12 * abs(v[b][j]) for v in (search["values"], selection["values"])]
                assert all(tied), f"{said}: boundary {b + 1} chose {mine} and {theirs}"
                continue
            assert mine == theirs, f"{said}: boundary {b + 1} chose {mine} and {theirs}"
        assert search["gammas"] == selection["gammas"], said
        assert search.get("evaluated") == selection.get("evaluated"), said
        for mine, theirs in zip(search["values"], selection["values"], strict=True):
            np.testing.assert_allclose(np.array(mine, dtype=float), np.array(theirs, dtype=float), rtol=ROUTE_RTOL[name],
                                       err_msg=said)
        assert_same_accuracy(selection, metrics, said, ("accuracy_matrix", "A_avg", "A_last", "F"))


def check_grid_values(report: dict, where: str) -> None:
    """The per-gamma criteria in `results` are the selections' values at the grid's own points."""
    for selection in report.get("selections") or []:
        key = KEY[selection["criterion"]]
        every = [range(len(selection["gammas"]))] * len(selection["values"])  # older files: every point evaluated
        for b, (points, values) in enumerate(zip(selection.get("evaluated") or every, selection["values"], strict=True)):
            at = dict(zip([selection["gammas"][i] for i in points], values, strict=True))
            for result in report["results"]:
                if result["gamma"] in at and result[key] is not None and at[result["gamma"]] is not None:
                    assert result[key][b] == pytest.approx(at[result["gamma"]], rel=1e-12), \
                        f"{where}: {key} at gamma {result['gamma']}, boundary {b}"


def sweep_crosscheck(root: Path, rng: np.random.Generator) -> None:
    blocks = bool(rng.random() < 0.4)
    store = random_store(root / "s.zarr", rng, blocks)
    case = random_sweep_case(rng, n_classes_of(store), blocks)
    if case.class_order:
        case.order_file = str(root / "order.json")
        Path(case.order_file).write_text(json.dumps(case.class_order))
    where = f"sweep {' '.join(case.sweep_args())}"
    result = invoke("sweep", "--features", store, "--out", root / "sweep", *case.sweep_args())
    if result.exit_code == 1 and "--drop-last would drop all" in result.output:  # documented; learn refuses alike
        seed = result.output.split("class order seed ")[1].split(";")[0] if len(case.orders) > 1 else str(case.orders[0])
        again = invoke("learn", "--features", store, "--out", root / "refused", *case.common(), "--order-seed", seed,
                       "--gamma", repr(case.gammas[0]))
        assert again.exit_code == 1 and "--drop-last would drop all" in again.output, f"{where}\n{again.output}"
        assert not (root / "sweep").exists() and not (root / "refused").exists(), where
        return
    assert result.exit_code == 0, f"{where}\n{result.output}"
    report = json.loads((root / "sweep" / "sweep.json").read_text())
    check_grid_values(report, where)
    if not case.fusions:
        check_one_sweep(store, root, case, report, None, report["tasks"])
        return
    entries = {e["fusion"]: e for e in report["fusions"]}
    assert report["results"] == entries[report["fusion"]]["results"], where
    flat = [(e["fusion"], r) for e in report["fusions"] for r in e["results"]]
    select = case.select or ("gcv" if case.loo == "none" else "loo")
    for name, choice in ((select, report["best"]), ("test", report["best_test"])):  # of equals, the first fusion
        fusion, r = max(flat, key=lambda item: (*rank(item[1], name), -case.fusions.index(item[0])))
        assert (choice["fusion"], choice["gamma"]) == (fusion, r["gamma"]), f"{where}: best (fusion, gamma) by {name}"
    for fusion, entry in entries.items():
        check_one_sweep(store, root / fusion.replace(":", "_"), case, entry, fusion, report["tasks"])


@pytest.mark.parametrize("case", [c if c < 4 else pytest.param(c, marks=pytest.mark.slow) for c in range(50)])
def test_sweep_equals_learn_per_gamma_head_order_and_fusion(tmp_path, case):
    sweep_crosscheck(tmp_path, np.random.default_rng(5000 + case))


# --- table against learn ----------------------------------------------------------------------------------------
PROJECTED = ("ridge", "balanced", "dual")


def random_table(rng: np.random.Generator, root: Path) -> tuple[list[Path], list[str], dict[str, Any]]:
    """1-2 stores and a random table over them: heads, order seeds, task counts, gamma (auto by a criterion over a
    random grid, or a number), projection, leave-one-out sample, batch and stream."""
    stores = [random_store(root / f"s{k}.zarr", rng) for k in range(int(rng.integers(1, 3)))]
    fewest = min(n_classes_of(s) for s in stores)
    others = [str(h) for h in rng.choice(["ncm", "slda", "fecam", "cosine", "balanced", "dual"], int(rng.integers(0, 3)),
                                          replace=False)]
    auto = rng.random() < 0.7
    heads = ["ridge", *others] if auto or rng.random() < 0.6 else others or ["ncm"]
    t = {"heads": heads, "orders": [int(s) for s in rng.choice(30, int(rng.integers(1, 4)), replace=False)],
         "tasks": sorted({int(rng.integers(1, min(fewest, 4) + 1)) for _ in range(int(rng.integers(1, 3)))}),
         "gamma": "auto" if auto else repr(float(rng.choice(GRID[2:]))), "batch": int(rng.choice([1, 7, 10, 32])),
         "D": int(rng.choice([0, 8, 16, 30])), "seed": int(rng.integers(0, 30)), "activation": None,
         "select": str(rng.choice(["loo", "gcv", "loo_accuracy"])), "loo": str(rng.choice(["default", "25", "0"])),
         "grid": ",".join(map(repr, sorted(float(g) for g in rng.choice(GRID, int(rng.integers(2, 5)), replace=False)))),
         "stream": []}
    if t["D"] and rng.random() < 0.5:
        t["activation"] = str(rng.choice(["sigmoid", "relu", "identity"]))
    if rng.random() < 0.15 and "fecam" not in heads:
        t["stream"] = ["--stream", "si-blurry"]
        t["orders"] = t["orders"][:1]  # two orders may stream different numbers of tasks (refused)
    return stores, heads, t


def table_args(heads: list[str], t: dict[str, Any]) -> list[str]:
    out = ["--heads", ",".join(heads), "--order-seeds", ",".join(map(str, t["orders"])),
           "--tasks", ",".join(map(str, t["tasks"])), "--batch-size", str(t["batch"]), "--backend", "numpy", *t["stream"]]
    if any(h in PROJECTED for h in heads):  # --seed only where it draws a projection (else refused; both default 0)
        out += ["--projection-dim", str(t["D"]), *(["--seed", str(t["seed"])] if t["D"] else [])]
        out += ["--activation", t["activation"]] if t["activation"] and ({"ridge", "balanced"} & set(heads)) else []
    if any(h in ("ridge", "balanced", "dual") for h in heads):
        out += ["--gamma", t["gamma"]]
    if t["gamma"] == "auto" and "ridge" in heads:
        out += ["--select", t["select"], "--gamma-grid", t["grid"]]
        out += ["--loo-sample", t["loo"]] if t["loo"] != "default" and t["select"] != "gcv" else []
    return out


def learn_args_of(run: dict, t: dict[str, Any], ridge_gamma: float | None) -> list[str]:
    """The separate `learn` that a table run equals (docs/results-table.md)."""
    head = run["head"]
    out = ["--head", head, "--order-seed", str(run["order_seed"]), "--tasks", str(run["tasks"]),
           "--batch-size", str(t["batch"]), *t["stream"]]
    if head in PROJECTED:
        out += ["--projection-dim", str(t["D"]), *(["--seed", str(t["seed"])] if t["D"] else [])]
        out += ["--activation", t["activation"]] if t["activation"] and head != "dual" else []
    if head == "ridge":
        out += ["--gamma", t["gamma"]]
        if t["gamma"] == "auto":
            out += ["--select", t["select"], "--gamma-grid", t["grid"]]
            out += ["--loo-sample", t["loo"]] if t["loo"] != "default" and t["select"] != "gcv" else []
    elif head in PROJECTED:
        out += ["--gamma", repr(ridge_gamma) if t["gamma"] == "auto" else t["gamma"]]
    return out


def table_crosscheck(root: Path, rng: np.random.Generator) -> None:
    stores, heads, t = random_table(rng, root)
    args = [*(a for s in stores for a in ("--features", s)), *table_args(heads, t)]
    ok("table", "--out", root / "table", *args)
    table = json.loads((root / "table" / "table.json").read_text())
    where = f"table {' '.join(map(str, args))}"
    runs = table["runs"]
    assert len(runs) == len(stores) * len(heads) * len(t["tasks"]) * len(t["orders"]), where
    ridge = {(r["store"], r["tasks"], r["order_seed"]): r for r in runs if r["head"] == "ridge"}
    for k, run in enumerate(runs):  # every run is its separate learn's
        mine = ridge.get((run["store"], run["tasks"], run["order_seed"]))
        gamma = mine["options"]["gammas_selected"][-1] if mine and t["gamma"] == "auto" else None
        extra = learn_args_of(run, t, gamma)
        metrics = learned(Path(run["store"]), root / f"run{k}", *extra)
        said = f"{where}: run {k} ({run['store']}, {run['head']}); learn {' '.join(extra)}"
        assert_same_accuracy(run, metrics, said, ("accuracy_matrix", "A_avg", "A_last", "F"))
        if run["head"] == "ridge" and t["gamma"] == "auto":
            assert run["options"]["gammas_selected"] == metrics["gammas_selected"], said
    for cell in table["cells"]:  # every cell is the mean and population std of its runs
        mine = [r for r in runs if (r["store"], r["head"], r["tasks"]) == (cell["store"], cell["head"], cell["tasks"])]
        mine.sort(key=lambda r: t["orders"].index(r["order_seed"]))
        for key in ("A_avg", "A_last", "F"):
            values = [r[key] for r in mine]
            said = f"{where}: cell {cell['store']} {cell['head']} tasks {cell['tasks']} {key}"
            assert cell[key]["values"] == values, said
            if len(set(values)) == 1:  # docs/orders.md: equal orders give that score and a std of exactly 0
                assert (cell[key]["mean"], cell[key]["std"]) == (values[0], 0.0), said
            assert cell[key]["mean"] == pytest.approx(float(np.mean(values)), rel=1e-14, abs=1e-15), said
            assert cell[key]["std"] == pytest.approx(float(np.std(values)), rel=1e-10, abs=1e-14), said


@pytest.mark.parametrize("case", [c if c < 2 else pytest.param(c, marks=pytest.mark.slow) for c in range(20)])
def test_table_equals_its_separate_learns(tmp_path, case):
    table_crosscheck(tmp_path, np.random.default_rng(7000 + case))


# --- evaluate against metrics.json and the model ----------------------------------------------------------------
ACT = {"sigmoid": lambda z: 1 / (1 + np.exp(-z)), "relu": lambda z: np.maximum(z, 0), "identity": lambda z: z}


def evaluate_crosscheck(root: Path, rng: np.random.Generator) -> None:
    """4. `evaluate --run`: scores.json is metrics.json's headline, the per-class counts sum to the last row of the
    (first order's) accuracy matrix, and for ridge they are the saved model's own argmax over its classes."""
    store = random_store(root / "s.zarr", rng)
    C = n_classes_of(store)
    head = str(rng.choice(["ridge", "ridge", "ncm", "slda", "cosine", "balanced"]))
    D = int(rng.choice([0, 8, 30])) if head == "ridge" else int(rng.choice([8, 30]))
    args = ["--head", head, "--tasks", str(int(rng.integers(1, min(C, 4) + 1))), "--seed", str(int(rng.integers(0, 30))),
            "--batch-size", str(int(rng.choice([1, 10, 32])))]
    if head in PROJECTED:
        args += ["--projection-dim", str(D), "--gamma", "auto" if head == "ridge" and rng.random() < 0.4 else "0.3"]
        args += ["--activation", str(rng.choice(["sigmoid", "relu", "identity"]))] if D and rng.random() < 0.5 else []
    orders = [int(s) for s in rng.choice(30, int(rng.choice([1, 2])), replace=False)]
    args += ["--order-seeds", ",".join(map(str, orders))] if len(orders) > 1 else ["--order-seed", str(orders[0])]
    metrics = learned(store, root / "run", *args)
    ok("evaluate", "--run", root / "run", "--no-plots")
    where = f"learn {' '.join(args)}; evaluate --run"
    scores = json.loads((root / "run" / "eval" / "scores.json").read_text())
    for key in ("A_avg", "A_last", "F", "F_published_code"):
        assert scores[key] == metrics[key], f"{where}: scores.json {key}"
    first = metrics["orders"][0] if len(orders) > 1 else metrics
    with (root / "run" / "eval" / "class_accuracy.csv").open(newline="") as f:
        rows = {int(r["class"]): r for r in csv.DictReader(f)}
    for j, task in enumerate(first["tasks"]):
        correct, n = sum(int(rows[c]["correct"]) for c in task), sum(int(rows[c]["test_rows"]) for c in task)
        assert first["accuracy_matrix"][-1][j] == pytest.approx(correct / n, abs=1e-15), f"{where}: task {j + 1}"
    if head != "ridge":
        return
    tensors = load_file(str(root / "run" / "model.safetensors"))
    test = open_store(store).split("test")
    X, y = np.asarray(test.features[:], dtype=np.float64), np.asarray(test.labels[:])
    act = next((args[i + 1] for i, a in enumerate(args) if a == "--activation"), "sigmoid" if D else "identity")
    H = ACT[act](X @ tensors["projection"]) if "projection" in tensors else X
    scores_ = H @ tensors["W"]
    top = np.sort(scores_, axis=1)
    predicted = tensors["classes"][scores_.argmax(axis=1)]
    for c, row in rows.items():
        mask = y == c
        near = int((mask & (top[:, -1] - top[:, -2] <= 1e-9 * np.abs(top).max(axis=1))).sum())
        assert int(row["test_rows"]) == int(mask.sum()), f"{where}: class {c} rows"
        assert abs(int(row["correct"]) - int((predicted[mask] == c).sum())) <= near, f"{where}: class {c} correct"


@pytest.mark.parametrize("case", [c if c < 3 else pytest.param(c, marks=pytest.mark.slow)
                                  for c in range(10)])
def test_evaluate_agrees_with_metrics_and_the_model(tmp_path, case):
    evaluate_crosscheck(tmp_path, np.random.default_rng(9000 + case))
