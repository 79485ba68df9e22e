"""Segment Anything with a local checkpoint: batched image encoder, the official `predict_torch` decoder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from davir.errors import DataError
from davir.io import path_record
from davir.preprocessing.change_regions import Prompt
from davir.preprocessing.components import option
from davir.preprocessing.segmenters.base import Candidates, SegmentRequest
from davir.registry import Registry


def _official(model_type: str) -> Callable:
    def build(checkpoint=None):
        from segment_anything import sam_model_registry

        return sam_model_registry[model_type](checkpoint=checkpoint)

    build.__qualname__ = f"segment_anything.sam_model_registry[{model_type!r}]"
    return build


# SAM type -> builder(checkpoint=None) -> Sam (segment-anything's own three, imported when built); a test or a
# user registers another architecture here (e.g. a tiny test model).
SAM_TYPES: Registry[Callable] = Registry("SAM type")
for _model_type in ("vit_h", "vit_l", "vit_b"):
    SAM_TYPES.register(_model_type, _official(_model_type))


def sam_types() -> list[str]:
    """The SAM architectures `--sam-type` offers (without importing segment_anything)."""
    return sorted(SAM_TYPES)


RESIZES = ("device", "pil")


@dataclass(frozen=True)
class SamSettings:
    """SAM's settings; the weights file and the device are given beside them (`SamSegmenter.build`)."""

    sam_type: str = field(
        default="vit_h", metadata=option("--sam-type", "SAM architecture of the checkpoint", choices=sam_types)
    )
    batch_size: int = field(
        default=8, metadata=option("--sam-batch-size", "images per image-encoder batch", compared=False)
    )
    image_resize: str = field(
        default="device",
        metadata=option(
            "--sam-resize",
            "SAM's resize to its 1024 side: 'device' (torch, PIL's filter, where SAM runs) or 'pil' (the official "
            "host resize; a cache started before the device resize existed is finished with it)",
            choices=RESIZES,
        ),
    )


def load_sam(checkpoint: str | Path | None, model_type: str = "vit_h", device: str | None = None):
    """Build SAM of `model_type` and load a local checkpoint (a state dict, loaded with weights_only=True)."""
    import torch

    build = SAM_TYPES[model_type]
    if checkpoint is None:
        raise DataError("--segmenter sam needs --sam-checkpoint PATH (a local SAM .pth; weights are never downloaded)")
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise DataError(
            f"SAM checkpoint not found: {checkpoint} (download sam_{model_type}_*.pth from the segment-anything "
            f"release page on a machine with internet and pass its local path with --sam-checkpoint)"
        )
    sam = build(checkpoint=None)
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle/zip errors: name the file
        raise DataError(f"SAM checkpoint {checkpoint} could not be read as a state dict: {error}") from error
    try:
        sam.load_state_dict(state)
    except RuntimeError as error:
        raise DataError(
            f"SAM checkpoint {checkpoint} does not fit SAM type {model_type!r}: {str(error)[:300]}"
        ) from error
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return sam.to(device).eval()


def resize_method(device) -> str:
    """How `resize_longest_side` resizes on `device` (recorded with a cache: the pixels differ by at most 1)."""
    return "torch-bilinear-antialias-uint8" if str(device) == "cpu" else "torch-bilinear-antialias-float-rounded"


def resize_longest_side(image: np.ndarray, target_length: int, device, method: str | None = None):
    """(1, 3, h, w) float tensor on `device`: `ResizeLongestSide.apply_image`'s resize, done by torch where SAM runs
    [D] (the official predictor resizes with PIL; `--sam-resize pil` keeps it; docs/preprocessing.md).

    The official transform resizes on the host with PIL (~10 ms an image to 1024 on one core), a quarter of a
    pair's time in the batched path on a GPU. Torch's antialiased bilinear is PIL's filter: in uint8 (CPU only) it
    gives PIL's pixels but for ≤ 0.3 % off by one level; on other devices it runs in float, rounded to the uint8
    grid (≤ 20 % of the pixels off by one level). Either stays within one grey level of `apply_image`.
    `method` (default: `resize_method(device)`) is for tests of the other device's arithmetic.
    """
    import torch
    import torch.nn.functional as F
    from segment_anything.utils.transforms import ResizeLongestSide

    size = ResizeLongestSide.get_preprocess_shape(image.shape[0], image.shape[1], target_length)
    # read-only or strided arrays (a cache's memory map, a crop) are copied once; others are used as they are
    pixels = torch.as_tensor(np.require(image, np.uint8, ["C", "W"]), device=device).permute(2, 0, 1)[None]
    if (method or resize_method(pixels.device)) == "torch-bilinear-antialias-uint8":
        return F.interpolate(pixels, size, mode="bilinear", align_corners=False, antialias=True).float()
    resized = F.interpolate(pixels.float(), size, mode="bilinear", align_corners=False, antialias=True)
    return resized.round_().clamp_(0, 255)


