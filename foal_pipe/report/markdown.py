"""``summary.md``: a run's settings, headline metrics (beside the paper's when comparable), its accuracy matrix,
how gamma was chosen, and the sweep. Only what the inputs hold: no dates or wall times, so the same run gives
the same text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from foal_pipe.core.metrics import SHOWN, capped, pct, summary_of
from foal_pipe.heads import HEADS
from foal_pipe.io.pathtext import path_text
from foal_pipe.protocol.criteria import CRITERIA, TRAINING_CRITERIA
from foal_pipe.protocol.schema import LearnMetrics, same_gamma
from foal_pipe.protocol.stream import counted
from foal_pipe.report.classes import ClassResults, task_classes
from foal_pipe.report.grouping import fusion_of
from foal_pipe.report.paper import GAMMAS, PAPER, PaperMatch, match_paper, recipe_notes
from foal_pipe.report.readers import Run
from foal_pipe.report.selection import criterion_text, has_criteria, last, result_at, sampled_rows, select

_LABELS = {"A_avg": "A_avg (%)", "A_last": "A_last (%)", "F": "F (%)", "F_published_code": "F, published code (%)",
           "A_auc": "A_auc (%)"}


#: What Markdown reads as markup in a name: a cell's ``|``, emphasis, code, links, HTML, and an underscore that is
#: not between letters or digits (intraword ones, as in ``aquarium_fish``, are text to GFM and are left as they are).
_MARKUP = re.compile(r"[\\`*~|\[\]<>&$]|_(?![^\W_])|(?<![^\W_])_")


def md(text: Any) -> str:
    """``text`` (a class or run name) as Markdown text, table cells included: its markup characters escaped, a line
    break as a space (it would end a table row)."""
    return _MARKUP.sub(lambda match: "\\" + match.group(), " ".join(str(text).splitlines()))


def code(text: Any) -> str:
    """``text`` (a path or name) as inline code, whatever backticks it holds: fenced by one more backtick than its
    longest run of them (CommonMark), with a space inside where it starts or ends with one; a line break as a space.
    A path is its text from its bytes (:func:`path_text`), the same in every locale."""
    text = " ".join((path_text(text) if isinstance(text, os.PathLike) else str(text)).splitlines())
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _code_cell(text: Any) -> str:
    """``text`` (a path) as inline code in a table cell: GFM splits a row at a ``|`` even inside code, unless escaped."""
    return code(text).replace("|", "\\|")


def _or(value: Any, absent: Any = "?") -> Any:
    """A recorded value, or what stands for one the run does not record."""
    return absent if value is None else value


def gamma_text(metrics: LearnMetrics) -> str:
    """A run's gamma: the number, or ``auto`` (a gamma chosen at every task boundary); a head's own gamma (balanced,
    dual), ``-`` for a head without one."""
    if metrics.head is not None:
        gamma = (metrics.head_options or {}).get("gamma")
        return "-" if gamma is None else f"{gamma:g}" if isinstance(gamma, (int, float)) else str(gamma)
    gamma = _or(metrics.gamma)
    return f"{gamma:g}" if isinstance(gamma, (int, float)) else str(gamma)


def head_text(metrics: LearnMetrics) -> str:
    """``learn --head``: the head and its options but gamma (shown on its own), e.g. ``head slda (shrinkage 0.1)``."""
    options = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in (metrics.head_options or {}).items() if k != "gamma")
    return f"head {metrics.head}" + (f" ({options})" if options else "")


def describe(metrics: LearnMetrics) -> str:
    """One line of the settings that produced a run (a head's run: the head and its options; its gamma, or none)."""
    m = metrics
    enc = m.encoder or {}
    fused = fusion_of(enc)  # fused when read: with ", no norm" under --no-fusion-norm, as `summary` names it
    enc_bits = ", ".join(f"{k} {fused if k == 'fusion' and fused else enc[k]}" for k in ("fusion", "image_size", "normalize")
                         if k in enc)
    n_tasks = _or(m.n_tasks, len(m.tasks or []) or len(m.accuracy_matrix))
    head = m.head is not None
    parts = [
        f"encoder {code(enc.get('name', '?'))}" + (f" ({enc_bits})" if enc_bits else ""),
        counted(n_tasks, "task"),
        *([head_text(m)] if head else []),
        "the store's features (no projection)" if head and m.projection_dim == 0 else f"D={_or(m.projection_dim)}",
        *([] if gamma_text(m) == "-" else [f"gamma={gamma_text(m)}"]),
        f"batch {_or(m.batch_size)}",
        # a continued run draws no projection: it keeps its model's, so it records no seed of its own
        "the continued model's projection" if m.seed is None and m.continuation is not None else f"seed {_or(m.seed)}",
        (f"{_or(m.dtype, '')} {_or(m.backend, '')}".strip() if head and m.engine is None
         else f"engine {_or(m.engine)} {_or(m.dtype, '')} {_or(m.backend, '')}".rstrip()),
    ]
    if m.head is not None and m.head in HEADS and HEADS[m.head].space == "projected":  # dual: relu and tanh of h
        parts.append("the head's own activations")
    elif m.activation is not None:
        parts.append(f"activation {m.activation}")
    if m.n_train_seen is not None:
        parts.append(f"{m.n_train_seen} training samples")
    if m.stream is not None:
        parts.append(f"stream {m.stream} (disjoint ratio {_or(m.disjoint_ratio)}%, blurry ratio {_or(m.blurry_ratio)}%)")
    if m.anytime is not None:
        parts.append(f"evaluated every {m.anytime.eval_every} rows")
    return " · ".join(parts)


def _results(m: LearnMetrics, paper: PaperMatch | None) -> list[str]:
    compared = paper if paper is not None and paper.comparable else None
    if compared is not None:
        lines = [f"| metric | ours | paper ({compared.row.title}) | ours - paper |", "|---|---:|---:|---:|"]
    else:
        lines = ["| metric | ours |", "|---|---:|"]
    for key, label in _LABELS.items():
        ours = getattr(m, key)
        if ours is None:
            continue
        if compared is not None:
            ref = compared.row.metrics().get(key)
            ref_s = f"{100 * ref:.1f}" if ref is not None else "-"
            delta = f"{round(100 * (ours - ref), 1) or 0.0:+.1f}" if ref is not None else "-"  # no -0.0
            lines.append(f"| {label} | {pct(ours)}{_spread(m, key)} | {ref_s} | {delta} |")
        else:
            lines.append(f"| {label} | {pct(ours)}{_spread(m, key)} |")
    if m.orders is not None:
        seeds = ", ".join(str(o.order_seed) for o in m.orders)
        over = (f"Mean ± std (population) over {len(m.orders)} class orders (order seeds {seeds}); the accuracy matrix "
                "below is their position-wise mean." if len(m.orders) > 1 else f"One class order (order seed {seeds}).")
        lines += ["", over, "",
                  "| order seed | A_avg (%) | A_last (%) | F (%) |", "|---:|---:|---:|---:|"]
        lines += [f"| {o.order_seed} | {pct(o.A_avg)} | {pct(o.A_last)} | {pct(o.F)} |" for o in m.orders]
    return lines + [""]


def _spread(m: LearnMetrics, key: str) -> str:
    """`` ± std`` when the run has many class orders (over one, a std says nothing); for a number ``std`` does not
    hold (the published code's F), the std of the orders' own values, where every order has one."""
    std = (m.std or {}).get(key)
    values = [getattr(o, key, None) for o in m.orders or ()]
    numbers = [v for v in values if v is not None]
    if std is None and m.std is not None and len(values) > 1 and len(numbers) == len(values):
        from foal_pipe.protocol.ordermeans import mean_std

        std = mean_std(numbers)[1]
    return "" if std is None or len(m.orders or ()) == 1 else f" ± {pct(std)}"


def _first_order(m: LearnMetrics) -> int | None:
    """The first class order's seed where the run has many (``learn --order-seeds``): its model is the one saved and
    its tasks are the ones named, while the matrix is the orders' position-wise mean."""
    return m.orders[0].order_seed if m.orders is not None and len(m.orders) > 1 else None


def _paper_lines(run: Run, paper: PaperMatch | None) -> list[str]:
    if paper is None:
        return [f"The paper's Table 2 has no {code(run.dataset)} column, so there is nothing to compare with."]
    r = paper.row
    if paper.comparable:
        return [
            f"Same dataset, data and settings as the {r.title} column of {PAPER} (ViT-B/16, {r.n_train:,} train and "
            f"{r.n_test:,} test rows of 768 features, D=1000, gamma 1, batch 10, {r.n_tasks} tasks); the paper "
            "reports a mean of 3 runs."
        ]
    return [
        f"Not compared with the paper's {r.title} column (A_avg {r.A_avg}, A_last {r.A_last}, F {r.F}): "
        f"this run differs in {'; '.join(paper.differences)}."
    ]


def _matrix(run: Run) -> list[str]:
    a, m = run.matrix, run.metrics
    T = len(a)
    steps = summary_of(a, run.metrics.stream)["A_steps"]
    assert isinstance(steps, list)  # A_steps is the summary's one list
    columns = ("column j: the test rows of the classes seen by the end of task j (Si-Blurry: classes recur, so a task "
               "has no test set of its own); A_i is the diagonal" if m.stream == "si-blurry" else "column j: test set of task j")
    lines = ["## Accuracy matrix (%)", "", f"Row i: after training through task i; {columns}.", ""]
    if T <= SHOWN:
        lines.append("| after task | " + " | ".join(f"T{j + 1}" for j in range(T)) + " | A_i |")
        lines.append("|---:|" + "---:|" * (T + 1))
        for i, row in enumerate(a):
            cells = [pct(v, 1) for v in row] + [""] * (T - i - 1)
            lines.append(f"| {i + 1} | " + " | ".join(cells) + f" | {pct(steps[i])} |")
    else:
        lines[-2] += (f" {T} tasks, too many columns for a table: A_i after each task, then the last row; "
                      "`accuracy_matrix.csv` holds every entry.")
        lines += ["| after task | A_i |", "|---:|---:|", *(f"| {i + 1} | {pct(v)} |" for i, v in enumerate(steps)), "",
                  f"Last row, after task {T}: " + ", ".join(f"T{j + 1} {pct(v, 1)}" for j, v in enumerate(a[-1])) + "."]
    tasks = task_classes(run)
    first = _first_order(m)
    order = "" if first is None else (f", of the first class order (order seed {first}; the matrix above averages each "
                                      "task position over the orders, whose tasks hold other classes)")
    if tasks:
        lines += ["", f"Classes per task (stream order){order}: "
                  + "; ".join(f"T{t + 1}: {_names(names)}" for t, names in enumerate(tasks[:SHOWN]))
                  + ("; ..." if len(tasks) > SHOWN else "")]
    if m.continuation is not None:
        lines += ["", f"The model continued {code(m.continuation.init_model)} (`learn --init-model`): the matrix covers "
                  "this run's tasks only."]
    return lines + [""]


def _names(names: list[str]) -> str:
    """A task's classes, the first :data:`SHOWN` of them named (``class_accuracy.csv`` lists each with its task)."""
    more = f", ... ({len(names):,} classes)" if len(names) > SHOWN else ""
    return ", ".join(map(md, names[:SHOWN])) + more


def _classes(classes: ClassResults, continued: bool, first: int | None) -> list[str]:
    """The final model's accuracy on each class's test rows (``class_accuracy.csv``); ``first``: the first class
    order's seed, whose model it is, where the run has many (:func:`_first_order`)."""
    n = int(classes.confusion.count.sum())
    where = f"the test split of {code(classes.features)}"
    if classes.earlier_from:
        where = (f"the test splits of {code(classes.features)} and, for the classes learned before this run, of "
                 + ", ".join(code(f) for f in classes.earlier_from) + " (`--eval-features`)")
    lines = ["## Per-class accuracy", "", f"The final model on {where} ({n:,} rows); "
             "`class_accuracy.csv` holds the same, `confusion_matrix.csv` the confusion counts (rows: true class, "
             "columns: predicted)."]
    if classes.unknown_rows:
        lines[-1] += f" {classes.unknown_rows:,} rows of classes the model does not know are left out."
    if continued:
        lines[-1] += " Task -: a class the model learned before this run."
    if first is not None:
        lines[-1] += (f" The model is the first class order's (order seed {first}): the task column is that order's, "
                      "and summed over a task's classes the counts give that order's own last matrix row, not the "
                      "orders' mean above.")
    lines += ["", "| class | task | test rows | accuracy (%) |", "|---|---:|---:|---:|"]
    for row in classes.rows():
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.1f}"
        lines.append(f"| {md(row['name'])} | {row['task'] or '-'} | {row['test_rows']:,} | {accuracy} |")
    return lines + [""]


