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
PROBE_FIELDS = frozenset(f.name for f in dataclasses.fields(ProbeSettings))


class _Given(argparse.Action):
    """Store the value, and note which flag was given before the subcommand (probe takes only some of them)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given_before = (*namespace.given_before, self.option_strings[0])


class _Parser(argparse.ArgumentParser):
    """The command's parser: after parsing, `probe` refuses the training flags given before it and wants --data
    (on either side of it)."""

    probe: argparse.ArgumentParser | None = None  # the probe subcommand's parser, for its usage line

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        if parsed.command == "probe" and self.probe is not None:
            takes = [a.option_strings[0] for a in self.probe._actions if a.dest in PROBE_FIELDS and a.option_strings]
            flags = {action.option_strings[0]: action.dest for action in self._actions if action.option_strings}
            misplaced = [flag for flag in parsed.given_before if flags[flag] not in PROBE_FIELDS]
            if misplaced:  # it was dropped without a word: `--out O probe` looked like it did something with O
                self.probe.error(
                    f"{misplaced[0]} (given before probe) is a flag of training, which probe does not take; "
                    f"probe takes {', '.join(takes)}"
                )
            if parsed.data is None:
                self.probe.error("the following arguments are required: --data")
        del parsed.given_before
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    parser.set_defaults(given_before=())
    commands = parser.add_subparsers(
        dest="command", parser_class=argparse.ArgumentParser, help="train (the default: the flags alone) or probe"
    )
    train = commands.add_parser("train", help="pretrain (the default command)")
    for sub in (parser, train):
        # `--data D --out O train` gives the flags before the command: the subcommand's defaults are SUPPRESS so
        # that they do not set them back (argparse gave "--data and --out are required" though both were given)
        def option(*names, default, sub=sub, **kwargs):
            if sub is parser:  # the flags before any subcommand: noted, so that probe can refuse the training ones
                sub.add_argument(*names, default=default, action=_Given, **kwargs)
            else:
                sub.add_argument(*names, default=argparse.SUPPRESS, **kwargs)

        option("--data", default=None, help="a synthetic set (python -m davir.data synth), not the demo's seed")
        option("--out", default=None, help="folder for backbone.pth, head.pth, pretrain_info.json")
        option(
            "--minutes",
            type=float,
            default=15.0,
            help="wall-clock training budget (> 0; --max-steps can end it sooner)",
        )
        option("--max-steps", type=int, default=0, help="stop after this many steps (0 = time only)")
        option("--batch-size", type=int, default=24, help="crops a step")
        option("--crop-cells", type=int, default=7, help="crop side in 16-pixel cells (14 = whole image)")
        option("--lr", type=float, default=2e-3, help="AdamW's peak rate (warm-up, then cosine)")
        option("--seed", type=int, default=0, help="seed of the weights and the crops (probe: of a random-init one)")
        option("--threads", type=int, default=1, help="torch CPU threads")
        option("--eval-every", type=int, default=200, help="score the held-out images and save every N steps")
        option("--eval-scenes", type=int, default=60, help="held-out test scenes (3 images each)")
        option(
            "--train-limit",
            type=limit_type("--train-limit", "every train scene"),
            default=None,
            help="use only the first N train scenes (N >= 1; default: all)",
        )
    probe_parser = commands.add_parser("probe", help="linear probes of a backbone's layer3 cells")
    # --data, --seed and --threads may come before probe too (`--data D probe`): SUPPRESS keeps those (as for
    # train), and --data is checked once both sides are parsed (_Parser); the training flags before it are refused
    probe_parser.add_argument(
        "--data", default=argparse.SUPPRESS, help="a synthetic set (train and test splits are probed; required)"
    )
    probe_parser.add_argument("--weights", help="backbone state dict (default: a random-init ResNet-101)")
    probe_parser.add_argument(
        "--seed", type=int, default=argparse.SUPPRESS, help="seed of the random-init backbone (default: 0)"
    )
    probe_parser.add_argument("--scenes", type=int, default=150, help="scenes per split (their before images)")
    probe_parser.add_argument("--threads", type=int, default=argparse.SUPPRESS, help="torch CPU threads (default: 1)")
    parser.probe = probe_parser
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
