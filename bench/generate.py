"""Captioning throughput of the DAVIR model's ``generate``: batched vs one pair at a time, same pairs, same run.

    python bench/generate.py                      # GPU: vicuna7b, 128 pairs, batches 1,16,64; CPU: tiny, 16 pairs
    python bench/generate.py --preset vicuna7b --pairs 128 --batch-sizes 1,16,64 --max-new-tokens 20 --num-beams 1,3
    python bench/generate.py --family qwen2_5_vl  # GPU: the Qwen2.5-VL-7B architecture at 448 px
    python bench/generate.py --preset tiny --pairs 16 --batch-sizes 1,8 --threads 1          # CPU smoke run

One model with random weights of ``--family`` and ``--preset`` (as ``bench/train_step.py``: ``vicuna7b`` is the
full InstructBLIP-Vicuna-7B architecture at 224 px, a chat family's ``7b``/``2b`` its published architecture;
bf16 on the GPU), LoRA attached, eval mode. The pairs are random pixels with entity prompts (EPC on, one
CLEVR entity each, as ``caption.py`` builds them). Every call generates exactly ``--max-new-tokens`` tokens
(``min_new_tokens`` = ``max_new_tokens``: random weights would otherwise stop at random places), and the bench
checks the length of every output. A row is one setting; each is warmed up on its first batch, then timed over
``--repeats`` passes over its pairs (median reported, with min and max):

* ``dynamic``: the model's ``generate`` as it is (HF dynamic KV cache, LoRA layers unmerged), every batch size
  and beam setting; batch size 1 is the loop that captions one pair at a time (over ``--loop-pairs`` of the
  same pairs: its rate per pair does not depend on how many);
* ``merged``: the same with the LoRA deltas merged into the base weights for the row (PEFT
  ``merge_adapter``; greedy only): no LoRA side-branch kernels in each decode step;
* ``static_compiled``: HF's static KV cache, with which ``generate`` ``torch.compile``s the decode step on a GPU
  (``CompileConfig``: inductor, CUDA graphs in ``reduce-overhead`` mode), LoRA unmerged, at
  ``--compile-batch-sizes`` (compiling one shape takes a while); ``static_compiled_merged`` (not run by default)
  the same with merged LoRA. On a CPU HF does not compile, so these rows time the static cache alone and say
  so (``compiled``: false); a setting the installed versions reject is reported as skipped with the error.

Prints one JSON object (rows, speed-ups over one-at-a-time, the target, device, versions).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import CompileConfig  # noqa: E402

from bench.bench_common import COLORS, MATERIALS, SHAPES, SIZES, check_gpu_memory, device_name, pick_device, sync  # noqa: E402
from bench.train_step import LARGE_PRESETS, build_random_model, pixel_shape  # noqa: E402
from davir.models.families import DEFAULT_FAMILY, FAMILIES  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.instructblip import DavirModel  # noqa: E402

ROW_KINDS = ("dynamic", "merged", "static_compiled", "static_compiled_merged")
DEFAULT_ROWS = ("dynamic", "merged", "static_compiled")
MERGED_KINDS = ("merged", "static_compiled_merged")
STATIC_KINDS = ("static_compiled", "static_compiled_merged")
TARGET = {
    "text": ">= 80 pairs/s on an H100 (vicuna7b, 224 px)",
    "min_pairs_per_s": 80.0,
    "probe_hf_generate_pairs_per_s": {"one_at_a_time": 1.34, "batch_16": 20.5, "batch_64": 65.0},
}


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return values


def build_model(family: str, preset: str, dtype: str, device: torch.device) -> torch.nn.Module:
    config = DavirModelConfig(family=family, preset=preset, train_mode="lora", dtype=dtype, seed=0)
    return build_random_model(config, device).eval()


def generating_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model whose ``generate`` (and compiled decode step) the DAVIR model calls."""
    return model.core.language_model if isinstance(model, DavirModel) else model.core


def synthetic_pairs(model: torch.nn.Module, count: int, device: torch.device, seed: int = 0) -> dict:
    """``count`` random float32 pixel pairs (normal, like normalised images) and their entity prompts, on
    ``device``."""
    generator = torch.Generator().manual_seed(seed)
    shape = pixel_shape(model)
    objects = [f"{s} {c} {m} {h}" for s in SIZES for c in COLORS for m in MATERIALS for h in SHAPES]
    return {
        "pixel_before": torch.randn(count, *shape, generator=generator).to(device),
        "pixel_after": torch.randn(count, *shape, generator=generator).to(device),
        "prompts": model.build_prompts([[objects[(7 * k) % len(objects)]] for k in range(count)]),
    }