def _other_stores(m: LearnMetrics) -> list[str]:
    """``learn --init-model --eval-features``: the final model's accuracy on each other store's test split."""
    lines = ["## Other feature stores", "", "The final model on each `--eval-features` store's test split, classes "
             "matched by name (rows of classes the model does not know count as wrong).", "",
             "| store | test rows | accuracy (%) | rows of unknown classes |", "|---|---:|---:|---:|"]
    for e in (m.continuation.eval_features if m.continuation else None) or []:
        lines.append(f"| {_code_cell(e.features)} | {e.n_test:,} | {pct(e.accuracy)} | {e.unknown_class_rows:,} |")
    everything = m.continuation.all_classes if m.continuation else None
    if everything is not None:
        parts = "; ".join(f"{p.task} ({p.n_test:,} rows of {code(p.features)}) {pct(p.accuracy)}" for p in everything.tasks)
        lines += ["", f"Every class seen (A_last over all the model's classes, as the literature reads it): "
                  f"{pct(everything.A_last)} on {everything.n_test:,} test rows; {parts}."]
    return lines + [""]


def _criterion(selected_by: str | None, what: str, sampled: int | None = None) -> str:
    """``selected_by`` in words (``sampled``: the rows a sampled leave-one-out scored, :func:`sampled_rows`)."""
    if selected_by not in CRITERIA:
        return f"a criterion the {what} does not record"
    return criterion_text(selected_by, sampled)


