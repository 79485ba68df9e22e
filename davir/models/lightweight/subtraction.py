"""Direct-subtraction baseline: the "Subtraction" / "direct-sub" rows of the ablation tables.

SCORER Table 6 (119.7 CIDEr Total on CLEVR-Change) and RDD Table 4 (120.4) replace the method's encoder
by a plain difference of the two images. The papers give no further detail, so [D]:
``X_diff = ReLU(Dropout(Linear(X~_aft − X~_bef)))`` on the projected tokens, the standard decoder, and
the caption loss only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from davir.models.lightweight.base import Encoded, LightweightCaptioner
from davir.models.lightweight.config import CLEVR_CHANGE, CLEVR_DC, LightweightConfig
from davir.models.lightweight.paper_values import DECODER_INIT_STD
from davir.models.lightweight.registry import register_method


@dataclass
class SubtractionSettings(LightweightConfig):
    """The baseline has no settings of its own: the common ones only."""


# Per-dataset values (docs/methods/subtraction.md): the benchmark sizes and the trainer's batch and lr.
PAPER_ROWS = {
    "clevr_change": {**CLEVR_CHANGE, "batch_size": 128, "lr": 2e-4},
    "clevr_dc": {**CLEVR_DC, "batch_size": 128, "lr": 2e-4},
    "spot_the_diff": {"batch_size": 32, "lr": 2e-4},
    "ier": {"batch_size": 16, "lr": 1e-4},
    "levir_cc": {"batch_size": 64, "lr": 1e-4},
}
SWITCHES = (DECODER_INIT_STD,)  # the printed values it reads beside paper_values.EVERY_METHOD


def direct_subtraction(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The baseline's difference representation before projection: ``X~_aft − X~_bef`` (B, N, D)."""
    return after - before


@register_method("subtraction", SubtractionSettings, rows=PAPER_ROWS, switches=SWITCHES)
class SubtractionCaptioner(LightweightCaptioner):
    """Projected-token subtraction → Linear → standard decoder; caption cross-entropy only."""

    def __init__(self, config: SubtractionSettings):
        super().__init__(config)
        self.project = nn.Sequential(nn.Linear(config.hidden, config.hidden), nn.Dropout(config.dropout), nn.ReLU())

    def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True) -> Encoded:
        return Encoded(self.project(direct_subtraction(tokens_before, tokens_after)))
