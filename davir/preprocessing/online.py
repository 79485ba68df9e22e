"""The offline preprocessing, pair by pair, for pairs that have no cache (`caption.py` on a user's folder).

Settings come from the manifests of the caches a model was trained with, so a user's pairs get exactly
the masks (Eqs. 2-3) and entities (Eqs. 8-9) the model saw in training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from davir.data.caches import PairMasks
from davir.data.records import ChangePair, DataError
from davir.io import read_json
from davir.preprocessing.change_regions import RegionSettings
from davir.preprocessing.mask_pipeline import compute_pair, read_manifest
from davir.preprocessing.segmenters import build_segmenter


class OnlineMasks:
    """Change masks of one pair with the settings of a mask cache's manifest (defaults without one)."""

    def __init__(self, regions: RegionSettings, segmenter_options: dict, segment_both: bool = True):
        options = dict(segmenter_options)
        self.settings = regions
        self.segment_both = segment_both
        self.segmenter = build_segmenter(options.pop("segmenter", "classical"), **options)

    @classmethod
    def from_cache(cls, cache_dir: str | Path | None) -> "OnlineMasks":
        if cache_dir is None or not Path(cache_dir).is_dir():
            return cls(RegionSettings(), {"segmenter": "classical"})
        settings = read_manifest(cache_dir).get("settings", {})
        return cls(RegionSettings(**settings.get("regions", {})), settings.get("segmenter", {"segmenter": "classical"}),
                   settings.get("segment_both", True))

    def __call__(self, pair: ChangePair) -> PairMasks:
        _, result = compute_pair(pair, self.settings, self.segmenter, self.segment_both)
        return PairMasks(before=result.before, after=result.after, info=result.info)


class OnlineEntities:
    """Top-k entities of one pair with the vocabulary and retriever stored in an entity cache."""

    def __init__(self, cache_dir: str | Path):
        from davir.text.phrases import EntityVocabulary
        from davir.preprocessing.retrievers import ClipRetriever, EntityGate, FittedRetriever

        cache_dir = Path(cache_dir)
        manifest_path = cache_dir / "entities" / "manifest.json"
        if not manifest_path.is_file() or not (cache_dir / "vocab.json").is_file():
            raise DataError(f"{cache_dir} holds no entity vocabulary/retriever (entities/manifest.json, vocab.json); "
                            "it must be the folder `python -m preprocess entities --out …` wrote for training")
        settings = read_json(manifest_path)["settings"]
        self.vocabulary = EntityVocabulary.load(cache_dir / "vocab.json")
        if settings["retriever"] == "fitted":
            self.retriever = FittedRetriever.load(cache_dir / "retriever")
        else:
            self.retriever = ClipRetriever(settings["clip_model"], settings["clip_checkpoint"],
                                           prompt=settings.get("clip_prompt", "a photo of {}"))
        self.retriever.prepare(self.vocabulary.phrases)
        self.gate = EntityGate.load(cache_dir / "gate") if settings.get("entity_gate") == "fitted" else None
        # CHEER's caches rank whole frames (§4.8) and need no masks; DAVIR's rank masked regions (Eq. 9).
        self.image_score = settings["image_score"] if settings.get("retrieval") == "image" else None
        self.region_options = None if self.image_score else {
            "mask_source": settings["mask_source"], "pad": settings["pad"], "weighting": settings["mask_weighting"]}

    @property
    def needs_masks(self) -> bool:
        return self.image_score is None

    def __call__(self, pair_id: str, before: np.ndarray, after: np.ndarray, masks: PairMasks | None, k: int
                 ) -> list[tuple[str, float]]:
        from davir.preprocessing.retrievers import pair_regions, retrieve_image_level, retrieve_top_k

        if self.image_score is not None:
            return retrieve_image_level(self.retriever, [(before, after)], self.vocabulary.phrases, k,
                                        self.image_score)[0]
        if masks is None:
            raise DataError(f"{pair_id}: region-level entity retrieval needs the pair's change masks")
        regions = pair_regions(pair_id, before, after, masks, **self.region_options)
        return retrieve_top_k(self.retriever, [regions], self.vocabulary.phrases, k, gate=self.gate)[0]