def _auto_gamma(m: LearnMetrics) -> list[str]:
    """How ``learn --gamma auto`` chose gamma at each task boundary."""
    assert m.gammas_selected is not None  # read_metrics refuses "auto" without a gamma per boundary
    chosen = capped([f"T{i + 1} {g:g}" for i, g in enumerate(m.gammas_selected)],
                    "every boundary's in metrics.json's gammas_selected", SHOWN)
    search = m.gamma_search
    sampled = search.sample_rows[-1] if search is not None and search.sample_rows and any(search.sample_eps or ()) else None
    criterion = _criterion(m.selected_by, "run", sampled)
    return ["## Gamma", "", f"Chosen at every task boundary from the data seen so far, by {criterion}: {chosen}.", ""]


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _sweep(run: Run) -> list[str]:
    s = run.sweep
    assert s is not None  # summary_markdown calls it only for a run with a sweep
    choice = select(s)
    sweep_paper = match_paper(s, ignore=("gamma",)) if s.dataset else None
    compared = sweep_paper if sweep_paper is not None and sweep_paper.comparable else None
    criteria = has_criteria(s)
    head = "| gamma | A_avg (%) | A_last (%) | F (%) |"
    if criteria:
        head += " GCV | LOO accuracy (%) | LOO MSE |"
    if compared is not None:
        head += " paper A_avg (%) |"
    head += " |"
    source = f"From {code(run.sweep_path)}" + ("; GCV and LOO at the last task boundary." if criteria else ".")
    lines = ["## Gamma sweep", "", source, "", head, "|" + "---:|" * (head.count("|") - 1)]
    for r in s.results:
        row = f"| {r.gamma:g} | {pct(r.A_avg)} | {pct(r.A_last)} | {pct(r.F)} |"
        if criteria:
            row += f" {_cell(last(r.gcv), '.4g')} | {pct(last(r.loo_accuracy))} | {_cell(last(r.loo_mse), '.4g')} |"
        if compared is not None:
            ref = dict(zip(GAMMAS, compared.row.gamma_A_avg))
            match = next((v for g, v in ref.items() if same_gamma(g, r.gamma)), None)
            row += f" {match if match is not None else '-'} |"
        marks = [label for label, g in (("selected", choice.gamma), ("test oracle", choice.oracle_gamma))
                 if same_gamma(g, r.gamma)]
        lines.append(row + f" {', '.join(marks)} |")
    selected = result_at(s, choice.gamma)
    lines += ["", f"Selected gamma: {choice.gamma:g}, by {choice.criterion} (test A_avg {pct(selected.A_avg)}%)."]
    if choice.sampled_rows is not None and s.leave_one_out is not None:  # sampled_rows comes from leave_one_out
        lines.append(f"Its leave-one-out was sampled: {choice.sampled_rows:,} training rows scored at the last task "
                     f"boundary (`--loo-sample {s.leave_one_out.loo_sample}`), not every row seen.")
    if choice.selected_by in TRAINING_CRITERIA:
        oracle = result_at(s, choice.oracle_gamma)
        lines.append(f"The test-set oracle would pick {choice.oracle_gamma:g} (test A_avg {pct(oracle.A_avg)}%); "
                     "it peeks at the test split, so it is shown for reference, not used.")
    if choice.selected_by is None:
        lines.append("This sweep predates GCV and leave-one-out selection, so its choice peeks at the test split; "
                     "re-run `foal-pipe sweep` for an honest one.")
    if choice.at_edge:
        lines += ["", f"**Note:** the selected gamma is the {choice.at_edge} in the grid, so the best may lie beyond "
                  "it: extend the sweep's gammas."]
    return lines + [""]


