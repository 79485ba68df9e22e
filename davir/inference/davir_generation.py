"""Captioning with a trained checkpoint: batched generation over ChangePair records, and localisation scores.

Shared by `evaluate.py --checkpoint` (a dataset split) and `caption.py` (a folder of pairs). A pair that
cannot be read becomes a `Prediction` with an `error` instead of stopping the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from davir.data.images import load_pair
from davir.data.records import ChangePair, DataError

# A patch counts as inside the change when the mask covers at least this share of it (as in the calibration).
INSIDE_COVERAGE = 0.25


@dataclass
class Prediction:
    pair_id: str
    caption: str | None = None
    entities: list[str] = field(default_factory=list)
    attention_before: np.ndarray | None = None  # (Hp, Wp), sums to 1
    attention_after: np.ndarray | None = None
    error: str | None = None


def resolve_model_dir(path: str | Path) -> Path:
    """A run folder (→ its best/, else last/) or a saved model folder itself."""
    path = Path(path)
    if (path / "davir_config.json").is_file() or (path / "lightweight_config.json").is_file():
        return path
    for name in ("best", "last"):
        candidate = path / name
        if (candidate / "davir_config.json").is_file() or (candidate / "lightweight_config.json").is_file():
            return candidate
    raise DataError(f"{path} is neither a saved model (davir_config.json) nor a run folder with best/ or last/")


def run_dir_of(model_dir: Path) -> Path | None:
    """The run folder a saved model belongs to (holding config.yaml), if any."""
    for candidate in (model_dir, model_dir.parent):
        if (candidate / "config.yaml").is_file():
            return candidate
    return None


EntitySource = Callable[[ChangePair, Image.Image, Image.Image], list[str]]


def caption_pairs(model, pairs: Sequence[ChangePair], *, batch_size: int = 16, max_new_tokens: int = 30,
                  num_beams: int = 1, entity_source: EntitySource | None = None,
                  size_policy: str = "resize_before_to_after", progress: bool = True) -> list[Prediction]:
    """Caption `pairs` with a DavirModel in batches; unreadable pairs are reported, not fatal."""
    predictions: list[Prediction] = []
    bar = tqdm(total=len(pairs), desc="caption", disable=not progress)
    device = model.device
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start: start + batch_size]
        ready, images, entities = [], [], []
        for pair in chunk:
            try:
                before, after = load_pair(pair, size_policy=size_policy)
                ready.append(pair)
                images.extend([before, after])
                entities.append(entity_source(pair, before, after) if entity_source else [])
            except DataError as error:
                predictions.append(Prediction(pair.pair_id, error=str(error)))
        if ready:
            pixels = model.image_processor(images).to(device)
            prompts = model.build_prompts(entities if entity_source else None, batch_size=len(ready))
            captions, attention_before, attention_after = model.generate(
                pixels[0::2], pixels[1::2], prompts, max_new_tokens=max_new_tokens, num_beams=num_beams,
                return_attention=True)
            for i, pair in enumerate(ready):
                predictions.append(Prediction(
                    pair.pair_id, caption=captions[i], entities=entities[i],
                    attention_before=attention_before[i].float().cpu().numpy(),
                    attention_after=attention_after[i].float().cpu().numpy()))
        bar.update(len(chunk))
    bar.close()
    order = {pair.pair_id: i for i, pair in enumerate(pairs)}
    return sorted(predictions, key=lambda p: order[p.pair_id])


def patch_coverage(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Share of each patch covered by a boolean mask (any resolution) on a (rows, cols) patch grid."""
    image = Image.fromarray(np.asarray(mask, dtype=np.float32), mode="F")
    return np.asarray(image.resize((grid[1], grid[0]), Image.BOX), dtype=np.float64)


def attention_localisation(attention: np.ndarray, mask: np.ndarray) -> dict[str, float] | None:
    """Share of the attention mass on patches inside the change mask, pointing hit, and the uniform baseline.

    `attention` (Hp, Wp) sums to 1; `mask` any-resolution bool in the same image frame. None for an
    empty mask (nothing to point at).
    """
    inside = patch_coverage(mask, attention.shape) >= INSIDE_COVERAGE
    if not inside.any():
        return None
    share = float(attention[inside].sum() / max(attention.sum(), 1e-12))
    peak = np.unravel_index(int(np.argmax(attention)), attention.shape)
    return {"share": share, "pointing": float(inside[peak]), "uniform": float(inside.mean())}


def localisation_summary(predictions: Sequence[Prediction], masks: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """Mean attention share inside the change mask and pointing accuracy over every image with a non-empty mask."""
    rows = []
    for prediction in predictions:
        if prediction.error or prediction.pair_id not in masks:
            continue
        mask_before, mask_after = masks[prediction.pair_id]
        for attention, mask in ((prediction.attention_before, mask_before), (prediction.attention_after, mask_after)):
            if attention is not None and mask is not None:
                score = attention_localisation(attention, mask)
                if score is not None:
                    rows.append(score)
    if not rows:
        return {"images": 0}
    mean = {key: float(np.mean([row[key] for row in rows])) for key in ("share", "pointing", "uniform")}
    return {"images": len(rows), "attention_share_in_mask": mean["share"], "pointing_accuracy": mean["pointing"],
            "uniform_share": mean["uniform"], "share_over_uniform": mean["share"] / max(mean["uniform"], 1e-12)}


def load_davir(model_dir: Path, device: str | torch.device | None = None):
    from davir.models.davir import DavirModel

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = DavirModel.from_pretrained(model_dir, device=device)
    model.eval()
    return model
