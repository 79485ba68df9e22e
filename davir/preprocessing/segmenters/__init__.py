"""The segmentation model S of DAVIR §3.1, `M_c = S(I, P_c)`, behind a registry (davir.preprocessing.components).

    segmenter = build_segmenter("classical")                     # weight-free default
    segmenter = build_segmenter("sam", SamSettings(sam_type="vit_h"), checkpoint="sam_vit_h_4b8939.pth")
    candidates = segmenter.segment([SegmentRequest(image, prompts, regions), ...])
    segmenter = SEGMENTERS.rebuild(name, manifest_settings, where=…)  # what a mask cache recorded

A new segmenter is a class with `name`, `segment(requests)` and `settings()` (a dict holding
`"segmenter": name` and every settings field) and one line:
`SEGMENTERS.register(name, ItsSettings, ItsClass.build, weights=…, in_workers=…)`. `ItsSettings` is a
dataclass whose fields with `option("--flag")` become `preprocess masks` options of this segmenter only.
`in_workers=True` (classical): each worker process of `preprocess masks --workers N` builds its own and
segments whole pairs — for cheap CPU segmenters. Otherwise (SAM, the default) the workers only load the
images and find the change regions, and the one segmenter in the main process segments them in batches of
its `batch_size`.

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

from davir.preprocessing.components import ComponentRegistry, Weights
from davir.preprocessing.segmenters.base import Candidates, Segmenter, SegmentRequest
from davir.preprocessing.segmenters.classical import CLASSICAL_METHODS, ClassicalSegmenter, ClassicalSettings
from davir.preprocessing.segmenters.sam import SAM_TYPES, SamSegmenter, SamSettings, load_sam

__all__ = ["CLASSICAL_METHODS", "SAM_TYPES", "SEGMENTERS", "Candidates", "ClassicalSegmenter", "ClassicalSettings",
           "SamSegmenter", "SamSettings", "SegmentRequest", "Segmenter", "build_segmenter", "load_sam"]

SEGMENTERS: ComponentRegistry[Segmenter] = ComponentRegistry("segmenter", "--segmenter")
SEGMENTERS.register("classical", ClassicalSettings, ClassicalSegmenter.build, in_workers=True)
SEGMENTERS.register("sam", SamSettings, SamSegmenter.build,
                    weights=Weights("sam_checkpoint", "--sam-checkpoint", "a local SAM .pth, e.g. sam_vit_h_4b8939.pth"))


def build_segmenter(name: str, settings=None, *, checkpoint=None, device: str | None = None, **fields) -> Segmenter:
    """The segmenter registered under `name`, from its typed settings (or their fields as keywords)."""
    return SEGMENTERS.build(name, settings, checkpoint=checkpoint, device=device, **fields)
