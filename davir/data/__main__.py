"""`python -m davir.data {stats,synth,show} …` — dataset statistics, the built-in synthetic set, a picture grid."""

from __future__ import annotations

import argparse
import json
import sys

from davir.data.records import DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m davir.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    stats = commands.add_parser("stats", help="per-split counts as JSON; works on annotations alone")
    stats.add_argument("--format", required=True)
    stats.add_argument("--root", required=True)
    stats.add_argument("--split", action="append", help="split(s) to count (default: all of the format's)")

    synth = commands.add_parser("synth", help="render the built-in synthetic change dataset (CLEVR-Change layout)")
    synth.add_argument("--out", required=True)
    synth.add_argument("--scenes", type=int, default=5000)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--width", type=int, default=320)
    synth.add_argument("--height", type=int, default=240)
    synth.add_argument("--semantic-distractor-rate", type=float, default=0.3,
                       help="share of semantic pairs that also carry an illumination/viewpoint distractor")
    synth.add_argument("--workers", type=int, default=0, help="processes (0 = one per core)")

    show = commands.add_parser("show", help="draw a grid of before/after/mask thumbnails with captions")
    show.add_argument("--format", required=True)
    show.add_argument("--root", required=True)
    show.add_argument("--split", default="test")
    show.add_argument("--out", required=True)
    show.add_argument("--num", type=int, default=12)

    pairs = commands.add_parser("pairs", help="write a folder-format pairs.csv (captions, splits, masks) of some "
                                "pairs of a dataset: input for caption.py, or a folder to train on")
    pairs.add_argument("--format", required=True)
    pairs.add_argument("--root", required=True)
    pairs.add_argument("--split", action="append", help="split(s) to write (repeatable; default: test)")
    pairs.add_argument("--num", type=int, default=8, help="pairs per split (0 = all)")
    pairs.add_argument("--copy-images", action="store_true",
                       help="copy the images into before/, after/, masks/ beside the CSV (a stand-alone folder)")
    pairs.add_argument("--out", required=True, help="the .csv to write; image paths are written relative to its folder")

    args = parser.parse_args(argv)
    try:
        if args.command == "stats":
            from davir.data.stats import dataset_stats

            print(json.dumps(dataset_stats(args.format, args.root, args.split), indent=2))
        elif args.command == "synth":
            from davir.data.synthetic import SynthConfig, generate_dataset

            config = SynthConfig(
                scenes=args.scenes, seed=args.seed, width=args.width, height=args.height,
                semantic_distractor_rate=args.semantic_distractor_rate,
            )
            summary = generate_dataset(args.out, config, workers=args.workers)
            print(json.dumps(summary, indent=2))
        elif args.command == "pairs":
            from davir.data.export import write_pairs_manifest

            print(write_pairs_manifest(args.format, args.root, args.split or ["test"], args.out, num=args.num,
                                       copy_images=args.copy_images))
        elif args.command == "show":
            from davir.data.show import draw_grid

            path = draw_grid(args.format, args.root, args.split, args.out, num=args.num)
            print(path)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
