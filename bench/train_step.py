"""Cost of the DAVIR training step next to a plain LoRA step of the same model: same batch, same run.

    python bench/train_step.py                    # GPU: vicuna7b, batch 16, bf16, LLM checkpointing; CPU: tiny, batch 8
    python bench/train_step.py --preset vicuna7b --batch-size 16 --steps 10 --warmup 3 --dtype bfloat16 \\
        --gradient-checkpointing                  # the issue's setting (H100)
    python bench/train_step.py --family qwen2_5_vl --batch-size 16   # GPU: the Qwen2.5-VL-7B architecture, 448 px
    python bench/train_step.py --preset tiny --batch-size 8 --steps 5 --warmup 2 --threads 1   # CPU smoke run
    python bench/train_step.py --estimate-only    # FLOP estimate of each variant (vicuna7b), on any machine

One model with random weights of ``--family`` (``model.family``; default ``instructblip``) and ``--preset``
(``vicuna7b`` is the full InstructBLIP-Vicuna-7B architecture at 224 px, a chat family's ``7b``/``2b`` its
published architecture at the family's size: Qwen2.5-VL-7B at 448 px), built directly on the GPU in the chosen
dtype, LoRA as in App. B (InstructBLIP: r=4 ViT qkv and Q-Former q/k/v, r=8 LLM attention; a chat family: its
mapping of the same ranks, ``davir/models/families``). Each timed step is what ``train.py`` does per batch:
forward, backward, gradient clipping (max norm 1) and an AdamW step over the trainable (LoRA) parameters, under
bf16 autocast when the weights are bf16 on a GPU (``run.mixed_precision: bf16`` of the DAVIR configs).
Variants, all on the same inputs:

* ``davir``: FAC on (λ = 0.1, synthetic rectangular change masks in both images) and EPC on (the prompt
  "Describe the difference between the two images. Entity: small red metal sphere.");
* ``plain``: the plain LoRA step: FAC off (λ = 0, no masks), the base prompt alone;
* ``epc_only``: the entity prompt with FAC off, which splits DAVIR's extra cost into EPC (longer LLM and
  Q-Former sequences) and FAC (the attention KL and its backward through the last ViT layer);
* ``davir_split_windows`` (Qwen2.5-VL, on request): ``davir`` with transformers' SDPA call per ViT window, the
  baseline of ``davir.models.vlm.window_attention``'s packed windows, which every other variant uses;
* ``davir_fused_adamw`` (on request): ``davir`` with ``AdamW(fused=True)`` (one kernel for the whole update);
* ``davir_compiled`` (InstructBLIP, on request): ``davir`` with each LLM decoder layer and each ViT layer but the
  last (FAC's hook) under ``torch.compile`` (regional: one compiled graph serves every layer of a kind, the
  checkpointing inside it), switched on for this variant's steps only; its first warm-up step compiles;
* ``reference`` (InstructBLIP, on request): a second model of the same architecture, dtype and LoRA config
  through transformers + PEFT alone (``bench/step_tools.py``: HF's modules, HF's loss and checkpointing, the
  inputs tokenised once), on the ``davir`` variant's sequences without FAC: what davir's code costs.

``--busy-cpus N`` times every variant again with N processes keeping N cores busy (as DataLoader workers do);
``--profile`` adds one profiled step per variant (kernels launched, GPU-busy share, the ops of most GPU time).

The variants run interleaved (ABC CBA ...) after a warm-up of each, so drift of the machine (clocks, other
load) hits all of them alike; every step is synchronised and timed alone, and the peak GPU memory is reset
before each step. Prints one JSON object: per variant mean/median/min/max seconds per step, pairs/s at the
median (and per CPU-second on a CPU), peak memory, LLM sequence length, the matrix-multiply TFLOP of the step
(counted by ``torch.utils.flop_counter`` on one extra step of each variant; for InstructBLIP also estimated from
the layer shapes) and the rate achieved; the DAVIR/plain ratio measured and predicted from the
FLOPs; device and library versions; the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from bench.bench_common import (  # noqa: E402
    ENTITY,
    check_gpu_memory,
    clevr_like_captions,
    device_name,
    pick_device,
    rectangle_masks,
    sync,
    vocabulary_texts,
)
from bench.step_flops import llm_sequence_length, round_significant, step_tflop_estimate  # noqa: E402
from bench.step_tools import build_reference, busy_cpus, profile_step, reference_inputs, reference_loss  # noqa: E402
from davir.models.families import DEFAULT_FAMILY, FAMILIES  # noqa: E402
from davir.models.vlm.build import build_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.instructblip import DavirModel  # noqa: E402

# Each family's published architecture (random weights): the default preset on a GPU.
LARGE_PRESETS = {
    "instructblip": "vicuna7b",
    "qwen2_5_vl": "7b",
    "llava_onevision": "7b",
    "smolvlm": "2b",
    "qwen3_vl": "8b",
    "internvl": "8b",
    "gemma3": "4b",
}
VARIANTS = ("davir", "plain", "epc_only")
SPLIT_WINDOWS = "davir_split_windows"  # Qwen2.5-VL only, on request
FUSED_ADAMW = "davir_fused_adamw"  # on request
COMPILED = "davir_compiled"  # InstructBLIP only, on request: LLM and ViT layers under torch.compile
REFERENCE = "reference"  # InstructBLIP only, on request: transformers + PEFT alone
TARGETS = {
    "text": "DAVIR <= 1.05x the plain step and >= 41 pairs/s on an H100 at batch 16 bf16 with LLM gradient "
    "checkpointing (vicuna7b preset, 224 px)",
    "max_ratio_davir_over_plain": 1.05,
    "min_davir_pairs_per_s": 41.0,
    "probe_plain_step": {"seconds": 0.388, "peak_memory_gib": 27.8, "batch_size": 16, "device": "H100"},
}


def build_model(args: argparse.Namespace, device: torch.device) -> DavirModel:
    """The benchmark model: random weights, LoRA of App. B, built on ``device`` in ``args.dtype``."""
    config = DavirModelConfig(
        family=args.family,
        preset=args.preset,
        train_mode="lora",
        dtype=args.dtype,
        gradient_checkpointing=args.gradient_checkpointing,
        image_size=args.image_size,
        seed=0,
    )
    config.fac.lambda_attn = 0.1
    config.epc.use_entities = True
    config.epc.num_entities = 1
    return build_random_model(config, device).train()


def build_random_model(config: DavirModelConfig, device: torch.device | str = "cpu") -> torch.nn.Module:
    """``config``'s random-weight preset, its word-level tokenizer learned from the benches' captions; an unknown
    preset of the family stops with the choices."""
    captions = clevr_like_captions(256, seed=1) + vocabulary_texts()
    try:
        return build_davir_model(config, captions_for_tokenizer=captions, device=device)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def pixel_shape(model: torch.nn.Module) -> tuple[int, ...]:
    """Per-picture shape of the model's pixel input: (3, S, S) for InstructBLIP, the family processor's patch
    rows for a chat family (Qwen2.5-VL: (patches, C·T·p·p))."""
    return tuple(model.image_processor(Image.new("RGB", (model.image_size, model.image_size))).shape[1:])


def synthetic_batch(model: DavirModel, batch: int, device: torch.device, seed: int = 0) -> dict:
    """Random pixels (normal, as after the processor's normalisation), CLEVR-like captions, rectangle masks: on
    ``device``."""
    generator = torch.Generator().manual_seed(seed)
    size, shape = model.image_size, pixel_shape(model)
    return {
        "pixel_before": torch.randn(batch, *shape, generator=generator).to(device),
        "pixel_after": torch.randn(batch, *shape, generator=generator).to(device),
        "captions": clevr_like_captions(batch, seed=seed + 2),
        "masks_before": rectangle_masks(batch, size, generator).to(device),
        "masks_after": rectangle_masks(batch, size, generator).to(device),
        "mask_valid": torch.ones(batch, dtype=torch.bool, device=device),
        "entity_prompts": model.build_prompts([[ENTITY]] * batch),
        "base_prompts": model.build_prompts(None, batch_size=batch),
    }


@contextlib.contextmanager
def fac_lambda(model: DavirModel, value: float):
    """Temporarily set FAC's λ (forward reads ``model.config.fac`` on every call)."""
    saved = model.config.fac
    model.config.fac = dataclasses.replace(saved, lambda_attn=value)
    try:
        yield
    finally:
        model.config.fac = saved


@contextlib.contextmanager
def compiled_layers(model: torch.nn.Module, on: bool):
    """With ``on``: InstructBLIP's LLM decoder layers and ViT layers (all but the last, where FAC's hook reads the
    attention) run through ``torch.compile`` for the duration; the compiled code is kept for the next time."""
    if not on:
        yield
        return
    core = model.core
    layers = [*core.language_model.model.layers, *core.vision_model.encoder.layers[:-1]]
    for layer in layers:
        if not hasattr(layer, "_bench_compiled"):
            layer._bench_compiled = torch.compile(layer._call_impl, dynamic=False)
        layer._compiled_call_impl = layer._bench_compiled
    try:
        yield
    finally:
        for layer in layers:
            layer._compiled_call_impl = None


@contextlib.contextmanager
def split_windows(model: torch.nn.Module, split: bool):
    """With ``split``: a Qwen2.5-VL ViT on transformers' own SDPA path (one call per window) for the duration."""
    if not split:
        yield
        return
    config = model.core.model.visual.config
    saved, config._attn_implementation = config._attn_implementation, "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = saved


def variant_inputs(name: str, data: dict) -> tuple[dict, float]:
    """Forward keyword arguments and FAC λ of one variant."""
    common = {"pixel_before": data["pixel_before"], "pixel_after": data["pixel_after"], "captions": data["captions"]}
    if name in ("davir", SPLIT_WINDOWS, FUSED_ADAMW, COMPILED):
        masks = {k: data[k] for k in ("masks_before", "masks_after", "mask_valid")}
        return {**common, "prompts": data["entity_prompts"], **masks}, 0.1
    if name == "epc_only":
        return {**common, "prompts": data["entity_prompts"]}, 0.0
    if name == "plain":
        return {**common, "prompts": data["base_prompts"]}, 0.0
    raise ValueError(f"unknown variant {name!r}; choose from {VARIANTS}")


class StepRunner:
    """One variant's training step: zero grads, forward (autocast), backward, clip, AdamW; timed alone."""

    def __init__(self, name: str, model: DavirModel, data: dict, device: torch.device, autocast: bool) -> None:
        self.name, self.device, self.autocast = name, device, autocast
        self.davir_model = model
        if name == REFERENCE:
            self.model = build_reference(model, device)
            self.reference_inputs = reference_inputs(model, data, device)
            self.kwargs, self.lambda_attn = variant_inputs("epc_only", data)
        else:
            self.model = model
            self.kwargs, self.lambda_attn = variant_inputs(name, data)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        # train.py's optimizer (weight decay 0.05 of the DAVIR configs); one per variant, over the same LoRA weights.
        fused = {"fused": True} if name == FUSED_ADAMW else {}
        self.optimizer = torch.optim.AdamW(self.parameters, lr=1e-5, weight_decay=0.05, **fused)
        self.busy_seconds: list[float] = []
        self.profile: dict | None = None
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []  # process CPU time: on a shared CPU, what an idle core would take
        self.peak_bytes = 0
        self.last: dict = {}
        self.counted_tflop: float | None = None
        self.count_error: str | None = None

    def count_flops(self) -> None:
        """One untimed step under ``FlopCounterMode``: the matrix products (and attention kernels) of forward,
        backward and the checkpointing recompute, as run."""
        try:
            with FlopCounterMode(display=False) as counter:
                self.step(timed=False)
        except Exception as error:  # an op the counter cannot follow: time the variant anyway
            self.count_error = f"{type(error).__name__}: {error}"[:300]
            return
        self.counted_tflop = round_significant(counter.get_total_flops() / 1e12)

    def step(self, timed: bool, busy: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=True)  # also frees the previous variant's gradients
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        sync(self.device)
        started, cpu_started = time.perf_counter(), time.process_time()
        if self.name == REFERENCE:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                loss, length = reference_loss(self.model, self.reference_inputs)
            out = dataclasses.make_dataclass("Out", ["loss", "caption_loss", "attn_loss", "fac_pairs", "labels"])(
                loss, loss, None, 0, torch.empty(0, length)
            )
        else:
            # the window split stays on through the backward: checkpointing recomputes the ViT blocks there
            with (
                fac_lambda(self.model, self.lambda_attn),
                split_windows(self.model, self.name == SPLIT_WINDOWS),
                compiled_layers(self.model, self.name == COMPILED),
            ):
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                    out = self.model(**self.kwargs)  # a compiled layer's backward (and recompute) is compiled with it
                out.loss.backward()
        if self.name == REFERENCE:
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        sync(self.device)
        elapsed, cpu_elapsed = time.perf_counter() - started, time.process_time() - cpu_started
        if self.device.type == "cuda":
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device))
        if timed and busy:
            self.busy_seconds.append(elapsed)
        elif timed:
            self.seconds.append(elapsed)
            self.cpu_seconds.append(cpu_elapsed)
        loss = out.loss.item()
        if loss != loss or abs(loss) == float("inf"):
            raise RuntimeError(f"variant {self.name}: non-finite loss {loss}")
        self.last = {
            "loss": round(loss, 4),
            "caption_loss": round(out.caption_loss.item(), 4),
            "attn_loss": None if out.attn_loss is None else round(out.attn_loss.item(), 4),
            "fac_pairs": out.fac_pairs,
            "llm_sequence_length": int(out.labels.shape[1]),
        }

    def estimate(self, batch: int, checkpointing: bool) -> dict:
        """FLOP estimate of this variant's step (its prompt length and LLM sequence length)."""
        length = llm_sequence_length(self.model, self.kwargs["prompts"], self.kwargs["captions"])
        return {
            "llm_sequence_length": length,
            **step_tflop_estimate(self.model, self.kwargs["prompts"], length, batch, checkpointing),
        }

    def summary(self, batch: int, checkpointing: bool) -> dict:
        median = statistics.median(self.seconds)
        estimate = None
        if (
            isinstance(self.model, DavirModel) and self.name != REFERENCE
        ):  # the shape estimate knows InstructBLIP's towers only
            estimate = self.estimate(batch, checkpointing)
            if estimate["llm_sequence_length"] != self.last["llm_sequence_length"]:
                raise RuntimeError(
                    f"variant {self.name}: estimated LLM length {estimate['llm_sequence_length']} but "
                    f"the forward used {self.last['llm_sequence_length']}"
                )
        tflop = self.counted_tflop if self.counted_tflop is not None else (estimate or {}).get("step_tflop")
        result = {
            "seconds_per_step": {
                "mean": round(statistics.fmean(self.seconds), 4),
                "median": round(median, 4),
                "min": round(min(self.seconds), 4),
                "max": round(max(self.seconds), 4),
                "stdev": round(statistics.stdev(self.seconds), 4) if len(self.seconds) > 1 else 0.0,
            },
            "pairs_per_s": round(batch / median, 2),
            **(
                {
                    "cpu_seconds_per_step_median": round(statistics.median(self.cpu_seconds), 4),
                    "pairs_per_cpu_s": round(batch / statistics.median(self.cpu_seconds), 2),
                }
                if self.device.type == "cpu"
                else {}
            ),
            "steps_timed": len(self.seconds),
            "prompt": self.kwargs["prompts"][0],
            "fac_lambda": self.lambda_attn,
            **self.last,
            "counted_step_tflop": self.counted_tflop,
            **({"count_error": self.count_error} if self.count_error else {}),
            **({"estimate": estimate} if estimate is not None else {}),
            "achieved_tflop_per_s": None if tflop is None else round_significant(tflop / median, 3),
        }
        if self.device.type == "cuda":
            result["peak_memory_gib"] = round(self.peak_bytes / 2**30, 2)
        if self.busy_seconds:
            busy = statistics.median(self.busy_seconds)
            result["with_busy_cpus"] = {
                "median": round(busy, 4),
                "min": round(min(self.busy_seconds), 4),
                "max": round(max(self.busy_seconds), 4),
                "pairs_per_s": round(batch / busy, 2),
                "over_idle": round(busy / median, 3),
            }
        if self.profile is not None:
            result["profile"] = self.profile
        return result


