"""What the step and generate benches share: CLEVR-like captions and their vocabulary, random change masks, the
device helpers."""

from __future__ import annotations

import platform
import random

import torch

ENTITY = "small red metal sphere"  # the entity prompt of the DAVIR variants

# CLEVR-Change-like captions (8-14 words): the word-level tokenizer of the random presets learns its vocabulary
# from them, and the batch draws its captions from them.
SIZES = ("small", "large")
COLORS = ("red", "blue", "green", "gray", "brown", "purple", "cyan", "yellow")
MATERIALS = ("metal", "rubber")
SHAPES = ("sphere", "cube", "cylinder")
TEMPLATES = (
    "the {a} changed its location",
    "the {a} has been newly placed",
    "the {a} has disappeared",
    "the {a} changed to {color}",
    "the {a} was replaced by a {b}",
    "there is no difference",
)


def clevr_like_captions(count: int, seed: int) -> list[str]:
    """``count`` captions drawn from the templates above with a seeded RNG."""
    rng = random.Random(seed)

    def thing() -> str:
        return f"{rng.choice(SIZES)} {rng.choice(COLORS)} {rng.choice(MATERIALS)} {rng.choice(SHAPES)}"

    return [rng.choice(TEMPLATES).format(a=thing(), b=thing(), color=rng.choice(COLORS)) for _ in range(count)]


def vocabulary_texts() -> list[str]:
    """Every word the benches use, so the word-level tokenizer never maps one to <unk>."""
    words = [*SIZES, *COLORS, *MATERIALS, *SHAPES, ENTITY]
    return [" ".join(words), *(t.format(a="x", b="x", color="x") for t in TEMPLATES)]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_gpu_memory(device: torch.device, preset: str, dtype: str) -> None:
    """Refuse early, with numbers, when the GPU cannot hold a 7B-class preset's weights (≤ 8.3 B parameters ≈
    17 GB in bf16)."""
    if device.type != "cuda" or preset == "tiny":
        return
    free, total = torch.cuda.mem_get_info(device)
    need = 8.3e9 * (4 if dtype == "float32" else 2) * 1.5  # weights + room for activations
    if free < need:
        raise SystemExit(
            f"{preset} in {dtype} needs about {need / 2**30:.0f} GiB of GPU memory; "
            f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB are free"
        )


def rectangle_masks(batch: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """(B, S, S) binary masks, one random axis-aligned rectangle (5-40 % of the side) per image."""
    masks = torch.zeros(batch, size, size)
    for row in range(batch):
        height, width = (int(v) for v in torch.randint(size // 20 + 1, 2 * size // 5 + 1, (2,), generator=generator))
        top = int(torch.randint(0, size - height + 1, (1,), generator=generator))
        left = int(torch.randint(0, size - width + 1, (1,), generator=generator))
        masks[row, top : top + height, left : left + width] = 1.0
    return masks
