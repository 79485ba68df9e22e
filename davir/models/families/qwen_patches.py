"""What the Qwen-style families share (Qwen2.5-VL, Qwen3-VL): the image processor cuts an S×S picture into p×p
patches and flattens them, picture after picture, into one ``(patches, C·T·p·p)`` tensor with an
``image_grid_thw`` row per picture; the ViT is ``model.visual``, and S is a multiple of p × the merger's side."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn


class PackedPatchImages(ABC):
    """Mixin for a ``ChatFamily`` whose processor packs every picture's patches into one tensor. The family gives
    ``preset_image_sizes``, ``pretrained_image_size`` and ``check_grid`` (a family without it fails at import,
    when it is registered)."""

    preset_image_sizes: dict[str, int]
    pretrained_image_size: int

    @abstractmethod
    def check_grid(self, size: int, patch_size: int, merge: int) -> None:
        """Raise a ValueError (ConfigError) for an S this family's processor cannot cut into whole merge units."""

    def input_size(self, model_config, architecture) -> int:
        """S: ``model.image_size``, else the pretrained size for a folder and the preset's size for a preset."""
        size = model_config.image_size or (
            self.pretrained_image_size
            if model_config.pretrained
            else self.preset_image_sizes.get(model_config.preset, self.pretrained_image_size)
        )
        vision = architecture.vision_config
        self.check_grid(size, vision.patch_size, vision.spatial_merge_size)
        return size

    def patch_grid(self, size: int, architecture) -> tuple[int, int]:
        side = size // architecture.vision_config.patch_size
        return side, side

    def per_image_pixels(self, processed: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        pixels = processed["pixel_values"]  # (count · patches, C · T · p · p), images one after another
        return pixels.reshape(count, pixels.shape[0] // count, pixels.shape[1])

    def pixel_inputs(self, pixels: torch.Tensor, one_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images = pixels.shape[0] * pixels.shape[1]  # (B, K, patches, dim): row by row, in text order
        return {
            "pixel_values": pixels.reshape(-1, pixels.shape[-1]),
            "image_grid_thw": one_image["image_grid_thw"].repeat(images, 1),
        }

    def encode_images(self, core: nn.Module, pixels: dict[str, torch.Tensor]) -> Any:
        return core.model.get_image_features(pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])

    def vision_tower(self, core: nn.Module) -> nn.Module:
        return core.model.visual
