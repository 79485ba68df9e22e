"""Compare runs side by side with the numbers the papers report for the same dataset.

    python -m davir.compare runs/lightweight_demo/*/seed* [--dataset clevr_change] [--split test]
        [--out table.md] [--plot bars.png]
    python -m davir.compare --leaderboard spot_the_diff [RUN…]     # every reported number, its source and protocol

Each RUN is a run folder that `evaluate.py --checkpoint RUN --split S` has scored; runs that differ only by seed
are one row, mean ± std (min–max). Values print x100. What is read and compared: docs/recipes.md, "Runs side
by side".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.compare.runs import bar_chart, check_outputs, compare_runs
from davir.errors import DataError, check_output_file, describe_os_error
from davir.io import write_text_atomic
from davir.runtime.signals import START_AGAIN, stop_on_signals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m davir.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="*", type=Path, help="run folders scored by evaluate.py --checkpoint")
    parser.add_argument(
        "--leaderboard",
        metavar="BENCHMARK",
        help="print every reported number for BENCHMARK (spot_the_diff, clevr_change, ier, levir_cc, "
        "clevr_dc) with its source and protocol mark, the RUNs beside them",
    )
    parser.add_argument("--dataset", help="dataset of the paper rows (default: the runs' data.format)")
    parser.add_argument("--split", help="which evaluation of each run (when a run has several)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here (never a file of a RUN)")
    parser.add_argument(
        "--plot", type=Path, help="write a bar chart here, in the format of its suffix (.png, .pdf, .svg, …)"
    )
    return parser


@stop_on_signals(rerun=START_AGAIN)  # --out and --plot are written atomically: a stop leaves neither half-written
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.out:  # checked before the runs are read: an unwritable path is one line, never a traceback
            check_output_file(args.out, what="--out", example="table.md")
        if args.plot:
            check_output_file(args.plot, what="--plot", example="bars.png")
        check_outputs({"--out": args.out, "--plot": args.plot}, args.runs)
        comparison = compare_runs(args.runs, dataset=args.dataset, split=args.split, leaderboard=args.leaderboard)
        print(comparison.table, end="")
        if args.out:
            write_text_atomic(args.out, comparison.table)
        if args.plot:
            if not comparison.results:
                raise DataError("--plot draws the runs: give run folders")
            bar_chart(comparison.results, comparison.dataset, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, permissions changed since the check
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
