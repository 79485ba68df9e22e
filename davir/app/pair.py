"""One uploaded pair through a model, exactly as `caption.py` captions a pair of files.

view = caption_pair(model, "before.png", "after.png")     # a PairView, or a DataError with caption.py's message
view.caption, view.entities                               # str, [(entity, score), ...]
view.mask_overlays(), view.attention_overlays()           # (on before, on after) images, None when absent
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from davir.app.models import LoadedModel
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.viz.folder_report import compose_strip
from davir.viz.report import overlay_heatmap, overlay_mask

DISPLAY_SIDE = 320  # overlays of smaller images are drawn on an enlarged copy (the demo's are 96 px wide)


@dataclass
class PairView:
    """What the page shows of one captioned pair (the images at the model's working resolution)."""

    caption: str
    entities: list[tuple[str, float]]
    before: Image.Image
    after: Image.Image
    mask: np.ndarray | None = None  # the union change mask, in the after image's frame (DAVIR)
    attention: tuple[np.ndarray, np.ndarray] | None = None  # FAC's maps over before and after (DAVIR)
    seconds: float = 0.0

    def shown(self) -> tuple[Image.Image, Image.Image]:
        """before and after as the page shows them: a small image enlarged to a long side of DISPLAY_SIDE px."""
        side = max(self.after.size)
        if side >= DISPLAY_SIDE:
            return self.before, self.after
        size = tuple(max(1, round(v * DISPLAY_SIDE / side)) for v in self.after.size)
        return self.before.resize(size, Image.BICUBIC), self.after.resize(size, Image.BICUBIC)

    def mask_overlays(self) -> tuple[Image.Image | None, Image.Image | None]:
        """The change mask tinted over before and over after (before is in after's frame: same size)."""
        if self.mask is None:
            return None, None
        before, after = self.shown()
        return overlay_mask(before, self.mask), overlay_mask(after, self.mask)

    def attention_overlays(self) -> tuple[Image.Image | None, Image.Image | None]:
        """FAC's attention over before and over after (min-max scaled heat maps)."""
        if self.attention is None:
            return None, None
        before, after = self.shown()
        return overlay_heatmap(before, self.attention[0]), overlay_heatmap(after, self.attention[1])

    def strip(self, height: int = 160) -> tuple[Image.Image, list[str]]:
        """The report's strip of this pair (before | after | mask | attention before | attention after)."""
        return compose_strip(self.before, self.after, mask=self.mask, attention=self.attention, height=height)


def short_paths(message: str, *paths: str | Path) -> str:
    """`message` with each upload's full path (a server-side temporary folder) replaced by its file name."""
    for path in paths:
        message = message.replace(str(path), Path(path).name)
    return message


def caption_pair(model: LoadedModel, before: str | Path | None, after: str | Path | None) -> PairView:
    """Caption the pair of image files with `model`; a DataError with caption.py's message when it can't."""
    if before is None or after is None:
        missing = " and ".join(name for name, value in (("before", before), ("after", after)) if value is None)
        raise DataError(f"no {missing} image: give a before image and an after image")
    before, after = Path(before), Path(after)
    pair = ChangePair(before.stem, before, after)
    started = time.perf_counter()
    with model.lock:
        prepared = model.captioner.prepare(pair, keep_images=True)
        result = model.captioner.generate([prepared], attention=True)[0]
    if result.error is not None:
        raise DataError(short_paths(result.error, before, after))
    attention = None
    if result.attention_before is not None and result.attention_after is not None:
        attention = (result.attention_before, result.attention_after)
    return PairView(
        result.caption,
        list(result.entities),
        prepared.before,
        prepared.after,
        mask=prepared.mask,
        attention=attention,
        seconds=time.perf_counter() - started,
    )
