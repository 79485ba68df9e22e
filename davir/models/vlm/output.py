"""What a DAVIR model's forward returns, whichever family is inside, and the joint loss it carries (Eq. 12)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from davir.models.losses import FacConfig, caption_cross_entropy, davir_total_loss, fac_attention_loss


@dataclass
class DavirOutput:
    """What ``DavirModel.forward`` returns. Losses are None when not computable (no captions / no masks)."""

    loss: torch.Tensor | None
    caption_loss: torch.Tensor | None
    attn_loss: torch.Tensor | None
    logits: torch.Tensor
    attention_before: torch.Tensor
    attention_after: torch.Tensor
    labels: torch.Tensor | None = None
    fac_pairs: int = 0


def davir_output(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    attention_before: torch.Tensor,
    attention_after: torch.Tensor,
    fac: FacConfig,
    masks_before: torch.Tensor | None = None,
    masks_after: torch.Tensor | None = None,
    mask_valid: torch.Tensor | None = None,
) -> DavirOutput:
    """The forward's result: L_caption on the labelled positions (``labels`` None: no captions, no loss), L_attn
    (Eq. 7) when λ > 0 and masks are given, and L_total = L_caption + λ L_attn (Eq. 12)."""
    caption_loss = caption_cross_entropy(logits, labels) if labels is not None else None
    attn_loss, fac_pairs = None, 0
    if fac.lambda_attn > 0 and (masks_before is not None or masks_after is not None):
        result = fac_attention_loss(attention_before, attention_after, masks_before, masks_after, mask_valid, fac)
        attn_loss, fac_pairs = result.loss, result.num_pairs
    if caption_loss is None:
        loss = None
    elif attn_loss is None:
        loss = caption_loss
    else:
        loss = davir_total_loss(caption_loss, attn_loss, fac.lambda_attn)
    return DavirOutput(
        loss=loss,
        caption_loss=caption_loss,
        attn_loss=attn_loss,
        logits=logits,
        attention_before=attention_before,
        attention_after=attention_after,
        labels=labels,
        fac_pairs=fac_pairs,
    )
