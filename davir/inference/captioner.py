"""Caption image pairs with any trained model, predictor-style (as segment-anything's `SamPredictor`).

    from davir import ChangeCaptioner
    captioner = ChangeCaptioner.from_pretrained("runs/demo", num_beams=3, device="cpu")  # CaptionerOptions fields
    captioner.caption("before.png", "after.png").caption              # paths, PIL images or arrays
    captioner.caption_records(pairs, batch_size=16)                    # ChangePair records, in batches

`prepare(pair)` (CPU) then `generate(prepared)` (batched): docs/recipes.md, "One captioning stack".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from davir.config import replace_fields
from davir.data.images import array_to_rgb, load_pair, to_rgb
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.inference.engines import DavirEngine, LightweightEngine, load_engine
from davir.io import path_record
from davir.runs.paths import RunPaths, run_decoding
from davir.runtime.devices import check_device

ENTITIES_KEPT = 5  # entities reported per pair (the prompt uses the model's top-k of them)
LOAD_MAX_SIDE = 1024  # images are decoded at no more than ~this long side (the masks work at 224, the models at ≤ 224)


ENGINES = ("transformers", "vllm")


@dataclass
class CaptionerOptions:
    """What `ChangeCaptioner.from_pretrained` may change from the run's own settings.

    The `*_from` / `pretrained` / `*_checkpoint` / `backbone_weights` paths replace what the run recorded (a run
    moved to another machine); decoding (`num_beams`, `max_new_tokens`) defaults to the run's own (the decoding
    its best/ was selected with)."""

    device: str | torch.device | None = None  # None: CUDA when there is one
    masks_from: str | Path | None = None  # mask cache whose settings to reuse (the run's data.masks)
    entities_from: str | Path | None = None  # entity cache: vocabulary and retriever (data.entities)
    pretrained: str | Path | None = None  # the base InstructBLIP folder (the model's `pretrained`)
    base_model: str | Path | None = None  # the same (the name an exported adapter folder uses)
    sam_checkpoint: str | Path | None = None  # SAM weights, when the mask cache was made with SAM
    clip_checkpoint: str | Path | None = None  # open_clip weights, when the entity cache used CLIP
    backbone_weights: str | Path | None = None  # ResNet-101 weights of a lightweight model
    num_beams: int | None = None
    max_new_tokens: int | None = None
    size_policy: str = "resize_before_to_after"  # or "error": before/after of different sizes fail the pair
    max_side: int | None = LOAD_MAX_SIDE  # decode images no larger than needed (None: full size)
    allow_profile_mismatch: bool = False  # accept caches of another preprocessing profile
    engine: str = "transformers"  # or "vllm": a merged export on a GPU (davir/inference/vllm_engine.py)
    merge_lora: bool = True  # fold LoRA into the base weights in memory (faster; files untouched)
    static_decode: bool = False  # static KV cache; on a GPU the decode step compiled (CUDA graphs)

    def check_paths(self) -> None:
        """The folders given here exist and the device is one this machine has (a DataError naming the flag
        otherwise), before any work."""
        if self.device is not None:
            check_device(self.device)
        if self.engine not in ENGINES:
            raise DataError(f"--engine {self.engine}: choose one of {', '.join(ENGINES)}")
        if self.masks_from is not None and not Path(self.masks_from).is_dir():
            raise DataError(
                f"--masks-from {self.masks_from}: no such folder (a mask cache written by "
                "`python -m preprocess masks --out …`)"
            )
        if self.entities_from is not None and not Path(self.entities_from).is_dir():
            raise DataError(
                f"--entities-from {self.entities_from}: no such folder (an entity cache written by "
                "`python -m preprocess entities --out …`)"
            )
        if self.pretrained is not None and not Path(self.pretrained).exists():
            raise DataError(f"--pretrained {self.pretrained}: no such folder")
        if self.base_model is not None and not Path(self.base_model).exists():
            raise DataError(f"--base-model {self.base_model}: no such folder")


def options_with(options: CaptionerOptions | None, overrides: dict) -> CaptionerOptions:
    """`options` (or the defaults) with `overrides` replaced; an unknown name is a TypeError listing the valid ones."""
    return replace_fields(CaptionerOptions, options, overrides, what="captioner")


@dataclass
class CaptionResult:
    """One pair's caption (or why it has none), the retrieved entities and, on request, attention maps."""

    pair_id: str
    caption: str | None = None
    entities: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None
    attention_before: np.ndarray | None = None  # (Hp, Wp), sums to 1 (DAVIR, with `attention=True`)
    attention_after: np.ndarray | None = None


