"""ResNet-class backbones truncated after layer3, built to fit a state dict (ResNet-101 or the tiny demo one).

`preprocess features --weights FILE` loads ImageNet ResNet-101 weights and the shipped tiny backbone
(`davir/assets/tiny_resnet/backbone.pth`, made by `python -m davir.pretrain_backbone`) through the same path:
the number of bottleneck blocks per stage and the bottleneck width are read off the state dict's keys and
shapes, so any torchvision ``ResNet(Bottleneck, …)`` whose layer3 gives 1024 channels at stride 16 loads.
"""

from __future__ import annotations

import re

import torch
from torch import nn

STAGES = ("layer1", "layer2", "layer3")
_BLOCK_KEY = re.compile(r"^(layer[1-4])\.(\d+)\.")


class LayoutError(ValueError):
    """The state dict is not a torchvision bottleneck ResNet."""


def resnet_layout(state: dict[str, torch.Tensor]) -> tuple[list[int], int]:
    """(blocks per stage for layer1..layer3, width_per_group) of a torchvision bottleneck ResNet state dict.

    ResNet-101 gives ([3, 4, 23], 64). Raises LayoutError for anything else than bottleneck blocks.
    """
    blocks = {stage: 0 for stage in STAGES}
    for key in state:
        match = _BLOCK_KEY.match(key)
        if match and match.group(1) in blocks:
            blocks[match.group(1)] = max(blocks[match.group(1)], int(match.group(2)) + 1)
    if not all(blocks.values()):
        raise LayoutError(
            f"no blocks for {[s for s, n in blocks.items() if not n]} (keys like 'layer1.0.conv1.weight')"
        )
    conv = state.get("layer1.0.conv1.weight")
    if conv is None or "layer1.0.conv3.weight" not in state:
        raise LayoutError("layer1.0 has no conv1/conv3: not bottleneck blocks")
    width = int(conv.shape[0])  # layer1's bottleneck width = 64 · width_per_group / 64
    return [blocks[s] for s in STAGES], width


def build_resnet(blocks: list[int], width_per_group: int = 64) -> nn.Module:
    """torchvision ``ResNet(Bottleneck, blocks + [1])``: the layer4 block is never used (truncated away)."""
    from torchvision.models.resnet import Bottleneck, ResNet

    return ResNet(Bottleneck, [*blocks, 1], width_per_group=width_per_group)


def truncate_at_layer3(net: nn.Module) -> nn.Sequential:
    """conv1 → bn1 → relu → maxpool → layer1-3: (B, 3, 224, 224) → (B, 1024, 14, 14)."""
    return nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3)


def backbone_from_state_dict(state: dict[str, torch.Tensor]) -> nn.Sequential:
    """The layer3-truncated ResNet of `state` (fc/layer4 may be absent); LayoutError when keys do not match."""
    blocks, width = resnet_layout(state)
    net = build_resnet(blocks, width)
    result = net.load_state_dict(state, strict=False)
    needed = [k for k in result.missing_keys if not k.startswith(("fc.", "layer4."))]
    if needed or result.unexpected_keys:
        raise LayoutError(f"missing {needed[:5]}, unexpected {result.unexpected_keys[:5]}")
    return truncate_at_layer3(net)


def random_backbone(seed: int, blocks: list[int] | None = None, width_per_group: int = 64) -> nn.Sequential:
    """Seeded random ResNet (default ResNet-101) up to layer3 whose residual branches all contribute.

    torchvision's ``zero_init_residual`` keeps a random ResNet-101 in fp16 range by zeroing every branch,
    which leaves conv7×7 → maxpool → three 1×1 shortcut maps (an 11-pixel receptive field). Instead each
    branch's last BN scale is set to 1/√(blocks in the stage), so a stage's variance grows ~2× instead of 2^n.
    """
    torch.manual_seed(seed)
    blocks = blocks or [3, 4, 23]
    net = build_resnet(blocks, width_per_group)
    for stage, count in zip(STAGES, blocks):
        for block in getattr(net, stage):
            nn.init.constant_(block.bn3.weight, count**-0.5)
    return truncate_at_layer3(net)
