"""Peak memory and time of a chat family's ``generate`` with the FAC hook off during generation (as
``ChatDavirModel`` runs it) vs on (as it ran before: every prefill computed a received-attention map, a T×T
matrix per head and image, then dropped it). Same model, pairs and captions; each setting in its own process
(peak RSS is per process), alternating ``--repeats`` times.

    python bench/fac_hook_generate.py                                 # tiny Qwen2.5-VL at 448 px, 8 pairs, beam 3
    python bench/fac_hook_generate.py --image-size 224 --pairs 16 --num-beams 1

Prints one JSON object: per setting the peak RSS of the process (MB), the RSS before ``generate`` and the
seconds of the call, and whether the captions of the two settings are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = ("hook_off", "hook_on")


def one_run(args: argparse.Namespace) -> dict:
    """Build the model, caption the pairs once in ``args.setting``; the child process's measurement."""
    import torch

    from bench.train_step import build_random_model, pixel_shape
    from davir.models.vlm.config import DavirModelConfig

    torch.set_num_threads(args.threads)
    config = DavirModelConfig(family=args.family, preset="tiny", train_mode="lora", image_size=args.image_size)
    model = build_random_model(config).eval()
    if args.setting == "hook_on":  # the behaviour before: the hook stays attached through generation
        model._attention_hook_off = contextlib.nullcontext
    generator = torch.Generator().manual_seed(0)
    shape = pixel_shape(model)
    before, after = (torch.randn(args.pairs, *shape, generator=generator) for _ in range(2))
    prompts = model.build_prompts([["small red metal sphere"]] * args.pairs)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    captions = model.generate(
        before,
        after,
        prompts,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.max_new_tokens,
        num_beams=args.num_beams,
    )
    return {
        "setting": args.setting,
        "seconds": round(time.perf_counter() - started, 2),
        "rss_before_generate_mb": round(rss_before),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "captions": captions,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen2_5_vl", choices=("qwen2_5_vl", "llava_onevision", "smolvlm"))
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--num-beams", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--setting", choices=SETTINGS, help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args(argv)
    if args.setting:
        print(json.dumps(one_run(args)))
        return {}

    passed = list(argv if argv is not None else sys.argv[1:])
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name in SETTINGS:
            child = subprocess.run(
                [sys.executable, __file__, *passed, "--setting", name], capture_output=True, text=True, check=True
            )
            runs[name].append(json.loads(child.stdout.strip().splitlines()[-1]))
    summary = {
        name: {
            "peak_rss_mb": [r["peak_rss_mb"] for r in rows],
            "rss_before_generate_mb": [r["rss_before_generate_mb"] for r in rows],
            "seconds_median": round(statistics.median(r["seconds"] for r in rows), 2),
        }
        for name, rows in runs.items()
    }
    report = {
        "benchmark": "chat-family generate: FAC hook off during generation (now) vs on (before)",
        "family": args.family,
        "preset": "tiny",
        "image_size": args.image_size,
        "pairs": args.pairs,
        "num_beams": args.num_beams,
        "new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "settings": summary,
        "same_captions": len({json.dumps(r["captions"]) for rows in runs.values() for r in rows}) == 1,
        "machine": f"{platform.machine()}, python {platform.python_version()}",
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
