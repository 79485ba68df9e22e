"""Entity retrievers for DAVIR's entity prompt (the DAVIR paper §3.3, Eqs. 8-9; docs/methods/davir.md).

    regions = pair_regions(before, after, masks)          # Eq. 8: masked, cropped change regions
    retriever = build_retriever("clip", ClipSettings(clip_model=…), checkpoint=…)   # or ("fitted", folder=…)
    scores = retriever.score(regions_of_many_pairs)        # (pairs, vocabulary) scores, Eq. 9
    top = top_k(scores[i], vocabulary.phrases, k)

Two retrievers share one interface (`prepare(phrases)`, `score(pairs)`, `save/load`):

* ``clip``   — open_clip with a local checkpoint file (never a hub tag): score(e) = max over the before
  and after region of cos(CLIP_img(region), CLIP_text("a photo of {e}")), the paper's Eq. 9.
* ``fitted`` — no weights at all: hand-made region descriptors (colour, shape, size, highlights)
  and logistic regressions fitted on the training split, each training pair labelled with the
  vocabulary phrases its reference captions name (one regression per vocabulary word, composed into
  phrase scores). By default (`mode="mixture"`) the two regions are weighted by a learned
  probability that the caption describes the before image, instead of Eq. 9's max: the max cannot
  tell which image the caption names for an attribute change ("the red sphere changed to blue" names
  the before object; "someone added a cube" the after one). See FittedRetriever. The fitted model is
  stored as JSON + npz (plain arrays, loaded with allow_pickle=False) and rebuilt, never unpickled.

The retrievers sit in the `RETRIEVERS` registry (davir.preprocessing.components), which `preprocess entities`
and the online path (davir.preprocessing.online) build through: a new one is a class with the interface above
and one line, `RETRIEVERS.register(name, ItsSettings, ItsClass.build, weights=…)`. `ItsSettings` is a dataclass;
its fields are recorded beside the job's own settings in the entity cache (so prefix their names with the
retriever's), and those made with `option("--flag")` are
`preprocess entities` options of this retriever only. The builder is called as
`build(settings, checkpoint=…, device=…, folder=CACHE/retriever)`. A retriever fitted on the fit split (the
`fitted` one) declares `fit=(settings, features, labels, phrases) → retriever` (features: each fit pair's
(2, F) `pair_features`, of whole frames with --image-level; labels: the phrase shares its references name;
the result has `training: dict` and `save(folder)`) and `is_fitted=(folder) → bool`; the job fits and saves
it once, and its builder loads it from `folder`.

The entity gate (EntityGate, [D]) withholds the entities of a pair whose change region shows nothing
the captions would name (a camera or light change): a logistic regression on both regions'
descriptors and their difference, fitted on the fit split; `retrieve_top_k(…, gate=gate)` applies it.

CHEER's image-level retrieval (docs/methods/cheer.md, CHEER Eq. 1) uses no masks: both retrievers also score
whole frames (`frame_scores(images)` → S ∈ R^{n×M}), and `cheer_rank_entities` ranks the vocabulary by
|S_bef − S_aft| (or S_bef − S_aft) under the paper's mean constraint; `retrieve_image_level` applies it.
"""

from __future__ import annotations

from davir.preprocessing.components import ComponentRegistry, Weights
from davir.preprocessing.retrievers.clip import DEFAULT_PROMPT, ClipRetriever, ClipSettings, square_pad
from davir.preprocessing.retrievers.fitted import (
    FITTED_MODES, FittedRetriever, FittedSettings, fit_soft_logistic, phrase_words, word_targets,
)
from davir.preprocessing.retrievers.gate import EntityGate, gate_features
from davir.preprocessing.retrievers.regions import (
    DESCRIPTOR_NAMES, EMPTY_FLAG, MASK_SOURCES, MASK_WEIGHTINGS, PairRegions, Region, frame_pair_features,
    masked_region, pair_features, pair_regions, padded_box, region_descriptor, resize_mask, soft_patch_mask,
    whole_frame_region,
)
from davir.preprocessing.retrievers.retrieval import (
    IMAGE_SCORES, Retriever, cheer_rank_entities, retrieve_image_level, retrieve_top_k, top_k,
)

__all__ = [
    "DEFAULT_PROMPT", "DESCRIPTOR_NAMES", "EMPTY_FLAG", "FITTED_MODES", "IMAGE_SCORES", "MASK_SOURCES",
    "MASK_WEIGHTINGS", "RETRIEVERS", "ClipRetriever", "ClipSettings", "EntityGate", "FittedRetriever",
    "FittedSettings", "PairRegions", "Region",
    "Retriever", "build_retriever", "cheer_rank_entities", "fit_soft_logistic", "frame_pair_features",
    "gate_features", "masked_region", "padded_box", "pair_features", "pair_regions", "phrase_words",
    "region_descriptor", "resize_mask", "retrieve_image_level", "retrieve_top_k", "soft_patch_mask",
    "square_pad", "top_k", "whole_frame_region", "word_targets",
]

RETRIEVERS: ComponentRegistry[Retriever] = ComponentRegistry("retriever", "--retriever")
RETRIEVERS.register("fitted", FittedSettings, FittedRetriever.build, fit=FittedRetriever.fit_new,
                    is_fitted=FittedRetriever.exists)
RETRIEVERS.register("clip", ClipSettings, ClipRetriever.build,
                    weights=Weights("clip_checkpoint", "--clip-checkpoint", "a local open_clip state dict for --clip-model"))


def build_retriever(name: str, settings=None, *, checkpoint=None, device: str | None = None, **fields_and_folder
                    ) -> Retriever:
    """A retriever by registry name from its typed settings (or their fields as keywords; `folder=` for `fitted`)."""
    return RETRIEVERS.build(name, settings, checkpoint=checkpoint, device=device, **fields_and_folder)
