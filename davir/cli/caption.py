"""`caption.py` / `davir-caption`: caption your own folder of image pairs with a trained checkpoint; JSONL out, and an HTML report to look at.

    python caption.py --checkpoint runs/demo --pairs my_pairs/ --out captions.jsonl --html report.html
    accelerate launch caption.py …       # the pairs split over processes; one output, in input order

Any trained model captions, with masks and entities made as in its training. A pair that cannot be read is listed
with its reason; the others still get captions. Layouts of --pairs: docs/datasets.md, "Your own folder of pairs";
reruns, locks and shards: docs/recipes.md, "Evaluation and captioning".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.errors import DataError, describe_os_error
from davir.inference import CaptionerOptions, caption_folder
from davir.runtime.arguments import at_least
from davir.runtime.signals import stop_on_signals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="caption.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="run folder (best/, else last/) or saved model: DAVIR or subtraction/SCORER/DIRL/RDD/CHEER",
    )
    parser.add_argument("--pairs", required=True, type=Path, help="folder of pairs or a pairs.csv/.jsonl manifest")
    parser.add_argument("--out", type=Path, help="JSONL output (default: PAIRS/captions.jsonl)")
    parser.add_argument(
        "--html",
        type=Path,
        help="HTML report (default: next to --out, report.html + report_files/); a rerun that resumes needs the same one",
    )
    parser.add_argument(
        "--report-limit",
        type=at_least(0),
        default=1000,
        help="captioned pairs shown in the report, the first N of the input (failed ones are all listed)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start again instead of resuming (a rerun otherwise skips the pairs already captioned); "
        "with --num-shards/--shard-index each shard clears only its own share",
    )
    parser.add_argument(
        "--wait-lock",
        action="store_true",
        help="when another run writes the same --out (OUT.lock), wait for it instead of stopping",
    )
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--batch-size", type=at_least(1), default=32)
    decoding.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="vllm: a merged export (davir-export --merge) of a chat family, on a CUDA GPU with "
        "vLLM installed; greedy, no attention maps (docs/toolkits.md)",
    )
    decoding.add_argument(
        "--merge-lora",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fold the LoRA deltas into the base weights in memory before captioning (default; "
        "about 1.5x faster on a GPU; the saved files are untouched)",
    )
    decoding.add_argument(
        "--compile",
        dest="static_decode",
        action="store_true",
        help="a static KV cache of one shape for every batch; on a CUDA GPU the decode step is "
        "compiled with CUDA graphs (the first batches wait for the compiler; then about 1.4x "
        "faster on a 7B model at --batch-size 64). Same captions",
    )
    decoding.add_argument(
        "--num-beams",
        type=int,
        default=None,
        help="default: the run's run.num_beams (the decoding its best/ was selected with)",
    )
    decoding.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's run.max_new_tokens")
    decoding.add_argument(
        "--workers", type=at_least(0), help="DataLoader workers preparing pairs (default: CPU cores - 1, ≤ 4)"
    )
    decoding.add_argument(
        "--resize-mismatched",
        action="store_true",
        help="resize the before image to the after image's size instead of reporting the pair",
    )
    shards = parser.add_argument_group("sharding (under `accelerate launch` each process is a shard already)")
    shards.add_argument("--num-shards", type=at_least(1), help="split the pairs into N contiguous shards (one per job)")
    shards.add_argument("--shard-index", type=at_least(0), default=0, help="the shard this job captions (0-based)")
    moved = parser.add_argument_group("what the run recorded, when it moved (default: the run's own paths)")
    moved.add_argument(
        "--allow-profile-mismatch",
        action="store_true",
        help="accept mask/entity caches of another preprocessing profile than the run trained on",
    )
    moved.add_argument("--masks-from", type=Path, help="mask cache whose settings to reuse (the run's data.masks)")
    moved.add_argument(
        "--entities-from", type=Path, help="entity cache holding the vocabulary and retriever (the run's data.entities)"
    )
    moved.add_argument("--pretrained", "--base-model", type=Path, help="the base model folder (model's `pretrained`)")
    moved.add_argument("--sam-checkpoint", type=Path, help="SAM weights, when the mask cache was made with SAM")
    moved.add_argument("--clip-checkpoint", type=Path, help="open_clip weights, when the entity cache used CLIP")
    moved.add_argument(
        "--backbone-weights",
        type=Path,
        help="ResNet-101 weights of a lightweight model (not needed for a random-init demo backbone)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


@stop_on_signals()
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = CaptionerOptions(
        masks_from=args.masks_from,
        entities_from=args.entities_from,
        pretrained=args.pretrained,
        sam_checkpoint=args.sam_checkpoint,
        clip_checkpoint=args.clip_checkpoint,
        backbone_weights=args.backbone_weights,
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        size_policy="resize_before_to_after" if args.resize_mismatched else "error",
        allow_profile_mismatch=args.allow_profile_mismatch,
        engine=args.engine,
        merge_lora=args.merge_lora,
        static_decode=args.static_decode,
    )
    try:
        return caption_folder(
            args.checkpoint,
            args.pairs,
            args.out,
            html=args.html,
            report_limit=args.report_limit,
            overwrite=args.overwrite,
            wait_lock=args.wait_lock,
            batch_size=args.batch_size,
            workers=args.workers,
            num_shards=args.num_shards,
            shard_index=args.shard_index,
            progress=not args.quiet,
            options=options,
        ).status
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, permissions changed mid-run: one line, never a traceback
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
