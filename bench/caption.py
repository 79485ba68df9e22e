"""`caption.py` end to end on a folder of N pairs: pairs/s and peak RSS, beside evaluate.py's generation.

    python bench/caption.py --checkpoint runs/demo --data outputs/demo/data --sizes 100,1000,10000

Each size runs `caption.py` as a user would (a fresh process, online masks + entities, the JSONL and the
report) on a pairs.csv that cycles the test split's pairs under new ids; peak RSS is sampled every 50 ms
over the whole process tree (the main process and its DataLoader workers). `evaluate_generation` is
`ChangeCaptioner.caption_records` with the split's cached entities — what `evaluate.py --checkpoint` runs —
the same model, so the two rates show what the online preprocessing and the report cost. With
`--compare-compile` every size runs twice, alternating, as it is and with `caption.py --compile` (the static KV
cache; on a GPU the compiled decode step), and the two JSONL files' captions are compared. One JSON object on
stdout.

    python bench/caption.py --checkpoint RUN --data DATA --sizes 512 --batch-size 64 --compare-compile --skip-evaluate
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's davir, not an installed one


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_measured(command: list[str], env: dict) -> dict:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process, peak, peak_main = psutil.Process(child.pid), 0, 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_main
        while not stop.is_set():
            try:
                peak = max(peak, tree_rss(process))
                peak_main = max(peak_main, process.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    stdout, stderr = child.communicate()
    stop.set()
    thread.join()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # the process and its workers
    return {
        "wall_s": time.perf_counter() - started,
        "cpu_s": cpu,
        "peak_rss_mb": peak / 2**20,
        "peak_rss_main_mb": peak_main / 2**20,
        "stdout": stdout.strip().splitlines()[-1] if stdout.strip() else "",
    }


def write_pairs(work: Path, data: Path, split: str, n: int) -> Path:
    """pairs.csv of n pairs cycling the split's (before, after) files, ids unique; paths under work/data."""
    sys.path.insert(0, str(REPO))
    from davir.data.formats import read_dataset

    data = data.resolve()  # a relative --data: the pairs' paths are resolved too
    pairs = read_dataset("clevr_change", data, split).pairs
    link = work / "data"
    if not link.exists():
        link.symlink_to(data.resolve())
    manifest = work / f"pairs_{n}.csv"
    with open(manifest, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["before", "after", "id"])
        for i in range(n):
            pair = pairs[i % len(pairs)]
            writer.writerow(
                [
                    f"data/{Path(pair.before).relative_to(data.resolve())}",
                    f"data/{Path(pair.after).relative_to(data.resolve())}",
                    f"{pair.pair_id}-{i}",
                ]
            )
    return manifest


def caption_command(args: argparse.Namespace, manifest: Path, out: Path) -> list[str]:
    command = [
        sys.executable,
        "caption.py",
        "--checkpoint",
        str(args.checkpoint),
        "--pairs",
        str(manifest),
        "--out",
        str(out),
        "--batch-size",
        str(args.batch_size),
        "--overwrite",
        "--quiet",
    ]
    return command + (["--workers", str(args.workers)] if args.workers is not None else [])


def captions_of(path: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row.get("id") or row.get("pair_id"): row.get("caption") for row in rows}


def evaluate_generation(checkpoint: Path, data: Path, entities: Path, split: str, batch_size: int) -> dict:
    """evaluate.py's generation (the captioner on cached entities, attention maps on, default decoding), here."""
    import torch

    from davir.data.formats import read_dataset
    from davir.inference import CachedEntities, ChangeCaptioner, load_engine
    from davir.runs.paths import RunPaths

    torch.set_num_threads(1)
    run = RunPaths.of(checkpoint)
    engine = load_engine(run, "cpu")
    pairs = read_dataset("clevr_change", data, split).pairs
    captioner = ChangeCaptioner(
        engine, None, CachedEntities(entities) if engine.uses_entities else None, run=run, max_side=None
    )
    started = time.perf_counter()
    captioner.caption_records(pairs, batch_size=batch_size, attention=True)
    seconds = time.perf_counter() - started
    return {"pairs": len(pairs), "seconds": seconds, "pairs_per_s": len(pairs) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=REPO / "runs" / "demo")
    parser.add_argument("--data", type=Path, default=REPO / "outputs" / "demo" / "data")
    parser.add_argument("--entities", type=Path, default=REPO / "outputs" / "demo" / "entities")
    parser.add_argument("--split", default="test")
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None, help="caption.py --workers (default: its own)")
    parser.add_argument("--work", type=Path, default=REPO / "outputs" / "bench_caption")
    parser.add_argument("--skip-evaluate", action="store_true")
    parser.add_argument(
        "--compare-compile", action="store_true", help="each size also with caption.py --compile; captions compared"
    )
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    result = {
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
        "checkpoint": str(args.checkpoint),
        "batch_size": args.batch_size,
        "caption": {},
    }
    for n in [int(s) for s in args.sizes.split(",")]:
        manifest = write_pairs(args.work, args.data, args.split, n)
        if args.compare_compile:
            result["caption_compile"] = result.get("caption_compile", {})
            out = args.work / f"out_{n}_compile" / "captions.jsonl"
            row = run_measured(caption_command(args, manifest, out) + ["--compile"], env)
            row.update(pairs=n, pairs_per_s=n / row["wall_s"], pairs_per_cpu_s=n / row["cpu_s"])
            result["caption_compile"][str(n)] = row
        out = args.work / f"out_{n}" / "captions.jsonl"
        row = run_measured(caption_command(args, manifest, out), env)
        if args.compare_compile:
            plain, compiled = (
                captions_of(folder / "captions.jsonl") for folder in (out.parent, args.work / f"out_{n}_compile")
            )
            result["caption_compile"][str(n)]["same_captions"] = plain == compiled
            result["caption_compile"][str(n)]["differing_pairs"] = sum(plain[k] != compiled.get(k) for k in plain)
        report = out.parent / "report.html"
        report_bytes = report.stat().st_size + sum(
            p.stat().st_size for p in (out.parent / "report_files").rglob("*") if p.is_file()
        )
        shown = len(list((out.parent / "report_files" / "strips").glob("*.jpg")))
        row.update(
            pairs=n,
            pairs_per_s=n / row["wall_s"],
            pairs_per_cpu_s=n / row["cpu_s"],
            report_bytes=report_bytes,
            report_bytes_per_shown_pair=report_bytes / max(shown, 1),
            report_pairs_shown=shown,
        )
        result["caption"][str(n)] = row
        print(json.dumps({n: row}), file=sys.stderr)
    sizes = sorted(result["caption"], key=int)
    if len(sizes) > 1:
        result["rss_ratio_largest_to_smallest"] = (
            result["caption"][sizes[-1]]["peak_rss_mb"] / result["caption"][sizes[0]]["peak_rss_mb"]
        )
    if not args.skip_evaluate:
        result["evaluate_generation"] = evaluate_generation(
            args.checkpoint, args.data, args.entities, args.split, args.batch_size
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
