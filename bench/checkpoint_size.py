"""Size of one training checkpoint (RUN/checkpoints/step_N) of a DAVIR LoRA run: trainable-only vs whole model.

    python bench/checkpoint_size.py                    # vicuna7b (arithmetic, meta tensors) + tiny (a real save)
    python bench/checkpoint_size.py --skip-tiny

* ``vicuna7b``: the InstructBLIP-Vicuna-7B architecture with the paper's LoRA (App. B: r=4 ViT qkv and Q-Former
  q/k/v, r=8 LLM attention), bf16 weights, built on the meta device (no memory): the bytes of the trainable
  tensors + buffers (what the checkpoint holds now), of the whole state dict (what `save_state` held before),
  and of AdamW's two moments of the trainable tensors (both cases).
* ``tiny``: the tiny preset with configs/demo.yaml's LoRA, 2 optimizer steps on random pairs, then
  `save_state` through the loop's hooks into a temporary folder: its files are measured on disk.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from davir.models.vlm.build import build_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.lora import LoraSettings  # noqa: E402

CAPTIONS = ["the red cube has moved", "a small sphere was added", "nothing has changed"]


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def vicuna7b() -> dict:
    config = DavirModelConfig(
        preset="vicuna7b",
        train_mode="lora",
        dtype="bfloat16",
        lora=LoraSettings(vision_rank=4, qformer_rank=4, llm_rank=8),
    )
    model = build_davir_model(config, captions_for_tokenizer=CAPTIONS, device="meta")
    state = model.state_dict()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    kept = trainable | {n for n, _ in model.named_buffers()}
    trainable_params = [p for p in model.parameters() if p.requires_grad]
    adam = 2 * sum(p.numel() * 4 for p in trainable_params)  # exp_avg + exp_avg_sq, fp32 (PEFT keeps adapters fp32)
    now = tensor_bytes(v for k, v in state.items() if k in kept)
    before = tensor_bytes(state.values())
    return {
        "trainable_parameters": sum(p.numel() for p in trainable_params),
        "all_parameters": sum(p.numel() for p in model.parameters()),
        "model_file_bytes_now": now,
        "model_file_bytes_before": before,
        "adamw_state_bytes": adam,
        "checkpoint_gb_now": round((now + adam) / 1e9, 3),
        "checkpoint_gb_before": round((before + adam) / 1e9, 3),
        "three_checkpoints_gb_before": round(3 * (before + adam) / 1e9, 1),
    }


def tiny() -> dict:
    from accelerate import Accelerator

    from davir.training.checkpoints import install_trainable_state_hooks

    torch.manual_seed(0)
    config = DavirModelConfig(
        train_mode="lora",
        extra_trainable=("language_projection", "query_tokens"),
        lora=LoraSettings(vision_rank=8, qformer_rank=8, llm_rank=16),
    )
    model = build_davir_model(config, captions_for_tokenizer=CAPTIONS)
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    pixels = torch.randn(2, 3, 64, 64)
    for _ in range(2):
        out = model(
            pixel_before=pixels,
            pixel_after=pixels,
            prompts=model.build_prompts(None, batch_size=2),
            captions=CAPTIONS[:2],
        )
        accelerator.backward(out.loss)
        optimizer.step()
        optimizer.zero_grad()
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        accelerator.save_state(str(Path(folder) / "before"))  # no hooks yet: the whole model
        install_trainable_state_hooks(accelerator)
        accelerator.save_state(str(Path(folder) / "now"))
        for name in ("before", "now"):
            files = {p.name: p.stat().st_size for p in (Path(folder) / name).iterdir()}
            result[f"{name}_bytes"] = sum(files.values())
            result[f"{name}_model_safetensors_bytes"] = files.get("model.safetensors")
    result["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result["all_parameters"] = sum(p.numel() for p in model.parameters())
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-tiny", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {"vicuna7b_lora_paper": vicuna7b()}
    if not args.skip_tiny:
        report["tiny_lora_demo"] = tiny()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
