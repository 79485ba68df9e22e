"""Score change captions with the standard metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE).

    python evaluate.py --predictions preds.json --references refs.json --out metrics.json
    python evaluate.py --predictions preds.json --format clevr_change --root data/clevr_change --split test

Predictions: a COCO results list, an {id: caption} JSON or a JSONL file. References: a COCO captions
file or an {id: [captions]} JSON (--references), or a dataset split through the data layer
(--format/--root/--split); when that dataset has change types (CLEVR-Change) a per-type table follows.
Tables print x100 as papers do; the JSON keeps the toolkit scale. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.data.records import DataError
from davir.io import write_text_atomic
from davir.metrics import (
    METRICS, TOTAL, MetricsError, format_group_table, format_table, load_predictions, load_references,
    load_references_from_dataset, score_by_group, score_captions, write_results_json,
)
from davir.metrics.io import MAX_EXAMPLES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python evaluate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_argument_group("predictions")
    source.add_argument("--predictions", type=Path, help="predictions file (.json COCO results / {id: caption}, or .jsonl)")
    refs = parser.add_argument_group("references (a file, or a dataset split through the data layer)")
    refs.add_argument("--references", type=Path, help="COCO captions file or {id: [captions]} JSON")
    refs.add_argument("--format", help="dataset format name (python -m davir.data stats lists the readers)")
    refs.add_argument("--root", type=Path, help="dataset root folder (with --format)")
    refs.add_argument("--split", default="test", help="dataset split (with --format; default: test)")
    scoring = parser.add_argument_group("scoring")
    scoring.add_argument("--metrics", default=",".join(METRICS),
                         help=f"comma-separated subset of {','.join(METRICS)} (default: all; SPICE is separate)")
    scoring.add_argument("--spice-corenlp", type=Path, default=None,
                         help="folder with stanford-corenlp-3.6.0.jar and -models.jar, enabling SPICE "
                              "(default: $DAVIR_SPICE_CORENLP or jars already installed)")
    scoring.add_argument("--no-spice", action="store_true", help="do not compute SPICE even if it is available")
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


def load_reference_source(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, str], dict, list[str]]:
    """(references, groups, description for the JSON, notes) from --references or the data layer."""
    if args.references is not None:
        return load_references(args.references), {}, {"file": str(args.references)}, []
    references, groups, without = load_references_from_dataset(args.format, args.root, args.split)
    notes = []
    if without:
        examples = ", ".join(map(repr, without[:MAX_EXAMPLES]))
        notes.append(f"{len(without)} pair(s) of {args.format} {args.split} have no reference caption and are not scored (e.g. {examples})")
    description = {"format": args.format, "root": str(args.root), "split": args.split,
                   "pairs_without_references": {"count": len(without), "examples": without[:MAX_EXAMPLES]}}
    return references, groups, description, notes


def report_scores(predictions: dict[str, str], args: argparse.Namespace, *, predictions_source: str) -> int:
    """Score `predictions` against the references the arguments name, print the table(s), write the outputs.

    Shared by every way of obtaining predictions (a file today; generation from a checkpoint later).
    """
    references, groups, reference_source, notes = load_reference_source(args)
    metrics = [name.strip() for name in args.metrics.split(",") if name.strip()]
    spice = False if args.no_spice else (args.spice_corenlp if args.spice_corenlp is not None else True)
    if groups:
        rows = score_by_group(predictions, references, groups, metrics=metrics, spice=spice, strict=args.strict)
    else:
        rows = {TOTAL: score_captions(predictions, references, metrics=metrics, spice=spice, strict=args.strict)}
    total = rows[TOTAL]

    text = format_table({TOTAL: total}, digits=args.digits)
    if len(rows) > 1:
        text += "\n" + format_group_table(rows, digits=args.digits)
    print(text, end="")
    for line in notes + total.mismatch.lines():
        print(f"note: {line}", file=sys.stderr)

    if args.markdown is not None:
        write_text_atomic(args.markdown, text)
    if args.out is not None:
        extra = {"predictions": predictions_source, "references": reference_source}
        write_results_json(args.out, rows, per_image=[TOTAL], extra=extra)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_reference_args(parser, args)
    if args.predictions is None:
        parser.error("--predictions is required")
    try:
        predictions = load_predictions(args.predictions)
        return report_scores(predictions, args, predictions_source=str(args.predictions))
    except (DataError, MetricsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
