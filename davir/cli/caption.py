"""`caption.py` / `davir-caption`: caption your own folder of image pairs with a trained checkpoint; JSONL out, and an HTML report to look at.

    python caption.py --checkpoint runs/demo --pairs my_pairs/ --out captions.jsonl --html report.html

`--pairs` is a folder with `before/` + `after/` (matching names), or `NAME_before.EXT`/`NAME_after.EXT`
side by side, or a `pairs.csv`/`pairs.jsonl` manifest (`before,after[,id]`), or such a manifest file.
Change masks and entities are computed on the fly with the same preprocessing (and settings) the model was
trained with. A pair that cannot be read (missing or corrupt image, before/after of different sizes unless
`--resize-mismatched`) is listed with the reason in the JSONL and the report; the others still get captions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.captioning import caption_folder
from davir.data.records import DataError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="caption.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="run folder (best/, else last/) or saved model")
    parser.add_argument("--pairs", required=True, type=Path, help="folder of pairs or a pairs.csv/.jsonl manifest")
    parser.add_argument("--out", type=Path, help="JSONL output (default: PAIRS/captions.jsonl)")
    parser.add_argument("--html", type=Path, help="HTML report (default: next to --out, report.html)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-beams", type=int, default=None,
                        help="default: the run's run.num_beams (the decoding its best/ was selected with)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's run.max_new_tokens")
    parser.add_argument("--allow-profile-mismatch", action="store_true",
                        help="accept mask/entity caches of another preprocessing profile than the run trained on")
    parser.add_argument("--resize-mismatched", action="store_true",
                        help="resize the before image to the after image's size instead of reporting the pair")
    parser.add_argument("--masks-from", type=Path, help="mask cache whose settings to reuse (default: the run's data.masks)")
    parser.add_argument("--entities-from", type=Path,
                        help="entity cache holding the vocabulary and retriever (default: the run's data.entities)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return caption_folder(args)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
