"""SCORER + CBR (Tu et al., ICCV 2023) — docs/methods/scorer.md.

Encoder: L cross-view reconstruction layers, each one SCORER-code attention module shared by both
directions and updated simultaneously (the after-side call reads the previous layer's before tokens):
``X^_q = LN(X_q + A·(X_k W_V))`` (Eqs. 5-6); the last layer's projected Q/K also give the B×B
multi-head token-wise matching matrices of the cross-view contrastive loss (Eqs. 2-4). Then
``X_diff = ReLU(Dropout(Linear([X^_bef; X^_aft])))`` (Eq. 7). The contrast's scale is a learnable exp(s)
(s from 1, clamped at ln 100) [C], where the paper names a temperature hyper-parameter τ without its value.
CBR (Eqs. 9-11, training only): the caption's mean decoder state is broadcast over the grid, fused with
the projected "before" tokens into a hallucinated "after", refined by MHSA, and contrasted with the real
"after" by MTM. Total: ``L = L_cap + λ_v L_cv + λ_r L_cbr`` (Eq. 13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from davir.models.lightweight.attention import (
    LogitScale,
    MultiHeadTokenMatching,
    ScorerAttention,
    batch_token_matching,
    init_as_difference,
    tie_query_key,
)
from davir.models.lightweight.base import Encoded, LightweightCaptioner
from davir.models.lightweight.config import CLEVR_CHANGE, CLEVR_DC, LightweightConfig
from davir.models.lightweight.decoder import DecoderOutput
from davir.models.lightweight.losses import info_nce, masked_mean
from davir.models.lightweight.paper_values import (
    DECODER_INIT_STD,
    DIFFERENCE_INIT,
    MATCHING_INIT,
    REFERENCE_QUIRKS,
    Switch,
)
from davir.models.lightweight.registry import register_method
from davir.text.vocab import PAD_ID


@dataclass
class ScorerSettings(LightweightConfig):
    """SCORER+CBR (§1): L = L_cap + λ_v L_cv + λ_r L_cbr, CLEVR-Change values."""

    cv_weight: float = 0.1
    cbr_weight: float = 0.001
    # MTM: "summed_heads" [C], the released code's (heads summed before the max). Our copy of the paper lost
    # Eqs. 2-3; its prose matches each head subspace, read as "per_head_mean": a gap the code fills
    mtm_mode: Literal["summed_heads", "per_head_mean"] = "summed_heads"
    freeze_cbr_params: bool | None = None  # None: follow reference_quirks (the released code never updates CBR)

    @property
    def resolved_freeze_cbr(self) -> bool:
        return self.reference_quirks if self.freeze_cbr_params is None else self.freeze_cbr_params


# Per-dataset values (docs/methods/scorer.md: supplement Tables 8-9, the released YAMLs).
PAPER_ROWS = {
    "clevr_change": {
        **CLEVR_CHANGE,
        "cv_weight": 0.1,
        "cbr_weight": 0.001,
        "encoder_layers": 2,
        "batch_size": 128,
        "lr": 2e-4,
    },
    "clevr_dc": {
        **CLEVR_DC,
        "cv_weight": 0.01,
        "cbr_weight": 0.004,
        "encoder_layers": 1,
        "batch_size": 128,
        "lr": 2e-4,
    },
    "spot_the_diff": {"cv_weight": 0.3, "cbr_weight": 0.5, "encoder_layers": 3, "batch_size": 32, "lr": 2e-4},
    "ier": {"cv_weight": 0.003, "cbr_weight": 0.06, "encoder_layers": 2, "batch_size": 16, "lr": 1e-4},
}
# The printed values it reads beside paper_values.EVERY_METHOD.
SWITCHES = (
    MATCHING_INIT,
    DIFFERENCE_INIT,
    DECODER_INIT_STD,
    REFERENCE_QUIRKS,
    Switch("lightweight.freeze_cbr_params", False, "[C]", read=lambda c: c.lightweight.resolved_freeze_cbr),
)


def cross_view_reconstruction(
    query_tokens: torch.Tensor, reconstructed: torch.Tensor, norm: nn.LayerNorm
) -> torch.Tensor:
    """SCORER Eq. 6: ``X^_q = LN(X_q + U)`` — integrate the reconstructed unchanged representation U (Eq. 5)."""
    return norm(query_tokens + reconstructed)


def cross_view_contrastive_loss(sim_before_to_after: torch.Tensor, sim_after_to_before: torch.Tensor) -> torch.Tensor:
    """SCORER Eq. 4: ``L_cv = ½ [CE_row(S^{b→a}) + CE_row(S^{a→b})]`` over the two MTM matrices."""
    return 0.5 * (info_nce(sim_before_to_after, symmetric=False) + info_nce(sim_after_to_before, symmetric=False))


def difference_representation(before: torch.Tensor, after: torch.Tensor, fuse: nn.Module) -> torch.Tensor:
    """SCORER Eq. 7: ``X_diff = ReLU(Dropout(Linear_{2D→D}([X^_bef ; X^_aft])))`` (channel concatenation)."""
    return fuse(torch.cat([before, after], dim=-1))


class ReconstructionLayer(nn.Module):
    """One SCORER layer [C]: attention without output projection + residual LN, plus MTM on its own Q/K."""

    def __init__(self, dim: int, heads: int, dropout: float, mtm_mode: str):
        super().__init__()
        self.attention = ScorerAttention(dim, heads, dropout)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.logit_scale = LogitScale()
        self.mtm_mode = mtm_mode

    def forward(
        self, query_tokens: torch.Tensor, key_tokens: torch.Tensor, need_similarity: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, Nq, D), (B, Nk, D) → reconstructed query tokens, and exp(s)·MTM (B, B) if asked (Eqs. 2-3, 5-6)."""
        reconstructed, query, key = self.attention(query_tokens, key_tokens)
        similarity = None
        if need_similarity:
            similarity = self.logit_scale() * batch_token_matching(query, key, self.mtm_mode)
        return cross_view_reconstruction(query_tokens, reconstructed, self.norm), similarity


