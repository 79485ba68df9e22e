"""Pieces of ``bench/train_step.py`` that are not the DAVIR step itself: the transformers + PEFT reference step of
InstructBLIP, busy CPU processes beside a timing, and a one-step profile of where the GPU waits."""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import time
from collections import Counter

import peft
import torch
from transformers import InstructBlipForConditionalGeneration

IGNORE_INDEX = -100


def build_reference(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A second InstructBLIP of ``model``'s architecture, dtype and attention kernel, with ``model``'s LoRA config
    applied by PEFT and HF's own non-reentrant checkpointing of the LLM: what a user of transformers + PEFT alone
    would train. Random weights (the timing does not depend on them)."""
    core = model.core
    dtype = next(core.parameters()).dtype
    with torch.device(device):
        reference = InstructBlipForConditionalGeneration._from_config(
            core.config, attn_implementation=core.config._attn_implementation, dtype=dtype
        )
    with torch.no_grad():
        reference.query_tokens.normal_(std=0.02)
    lora = copy.deepcopy(model.wrapped().peft_config["default"])
    lora.inference_mode = False
    reference = peft.get_peft_model(reference, lora)
    if model.config.gradient_checkpointing:  # as davir's LLM: non-reentrant, the LLM only
        language_model = reference.base_model.model.language_model
        language_model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        language_model.enable_input_require_grads()
    return reference.train()


def reference_inputs(model: torch.nn.Module, data: dict, device: torch.device) -> dict:
    """The tensors of the reference step, tokenised once (as a user's collator does): Q-Former instruction ids,
    LLM [prompt | caption + EOS] ids padded on the right, its mask and labels — the same sequences as the DAVIR
    model's ``davir`` variant (entity prompt)."""
    prompts, captions = data["entity_prompts"], data["captions"]
    qformer = model.qformer_tokenizer(list(prompts), padding=True, return_tensors="pt")
    prompt_ids, caption_ids = model._prompt_ids(prompts), model._caption_ids(captions)
    length = max(len(p) + len(c) for p, c in zip(prompt_ids, caption_ids))
    batch = len(prompts)
    ids = torch.full((batch, length), model.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((batch, length), dtype=torch.long)
    labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompt_ids, caption_ids)):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        mask[row, : len(p) + len(c)] = 1
        labels[row, len(p) : len(p) + len(c)] = torch.tensor(c)
    return {
        "pixels": torch.cat([data["pixel_before"], data["pixel_after"]]),
        "qformer_ids": qformer["input_ids"].repeat(2, 1).to(device),
        "qformer_mask": qformer["attention_mask"].repeat(2, 1).to(device),
        "input_ids": ids.to(device),
        "text_mask": mask.to(device),
        "labels": labels.to(device),
    }


def reference_loss(reference: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, int]:
    """HF's modules end to end: both images through ``get_image_features`` as one batch, the two query sets
    side by side before the text embeddings, HF's causal-LM loss. Returns (loss, LLM sequence length)."""
    core = reference.base_model.model
    pixels = inputs["pixels"].to(core.vision_model.embeddings.patch_embedding.weight.dtype)
    tokens = core.get_image_features(
        pixels, qformer_input_ids=inputs["qformer_ids"], qformer_attention_mask=inputs["qformer_mask"], return_dict=True
    ).pooler_output
    batch = tokens.shape[0] // 2
    visual = torch.cat([tokens[:batch], tokens[batch:]], dim=1)
    text = core.get_input_embeddings()(inputs["input_ids"])
    embeds = torch.cat([visual.to(text.dtype), text], dim=1)
    ones = torch.ones(visual.shape[:2], dtype=torch.long, device=text.device)
    ignore = torch.full(visual.shape[:2], IGNORE_INDEX, dtype=torch.long, device=text.device)
    out = core.language_model(
        inputs_embeds=embeds,
        attention_mask=torch.cat([ones, inputs["text_mask"]], 1),
        labels=torch.cat([ignore, inputs["labels"]], 1),
        use_cache=False,
    )
    return out.loss, embeds.shape[1]


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


@contextlib.contextmanager
def busy_cpus(count: int):
    """``count`` processes each keeping one CPU core busy (pure Python loops, as DataLoader workers decoding
    images keep theirs) for the duration."""
    if count <= 0:
        yield
        return
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    workers = [context.Process(target=_spin, args=(stop,), daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # all of them spinning before the first timed step
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()


def profile_step(step, device: torch.device, top: int = 12) -> dict:
    """One step under ``torch.profiler``: wall time, the GPU kernels' summed time (busy share of the wall time),
    how many kernels were launched and the ops of most GPU time — where a launch-bound step shows many small
    kernels and a low busy share."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        step()
    wall = time.perf_counter() - started
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(e.device_time for e in kernels)
    launches = Counter(
        e.name
        for e in events
        if e.name
        in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaStreamSynchronize")
    )
    by_op = sorted(prof.key_averages(), key=lambda a: a.self_device_time_total, reverse=True)[:top]
    return {
        "wall_s": round(wall, 4),
        "kernels": len(kernels),
        "kernel_time_s": round(kernel_us / 1e6, 4),
        "gpu_busy_share": round(kernel_us / 1e6 / wall, 3) if wall else None,
        "runtime_calls": dict(launches),
        "cpu_ops": sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CPU),
        "top_ops_by_gpu_time": [
            {"op": a.key[:80], "calls": a.count, "gpu_ms": round(a.self_device_time_total / 1e3, 2)} for a in by_op
        ],
    }
