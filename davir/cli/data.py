"""`python -m davir.data {stats,verify,import,pairs,export,synth,show} …` — dataset statistics, download check,
checking and importing your own labelled pairs (or a toolkit's dataset), manifests, datasets for LLaMA-Factory /
ms-swift / TRL, the built-in synthetic set, a picture grid."""

from __future__ import annotations

import argparse
import json
import sys

from davir.errors import DataError
from davir.runtime.signals import START_AGAIN, stop_on_signals


def _verify(args) -> int:
    from davir.data.verify import format_checks, verify_dataset
    from davir.errors import check_output_file
    from davir.io import write_json_atomic

    if args.out:  # before the images are looked at (minutes on a whole benchmark)
        check_output_file(args.out, what="--out", example="verify.json")
    checks = verify_dataset(args.format, args.root, args.split, decode=not args.quick, out=args.out)
    summary, problems = format_checks(args.format, checks)
    print("\n".join(summary))
    for line in problems:
        print(line, file=sys.stderr)
    if args.out:
        write_json_atomic(
            args.out,
            {
                "format": args.format,
                "root": args.root,
                "decoded": not args.quick,
                "splits": [check.to_dict() for check in checks],
            },
        )
    incomplete = [check.split + (" (empty)" if check.empty else "") for check in checks if not check.complete]
    if incomplete:
        print(f"error: {args.format} at {args.root} is incomplete in {', '.join(incomplete)}", file=sys.stderr)
        return 1
    return 0


def _import(args) -> int:
    from davir.data.formats.folder import SplitOptions
    from davir.data.importer import import_pairs
    from davir.data.toolkits import ImportOptions

    toolkit_only = {"--split": args.split, "--dataset": args.dataset, "--allow-outside": args.allow_outside}
    misplaced = [name for name, value in toolkit_only.items() if value] if args.toolkit is None else []
    if misplaced or (args.dataset and args.toolkit != "llamafactory"):
        print(
            f"error: {(misplaced or ['--dataset'])[0]} is an option of `import --from "
            f"{'llamafactory' if not misplaced else 'llamafactory|swift|trl'}`",
            file=sys.stderr,
        )
        return 2
    options = SplitOptions(seed=args.split_seed, val_fraction=args.val_fraction, test_fraction=args.test_fraction)
    toolkit_options = ImportOptions(
        allow_outside=args.allow_outside, split=args.split, datasets=tuple(args.dataset or ())
    )
    status, report = import_pairs(
        args.source,
        args.out,
        options=options,
        allow_uncaptioned=args.allow_uncaptioned,
        allow_size_mismatch=args.allow_size_mismatch,
        encoding=args.encoding,
        toolkit=args.toolkit,
        toolkit_options=toolkit_options,
    )
    problems = report["problems"]
    for line in report["warnings"]:
        print(f"warning: {line}", file=sys.stderr)
    skipped = report["skipped"][: report.get("toolkit_rows_skipped", 0)]
    for line in skipped[:20]:
        print(f"skipped: {line}", file=sys.stderr)
    if len(skipped) > 20:
        print(f'skipped: … and {len(skipped) - 20} more row(s): {args.out}/report.json "skipped"', file=sys.stderr)
    if problems:
        print(
            f"error: {len(problems)} problem(s) in {report['source']}; nothing imported "
            f"(report: {args.out}/report.json, {args.out}/summary.html)",
            file=sys.stderr,
        )
        for line in problems:
            print(line, file=sys.stderr)
        return status
    for note in report["notes"]:
        print(f"note: {note}", file=sys.stderr)
    splits = ", ".join(f"{k} {v}" for k, v in report["pairs_by_split"].items())
    captions = report["captions"]
    print(
        f"imported {report['pairs']} pair(s) ({splits}; {report['pairs_without_captions']} without captions) "
        f"with {captions['captions']} caption(s), vocabulary {captions.get('vocabulary', 0)}: {args.out}/pairs.jsonl; "
        f"summary {args.out}/summary.html"
        + (f"; {len(report['warnings'])} warning(s) above" if report["warnings"] else "")
        + (f"; {len(skipped)} row(s) of {args.source} skipped (listed above)" if skipped else "")
    )
    return status


def _export(args) -> int:
    from davir.data.toolkits import export_toolkit
    from davir.integrations.prompts import epc_prompt_for
    from davir.models.vlm.epc import EpcConfig

    try:
        epc = EpcConfig(num_entities=args.num_entities, **({"prompt": args.prompt} if args.prompt else {}))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.entities is not None:  # as train.py checks data.entities against data.root
        from davir.data.caches import check_cache_root

        check_cache_root(
            args.entities,
            args.root,
            key="--entities",
            moved_from=args.moved_from,
            root_key="--root",
            moved_hint="pass --moved-from ",
        )
    summary = export_toolkit(
        args.to,
        args.format,
        args.root,
        args.split or ["train", "val", "test"],
        args.out,
        prompt_for=epc_prompt_for(args.entities, epc),
        name=args.name,
        overwrite=args.overwrite,
    )
    splits = ", ".join(f"{split} {c['pairs']} pairs / {c['samples']} samples" for split, c in summary["splits"].items())
    print(f"{args.to}: {splits}: {', '.join(summary['files'])} in {args.out}")
    return 0


