"""The segmentation model S of DAVIR §3.1, `M_c = S(I, P_c)`, behind a small registry.

    segmenter = build_segmenter("classical")                     # weight-free default
    segmenter = build_segmenter("sam", checkpoint="sam_vit_h_4b8939.pth", model_type="vit_h")
    candidates = segmenter.segment([SegmentRequest(image, prompts, regions), ...])

`segment` takes a batch of images with their prompts and returns, per image and prompt, a (K, H, W)
bool array of candidate masks (SAM: K = 3, multimask output; classical: K = 1) and K scores. The
IoU filter of Eq. 3 (preprocess.change_regions.change_mask_union) picks among them.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import cv2
import numpy as np

from davir.data.records import DataError
from preprocess.change_regions import Prompt, fill_holes

CLASSICAL_METHODS = ("contrast", "grabcut", "region")


@dataclass
class SegmentRequest:
    """One image and its prompts; `regions[i]` is R_c of prompt i in this image's frame (H, W) bool."""

    image: np.ndarray
    prompts: list[Prompt]
    regions: list[np.ndarray]


@dataclass
class Candidates:
    """The segmenter's answer for one prompt: (K, H, W) bool masks and K scores."""

    masks: np.ndarray
    scores: np.ndarray


class Segmenter(Protocol):
    name: str

    def segment(self, requests: list[SegmentRequest]) -> list[list[Candidates]]: ...

    def settings(self) -> dict: ...


# ----------------------------------------------------------------------------------------------
# classical
# ----------------------------------------------------------------------------------------------