class SamSegmenter:
    """S = Segment Anything: box + positive centre point per prompt, three candidate masks each."""

    name = "sam"

    def __init__(
        self,
        checkpoint: str | Path | None,
        model_type: str = "vit_h",
        device: str | None = None,
        batch_size: int = 8,
        bf16: bool | None = None,
        model=None,
        image_resize: str = "device",
    ):
        """Load SAM from `checkpoint` — or use an already built `model` (benchmarks with random weights)."""
        import torch
        from segment_anything import SamPredictor

        self.sam = load_sam(checkpoint, model_type, device) if model is None else model.eval()
        self.device = next(self.sam.parameters()).device
        self.predictor = SamPredictor(self.sam)
        self.model_type = model_type
        self.checkpoint = path_record(checkpoint)  # absolute: a resume from any folder compares, a rebuild finds it
        self.batch_size = batch_size
        if image_resize not in RESIZES:
            raise DataError(f"SAM image_resize {image_resize!r}: choose from {RESIZES}")
        self.image_resize = image_resize
        # bf16 autocast for the image encoder on a GPU only; CPU bf16 is slow and loses accuracy.
        self.bf16 = (self.device.type == "cuda") if bf16 is None else bf16
        self._torch = torch

    @classmethod
    def build(cls, settings: SamSettings, *, checkpoint: str | Path | None, device: str | None = None) -> SamSegmenter:
        """The registry's builder. bf16 follows the device (a GPU), so it is never restored from a record."""
        return cls(
            checkpoint,
            settings.sam_type,
            device=device,
            batch_size=settings.batch_size,
            image_resize=settings.image_resize,
        )

    def settings(self) -> dict:
        return {
            "segmenter": self.name,
            "sam_type": self.model_type,
            "sam_checkpoint": self.checkpoint,
            "device": str(self.device),
            "bf16_encoder": self.bf16,
            "batch_size": self.batch_size,
            "multimask_output": True,
            "image_resize": self.image_resize,
            # the arithmetic of the device resize differs by device (within one grey level), as bf16 does
            **({"resize_arithmetic": resize_method(self.device)} if self.image_resize == "device" else {}),
        }

    def encode(self, images: list[np.ndarray]):
        """Image embeddings (B, 256, 64, 64) of a batch: ResizeLongestSide, normalise+pad, one encoder pass."""
        torch = self._torch
        batch = [self.sam.preprocess(self._resized(image)) for image in images]
        batch = torch.cat(batch)
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            features = self.sam.image_encoder(batch)
        return features.float()

    def _resized(self, image: np.ndarray):
        """(1, 3, h, w) float on SAM's device, the long side at SAM's input size."""
        transform = self.predictor.transform
        if self.image_resize == "pil":  # the official transform, on the host
            resized = transform.apply_image(image)
            return self._torch.as_tensor(resized, device=self.device).permute(2, 0, 1).contiguous()[None].float()
        return resize_longest_side(image, transform.target_length, self.device)

    def _prompt_tensors(self, image: np.ndarray, prompts: list[Prompt]):
        """(point coords, labels, boxes) of one image's prompts on SAM's device, in the resized image's frame."""
        torch = self._torch
        transform, original = self.predictor.transform, image.shape[:2]
        boxes = torch.tensor([p.box for p in prompts], dtype=torch.float32)
        points = torch.tensor([[p.point] for p in prompts], dtype=torch.float32)
        labels = torch.ones(points.shape[:2], dtype=torch.int64)
        return (
            transform.apply_coords_torch(points, original).to(self.device),
            labels.to(self.device),
            transform.apply_boxes_torch(boxes, original).to(self.device),
        )

    def _decode(self, features, image: np.ndarray, prompt_tensors):
        """All prompts of one image through the official `SamPredictor.predict_torch`: (masks, scores) on SAM's
        device, (P, 3, H, W) and (P, 3)."""
        torch = self._torch
        predictor = self.predictor
        original = image.shape[:2]
        predictor.reset_image()
        predictor.features = features
        predictor.original_size = original
        predictor.input_size = tuple(
            predictor.transform.get_preprocess_shape(*original, predictor.transform.target_length)
        )
        predictor.is_image_set = True
        points, labels, boxes = prompt_tensors
        with torch.inference_mode():
            masks, scores, _ = predictor.predict_torch(points, labels, boxes=boxes, multimask_output=True)
        return masks, scores

    def segment(self, requests: list[SegmentRequest]) -> list[list[Candidates]]:
        results: list[list[Candidates]] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            # Images without a prompt are not encoded at all.
            needed = [i for i, r in enumerate(chunk) if r.prompts]
            # The prompts go to the device before any of the batch's work is queued, and the masks come back after
            # all of it: torch's blocking copy between host and device waits for everything queued before it, so
            # one in between would make the host wait once an image instead of once a batch.
            prompts = {i: self._prompt_tensors(chunk[i].image, chunk[i].prompts) for i in needed}
            features = self.encode([chunk[i].image for i in needed]) if needed else None
            decoded = {
                i: self._decode(features[row : row + 1], chunk[i].image, prompts[i]) for row, i in enumerate(needed)
            }
            answers: list[list[Candidates]] = [[] for _ in chunk]
            for i, (masks, scores) in decoded.items():
                masks, scores = masks.cpu().numpy(), scores.float().cpu().numpy()
                answers[i] = [Candidates(masks[k], scores[k]) for k in range(len(chunk[i].prompts))]
            results.extend(answers)
        return results
