"""The ResNet-101 backbone of the lightweight methods (docs/methods/README.md) and its input recipe [C].

    backbone = build_backbone("resnet101-63fe2227.pth")          # local torchvision state dict, layer3 output
    x = normalize_batch(uint8_batch, IMAGENET_STD)                # (B, 3, 224, 224) → network input
    features = backbone(x)                                        # (B, 1024, 14, 14)

The SCORER/DIRL `extract_features.py` recipe: RGB → ``cv2.resize(224×224, INTER_CUBIC)`` on uint8 → /255 →
ImageNet mean/std (`AUTHORS_STD` is the reference script's typo for the last channel) → layer3.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from davir.data.images import load_rgb
from davir.errors import DataError
from davir.io import file_sha256

IMAGE_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTHORS_STD = (0.229, 0.224, 0.224)  # the reference script's typo for the last channel
NO_WEIGHTS = (
    "ResNet-101 weights are needed: pass --weights PATH to a local torchvision resnet101 state dict "
    "(e.g. resnet101-63fe2227.pth); nothing is downloaded. --random-init is for tests and demos only."
)


def load_resized(path: Path, *, record: str = "?") -> np.ndarray:
    """RGB uint8 (224, 224, 3): the image resized with OpenCV's bicubic interpolation, as the reference."""
    rgb = np.asarray(load_rgb(path, record=record))
    return cv2.resize(rgb, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_CUBIC)


def normalize_batch(images: torch.Tensor, std: Sequence[float]) -> torch.Tensor:
    """uint8 (B, 3, H, W) → float32 ``(x / 255 − mean) / std`` with the ImageNet mean."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
    scale = torch.tensor(std, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / scale


def build_backbone(weights: str | Path | None, *, random_init: bool = False, seed: int = 0) -> torch.nn.Module:
    """torchvision bottleneck ResNet truncated after layer3 (conv1, bn1, relu, maxpool, layer1-3), in eval mode.

    The layout (blocks per stage, bottleneck width) is read from the weights, so ImageNet ResNet-101 and
    the shipped tiny backbone (davir/assets/tiny_resnet, `python -m davir.pretrain_backbone`) load alike.
    `random_init` is a seeded ResNet-101 whose residual branches all contribute (see `random_backbone`).
    """
    from davir.models.resnet_layout import LayoutError, backbone_from_state_dict, random_backbone

    if random_init:
        return random_backbone(seed).eval().requires_grad_(False)
    if weights is None:
        raise DataError(NO_WEIGHTS)
    weights = Path(weights)
    if not weights.is_file():
        raise DataError(f"ResNet-101 weights file is missing: {weights}")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as error:  # a corrupt or non-PyTorch file: say which file
        raise DataError(f"{weights}: cannot be read as a PyTorch state dict ({error})") from error
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise DataError(f"{weights}: expected a state dict, got {type(state).__name__}")
    try:
        backbone = backbone_from_state_dict(state)
    except (LayoutError, RuntimeError) as error:  # wrong keys or shape mismatches
        raise DataError(f"{weights}: not a torchvision ResNet-101 state dict ({str(error)[:300]})") from error
    return backbone.eval().requires_grad_(False)


# The demo's tiny pretrained backbone (`python -m davir.pretrain_backbone`, docs/experiments/tiny_backbone.md), package data so
# that an installed davir finds it too.
SHIPPED_BACKBONE = Path(__file__).resolve().parents[1] / "assets" / "tiny_resnet" / "backbone.pth"


def shipped_backbone_matching(fingerprint: str | None) -> Path | None:
    """The shipped tiny backbone when `fingerprint` (a features manifest's ``"sha256:…"``) is its hash, else None."""
    if not fingerprint or not SHIPPED_BACKBONE.is_file():
        return None
    return SHIPPED_BACKBONE if fingerprint == f"sha256:{file_sha256(SHIPPED_BACKBONE)}" else None
