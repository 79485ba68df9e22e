"""Start-up cost of `caption.py` on a huge manifest: seconds to the first JSONL line and peak memory, as JSON.

    python bench/caption_start.py --checkpoint runs/demo --rows 1000000                 # this tree only
    python bench/caption_start.py --checkpoint runs/demo --rows 1000000 --baseline HEAD  # and a git revision
    python bench/caption_start.py --checkpoint runs/demo --pairs big/pairs.jsonl --baseline HEAD

The manifest is what a user of a million pairs has: `bench/manifest_import.py`'s pairs.csv (a pool of small PNGs
per split) imported with `python -m davir.data import` into a pairs.jsonl, which `caption.py --pairs` reads
(`--pairs` takes an existing manifest or folder instead). Each run is a fresh `caption.py` process (its own
session, a fresh --out) stopped with SIGTERM to its process group once the first complete line is in the JSONL.
Memory: `max_rss_mb` is the largest single process of the tree (`wait4`, what `/usr/bin/time -v` reports);
`peak_tree_rss_mb` sums the tree's RSS every 0.1 s (a forked DataLoader worker counts the parent's shared
pages again); `peak_tree_pss_mb` sums its proportional set size every 0.5 s (shared pages split between the
processes: the memory the tree takes). `--baseline REV` extracts that revision's `davir/` and `caption.py` with
`git archive` (the repository is not touched) and alternates it with this tree on the same manifest.
`--check-rows N` then captions the first N rows to the end with every tree and compares the JSONL bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from manifest_import import make_manifest  # noqa: E402


def _tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def _sum(processes: list[psutil.Process], field: str, full: bool = False) -> int:
    total = 0
    for p in processes:
        try:
            total += getattr(p.memory_full_info() if full else p.memory_info(), field)
        except psutil.Error:
            pass
    return total


def _first_line_written(out: Path) -> bool:
    try:
        with open(out, "rb") as handle:
            return b"\n" in handle.read(1 << 16)
    except OSError:
        return False


def until_first_caption(command: list[str], cwd: Path, env: dict, out: Path, log: Path, timeout: float) -> dict:
    """Run `command` until `out` holds a complete line, stop its process group, and measure it."""
    started = time.perf_counter()
    with open(log, "w") as stderr:
        child = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    process = psutil.Process(child.pid)
    peaks = {"tree_rss": 0, "main_rss": 0, "tree_pss": 0}
    first: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        last_pss = 0.0
        while not stop.is_set():
            tree = _tree(process)
            peaks["tree_rss"] = max(peaks["tree_rss"], _sum(tree, "rss"))
            peaks["main_rss"] = max(peaks["main_rss"], _sum(tree[:1], "rss"))
            if time.perf_counter() - last_pss >= 0.5:
                peaks["tree_pss"] = max(peaks["tree_pss"], _sum(tree, "pss", full=True))
                last_pss = time.perf_counter()
            if not first and _first_line_written(out):
                first.append(time.perf_counter() - started)
                stop.set()
            time.sleep(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    usage = None  # os.wait4, never Popen.poll: the exit must be reaped here to get the tree's ru_maxrss
    while not stop.wait(0.2):
        pid, _, exited = os.wait4(child.pid, os.WNOHANG)
        if pid:
            usage = exited
        if pid or time.perf_counter() - started > timeout:
            stop.set()
    thread.join()
    if usage is None:
        os.killpg(child.pid, signal.SIGTERM)  # the whole job: the main process and its DataLoader workers
        deadline = time.perf_counter() + 60
        while True:
            pid, _, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                os.killpg(child.pid, signal.SIGKILL)
                _, _, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.1)
    child.returncode = 0  # reaped above
    row = {
        "seconds_to_first_caption": round(first[0], 2) if first else None,
        "max_rss_mb": round(usage.ru_maxrss / 1024, 1) if usage else None,
        "peak_tree_rss_mb": round(peaks["tree_rss"] / 2**20, 1),
        "peak_main_rss_mb": round(peaks["main_rss"] / 2**20, 1),
        "peak_tree_pss_mb": round(peaks["tree_pss"] / 2**20, 1),
    }
    if not first:
        row["stderr_tail"] = log.read_text(errors="replace")[-800:]
    return row


def checked(command: list[str], cwd: Path, env: dict) -> None:
    """Run a command to its end; a failure stops the bench with the command and the tail of its stderr."""
    result = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")


def extract(revision: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", revision, "davir", "caption.py"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def head_manifest(manifest: Path, rows: int, into: Path) -> Path:
    """The first `rows` data rows of a pairs.jsonl / pairs.csv (its paths must be absolute)."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / manifest.name
    with open(manifest, encoding="utf-8") as source, open(target, "w", encoding="utf-8") as out:
        for number, line in enumerate(source):
            if number >= rows + (manifest.suffix == ".csv"):
                break
            out.write(line)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=REPO / "runs" / "demo")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=300, help="images per split in the pool")
    parser.add_argument("--pairs", type=Path, help="an existing manifest or folder instead of making one")
    parser.add_argument("--baseline", default=None, help="a git revision to time beside this tree (e.g. HEAD)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--check-rows",
        type=int,
        default=0,
        help="then caption the first N rows to the end with every tree and compare the JSONL bytes",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds a run may take to its first caption")
    parser.add_argument("--work", type=Path, help="folder for the manifest and outputs (default: a temporary one)")
    parser.add_argument("--caption-args", default="", help="more caption.py arguments, e.g. '--workers 0'")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-caption-start-") as temporary:
        work = Path(args.work or temporary)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        pairs = args.pairs
        if pairs is None:
            csv_manifest = make_manifest(work / "data", args.rows, args.images)
            pairs = work / "imported" / "pairs.jsonl"
            if not pairs.is_file():
                checked(
                    [sys.executable, "-m", "davir.data", "import", str(csv_manifest), "--out", str(pairs.parent)],
                    REPO,
                    {**env, "PYTHONPATH": str(REPO)},
                )
        setup = time.perf_counter() - started
        trees = {"this_tree": REPO}
        if args.baseline:
            trees = {f"baseline {args.baseline}": extract(args.baseline, Path(temporary) / "baseline"), **trees}
        extra = args.caption_args.split()
        results: dict[str, list[dict]] = {name: [] for name in trees}
        for repeat in range(args.repeats):
            for name, tree in trees.items():  # alternating, so a busy moment of the machine hits both
                out = work / f"out-{repeat}-{name.split()[0]}" / "captions.jsonl"
                shutil.rmtree(out.parent, ignore_errors=True)  # an earlier run's line is no first caption
                command = [
                    sys.executable,
                    str(tree / "caption.py"),
                    "--checkpoint",
                    str(args.checkpoint.resolve()),
                    "--pairs",
                    str(pairs),
                    "--out",
                    str(out),
                    "--overwrite",
                    "--quiet",
                    *extra,
                ]
                row = until_first_caption(
                    command,
                    tree,
                    {**env, "PYTHONPATH": str(tree)},
                    out,
                    work / f"log-{repeat}-{name.split()[0]}.txt",
                    args.timeout,
                )
                results[name].append(row)
                print(json.dumps({name: row}), file=sys.stderr)
        check = None
        if args.check_rows:
            small = head_manifest(pairs, args.check_rows, work / "small")
            digests = {}
            for name, tree in trees.items():
                out = work / f"small-{name.split()[0]}" / "captions.jsonl"
                checked(
                    [
                        sys.executable,
                        str(tree / "caption.py"),
                        "--checkpoint",
                        str(args.checkpoint.resolve()),
                        "--pairs",
                        str(small),
                        "--out",
                        str(out),
                        "--overwrite",
                        "--quiet",
                        *extra,
                    ],
                    tree,
                    {**env, "PYTHONPATH": str(tree)},
                )
                digests[name] = hashlib.sha256(out.read_bytes()).hexdigest()
            check = {"rows": args.check_rows, "jsonl_sha256": digests, "identical": len(set(digests.values())) == 1}
        print(
            json.dumps(
                {
                    "bench": "caption_start",
                    "pairs": str(pairs),
                    "rows": None if args.pairs else args.rows,
                    "manifest_mb": round(pairs.stat().st_size / 2**20, 1) if pairs.is_file() else None,
                    "setup_seconds": round(setup, 1),
                    "checkpoint": str(args.checkpoint),
                    "machine": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "load_1min": round(os.getloadavg()[0], 2),
                    },
                    "runs": results,
                    "best": {
                        name: {
                            key: min((r[key] for r in runs if r[key] is not None), default=None)
                            for key in (
                                "seconds_to_first_caption",
                                "max_rss_mb",
                                "peak_tree_pss_mb",
                                "peak_tree_rss_mb",
                            )
                        }
                        for name, runs in results.items()
                    },
                    **({"same_jsonl": check} if check else {}),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
