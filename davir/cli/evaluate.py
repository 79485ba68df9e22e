"""`evaluate.py` / `davir-evaluate`: score change captions with the standard metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE).

    python evaluate.py --predictions preds.json --references refs.json --out metrics.json
    python evaluate.py --predictions preds.json --format clevr_change --root data/clevr_change --split test
    python evaluate.py --checkpoint runs/demo --split test          # generate with a trained model, then score
    accelerate launch evaluate.py --checkpoint runs/demo            # generation sharded over processes

Predictions: a COCO results list, an {id: caption} JSON or a JSONL file. References: a COCO captions
file or an {id: [captions]} JSON (--references), or a dataset split through the data layer
(--format/--root/--split); when that dataset has change types (CLEVR-Change) a per-type table follows.
A split with an official reference file (Spot-the-Diff, IER) is scored on exactly that file's pairs and
sentences; empty references: see --empty-references and docs/experiments/results.md ("Protocols").
Tables print x100 as papers do; the JSON keeps the toolkit scale. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.errors import DataError, describe_os_error
from davir.evaluation import EvaluationOptions, ReferenceSource, evaluate_run, score_predictions
from davir.evaluation.scoring import check_outputs
from davir.metrics import METRICS, MetricsError, load_predictions
from davir.runtime.arguments import at_least, limit_type
from davir.runtime.signals import START_AGAIN, stop_on_signals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evaluate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_argument_group("predictions")
    source.add_argument(
        "--predictions", type=Path, help="predictions file (.json COCO results / {id: caption}, or .jsonl)"
    )
    source.add_argument(
        "--checkpoint",
        type=Path,
        help="generate the predictions with a trained model: a run folder (uses best/, else last/) "
        "or a saved model folder; --format/--root default to the run's training data",
    )
    source.add_argument(
        "--entities", type=Path, help="entity cache for the split (EPC; default: the run's data.entities)"
    )
    source.add_argument(
        "--allow-profile-mismatch",
        action="store_true",
        help="accept an entity cache of another preprocessing profile than the run trained on",
    )
    source.add_argument(
        "--masks", type=Path, help="mask cache for the localisation score when the data has no ground-truth masks"
    )
    source.add_argument(
        "--backbone-weights",
        type=Path,
        help="ResNet weights of a lightweight run, when its features are computed from the images (a --root other "
        "than the one its feature cache was built from)",
    )
    source.add_argument("--batch-size", type=at_least(1), default=None, help="pairs per generate call (default: 16)")
    source.add_argument(
        "--num-beams",
        type=at_least(1),
        default=None,
        help="1 = greedy, >1 = beam search (default: the run's run.num_beams, the decoding its "
        "best/ was selected with)",
    )
    source.add_argument(
        "--max-new-tokens", type=at_least(1), default=None, help="default: the run's run.max_new_tokens"
    )
    source.add_argument(
        "--limit", type=limit_type(), help="caption only the first N pairs of the split (N >= 1; default: all)"
    )
    refs = parser.add_argument_group("references (a file, or a dataset split through the data layer)")
    refs.add_argument("--references", type=Path, help="COCO captions file or {id: [captions]} JSON")
    refs.add_argument("--format", help="dataset format name (python -m davir.data stats lists the readers)")
    refs.add_argument("--root", type=Path, help="dataset root folder (with --format)")
    refs.add_argument("--split", default="test", help="dataset split (with --format; default: test)")
    refs.add_argument(
        "--empty-references",
        choices=("auto", "keep", "skip"),
        default=None,
        help="empty sentences of a --references file: auto (default) keeps them in an official "
        "reference file, as its published numbers do, and skips them (with the pairs left without "
        "any) in any other file; always counted and reported (docs/experiments/results.md, Protocols). "
        "A dataset split (--format/--root, --checkpoint) always follows auto's rule, by its protocol",
    )
    scoring = parser.add_argument_group("scoring")
    scoring.add_argument(
        "--metrics",
        default=",".join(METRICS),
        help=f"comma-separated subset of {','.join(METRICS)} (default: all; SPICE is separate)",
    )
    scoring.add_argument(
        "--spice-corenlp",
        type=Path,
        default=None,
        help="folder with stanford-corenlp-3.6.0.jar and -models.jar, enabling SPICE "
        "(default: $DAVIR_SPICE_CORENLP or jars already installed)",
    )
    scoring.add_argument("--no-spice", action="store_true", help="do not compute SPICE even if it is available")
    scoring.add_argument(
        "--synthetic-scenes",
        type=Path,
        default=None,
        help="the folder of a davir synthetic set (holding scenes.json) whose pairs these are, e.g. "
        "exported to the folder format with their ids kept: adds type/object accuracy",
    )
    scoring.add_argument(
        "--strict", action="store_true", help="fail when predictions and references do not cover the same pairs"
    )
    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, help="write all scores (and per-pair CIDEr) to this JSON file")
    output.add_argument("--markdown", type=Path, help="write the table(s) to this Markdown file")
    output.add_argument("--digits", type=at_least(0), default=1, help="decimals of the x100 table values (default: 1)")
    return parser


def check_reference_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exactly one reference source: --references, or --format with --root."""
    if args.references is not None and args.format is not None:
        parser.error("give either --references or --format/--root/--split, not both")
    if args.references is None and args.format is None:
        parser.error("references are required: --references FILE or --format NAME --root DIR --split S")
    if args.format is not None and args.root is None:
        parser.error("--format needs --root")


