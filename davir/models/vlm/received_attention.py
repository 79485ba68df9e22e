"""FAC's patch map for vision encoders without a [CLS] token: the mean attention each patch receives.

InstructBLIP's EVA ViT has a [CLS] token, and DAVIR's Eq. 5 supervises its attention row. SigLIP
(LLaVA-OneVision, SmolVLM) and Qwen2.5-VL's ViT have none [D]: there the map is the attention each patch
*receives*, averaged over the heads and over every query patch of the same image,

    a_k = 1/(H·T) Σ_h Σ_q softmax_k(q_q · k_k · scale)          (sums to 1 over the T patches)

— where the layer as a whole looks, the quantity a [CLS] row summarises in a ViT that has one. The hooks
recompute it from the layer's query and key projections (LoRA included), so the model keeps its fast
(SDPA/flash) attention; the tests hold it equal to the eager attention's probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def received_attention(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """(…, heads, T, d) queries and keys of one image → (…, T): the mean over heads and queries of the
    softmax attention each key position receives. Float32, differentiable."""
    with torch.autocast(device_type=query.device.type, enabled=False):
        logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
        return logits.softmax(dim=-1).mean(dim=(-3, -2))


class QueryKeyHook:
    """Hooks on a ViT layer's separate ``q_proj`` and ``k_proj`` (SigLIP-style attention, no rotary): after each
    vision forward, :meth:`pop` gives the received attention (N, T) of every image of the call.

    ``heads`` and ``scale`` are the layer's; the projections' outputs (N, T, D) are split into heads as the
    layer does. The hook keeps only the latest call (a recomputation under checkpointing overwrites it)."""

    def __init__(self, attention: nn.Module, *, heads: int, scale: float) -> None:
        self.query_projection, self.key_projection = attention.q_proj, attention.k_proj
        self.heads, self.scale = heads, scale
        self._query: torch.Tensor | None = None
        self._latest: torch.Tensor | None = None
        self._handles: list = []

    def attach(self) -> QueryKeyHook:
        if not self._handles:
            self._handles = [
                self.query_projection.register_forward_hook(self._keep_query),
                self.key_projection.register_forward_hook(self._with_key),
            ]
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _split(self, states: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = states.shape
        return states.reshape(batch, tokens, self.heads, width // self.heads).transpose(1, 2)

    def _keep_query(self, module, inputs, output: torch.Tensor) -> None:
        self._query = output

    def _with_key(self, module, inputs, output: torch.Tensor) -> None:
        if self._query is None:
            raise RuntimeError("the FAC hook saw the key projection run before the query projection")
        self._latest = received_attention(self._split(self._query), self._split(output), self.scale)
        self._query = None

    def pop(self, *, missing_ok: bool = False) -> torch.Tensor | None:
        """(N, T) received attention of the last vision forward; raises if the hook has not fired."""
        latest, self._latest = self._latest, None
        if latest is None and not missing_ok:
            raise RuntimeError("the FAC attention hook did not fire: was the vision tower run after attach()?")
        return latest


class PackedQkvHook:
    """The mean attention each patch receives in one Qwen-style ViT block (the images packed into one sequence,
    ``cu_seqlens`` between them; a fused ``qkv``; 2-D rotary embeddings), per image, from the block's qkv output
    (a forward hook on ``attn.qkv``, LoRA included) and its rotary embeddings (a pre-hook on ``attn``).
    ``apply_rotary`` is the family's own ``apply_rotary_pos_emb_vision``; ``pop()`` → ((images, tokens) in the
    block's token order, float32, differentiable; ``geometry``, what the family needs to put them in raster order)."""

    def __init__(self, attention: nn.Module, apply_rotary: Callable, geometry: Any) -> None:
        self.attention = attention
        self.apply_rotary = apply_rotary
        self.geometry = geometry
        self.num_heads = attention.num_heads
        self.scale = attention.scaling
        self._inputs: dict[str, Any] = {}
        self._latest: torch.Tensor | None = None
        self._handles: list = []

    def attach(self) -> PackedQkvHook:
        if not self._handles:
            self._handles = [
                self.attention.register_forward_pre_hook(self._keep_inputs, with_kwargs=True),
                self.attention.qkv.register_forward_hook(self._hook),
            ]
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _keep_inputs(self, module, args, kwargs) -> None:
        self._inputs = {"cu_seqlens": kwargs["cu_seqlens"], "position_embeddings": kwargs["position_embeddings"]}

    def _hook(self, module, inputs, output: torch.Tensor) -> None:
        tokens = output.shape[0]
        query, key, _ = output.reshape(tokens, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        cos, sin = self._inputs["position_embeddings"]
        with torch.autocast(device_type=output.device.type, enabled=False):
            query, key = self.apply_rotary(query.float(), key.float(), cos, sin)
            bounds = self._inputs["cu_seqlens"].tolist()
            lengths = {end - start for start, end in zip(bounds[:-1], bounds[1:])}
            if len(lengths) == 1:  # one grid per run: every image as one batched matmul
                length = lengths.pop()
                split = lambda states: states.reshape(-1, length, *states.shape[1:]).transpose(1, 2)  # noqa: E731
                self._latest = received_attention(split(query), split(key), self.scale)
            else:
                self._latest = torch.stack(
                    [
                        received_attention(query[start:end].transpose(0, 1), key[start:end].transpose(0, 1), self.scale)
                        for start, end in zip(bounds[:-1], bounds[1:])
                    ]
                )

    def pop(self, *, missing_ok: bool = False) -> tuple[torch.Tensor, Any] | None:
        """(received attention (images, tokens) in the block's token order, the geometry given)."""
        latest, self._latest = self._latest, None
        if latest is None:
            if missing_ok:
                return None
            raise RuntimeError("the FAC attention hook did not fire: was the vision tower run after attach()?")
        return latest, self.geometry
