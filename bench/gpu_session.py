"""One lent GPU session's benches in one command: the rows bench/README.md owes, in order of priority, each under
what is left of one deadline, their JSON gathered into one file (rewritten after every part, so a part killed by
the deadline leaves the others' results).

    python3 bench/gpu_session.py --out $OUT/gpu_session.json --deadline 520
    python3 bench/gpu_session.py --out /tmp/s.json --cpu-smoke     # the same parts at tiny size, on any machine

Parts run one after another (nothing else busy on the machine's CPUs while one times); each part's stderr goes
to ``--log``. A part that fails or runs out of time is recorded with its exit status and the end of its log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parts(smoke: bool) -> list[tuple[str, list[str], float]]:
    """(name, argv after the interpreter, seconds it may take at most)."""
    if smoke:
        tiny, loop = ["--preset", "tiny", "--threads", "1"], "/tmp/davir_gpu_loop_smoke"
        return [
            (
                "qwen_step",
                [
                    "bench/train_step.py",
                    "--family",
                    "qwen2_5_vl",
                    *tiny,
                    "--batch-size",
                    "2",
                    "--steps",
                    "1",
                    "--warmup",
                    "1",
                    "--gradient-checkpointing",
                    "--variants",
                    "davir,davir_split_windows",
                    "--profile",
                ],
                300,
            ),
            (
                "instructblip_loop",
                [
                    "bench/train_loop.py",
                    "--preset",
                    "tiny",
                    "--scenes",
                    "30",
                    "--steps",
                    "4",
                    "--log-every",
                    "2",
                    "--workers",
                    "0",
                    "--work-dir",
                    loop,
                ],
                400,
            ),
            (
                "caption_compile",
                [
                    "bench/caption.py",
                    "--checkpoint",
                    f"{loop}/run_workers0",
                    "--data",
                    f"{loop}/data",
                    "--split",
                    "train",
                    "--sizes",
                    "16",
                    "--batch-size",
                    "8",
                    "--compare-compile",
                    "--skip-evaluate",
                    "--work",
                    f"{loop}/caption",
                ],
                300,
            ),
            (
                "sam",
                [
                    "bench/preprocess.py",
                    "--pairs",
                    "8",
                    "--work-sizes",
                    "320",
                    "--sam-pairs",
                    "1",
                    "--sam-batch-size",
                    "2",
                    "--sam-type",
                    "vit_b",
                    "--sam-on-cpu",
                ],
                400,
            ),
            (
                "qwen_loop",
                [
                    "bench/train_loop.py",
                    "--family",
                    "qwen2_5_vl",
                    "--scenes",
                    "30",
                    "--steps",
                    "2",
                    "--log-every",
                    "1",
                    "--workers",
                    "0",
                ],
                400,
            ),
            *family_steps(tiny + ["--batch-size", "2", "--steps", "1", "--warmup", "1"], 300),
        ]
    loop = "/tmp/davir_gpu_loop"  # the loop's run folder is what the caption part captions with
    return [  # what bench/README.md owes after the 2026-11-28 session (that session's set: the JSON in bench/results)
        (
            "qwen_step",
            [
                "bench/train_step.py",
                "--family",
                "qwen2_5_vl",
                "--batch-size",
                "16",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--variants",
                "davir,davir_split_windows",
                "--profile",
            ],
            240,
        ),
        (
            "instructblip_loop",
            [
                "bench/train_loop.py",
                "--family",
                "instructblip",
                "--steps",
                "16",
                "--log-every",
                "4",
                "--workers",
                "4",
                "--work-dir",
                loop,
                "--timeout",
                "120",
            ],
            170,
        ),
        (
            "caption_compile",
            [
                "bench/caption.py",
                "--checkpoint",
                f"{loop}/run_workers4",
                "--data",
                f"{loop}/data",
                "--split",
                "train",
                "--sizes",
                "512",
                "--batch-size",
                "64",
                "--compare-compile",
                "--skip-evaluate",
                "--work",
                f"{loop}/caption",
            ],
            200,
        ),
        (  # issue 51 goal 5: 200 pairs, with the resize on the device and one wait a batch, and its stage profile
            "sam",
            [
                "bench/preprocess.py",
                "--pairs",
                "200",
                "--work-sizes",
                "320",
                "--sam-pairs",
                "200",
                "--sam-type",
                "vit_b",
            ],
            110,
        ),
        (
            "qwen_loop",
            [
                "bench/train_loop.py",
                "--family",
                "qwen2_5_vl",
                "--steps",
                "8",
                "--log-every",
                "2",
                "--workers",
                "4",
                "--timeout",
                "170",
            ],
            200,
        ),
        # Issue 52's 7B-class rows of the families added last (their published sizes: LARGE_PRESETS), if time is left.
        *family_steps(["--batch-size", "16", "--steps", "2", "--warmup", "1"], 120),
    ]


def family_steps(settings: list[str], cap: float) -> list[tuple[str, list[str], float]]:
    """One DAVIR step bench per family added in issue 52."""
    return [
        (f"{family}_step", ["bench/train_step.py", "--family", family, *settings, "--variants", "davir"], cap)
        for family in ("qwen3_vl", "internvl", "gemma3")
    ]


def write_atomically(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, path)


def run_group(command: list[str], env: dict, err, limit: float) -> tuple[int, str]:
    """Run ``command`` in its own process group; past ``limit`` seconds the whole group is killed (a part's own
    children — accelerate's train.py, DataLoader workers — must not hold the GPU into the next part)."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
    )
    try:
        stdout, _ = process.communicate(timeout=limit)
        return process.returncode, stdout
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)  # train_loop.py then stops the train.py it started in its own group
        try:
            stdout, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
        return 124, stdout or ""


def environment() -> dict:
    import torch

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError as error:
        info["transformers"] = str(error)
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    info["commit"] = commit.stdout.strip() or None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    info["uncommitted_changes"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--log", type=Path, help="stderr of every part (default: OUT with .log)")
    parser.add_argument("--deadline", type=float, default=520, help="seconds for all parts together")
    parser.add_argument("--only", help="comma list of part names")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny settings on any machine: checks the parts run")
    args = parser.parse_args(argv)
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.log or args.out.with_suffix(".log")
    report = {"environment": environment(), "deadline_s": args.deadline, "parts": {}}
    chosen = set(args.only.split(",")) if args.only else None
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name, command, cap in parts(args.cpu_smoke):
        if chosen is not None and name not in chosen:
            continue
        left = args.deadline - (time.monotonic() - started)
        if left < 20:
            report["parts"][name] = {"skipped": f"{left:.0f} s of the deadline left"}
            write_atomically(args.out, report)
            continue
        limit = min(cap, left)
        part_started = time.monotonic()
        with log.open("a") as err:
            err.write(f"\n=== {name}: {' '.join(command)} (limit {limit:.0f} s)\n")
            err.flush()
            code, stdout = run_group([sys.executable, *command], env, err, limit)
        entry: dict = {"exit": code, "seconds": round(time.monotonic() - part_started, 1), "limit_s": round(limit)}
        try:
            entry["result"] = json.loads(stdout)
        except (json.JSONDecodeError, TypeError):
            entry["stdout_tail"] = (stdout or "")[-2000:]
        report["parts"][name] = entry
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        write_atomically(args.out, report)
        print(f"{name}: exit {code}, {entry['seconds']} s", file=sys.stderr, flush=True)
    summary = {name: {"exit": p.get("exit"), "seconds": p.get("seconds")} for name, p in report["parts"].items()}
    print(json.dumps(summary))
    return report


if __name__ == "__main__":
    main()