class LengthProbe:
    """Wraps the generating model's ``generate`` to record the number of new tokens of every call (the bench's
    check that each pair got exactly ``max_new_tokens``); HF returns the ``input_ids`` given and the new tokens
    (only the new ones for InstructBLIP's ``inputs_embeds``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.target = generating_model(model)
        self.original = self.target.generate
        self.lengths: set[int] = set()

    def __enter__(self) -> LengthProbe:
        def generate(*args, **kwargs):
            output = self.original(*args, **kwargs)
            given = kwargs["input_ids"].shape[1] if kwargs.get("input_ids") is not None else 0
            self.lengths.add(int(output.shape[1]) - given)
            return output

        self.target.generate = generate  # instance attribute shadows the method
        return self

    def __exit__(self, *exc) -> None:
        del self.target.generate


@contextlib.contextmanager
def merged_lora(model: torch.nn.Module, merge: bool):
    """PEFT ``merge_adapter`` for the duration (W ← W + B·A·scale in the base weights), unmerged afterwards."""
    if not merge:
        yield
        return
    model.wrapped().merge_adapter()
    try:
        yield
    finally:
        model.wrapped().unmerge_adapter()


def run_pass(
    model: torch.nn.Module, pairs: dict, count: int, batch: int, settings: dict, device: torch.device
) -> tuple[float, float]:
    """Caption the first ``count`` pairs in batches of ``batch``: (wall seconds, synchronised; CPU seconds of
    this process, which on a shared CPU, with one thread, is the time an idle core would take)."""
    sync(device)
    started, cpu_started = time.perf_counter(), time.process_time()
    for first in range(0, count, batch):
        chunk = slice(first, min(first + batch, count))
        model.generate(pairs["pixel_before"][chunk], pairs["pixel_after"][chunk], pairs["prompts"][chunk], **settings)
    sync(device)
    return time.perf_counter() - started, time.process_time() - cpu_started


def time_row(model: torch.nn.Module, pairs: dict, row: dict, args: argparse.Namespace, device: torch.device) -> dict:
    """Warm up on the first batch, then ``args.repeats`` timed passes over the row's pairs."""
    batch, beams, kind = row["batch_size"], row["num_beams"], row["kind"]
    count = min(args.loop_pairs, args.pairs) if batch == 1 else args.pairs
    count -= count % batch  # whole batches only: a last, smaller batch would be another shape to compile
    if count == 0:
        return {**row, "skipped": f"fewer pairs than one batch of {batch}"}
    settings = {"max_new_tokens": args.max_new_tokens, "min_new_tokens": args.max_new_tokens, "num_beams": beams}
    static = kind in STATIC_KINDS
    if static:
        settings["cache_implementation"] = "static"
        settings["compile_config"] = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead")
    warmup_calls = 3 if static else 1  # compile, then CUDA-graph recording, then replay
    with LengthProbe(model) as probe, merged_lora(model, kind in MERGED_KINDS):
        for _ in range(warmup_calls):
            run_pass(model, pairs, batch, batch, settings, device)
        passes = [run_pass(model, pairs, count, batch, settings, device) for _ in range(args.repeats)]
    seconds = [wall for wall, _ in passes]
    if probe.lengths != {args.max_new_tokens}:
        raise RuntimeError(f"row {row}: generated {sorted(probe.lengths)} new tokens, expected {args.max_new_tokens}")
    median = statistics.median(seconds)
    result = {
        **row,
        "pairs": count,
        "seconds_per_pass": {"median": round(median, 4), "min": round(min(seconds), 4), "max": round(max(seconds), 4)},
        "pairs_per_s": round(count / median, 2),
        "pairs_per_s_range": [round(count / max(seconds), 2), round(count / min(seconds), 2)],
        "new_tokens_per_pair": args.max_new_tokens,
    }
    if device.type == "cpu":
        result["pairs_per_cpu_s"] = round(count / statistics.median(cpu for _, cpu in passes), 2)
    if static:
        result["compiled"] = hasattr(generating_model(model), "_compiled_call")
        if not result["compiled"]:
            result["note"] = "not compiled: HF compiles the static-cache decode step only on an accelerator"
    return result


def planned_rows(args: argparse.Namespace) -> list[dict]:
    """Rows in run order; merged-LoRA rows last: merging and unmerging bf16 weights rounds them, so rows after a
    merge would run on (slightly) different weights."""
    rows = []
    for kind in sorted(args.rows, key=lambda k: k in MERGED_KINDS):
        if kind in STATIC_KINDS:
            sizes = args.compile_batch_sizes or [max(args.batch_sizes)]
            rows += [{"kind": kind, "num_beams": k, "batch_size": b} for k in args.num_beams for b in sizes]
        elif kind == "merged":
            rows += [{"kind": kind, "num_beams": 1, "batch_size": b} for b in args.batch_sizes]
        else:
            rows += [{"kind": kind, "num_beams": k, "batch_size": b} for k in args.num_beams for b in args.batch_sizes]
    return rows


