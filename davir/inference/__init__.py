"""Captions from a trained model: one captioning stack for `caption.py`, `evaluate.py --checkpoint` and Python.

    from davir.inference import ChangeCaptioner, caption_folder
    captioner = ChangeCaptioner.from_pretrained("runs/demo", device="cpu")   # CaptionerOptions fields
    caption_folder(captioner, "my_pairs/", "captions.jsonl").status          # the JSONL + HTML report

Modules: captioner, engines, sources, lightweight, folder, caption_store (docs/recipes.md, "One captioning stack").
"""

from davir.inference.captioner import CaptionerOptions, CaptionResult, ChangeCaptioner, PreparedPair
from davir.inference.engines import DavirEngine, LightweightEngine, load_engine
from davir.inference.folder import CaptionSummary, caption_folder
from davir.inference.sources import CachedEntities, CachedFeatures, OnlineFeatures

__all__ = [
    "CachedEntities",
    "CachedFeatures",
    "CaptionResult",
    "CaptionSummary",
    "CaptionerOptions",
    "ChangeCaptioner",
    "DavirEngine",
    "LightweightEngine",
    "OnlineFeatures",
    "PreparedPair",
    "caption_folder",
    "load_engine",
]
