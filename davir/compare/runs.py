"""Compare runs side by side with the numbers the papers report for the same dataset: what `python -m
davir.compare` (davir.cli.compare, whose help says what is read and how seeds are pooled) does, from Python as
`compare_runs`, or `read_run` + `comparison_table` / `bar_chart`."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from davir.compare.paper_results import METRIC_COLUMNS, paper_results
from davir.compare.seed_spread import inside_spread_lines, metric_at, spread_text, value_at
from davir.errors import DataError, refuse_outputs_over_inputs
from davir.io import atomic_path, read_json
from davir.runs.files import RUN_ENTRIES, check_keys
from davir.runtime.cost import COST_FIELDS, DEVICE_PATH

SETTINGS = ("total", "semantic", "distractor")
# Stated-difference faithfulness of the total row (metrics.json "faithfulness", davir.metrics.faithfulness).
FAITHFULNESS_COLUMNS = {
    "object F1": ("faithfulness", "rows", "total", "objects", "f1"),
    "hallucinated": ("faithfulness", "rows", "total", "hallucination_rate"),
}
_SEED = re.compile(r"(?:^|[_-])seed\d+$")


@dataclass
class RunResult:
    name: str
    method: str
    dataset: str
    split: str
    rows: dict[str, dict[str, float]]  # setting -> metric -> toolkit value (0..1; CIDEr unbounded)
    pairs: dict[str, int]
    path: Path
    document: dict[str, Any] = field(default_factory=dict)  # the whole metrics.json
    group: str = ""  # the run's name without its seed: runs of one group are one table row
    seed: int | None = None  # config.yaml run.seed (None where the config does not say)
    folder: Path | None = None  # the run folder as given


def seed_group(run: Path) -> str:
    """`runs/x/seed2` → "x", `runs/x_seed2` → "x", anything else its own name."""
    run = Path(run)
    if re.fullmatch(r"seed\d+", run.name):
        return run.parent.name or run.name
    return _SEED.sub("", run.name) or run.name


def read_run(run: Path, *, split: str | None = None) -> RunResult:
    """The scored evaluation of one run folder (the only one, or the one of `split`)."""
    run = Path(run)
    config_path = run / "config.yaml"
    if not run.exists():
        raise DataError(f"run folder {run} does not exist")
    if not config_path.is_file():
        raise DataError(f"{run} is not a run folder (no config.yaml)")
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        reason = getattr(error, "problem", None) or str(error)
        raise DataError(f"{config_path}: not a readable run config ({where}{reason})") from error
    check_keys(config, config_path, {"method": (str,), "data": (dict,), "data.format": (str,), "run": (dict,)})
    method = config.get("method", "?")
    found = sorted((run / "eval").glob("*/metrics.json"))
    if split is not None:
        found = [p for p in found if p.parent.name.endswith(f"_{split}")]
    if not found:
        raise DataError(
            f"{run} has no eval/*{'_' + split if split else ''}/metrics.json; run "
            f"`python evaluate.py --checkpoint {shlex.quote(str(run))} --split {shlex.quote(split or 'test')}` first"
        )
    if len(found) > 1:
        raise DataError(
            f"{run} has several evaluations ({', '.join(p.parent.name for p in found)}); pick one with --split"
        )
    metrics = read_json(found[0])
    if not isinstance(metrics, dict):
        raise DataError(f"{found[0]}: expected a JSON object written by evaluate.py")
    check_keys(metrics, found[0], {"rows": (dict,)})
    rows, pairs = {}, {}
    for setting in SETTINGS:
        if setting in metrics.get("rows", {}):
            row = f"rows.{setting}"
            numbers = {f"{row}.metrics.{name}": (int, float, type(None)) for name in METRIC_COLUMNS}
            schema = {row: (dict,), f"{row}.metrics": (dict,), f"{row}.num_pairs": (int,), **numbers}
            check_keys(metrics, found[0], schema, (f"{row}.metrics",))
            rows[setting] = metrics["rows"][setting]["metrics"]
            pairs[setting] = metrics["rows"][setting].get("num_pairs", 0)
    if "total" not in rows:
        raise DataError(f"{found[0]}: no 'total' row; not written by evaluate.py")
    data_format = config.get("data", {}).get("format", "?")
    seed = (config.get("run") or {}).get("seed")
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    return RunResult(
        run.name,
        method,
        data_format,
        found[0].parent.name.rsplit("_", 1)[-1],
        rows,
        pairs,
        found[0],
        metrics,
        seed_group(run),
        seed,
        run,
    )


def _cell(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def group_runs(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs keyed by seed group (and method and split, so that two methods never share a row), in input order. A
    group holding two runs of one seed (`runs/a/demo` and `runs/b/demo`, both seed 0) is not seeds of one
    variant: each of its runs is a row of its own, named by its folder (`unpooled`)."""
    rows: dict[str, list[RunResult]] = {}
    for key, runs in group_runs_by_name(results).items():
        if unpooled(runs):
            for run in runs:
                named = replace(run, name=str(run.folder or run.path), group=str(run.folder or run.path))
                rows[f"{named.group} ({run.method}, {run.split})"] = [named]
        else:
            rows[key] = runs
    return rows