@dataclass
class PreparedPair:
    """The CPU stage of one pair (picklable: it crosses from DataLoader workers)."""

    pair: ChangePair
    index: int = 0
    inputs: object = None  # the engine's model inputs
    entities: list[tuple[str, float]] = field(default_factory=list)
    before: Image.Image | None = None  # kept only when `keep_images` (the report's sample)
    after: Image.Image | None = None
    mask: np.ndarray | None = None  # union change mask (after frame), when computed
    error: str | None = None


def _as_image(image, name: str) -> Image.Image:
    if isinstance(image, Image.Image):
        return to_rgb(image)
    if isinstance(image, np.ndarray):
        return array_to_rgb(image, name=name)
    raise TypeError(f"{name}: expected a path, a PIL image or an array, got {type(image).__name__}")


class ChangeCaptioner:
    """A trained model with the sources of what it reads besides the images; see the module docstring.

    `masks`: OnlineMasks (DAVIR's region-level entities and the report), `entities`: an EntitySource (the
    model trained with entities needs one); a lightweight engine carries its FeatureSource."""

    def __init__(
        self,
        engine: DavirEngine | LightweightEngine,
        masks=None,
        entities=None,
        *,
        run: RunPaths,
        num_beams: int = 1,
        max_new_tokens: int = 30,
        size_policy: str = "resize_before_to_after",
        max_side: int | None = LOAD_MAX_SIDE,
    ):
        if engine.uses_entities and entities is None:
            raise ValueError(f"{run.model_dir} was trained with entities: give an entity source")
        self.engine, self.masks, self.entities, self.run = engine, masks, entities, run
        self.num_beams, self.max_new_tokens = num_beams, max_new_tokens
        self.size_policy, self.max_side = size_policy, max_side

    @classmethod
    def from_pretrained(
        cls, checkpoint: str | Path, options: CaptionerOptions | None = None, **overrides
    ) -> ChangeCaptioner:
        """A run folder (its best/, else last/) or a saved model folder, DAVIR or lightweight, for new pairs.

        `overrides` are fields of `CaptionerOptions` (an unknown name is a TypeError). A recorded path that
        cannot be found is a DataError naming the flag. The mask and entity caches must be of the
        preprocessing profile the run trained on unless `allow_profile_mismatch`.
        """
        from davir.preprocessing.online import OnlineEntities, OnlineMasks
        from davir.preprocessing.profiles import check_cache_profiles

        options = options_with(options, overrides)
        options.check_paths()
        run = RunPaths.of(checkpoint)
        device = options.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if options.engine == "vllm":
            from davir.inference.vllm_engine import VllmEngine

            engine = VllmEngine.load(run, num_beams=options.num_beams)
        else:
            engine = load_engine(
                run,
                device,
                pretrained=options.pretrained or options.base_model,
                backbone_weights=options.backbone_weights,
                merge_lora=options.merge_lora,
                static_decode=options.static_decode,
            )
        entities, entity_dir, mask_dir = None, None, None
        if engine.uses_entities:
            entity_dir = options.entities_from or run.resolve(
                run.data.get("entities"), what="entity cache (data.entities)", flag="--entities-from"
            )
            if entity_dir is None:
                raise DataError(
                    f"{run.model_dir} was trained with entities: pass --entities-from CACHE (the folder "
                    "`python -m preprocess entities --out CACHE` wrote for its training data)"
                )
            entities = OnlineEntities(entity_dir, clip_checkpoint=options.clip_checkpoint)
            if isinstance(engine, LightweightEngine):  # a retrieved phrase the model lacks could caption no pair
                engine.check_vocabulary(entities.vocabulary.phrases, where=f"the entity cache {entity_dir}")
        masks = None
        if not run.lightweight:  # DAVIR's entities rank masked regions; the report shows the masks
            mask_dir = options.masks_from or run.resolve(
                run.data.get("masks"), what="mask cache (data.masks)", flag="--masks-from"
            )
            masks = OnlineMasks.from_cache(mask_dir, sam_checkpoint=options.sam_checkpoint, device=str(device))
        check_cache_profiles(
            run.data.get("preprocessing_profile"),
            masks=mask_dir if masks is not None else None,
            entities=entity_dir if entities is not None else None,
            allow_mismatch=options.allow_profile_mismatch,
            where=f"the run {run.run_dir or run.model_dir} (data.preprocessing_profile)",
            override="--allow-profile-mismatch",
            warn=lambda m: print(m, file=sys.stderr),
            entity_level="image" if run.lightweight else "region",
        )
        decoding = run_decoding(
            run.run_dir or run.model_dir, num_beams=options.num_beams, max_new_tokens=options.max_new_tokens
        )
        return cls(
            engine,
            masks,
            entities,
            run=run,
            num_beams=decoding["num_beams"],
            max_new_tokens=decoding["max_new_tokens"],
            size_policy=options.size_policy,
            max_side=options.max_side,
        )

    # ------------------------------------------------------------------------------------------------ stages
    def settings(self) -> dict:
        """What decides the captions: a rerun may reuse earlier outputs only when these are equal."""
        model_files = sorted(p for p in self.run.model_dir.rglob("*") if p.is_file())
        return {
            "model": path_record(self.run.model_dir),
            "kind": self.engine.kind,
            "model_files": {
                str(p.relative_to(self.run.model_dir)): [p.stat().st_size, int(p.stat().st_mtime)] for p in model_files
            },
            "num_beams": self.num_beams,
            "max_new_tokens": self.max_new_tokens,
            "size_policy": self.size_policy,
            "max_side": self.max_side,
            "masks": None if self.masks is None else self.masks.settings_dict(),
            "entities": None if self.entities is None else path_record(self.entities.cache_dir),
        }

    def needs_masks(self, keep_images: bool) -> bool:
        return self.masks is not None and (keep_images or (self.entities is not None and self.entities.needs_masks))

    def needs_images(self, keep_images: bool) -> bool:
        """Whether `prepare` loads the pair's images: the model, the entity source or the report reads them."""
        entities_read_them = self.entities is not None and getattr(self.entities, "needs_images", True)
        return keep_images or self.engine.needs_images or entities_read_them

    def prepare_images(
        self,
        pair: ChangePair,
        before: Image.Image | None,
        after: Image.Image | None,
        *,
        index: int = 0,
        keep_images: bool = False,
    ) -> PreparedPair:
        """Masks, entities and model inputs of a loaded pair (images None: sources that need none); a failure
        becomes the pair's `error`."""
        try:
            mask_pair = None
            before_array = None if before is None else np.asarray(before)
            after_array = None if after is None else np.asarray(after)
            if self.needs_masks(keep_images):
                mask_pair = self.masks.from_arrays(pair.pair_id, before_array, after_array)
            entities = []
            if self.entities is not None:
                kept = max(ENTITIES_KEPT, self.engine.num_entities)
                entities = [
                    (e, float(s)) for e, s in self.entities(pair.pair_id, before_array, after_array, mask_pair, kept)
                ]
            inputs = self.engine.inputs(pair, before, after, [e for e, _ in entities[: self.engine.num_entities]])
        except DataError as error:
            return PreparedPair(pair, index, error=str(error))
        except Exception as error:  # noqa: BLE001 - one odd pair must not stop 100,000 others; it is reported
            return PreparedPair(pair, index, error=f"record {pair.pair_id!r}: {type(error).__name__}: {error}")
        return PreparedPair(
            pair,
            index,
            inputs=inputs,
            entities=entities,
            before=before if keep_images else None,
            after=after if keep_images else None,
            mask=None if mask_pair is None or not keep_images else mask_pair.union,
        )

    def prepare(self, pair: ChangePair, *, index: int = 0, keep_images: bool = False) -> PreparedPair:
        """Load one pair from its files (at the working resolution) and prepare it."""
        before = after = None
        if self.needs_images(keep_images):
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
            captions, maps = self.engine.generate(
                [p.inputs for p in ready],
                [[e for e, _ in p.entities[:k]] for p in ready],
                num_beams=self.num_beams,
                max_new_tokens=self.max_new_tokens,
                attention=attention,
            )
            for i, (p, caption) in enumerate(zip(ready, captions)):
                results[id(p)] = CaptionResult(
                    p.pair.pair_id,
                    caption,
                    p.entities,
                    attention_before=maps[i][0] if maps else None,
                    attention_after=maps[i][1] if maps else None,
                )
        return [results.get(id(p)) or CaptionResult(p.pair.pair_id, error=p.error) for p in prepared]

    # -------------------------------------------------------------------------------------------- the API
    def caption_records(
        self, pairs: Sequence[ChangePair], *, batch_size: int = 16, attention: bool = False, progress: bool = False
    ) -> list[CaptionResult]:
        """Caption ChangePair records in order, `batch_size` pairs per generate call (prepared in this process)."""
        from tqdm.auto import tqdm

        results: list[CaptionResult] = []
        with tqdm(total=len(pairs), desc="caption", disable=not progress) as bar:
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start : start + batch_size]
                results.extend(
                    self.generate(
                        [self.prepare(pair, index=start + i) for i, pair in enumerate(chunk)], attention=attention
                    )
                )
                bar.update(len(chunk))
        return results

    def caption(
        self, before, after, *, batch_size: int = 16, attention: bool = False
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
                prepared.append(
                    self.prepare_images(ChangePair(str(i), Path("<before>"), Path("<after>")), b, a, index=i)
                )
            results.extend(self.generate(prepared, attention=attention))
        return results[0] if single else results