def _disk(radius: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


class ClassicalSegmenter:
    """Weight-free S: refine each cluster region inside a crop around its box (see the module docstring)."""

    name = "classical"

    def __init__(self, method: str = "contrast", contrast_threshold: float = 0.1, pad: float = 0.25,
                 crop_size: int = 160, grabcut_iterations: int = 2):
        if method not in CLASSICAL_METHODS:
            raise ValueError(f"classical method must be one of {CLASSICAL_METHODS}, got {method!r}")
        self.method = method
        self.contrast_threshold = contrast_threshold
        self.pad = pad
        self.crop_size = crop_size
        self.grabcut_iterations = grabcut_iterations

    def settings(self) -> dict:
        return {"segmenter": self.name, "method": self.method, "contrast_threshold": self.contrast_threshold,
                "pad": self.pad, "crop_size": self.crop_size, "grabcut_iterations": self.grabcut_iterations}

    def segment(self, requests: list[SegmentRequest]) -> list[list[Candidates]]:
        return [[self.segment_one(r.image, p, region) for p, region in zip(r.prompts, r.regions)] for r in requests]

    def segment_one(self, image: np.ndarray, prompt: Prompt, region: np.ndarray) -> Candidates:
        """One prompt: crop around the box, refine at ≤ crop_size px, paste back at image resolution."""
        height, width = image.shape[:2]
        if self.method == "region":
            return Candidates(region[None].copy(), np.ones(1, np.float32))
        x0, y0, x1, y1 = prompt.box
        pad = max(4.0, self.pad * max(x1 - x0, y1 - y0))
        cx0, cy0 = int(max(0, np.floor(x0 - pad))), int(max(0, np.floor(y0 - pad)))
        cx1, cy1 = int(min(width, np.ceil(x1 + pad))), int(min(height, np.ceil(y1 + pad)))
        crop = image[cy0:cy1, cx0:cx1]
        crop_region = region[cy0:cy1, cx0:cx1]
        box = (x0 - cx0, y0 - cy0, x1 - cx0, y1 - cy0)
        scale = min(1.0, self.crop_size / max(crop.shape[:2]))
        if scale < 1.0:
            size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
            crop = cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
            crop_region = cv2.resize(crop_region.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST).astype(bool)
            box = tuple(v * scale for v in box)
        if self.method == "contrast":
            small = self._contrast(crop, crop_region, box)
        else:
            small = self._grabcut(crop, crop_region, box)
        if scale < 1.0:
            small = cv2.resize(small.astype(np.uint8), (cx1 - cx0, cy1 - cy0), interpolation=cv2.INTER_LINEAR) > 0
        mask = np.zeros((height, width), dtype=bool)
        mask[cy0:cy1, cx0:cx1] = small
        return Candidates(mask[None], np.ones(1, np.float32))

    @staticmethod
    def _box_mask(shape: tuple[int, int], box: tuple[float, ...], grow: int = 0) -> np.ndarray:
        inside = np.zeros(shape, dtype=np.uint8)
        x0, y0, x1, y1 = box
        inside[max(0, int(y0) - grow):int(np.ceil(y1)) + grow, max(0, int(x0) - grow):int(np.ceil(x1)) + grow] = 1
        return inside

    def _contrast(self, crop: np.ndarray, region: np.ndarray, box: tuple[float, ...]) -> np.ndarray:
        """Pixels that differ from an inpainted background estimate of the box, connected to R_c."""
        hole = self._box_mask(crop.shape[:2], box, grow=2) | cv2.dilate(region.astype(np.uint8), _disk(2))
        if hole.all():  # no surrounding pixels to inpaint from: fall back to the region itself
            return region
        # The background is smooth where it matters, so it is inpainted at ≤ 48 px and upsampled.
        background = self._inpaint_small(crop, hole, 48)
        evidence = np.abs(crop.astype(np.int16) - background.astype(np.int16)).mean(axis=2) / 255.0
        evidence = cv2.GaussianBlur(evidence.astype(np.float32), (3, 3), 0)
        candidate = ((evidence > self.contrast_threshold) & hole.astype(bool)).astype(np.uint8)
        candidate = cv2.morphologyEx(candidate, cv2.MORPH_OPEN, _disk(1))
        _, labels = cv2.connectedComponents(candidate, connectivity=8)
        touching = np.unique(labels[region & (labels > 0)])
        mask = np.isin(labels, touching[touching > 0])
        mask = cv2.morphologyEx(mask.astype(np.uint8), cv2.MORPH_CLOSE, _disk(2)).astype(bool)
        return fill_holes(mask)

    @staticmethod
    def _inpaint_small(crop: np.ndarray, hole: np.ndarray, size: int) -> np.ndarray:
        """Telea inpainting of `hole` at a long side of at most `size` px, resampled to the crop size."""
        height, width = crop.shape[:2]
        scale = min(1.0, size / max(height, width))
        if scale == 1.0:
            return cv2.inpaint(crop, hole, 3, cv2.INPAINT_TELEA)
        small_size = (max(2, round(width * scale)), max(2, round(height * scale)))
        small = cv2.resize(crop, small_size, interpolation=cv2.INTER_AREA)
        small_hole = cv2.dilate(cv2.resize(hole, small_size, interpolation=cv2.INTER_NEAREST), _disk(1))
        if small_hole.all():
            small_hole = cv2.resize(hole, small_size, interpolation=cv2.INTER_NEAREST)
        filled = cv2.inpaint(small, small_hole, 3, cv2.INPAINT_TELEA)
        return cv2.resize(filled, (width, height), interpolation=cv2.INTER_LINEAR)

    def _grabcut(self, crop: np.ndarray, region: np.ndarray, box: tuple[float, ...]) -> np.ndarray:
        """OpenCV GrabCut seeded by the box: outside = background, R_c = probable foreground."""
        inside = self._box_mask(crop.shape[:2], box).astype(bool)
        seeds = np.full(crop.shape[:2], cv2.GC_BGD, dtype=np.uint8)
        seeds[inside] = cv2.GC_PR_BGD
        seeds[region & inside] = cv2.GC_PR_FGD
        if not (seeds == cv2.GC_BGD).any() or not (seeds == cv2.GC_PR_FGD).any():
            return region
        bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
        try:
            cv2.grabCut(crop, seeds, None, bgd, fgd, self.grabcut_iterations, cv2.GC_INIT_WITH_MASK)
        except cv2.error:  # degenerate colour models (e.g. a flat crop): keep the region
            return region
        return fill_holes((seeds == cv2.GC_FGD) | (seeds == cv2.GC_PR_FGD))


# ----------------------------------------------------------------------------------------------
# SAM
# ----------------------------------------------------------------------------------------------

def _sam_builders() -> dict[str, Callable]:
    from segment_anything import sam_model_registry

    return {name: builder for name, builder in sam_model_registry.items() if name != "default"}


# name -> builder(checkpoint=None) -> Sam; extra architectures (e.g. a tiny test model) can be added.
SAM_BUILDERS: dict[str, Callable] = {}


def load_sam(checkpoint: str | Path | None, model_type: str = "vit_h", device: str | None = None):
    """Build SAM of `model_type` and load a local checkpoint (a state dict, loaded with weights_only=True)."""
    import torch

    builders = {**_sam_builders(), **SAM_BUILDERS}
    if model_type not in builders:
        raise DataError(f"unknown SAM type {model_type!r}; choose from {', '.join(sorted(builders))}")
    if checkpoint is None:
        raise DataError("--segmenter sam needs --sam-checkpoint PATH (a local SAM .pth; weights are never downloaded)")
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise DataError(
            f"SAM checkpoint not found: {checkpoint} (download sam_{model_type}_*.pth from the segment-anything "
            f"release page on a machine with internet and pass its local path with --sam-checkpoint)"
        )
    sam = builders[model_type](checkpoint=None)
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle/zip errors: name the file
        raise DataError(f"SAM checkpoint {checkpoint} could not be read as a state dict: {error}") from error
    try:
        sam.load_state_dict(state)
    except RuntimeError as error:
        raise DataError(f"SAM checkpoint {checkpoint} does not fit SAM type {model_type!r}: {str(error)[:300]}") from error
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return sam.to(device).eval()


class SamSegmenter:
    """S = Segment Anything: box + positive centre point per prompt, three candidate masks each."""

    name = "sam"

    def __init__(self, checkpoint: str | Path | None, model_type: str = "vit_h", device: str | None = None,
                 batch_size: int = 8, bf16: bool | None = None, model=None):
        """Load SAM from `checkpoint` — or use an already built `model` (benchmarks with random weights)."""
        import torch
        from segment_anything import SamPredictor

        self.sam = load_sam(checkpoint, model_type, device) if model is None else model.eval()
        self.device = next(self.sam.parameters()).device
        self.predictor = SamPredictor(self.sam)
        self.model_type = model_type
        self.checkpoint = str(checkpoint)
        self.batch_size = batch_size
        # bf16 autocast for the image encoder on a GPU only; CPU bf16 is slow and loses accuracy.
        self.bf16 = (self.device.type == "cuda") if bf16 is None else bf16
        self._torch = torch

    def settings(self) -> dict:
        return {"segmenter": self.name, "sam_type": self.model_type, "sam_checkpoint": self.checkpoint,
                "device": str(self.device), "bf16_encoder": self.bf16, "batch_size": self.batch_size,
                "multimask_output": True}

    def encode(self, images: list[np.ndarray]):
        """Image embeddings (B, 256, 64, 64) of a batch: ResizeLongestSide, normalise+pad, one encoder pass."""
        torch = self._torch
        transform = self.predictor.transform
        batch = []
        for image in images:
            resized = transform.apply_image(image)
            tensor = torch.as_tensor(resized, device=self.device).permute(2, 0, 1).contiguous()[None]
            batch.append(self.sam.preprocess(tensor.float()))
        batch = torch.cat(batch)
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            features = self.sam.image_encoder(batch)
        return features.float()

    def _decode(self, features, image: np.ndarray, prompts: list[Prompt]) -> list[Candidates]:
        """All prompts of one image through the official `SamPredictor.predict_torch`."""
        torch = self._torch
        if not prompts:
            return []
        predictor = self.predictor
        original = image.shape[:2]
        predictor.reset_image()
        predictor.features = features
        predictor.original_size = original
        predictor.input_size = tuple(predictor.transform.get_preprocess_shape(*original, predictor.transform.target_length))
        predictor.is_image_set = True
        boxes = torch.tensor([p.box for p in prompts], dtype=torch.float32, device=self.device)
        points = torch.tensor([[p.point] for p in prompts], dtype=torch.float32, device=self.device)
        labels = torch.ones(points.shape[:2], dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            masks, scores, _ = predictor.predict_torch(
                predictor.transform.apply_coords_torch(points, original), labels,
                boxes=predictor.transform.apply_boxes_torch(boxes, original), multimask_output=True)
        masks, scores = masks.cpu().numpy(), scores.float().cpu().numpy()
        return [Candidates(masks[i], scores[i]) for i in range(len(prompts))]

    def segment(self, requests: list[SegmentRequest]) -> list[list[Candidates]]:
        results: list[list[Candidates]] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start:start + self.batch_size]
            # Images without a prompt are not encoded at all.
            needed = [i for i, r in enumerate(chunk) if r.prompts]
            features = self.encode([chunk[i].image for i in needed]) if needed else None
            answers: list[list[Candidates]] = [[] for _ in chunk]
            for row, i in enumerate(needed):
                answers[i] = self._decode(features[row:row + 1], chunk[i].image, chunk[i].prompts)
            results.extend(answers)
        return results


SEGMENTERS: dict[str, Callable[..., Segmenter]] = {
    "classical": ClassicalSegmenter,
    "sam": SamSegmenter,
}


def build_segmenter(name: str, **options) -> Segmenter:
    """The segmenter registered under `name`, built with its keyword options."""
    if name not in SEGMENTERS:
        raise DataError(f"unknown segmenter {name!r}; choose from {', '.join(SEGMENTERS)}")
    return SEGMENTERS[name](**options)
