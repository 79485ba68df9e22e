"""ResNet-101 layer3 grid features for the lightweight methods (docs/methods/README.md), stored as fp16 shards.

    python -m preprocess features --format clevr_change --root DATA --split train --out CACHE \\
        --weights resnet101-63fe2227.pth [--batch-size 64] [--workers 4] [--num-shards K --shard-index I]

Recipe [C] (the SCORER/DIRL `extract_features.py`): RGB → ``cv2.resize(224×224, INTER_CUBIC)`` on uint8 →
/255 → ImageNet mean (0.485, 0.456, 0.406) / std (0.229, 0.224, 0.225) — ``--std-typo`` uses the
authors' (0.229, 0.224, 0.224) — → torchvision ``resnet101`` up to layer3 → 1024×14×14. Every image a
split uses is extracted once (before, after, CLEVR distractor; shared images deduplicated). On a GPU the
backbone runs in bf16 with channels_last; features are stored as fp16.

Weights come only from a local file (``--weights``: a torchvision ResNet-101 state dict); ``--random-init``
builds a seeded random ResNet-101 for tests (every residual branch scaled by 1/√blocks so activations stay in
fp16 range; ``zero_init_residual`` would leave an 11-pixel receptive field) and the manifest says so. Any
torchvision bottleneck ResNet whose layer3 gives 1024 channels loads through ``--weights`` (the layout is read
off the state dict): the demo uses the tiny one shipped in davir/assets/tiny_resnet (docs/experiments/tiny_backbone.md).

Cache layout (atomic writes; a rerun skips every image already stored, so a killed run resumes; the N
processes of ``accelerate launch -m preprocess features …`` split the images (image i to process i % N, each on
its own device; the main process writes index.json once all are stored), as K hand-started processes with
``--num-shards K --shard-index I`` do):

    CACHE/manifest.json                         extraction settings (identical for every run into CACHE),
                                                written once a run has stored every image of its share
    CACHE/manifest.incomplete.json              the same settings, "status": "incomplete", while the first
                                                run (or its rerun) has not finished: not a cache yet
    CACHE/features/s{I}of{K}-{n}.safetensors    tensor "features" (N, 1024, 14, 14) fp16; metadata "keys"
                                                = JSON list of the N image keys, row order
    CACHE/index.json                            {"chunks": [...], "entries": {key: [chunk file, row]}}
    CACHE/runs/{split}-s{I}of{K}.json           counts of one run (extracted, already there, missing)

A run that stops (an unreadable image: exit 2, its pair and file named; a kill) keeps the chunks it finished;
a first run leaves no manifest.json, so `FeatureCache` and train.py say the extraction has not finished
rather than reading it as a cache, and the rerun resumes after the stored chunks (a killed write's temporary
is removed, never read).

An image key is the image path relative to the dataset root (POSIX separators), so keys repeat across datasets:
a cache takes the images of the one dataset root its manifest records, and a run with another `--root` is
refused before any work (`--moved-from RECORDED_ROOT` when the dataset only moved). `FeatureCache(CACHE)
.get(image_path)` returns the stored (1024, 14, 14) tensor for a path under the dataset root or a key.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from davir.data.caches import add_moved_from_argument, refuse_another_root
from davir.data.feature_cache import (
    FEATURE_SHAPE,
    FORMAT_VERSION,
    MANIFEST,
    UNFINISHED_MANIFEST,
    image_key,
    next_chunk_number,
    scan_index,
    write_chunk,
    write_index,
)
from davir.data.formats import FORMATS, read_dataset
from davir.errors import DataError, check_output_dir
from davir.io import read_json, write_json_atomic
from davir.jobs.processes import ProcessLayout, process_layout
from davir.preprocessing.backbone import (
    AUTHORS_STD,
    IMAGE_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    NO_WEIGHTS,
    build_backbone,
    file_sha256,
    load_resized,
    normalize_batch,
)
from davir.runtime.locks import output_lock, shard_job
from davir.runtime.signals import stop_on_signals

MISSING_EXAMPLES = 20


class _ImageList(torch.utils.data.Dataset):
    """(row, uint8 CHW tensor, error) per image; decoding and resizing run in the loader workers.

    An image that cannot be read gives a blank tensor and its error's one line (naming the pair, from `pairs`:
    key → the ids of the pairs using it, and the file), which the main process raises: a DataError raised in a
    worker would reach the user as torch's "Caught DataError in DataLoader worker" with the worker's traceback."""

    def __init__(self, items: list[tuple[str, Path]], pairs: dict[str, list[str]] | None = None):
        self.items = items
        self.pairs = pairs or {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        key, path = self.items[index]
        users = self.pairs.get(key) or [key]
        try:
            image = load_resized(path, record=users[0])
        except DataError as error:
            blank = torch.zeros(3, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8)
            return index, blank, f"{error}{also_used_by(users[1:])}"
        return index, torch.from_numpy(image).permute(2, 0, 1).contiguous(), ""


def also_used_by(others: list[str]) -> str:
    """The other pairs an image belongs to, for its error message ('' for none)."""
    if not others:
        return ""
    shown = ", ".join(repr(pair_id) for pair_id in others[:3]) + (", …" if len(others) > 3 else "")
    return f" (the image of {len(others)} other pair{'s' if len(others) > 1 else ''} too: {shown})"


@dataclass
class Settings:
    """What makes two caches interchangeable; stored in manifest.json and checked on every run."""

    weights: str  # "random-init(seed=N,…)" or the weights file's sha256
    std: tuple[float, float, float]
    dataset_root: str

    def manifest(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "backbone": "torchvision resnet101 up to layer3",
            "weights": self.weights,
            "input": f"{IMAGE_SIZE}x{IMAGE_SIZE} cv2.INTER_CUBIC, RGB, /255, ImageNet mean",
            "mean": list(IMAGENET_MEAN),
            "std": list(self.std),
            "shape": list(FEATURE_SHAPE),
            "dtype": "float16",
            "dataset_root": self.dataset_root,
        }


def check_manifest(cache: Path, settings: Settings, write: bool = True) -> None:
    """Refuse a cache made with other settings (mixed features would be silent garbage), or, in a folder that is
    no cache yet, record the settings in manifest.incomplete.json (`write`: not a launch's other processes), so
    that a rerun after a failure or a kill compares against them. manifest.json is written only by
    `finish_manifest`, once a run has stored its images: a first run that stops leaves no manifest.json, so the
    folder is not taken for a cache (`FeatureCache`, train.py name the unfinished extraction instead)."""
    wanted = settings.manifest()
    for path in (cache / MANIFEST, cache / UNFINISHED_MANIFEST):
        if path.is_file():
            existing = read_json(path)
            differing = [k for k in wanted if k != "dataset_root" and existing.get(k) != wanted[k]]
            if differing:
                raise DataError(
                    f"{path}: the cache was made with other settings ({', '.join(differing)}: "
                    f"{[existing.get(k) for k in differing]} vs {[wanted[k] for k in differing]}); use another --out"
                )
            return
    if write:
        write_json_atomic(
            cache / UNFINISHED_MANIFEST,
            {
                **wanted,
                "status": "incomplete",
                "note": "a run of `python -m preprocess features` into this folder has not finished; rerun it to "
                "resume (manifest.json replaces this file once every image of a run is stored)",
            },
        )


def finish_manifest(cache: Path, settings: Settings) -> None:
    """After a run has stored every image of its share: manifest.json (if the cache had none yet), and the
    unfinished record gone."""
    if not (cache / MANIFEST).is_file():
        write_json_atomic(cache / MANIFEST, settings.manifest())
    (cache / UNFINISHED_MANIFEST).unlink(missing_ok=True)


# --- extraction ------------------------------------------------------------------------------------
def pick_device(name: str, launched_on: str | None = None) -> torch.device:
    """--device; `auto` is this process's accelerate device under `accelerate launch` (`launched_on`)."""
    if name == "auto" and launched_on is not None:
        return torch.device(launched_on)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DataError("--device cuda was asked for but no GPU is available")
    return torch.device(name)


def default_batch_size(device: torch.device) -> int:
    """Images per forward pass: 64 on a GPU, 8 on the CPU (there a batch of 64 allocates ~200 MB per
    activation, and its page faults cost more than the convolutions)."""
    return 8 if device.type == "cpu" else 64


def extract_images(
    items: list[tuple[str, Path]],
    cache: Path,
    backbone: torch.nn.Module,
    *,
    std: Sequence[float],
    chunk_prefix: str,
    device: torch.device,
    batch_size: int = 64,
    workers: int = 2,
    chunk_size: int = 256,
    progress: bool = True,
    description: str = "features",
    pairs: dict[str, list[str]] | None = None,
) -> int:
    """Run the backbone over (key, path) items and store fp16 chunks of `chunk_size`; returns images written.
    An unreadable image stops it with a DataError naming the image's pair (`pairs`: key → pair ids) and file;
    the chunks written before stay (a rerun resumes after them)."""
    if not items:
        return 0
    cuda = device.type == "cuda"
    backbone = backbone.to(device)
    if cuda:
        backbone = backbone.to(memory_format=torch.channels_last)
    loader = torch.utils.data.DataLoader(
        _ImageList(items, pairs), batch_size=batch_size, num_workers=workers, pin_memory=cuda, persistent_workers=False
    )
    number = next_chunk_number(cache, chunk_prefix)
    pending: list[torch.Tensor] = []
    pending_keys: list[str] = []
    written = 0

    def flush(count: int) -> None:
        """Write the first `count` pending rows as one chunk file."""
        nonlocal number, written, pending, pending_keys
        stacked = torch.cat(pending)
        features, keys = stacked[:count], pending_keys[:count]
        if not bool(torch.isfinite(features).all()):
            raise DataError(f"non-finite features (fp16 overflow?) for images {keys[:5]}; check the weights")
        write_chunk(cache / "features" / f"{chunk_prefix}-{number:06d}.safetensors", features.clone(), keys)
        pending, pending_keys = [stacked[count:]], pending_keys[count:]
        number, written = number + 1, written + count

    with torch.no_grad(), tqdm(total=len(items), desc=description, unit="image", disable=not progress) as bar:
        for rows, images, errors in loader:
            failed = [error for error in errors if error]
            if failed:
                more = f" ({len(failed) - 1} more unreadable image(s) in this batch)" if len(failed) > 1 else ""
                raise DataError(f"{failed[0]}{more}")
            x = normalize_batch(images.to(device, non_blocking=cuda), std)
            if cuda:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    features = backbone(x.contiguous(memory_format=torch.channels_last))
            else:
                features = backbone(x)
            pending.append(features.float().to(torch.float16).cpu())
            pending_keys.extend(items[row][0] for row in rows.tolist())
            while len(pending_keys) >= chunk_size:
                flush(chunk_size)
            bar.update(len(rows))
    if pending_keys:
        flush(len(pending_keys))
    return written


def images_and_pairs(index, dataset_root: Path) -> tuple[dict[str, Path], dict[str, list[str]]]:
    """({key: path} of every image a split uses, in first-use order; {key: ids of the pairs using it}): an
    image that cannot be read is named with its pair, as the other preprocessing jobs name it."""
    seen: dict[str, Path] = {}
    users: dict[str, list[str]] = {}
    for pair in index.pairs:
        for path in (pair.before, pair.after, pair.distractor):
            if path is not None:
                key = image_key(path, dataset_root)
                seen.setdefault(key, Path(path))
                pair_ids = users.setdefault(key, [])
                if not pair_ids or pair_ids[-1] != pair.pair_id:  # a pair's distractor may be its after image
                    pair_ids.append(pair.pair_id)
    return seen, users


def chunk_prefix(layout: ProcessLayout) -> str:
    """A shard's name in its chunk files (s000of001-000003.safetensors) and run records: each shard writes only its own."""
    return f"s{layout.index:03d}of{layout.count:03d}"


def remove_stale_temporaries(cache: Path, layout: ProcessLayout) -> int:
    """Remove the temporaries a killed run of this shard left (`.s000of001-000003.safetensors.<pid>.<random>.tmp`;
    its lock is held, so no live writer owns them), and, where this process alone writes the cache's shared files
    (one shard, or a launch's main process), those of manifest.json, manifest.incomplete.json and index.json.
    Returns how many went."""
    stale = list((cache / "features").glob(f".{chunk_prefix(layout)}-*.tmp"))
    if layout.count == 1 or (layout.launched and layout.is_main):
        stale += [p for name in (MANIFEST, UNFINISHED_MANIFEST, "index.json") for p in cache.glob(f".{name}.*.tmp")]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def run(args: argparse.Namespace, layout: ProcessLayout | None = None) -> dict:
    """The `features` command: returns the run record (also written to CACHE/runs/; under `accelerate launch` the
    whole run's, merged by the main process, which also writes index.json once every share is stored)."""
    if args.num_shards < 1 or not 0 <= args.shard_index < args.num_shards:
        raise DataError(f"--shard-index must be in 0..{args.num_shards - 1}, got {args.shard_index}")
    layout = layout or process_layout(args.num_shards, args.shard_index)
    if args.random_init and args.weights:
        raise DataError("--weights and --random-init exclude each other")
    started = time.perf_counter()
    root, cache = Path(args.root), check_output_dir(args.out, what="--out")  # before any work (docs/errors.md)
    refuse_another_root(cache, root, args.moved_from)
    index = read_dataset(args.format, root, args.split)
    paths, pairs_of = images_and_pairs(index, root)
    images = list(paths.items())
    mine = layout.share(images)
    layout.announce(len(mine), len(images), "images")

    if args.random_init:
        weights_id = f"random-init(seed={args.seed},branches=1/sqrt(blocks))"  # not the zero-branch v1
    elif not args.weights:
        raise DataError(NO_WEIGHTS)
    elif not Path(args.weights).is_file():
        raise DataError(f"ResNet-101 weights file is missing: {args.weights}")
    else:
        weights_id = f"sha256:{file_sha256(Path(args.weights))}"
    std = AUTHORS_STD if args.std_typo else IMAGENET_STD
    cache.mkdir(parents=True, exist_ok=True)
    settings = Settings(weights_id, tuple(std), str(root.resolve()))
    # Hand-set shards each record the settings (one may start alone); in a launch only the main process writes.
    writes_manifest = layout.is_main or not layout.launched
    check_manifest(cache, settings, write=writes_manifest)

    remove_stale_temporaries(cache, layout)
    done = scan_index(cache)
    todo = [(key, path) for key, path in mine if key not in done]
    missing = [(key, path) for key, path in todo if not path.is_file()]
    if missing and not args.skip_missing:
        examples = ", ".join(f"{path} of pair {pairs_of[key][0]!r}" for key, path in missing[:3])
        raise DataError(
            f"{len(missing)} of {len(todo)} images to extract are missing (e.g. {examples}); "
            "pass --skip-missing to extract the others and count these in the run record"
        )
    missing_keys = {key for key, _ in missing}
    todo = [(key, path) for key, path in todo if key not in missing_keys]
    written = 0
    device = pick_device(args.device, layout.device)
    if todo:
        backbone = build_backbone(args.weights, random_init=args.random_init, seed=args.seed)
        written = extract_images(
            todo,
            cache,
            backbone,
            std=std,
            chunk_prefix=chunk_prefix(layout),
            device=device,
            batch_size=args.batch_size or default_batch_size(device),
            workers=args.workers,
            chunk_size=args.chunk_size,
            progress=not args.no_progress,
            description=f"features {args.split}",
            pairs=pairs_of,
        )
    entries = {} if layout.launched else write_index(cache)  # a launch: the main process, once all are done
    if not layout.launched:
        finish_manifest(cache, settings)
    seconds = time.perf_counter() - started
    record = {
        "format": args.format,
        "split": args.split,
        "shard": [layout.index, layout.count],
        "images_in_split": len(images),
        "images_in_shard": len(mine),
        "extracted": written,
        "already_cached": len(mine) - len(todo) - len(missing),
        "missing": len(missing),
        "missing_examples": [str(p) for _, p in missing[:MISSING_EXAMPLES]],
        "cache_entries": len(entries),
        "device": str(device),
        "seconds": round(seconds, 3),
        "skipped_records": len(index.skipped),
    }
    write_json_atomic(cache / "runs" / f"{args.split}-{chunk_prefix(layout)}.json", record)
    if not layout.launched:
        return record
    merged = merge_process_records(
        layout.gather(record), cache, split=args.split, write=layout.is_main, seconds=time.perf_counter() - started
    )
    if layout.is_main:  # every process has stored its share now
        finish_manifest(cache, settings)
    return merged


def merge_process_records(records: list[dict], cache: Path, *, split: str, write: bool, seconds: float) -> dict:
    """The record of a whole `accelerate launch` (as one process's run would read) from its processes' records;
    `write` (the main process): index.json of every chunk and `runs/SPLIT-s000of001.json`."""
    counted = ("images_in_shard", "extracted", "already_cached", "missing")
    merged = {
        **records[0],
        "shard": [0, 1],
        "processes": [
            {
                "index": i,
                "images": r["images_in_shard"],
                "extracted": r["extracted"],
                "device": r["device"],
                "seconds": r["seconds"],
            }
            for i, r in enumerate(records)
        ],
        **{key: sum(r[key] for r in records) for key in counted},
        "seconds": round(seconds, 3),
    }
    merged["missing_examples"] = [e for r in records for e in r["missing_examples"]][:MISSING_EXAMPLES]
    if write:
        merged["cache_entries"] = len(write_index(cache))
        write_json_atomic(cache / "runs" / f"{split}-s000of001.json", merged)
    return merged


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m preprocess features", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--format", required=True, choices=sorted(FORMATS))
    parser.add_argument("--root", required=True, help="dataset root (as for `python -m davir.data stats`)")
    parser.add_argument("--split", required=True)
    parser.add_argument("--out", required=True, help="cache folder (shared by splits and shards)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--weights", help="local torchvision ResNet-101 state dict (.pth)")
    source.add_argument("--random-init", action="store_true", help="seeded random backbone (tests/demo only)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --random-init")
    parser.add_argument("--std-typo", action="store_true", help="the authors' std (0.229, 0.224, 0.224)")
    add_moved_from_argument(parser)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="images per forward pass (default 64 on a GPU, 8 on the CPU, where a larger batch "
        "costs more in page faults than in convolutions)",
    )
    parser.add_argument("--workers", type=int, default=2, help="decode/resize processes (0 = in the main process)")
    parser.add_argument("--chunk-size", type=int, default=256, help="images per shard file")
    parser.add_argument("--num-shards", type=int, default=1)
    parser.add_argument("--shard-index", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--skip-missing",
        action="store_true",
        help="extract the images present and count missing ones instead of failing",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")
    parser.add_argument(
        "--wait-lock",
        action="store_true",
        help="when another run writes the same cache (shard), wait for it instead of stopping",
    )
    return parser


@stop_on_signals()
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_output_dir(args.out, what="--out")  # before its lock file is made beside it
        layout = process_layout(args.num_shards, args.shard_index)
        # Per shard, whatever the split: chunk files are named by shard (s000of001-*), not by split.
        with output_lock(
            args.out,
            what=f"feature cache {args.out}",
            job=shard_job("features", layout.count, layout.index),
            wait=args.wait_lock,
        ):
            record = run(args, layout)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not layout.launched or layout.is_main:
        print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
