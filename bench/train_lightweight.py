"""Training throughput of the lightweight captioners: pairs/s for forward + backward + Adam step.

    python bench/train_lightweight.py            # GPU: the papers' CLEVR-Change batch sizes; CPU: batch 4
    python bench/train_lightweight.py --methods scorer dirl --batch-size 64 --steps 20

Models are at the paper sizes (hidden 512, word embedding 300, 8 heads, 2+2 layers, CLEVR-Change
settings from `paper_settings`); inputs are random features (1024×14×14), random 24-token captions
(vocabulary 76), and for CHEER 3 random entity embeddings, for RDD precomputed attribute features. One
"pair" is one (before, after, caption) sample; a CLEVR-Change iteration of SCORER/DIRL forwards two
pairs per scene (§0.6), so scenes/s = pairs/s ÷ 2. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from davir.models.lightweight import METHOD_NAMES, LightweightConfig, build_lightweight_model, paper_settings  # noqa: E402


def random_batch(config: LightweightConfig, batch: int, device: torch.device, generator: torch.Generator) -> dict:
    """Random features and valid captions (<START> words <END>, padded) of the paper shapes."""
    feats = [torch.randn(batch, config.backbone_channels, 14, 14, generator=generator).to(device) for _ in range(2)]
    lengths = torch.randint(6, config.max_len - 1, (batch,), generator=generator)
    captions_in = torch.zeros(batch, config.max_len, dtype=torch.long)
    captions_target = torch.full((batch, config.max_len), -1, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        words = torch.randint(4, config.vocab_size, (length,), generator=generator)
        sequence = torch.cat([torch.tensor([2]), words, torch.tensor([3])])
        captions_in[row, : len(sequence)] = sequence
        captions_target[row, : len(sequence) - 1] = sequence[1:]
    extras = {}
    if config.method == "cheer":
        extras["entities"] = torch.randn(batch, config.cheer_entities, config.entity_dim, generator=generator).to(
            device
        )
    if config.method == "rdd":
        extras["attributes"] = {
            "noun_features": torch.randn(batch, config.acr_text_dim, generator=generator).to(device),
            "verb_features": torch.randn(batch, config.acr_text_dim, generator=generator).to(device),
        }
    return {
        "feats": feats,
        "captions_in": captions_in.to(device),
        "captions_target": captions_target.to(device),
        "extras": extras,
    }


def bench_method(method: str, batch: int, steps: int, warmup: int, device: torch.device, bf16: bool) -> dict:
    model_fields, trainer = paper_settings(method, "clevr_change")
    config = LightweightConfig(method=method, **model_fields)
    model = build_lightweight_model(config).to(device).train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=trainer["lr"])
    data = random_batch(config, batch, device, torch.Generator().manual_seed(0))
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(*data["feats"], data["captions_in"], data["captions_target"], **data["extras"])
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
        model.after_optimizer_step()
        return out["loss"].item()

    for _ in range(warmup):
        step()
    if gpu:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        loss = step()
    if gpu:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / steps
    result = {
        "batch_size": batch,
        "paper_batch_size": trainer["batch_size"],
        "seconds_per_step": round(seconds, 4),
        "pairs_per_s": round(batch / seconds, 1),
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "last_loss": round(loss, 4),
    }
    if gpu:
        result["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHOD_NAMES), choices=METHOD_NAMES)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, help="default: each paper's CLEVR-Change batch on GPU, 4 on CPU")
    parser.add_argument("--steps", type=int, help="timed steps (default: 20 on GPU, 3 on CPU)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), help="default: bf16 autocast on GPU, fp32 on CPU")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    gpu = device.type == "cuda"
    bf16 = (args.precision or ("bf16" if gpu else "fp32")) == "bf16"
    steps = args.steps or (20 if gpu else 3)
    results = {}
    for method in args.methods:
        batch = args.batch_size or (paper_settings(method, "clevr_change")[1]["batch_size"] if gpu else 4)
        torch.manual_seed(0)
        results[method] = bench_method(method, batch, steps, args.warmup, device, bf16)
    report = {
        "benchmark": "lightweight captioner training step (forward + backward + Adam), CLEVR-Change shapes",
        "device": torch.cuda.get_device_name(device) if gpu else f"cpu ({platform.processor() or platform.machine()})",
        "precision": "bf16 autocast" if bf16 else "fp32",
        "torch_threads": torch.get_num_threads(),
        "steps": steps,
        "methods": results,
        "torch": torch.__version__,
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
