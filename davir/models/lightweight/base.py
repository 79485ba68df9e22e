"""What every lightweight method shares: front-end → encoder → decoder → caption XE + weighted aux losses.

A method subclasses `LightweightCaptioner` and provides `encode` (its difference encoder, returning the
decoder memory and any encoder-side auxiliary losses), optionally `decoder_losses` (losses that read the
decoder states: SCORER's CBR, DIRL's CCR, RDD's ACR) and `loss_weights`; a method whose batches carry more
than features and captions names its `inputs` class (inputs.py: what the training task prepares and passes on).
The public API is uniform:

    out = model(feat_before, feat_after, captions_in, captions_target, entities=..., attributes=...)
    out["loss"].backward(); optimizer.step(); model.after_optimizer_step()
    ids = model.generate(feat_before, feat_after, max_len=24, beam_size=1, entities=...)
    losses = clevr_pair_loss(model, batch)       # CLEVR-Change: semantic + distractor pair (§0.6)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from davir.models.lightweight.attention import LogitScale
from davir.models.lightweight.config import LightweightConfig
from davir.models.lightweight.decoder import (
    CaptionDecoder,
    DecoderOutput,
    beam_decode,
    greedy_decode,
    init_weights,
    width_scaled_std,
)
from davir.models.lightweight.frontend import FeatureFrontend
from davir.models.lightweight.inputs import MethodInputs
from davir.models.lightweight.losses import caption_cross_entropy
from davir.text.vocab import START_ID


@dataclass
class Encoded:
    """Encoder output: decoder memory, optional entity memory, encoder-side losses, tensors for later losses."""

    memory: torch.Tensor  # (B, N, D) difference tokens the decoder cross-attends to
    text_memory: torch.Tensor | None = None  # (B, K, D) entity features (CHEER)
    losses: dict[str, torch.Tensor] = field(default_factory=dict)  # unweighted
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. SCORER's pre-layer tokens for CBR


class LightweightCaptioner(nn.Module, ABC):
    """Base class of the five methods (see the module docstring for the API)."""

    decoder_init = (
        "normal"  # "normal" N(0, 0.02) at width 512 as SCORER's decoder [C] (width-scaled [D]); DIRL "xavier"
    )
    inputs: ClassVar[type[MethodInputs]] = MethodInputs  # what its batches carry beyond features and captions

    def __init__(self, config: LightweightConfig):
        super().__init__()
        self.config = config
        self.frontend = FeatureFrontend(
            config.feat_dim,
            config.hidden,
            config.grid_size,
            config.coord_channels,
            pool=config.feature_pool,
            init=config.frontend_init,
        )
        self.decoder = CaptionDecoder(
            config.vocab_size,
            hidden=config.hidden,
            word_dim=config.word_emb,
            heads=config.heads,
            layers=config.layers,
            ffn_dim=config.ffn_dim,
            max_len=config.max_len,
            dropout=config.dropout,
            positions=config.resolved_positions,
            layer_kind=self.decoder_kind(config),
            **self.decoder_options(config),
        )
        std = config.decoder_init_std if config.decoder_init_std is not None else width_scaled_std(config.hidden)
        init_weights(self.decoder, self.decoder_init, std=std)

    # --- what a method provides -------------------------------------------------------------------
    @classmethod
    def decoder_kind(cls, config: LightweightConfig) -> str:
        """Decoder layer kind: "standard", "scorer" (SCORER code quirks) or "gated" (CHEER)."""
        return "standard"

    @classmethod
    def decoder_options(cls, config: LightweightConfig) -> dict:
        """Further keyword arguments of `CaptionDecoder` (CHEER: `sigmoid_gates`)."""
        return {}

    @abstractmethod
    def encode(
        self, tokens_before: torch.Tensor, tokens_after: torch.Tensor, *, entities=None, need_losses: bool = True
    ) -> Encoded:
        """Difference encoder on projected tokens (B, N, D) of both images."""

    def decoder_losses(
        self, encoded: Encoded, decoded: DecoderOutput, captions_in: torch.Tensor, attributes=None
    ) -> dict[str, torch.Tensor]:
        """Auxiliary losses that need the decoder's states (none by default)."""
        return {}

    def loss_weights(self) -> dict[str, float]:
        """Weight of each auxiliary loss in the total (the paper's λ's)."""
        return {}

    def distractor_pair_losses(self) -> tuple[str, ...]:
        """Auxiliary losses that `clevr_pair_loss` takes from the distractor pair alone (none by default)."""
        return ()

    # --- shared API -------------------------------------------------------------------------------
    def forward(
        self,
        feat_before: torch.Tensor,
        feat_after: torch.Tensor,
        captions_in: torch.Tensor,
        captions_target: torch.Tensor,
        *,
        entities=None,
        attributes=None,
        **extra,
    ) -> dict[str, torch.Tensor]:
        """Losses of one batch of pairs: ``{"loss": total, "caption_loss": …, <aux>_loss: … (unweighted)}``.

        feat_* (B, C, H, W) grid features; captions_in (B, T) ``<START> w… <END>`` padded with 0;
        captions_target (B, T) shifted left, padded with −1 (see `Vocabulary.caption_tensors`). `extra`: a
        method's own inputs (its `inputs` class gives them), passed to its `encode`.
        """
        if captions_in.shape != captions_target.shape or captions_in.dim() != 2:
            raise ValueError(
                f"captions_in {tuple(captions_in.shape)} and captions_target {tuple(captions_target.shape)} "
                "must both be (B, T)"
            )
        if captions_in.shape[0] != feat_before.shape[0] or feat_before.shape != feat_after.shape:
            raise ValueError(
                f"feature batches {tuple(feat_before.shape)} / {tuple(feat_after.shape)} do not match "
                f"{captions_in.shape[0]} captions"
            )
        if not bool((captions_in[:, 0] == START_ID).all()):
            raise ValueError(f"every caption input must begin with <START> (id {START_ID})")
        encoded = self.encode(self.frontend(feat_before), self.frontend(feat_after), entities=entities, **extra)
        decoded = self.decoder(captions_in, encoded.memory, encoded.text_memory)
        caption_loss = caption_cross_entropy(
            decoded.logits, captions_target, reduction=self.config.resolved_caption_loss
        )
        aux = {**encoded.losses, **self.decoder_losses(encoded, decoded, captions_in, attributes)}
        weights = self.loss_weights()
        total = caption_loss
        for name, value in aux.items():
            total = total + weights[name] * value
        return {"loss": total, "caption_loss": caption_loss, **aux}

    @torch.no_grad()
    def generate(
        self,
        feat_before: torch.Tensor,
        feat_after: torch.Tensor,
        *,
        max_len: int | None = None,
        beam_size: int = 1,
        entities=None,
        attributes=None,
        **extra,
    ) -> torch.Tensor:
        """Caption word ids (B, W): greedy (beam_size 1 [C]) or beam search; <END> and after are 0.

        Runs in eval mode (dropout off) and restores the previous mode. `max_len` (default: the config's)
        bounds the number of generated tokens including <END>. `entities` are CHEER's retrieved entities;
        `attributes` (RDD's training-only ACR input) is accepted so one call fits every method, and unused.
        """
        max_len = self.config.max_len if max_len is None else max_len
        if not 1 <= max_len <= self.config.max_len:
            raise ValueError(f"max_len must be in 1..{self.config.max_len} (the decoder's positions), got {max_len}")
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        was_training = self.training
        self.eval()
        try:
            encoded = self.encode(
                self.frontend(feat_before), self.frontend(feat_after), entities=entities, need_losses=False, **extra
            )
            memory, text_memory = encoded.memory, encoded.text_memory
            batch = memory.shape[0]
            if beam_size == 1:
                return greedy_decode(
                    lambda tokens: self.decoder.next_token_log_probs(tokens, memory, text_memory),
                    batch,
                    max_len,
                    memory.device,
                )
            memory = memory.repeat_interleave(beam_size, dim=0)
            if text_memory is not None:
                text_memory = text_memory.repeat_interleave(beam_size, dim=0)
            return beam_decode(
                lambda tokens: self.decoder.next_token_log_probs(tokens, memory, text_memory),
                batch,
                beam_size,
                max_len,
                memory.device,
            )
        finally:
            self.train(was_training)

    def after_optimizer_step(self) -> None:
        """Call after every `optimizer.step()`: clamps each learnable logit scale at ln 100 [C]."""
        for module in self.modules():
            if isinstance(module, LogitScale):
                module.clamp_()


