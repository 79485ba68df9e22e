"""Start-up cost of a huge manifest: `python -m davir.data import` of N rows, wall time and peak memory, as JSON.

    python bench/manifest_import.py --rows 1000000                 # this tree only
    python bench/manifest_import.py --rows 1000000 --baseline HEAD  # and a git revision, in the same run

The manifest (pairs.csv: id, before, after, caption, split) names a pool of small PNGs (--images per split,
reused by many rows, as many pairs of one scene are; no image in two splits, so nothing is leakage), so the
run times the per-row work — parsing, merging, splits, checks, pairs.jsonl — not the decoding of 2N images.
Each command runs in its own process under `/usr/bin/time`-like accounting (peak RSS of the child).
`--baseline REV` extracts that revision with `git archive` into a temporary folder (the repository is not
touched) and times it on the same manifest, alternating with this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = (("train", 8), ("val", 1), ("test", 1))  # rows per 10, by split


def make_manifest(folder: Path, rows: int, images_per_split: int) -> Path:
    """pairs.csv of `rows` rows over a pool of tiny images, each split with its own images."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    pools = {}
    for number, (split, _) in enumerate(SPLITS):
        pool = folder / "images" / split
        pool.mkdir(parents=True, exist_ok=True)
        pools[split] = [pool / f"{i:05d}.png" for i in range(images_per_split)]
        for i, path in enumerate(pools[split]):
            if not path.exists():
                Image.new("RGB", (32, 24), (i % 256, i // 256, 60 * number)).save(path)  # unique bytes
    order = [split for split, share in SPLITS for _ in range(share)]
    path = folder / "pairs.csv"
    with path.open("w", encoding="utf-8") as out:
        out.write("id,before,after,caption,split\n")
        for i in range(rows):
            split = order[i % len(order)]
            pool = pools[split]
            before, after = pool[i % len(pool)], pool[(i * 31 + 1) % len(pool)]
            out.write(f"p{i:07d},{before},{after},the red cube moved to the left {i % 97},{split}\n")
    return path


def timed(command: list[str], cwd: Path, env: dict) -> dict:
    """Wall seconds, peak RSS (MB) and exit status of one child process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read()
    process.stderr.close()
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "exit": os.waitstatus_to_exitcode(status),
        **({"stderr_tail": stderr[-500:]} if os.waitstatus_to_exitcode(status) else {}),
    }


def extract(revision: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", revision, "davir"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--images", type=int, default=300, help="images per split in the pool")
    parser.add_argument("--baseline", default=None, help="a git revision to time beside this tree (e.g. HEAD)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", default=None, help="folder for the manifest (default: a temporary one)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-import-") as temporary:
        work = Path(args.work or temporary)
        started = time.perf_counter()
        manifest = make_manifest(work / "data", args.rows, args.images)
        setup = time.perf_counter() - started
        trees = {"this_tree": REPO}
        if args.baseline:
            trees = {f"baseline {args.baseline}": extract(args.baseline, Path(temporary) / "baseline"), **trees}
        results: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():  # alternating, so a busy moment of the machine hits both
                env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
                out = work / f"imported-{len(results[name])}-{name.split()[0]}"
                command = [sys.executable, "-m", "davir.data", "import", str(manifest), "--out", str(out)]
                results[name].append(timed(command, tree, env))
        print(
            json.dumps(
                {
                    "bench": "manifest_import",
                    "rows": args.rows,
                    "images_per_split": args.images,
                    "manifest_mb": round(manifest.stat().st_size / 2**20, 1),
                    "setup_seconds": round(setup, 1),
                    "machine": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "load_1min": round(os.getloadavg()[0], 2),
                    },
                    "runs": results,
                    "best": {
                        name: {
                            "seconds": min(r["seconds"] for r in runs),
                            "peak_rss_mb": min(r["peak_rss_mb"] for r in runs),
                        }
                        for name, runs in results.items()
                    },
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
