"""`python -m davir.pretrain_backbone`: pretrain the tiny ResNet backbone of the lightweight demo, or probe one.

    python -m davir.data synth --out /tmp/synth_bb --scenes 1500 --seed 17       # not the demo's seed 0
    python -m davir.pretrain_backbone --data /tmp/synth_bb --out davir/assets/tiny_resnet --minutes 15
    python -m davir.pretrain_backbone probe --data SET [--weights OUT/backbone.pth]

The flags are the fields of davir.pretrain_backbone.train.PretrainSettings / ProbeSettings (docs/experiments/tiny_backbone.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

from davir.config import ConfigError
from davir.errors import DataError
from davir.pretrain_backbone.train import PretrainSettings, ProbeSettings, pretrain_backbone, probe_backbone
from davir.runtime.arguments import limit_type
from davir.runtime.signals import START_AGAIN, stop_on_signals

PROG = "python -m davir.pretrain_backbone"
DESCRIPTION = "Pretrain the tiny ResNet backbone whose layer3 grid features the lightweight demo methods read."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", help="train (the default: the flags alone) or probe")
    train = commands.add_parser("train", help="pretrain (the default command)")
    for sub in (parser, train):
        # `--data D --out O train` gives the flags before the command: the subcommand's defaults are SUPPRESS so
        # that they do not set them back (argparse gave "--data and --out are required" though both were given)
        def default(value, sub=sub):
            return value if sub is parser else argparse.SUPPRESS

        sub.add_argument(
            "--data", default=default(None), help="a synthetic set (python -m davir.data synth), not the demo's seed"
        )
        sub.add_argument("--out", default=default(None), help="folder for backbone.pth, head.pth, pretrain_info.json")
        sub.add_argument(
            "--minutes",
            type=float,
            default=default(15.0),
            help="wall-clock training budget (> 0; --max-steps can end it sooner)",
        )
        sub.add_argument("--max-steps", type=int, default=default(0), help="stop after this many steps (0 = time only)")
        sub.add_argument("--batch-size", type=int, default=default(24), help="crops a step")
        sub.add_argument(
            "--crop-cells", type=int, default=default(7), help="crop side in 16-pixel cells (14 = whole image)"
        )
        sub.add_argument("--lr", type=float, default=default(2e-3), help="AdamW's peak rate (warm-up, then cosine)")
        sub.add_argument("--seed", type=int, default=default(0), help="seed of the weights and the crops")
        sub.add_argument("--threads", type=int, default=default(1), help="torch CPU threads")
        sub.add_argument(
            "--eval-every", type=int, default=default(200), help="score the held-out images and save every N steps"
        )
        sub.add_argument("--eval-scenes", type=int, default=default(60), help="held-out test scenes (3 images each)")
        sub.add_argument(
            "--train-limit",
            type=limit_type("--train-limit", "every train scene"),
            default=default(None),
            help="use only the first N train scenes (N >= 1; default: all)",
        )
    probe_parser = commands.add_parser("probe", help="linear probes of a backbone's layer3 cells")
    probe_parser.add_argument("--data", required=True, help="a synthetic set (train and test splits are probed)")
    probe_parser.add_argument("--weights", help="backbone state dict (default: a random-init ResNet-101)")
    probe_parser.add_argument("--seed", type=int, default=0, help="seed of the random-init backbone")
    probe_parser.add_argument("--scenes", type=int, default=150, help="scenes per split (their before images)")
    probe_parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser


def _settings(cls: type, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = " ".join([PROG, *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    try:
        if args.command == "probe":
            print(json.dumps(probe_backbone(_settings(ProbeSettings, args)), indent=2))
            return 0
        if not args.data or not args.out:
            raise DataError("--data and --out are required")
        info = pretrain_backbone(_settings(PretrainSettings, args), command=command)
    except (ConfigError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(info["curve"][-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
