"""The last ViT layer's [CLS]→patch attention (DAVIR Eq. 5) without eager attention for the whole tower.

``output_attentions=True`` needs eager attention in every one of the 39 EVA-ViT layers and materialises
39 × N × 16 × 257 × 257 probabilities. FAC only needs one row of one layer, so a forward hook on the last
layer's fused ``qkv`` projection recomputes just that row, ``softmax(q_cls · kᵀ · scale)`` per head, from
the projection's output. The hook is on whatever module sits at ``self_attn.qkv`` when it is attached —
after PEFT wrapping that is the LoRA layer, whose output already includes the LoRA delta — so the map is
exactly what the (SDPA or eager) attention of that layer uses, and gradients flow into qkv and its LoRA.
"""

from __future__ import annotations

import torch
from torch import nn


class ClsAttentionHook:
    """Forward hook that keeps the [CLS]→all-tokens attention of one ViT attention block.

    Attach with :meth:`attach`; after each vision forward, :meth:`pop` returns the probabilities of the
    most recent call, shape (N, heads, tokens), in float32. The hook keeps only the latest call, so a
    recomputation (e.g. under gradient checkpointing) overwrites rather than accumulates.
    """

    def __init__(self, attention: nn.Module) -> None:
        # InstructBlipAttention: fused qkv Linear (D → 3D), `num_heads`, `scale` = head_dim ** -0.5.
        self.num_heads: int = attention.num_heads
        self.head_dim: int = attention.head_dim
        self.scale: float = attention.scale
        self.qkv: nn.Module = attention.qkv
        self._latest: torch.Tensor | None = None
        self._handle = None

    def attach(self) -> ClsAttentionHook:
        if self._handle is None:
            self._handle = self.qkv.register_forward_hook(self._hook)
        return self

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        batch, tokens, _ = output.shape
        # Same split as InstructBlipAttention.forward: (N, T, 3, heads, head_dim).
        qkv = output.reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        # float32 even under bf16 weights or autocast: it is one row per head, and the loss takes its log.
        with torch.autocast(device_type=output.device.type, enabled=False):
            q_cls = qkv[:, 0, 0].float()  # (N, heads, head_dim)
            keys = qkv[:, :, 1].float()  # (N, T, heads, head_dim)
            logits = torch.einsum("nhd,nthd->nht", q_cls, keys) * self.scale
            self._latest = logits.softmax(dim=-1)

    def pop(self) -> torch.Tensor:
        """The attention row of the last forward (N, heads, tokens); raises if the hook has not fired."""
        if self._latest is None:
            raise RuntimeError("the [CLS] attention hook did not fire: was the vision tower run after attach()?")
        latest, self._latest = self._latest, None
        return latest


def last_layer_attention_module(vision_model: nn.Module) -> nn.Module:
    """``vision_model.encoder.layers[-1].self_attn`` of an InstructBLIP/BLIP-2 vision tower."""
    return vision_model.encoder.layers[-1].self_attn


def cls_to_patch_map(cls_row: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(N, heads, 1 + Hp·Wp) [CLS] attention row → (N, Hp, Wp) map: mean over heads, [CLS]→[CLS] dropped.

    The map is not renormalised (it sums to 1 minus the [CLS] self-weight); the FAC loss normalises it.
    """
    height, width = grid
    if cls_row.shape[-1] != 1 + height * width:
        raise ValueError(
            f"attention row has {cls_row.shape[-1]} tokens, expected 1 + {height}×{width} for the patch grid"
        )
    return cls_row.mean(dim=1)[:, 1:].reshape(cls_row.shape[0], height, width)
