"""Throughput of the change-mask pipeline (`python -m preprocess masks`), printed as JSON.

    python bench/preprocess.py                       # makes a small synthetic set in a temp folder
    python bench/preprocess.py --root /data/synth --split test --pairs 300

CPU part (always): the whole per-pair pipeline in one process with one OpenCV thread — image loading,
Eq. 2 (difference map, registration, DBSCAN, prompts), the classical segmenter in both images,
Eq. 3 and the cache write — as pairs/s per core, at each working resolution of --work-sizes, with a
per-stage breakdown in ms/pair. `pairs_per_s_per_core` is wall-clock; `pairs_per_cpu_s` divides by
the CPU time the process actually got, which is what one idle core delivers (on a shared machine the
wall-clock rate understates it).

GPU part (only when `torch.cuda.is_available()`): SAM ViT-H with random weights (no checkpoint is
needed to time it) on the same pairs, end to end:
  * `batched`: this pipeline — CPU stage, image encoder over batches of images in bf16, all prompts
    of an image decoded at once through `SamPredictor.predict_torch`, Eq. 3 — for both images and
    for the after image only;
  * `official`: the per-image `SamPredictor` loop of the segment-anything README — `set_image` in
    fp32, then `predict` one prompt at a time, after image only and both images.
  Without CUDA the part reports "no GPU" (its numbers are owed, bench/README.md).

Processes part (`--processes 1 2`): the whole `preprocess masks` command under `accelerate launch` with 1 and
then 2 CPU processes (gloo; `--workers 1`, one OpenCV thread each) on the same split into fresh caches,
alternating `--repeats` times: wall seconds of the command (start-up included), the job's own seconds
(from its manifest), pairs/s of both, and whether the mask files are the same bytes (one sha256 over them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from davir.data import read_dataset  # noqa: E402
from davir.data.caches import MaskCache  # noqa: E402
from davir.data.images import load_rgb  # noqa: E402
from davir.preprocessing.change_regions import RegionSettings  # noqa: E402
from davir.preprocessing.mask_pipeline import finish_pair, prepare_pair, segment_requests  # noqa: E402
from davir.preprocessing.segmenters import SamSegmenter, build_segmenter  # noqa: E402


def synthetic_root(folder: Path, scenes: int) -> Path:
    """A small synthetic set (320x240, CLEVR-Change layout) to time on when no --root is given."""
    from davir.data.synthetic import SynthConfig, generate_dataset

    generate_dataset(folder, SynthConfig(scenes=scenes, seed=7, val_fraction=0.0, test_fraction=0.5), workers=0)
    return folder


def bench_cpu(pairs, work_size: int, cache_root: Path) -> dict:
    """One process, one OpenCV thread: ms/pair per stage and end-to-end pairs/s."""
    import cv2

    cv2.setNumThreads(1)
    settings = RegionSettings(work_size=work_size)
    segmenter = build_segmenter("classical")
    cache = MaskCache(cache_root / f"cpu-{work_size}")
    stages = {"load+eq2": 0.0, "segment": 0.0, "eq3": 0.0, "write": 0.0}
    start, cpu_start = time.perf_counter(), time.process_time()
    clusters = 0
    for pair in pairs:
        t0 = time.perf_counter()
        prepared = prepare_pair(pair, settings)
        t1 = time.perf_counter()
        candidates = segmenter.segment(segment_requests(prepared, True))
        t2 = time.perf_counter()
        result = finish_pair(prepared, candidates, settings.tau, True)
        t3 = time.perf_counter()
        cache.write(result.pair_id, result.before, result.after, result.info)
        t4 = time.perf_counter()
        for name, seconds in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            stages[name] += seconds
        clusters += len(prepared.regions.clusters)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "work_size": work_size,
        "pairs": len(pairs),
        "seconds": round(total, 2),
        "cpu_seconds": round(cpu, 2),
        # wall-clock rate (includes waiting for the disk and for other processes on a shared machine)
        "pairs_per_s_per_core": round(len(pairs) / total, 1),
        # rate per second of CPU time this process got: the per-core throughput on an idle core
        "pairs_per_cpu_s": round(len(pairs) / cpu, 1),
        "ms_per_pair": {name: round(1000 * seconds / len(pairs), 2) for name, seconds in stages.items()},
        "clusters_per_pair": round(clusters / len(pairs), 2),
    }


def bench_sam(pairs, settings: RegionSettings, batch_size: int, model_type: str = "vit_h", model=None) -> dict:
    """Batched bf16 pipeline vs the official per-image SamPredictor loop, same pairs, same run."""
    import torch
    from segment_anything import SamPredictor, sam_model_registry

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sam = (model if model is not None else sam_model_registry[model_type]()).to(device).eval()  # random weights
    segmenter = SamSegmenter(None, model_type, device=device, batch_size=batch_size, model=sam)
    prepared = [prepare_pair(pair, settings) for pair in pairs]  # the CPU stage, shared by both

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def batched(segment_both: bool) -> float:
        per_pair = 2 if segment_both else 1
        chunk = max(1, batch_size // per_pair)
        sync()
        start = time.perf_counter()
        for first in range(0, len(prepared), chunk):
            group = prepared[first : first + chunk]
            answers = segmenter.segment([r for p in group for r in segment_requests(p, segment_both)])
            for k, p in enumerate(group):
                finish_pair(p, answers[k * per_pair : (k + 1) * per_pair], settings.tau, segment_both)
        sync()
        return time.perf_counter() - start

    official_predictor = SamPredictor(sam)

    def official(segment_both: bool = False) -> float:
        sync()
        start = time.perf_counter()
        for p in prepared:
            sides = [(p.after, p.regions.prompts_after)]
            if segment_both:
                sides.append((p.before, p.regions.prompts_before))
            for image, prompts in sides:
                official_predictor.set_image(image)
                for prompt in prompts:
                    official_predictor.predict(
                        point_coords=np.array([prompt.point]),
                        point_labels=np.array([1]),
                        box=np.array(prompt.box),
                        multimask_output=True,
                    )
        sync()
        return time.perf_counter() - start

    # Warm-up (cuDNN autotuning, allocator) on a few pairs, not timed.
    warm = prepared
    prepared = warm[: min(4, len(warm))]
    batched(True), official()
    prepared = warm
    timings = {
        "batched_both": batched(True),
        "batched_after_only": batched(False),
        "official_after_only_fp32": official(),
        "official_both_fp32": official(True),
    }
    n = len(prepared)
    result = {name: {"seconds": round(t, 2), "pairs_per_s": round(n / t, 2)} for name, t in timings.items()}
    result["batched_both_ms_per_pair_by_stage"] = stage_breakdown(lambda: batched(True), segmenter, sync=sync, pairs=n)
    result["speedup_batched_after_only_vs_official"] = round(
        timings["official_after_only_fp32"] / timings["batched_after_only"], 2
    )
    result["speedup_batched_both_vs_official"] = round(timings["official_after_only_fp32"] / timings["batched_both"], 2)
    # the goal of issue 30: >= 4x with both images segmented on both sides
    result["speedup_batched_both_vs_official_both"] = round(timings["official_both_fp32"] / timings["batched_both"], 2)
    result.update(
        {
            "batched_encoder_dtype": "bf16" if segmenter.bf16 else "fp32",
            "model": model_type,
            "weights": "random",
            "pairs": n,
            "batch_size": batch_size,
            "device": device,
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "prompts_per_pair": round(sum(len(p.regions.prompts_after) for p in prepared) / n, 2),
        }
    )
    return result


def stage_breakdown(run: Callable[[], float], segmenter: SamSegmenter, *, sync: Callable, pairs: int) -> dict:
    """One more ``run()`` with each stage of the batched path timed alone (synchronised before and after, so the
    GPU work is charged to its stage): the resize to SAM's 1024 side (on SAM's device, the host-to-device copy of
    the image included), the image encoder, the prompt + mask decoder with the mask upsampling, Eq. 3; ``other`` is
    the rest of the wall time (batching, normalising, the prompts' and masks' copies between host and device,
    Python). The synchronisations serialise what the untimed path overlaps, so the stages add up to more than a
    plain run. ms per pair."""
    seconds: dict[str, float] = {}
    started: dict[str, float] = {}

    def begin(name: str) -> None:
        sync()
        started[name] = time.perf_counter()

    def end(name: str) -> None:
        sync()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started.pop(name)

    def timed(name: str, function: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            begin(name)
            try:
                return function(*args, **kwargs)
            finally:
                end(name)

        return wrapper

    encoder = segmenter.sam.image_encoder
    hooks = [
        encoder.register_forward_pre_hook(lambda *_: begin("image_encoder")),
        encoder.register_forward_hook(lambda *_: end("image_encoder")),
    ]
    module = sys.modules[__name__]
    patched = [
        (segmenter, "_resized", "resize_to_1024"),  # either --sam-resize
        (segmenter, "_decode", "prompt_and_mask_decoder"),
        (module, "finish_pair", "eq3_select"),  # batched() calls this module's name
    ]
    # (owner, attribute, its own value before or None): an instance attribute set here is deleted afterwards, so
    # the class's method shows through again; the module's function is put back.
    originals = [(owner, attribute, vars(owner).get(attribute)) for owner, attribute, _ in patched]
    try:
        for owner, attribute, name in patched:
            setattr(owner, attribute, timed(name, getattr(owner, attribute)))
        total = run()
    finally:
        for owner, attribute, original in originals:
            if original is None:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, original)
        for hook in hooks:
            hook.remove()
    staged = {name: round(1000 * value / pairs, 2) for name, value in seconds.items()}
    staged["other"] = round(1000 * (total - sum(seconds.values())) / pairs, 2)
    staged["total"] = round(1000 * total / pairs, 2)
    return staged


def _mask_bytes_sha256(cache: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted((cache / "masks").iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def bench_processes(root: Path, split: str, limit: int, counts: list[int], repeats: int, tmp: Path) -> dict:
    """`accelerate launch … -m preprocess masks` with each process count on the same pairs, alternating."""
    launcher = Path(sys.executable).parent / "accelerate"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    for repeat in range(repeats):
        for n in counts:
            out = tmp / f"processes-{n}-{repeat}"
            distributed = ["--multi_gpu"] if n > 1 else []
            command = [
                str(launcher),
                "launch",
                *distributed,
                "--num_processes",
                str(n),
                "--num_machines",
                "1",
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                "-m",
                "preprocess",
                "masks",
                "--format",
                "clevr_change",
                "--root",
                str(root),
                "--split",
                split,
                "--out",
                str(out),
                "--limit",
                str(limit),
                "--workers",
                "1",
                "--no-progress",
            ]
            start = time.perf_counter()
            done = subprocess.run(
                command, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True
            )
            wall = time.perf_counter() - start
            if done.returncode != 0:
                runs[n].append({"error": done.stderr[-800:]})
                continue
            manifest = json.loads((out / "manifest.json").read_text())
            pairs = manifest["counts"]["pairs"]
            runs[n].append(
                {
                    "wall_seconds": round(wall, 2),
                    "job_seconds": manifest["seconds"],
                    "pairs_per_s_wall": round(pairs / wall, 2),
                    "pairs_per_s_job": round(pairs / manifest["seconds"], 2),
                    "mask_files": len(list((out / "masks").iterdir())),
                    "mask_bytes_sha256": _mask_bytes_sha256(out),
                }
            )
    best = {
        n: max((r for r in rs if "job_seconds" in r), key=lambda r: r["pairs_per_s_job"], default=None)
        for n, rs in runs.items()
    }
    digests = {r["mask_bytes_sha256"] for rs in runs.values() for r in rs if "mask_bytes_sha256" in r}
    report = {
        "pairs": limit,
        "split": split,
        "runs": {str(n): rs for n, rs in runs.items()},
        "same_bytes_all_runs": len(digests) == 1,
        "load_1min_at_end": round(os.getloadavg()[0], 2),
    }
    if len(counts) > 1 and all(best.values()):
        first, last = counts[0], counts[-1]
        report[f"speedup_{last}_vs_{first}_job"] = round(
            best[last]["pairs_per_s_job"] / best[first]["pairs_per_s_job"], 2
        )
        report[f"speedup_{last}_vs_{first}_wall"] = round(
            best[last]["pairs_per_s_wall"] / best[first]["pairs_per_s_wall"], 2
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="a clevr_change-layout set with gt masks (default: make one)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--pairs", type=int, default=200, help="pairs timed on the CPU")
    parser.add_argument("--work-sizes", type=int, nargs="+", default=[224, 320])
    parser.add_argument("--sam-pairs", type=int, default=64, help="pairs timed with SAM on a GPU")
    parser.add_argument("--sam-batch-size", type=int, default=8)
    parser.add_argument("--sam-type", default="vit_h", choices=["vit_h", "vit_l", "vit_b"])
    parser.add_argument(
        "--sam-on-cpu",
        action="store_true",
        help="run the SAM part without a GPU too (a check that it runs; its numbers say nothing about a GPU)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=None,
        help="instead of the parts above: `preprocess masks` under accelerate with these process counts",
    )
    parser.add_argument("--process-pairs", type=int, default=300, help="pairs (--limit) for --processes")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per process count (--processes)")
    args = parser.parse_args(argv)

    import torch

    with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as tmp:
        tmp = Path(tmp)
        root = Path(args.root) if args.root else synthetic_root(tmp / "synth", max(8, args.pairs))
        split = args.split if args.root else "test"
        if args.processes:
            print(
                json.dumps(
                    {
                        "processes": bench_processes(
                            root, split, args.process_pairs, args.processes, args.repeats, tmp
                        ),
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                    },
                    indent=2,
                )
            )
            return 0
        pairs = read_dataset("clevr_change", root, split).pairs
        width, height = load_rgb(pairs[0].after).size
        report = {
            "root": str(root),
            "split": split,
            "image_size": [height, width],
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_stages": [bench_cpu(pairs[: args.pairs], size, tmp / "cache") for size in args.work_sizes],
        }
        if torch.cuda.is_available() or args.sam_on_cpu:
            report["sam"] = bench_sam(pairs[: args.sam_pairs], RegionSettings(), args.sam_batch_size, args.sam_type)
        else:
            report["sam"] = "no GPU: skipped (torch.cuda.is_available() is False); the SAM numbers are owed"
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
