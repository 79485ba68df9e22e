"""Scoring a sweep's runs: one METEOR java process per call (the baseline) vs one for all (`shared_meteor`).

    python bench/sweep_scoring.py --runs 5
    python bench/sweep_scoring.py --predictions runs/lightweight_demo/*/seed*/eval/clevr_change_test/predictions.json \
        --root outputs/demo/data

Scores the same predictions `--runs` times through `davir.metrics.score_by_group` (the path `evaluate.py` takes:
PTB tokenizer, BLEU, METEOR, ROUGE-L, CIDEr per change type), first with a fresh METEOR process per call,
then inside one `shared_meteor()` block, and prints JSON: seconds per run of each, side by side, and whether
every score is the same. Without `--predictions` it scores the real Spot-the-Diff val example of the shared
fixtures (1,489 predictions of a published model) `--runs` times: no model, no download needed.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from davir.metrics.captions import score_by_group, shared_meteor  # noqa: E402

SPOT = REPO.parent / "shared" / "datasets" / "spot_the_diff"


def fixture_job() -> tuple[dict, dict, dict]:
    """The real Spot-the-Diff val example of the shared fixtures: 1,489 predictions, their references, no groups."""
    from davir.metrics.io import load_predictions, load_references

    predictions = load_predictions(SPOT / "eval_example_val" / "ssgpa_spot_val_total_captions.json")
    references = load_references(SPOT / "spot_val_change_captions_reformat.json")
    return predictions, references, {}


def prediction_jobs(paths: list[Path], root: Path) -> list[tuple[dict, dict, dict]]:
    from davir.metrics.io import load_predictions
    from davir.metrics.protocols import load_references_from_dataset

    references, groups, _ = load_references_from_dataset("clevr_change", root, "test")
    jobs = []
    for path in paths:
        jobs.append((load_predictions(path), references, groups))
    return jobs


def score_all(jobs) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    results = []
    for predictions, references, groups in jobs:
        scored = score_by_group(predictions, references, groups, spice=False)
        results.append({group: scores.metrics for group, scores in scored.items()})
    return time.perf_counter() - start, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="how many runs to score (the fixture job, repeated)")
    parser.add_argument("--predictions", type=Path, nargs="+", help="predictions.json files of real runs")
    parser.add_argument("--root", type=Path, help="the dataset root of --predictions (CLEVR-Change layout)")
    args = parser.parse_args(argv)
    if args.predictions:
        if args.root is None:
            parser.error("--predictions needs --root")
        jobs = prediction_jobs(args.predictions, args.root)
    else:
        jobs = [fixture_job()] * args.runs

    baseline_s, baseline = score_all(jobs)
    with shared_meteor():
        shared_s, shared = score_all(jobs)
    print(
        json.dumps(
            {
                "bench": "sweep_scoring",
                "machine": platform.platform(),
                "runs": len(jobs),
                "pairs_per_run": len(jobs[0][0]),
                "process_per_call": {
                    "seconds": round(baseline_s, 2),
                    "seconds_per_run": round(baseline_s / len(jobs), 2),
                },
                "shared_meteor": {"seconds": round(shared_s, 2), "seconds_per_run": round(shared_s / len(jobs), 2)},
                "speedup": round(baseline_s / shared_s, 2),
                "identical_scores": baseline == shared,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
