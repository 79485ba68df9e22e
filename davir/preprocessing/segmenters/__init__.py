"""The segmentation model S of DAVIR §3.1, `M_c = S(I, P_c)`, behind a small registry.

    segmenter = build_segmenter("classical")                     # weight-free default
    segmenter = build_segmenter("sam", checkpoint="sam_vit_h_4b8939.pth", model_type="vit_h")
    candidates = segmenter.segment([SegmentRequest(image, prompts, regions), ...])

`segment` takes a batch of images with their prompts and returns, per image and prompt, a (K, H, W)
bool array of candidate masks (SAM: K = 3, multimask output; classical: K = 1) and K scores. The
IoU filter of Eq. 3 (davir.preprocessing.change_regions.change_mask_union) picks among them.

* `classical`: no weights. The cluster region R_c found by differencing is refined in the image
  itself, inside a crop around the box B_c (crops are capped at `crop_size` px, so the cost is flat):
  `contrast` (default) marks the pixels that stand out from the background — the box is inpainted
  from its surroundings (OpenCV Telea) and pixels differing from that estimate by more than
  `contrast_threshold` are kept where they touch R_c; an image where the changed object is absent
  (the before image of an "add") gives an empty mask, so per-image masks come out right.
  `grabcut` seeds OpenCV GrabCut with the box (R_c probable foreground); `region` returns R_c itself.
* `sam`: segment-anything with a local checkpoint. On a GPU the image encoder runs once over a batch
  of images in bf16 (`SamPredictor.set_image` takes one image at a time), then the official
  `predict_torch` decodes all prompts of each image at once; on the CPU everything stays fp32.
"""

from __future__ import annotations

from typing import Callable

from davir.data.records import DataError
from davir.preprocessing.segmenters.base import Candidates, Segmenter, SegmentRequest
from davir.preprocessing.segmenters.classical import CLASSICAL_METHODS, ClassicalSegmenter
from davir.preprocessing.segmenters.sam import SAM_BUILDERS, SamSegmenter, load_sam

__all__ = ["CLASSICAL_METHODS", "SAM_BUILDERS", "SEGMENTERS", "Candidates", "ClassicalSegmenter", "SamSegmenter",
           "SegmentRequest", "Segmenter", "build_segmenter", "load_sam"]

SEGMENTERS: dict[str, Callable[..., Segmenter]] = {
    "classical": ClassicalSegmenter,
    "sam": SamSegmenter,
}


def build_segmenter(name: str, **options) -> Segmenter:
    """The segmenter registered under `name`, built with its keyword options."""
    if name not in SEGMENTERS:
        raise DataError(f"unknown segmenter {name!r}; choose from {', '.join(SEGMENTERS)}")
    return SEGMENTERS[name](**options)
