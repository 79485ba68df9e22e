"""DIRL + CCR (Tu et al., ECCV 2024) — docs/methods/dirl.md.

DIRL (Eqs. 2-4): a shared 2-layer MLP projector maps the projected tokens of both images; the channel
cross-correlation of same-position tokens over the batch is pushed towards identity
(``Σ(1 − C_ii)² + α Σ_{i≠j} C_ij²``). The projector output is used only by this loss [C].
Difference (Eqs. 5-7): 2 cross-attention layers (one module per layer, both directions updated
simultaneously) give the shared content; ``F^d = F − F^s``; ``F_d = ReLU(Dropout(LN(Linear([F^d_bef;
F^d_aft]))))``. Two parts come from the released code, not the printed equations [C], with no switch: each
cross-attention layer is ``LN(x + MHA)`` (Eq. 5 prints the MHCA alone) and Eq. 7's Linear is followed by LN
and Dropout (Eq. 7 prints ``ReLU(Linear)``). CCR (Eqs. 12-14): in-batch InfoNCE between the mean word feature after self-attention
and the mean attended-visual feature after cross-attention of the last decoder layer (dot product, τ=0.5).
Total: ``L = L_cap + λ_d L_dirl + λ_c L_ccr`` (Eq. 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from davir.models.lightweight.attention import CrossAttentionBlock, tie_query_key
from davir.models.lightweight.base import Encoded, LightweightCaptioner
from davir.models.lightweight.config import CLEVR_CHANGE, CLEVR_DC, LightweightConfig
from davir.models.lightweight.decoder import DecoderOutput, init_weights
from davir.models.lightweight.losses import cross_correlation_loss, info_nce, masked_mean, similarity
from davir.models.lightweight.paper_values import MATCHING_INIT, REFERENCE_QUIRKS, Switch
from davir.models.lightweight.registry import register_method
from davir.text.vocab import PAD_ID


@dataclass
class DirlSettings(LightweightConfig):
    """DIRL+CCR (§2): L = L_cap + λ_d L_dirl + λ_c L_ccr, CLEVR-Change values."""

    dirl_weight: float = 0.5
    ccr_weight: float = 0.3
    dirl_alpha: float = 0.003
    # Eq. 3: "cosine" as printed (no centring); "zscore" [C] the released code's channels standardised over tokens
    dirl_correlation: Literal["zscore", "cosine"] = "cosine"
    ccr_temperature: float = 0.5
    ccr_mode: Literal["paper", "code"] | None = None  # None: "code" with reference_quirks, else "paper"
    # Eq. 6 as printed, F~ − F^s (True: [D] LN(F~) − F^s; measured worse with matching_init, docs/experiments/lightweight_demo.md)
    dirl_normalize_difference: bool = False
    # scene batches: L_dirl on both pairs ("all", the paper and its released code) or "distractor" [D] only
    dirl_pairs: Literal["all", "distractor"] = "all"

    @property
    def resolved_ccr_mode(self) -> str:
        return self.ccr_mode or ("code" if self.reference_quirks else "paper")


# Per-dataset values (docs/methods/dirl.md: the released YAMLs and the paper).
PAPER_ROWS = {
    "clevr_change": {**CLEVR_CHANGE, "dirl_weight": 0.5, "ccr_weight": 0.3, "batch_size": 128, "lr": 2e-4},
    "clevr_dc": {**CLEVR_DC, "dirl_weight": 0.03, "ccr_weight": 0.05, "batch_size": 128, "lr": 2e-4},
    "spot_the_diff": {"dirl_weight": 0.5, "ccr_weight": 0.004, "batch_size": 32, "lr": 2e-4},
    "ier": {"dirl_weight": 0.001, "ccr_weight": 0.05, "batch_size": 16, "lr": 1e-4},
}
# The printed values it reads beside paper_values.EVERY_METHOD (its decoder is Xavier-initialised: no init std).
SWITCHES = (
    MATCHING_INIT,
    REFERENCE_QUIRKS,
    Switch("lightweight.dirl_correlation", "cosine", "[C]"),
    Switch("lightweight.ccr_mode", "paper", "[C]", read=lambda c: c.lightweight.resolved_ccr_mode),
    Switch("lightweight.dirl_normalize_difference", False, "[D]"),
    Switch("lightweight.dirl_pairs", "all", "[D]"),
)


def distractors_immune_loss(
    projected_before: torch.Tensor, projected_after: torch.Tensor, *, alpha: float, mode: str
) -> torch.Tensor:
    """DIRL Eqs. 3-4 on (B, N, D) projector outputs: every token is a sample, paired by grid position [C]."""
    return cross_correlation_loss(projected_before.flatten(0, 1), projected_after.flatten(0, 1), alpha=alpha, mode=mode)


def shared_representation(
    layers: nn.ModuleList, before: torch.Tensor, after: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DIRL Eq. 5: ``F^s_bef = MHCA(F_bef, F_aft)``, ``F^s_aft = MHCA(F_aft, F_bef)``, stacked, simultaneous [C]."""
    for layer in layers:
        before, after = layer(before, after), layer(after, before)
    return before, after


