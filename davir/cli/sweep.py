"""Train and score a grid of runs (variants × seeds) and print one table of mean ± std.

    python -m davir.sweep configs/sweeps/ablation_demo.yaml        # DAVIR FAC/EPC ablation (paper Table 4)
    python -m davir.sweep configs/sweeps/lightweight_demo.yaml     # the five lightweight methods
    python -m davir.sweep SWEEP.yaml --seeds 0 --set optim.max_steps=50   # quicker, fewer seeds

An interrupted sweep continues where it stopped. The sweep file, `--var`, and OUT/summary.md: docs/recipes.md,
"Set-up, the demo targets and their knobs".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.config import ConfigError
from davir.errors import DataError
from davir.runtime.signals import stop_on_signals
from davir.sweep.grid import load_sweep, run_sweep, set_vars


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m davir.sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep", help="sweep YAML (configs/sweeps/)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the sweep's seeds")
    parser.add_argument("--out", type=Path, help="override the sweep's output folder")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="key=value override applied to every run (repeatable)",
    )
    parser.add_argument(
        "--split",
        help="score on this split instead of the sweep's (trained cells are only re-scored), "
        "e.g. --split val to choose between variants without looking at test",
    )
    parser.add_argument(
        "--var",
        dest="vars",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable of the sweep file (its vars:), e.g. --var demo_dir=/data/demo (repeatable)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        help="run only these variants (names or folder slugs), e.g. to share a sweep between machines",
    )
    return parser


@stop_on_signals(rerun="rerun the same command to resume (finished cells are kept)")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
        set_vars(sweep, args.vars)
        result = run_sweep(
            sweep, seeds=args.seeds, variants=args.variants, extra=args.overrides, split=args.split, out=args.out
        )
    except (ConfigError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(result.text, end="")
    print(f"summary written to {result.markdown_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
