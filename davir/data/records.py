"""The one record type every reader produces and every pipeline consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from davir.errors import DataError

__all__ = ["CHANGE_TYPES", "DISTRACTOR", "ChangePair", "DataError", "DatasetIndex", "SkippedRecord"]


# Change types the CLEVR-style readers and the synthetic set use; other datasets leave it None.
CHANGE_TYPES = ("color", "material", "add", "drop", "move")
DISTRACTOR = "distractor"


@dataclass(frozen=True, slots=True)  # slots: a user's 1,000,000 pairs are a million of these in memory
class ChangePair:
    """One before/after pair and what is known about it.

    Images are paths, loaded lazily (`davir.data.images.load_pair`). `captions` holds every
    reference sentence (possibly none, e.g. a user's folder of pairs). `distractor` is CLEVR-Change's
    non-semantic image of the same scene; `gt_mask_before`/`gt_mask_after` are ground-truth change
    masks in each image's own frame (the synthetic set has them; an all-zero mask means "no change").

    `captions` are cleaned for training (empty sentences skipped and counted, blanks stripped);
    `source_captions` are the sentences exactly as the annotation file has them, empty ones included,
    for readers whose benchmark is scored against its raw sentences (`davir.metrics.protocols`);
    None where the reader does not keep them.
    """

    pair_id: str
    before: Path
    after: Path
    captions: tuple[str, ...] = ()
    split: str = "test"
    change_type: str | None = None
    distractor: Path | None = None
    gt_mask_before: Path | None = None
    gt_mask_after: Path | None = None
    scene_id: str | None = None
    source_captions: tuple[str, ...] | None = field(default=None, compare=False)
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def has_gt_mask(self) -> bool:
        return self.gt_mask_before is not None and self.gt_mask_after is not None

    def to_dict(self) -> dict:
        """Plain-Python view (paths as strings) for JSON and `datasets.Dataset`."""
        return {
            "pair_id": self.pair_id,
            "before": str(self.before),
            "after": str(self.after),
            "captions": list(self.captions),
            "split": self.split,
            "change_type": self.change_type,
            "distractor": None if self.distractor is None else str(self.distractor),
            "gt_mask_before": None if self.gt_mask_before is None else str(self.gt_mask_before),
            "gt_mask_after": None if self.gt_mask_after is None else str(self.gt_mask_after),
            "scene_id": self.scene_id,
        }


@dataclass(frozen=True)
class SkippedRecord:
    """A documented, counted skip: which record (or sentence) was left out and why."""

    source: str
    record: str
    reason: str
    # The record's pair is in none of the split's pairs (a file without its partner, a train pair without a
    # caption), not a sentence or a caption file left out of a pair that is kept. `verify` counts these as missing.
    drops_pair: bool = False


@dataclass
class DatasetIndex:
    """What a reader returns for one split: the pairs and everything it skipped."""

    format: str
    root: Path
    split: str
    pairs: list[ChangePair]
    skipped: list[SkippedRecord] = field(default_factory=list)
    # What the user should know that is no skipped record (e.g. manifest columns davir does not read).
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.pairs)

    def __iter__(self):
        return iter(self.pairs)

    def by_id(self) -> dict[str, ChangePair]:
        return {p.pair_id: p for p in self.pairs}
