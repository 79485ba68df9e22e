"""A toy lightweight method that needs a batch input no built-in method reads, all of it in this one file.

Its input is each pair's slot in a table of the run's pairs (train + val, read per dataset in `prepare`, which also
sizes the model's table): the captioner adds a learned vector per slot to the difference tokens. Registering it
(`register_toy`) is the one step besides this file; LightweightTask then trains it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from davir.models.lightweight.base import Encoded, LightweightCaptioner
from davir.models.lightweight.config import LightweightConfig
from davir.models.lightweight.inputs import MethodInputs
from davir.models.lightweight.registry import METHODS, register_method

NAME = "toy_slot"


@dataclass
class SlotSettings(LightweightConfig):
    slot_count: int = 1  # the number of slots: set by SlotInputs.prepare from the run's pairs


@dataclass
class SlotField:
    """`slot` (and, in scene batches, `slot_distractor`): the pair's row in the slot table."""

    table: dict[str, int]
    distractor_ids: dict[str, str] | None = None
    keys: tuple[str, ...] = ("slot", "slot_distractor")

    def __call__(self, pair) -> dict[str, Any]:
        row = {"slot": self.table[pair.pair_id]}
        if self.distractor_ids is not None:
            row["slot_distractor"] = self.table[self.distractor_ids[pair.scene_id]]
        return row


class SlotInputs(MethodInputs):
    def prepare(self, settings: SlotSettings) -> SlotSettings:
        pairs = [*self.context.train_pairs, *self.context.val_pairs]
        self.table = {pair.pair_id: index for index, pair in enumerate(pairs)}
        self.context.note(f"toy slot table: {len(self.table)} pairs")
        return replace(settings, slot_count=len(self.table))

    def fields(self, *, distractor_ids=None) -> list:
        return [SlotField(self.table, distractor_ids)]

    def model_inputs(self, batch, device, *, pair="semantic") -> dict[str, Any]:
        slots = batch["slot_distractor" if pair == "distractor" else "slot"]
        return {"slot": torch.as_tensor(slots, dtype=torch.long, device=device)}


class SlotCaptioner(LightweightCaptioner):
    """(after − before) + the pair's slot vector → Linear → the standard decoder."""

    inputs = SlotInputs

    def __init__(self, config: SlotSettings):
        super().__init__(config)
        self.slots = nn.Embedding(config.slot_count, config.hidden)
        self.mix = nn.Linear(config.hidden, config.hidden)

    def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True, slot=None) -> Encoded:
        if slot is None:
            raise ValueError("the toy needs each pair's `slot`")
        self.seen_slots = slot.detach().cpu()
        return Encoded(torch.relu(self.mix(tokens_after - tokens_before + self.slots(slot)[:, None, :])))


def register_toy() -> None:
    """The one registration."""
    register_method(NAME, SlotSettings)(SlotCaptioner)


def unregister_toy() -> None:
    METHODS.unregister(NAME)
