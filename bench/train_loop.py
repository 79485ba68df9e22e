"""The real training loop: ``accelerate launch train.py`` itself on a synthetic set, pairs/s as the run logs it.

    python bench/train_loop.py                       # GPU: InstructBLIP-Vicuna-7B architecture, batch 16, bf16
    python bench/train_loop.py --family qwen2_5_vl   # GPU: Qwen2.5-VL-7B architecture at 448 px
    python bench/train_loop.py --preset tiny --scenes 60 --steps 6 --batch-size 4   # CPU smoke run
    python bench/train_loop.py --step-bench STEP.json    # loop / step ratio against bench/train_step.py's JSON

Makes the built-in synthetic set (``python -m davir.data synth``) with its change masks and entities
(``python -m preprocess masks`` / ``entities``, the toolkit profile, as ``make demo``), then runs
``accelerate launch train.py --config configs/demo.yaml`` with random weights of the family's large preset, App. B's
LoRA ranks, bf16 weights under bf16 autocast, checkpointing — the step bench's setting — once per
``--workers`` value (``data.num_workers``; 0 is train.py's default). ``train/pairs_per_s`` of each logging window
after the first (start-up, first batches) is the loop's rate; its median is compared with the step bench's
``davir`` variant when ``--step-bench`` is given. The final validation scores with Java's PTB tokenizer: where
the machine has no Java it fails after the timed windows, which is reported, not hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LARGE_PRESETS = {
    "instructblip": "vicuna7b",
    "qwen2_5_vl": "7b",
    "llava_onevision": "7b",
    "smolvlm": "2b",
    "qwen3_vl": "8b",
    "internvl": "8b",
    "gemma3": "4b",
}


RUNNING: list[subprocess.Popen] = []  # the child of the moment, stopped with us on SIGTERM


def _stop(signum, frame) -> None:
    for process in RUNNING:
        os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run(command: list[str], log: Path, timeout: float) -> tuple[int, float]:
    started = time.perf_counter()
    with log.open("a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        RUNNING[:] = [process]
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # the launcher and its train.py together
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = 124
        RUNNING.clear()
    return code, time.perf_counter() - started


def make_data(folder: Path, scenes: int, log: Path) -> dict:
    """The synthetic set, its masks and entities for train and val; seconds of each stage."""
    py, data = sys.executable, folder / "data"
    stages = {
        "synth": [
            py,
            "-m",
            "davir.data",
            "synth",
            "--out",
            str(data),
            "--scenes",
            str(scenes),
            "--seed",
            "0",
            "--workers",
            "0",
        ]
    }
    for split in ("train", "val"):
        stages[f"masks_{split}"] = [
            py,
            "-m",
            "preprocess",
            "masks",
            "--format",
            "clevr_change",
            "--root",
            str(data),
            "--split",
            split,
            "--out",
            str(folder / "masks"),
            "--workers",
            "0",
            "--no-progress",
        ]
        stages[f"entities_{split}"] = [
            py,
            "-m",
            "preprocess",
            "entities",
            "--format",
            "clevr_change",
            "--root",
            str(data),
            "--split",
            split,
            "--masks",
            str(folder / "masks"),
            "--out",
            str(folder / "entities"),
            "--no-progress",
        ]
    seconds = {}
    for name, command in stages.items():
        code, took = run(command, log, timeout=600)
        if code != 0:
            raise SystemExit(f"{name} failed (exit {code}); see {log}")
        seconds[name] = round(took, 1)
    return seconds


def train_command(args: argparse.Namespace, folder: Path, workers: int, gpu: bool) -> list[str]:
    run_dir = folder / f"run_workers{workers}"
    overrides = {
        "model.family": args.family,
        "model.pretrained": "null",
        "model.preset": args.preset,
        "model.image_size": "null",
        "model.lora.vision_rank": 4,
        "model.lora.qformer_rank": 4,
        "model.lora.llm_rank": 8,
        "model.extra_trainable": "[]",
        "model.dtype": "bfloat16" if gpu else "float32",
        "model.gradient_checkpointing": str(gpu).lower(),
        "data.root": folder / "data",
        "data.masks": folder / "masks",
        "data.entities": folder / "entities",
        "data.num_workers": workers,
        "optim.batch_size": args.batch_size,
        "optim.max_steps": args.steps,
        "optim.weight_decay": 0.05,
        "optim.lr": 1e-5,
        "run.log_every": args.log_every,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.val_max_pairs": args.batch_size,
        "run.trackers": "[]",
        "run.mixed_precision": "bf16" if gpu else "no",
        "run.output_dir": run_dir,
        "run.overwrite": "true",
    }
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--mixed_precision",
        "bf16" if gpu else "no",
        "--dynamo_backend",
        "no",
        str(ROOT / "train.py"),
        "--config",
        str(ROOT / "configs" / "demo.yaml"),
        *(f"{k}={v}" for k, v in overrides.items()),
    ]


def loop_rate(run_dir: Path, batch: int) -> dict:
    """pairs/s of each logging window from the run's train_log.jsonl; the first window (start-up) left out."""
    log = run_dir / "train_log.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    windows = [row["train/pairs_per_s"] for row in rows]
    timed = windows[1:]
    result = {"windows_pairs_per_s": [round(w, 2) for w in windows], "steps_logged": [row["step"] for row in rows]}
    if timed:
        result["pairs_per_s_median"] = round(statistics.median(timed), 2)
        result["seconds_per_step_median"] = round(batch / statistics.median(timed), 4)
    return result