def difference_tokens(tokens: torch.Tensor, shared: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """DIRL Eq. 6: ``F^d_o = F~_o − F^s_o``.

    [D] ``normalize``: F^s_o leaves a residual LayerNorm (unit scale per token) while F~_o is the front-end's
    output at whatever scale; ``F^d_o = LN(F~_o) − F^s_o`` (parameter-free LN) subtracts like from like.
    ``normalize=False`` is Eq. 6 as printed.
    """
    if normalize:
        tokens = F.layer_norm(tokens, tokens.shape[-1:])
    return tokens - shared


def ccr_features(
    self_state: torch.Tensor, cross_state: torch.Tensor, captions_in: torch.Tensor, mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """DIRL Eq. 12: global word feature E~ (mean self-attention output) and attended-difference feature V~.

    The means run over the word positions: ``paper`` mode over the real tokens, ``code`` mode over all
    positions, padding included [C].
    """
    mask = None if mode == "code" else captions_in != PAD_ID
    return masked_mean(self_state, mask), masked_mean(cross_state, mask)


def cross_modal_contrastive_loss(
    text: torch.Tensor, visual: torch.Tensor, *, temperature: float, mode: str
) -> torch.Tensor:
    """DIRL Eqs. 13-14: ``L_ccr = ½ (L_t2v + L_v2t)``, in-batch InfoNCE with dot-product similarity / τ.

    ``code`` mode [C]: logits ``(T·Vᵀ/τ + V·Tᵀ/τ) / 2`` and a row-wise cross-entropy only.
    """
    sim = similarity(text, visual, "dot")
    if mode == "code":
        return info_nce(0.5 * (sim + sim.transpose(0, 1)), temperature=temperature, symmetric=False)
    return info_nce(sim, temperature=temperature, symmetric=True)


@register_method("dirl", DirlSettings, rows=PAPER_ROWS, switches=SWITCHES)
class DirlCaptioner(LightweightCaptioner):
    """DIRL encoder + standard decoder (FFN 2048) + L_dirl + L_ccr; Xavier init everywhere [C]."""

    decoder_init = "xavier"

    def __init__(self, config: DirlSettings):
        super().__init__(config)
        dim = config.hidden
        self.projector = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Dropout(config.dropout), nn.Linear(4 * dim, dim)
        )
        self.cross_layers = nn.ModuleList(
            CrossAttentionBlock(dim, config.heads, config.dropout) for _ in range(config.encoder_layers)
        )
        self.fuse = nn.Sequential(nn.Linear(2 * dim, dim), nn.LayerNorm(dim), nn.Dropout(config.dropout), nn.ReLU())
        init_weights(self, "xavier")
        if config.matching_init:
            for layer in self.cross_layers:
                tie_query_key(layer.attention, identity_value=True)

    def fuse_difference(self, diff_before: torch.Tensor, diff_after: torch.Tensor) -> torch.Tensor:
        """DIRL Eq. 7: ``F_d = ReLU([F^d_bef ; F^d_aft] W_c + b_c)`` (code: Linear → LN → Dropout → ReLU)."""
        return self.fuse(torch.cat([diff_before, diff_after], dim=-1))

    def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True) -> Encoded:
        losses = {}
        if need_losses:
            losses["dirl_loss"] = distractors_immune_loss(
                self.projector(tokens_before),
                self.projector(tokens_after),
                alpha=self.config.dirl_alpha,
                mode=self.config.dirl_correlation,
            )
        shared_before, shared_after = shared_representation(self.cross_layers, tokens_before, tokens_after)
        normalize = self.config.dirl_normalize_difference
        memory = self.fuse_difference(
            difference_tokens(tokens_before, shared_before, normalize),
            difference_tokens(tokens_after, shared_after, normalize),
        )
        return Encoded(memory, losses=losses)

    def decoder_losses(self, encoded: Encoded, decoded: DecoderOutput, captions_in, attributes=None):
        mode = self.config.resolved_ccr_mode
        text, visual = ccr_features(decoded.self_states[-1], decoded.cross_states[-1], captions_in, mode)
        return {
            "ccr_loss": cross_modal_contrastive_loss(text, visual, temperature=self.config.ccr_temperature, mode=mode)
        }

    def loss_weights(self) -> dict[str, float]:
        return {"dirl_loss": self.config.dirl_weight, "ccr_loss": self.config.ccr_weight}

    def distractor_pair_losses(self) -> tuple[str, ...]:
        """[D] With `dirl_pairs="distractor"`, scene batches (`clevr_pair_loss`) apply L_dirl to the
        distractor pair only: on a semantic pair it pulls the changed tokens of both images together through
        the shared front-end, i.e. rewards erasing the very change to be captioned."""
        return ("dirl_loss",) if self.config.dirl_pairs == "distractor" else ()