def add_speedups(results: list[dict]) -> None:
    """pairs/s over the one-at-a-time rate of the same beam setting with the model's ``generate`` as it is."""
    loop = {
        r["num_beams"]: r["pairs_per_s"]
        for r in results
        if r["kind"] == "dynamic" and r["batch_size"] == 1 and "pairs_per_s" in r
    }
    for r in results:
        if "pairs_per_s" in r and r["num_beams"] in loop:
            r["speedup_vs_one_at_a_time"] = round(r["pairs_per_s"] / loop[r["num_beams"]], 2)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=FAMILIES.names(), default=DEFAULT_FAMILY, help="model.family")
    parser.add_argument("--preset", help=f"a preset of the family (default on a GPU: {LARGE_PRESETS}; tiny on CPU)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--pairs", type=int, help="pairs captioned per pass (default: 128 on GPU, 16 on CPU)")
    parser.add_argument(
        "--loop-pairs",
        type=int,
        help="pairs of the batch-1 rows (default: 16 on GPU, all on CPU); its rate is per pair",
    )
    parser.add_argument("--batch-sizes", type=int_list, help="default: 1,16,64 on GPU, 1,8 on CPU")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--num-beams", type=int_list, default=[1, 3], help="beam settings, e.g. 1,3")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma list from {ROW_KINDS}")
    parser.add_argument(
        "--compile-batch-sizes",
        type=int_list,
        help="batch sizes of the static_compiled rows (default: the largest of --batch-sizes)",
    )
    parser.add_argument("--repeats", type=int, help="timed passes per row (default: 3 on GPU, 2 on CPU)")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32", "float16"),
        help="weights' dtype (default: bfloat16 on GPU, float32 on CPU)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: 1 on CPU, as the machine is shared; torch's choice on a GPU)",
    )
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    gpu = device.type == "cuda"
    if args.threads or not gpu:
        torch.set_num_threads(args.threads or 1)
    args.preset = args.preset or (LARGE_PRESETS[args.family] if gpu else "tiny")
    args.pairs = args.pairs or (128 if gpu else 16)
    args.loop_pairs = args.loop_pairs or (16 if gpu else args.pairs)
    args.batch_sizes = args.batch_sizes or ([1, 16, 64] if gpu else [1, 8])
    args.repeats = args.repeats or (3 if gpu else 2)
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.rows or set(args.rows) - set(ROW_KINDS):
        raise SystemExit(f"--rows: choose from {ROW_KINDS}")
    if args.max_new_tokens < 1 or args.repeats < 1:
        raise SystemExit("--max-new-tokens and --repeats must be >= 1")

    check_gpu_memory(device, args.preset, args.dtype)
    torch.manual_seed(0)
    started = time.perf_counter()
    model = build_model(args.family, args.preset, args.dtype, device)
    sync(device)
    build_seconds = time.perf_counter() - started
    pairs = synthetic_pairs(model, args.pairs, device)

    results = []
    for row in planned_rows(args):
        try:
            results.append(time_row(model, pairs, row, args, device))
        except Exception as error:  # a setting the installed versions do not support: report it, keep going
            if row["kind"] == "dynamic":
                raise
            detail = traceback.format_exception_only(type(error), error)[-1].strip()
            results.append({**row, "skipped": f"failed: {detail[:400]}"})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # progress, in case a later row runs long
    add_speedups(results)

    timed = [r for r in results if "pairs_per_s" in r]
    best = max(timed, key=lambda r: r["pairs_per_s"]) if timed else None
    best_by_kind: dict[str, float] = {}
    for r in timed:
        best_by_kind[r["kind"]] = max(best_by_kind.get(r["kind"], 0.0), r["pairs_per_s"])
    target_applies = gpu and args.preset == "vicuna7b" and "H100" in device_name(device)
    report = {
        "benchmark": f"{type(model).__name__}.generate ({args.family}): batched vs one pair at a time (greedy and "
        "beam), forced length",
        "device": device_name(device),
        "family": args.family,
        "preset": args.preset,
        "image_size": model.image_size,
        "dtype": args.dtype,
        "max_new_tokens": args.max_new_tokens,
        "min_new_tokens": args.max_new_tokens,
        "forced_length_checked": True,
        "prompt_example": pairs["prompts"][0],
        "pairs": args.pairs,
        "repeats": args.repeats,
        "build_seconds": round(build_seconds, 1),
        "rows": results,
        "best": None if best is None else {k: best[k] for k in ("kind", "batch_size", "num_beams", "pairs_per_s")},
        "target": TARGET,
        "best_pairs_per_s_by_kind": best_by_kind,
        "target_met_by_kind": {k: v >= TARGET["min_pairs_per_s"] for k, v in best_by_kind.items()}
        if target_applies
        else "not applicable (needs vicuna7b on an H100)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": platform.python_version(),
    }
    if not gpu:
        report["note"] = (
            "CPU run of the small preset: checks the bench and the relative batching gain only; the GPU figures "
            "are in bench/README.md."
        )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