def reconstruct_both_views(
    layers: nn.ModuleList, before: torch.Tensor, after: torch.Tensor, need_similarity: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Stack of reconstruction layers, both directions updated simultaneously [C].

    ``X_bef ← Layer(X_bef, X_aft)``, ``X_aft ← Layer(X_aft, X_bef_previous)``; the similarity matrices
    S^{b→a}, S^{a→b} come from the last layer.
    """
    sim_ba = sim_ab = None
    for index, layer in enumerate(layers):
        last = need_similarity and index == len(layers) - 1
        new_before, sim_ba = layer(before, after, last)
        after, sim_ab = layer(after, before, last)
        before = new_before
    return before, after, sim_ba, sim_ab


def sentence_feature(hidden: torch.Tensor, captions_in: torch.Tensor, padded_mean: bool) -> torch.Tensor:
    """CBR's sentence feature (Eq. 9 input): mean of the decoder's final states over the caption tokens.

    The code [C] zeroes padding and divides by the padded length (`padded_mean=True`); the clean
    version divides by the number of real tokens (<START> … <END>).
    """
    mask = captions_in != PAD_ID
    if padded_mean:
        return (hidden * mask.unsqueeze(-1).to(hidden.dtype)).mean(dim=1)
    return masked_mean(hidden, mask)


class CrossModalBackwardReasoning(nn.Module):
    """CBR (SCORER Eqs. 9-11): hallucinate the "after" from "before" + sentence, contrast with the real one."""

    def __init__(self, dim: int, heads: int, mtm_mode: str):
        super().__init__()
        self.fuse = nn.Linear(2 * dim, dim)  # the code's Conv1x1(1024→512) on the grid
        self.self_attention = nn.MultiheadAttention(dim, heads, bias=False, batch_first=True)
        self.refine = nn.Linear(dim, dim)  # Conv1x1(512→512)
        self.matching = MultiHeadTokenMatching(dim, heads, mtm_mode)

    def hallucinate(self, before_tokens: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
        """Eq. 9: ``h = Conv1×1([X~_bef ; broadcast(s)])`` — the sentence vector tiled over all grid positions."""
        tiled = sentence.unsqueeze(1).expand(-1, before_tokens.shape[1], -1)
        return self.fuse(torch.cat([before_tokens, tiled], dim=-1))

    def refine_hallucination(self, hallucination: torch.Tensor) -> torch.Tensor:
        """Eq. 10: ``h' = Conv1×1(MHSA(h))`` — no residual and no LN in the code [C]."""
        attended, _ = self.self_attention(hallucination, hallucination, hallucination, need_weights=False)
        return self.refine(attended)

    def forward(self, before_tokens: torch.Tensor, sentence: torch.Tensor, after_tokens: torch.Tensor) -> torch.Tensor:
        """Eq. 11: ``L_cbr = ½ [CE_row(S^hal) + CE_row(S^halᵀ)]`` with S^hal = exp(s')·MTM(h', X~_aft)."""
        refined = self.refine_hallucination(self.hallucinate(before_tokens, sentence))
        return info_nce(self.matching(refined, after_tokens), symmetric=True)


@register_method("scorer", ScorerSettings, rows=PAPER_ROWS, switches=SWITCHES)
class ScorerCaptioner(LightweightCaptioner):
    """SCORER encoder + standard decoder (SCORER-code decoder with `reference_quirks`) + L_cv + L_cbr."""

    def __init__(self, config: ScorerSettings):
        super().__init__(config)
        dim = config.hidden
        self.layers = nn.ModuleList(
            ReconstructionLayer(dim, config.heads, config.dropout, config.mtm_mode)
            for _ in range(config.encoder_layers)
        )
        if config.matching_init:
            for layer in self.layers:
                tie_query_key(layer.attention, identity_value=True)
        self.fuse = nn.Sequential(nn.Linear(2 * dim, dim), nn.Dropout(config.dropout), nn.ReLU())
        if config.difference_init:
            init_as_difference(self.fuse[0])
        self.cbr = CrossModalBackwardReasoning(dim, config.heads, config.mtm_mode)
        if config.resolved_freeze_cbr:
            # The released train.py never gives CBR's parameters to the optimiser [C]: they stay at init.
            self.cbr.requires_grad_(False)

    @classmethod
    def decoder_kind(cls, config: LightweightConfig) -> str:
        return "scorer" if config.reference_quirks else "standard"

    def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True) -> Encoded:
        before, after, sim_ba, sim_ab = reconstruct_both_views(self.layers, tokens_before, tokens_after, need_losses)
        memory = difference_representation(before, after, self.fuse)
        losses = {"cv_loss": cross_view_contrastive_loss(sim_ba, sim_ab)} if need_losses else {}
        return Encoded(memory, losses=losses, saved={"before": tokens_before, "after": tokens_after})

    def decoder_losses(self, encoded: Encoded, decoded: DecoderOutput, captions_in, attributes=None):
        sentence = sentence_feature(decoded.hidden, captions_in, padded_mean=self.config.reference_quirks)
        return {"cbr_loss": self.cbr(encoded.saved["before"], sentence, encoded.saved["after"])}

    def loss_weights(self) -> dict[str, float]:
        return {"cv_loss": self.config.cv_weight, "cbr_loss": self.config.cbr_weight}