def _fusions(run: Run) -> list[str]:
    """``sweep --fusions``: each fusion's selected gamma and its test numbers, and the choice over all of them."""
    s = run.sweep
    assert s is not None and s.fusions is not None  # summary_markdown calls it only for a sweep --fusions
    best, oracle = s.best, s.best_test
    assert best is not None and oracle is not None  # read_sweep refuses fusions without both choices
    criterion = _criterion(s.selected_by, "sweep", sampled_rows(s))  # its sample is said under the gamma sweep
    lines = ["## Fusion ablation", "", f"From {code(run.sweep_path)}: every fusion x gamma from one read of the stored "
             f"blocks; each fusion's gamma selected by {criterion}.", "",
             "| fusion | selected gamma | A_avg (%) | A_last (%) | F (%) | test-oracle gamma | its A_avg (%) | |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for entry in s.fusions:
        assert entry.best_gamma is not None and entry.best_gamma_test is not None  # sweep --fusions writes both
        at, top = result_at(entry, entry.best_gamma), result_at(entry, entry.best_gamma_test)
        mark = "selected" if entry.fusion == best.fusion else ""
        lines.append(f"| {entry.fusion} | {entry.best_gamma:g} | {pct(at.A_avg)} | {pct(at.A_last)} | "
                     f"{pct(at.F)} | {entry.best_gamma_test:g} | {pct(top.A_avg)} | {mark} |")
    chosen = result_at(next(e for e in s.fusions if e.fusion == best.fusion), best.gamma)
    lines += ["", f"Selected fusion: {best.fusion} with gamma {best.gamma:g}, by {criterion} over every fusion "
              f"and gamma (test A_avg {pct(chosen.A_avg)}%). The gamma sweep below is this fusion's."]
    if s.selected_by != "test":
        top = result_at(next(e for e in s.fusions if e.fusion == oracle.fusion), oracle.gamma)
        lines.append(f"The test-set oracle would pick {oracle.fusion} with gamma {oracle.gamma:g} (test A_avg "
                     f"{pct(top.A_avg)}%); it peeks at the test split, so it is shown for reference, not used.")
    return lines + [""]


def _head_options(options: dict[str, Any], seeds: list[int] | None) -> str:
    """A sweep head's options as run. With ``--order-seeds`` ridge ran each class order at the gamma chosen on its
    own rows, and the heads that take ridge's gamma at that order's (``gammas``, ``gamma_comps``: one per order):
    one value where every order agrees, else each order's, by its seed. Files before them hold balanced's and dual's
    first order's gamma alone: named as that order's."""
    def value(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    shown = []
    for k, v in options.items():
        if isinstance(v, list) and v and k.endswith("s"):
            names = seeds if seeds is not None and len(seeds) == len(v) else range(1, len(v) + 1)
            shown.append(f"{k[:-1]} {value(v[0])}" if len(set(v)) == 1 else f"{k[:-1]} " + ", ".join(
                f"{value(g)} (order {seed})" for seed, g in zip(names, v, strict=True)))
        elif k in ("gamma", "gamma_comp") and seeds is not None and len(seeds) > 1:
            shown.append(f"{k} {value(v)} (order {seeds[0]}'s)")
        else:
            shown.append(f"{k} {value(v)}")
    return ", ".join(shown)


def _heads(run: Run) -> list[str]:
    """``sweep --heads``: every head's test numbers, options and exact leave-one-out accuracy, and the choices."""
    s = run.sweep
    assert s is not None and s.heads is not None  # summary_markdown calls it only for a sweep --heads
    per_order = "ridge" in s.heads and "gammas" in s.heads["ridge"].options  # --order-seeds: each order's own
    ridge = "each class order's gamma, selected on its rows" if per_order else "the sweep's selected gamma"
    lines = ["## Heads", "", f"From {code(run.sweep_path)}: every head from one read of the store (ridge at {ridge}).", "",
             "| head | A_avg % | A_last % | F % | LOO acc % | options |", "|---|---:|---:|---:|---:|---|"]
    for name, h in s.heads.items():
        options = _head_options(h.options, s.order_seeds)
        lines.append(f"| {name} | {pct(h.A_avg)} | {pct(h.A_last)} | {pct(h.F)} | {pct(h.loo_accuracy)} | "
                     f"{options or '-'} |")
    chosen = (f"Best head by {s.best_head_selected_by} (training rows only): **{s.best_head}**" if s.best_head
              else "No head has a training criterion")
    return lines + ["", f"{chosen}; the test oracle's: {s.best_head_test} (it peeks at the test split).", ""]


def summary_markdown(
    run: Run,
    *,
    paper: PaperMatch | None,
    warnings: list[str],
    notes: list[str],
    plots: list[str],
    classes: ClassResults | None = None,
) -> str:
    """The ``summary.md`` text: settings, headline metrics (with the paper's), matrix, the accuracy on other
    stores, per-class accuracy, gamma, sweep, plots.

    ``warnings`` (inconsistent inputs) are bold; ``notes`` (say, no sweep found) are plain sentences;
    ``plots`` are the PNG file names, linked relative to summary.md; ``classes``: the per-class results.
    """
    m = run.metrics
    title = "F-OAL run" if m.head is None else f"{m.head} head run"
    lines = [f"# {title}: {md(run.label)}", "", f"Run {code(run.path)}: {describe(m)}.", "", "## Results", ""]
    lines += _results(m, paper)
    lines += _paper_lines(run, paper)
    departures = recipe_notes(m) if paper is not None else []
    if departures:
        lines.append(f"Departures from the published code: {'; '.join(departures)}.")
    for paragraph in [*(f"**Warning:** {w}." for w in warnings), *notes]:
        lines += ["", paragraph]
    lines.append("")
    lines += _matrix(run)
    if m.continuation is not None and m.continuation.eval_features:
        lines += _other_stores(m)
    if classes is not None:
        lines += _classes(classes, m.continuation is not None, _first_order(m))
    if m.gamma == "auto":
        lines += _auto_gamma(m)
    if run.sweep is not None and run.sweep.fusions is not None:
        lines += _fusions(run)
    if run.sweep is not None:
        lines += _sweep(run)
    if run.sweep is not None and run.sweep.heads:
        lines += _heads(run)
    if plots:
        lines += ["## Plots", "", *(f"![{Path(name).stem.replace('_', ' ')}]({name})" for name in plots), ""]
    return "\n".join(lines)
