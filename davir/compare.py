"""Compare runs side by side with the numbers the papers report for the same dataset.

    python -m davir.compare runs/subtraction_demo runs/scorer_demo … [--dataset clevr_change] [--split test]
        [--out table.md] [--plot bars.png]

Each RUN is a run folder that `python evaluate.py --checkpoint RUN --split S` has scored: its
RUN/eval/<format>_<split>/metrics.json is read (the total row and, for CLEVR-Change, the semantic and
distractor rows). The papers' rows for the dataset (davir.paper_results, methods.md §7.4) follow, for
the methods among the runs and the subtraction baseline. Values print x100 as papers print them.
Note that a run on other data (e.g. the built-in synthetic set) is not comparable in absolute terms;
the paper rows are there to show the expected ordering and gap sizes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from davir.data.records import DataError
from davir.io import read_json, write_text_atomic
from davir.paper_results import METRIC_COLUMNS, paper_results

SETTINGS = ("total", "semantic", "distractor")


@dataclass
class RunResult:
    name: str
    method: str
    dataset: str
    split: str
    rows: dict[str, dict[str, float]]  # setting -> metric -> toolkit value (0..1; CIDEr unbounded)
    pairs: dict[str, int]
    path: Path


def read_run(run: Path, *, split: str | None = None) -> RunResult:
    """The scored evaluation of one run folder (the only one, or the one of `split`)."""
    run = Path(run)
    config_path = run / "config.yaml"
    if not config_path.is_file():
        raise DataError(f"{run} is not a run folder (no config.yaml)")
    config = yaml.safe_load(config_path.read_text()) or {}
    method = config.get("method", "?")
    found = sorted((run / "eval").glob("*/metrics.json"))
    if split is not None:
        found = [p for p in found if p.parent.name.endswith(f"_{split}")]
    if not found:
        raise DataError(f"{run} has no eval/*{'_' + split if split else ''}/metrics.json; run "
                        f"`python evaluate.py --checkpoint {run} --split {split or 'test'}` first")
    if len(found) > 1:
        raise DataError(f"{run} has several evaluations ({', '.join(p.parent.name for p in found)}); pick one with --split")
    metrics = read_json(found[0])
    rows, pairs = {}, {}
    for setting in SETTINGS:
        if setting in metrics.get("rows", {}):
            rows[setting] = metrics["rows"][setting]["metrics"]
            pairs[setting] = metrics["rows"][setting].get("num_pairs", 0)
    if "total" not in rows:
        raise DataError(f"{found[0]}: no 'total' row; not written by evaluate.py")
    data_format = config.get("data", {}).get("format", "?")
    return RunResult(run.name, method, data_format, found[0].parent.name.rsplit("_", 1)[-1], rows, pairs, found[0])


def _cell(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def comparison_table(results: list[RunResult], dataset: str) -> str:
    """One Markdown table: every run's rows (x100), then the papers' rows for the same dataset."""
    header = ["source", "method", "setting", *METRIC_COLUMNS, "pairs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|"]
    for result in results:
        for setting, metrics in result.rows.items():
            cells = [f"ours: {result.name} ({result.split})", result.method, setting,
                     *(_cell(None if metrics.get(m) is None else 100 * metrics[m]) for m in METRIC_COLUMNS),
                     str(result.pairs.get(setting, ""))]
            lines.append("| " + " | ".join(cells) + " |")
    methods = {r.method for r in results} | {"subtraction"}
    for row in paper_results(dataset, methods):
        cells = [f"paper: {row.source}", row.method, row.setting, *(_cell(row.scores[m]) for m in METRIC_COLUMNS), ""]
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"Scores x100 (CIDEr = CIDEr-D). Paper rows: each method's own paper on {dataset} "
            "(methods.md §7.4); runs on other data are comparable in ordering, not in absolute value.")
    return "\n".join(lines) + "\n\n" + note + "\n"


def bar_chart(results: list[RunResult], dataset: str, path: Path) -> None:
    """Grouped bars: each run's total-row metrics, and CIDEr beside the paper's CIDEr for its method."""
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
        reported = [p.scores["CIDEr"] for p in paper_results(dataset, {result.method})
                    if p.scores["CIDEr"] is not None and p.setting in ("total", "all")]
        paper.append(reported[0] if reported else 0.0)
    xr = np.arange(len(results))
    right.bar(xr - 0.2, ours, 0.4, label="ours")
    right.bar(xr + 0.2, paper, 0.4, label=f"paper ({dataset})", hatch="//", alpha=0.6)
    right.set_xticks(xr, names, rotation=20, ha="right", fontsize=8)
    right.set_title("CIDEr: ours vs paper (0 = not reported)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m davir.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders scored by evaluate.py --checkpoint")
    parser.add_argument("--dataset", help="dataset of the paper rows (default: the runs' data.format)")
    parser.add_argument("--split", help="which evaluation of each run (when a run has several)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    parser.add_argument("--plot", type=Path, help="write a bar chart PNG here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results = [read_run(run, split=args.split) for run in args.runs]
        dataset = args.dataset or results[0].dataset
        table = comparison_table(results, dataset)
        print(table, end="")
        if args.out:
            write_text_atomic(args.out, table)
        if args.plot:
            bar_chart(results, dataset, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