CHECKPOINT_ONLY = (
    "entities",
    "allow_profile_mismatch",
    "masks",
    "backbone_weights",
    "batch_size",
    "num_beams",
    "max_new_tokens",
    "limit",
)  # the flags of generating predictions with --checkpoint


def check_predictions_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A flag of generating predictions given with a --predictions file would change nothing: a usage error."""
    given = ["--" + name.replace("_", "-") for name in CHECKPOINT_ONLY if getattr(args, name) not in (None, False)]
    if given:
        parser.error(
            f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to generating predictions with --checkpoint; "
            "--predictions scores a file of captions as it is"
        )


def check_empty_references(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--empty-references keep|skip rules a --references file only. A dataset split's references are its protocol's
    (davir.metrics.protocols.references_for_evaluation: empty sentences as the split's official reference file has
    them, else skipped by the reader), which is `auto`'s rule; keep or skip would silently change nothing there."""
    if args.references is None and args.empty_references not in (None, "auto"):
        source = "--checkpoint" if args.checkpoint is not None else "--format/--root"
        parser.error(
            f"--empty-references {args.empty_references} applies to a --references file only; the dataset split of "
            f"{source} is scored under its protocol (empty sentences as its official reference file has them, else "
            "skipped: auto's rule)"
        )


def scoring_options(args: argparse.Namespace) -> dict:
    """The scoring flags as keywords of score_predictions / EvaluationOptions."""
    return {
        "metrics": [name.strip() for name in args.metrics.split(",") if name.strip()],
        "spice": False if args.no_spice else (args.spice_corenlp if args.spice_corenlp is not None else True),
        "strict": args.strict,
        "synthetic_scenes": args.synthetic_scenes,
        "digits": args.digits,
        "out": args.out,
        "markdown": args.markdown,
    }


def evaluation_options(args: argparse.Namespace) -> EvaluationOptions:
    """--checkpoint: the flags as EvaluationOptions."""
    return EvaluationOptions(
        format=args.format,
        root=args.root,
        limit=args.limit,
        entities=args.entities,
        allow_profile_mismatch=args.allow_profile_mismatch,
        masks=args.masks,
        backbone_weights=args.backbone_weights,
        batch_size=args.batch_size or EvaluationOptions.batch_size,
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        **scoring_options(args),
    )


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.predictions is None) == (args.checkpoint is None):
        parser.error("give exactly one of --predictions FILE or --checkpoint RUN")
    try:
        if args.checkpoint is not None:
            if args.references is not None:
                parser.error(
                    "--checkpoint scores against the dataset split (--format/--root/--split), not --references"
                )
            check_empty_references(parser, args)
            evaluate_run(args.checkpoint, args.split, evaluation_options(args))
            return 0
        check_reference_args(parser, args)
        check_predictions_args(parser, args)
        check_empty_references(parser, args)
        check_outputs(
            args.out, args.markdown, inputs={"--predictions": args.predictions, "--references": args.references}
        )
        predictions = load_predictions(args.predictions)
        references = (
            ReferenceSource.file(args.references, empty=args.empty_references or "auto", split=args.split)
            if args.references is not None
            else ReferenceSource.dataset(args.format, args.root, args.split)
        )
        score_predictions(
            predictions, references, predictions_source=str(args.predictions), echo=True, **scoring_options(args)
        )
        return 0
    except (DataError, MetricsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # permissions, a full disk: one line, never a traceback (docs/errors.md)
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
