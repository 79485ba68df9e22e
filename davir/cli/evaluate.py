"""`evaluate.py` / `davir-evaluate`: score change captions with the standard metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE).

    python evaluate.py --predictions preds.json --references refs.json --out metrics.json
    python evaluate.py --predictions preds.json --format clevr_change --root data/clevr_change --split test
    python evaluate.py --checkpoint runs/demo --split test          # generate with a trained model, then score
    accelerate launch evaluate.py --checkpoint runs/demo            # generation sharded over processes

Predictions: a COCO results list, an {id: caption} JSON or a JSONL file. References: a COCO captions
file or an {id: [captions]} JSON (--references), or a dataset split through the data layer
(--format/--root/--split); when that dataset has change types (CLEVR-Change) a per-type table follows.
A split with an official reference file (Spot-the-Diff, IER) is scored on exactly that file's pairs and
sentences; empty references: see --empty-references and docs/results.md ("Protocols").
Tables print x100 as papers do; the JSON keeps the toolkit scale. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.data.records import DataError
from davir.errors import describe_os_error
from davir.evaluation.scoring import check_outputs, generate_and_score, report_scores
from davir.metrics import METRICS, MetricsError, load_predictions
from davir.runtime.signals import START_AGAIN, stop_on_signals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evaluate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_argument_group("predictions")
    source.add_argument("--predictions", type=Path, help="predictions file (.json COCO results / {id: caption}, or .jsonl)")
    source.add_argument("--checkpoint", type=Path,
                        help="generate the predictions with a trained model: a run folder (uses best/, else last/) "
                             "or a saved model folder; --format/--root default to the run's training data")
    source.add_argument("--entities", type=Path, help="entity cache for the split (EPC; default: the run's data.entities)")
    source.add_argument("--allow-profile-mismatch", action="store_true",
                        help="accept an entity cache of another preprocessing profile than the run trained on")
    source.add_argument("--masks", type=Path,
                        help="mask cache for the localisation score when the data has no ground-truth masks")
    source.add_argument("--batch-size", type=int, default=16)
    source.add_argument("--num-beams", type=int, default=None,
                        help="1 = greedy, >1 = beam search (default: the run's run.num_beams, the decoding its "
                             "best/ was selected with)")
    source.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's run.max_new_tokens")
    source.add_argument("--limit", type=int, help="caption only the first N pairs of the split")
    refs = parser.add_argument_group("references (a file, or a dataset split through the data layer)")
    refs.add_argument("--references", type=Path, help="COCO captions file or {id: [captions]} JSON")
    refs.add_argument("--format", help="dataset format name (python -m davir.data stats lists the readers)")
    refs.add_argument("--root", type=Path, help="dataset root folder (with --format)")
    refs.add_argument("--split", default="test", help="dataset split (with --format; default: test)")
    refs.add_argument("--empty-references", choices=("auto", "keep", "skip"), default="auto",
                      help="empty sentences of a --references file: auto (default) keeps them in an official "
                           "reference file, as its published numbers do, and skips them (with the pairs left without "
                           "any) in any other file; always counted and reported (docs/results.md, Protocols)")
    scoring = parser.add_argument_group("scoring")
    scoring.add_argument("--metrics", default=",".join(METRICS),
                         help=f"comma-separated subset of {','.join(METRICS)} (default: all; SPICE is separate)")
    scoring.add_argument("--spice-corenlp", type=Path, default=None,
                         help="folder with stanford-corenlp-3.6.0.jar and -models.jar, enabling SPICE "
                              "(default: $DAVIR_SPICE_CORENLP or jars already installed)")
    scoring.add_argument("--no-spice", action="store_true", help="do not compute SPICE even if it is available")
    scoring.add_argument("--synthetic-scenes", type=Path, default=None,
                         help="the folder of a davir synthetic set (holding scenes.json) whose pairs these are, e.g. "
                              "exported to the folder format with their ids kept: adds type/object accuracy")
    scoring.add_argument("--strict", action="store_true",
                         help="fail when predictions and references do not cover the same pairs")
    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, help="write all scores (and per-pair CIDEr) to this JSON file")
    output.add_argument("--markdown", type=Path, help="write the table(s) to this Markdown file")
    output.add_argument("--digits", type=int, default=1, help="decimals of the x100 table values (default: 1)")
    return parser


def check_reference_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exactly one reference source: --references, or --format with --root."""
    if args.references is not None and args.format is not None:
        parser.error("give either --references or --format/--root/--split, not both")
    if args.references is None and args.format is None:
        parser.error("references are required: --references FILE or --format NAME --root DIR --split S")
    if args.format is not None and args.root is None:
        parser.error("--format needs --root")


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.predictions is None) == (args.checkpoint is None):
        parser.error("give exactly one of --predictions FILE or --checkpoint RUN")
    try:
        if args.checkpoint is not None:
            if args.references is not None:
                parser.error("--checkpoint scores against the dataset split (--format/--root/--split), not --references")
            return generate_and_score(args)
        check_reference_args(parser, args)
        check_outputs(args)
        predictions = load_predictions(args.predictions)
        return report_scores(predictions, args, predictions_source=str(args.predictions))
    except (DataError, MetricsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # permissions, a full disk: one line, never a traceback (docs/errors.md)
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
