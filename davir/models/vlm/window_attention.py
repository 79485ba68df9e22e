"""Qwen2.5-VL's windowed ViT attention in a few SDPA calls instead of one per window.

Qwen2.5-VL's vision blocks attend within windows (and, in the full-attention blocks, within images), packed
into one sequence with ``cu_seqlens``. transformers hands that packing to an attention kernel only when the
implementation is a flash one; with SDPA (all we can rely on: flash-attn is not a dependency) it splits the
sequence and calls SDPA once per window — at 448 px 16 windows an image, 512 calls in each of the 28 window
blocks for a batch of 16 pairs, again in the checkpointing recompute and the backward. The H200 run of
``bench/train_step.py --family qwen2_5_vl`` reached 61 TFLOP/s against InstructBLIP's 189 (bench/README.md).

:func:`packed_window_attention` takes the packed sequence as a flash kernel would and groups the windows by
length (with one grid per run there are at most four: whole windows and the right, bottom and corner ones),
so each group is one batched SDPA call over (windows, heads, length, dim). Same arithmetic as the split path:
the tests hold the vision tower's output and the FAC map equal to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

# transformers passes cu_seqlens only to implementations whose name says "flash" (is_flash_attention_requested);
# the name is registered for the vision tower alone.
PACKED_ATTENTION = "davir_packed_sdpa_flash_layout"


def packed_window_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    is_causal: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """(1, H, N, D) query/key/value of windows packed along N with boundaries ``cu_seq_lens_q`` → ((1, N, H, D)
    attention output, None), each window attending only to itself (non-causal)."""
    if cu_seq_lens_q is None or query.shape[0] != 1 or attention_mask is not None or is_causal:
        raise ValueError("packed_window_attention takes one packed, unmasked, non-causal sequence with cu_seqlens")
    bounds = cu_seq_lens_q.tolist()
    starts, lengths = bounds[:-1], [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    states, sdpa = (query[0], key[0], value[0]), {"dropout_p": dropout, "scale": scaling}
    if len(set(lengths)) == 1:  # every window alike (the grid a multiple of the window): views, no gather
        return _attend(*states, lengths[0], **sdpa).unsqueeze(0), None
    output = query.new_empty(query.shape[2], query.shape[1], query.shape[3])  # (N, H, D)
    for length in sorted(set(lengths)):
        first = torch.tensor([s for s, n in zip(starts, lengths) if n == length], device=query.device)
        index = (first[:, None] + torch.arange(length, device=query.device)).flatten()  # the group's positions
        output[index] = _attend(*(s.index_select(1, index) for s in states), length, **sdpa)
    return output.unsqueeze(0), None


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, length: int, **sdpa) -> torch.Tensor:
    """(H, M, D) of M / ``length`` whole windows one after another → (M, H, D), one SDPA call for all."""
    windows = [s.unflatten(1, (-1, length)).transpose(0, 1) for s in (query, key, value)]  # (windows, H, L, D)
    return F.scaled_dot_product_attention(*windows, **sdpa).permute(0, 2, 1, 3).flatten(0, 1)


AttentionInterface.register(PACKED_ATTENTION, packed_window_attention)


def use_packed_window_attention(vision_tower: torch.nn.Module) -> None:
    """Switch a Qwen2.5-VL vision tower from SDPA per window to :func:`packed_window_attention`."""
    vision_tower.config._attn_implementation = PACKED_ATTENTION
