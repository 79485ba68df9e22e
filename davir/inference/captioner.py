"""Caption image pairs with any trained model, predictor-style (as segment-anything's `SamPredictor`).

    from davir import ChangeCaptioner
    captioner = ChangeCaptioner.from_pretrained("runs/demo")          # DAVIR or a lightweight run
    captioner.caption("before.png", "after.png").caption              # paths, PIL images or arrays
    captioner.caption([b1, b2], [a1, a2])                              # a batch → a list of results

Two stages, so a DataLoader's workers can run the first while the model runs the second:
`prepare(pair)` (CPU: load at the working resolution, change masks, entities, the model's input tensors)
and `generate(prepared)` (a batched forward pass). `caption.py` streams a folder through the same two
(davir.inference.folder). Masks and entities are made with the settings of the caches the model was trained
with (davir.preprocessing.online); every path the run recorded is found from any working directory
(davir.runs.paths).
"""

from __future__ import annotations

import sys

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
import torch
from PIL import Image

from davir.data.images import array_to_rgb, load_pair, to_rgb
from davir.data.records import ChangePair, DataError
from davir.runs.paths import RunPaths

ENTITIES_KEPT = 5     # entities reported per pair (the prompt uses the model's top-k of them)
LOAD_MAX_SIDE = 1024  # images are decoded at no more than ~this long side (the masks work at 224, the models at ≤ 224)


@dataclass
class CaptionResult:
    """One pair's caption (or why it has none), the retrieved entities and, on request, attention maps."""

    pair_id: str
    caption: str | None = None
    entities: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None
    attention_before: np.ndarray | None = None
    attention_after: np.ndarray | None = None


@dataclass
class PreparedPair:
    """The CPU stage of one pair (picklable: it crosses from DataLoader workers)."""

    pair: ChangePair
    index: int = 0
    inputs: object = None                 # the engine's model inputs
    entities: list[tuple[str, float]] = field(default_factory=list)
    before: Image.Image | None = None     # kept only when `keep_images` (the report's sample)
    after: Image.Image | None = None
    mask: np.ndarray | None = None        # union change mask (after frame), when computed
    error: str | None = None


def _as_image(image, name: str) -> Image.Image:
    if isinstance(image, Image.Image):
        return to_rgb(image)
    if isinstance(image, np.ndarray):
        return array_to_rgb(image, name=name)
    raise TypeError(f"{name}: expected a path, a PIL image or an array, got {type(image).__name__}")


class DavirEngine:
    """DAVIR: the saved InstructBLIP + LoRA model; entities (Eq. 10 prompts) when it was trained with EPC."""

    kind = "davir"

    def __init__(self, run: RunPaths, device, pretrained: str | Path | None):
        from davir.models.davir import DavirModel
        from davir.models.davir_checkpoint import read_davir_config

        recorded = read_davir_config(run.model_dir).pretrained
        base = pretrained or run.resolve(recorded, what="pretrained InstructBLIP folder (model.pretrained)",
                                         flag="--pretrained")
        self.model = DavirModel.from_pretrained(run.model_dir, device=device, pretrained=base).eval()
        self.uses_entities = bool(self.model.config.epc.use_entities)
        self.num_entities = self.model.config.epc.num_entities

    def inputs(self, before: Image.Image, after: Image.Image) -> torch.Tensor:
        return self.model.image_processor([before, after])

    def generate(self, inputs: list[torch.Tensor], entities: list[list[str]], *, num_beams: int,
                 max_new_tokens: int, attention: bool) -> tuple[list[str], list | None]:
        pixels = torch.stack(inputs).to(self.model.device)
        prompts = self.model.build_prompts(entities if self.uses_entities else None, batch_size=len(inputs))
        out = self.model.generate(pixels[:, 0], pixels[:, 1], prompts, max_new_tokens=max_new_tokens,
                                  num_beams=num_beams, return_attention=attention)
        if not attention:
            return out, None
        captions, before, after = out
        maps = [(before[i].float().cpu().numpy(), after[i].float().cpu().numpy()) for i in range(len(captions))]
        return captions, maps


