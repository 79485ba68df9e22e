"""Entity retrievers for DAVIR's entity prompt (the DAVIR paper §3.3, Eqs. 8-9; docs/methods/davir.md).

    regions = pair_regions(before, after, masks)          # Eq. 8: masked, cropped change regions
    retriever = build_retriever("clip", ClipSettings(clip_model=…), checkpoint=…)   # or ("fitted", folder=…)
    scores = retriever.score(regions_of_many_pairs)        # (pairs, vocabulary) scores, Eq. 9
    top = top_k(scores[i], vocabulary.phrases, k)

The `clip` and `fitted` retrievers, the entity gate and CHEER's image-level ranking: docs/preprocessing.md,
"Retrievers"; adding one: docs/architecture.md.
"""

from __future__ import annotations

from davir.preprocessing.components import ComponentRegistry, Weights
from davir.preprocessing.retrievers.clip import DEFAULT_PROMPT, ClipRetriever, ClipSettings, square_pad
from davir.preprocessing.retrievers.fitted import (
    FITTED_MODES,
    FittedRetriever,
    FittedSettings,
    fit_soft_logistic,
    phrase_words,
    word_targets,
)
from davir.preprocessing.retrievers.gate import EntityGate, gate_features
from davir.preprocessing.retrievers.regions import (
    DESCRIPTOR_NAMES,
    EMPTY_FLAG,
    MASK_SOURCES,
    MASK_WEIGHTINGS,
    PairRegions,
    Region,
    frame_pair_features,
    masked_region,
    padded_box,
    pair_features,
    pair_regions,
    region_descriptor,
    resize_mask,
    soft_patch_mask,
    whole_frame_region,
)
from davir.preprocessing.retrievers.retrieval import (
    IMAGE_SCORES,
    Retriever,
    cheer_rank_entities,
    retrieve_image_level,
    retrieve_top_k,
    top_k,
)

__all__ = [
    "DEFAULT_PROMPT",
    "DESCRIPTOR_NAMES",
    "EMPTY_FLAG",
    "FITTED_MODES",
    "IMAGE_SCORES",
    "MASK_SOURCES",
    "MASK_WEIGHTINGS",
    "RETRIEVERS",
    "ClipRetriever",
    "ClipSettings",
    "EntityGate",
    "FittedRetriever",
    "FittedSettings",
    "PairRegions",
    "Region",
    "Retriever",
    "build_retriever",
    "cheer_rank_entities",
    "fit_soft_logistic",
    "frame_pair_features",
    "gate_features",
    "masked_region",
    "padded_box",
    "pair_features",
    "pair_regions",
    "phrase_words",
    "region_descriptor",
    "resize_mask",
    "retrieve_image_level",
    "retrieve_top_k",
    "soft_patch_mask",
    "square_pad",
    "top_k",
    "whole_frame_region",
    "word_targets",
]

RETRIEVERS: ComponentRegistry[Retriever] = ComponentRegistry("retriever", "--retriever")
RETRIEVERS.register(
    "fitted", FittedSettings, FittedRetriever.build, fit=FittedRetriever.fit_new, is_fitted=FittedRetriever.exists
)
RETRIEVERS.register(
    "clip",
    ClipSettings,
    ClipRetriever.build,
    weights=Weights("clip_checkpoint", "--clip-checkpoint", "a local open_clip state dict for --clip-model"),
)


def build_retriever(
    name: str, settings=None, *, checkpoint=None, device: str | None = None, **fields_and_folder
) -> Retriever:
    """A retriever by registry name from its typed settings (or their fields as keywords; `folder=` for `fitted`)."""
    return RETRIEVERS.build(name, settings, checkpoint=checkpoint, device=device, **fields_and_folder)
