"""Pretrain the tiny InstructBLIP-class checkpoint that the demo fine-tunes with DAVIR.

The command line of ``python -m davir.pretrain_tiny`` (see the package docstring for what it does)."""

from __future__ import annotations

import argparse
import sys

from davir.config import ConfigError
from davir.errors import DataError, describe_os_error
from davir.pretrain_tiny.batches import EntityNoise
from davir.pretrain_tiny.data import DESCRIPTION_ORDERS
from davir.pretrain_tiny.loop import TinyPretrainSettings, pretrain
from davir.runtime.arguments import limit_type
from davir.runtime.signals import START_AGAIN, stop_on_signals


def type_weights(text: str) -> dict[str, float]:
    """``move=3,color=1.5`` → {"move": 3.0, "color": 1.5} (the settings check the types and weights)."""
    weights = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, weight = item.partition("=")
        try:
            weights[kind.strip()] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not TYPE=WEIGHT") from None
    return weights


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m davir.pretrain_tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        required=True,
        help="folder to write the checkpoint into: new, empty, or one this command wrote (never the --init folder)",
    )
    parser.add_argument(
        "--family",
        default="instructblip",
        help="model family of the tiny preset (instructblip, qwen2_5_vl, llava_onevision, smolvlm)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", help="an existing synthetic set (python -m davir.data synth)")
    source.add_argument("--scenes", type=int, default=2000, help="generate a set of this many scenes (no --data)")
    parser.add_argument(
        "--data-seed",
        type=int,
        default=1,
        help="generator seed of the --scenes set (default 1: not the demo's seed 0, so no demo scene is seen)",
    )
    parser.add_argument("--workers", type=int, default=0, help="processes for generating (0 = one per core)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and of the batches drawn")
    parser.add_argument(
        "--init",
        help="continue from a folder this command wrote: its best weights (OUT) or its "
        "last (OUT/last); default: random weights",
    )
    parser.add_argument(
        "--desc-steps", type=int, default=3000, help="steps of stage 1, single-image description (0 skips it)"
    )
    parser.add_argument(
        "--change-steps", type=int, default=3000, help="steps of stage 2, change captioning (0 skips it)"
    )
    parser.add_argument("--desc-mix", type=float, default=0.2, help="share of description batches in stage 2")
    parser.add_argument(
        "--entity-share",
        type=float,
        default=0.0,
        help="share of change batches prompted with EPC entity prompts (Eq. 10) instead of the base prompt",
    )
    parser.add_argument(
        "--entity-wrong",
        type=float,
        default=EntityNoise.wrong,
        help="share of changed pairs whose entity is another object of the scene",
    )
    parser.add_argument(
        "--entity-on-distractor",
        type=float,
        default=EntityNoise.on_distractor,
        help="share of distractor pairs given one of the scene's objects as entity",
    )
    parser.add_argument(
        "--desc-order",
        choices=DESCRIPTION_ORDERS,
        default="left-to-right",
        help="object order of the description targets",
    )
    parser.add_argument(
        "--type-weights",
        type=type_weights,
        default={},
        metavar="TYPE=W,...",
        help="draw the changed pairs of these change types W times as often, e.g. move=3 "
        "(default: as the data holds them)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="pictures (stage 1) or pairs (stage 2) a step")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW's peak rate in each stage (warm-up, then cosine)")
    parser.add_argument("--image-size", type=int, default=64, help="picture side in pixels (with --init: that model's)")
    parser.add_argument("--patch-size", type=int, default=8, help="ViT patch side in pixels; divides --image-size")
    parser.add_argument("--query-tokens", type=int, default=0, help="0 = the preset's 16")
    parser.add_argument(
        "--add-llm-layers",
        type=int,
        default=0,
        help="append N LLM layers to the --init model, each starting as the identity",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--eval-every", type=int, default=500, help="score the held-out scenes every N steps (and at each stage's end)"
    )
    parser.add_argument("--eval-scenes", type=int, default=100, help="test scenes scored (2 pairs each)")
    parser.add_argument(
        "--train-limit",
        type=limit_type("--train-limit", "every train scene"),
        default=None,
        help="use only the first N train scenes (N >= 1; default: all)",
    )
    parser.add_argument(
        "--no-cider", dest="cider", action="store_false", help="skip BLEU/CIDEr in the final evaluation (needs Java)"
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return parser


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        settings = TinyPretrainSettings(**vars(parser.parse_args(argv)), argv=tuple(argv))
    except ValueError as error:
        parser.error(f"--{error}")
    try:
        pretrain(settings)
    except (DataError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, permissions changed mid-run
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
