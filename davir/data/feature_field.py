"""Cached ResNet-101 grid features as a pluggable dataset field (the lightweight methods' image input).

    field = FeatureField(FeatureCache("cache/features", dataset_root="data/clevr_change"))
    dataset = ChangeCaptionDataset(pairs, [field])     # examples gain feat_before, feat_after (1024, 14, 14)

The features come from `python -m preprocess features`; a pair whose image is not in the cache is a
DataError naming the pair and the command to run (raised by `FeatureCache.get`, wrapped here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from davir.data.feature_cache import FeatureCache
from davir.data.records import ChangePair
from davir.errors import DataError


@dataclass
class FeatureField:
    """`feat_before`, `feat_after` and, when the record has one and `distractor` is on, `feat_distractor`.

    `distractor=True` is for CLEVR-Change scene batches (§0.6: the non-semantic image is the second
    "after" of the scene); then every pair must carry a distractor so the batch stacks.
    """

    cache: FeatureCache
    distractor: bool = False
    keys: tuple[str, ...] = ("feat_before", "feat_after", "feat_distractor")

    def __call__(self, pair: ChangePair) -> dict[str, Any]:
        try:
            example = {"feat_before": self.cache.get(pair.before), "feat_after": self.cache.get(pair.after)}
            if self.distractor:
                if pair.distractor is None:
                    raise DataError("the record has no distractor image, but scene batches need one")
                example["feat_distractor"] = self.cache.get(pair.distractor)
        except DataError as error:
            raise DataError(f"pair {pair.pair_id!r}: {error}") from error
        return example