def _swap_rows(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exchange rows of two batches where `mask` (B,) is True."""
    view = mask.view(-1, *([1] * (a.dim() - 1)))
    return torch.where(view, b, a), torch.where(view, a, b)


def clevr_pair_loss(
    model: LightweightCaptioner, batch: dict, *, swap_probability: float = 0.5, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """CLEVR-Change training step of SCORER/DIRL (docs/methods/README.md): both pairs of every scene, losses averaged.

    batch keys: ``feat_before`` (default image), ``feat_after`` (semantic change), ``feat_distractor``
    (non-semantic image), ``captions_in``/``captions_target`` (a change caption), ``no_change_in``/
    ``no_change_target`` (a no-change caption); optional per-pair model inputs ``KEY``/``KEY_distractor``
    (``entities`` for CHEER, ``attributes`` for RDD, a method's own), each passed to the model as ``KEY``.

    In training mode, each scene's default and distractor images swap roles with probability 0.5 (the
    reference loader's augmentation); then (before, semantic) and (before, distractor) are both forwarded
    and every returned loss is ``0.5 · semantic + 0.5 · distractor``, except the model's
    `distractor_pair_losses()`, taken from the distractor pair alone (DIRL's L_dirl with `dirl_pairs=distractor`
    [D]).
    """
    required = (
        "feat_before",
        "feat_after",
        "feat_distractor",
        "captions_in",
        "captions_target",
        "no_change_in",
        "no_change_target",
    )
    missing = [key for key in required if key not in batch]
    if missing:
        raise KeyError(f"clevr_pair_loss batch is missing {', '.join(missing)}")
    before, distractor = batch["feat_before"], batch["feat_distractor"]
    if model.training and swap_probability > 0:
        swap = torch.rand(before.shape[0], generator=generator, device="cpu") < swap_probability
        before, distractor = _swap_rows(swap.to(before.device), before, distractor)
    inputs = [key for key in batch if key not in required and not key.endswith("_distractor")]
    semantic = model(
        before,
        batch["feat_after"],
        batch["captions_in"],
        batch["captions_target"],
        **{key: batch[key] for key in inputs},
    )
    nonsemantic = model(
        before,
        distractor,
        batch["no_change_in"],
        batch["no_change_target"],
        **{key: batch.get(f"{key}_distractor") for key in inputs},
    )
    losses = {key: 0.5 * semantic[key] + 0.5 * nonsemantic[key] for key in semantic}
    weights = model.loss_weights()
    for name in model.distractor_pair_losses():
        if name in semantic:  # replace the semantic pair's half by the distractor pair's
            losses["loss"] = losses["loss"] + 0.5 * weights[name] * (nonsemantic[name] - semantic[name])
            losses[name] = nonsemantic[name]
    return losses