class LightweightEngine:
    """Subtraction / SCORER / DIRL / RDD / CHEER on ResNet-101 layer3 features computed from the images."""

    kind = "lightweight"

    def __init__(self, run: RunPaths, device, backbone_weights: str | Path | None):
        from davir.inference.lightweight import OnlineFeatures, load_lightweight

        self.bundle = load_lightweight(run.model_dir, device=device)
        self.features = OnlineFeatures(backbone_weights, device=self.bundle.device,
                                       trained_with=(self.bundle.info.get("features") or {}).get("weights"))
        self.uses_entities = self.bundle.method == "cheer"
        self.num_entities = self.bundle.model.config.cheer_entities if self.uses_entities else 0

    def inputs(self, before: Image.Image, after: Image.Image) -> np.ndarray:
        from davir.preprocessing.backbone import IMAGE_SIZE

        # As `preprocess features` (load_resized): OpenCV bicubic to 224x224, uint8.
        return np.stack([cv2.resize(np.asarray(image), (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_CUBIC)
                         for image in (before, after)])

    @torch.no_grad()
    def generate(self, inputs: list[np.ndarray], entities: list[list[str]], *, num_beams: int,
                 max_new_tokens: int, attention: bool) -> tuple[list[str], None]:
        from davir.preprocessing.backbone import normalize_batch

        bundle, device = self.bundle, self.bundle.device
        images = torch.from_numpy(np.concatenate(inputs)).permute(0, 3, 1, 2).to(device)
        features = self.features.backbone(normalize_batch(images, self.features.std)).to(torch.float16).float()
        entity_ids = None
        if self.uses_entities:
            unknown = sorted({e for row in entities for e in row if e not in bundle.entity_index})
            if unknown:
                raise DataError(f"entities outside this CHEER model's vocabulary: {unknown[:5]}")
            entity_ids = torch.tensor([[bundle.entity_index[e] for e in row] for row in entities], device=device)
        max_len = min(max_new_tokens, bundle.model.config.max_len)
        ids = bundle.model.generate(features[0::2], features[1::2], max_len=max_len, beam_size=num_beams,
                                    entities=entity_ids)
        return [bundle.vocab.decode(row) for row in ids], None


class ChangeCaptioner:
    """A trained model with the preprocessing it was trained with; see the module docstring."""

    def __init__(self, engine, masks, entities, *, run: RunPaths, num_beams: int = 1, max_new_tokens: int = 30,
                 size_policy: str = "resize_before_to_after", max_side: int = LOAD_MAX_SIDE):
        self.engine, self.masks, self.entities, self.run = engine, masks, entities, run
        self.num_beams, self.max_new_tokens = num_beams, max_new_tokens
        self.size_policy, self.max_side = size_policy, max_side

    @classmethod
    def from_pretrained(cls, checkpoint: str | Path, *, device: str | torch.device | None = None,
                        masks_from: str | Path | None = None, entities_from: str | Path | None = None,
                        pretrained: str | Path | None = None, sam_checkpoint: str | Path | None = None,
                        clip_checkpoint: str | Path | None = None, backbone_weights: str | Path | None = None,
                        num_beams: int | None = None, max_new_tokens: int | None = None,
                        size_policy: str = "resize_before_to_after", max_side: int = LOAD_MAX_SIDE,
                        allow_profile_mismatch: bool = False) -> "ChangeCaptioner":
        """A run folder (its best/, else last/) or a saved model folder, DAVIR or lightweight.

        The `*_from` / `pretrained` / `*_checkpoint` arguments replace what the run recorded (a run
        moved to another machine); a recorded path that cannot be found is a DataError naming the flag.
        Decoding defaults to the run's own (`run_decoding`: how its best/ was selected); the mask and
        entity caches must be of the preprocessing profile the run trained on unless
        `allow_profile_mismatch`.
        """
        from davir.preprocessing.profiles import check_cache_profiles
        from davir.training.run import run_decoding
        from davir.preprocessing.online import OnlineEntities, OnlineMasks

        run = RunPaths.of(checkpoint)
        for given, flag in ((masks_from, "--masks-from"), (entities_from, "--entities-from"),
                            (pretrained, "--pretrained")):
            if given is not None and not Path(given).exists():
                raise DataError(f"{flag} {given}: no such folder")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        lightweight = (run.model_dir / "lightweight_config.json").is_file()
        engine = LightweightEngine(run, device, backbone_weights) if lightweight else DavirEngine(run, device, pretrained)
        entities, entity_dir, mask_dir = None, None, None
        if engine.uses_entities:
            entity_dir = entities_from or run.resolve(run.data.get("entities"), what="entity cache (data.entities)",
                                                      flag="--entities-from")
            if entity_dir is None:
                raise DataError(f"{run.model_dir} was trained with entities: pass --entities-from CACHE (the folder "
                                "`python -m preprocess entities --out CACHE` wrote for its training data)")
            entities = OnlineEntities(entity_dir, clip_checkpoint=clip_checkpoint)
        masks = None
        if not lightweight:  # DAVIR's entities rank masked regions; the report shows the masks
            mask_dir = masks_from or run.resolve(run.data.get("masks"), what="mask cache (data.masks)",
                                                 flag="--masks-from")
            masks = OnlineMasks.from_cache(mask_dir, sam_checkpoint=sam_checkpoint, device=str(device))
        check_cache_profiles(run.data.get("preprocessing_profile"), masks=mask_dir if masks is not None else None,
                             entities=entity_dir if entities is not None else None,
                             allow_mismatch=allow_profile_mismatch,
                             where=f"the run {run.run_dir or run.model_dir} (data.preprocessing_profile)",
                             override="--allow-profile-mismatch", warn=lambda m: print(m, file=sys.stderr))
        decoding = run_decoding(run.run_dir or run.model_dir, num_beams=num_beams, max_new_tokens=max_new_tokens)
        return cls(engine, masks, entities, run=run, num_beams=decoding["num_beams"],
                   max_new_tokens=decoding["max_new_tokens"], size_policy=size_policy, max_side=max_side)

    # ------------------------------------------------------------------------------------------------ stages
    def settings(self) -> dict:
        """What decides the captions: a rerun may reuse earlier outputs only when these are equal."""
        model_files = sorted(p for p in self.run.model_dir.rglob("*") if p.is_file())
        return {
            "model": str(self.run.model_dir), "kind": self.engine.kind,
            "model_files": {str(p.relative_to(self.run.model_dir)): [p.stat().st_size, int(p.stat().st_mtime)]
                            for p in model_files},
            "num_beams": self.num_beams, "max_new_tokens": self.max_new_tokens, "size_policy": self.size_policy,
            "max_side": self.max_side,
            "masks": None if self.masks is None else self.masks.settings_dict(),
            "entities": None if self.entities is None else str(self.entities.cache_dir),
        }

    def needs_masks(self, keep_images: bool) -> bool:
        return self.masks is not None and (keep_images or (self.entities is not None and self.entities.needs_masks))

    def prepare_images(self, pair: ChangePair, before: Image.Image, after: Image.Image, *, index: int = 0,
                       keep_images: bool = False) -> PreparedPair:
        """Masks, entities and model inputs of a loaded pair; a failure becomes the pair's `error`."""
        try:
            mask_pair = None
            before_array, after_array = np.asarray(before), np.asarray(after)
            if self.needs_masks(keep_images):
                mask_pair = self.masks.from_arrays(pair.pair_id, before_array, after_array)
            entities = []
            if self.entities is not None:
                entities = self.entities(pair.pair_id, before_array, after_array, mask_pair, ENTITIES_KEPT)
            inputs = self.engine.inputs(before, after)
        except DataError as error:
            return PreparedPair(pair, index, error=str(error))
        except Exception as error:  # noqa: BLE001 - one odd pair must not stop 100,000 others; it is reported
            return PreparedPair(pair, index, error=f"record {pair.pair_id!r}: {type(error).__name__}: {error}")
        return PreparedPair(pair, index, inputs=inputs, entities=[(e, float(s)) for e, s in entities],
                            before=before if keep_images else None, after=after if keep_images else None,
                            mask=None if mask_pair is None or not keep_images else mask_pair.union)

    def prepare(self, pair: ChangePair, *, index: int = 0, keep_images: bool = False) -> PreparedPair:
        """Load one pair from its files (at the working resolution) and prepare it."""
        try:
            before, after = load_pair(pair, size_policy=self.size_policy, max_side=self.max_side)
        except DataError as error:
            return PreparedPair(pair, index, error=str(error))
        return self.prepare_images(pair, before, after, index=index, keep_images=keep_images)

    def generate(self, prepared: Sequence[PreparedPair], *, attention: bool = False) -> list[CaptionResult]:
        """Caption the prepared pairs in one batch (failed ones pass through with their error)."""
        ready = [p for p in prepared if p.error is None]
        results = {}
        if ready:
            k = self.engine.num_entities
            captions, maps = self.engine.generate([p.inputs for p in ready], [[e for e, _ in p.entities[:k]]
                                                                              for p in ready],
                                                  num_beams=self.num_beams, max_new_tokens=self.max_new_tokens,
                                                  attention=attention)
            for i, (p, caption) in enumerate(zip(ready, captions)):
                results[id(p)] = CaptionResult(p.pair.pair_id, caption, p.entities,
                                               attention_before=maps[i][0] if maps else None,
                                               attention_after=maps[i][1] if maps else None)
        return [results.get(id(p)) or CaptionResult(p.pair.pair_id, error=p.error) for p in prepared]

    # -------------------------------------------------------------------------------------------- the API
    def caption(self, before, after, *, batch_size: int = 16, attention: bool = False
                ) -> CaptionResult | list[CaptionResult]:
        """Caption one pair (paths, PIL images or uint8 arrays) or two equal-length lists of them."""
        single = not isinstance(before, (list, tuple))
        befores, afters = ([before], [after]) if single else (list(before), list(after))
        if len(befores) != len(afters):
            raise ValueError(f"{len(befores)} before images but {len(afters)} after images")
        results = []
        for start in range(0, len(befores), batch_size):
            prepared = []
            for i in range(start, min(start + batch_size, len(befores))):
                b, a = befores[i], afters[i]
                if isinstance(b, (str, Path)) and isinstance(a, (str, Path)):
                    prepared.append(self.prepare(ChangePair(str(i), Path(b), Path(a)), index=i))
                    continue
                b = _as_image(b, "before") if not isinstance(b, (str, Path)) else b
                a = _as_image(a, "after") if not isinstance(a, (str, Path)) else a
                if isinstance(b, (str, Path)) or isinstance(a, (str, Path)):
                    raise TypeError("give both images of a pair as paths, or both as images/arrays")
                if b.size != a.size:
                    if self.size_policy == "error":
                        raise DataError(f"pair {i}: before is {b.size[0]}x{b.size[1]}, after {a.size[0]}x{a.size[1]}")
                    b = b.resize(a.size, Image.BICUBIC)
                prepared.append(self.prepare_images(ChangePair(str(i), Path("<before>"), Path("<after>")), b, a,
                                                    index=i))
            results.extend(self.generate(prepared, attention=attention))
        return results[0] if single else results
