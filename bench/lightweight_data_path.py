"""Lightweight training throughput through the real loop: features held in memory (pooled once) vs read per step.

    python bench/lightweight_data_path.py --data outputs/demo/data --features outputs/demo/features \
        --methods subtraction scorer --steps 150

For each method, trains its demo config (`configs/<method>_demo.yaml`, in this process, 1 thread) for
`--steps` steps twice: `data.preload_features_gb=0` (every step reads the 14×14 fp16 grids from the
memory-mapped cache and the model pools them: the baseline) and the default (the run's features in
memory, pooled to the token grid once: `davir.data.feature_table`). Prints JSON: scenes/s of the
training loop (the median of the trainer's own `train/pairs_per_s`, the first logging window left
out) and the wall seconds of the whole `train()` call (start-up and the table load included), side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(method: str, args, preload_gb: float | None, out: Path) -> dict:
    from davir.config import load_config
    from davir.runs.config import TrainConfig
    from davir.training.loop import train

    overrides = [
        f"data.root={args.data}",
        f"data.features={args.features}",
        f"optim.max_steps={args.steps}",
        "run.eval_every=0",
        "run.log_every=10",
        f"run.output_dir={out}",
        "run.overwrite=true",
        *args.overrides,
    ]
    if preload_gb is not None:
        overrides.append(f"data.preload_features_gb={preload_gb}")
    if args.entities:
        overrides.append(f"data.entities={args.entities}")
    config = load_config(TrainConfig, REPO / "configs" / f"{method}_demo.yaml", overrides)
    start = time.perf_counter()
    run_dir = train(config)
    total = time.perf_counter() - start
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    rates = [row["train/pairs_per_s"] for row in log[1:]]
    return {"scenes_per_s": round(statistics.median(rates), 1), "wall_s": round(total, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--entities", default=None, help="CHEER's entity cache (outputs/demo/entities_image)")
    parser.add_argument("--methods", nargs="+", default=["subtraction", "scorer"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides for every run")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            baseline = run(method, args, 0, Path(tmp) / f"{method}_cache")
            preloaded = run(method, args, None, Path(tmp) / f"{method}_memory")
            results[method] = {
                "read_per_step": baseline,
                "in_memory": preloaded,
                "speedup": round(preloaded["scenes_per_s"] / baseline["scenes_per_s"], 2),
            }
    print(
        json.dumps(
            {
                "benchmark": "lightweight training loop, demo configs: features read per step vs in memory",
                "steps": args.steps,
                "threads": 1,
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "results": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
