"""The captioners the app shows: each loaded once (`ChangeCaptioner.from_pretrained`) and used one call at a time.

    shelf = ModelShelf(CaptionerOptions(device="cpu"))
    model = shelf.get("runs/demo")            # a LoadedModel: .captioner, .lock, .name
    shelf.get("runs/other")                   # the compare tab's second model, loaded on first use

At most `keep` models stay loaded, the least recently used going first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from davir.errors import DataError
from davir.inference.captioner import CaptionerOptions, ChangeCaptioner
from davir.runs.paths import resolve_model_dir


@dataclass
class LoadedModel:
    """A captioner, the lock its calls take (a model runs one pair at a time) and the name the page shows."""

    captioner: ChangeCaptioner
    checkpoint: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        run = self.captioner.run
        return f"{self.checkpoint} ({self.captioner.engine.kind}, {run.model_dir.name}/)"


class ModelShelf:
    def __init__(self, options: CaptionerOptions | None = None, *, keep: int = 3):
        self.options, self.keep = options or CaptionerOptions(), keep
        self._models: OrderedDict[Path, LoadedModel] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, checkpoint: str | Path) -> LoadedModel:
        text = str(checkpoint).strip()
        if not text:
            raise DataError("give a checkpoint: a run folder (its best/, else last/) or a saved model folder")
        path = Path(text).expanduser()
        if not path.exists():
            raise DataError(f"checkpoint {text}: no such folder")
        key = resolve_model_dir(path).resolve()  # a DataError naming what a model folder holds
        with self._lock:  # one load at a time: two tabs asking for one new model load it once
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            model = LoadedModel(ChangeCaptioner.from_pretrained(path, self.options), text)
            self._models[key] = model
            while len(self._models) > self.keep:
                self._models.popitem(last=False)
            return model
