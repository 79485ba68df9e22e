"""`train.py` / `davir-train`: train DAVIR or a lightweight method from a YAML config with overrides.

    accelerate launch train.py --config configs/demo.yaml [key.sub=value …] [--resume]
    python train.py                      # the built-in demo config

The loop itself is davir.training.loop.train.
"""

from __future__ import annotations

import argparse
import sys

from davir.config import ConfigError, load_config
from davir.errors import DataError, describe_os_error
from davir.runs.config import DEFAULT_CONFIG, TrainConfig
from davir.runtime.signals import stop_on_signals
from davir.training.loop import NonFiniteLoss, train_in_folder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="YAML config (default: %(default)s)")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in run.output_dir from its last checkpoint"
    )
    parser.add_argument(
        "--wait-lock",
        action="store_true",
        help="when another train.py writes the same run folder (RUN.lock), wait for it, not stop",
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the YAML config")
    return parser.parse_args(argv)


@stop_on_signals(rerun="rerun with --resume to continue from the last complete checkpoint")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(TrainConfig, args.config, args.overrides)
        run_dir = train_in_folder(config, resume=args.resume, wait_lock=args.wait_lock)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except (DataError, NonFiniteLoss) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # permissions, a full disk: one line, never a traceback (docs/errors.md)
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    print(f"run folder: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