def interleaved_order(names: list[str], rounds: int) -> list[str]:
    """ABC CBA ABC ...: each variant as often first as last, so slow drift cancels out of the ratios."""
    order: list[str] = []
    for index in range(rounds):
        order.extend(names if index % 2 == 0 else reversed(names))
    return order


def target_verdict(args: argparse.Namespace, device: torch.device, variants: dict, ratio: float | None) -> dict:
    applicable = (
        device.type == "cuda"
        and "H100" in torch.cuda.get_device_name(device)
        and args.family == "instructblip"
        and args.preset == "vicuna7b"
        and args.batch_size == 16
        and args.dtype == "bfloat16"
        and args.gradient_checkpointing
    )
    if not applicable:
        return {"applicable": False, "why": "targets are for vicuna7b, batch 16, bf16, LLM checkpointing on an H100"}
    davir_rate = variants["davir"]["pairs_per_s"]
    return {
        "applicable": True,
        "ratio_ok": ratio is not None and ratio <= TARGETS["max_ratio_davir_over_plain"],
        "throughput_ok": davir_rate >= TARGETS["min_davir_pairs_per_s"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=FAMILIES.names(), default=DEFAULT_FAMILY, help="model.family")
    parser.add_argument("--preset", help=f"a preset of the family (default on a GPU: {LARGE_PRESETS}; tiny on CPU)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, help="pairs per step (default: 16 on GPU, 8 on CPU)")
    parser.add_argument("--steps", type=int, help="timed steps per variant (default: 10 on GPU, 5 on CPU)")
    parser.add_argument("--warmup", type=int, help="untimed steps per variant first (default: 3 on GPU, 2 on CPU)")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32", "float16"),
        help="weights' dtype (default: bfloat16 on GPU, float32 on CPU)",
    )
    parser.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        help="bf16 autocast around the forward (default: on for bf16 weights on a GPU)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        help="non-reentrant checkpointing (InstructBLIP: the LLM; a chat family: every layer "
        "HF checkpoints, ViT blocks included) (default: on for the large presets, off for tiny)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma list from {(*VARIANTS, FUSED_ADAMW, SPLIT_WINDOWS, REFERENCE, COMPILED)} "
        f"({SPLIT_WINDOWS}: qwen2_5_vl only; {REFERENCE}, {COMPILED}: instructblip only)",
    )
    parser.add_argument(
        "--busy-cpus", type=int, default=0, help="time every variant again with N processes keeping N CPU cores busy"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one profiled step per variant: kernels, GPU-busy share, ops of most GPU time",
    )
    parser.add_argument("--image-size", type=int, help="model.image_size (default: the preset's)")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: 1 on CPU, where oversubscribed cores of a shared "
        "machine made a 2-thread tiny step about 10x slower: 2.7 s vs 0.28 s; torch's choice on a "
        "GPU)",
    )
    parser.add_argument(
        "--estimate-only",
        action="store_true",
        help="build on the 'meta' device (no memory, any machine) and print only the FLOP estimate "
        "per variant (default preset then: vicuna7b, batch 16, checkpointing on)",
    )
    args = parser.parse_args(argv)
    if args.estimate_only and args.family != "instructblip":
        raise SystemExit(
            "--estimate-only is the layer-shape estimate of InstructBLIP; a chat family's FLOPs are "
            "counted on a real step (run without --estimate-only)"
        )
    device = torch.device("meta") if args.estimate_only else pick_device(args.device)
    gpu = device.type == "cuda" or args.estimate_only  # the estimate describes the GPU setting
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    args.preset = args.preset or (LARGE_PRESETS[args.family] if gpu else "tiny")
    args.batch_size = args.batch_size or (16 if gpu else 8)
    args.steps = args.steps or (10 if gpu else 5)
    args.warmup = args.warmup if args.warmup is not None else (3 if gpu else 2)
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if args.gradient_checkpointing is None:
        args.gradient_checkpointing = args.preset != "tiny"
    autocast = args.autocast if args.autocast is not None else (gpu and args.dtype == "bfloat16")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    extra = {"qwen2_5_vl": [SPLIT_WINDOWS], "instructblip": [REFERENCE, COMPILED]}.get(args.family, [])
    unknown = sorted(set(names) - {*VARIANTS, FUSED_ADAMW, *extra})
    if unknown or not names:
        raise SystemExit(f"--variants {args.variants!r}: choose from {(*VARIANTS, FUSED_ADAMW, *extra)}")
    if args.steps < 1 or args.batch_size < 1 or args.warmup < 0:
        raise SystemExit("--steps and --batch-size must be >= 1, --warmup >= 0")

    check_gpu_memory(device, args.preset, args.dtype)
    torch.manual_seed(0)
    build_started = time.perf_counter()
    model = build_model(args, device)
    sync(device)
    build_seconds = time.perf_counter() - build_started
    trainable, total = model.trainable_parameter_summary()["all"]
    data = synthetic_batch(model, args.batch_size, torch.device("cpu") if args.estimate_only else device)
    runners = {name: StepRunner(name, model, data, device, autocast) for name in names}
    setting = {
        "family": args.family,
        "preset": args.preset,
        "image_size": model.image_size,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "autocast_bf16": autocast,
        "gradient_checkpointing": args.gradient_checkpointing,
        "parameters": {"total": total, "trainable": trainable},
    }
    estimates = {}
    if isinstance(model, DavirModel):
        estimates = {
            name: r.estimate(args.batch_size, args.gradient_checkpointing)
            for name, r in runners.items()
            if name != REFERENCE
        }
    predicted = {}
    if "davir" in estimates and "plain" in estimates:
        predicted["davir_over_plain"] = round(estimates["davir"]["step_tflop"] / estimates["plain"]["step_tflop"], 4)
    if args.estimate_only:
        report = {
            "benchmark": "FLOP estimate of the DAVIR and plain training steps (no timing; model built on 'meta')",
            **setting,
            "estimates": estimates,
            "predicted_ratio_from_flops": predicted,
            "targets": TARGETS,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
        print(json.dumps(report, indent=2))
        return report

    for name in interleaved_order(names, args.warmup):
        runners[name].step(timed=False)
    for runner in runners.values():
        runner.count_flops()
    for name in interleaved_order(names, args.steps):
        runners[name].step(timed=True)
    if args.busy_cpus:
        with busy_cpus(args.busy_cpus):
            for name in interleaved_order(names, args.steps):
                runners[name].step(timed=True, busy=True)
    if args.profile:
        for runner in runners.values():
            runner.profile = profile_step(lambda r=runner: r.step(timed=False), device)

    variants = {name: runner.summary(args.batch_size, args.gradient_checkpointing) for name, runner in runners.items()}
    ratios = {}
    median = {name: v["seconds_per_step"]["median"] for name, v in variants.items()}
    for other, key in (
        (SPLIT_WINDOWS, "split_windows_over_davir"),
        (FUSED_ADAMW, "fused_adamw_over_davir"),
        (REFERENCE, "reference_over_davir"),
        (COMPILED, "compiled_over_davir"),
    ):
        if "davir" in variants and other in variants:
            ratios[key] = round(median[other] / median["davir"], 4)
    if "davir" in variants and "plain" in variants:
        ratios["davir_over_plain"] = round(median["davir"] / median["plain"], 4)
        if "epc_only" in variants:
            ratios["epc_only_over_plain"] = round(median["epc_only"] / median["plain"], 4)
            ratios["davir_over_epc_only"] = round(median["davir"] / median["epc_only"], 4)
        counted = {name: v["counted_step_tflop"] for name, v in variants.items()}
        if counted["davir"] and counted["plain"]:
            predicted["davir_over_plain_counted"] = round(counted["davir"] / counted["plain"], 4)
        if device.type == "cpu":
            cpu = {name: v["cpu_seconds_per_step_median"] for name, v in variants.items()}
            ratios["cpu_time_davir_over_plain"] = round(cpu["davir"] / cpu["plain"], 4)
    report = {
        "benchmark": f"DAVIR training step vs plain {args.family} LoRA step (forward + backward + clip + AdamW, "
        "same batch, interleaved)",
        "device": device_name(device),
        **setting,
        "build_seconds": round(build_seconds, 1),
        "steps": {
            "warmup_per_variant": args.warmup,
            "timed_per_variant": args.steps,
            "order": "interleaved ABC CBA",
            "busy_cpus": args.busy_cpus,
        },
        "variants": variants,
        "ratios_of_median_step": ratios,
        "predicted_ratio_from_flops": predicted,
        "targets": TARGETS,
        "target_check": target_verdict(args, device, variants, ratios.get("davir_over_plain")),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": platform.python_version(),
    }
    if gpu:
        report["cuda"] = torch.version.cuda
    else:
        report["note"] = (
            "CPU run of the small preset: checks the bench and the relative cost only; the GPU figures are in "
            "bench/README.md."
        )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