def group_runs_by_name(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs keyed by seed group, method and split, as given (no run split off)."""
    groups: dict[str, list[RunResult]] = {}
    for result in results:
        groups.setdefault(f"{result.group} ({result.method}, {result.split})", []).append(result)
    return groups


def unpooled(runs: list[RunResult]) -> bool:
    """Whether runs of one seed group share a seed, so are not seeds of one variant."""
    seeds = [run.seed for run in runs if run.seed is not None]
    return len(seeds) != len(set(seeds))


def _label(runs: list[RunResult]) -> str:
    first = runs[0]
    if len(runs) == 1:
        return f"ours: {first.name} ({first.split})"
    return f"ours: {first.group} ({first.split}, {len(runs)} seeds)"


def comparison_table(results: list[RunResult], dataset: str) -> str:
    """Markdown tables: every run group's rows (x100, mean ± std (min–max) over seeds) with the papers' rows for
    the same dataset, the compute cost per group, and the differences the seed spread cannot settle."""
    header = ["source", "method", "setting", *METRIC_COLUMNS, *FAITHFULNESS_COLUMNS, "pairs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|"]
    groups = group_runs(results)
    spread: dict[str, dict[str, list[float]]] = {}
    for runs in groups.values():
        for setting in runs[0].rows:
            cells = [_label(runs), runs[0].method, setting]
            for metric in METRIC_COLUMNS:
                values = [r.rows[setting][metric] for r in runs if r.rows.get(setting, {}).get(metric) is not None]
                cells.append(spread_text(values, 100.0) if values else "–")
                if setting == "total":
                    spread.setdefault(metric, {})[_label(runs)] = values
            for title, path in FAITHFULNESS_COLUMNS.items():
                values = (
                    [v for v in (metric_at(r.document, path) for r in runs) if v is not None]
                    if setting == "total"
                    else []
                )
                cells.append(spread_text(values, 100.0) if values else "–")
                if setting == "total":
                    spread.setdefault(title, {})[_label(runs)] = values
            cells.append(str(runs[0].pairs.get(setting, "")))
            lines.append("| " + " | ".join(cells) + " |")
    methods = {r.method for r in results} | {"subtraction"}
    for row in paper_results(dataset, methods):
        cells = [
            f"paper: {row.source}",
            row.method,
            row.setting,
            *(_cell(row.scores[m]) for m in METRIC_COLUMNS),
            *("–" for _ in FAITHFULNESS_COLUMNS),
            "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    papers = (
        f"Paper rows: each method's own paper on {dataset} (docs/methods/README.md); runs on other data are "
        "comparable in ordering, not in absolute value."
        if paper_results(dataset)
        else f"No paper reports numbers on {dataset} (davir/compare/paper_results.py); --dataset names another."
    )
    note = (
        "Scores x100 (CIDEr = CIDEr-D); ours: mean ± std (min–max) over seeds; object F1 / hallucinated: "
        f"stated-difference faithfulness. {papers}"
    )
    text = "\n".join(lines) + "\n\n" + note + "\n"
    for runs in group_runs_by_name(results).values():
        if unpooled(runs):
            text += (
                f"\nNot pooled: {', '.join(str(r.folder or r.path) for r in runs)} share a name but not seeds of one "
                "variant (two of them trained with one seed); each is a row of its own.\n"
            )
    text += cost_table(groups)
    flags = inside_spread_lines(spread)
    if flags and len(groups) > 1:
        text += "\nInside the seed spread (min–max ranges overlap; these seeds do not settle the order):\n\n"
        text += "\n".join(flags) + "\n"
    return text


def cost_table(groups: dict[str, list[RunResult]]) -> str:
    """The compute cost of each run group (davir.runtime.cost; mean ± std (min–max) over seeds), or "" if no
    run recorded one."""
    if not any(
        metric_at(r.document, path) is not None
        for runs in groups.values()
        for r in runs
        for _, path, _, _ in COST_FIELDS
    ):
        return ""
    lines = [
        "",
        "Compute cost (training wall time includes validation and checkpoints; peak memory: CUDA allocator "
        "on a GPU, process RSS on a CPU):",
        "",
        "| run | " + " | ".join(title for title, *_ in COST_FIELDS) + " | device |",
        "|---" + "|---:" * len(COST_FIELDS) + "|---|",
    ]
    for runs in groups.values():
        cells = []
        for _, path, scale, digits in COST_FIELDS:
            values = [v for v in (metric_at(r.document, path) for r in runs) if v is not None]
            cells.append(spread_text(values, scale, digits))
        devices = {str(d) for d in (_device(r.document) for r in runs) if d}
        lines.append(f"| {_label(runs)} | " + " | ".join(cells) + f" | {', '.join(sorted(devices)) or '?'} |")
    return "\n".join(lines) + "\n"


def _device(document: dict[str, Any]) -> str | None:
    value = value_at(document, DEVICE_PATH)
    return value if isinstance(value, str) else None


def picture_formats() -> dict[str, str]:
    """The file suffixes matplotlib writes a figure as (png, pdf, svg, …) → what each is."""
    from matplotlib.backend_bases import FigureCanvasBase

    return FigureCanvasBase.get_supported_filetypes()


def check_outputs(outputs: Mapping[str, str | Path | None], runs: Sequence[str | Path]) -> None:
    """Before any run is read: no two outputs ({flag: path}) are one file, `--plot` has a suffix matplotlib
    writes, and no output replaces a file a run wrote (its config.yaml, an eval's metrics.json, its weights: a
    path under one of the run's own entries, `davir.runs.files.RUN_ENTRIES`). A new file of the user's beside
    them in the run folder is fine."""
    refuse_outputs_over_inputs({"--plot": outputs.get("--plot")}, {"the --out file": outputs.get("--out")})
    given = {flag: Path(path) for flag, path in outputs.items() if path is not None}
    for flag, path in given.items():
        real = os.path.realpath(path)
        if flag == "--plot":
            suffix = path.suffix.lower().lstrip(".")
            formats = picture_formats()
            if suffix not in formats:
                raise DataError(
                    f"--plot {path}: matplotlib cannot write a {'.' + suffix if suffix else 'file without a suffix'}"
                    f"; give a .png path (or {', '.join('.' + name for name in sorted(formats) if name != 'png')})"
                )
        if not os.path.lexists(path):
            continue
        for run in runs:
            for inside, folder in ((os.path.abspath(path), os.path.abspath(run)), (real, os.path.realpath(run))):
                relative = os.path.relpath(inside, folder)
                if relative.split(os.sep)[0] in RUN_ENTRIES:
                    raise DataError(
                        f"{flag} {path} is {relative} of the run {run}, which it would replace; give another {flag}"
                    )


def bar_chart(results: list[RunResult], dataset: str, path: Path) -> None:
    """Grouped bars: each run's total-row metrics, and CIDEr beside the paper's CIDEr for its method; written
    atomically in the format of `path`'s suffix (png, pdf, svg, …)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    metrics = [m for m in METRIC_COLUMNS if any(r.rows["total"].get(m) is not None for r in results)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(results), 1)
    x = np.arange(len(metrics))
    for i, result in enumerate(results):
        values = [100 * (result.rows["total"].get(m) or 0.0) for m in metrics]
        left.bar(x + i * width, values, width, label=result.name)
    left.set_xticks(x + width * (len(results) - 1) / 2, metrics)
    left.set_title("ours (total, x100)")
    left.legend(fontsize=8)
    names = [r.name for r in results]
    ours = [100 * (r.rows["total"].get("CIDEr") or 0.0) for r in results]
    paper = []
    for result in results:
        reported = [
            p.scores["CIDEr"]
            for p in paper_results(dataset, {result.method})
            if p.scores["CIDEr"] is not None and p.setting in ("total", "all")
        ]
        paper.append(reported[0] if reported else 0.0)
    xr = np.arange(len(results))
    right.bar(xr - 0.2, ours, 0.4, label="ours")
    right.bar(xr + 0.2, paper, 0.4, label=f"paper ({dataset})", hatch="//", alpha=0.6)
    right.set_xticks(xr, names, rotation=20, ha="right", fontsize=8)
    right.set_title("CIDEr: ours vs paper (0 = not reported)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    try:
        with atomic_path(path) as tmp:  # a Ctrl-C mid-save leaves no half picture
            fig.savefig(tmp, dpi=100, format=path.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class Comparison:
    """`compare_runs`'s answer: the Markdown table, the runs it read, and the dataset of its paper rows."""

    table: str
    results: list[RunResult]
    dataset: str | None


def compare_runs(
    runs: Sequence[str | Path], *, dataset: str | None = None, split: str | None = None, leaderboard: str | None = None
) -> Comparison:
    """The comparison table of `runs` (their `split` evaluation) beside the papers' rows for `dataset` (default: the
    first run's data format), or with `leaderboard` the leaderboard of that benchmark with the runs in it."""
    if not runs and not leaderboard:
        raise DataError("give the run folders to compare, or --leaderboard BENCHMARK")
    if dataset is not None:  # a typo (clevr-change) gave a table without a single paper row
        from davir.data.formats import FORMATS

        FORMATS.check(dataset, key="--dataset")
    given: dict[str, Path] = {}
    for run in map(Path, runs):  # one run twice (a glob and its path, a link) would count as two seeds
        real = os.path.realpath(run)
        if real in given:
            raise DataError(f"{run} is the run {given[real]} again ({real}); give each run once")
        given[real] = run
    results = [read_run(Path(run), split=split) for run in runs]
    if leaderboard:
        from davir.compare.leaderboard import leaderboard_table
        from davir.compare.paper_results import PAPER_RESULTS

        known = sorted({r.dataset for r in PAPER_RESULTS})
        if leaderboard not in known:
            raise DataError(
                f"--leaderboard {leaderboard}: no reported numbers for it; choose one of {', '.join(known)}"
            )
        table = leaderboard_table(leaderboard, results)
    else:
        table = comparison_table(results, dataset or results[0].dataset)
    return Comparison(table, results, dataset or (results[0].dataset if results else leaderboard))
