"""Throughput of grid-feature extraction, end to end: decode → bicubic resize → ResNet-101 to layer3 → fp16 shards.

    python bench/features.py                 # GPU if available (bf16 + channels_last), else a small CPU run
    python bench/features.py --images 2048 --batch-size 128 --workers 8
    python bench/features.py --weights davir/assets/tiny_resnet/backbone.pth --images 256 --batch-size 8,64 --workers 0 --threads 1

Images are the real CLEVR-Change fixtures (480×320 PNG) from ../shared/datasets, cycled to the requested
count under distinct keys, so every one is decoded, resized, run and written. The backbone is a seeded
random ResNet-101 (`--weights` for real ones): throughput does not depend on the weights. Prints one
JSON object; the first (warm-up) batch is not timed. Several `--batch-size` values (comma-separated) run one
after the other in the same process and are reported side by side under "runs".
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from davir.data.feature_cache import FEATURE_SHAPE  # noqa: E402
from davir.jobs.features import default_batch_size, extract_images, pick_device  # noqa: E402
from davir.preprocessing.backbone import IMAGENET_STD, build_backbone  # noqa: E402

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "clevr_change"


def time_extraction(items, backbone, device, batch_size: int, workers: int, out_dir: str | None) -> dict:
    gpu = device.type == "cuda"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(out_dir) / f"batch{batch_size}" if out_dir else Path(scratch)
        # Warm-up (cuDNN algorithm choice, worker start, page cache) on one batch, not timed.
        extract_images(
            items[:batch_size],
            out / "warmup",
            backbone,
            std=IMAGENET_STD,
            chunk_prefix="warmup",
            device=device,
            batch_size=batch_size,
            workers=workers,
            progress=False,
        )
        if gpu:
            torch.cuda.synchronize()
        started, cpu_started = time.perf_counter(), time.process_time()
        written = extract_images(
            items,
            out / "timed",
            backbone,
            std=IMAGENET_STD,
            chunk_prefix="bench",
            device=device,
            batch_size=batch_size,
            workers=workers,
            progress=False,
        )
        if gpu:
            torch.cuda.synchronize()
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        stored = sum(p.stat().st_size for p in (out / "timed" / "features").glob("*.safetensors"))
    return {
        "batch_size": batch_size,
        "images": written,
        "seconds": round(seconds, 3),
        "images_per_s": round(written / seconds, 2),
        "ms_per_image": round(1000 * seconds / written, 2),
        "process_cpu_s": round(cpu_seconds, 2),
        "stored_mb": round(stored / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--images", type=int, help="images to extract (default: 1024 on GPU, 16 on CPU)")
    parser.add_argument(
        "--batch-size", help="one or more, comma-separated (default: 128 on GPU, 8 on CPU, as `preprocess features`)"
    )
    parser.add_argument("--workers", type=int, help="decode/resize processes (default: 8 on GPU, 1 on CPU)")
    parser.add_argument("--weights", help="local ResNet-101 weights (default: seeded random init)")
    parser.add_argument("--source", default=str(DEFAULT_SOURCE), help="folder searched for *.png images")
    parser.add_argument("--out", help="cache folder (default: a temporary folder, deleted afterwards)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    device = pick_device(args.device)
    gpu = device.type == "cuda"
    count = args.images or (1024 if gpu else 16)
    # On a GPU the bench's default is 128, not the command's 64: it measures how far a larger batch goes.
    default = 128 if gpu else default_batch_size(device)
    batch_sizes = [int(b) for b in args.batch_size.split(",")] if args.batch_size else [default]
    workers = args.workers if args.workers is not None else (8 if gpu else 1)
    sources = sorted(Path(args.source).rglob("*.png"))
    if not sources:
        raise SystemExit(f"no .png images under {args.source}")
    items = [(f"bench/{index:06d}.png", sources[index % len(sources)]) for index in range(count)]
    backbone = build_backbone(args.weights, random_init=args.weights is None, seed=0)

    runs = [time_extraction(items, backbone, device, batch_size, workers, args.out) for batch_size in batch_sizes]
    result = {
        "benchmark": "feature extraction end to end (decode, cv2 bicubic 224, ResNet-101 layer3, fp16 safetensors)",
        "device": torch.cuda.get_device_name(device) if gpu else f"cpu ({platform.processor() or platform.machine()})",
        "precision": "bf16 autocast, channels_last" if gpu else "fp32",
        "torch_threads": torch.get_num_threads(),
        "weights": args.weights or "random-init ResNet-101",
        "image_size": "480x320 PNG (CLEVR-Change)",
        "workers": workers,
        "feature_shape": list(FEATURE_SHAPE),
        "torch": torch.__version__,
        **(runs[0] if len(runs) == 1 else {"runs": runs}),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