def main(argv: list[str] | None = None) -> dict:
    import torch  # after argparse: --help stays quick

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="instructblip", choices=sorted(LARGE_PRESETS))
    parser.add_argument("--preset", help="default: the family's published architecture on a GPU, tiny on a CPU")
    parser.add_argument(
        "--scenes", type=int, help="synthetic scenes (two pairs each; default: enough for one epoch of --steps batches)"
    )
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default: 40 on a GPU, 6 on a CPU)")
    parser.add_argument("--log-every", type=int, help="steps per logged window (default: --steps / 5)")
    parser.add_argument("--batch-size", type=int, help="default: 16 on a GPU, 4 on a CPU")
    parser.add_argument("--workers", default="0", help="comma list of data.num_workers values, one run each")
    parser.add_argument("--work-dir", type=Path, help="default: a fresh folder under /tmp")
    parser.add_argument("--step-bench", type=Path, help="bench/train_step.py's JSON of the same setting")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per train.py run")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    gpu = torch.cuda.is_available()
    args.preset = args.preset or (LARGE_PRESETS[args.family] if gpu else "tiny")
    args.batch_size = args.batch_size or (16 if gpu else 4)
    args.steps = args.steps or (40 if gpu else 6)
    args.log_every = args.log_every or max(1, args.steps // 5)
    # train split ≈ 70 % of the scenes, two pairs a scene: one epoch covers every step (no worker restarts)
    args.scenes = args.scenes or int(args.steps * args.batch_size / (2 * 0.65)) + 8
    folder = args.work_dir or Path(f"/tmp/davir_train_loop_{os.getpid()}")
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "log.txt"
    report = {
        "benchmark": "accelerate launch train.py: the training loop's pairs/s as train_log.jsonl records it",
        "family": args.family,
        "preset": args.preset,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "log_every": args.log_every,
        "scenes": args.scenes,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "cpu_count": os.cpu_count(),
        "java": shutil.which("java") is not None,
        "log": str(log),
    }
    report["data_seconds"] = make_data(folder, args.scenes, log)
    runs = {}
    for workers in [int(w) for w in args.workers.split(",")]:
        code, took = run(train_command(args, folder, workers, gpu), log, timeout=args.timeout)
        runs[f"workers_{workers}"] = {
            "exit": code,
            "wall_s": round(took, 1),
            **loop_rate(folder / f"run_workers{workers}", args.batch_size),
        }
    report["runs"] = runs
    if args.step_bench and args.step_bench.is_file():
        step = json.loads(args.step_bench.read_text())["variants"]["davir"]
        report["step_bench_davir_pairs_per_s"] = step["pairs_per_s"]
        report["loop_over_step"] = {
            name: round(r["pairs_per_s_median"] / step["pairs_per_s"], 3)
            for name, r in runs.items()
            if "pairs_per_s_median" in r
        }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
