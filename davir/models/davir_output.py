"""What a DAVIR model's forward returns, whichever family is inside."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