FORMAT_HELP = "the dataset's format: clevr_change, clevr_dc, spot_the_diff, ier, levir_cc or folder (docs/datasets.md)"
ROOT_HELP = "the folder holding the dataset's annotation files, in the layout docs/datasets.md gives for its format"


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m davir.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    stats = commands.add_parser("stats", help="per-split counts as JSON; works on annotations alone")
    stats.add_argument("--format", required=True, help=FORMAT_HELP)
    stats.add_argument("--root", required=True, help=ROOT_HELP)
    stats.add_argument("--split", action="append", help="split(s) to count (default: all of the format's)")

    verify = commands.add_parser(
        "verify",
        help="is my download complete? official pair/image counts per split, "
        "every missing, empty or undecodable image with its record; exit 1 when short",
    )
    verify.add_argument("--format", required=True, help=FORMAT_HELP)
    verify.add_argument("--root", required=True, help=ROOT_HELP)
    verify.add_argument("--split", action="append", help="split(s) to check (default: all of the format's)")
    verify.add_argument("--quick", action="store_true", help="check existence and size only, do not decode images")
    verify.add_argument(
        "--out",
        help="write every split's counts and problems to this JSON file (never a file of the dataset: "
        "inside --root only a new file or an earlier report)",
    )

    importer = commands.add_parser(
        "import",
        help="check your own pairs (a pairs.csv/.jsonl or a folder) end to end; "
        "write a normalised pairs.jsonl, report.json and summary.html; exit 2 on problems",
    )
    importer.add_argument("source", help="a pairs.csv / pairs.jsonl manifest, or a folder of pairs")
    importer.add_argument(
        "--out",
        required=True,
        help="folder for pairs.jsonl, report.json and summary.html: a new one, or an earlier import's (its files are "
        "replaced; files of those names that no import wrote are refused)",
    )
    importer.add_argument("--val-fraction", type=float, default=0.1, help="seeded split of pairs without a split")
    importer.add_argument("--test-fraction", type=float, default=0.1)
    importer.add_argument("--split-seed", type=int, default=0)
    importer.add_argument(
        "--allow-uncaptioned",
        action="store_true",
        help="keep pairs without captions (captionable only, never trained on)",
    )
    importer.add_argument(
        "--allow-size-mismatch",
        action="store_true",
        help="accept before/after of different sizes (before is resized to after)",
    )
    importer.add_argument(
        "--encoding",
        default=None,
        help="the manifest's text encoding when it is not UTF-8 (e.g. latin-1, cp1252); "
        "the pairs.jsonl written is UTF-8",
    )

    importer.add_argument(
        "--from",
        dest="toolkit",
        choices=("llamafactory", "swift", "trl"),
        default=None,
        help="SOURCE is that toolkit's dataset (an export folder or one file), e.g. what "
        "`export --to` wrote; rows that are no pair are skipped and listed, exit 1 "
        "(docs/toolkits.md)",
    )
    importer.add_argument(
        "--split",
        choices=("train", "val", "test"),
        default=None,
        help="with --from: the split of a file whose name is not one (default: LLaMA-Factory's "
        "declared split, else the seeded split)",
    )
    importer.add_argument(
        "--dataset",
        action="append",
        default=None,
        help="with --from llamafactory: a dataset of dataset_info.json to read (repeatable)",
    )
    importer.add_argument(
        "--allow-outside",
        action="store_true",
        help="with --from: read images and files outside the dataset's folder (davir's own "
        "export names absolute paths; a downloaded dataset should not)",
    )

    export = commands.add_parser(
        "export",
        help="write a dataset as LLaMA-Factory / ms-swift / TRL multi-image chat "
        "datasets (before image, after image, the DAVIR prompt; the captions as answers)",
    )
    export.add_argument("--to", required=True, choices=("llamafactory", "swift", "trl"))
    export.add_argument("--format", required=True)
    export.add_argument("--root", required=True)
    export.add_argument("--split", action="append", help="split(s) to write (repeatable; default: train, val, test)")
    export.add_argument("--out", required=True, help="folder for <split>.jsonl (+ dataset_info.json for llamafactory)")
    export.add_argument(
        "--entities",
        default=None,
        help="a davir entity cache: add the EPC entity phrase to each pair's prompt (`python -m preprocess entities`)",
    )
    export.add_argument(
        "--moved-from",
        default=None,
        help="the dataset root the entity cache recorded, when the "
        "dataset only moved since (as train.py's data.moved_from)",
    )
    export.add_argument("--num-entities", type=int, default=1, help="entities in the EPC phrase (k of Eq. 10)")
    export.add_argument("--prompt", default=None, help="the base prompt (default: DAVIR's)")
    export.add_argument("--name", default=None, help="dataset name in dataset_info.json (default: the root's name)")
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files in --out that an earlier export did not write or that changed since (refused otherwise)",
    )

    synth = commands.add_parser("synth", help="render the built-in synthetic change dataset (CLEVR-Change layout)")
    synth.add_argument("--out", required=True)
    synth.add_argument("--scenes", type=int, default=5000)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--width", type=int, default=320)
    synth.add_argument("--height", type=int, default=240)
    synth.add_argument(
        "--semantic-distractor-rate",
        type=float,
        default=0.3,
        help="share of semantic pairs that also carry an illumination/viewpoint distractor",
    )
    synth.add_argument(
        "--difficulty",
        choices=("standard", "hard"),
        default="standard",
        help="standard: today's set (3-7 objects, small orbit of the camera, global light change); "
        "hard: 6-10 partly hidden and small objects, camera moves with parallax, moving "
        "shadows, a textured floor (docs/experiments/synthetic_hard.md)",
    )
    synth.add_argument("--min-objects", type=int, default=None, help="default: the difficulty's (3 / 6)")
    synth.add_argument("--max-objects", type=int, default=None, help="default: the difficulty's (7 / 10)")
    synth.add_argument("--workers", type=int, default=0, help="processes (0 = one per core)")

    show = commands.add_parser("show", help="draw a grid of before/after/mask thumbnails with captions")
    show.add_argument("--format", required=True, help=FORMAT_HELP)
    show.add_argument("--root", required=True, help=ROOT_HELP)
    show.add_argument("--split", default="test", help="the split to draw (default: test)")
    show.add_argument(
        "--out",
        required=True,
        help="the picture to write, in the format its suffix names: .png, .jpg/.jpeg or .webp (never a file of the "
        "dataset: inside --root only a new file or an earlier grid)",
    )
    show.add_argument("--num", type=int, default=12, help="pairs to draw, one row each: 1 to 500 (default: 12)")

    pairs = commands.add_parser(
        "pairs",
        help="write a folder-format pairs.csv (captions, splits, masks) of some "
        "pairs of a dataset: input for caption.py, or a folder to train on",
    )
    pairs.add_argument("--format", required=True)
    pairs.add_argument("--root", required=True)
    pairs.add_argument("--split", action="append", help="split(s) to write (repeatable; default: test)")
    pairs.add_argument("--num", type=int, default=8, help="pairs per split (0 = all)")
    pairs.add_argument(
        "--copy-images",
        action="store_true",
        help="copy the images into before/, after/, masks/ beside the CSV (a stand-alone folder)",
    )
    pairs.add_argument("--out", required=True, help="the .csv to write; image paths are written relative to its folder")

    args = parser.parse_args(argv)
    try:
        if args.command == "stats":
            from davir.data.stats import dataset_stats, unreadable_splits

            result = dataset_stats(args.format, args.root, args.split)
            print(json.dumps(result, indent=2))
            failed = unreadable_splits(result)
            # A split the user asked for, or every split, unreadable: a failure, not a JSON detail.
            if failed and (args.split or len(failed) == len(result["splits"])):
                split, message = next(iter(failed.items()))
                more = f" (and {len(failed) - 1} more split(s))" if len(failed) > 1 else ""
                print(f"error: {args.format} split {split!r} cannot be read: {message}{more}", file=sys.stderr)
                return 2
            for split, message in failed.items():
                print(f"note: {args.format} split {split!r} cannot be read: {message}", file=sys.stderr)
        elif args.command == "verify":
            return _verify(args)
        elif args.command == "import":
            return _import(args)
        elif args.command == "synth":
            from davir.data.synthetic import SynthConfig, generate_dataset

            config = SynthConfig(
                scenes=args.scenes,
                seed=args.seed,
                width=args.width,
                height=args.height,
                semantic_distractor_rate=args.semantic_distractor_rate,
                difficulty=args.difficulty,
                min_objects=args.min_objects,
                max_objects=args.max_objects,
            )
            summary = generate_dataset(args.out, config, workers=args.workers)
            print(json.dumps(summary, indent=2))
        elif args.command == "pairs":
            from davir.data.export import write_pairs_manifest

            print(
                write_pairs_manifest(
                    args.format, args.root, args.split or ["test"], args.out, num=args.num, copy_images=args.copy_images
                )
            )
        elif args.command == "export":
            return _export(args)
        elif args.command == "show":
            from davir.data.show import draw_grid

            grid = draw_grid(args.format, args.root, args.split, args.out, num=args.num)
            print(grid.path)
            for _, reason in grid.failed:  # as caption.py: the others are drawn, these are named, exit 1
                print(f"not drawn: {reason}", file=sys.stderr)
            if grid.failed:
                print(
                    f"error: {len(grid.failed)} of {grid.drawn + len(grid.failed)} pair(s) could not be drawn "
                    f"(crossed out in {grid.path}; listed above)",
                    file=sys.stderr,
                )
            return grid.status
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, permissions: one line, never a traceback (docs/errors.md)
        from davir.errors import describe_os_error

        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
