"""The offline preprocessing, pair by pair, for pairs that have no cache (`caption.py` on a user's folder).

Settings come from the manifests of the caches a model was trained with, so a user's pairs get exactly
the masks (Eqs. 2-3) and entities (Eqs. 8-9) the model saw in training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from davir.data.caches import PairMasks
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.io import read_json
from davir.preprocessing.change_regions import RegionSettings, find_change_regions
from davir.preprocessing.mask_pipeline import Prepared, compute_pair, finish_pair, read_manifest, segment_requests
from davir.preprocessing.object_localisation import OnlineObjectMasks
from davir.preprocessing.segmenters import SEGMENTERS, build_segmenter


def segmenter_from_settings(
    recorded: dict | None, *, cache: Path, sam_checkpoint: str | Path | None = None, device: str | None = None
):
    """The segmenter a mask cache's manifest recorded (`Segmenter.settings()`), rebuilt through SEGMENTERS.

    A segmenter with weights finds them where the manifest says, unless `sam_checkpoint` (caption.py's
    --sam-checkpoint: the weights of the cache's segmenter) replaces them (a run moved to another machine);
    a missing file is a DataError naming the cache, the path and the flag. The device is the captioning one.
    """
    recorded = dict(recorded or {"segmenter": "classical"})
    return SEGMENTERS.rebuild(
        recorded.get("segmenter", "classical"),
        recorded,
        where=f"mask cache {cache}",
        checkpoint=sam_checkpoint,
        override_flag="--sam-checkpoint",
        device=device,
    )


class OnlineMasks:
    """Change masks of one pair with the settings of a mask cache's manifest."""

    def __init__(self, regions: RegionSettings, segmenter, segment_both: bool = True):
        self.settings = regions
        self.segment_both = segment_both
        self.segmenter = segmenter

    @classmethod
    def from_cache(
        cls, cache_dir: str | Path | None, *, sam_checkpoint: str | Path | None = None, device: str | None = None
    ) -> OnlineMasks | OnlineObjectMasks:
        """The masks of the cache at `cache_dir`; None → the default settings (a model trained without a cache).

        A cache folder that does not exist, or has no manifest, is a DataError naming it — never a silent
        fallback to other settings than the model was trained with.
        """
        if cache_dir is None:
            return cls(RegionSettings(), build_segmenter("classical"))
        cache_dir = Path(cache_dir)
        if not cache_dir.is_dir():
            raise DataError(
                f"mask cache not found: {cache_dir} (the model's masks settings are read from it): "
                "pass --masks-from CACHE, the folder `python -m preprocess masks --out CACHE` wrote"
            )
        try:
            settings = read_manifest(cache_dir).get("settings", {})
        except (OSError, ValueError, KeyError) as error:
            raise DataError(f"{cache_dir} is not a mask cache (no readable manifest.json): {error}") from error
        if settings.get("localisation", "pixel") == "object":  # `preprocess masks --localisation object` [D]
            return OnlineObjectMasks.from_recorded(settings)
        segmenter = segmenter_from_settings(
            settings.get("segmenter"), cache=cache_dir, sam_checkpoint=sam_checkpoint, device=device
        )
        return cls(RegionSettings(**settings.get("regions", {})), segmenter, settings.get("segment_both", True))

    def settings_dict(self) -> dict:
        return {
            "regions": self.settings.to_dict(),
            "segmenter": self.segmenter.settings(),
            "segment_both": self.segment_both,
        }

    def __call__(self, pair: ChangePair) -> PairMasks:
        _, result = compute_pair(pair, self.settings, self.segmenter, self.segment_both)
        return PairMasks(before=result.before, after=result.after, info=result.info)

    def from_arrays(self, pair_id: str, before: np.ndarray, after: np.ndarray) -> PairMasks:
        """The masks of an already loaded pair (same size, RGB uint8)."""
        prepared = Prepared(pair_id, before, after, find_change_regions(before, after, self.settings))
        candidates = self.segmenter.segment(segment_requests(prepared, self.segment_both))
        result = finish_pair(prepared, candidates, self.settings.tau, self.segment_both)
        return PairMasks(before=result.before, after=result.after, info=result.info)


class OnlineEntities:
    """Top-k entities of one pair with the vocabulary and retriever stored in an entity cache."""

    def __init__(self, cache_dir: str | Path, *, clip_checkpoint: str | Path | None = None):
        from davir.preprocessing.retrievers import RETRIEVERS, EntityGate
        from davir.text.entity_vocabulary import EntityVocabulary

        cache_dir = Path(cache_dir)
        self.cache_dir = cache_dir
        manifest_path = cache_dir / "entities" / "manifest.json"
        if not manifest_path.is_file() or not (cache_dir / "vocab.json").is_file():
            raise DataError(
                f"{cache_dir} holds no entity vocabulary/retriever (entities/manifest.json, vocab.json); "
                "it must be the folder `python -m preprocess entities --out …` wrote for training"
            )
        settings = read_json(manifest_path)["settings"]
        self.vocabulary = EntityVocabulary.load(cache_dir / "vocab.json")
        # Any registered retriever, with its recorded settings; its weights file unless caption.py's
        # --clip-checkpoint (the weights of the cache's retriever) replaces it.
        self.retriever = RETRIEVERS.rebuild(
            settings["retriever"],
            settings,
            where=f"entity cache {cache_dir}",
            checkpoint=clip_checkpoint,
            override_flag="--clip-checkpoint",
            folder=cache_dir / "retriever",
        )
        self.retriever.prepare(self.vocabulary.phrases)
        self.gate = EntityGate.load(cache_dir / "gate") if settings.get("entity_gate") == "fitted" else None
        # CHEER's caches rank whole frames (§4.8) and need no masks; DAVIR's rank masked regions (Eq. 9).
        self.image_score = settings["image_score"] if settings.get("retrieval") == "image" else None
        self.region_options = (
            None
            if self.image_score
            else {
                "mask_source": settings["mask_source"],
                "pad": settings["pad"],
                "weighting": settings["mask_weighting"],
            }
        )

    @property
    def needs_masks(self) -> bool:
        return self.image_score is None

    def __call__(
        self, pair_id: str, before: np.ndarray, after: np.ndarray, masks: PairMasks | None, k: int
    ) -> list[tuple[str, float]]:
        from davir.preprocessing.retrievers import pair_regions, retrieve_image_level, retrieve_top_k

        if self.image_score is not None:
            return retrieve_image_level(
                self.retriever, [(before, after)], self.vocabulary.phrases, k, self.image_score
            )[0]
        if masks is None:
            raise DataError(f"{pair_id}: region-level entity retrieval needs the pair's change masks")
        regions = pair_regions(pair_id, before, after, masks, **self.region_options)
        return retrieve_top_k(self.retriever, [regions], self.vocabulary.phrases, k, gate=self.gate)[0]
