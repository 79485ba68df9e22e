"""The segmentation model S of DAVIR §3.1, `M_c = S(I, P_c)`, behind a registry (davir.preprocessing.components).

    segmenter = build_segmenter("classical")                     # weight-free default
    segmenter = build_segmenter("sam", SamSettings(sam_type="vit_h"), checkpoint="sam_vit_h_4b8939.pth")
    candidates = segmenter.segment([SegmentRequest(image, prompts, regions), ...])
    segmenter = SEGMENTERS.rebuild(name, manifest_settings, where=…)  # what a mask cache recorded

How `classical` and `sam` work: docs/preprocessing.md, "Segmenters"; adding one: docs/architecture.md.
"""

from __future__ import annotations

from davir.preprocessing.components import ComponentRegistry, Weights
from davir.preprocessing.segmenters.base import Candidates, Segmenter, SegmentRequest
from davir.preprocessing.segmenters.classical import CLASSICAL_METHODS, ClassicalSegmenter, ClassicalSettings
from davir.preprocessing.segmenters.sam import SAM_TYPES, SamSegmenter, SamSettings, load_sam

__all__ = [
    "CLASSICAL_METHODS",
    "SAM_TYPES",
    "SEGMENTERS",
    "Candidates",
    "ClassicalSegmenter",
    "ClassicalSettings",
    "SamSegmenter",
    "SamSettings",
    "SegmentRequest",
    "Segmenter",
    "build_segmenter",
    "load_sam",
]

SEGMENTERS: ComponentRegistry[Segmenter] = ComponentRegistry("segmenter", "--segmenter")
SEGMENTERS.register("classical", ClassicalSettings, ClassicalSegmenter.build, in_workers=True)
SEGMENTERS.register(
    "sam",
    SamSettings,
    SamSegmenter.build,
    weights=Weights("sam_checkpoint", "--sam-checkpoint", "a local SAM .pth, e.g. sam_vit_h_4b8939.pth"),
    older_records={"image_resize": "pil"},  # a cache recorded before the device resize existed used PIL's
)


def build_segmenter(name: str, settings=None, *, checkpoint=None, device: str | None = None, **fields) -> Segmenter:
    """The segmenter registered under `name`, from its typed settings (or their fields as keywords)."""
    return SEGMENTERS.build(name, settings, checkpoint=checkpoint, device=device, **fields)
