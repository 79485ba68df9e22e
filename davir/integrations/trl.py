"""DAVIR's FAC (and EPC prompts) inside TRL's ``SFTTrainer``, for the chat families of davir's registry.

    trainer = DavirSFTTrainer(model=model, args=SFTConfig(..., remove_unused_columns=False), train_dataset=dataset,
                              processing_class=processor,
                              davir=DavirTrlSettings(family="qwen2_5_vl", image_size=448, masks="caches/masks",
                                                     entities="caches/entities", fac=FacConfig(lambda_attn=0.1)))
    trainer.train()       # logs loss, attn_loss (Eq. 7) and fac_pairs beside TRL's own metrics

The collator, the tokens scored and the loss (Eq. 12): docs/toolkits.md, "FAC and EPC in TRL's `SFTTrainer`".
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from PIL import Image

from davir.data.caches import EntityCache, MaskCache
from davir.data.images import load_rgb, to_rgb, upright
from davir.errors import DataError, import_optional
from davir.integrations.prompts import epc_prompt_for
from davir.models.families import get_family
from davir.models.families.base import ChatFamily
from davir.models.losses import FacConfig, davir_total_loss, fac_attention_loss
from davir.models.vlm.epc import EpcConfig

# TRL is not a dependency of davir: without it, one line naming the extra davir[trl] instead of a traceback.
_sft = import_optional("trl.trainer.sft_trainer", needed_by="davir.integrations.trl")
SFTTrainer, DataCollatorForVisionLanguageModeling = _sft.SFTTrainer, _sft.DataCollatorForVisionLanguageModeling

MASK_KEYS = ("davir_masks_before", "davir_masks_after", "davir_mask_valid")
MASKS_COMMAND = "python -m preprocess masks --format F --root R --split S --out CACHE"
ENTITIES_COMMAND = "python -m preprocess entities --format F --root R --split S --masks MASKS --out CACHE"
log = logging.getLogger(__name__)


@dataclass
class DavirTrlSettings:
    """What davir adds to an SFTTrainer run.

    * ``family``: a chat family of davir's registry (qwen2_5_vl, llava_onevision, smolvlm).
    * ``image_size``: S, every picture resized to S×S (None: the family's default for a pretrained folder).
    * ``masks``: a davir mask cache (``python -m preprocess masks``); None turns FAC off.
    * ``entities``: a davir entity cache; the user turn's text becomes the EPC prompt of the pair (``epc``).
    * ``fac``: FAC's settings and λ (``lambda_attn``; 0 turns it off).
    * ``id_key``: the dataset column holding the pair id.
    """

    family: str = "qwen2_5_vl"
    image_size: int | None = None
    masks: str | Path | None = None
    entities: str | Path | None = None
    fac: FacConfig = field(default_factory=FacConfig)
    epc: EpcConfig = field(default_factory=EpcConfig)
    id_key: str = "id"

    def __post_init__(self) -> None:
        # 0 would read as "not given" further on and silently give the family's default size
        if self.image_size is not None and (
            isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or self.image_size < 1
        ):
            raise ValueError(
                f"DavirTrlSettings image_size must be a whole number of pixels >= 1 or None, got {self.image_size!r}"
            )


def _open(image: Any, pair_id: str) -> Image.Image:
    """One picture of a pair, upright RGB as every davir reader gives it (EXIF orientation applied, as the mask
    cache's masks were made): a path through ``load_rgb``, a PIL image or ``{"bytes"}`` through ``upright``."""
    if isinstance(image, dict):  # datasets.Image not decoded: {"path", "bytes"}
        if image.get("bytes"):
            with Image.open(io.BytesIO(image["bytes"])) as opened:
                opened.load()
                return to_rgb(upright(opened))
        image = image.get("path")
    if isinstance(image, Image.Image):  # an image datasets decoded is upright already: upright() leaves it as is
        return to_rgb(upright(image))
    if not isinstance(image, (str, Path)):
        raise DataError(f"pair {pair_id!r}: an image must be a PIL image or a path, got {type(image).__name__}")
    return load_rgb(Path(image), record=pair_id)


def open_mask_cache(path: str | Path) -> MaskCache:
    """The mask cache at ``path``; a path that is no mask cache (a typo) is a DataError, never FAC silently off."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"masks={str(path)!r}: no such folder; FAC reads a davir mask cache (`{MASKS_COMMAND}`)")
    cache = MaskCache(path)
    if not cache.folder.is_dir() and not (path / "manifest.json").is_file():
        raise DataError(
            f"masks={str(path)!r}: not a davir mask cache (no masks/ folder or manifest.json); make one "
            f"with `{MASKS_COMMAND}`"
        )
    return cache


def open_entity_cache(path: str | Path) -> EntityCache:
    """The entity cache at ``path``; a path that is no entity cache (a typo) is a DataError at construction, not
    at the first batch with advice to fill the mistyped folder."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(
            f"entities={str(path)!r}: no such folder; EPC reads a davir entity cache (`{ENTITIES_COMMAND}`)"
        )
    cache = EntityCache(path)
    if not cache.folder.is_dir():
        raise DataError(
            f"entities={str(path)!r}: not a davir entity cache (no entities/ folder); make one with "
            f"`{ENTITIES_COMMAND}`"
        )
    return cache


def mask_coverage(cache: MaskCache, pair_ids) -> dict:
    """How many of the distinct ``pair_ids`` have an entry in ``cache`` (the rest are left out of FAC)."""
    pairs = set(map(str, pair_ids))
    missing = sorted(pair_id for pair_id in pairs if not cache.has(pair_id))
    return {"pairs": len(pairs), "with_masks": len(pairs) - len(missing), "missing": missing}


def _square_mask(mask: np.ndarray | None, size: int) -> torch.Tensor | None:
    """A boolean mask (any resolution) as the share of each pixel of the S×S picture it covers."""
    if mask is None:
        return None
    picture = Image.fromarray(np.asarray(mask, dtype=np.float32), mode="F").resize((size, size), Image.BOX)
    return torch.from_numpy(np.asarray(picture, dtype=np.float32).copy()).clamp_(0, 1)


def _split_turns(messages: Any, pair_id: str) -> tuple[list, list]:
    """A ``messages`` conversation as (prompt, completion): the turns before the last assistant turn, and that turn
    (so TRL's completion-only loss scores the answer alone)."""
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages] if isinstance(messages, list) else []
    if "assistant" not in roles:
        raise DataError(f"pair {pair_id!r}: 'messages' must end with an assistant turn (the caption)")
    last = len(roles) - 1 - roles[::-1].index("assistant")
    return messages[:last], messages[last:]


class DavirFacCollator:
    """TRL's collator with davir's pair handling around it: S×S pictures, EPC prompts, change masks by pair id.

    Adds ``davir_masks_before``/``davir_masks_after`` (B, S, S) and ``davir_mask_valid`` (B,) to the batch when a
    mask cache is given (a pair missing from the cache is left out of FAC, never given an empty target). A
    ``messages`` example is passed on as prompt + completion; with ``end_token_id`` (completion-only loss) the
    labels stop at the caption's end of turn."""

    def __init__(
        self,
        collator,
        *,
        image_size: int,
        masks: str | Path | None = None,
        entities: str | Path | None = None,
        epc: EpcConfig | None = None,
        id_key: str = "id",
        end_token_id: int | None = None,
    ) -> None:
        self.collator = collator
        self.end_token_id = end_token_id
        self.image_size = image_size
        self.masks = open_mask_cache(masks) if masks is not None else None
        self.entities = open_entity_cache(entities) if entities is not None else None
        self.prompt_for = epc_prompt_for(self.entities, epc) if entities is not None else None
        self.id_key = id_key

    def _examples(self, examples: Sequence[dict]) -> tuple[list[dict], list[str]]:
        ready, ids = [], []
        size = (self.image_size, self.image_size)
        for example in examples:
            example = dict(example)
            if self.id_key not in example:
                raise DataError(
                    f"a training example has no {self.id_key!r} column (the pair id FAC and EPC read): "
                    "export the dataset with `python -m davir.data export --to trl`, and keep the "
                    "column (SFTConfig(remove_unused_columns=False) or DavirSFTTrainer)"
                )
            ids.append(str(example.pop(self.id_key)))
            images = example.get("images")
            if not isinstance(images, list) or len(images) != 2:
                raise DataError(f"pair {ids[-1]!r}: 'images' must hold two pictures, before then after")
            example["images"] = [_open(image, ids[-1]).resize(size, Image.Resampling.BICUBIC) for image in images]
            if "messages" in example and "prompt" not in example:
                example["prompt"], example["completion"] = _split_turns(example.pop("messages"), ids[-1])
            if self.prompt_for is not None:
                example["prompt"] = self._with_prompt(example["prompt"], self.prompt_for(ids[-1]))
            ready.append(example)
        return ready, ids

    @staticmethod
    def _with_prompt(messages: list[dict], prompt: str) -> list[dict]:
        """The first user turn's text part replaced by ``prompt`` (image parts kept in place)."""
        out, done = [], False
        for message in messages:
            if message["role"] == "user" and not done and isinstance(message["content"], list):
                parts = [part for part in message["content"] if part.get("type") != "text"]
                message = {**message, "content": [*parts, {"type": "text", "text": prompt}]}
                done = True
            out.append(message)
        return out

    def _mask_tensors(self, ids: Sequence[str]) -> dict[str, torch.Tensor]:
        size = self.image_size
        before = torch.zeros(len(ids), size, size)
        after = torch.zeros(len(ids), size, size)
        valid = torch.zeros(len(ids), dtype=torch.bool)
        for row, pair_id in enumerate(ids):
            if not self.masks.has(pair_id):
                continue
            entry = self.masks.read(pair_id)
            union = entry.union
            before[row] = _square_mask(entry.before if entry.before is not None else union, size)
            after[row] = _square_mask(entry.after if entry.after is not None else union, size)
            valid[row] = True
        return dict(zip(MASK_KEYS, (before, after, valid)))

    def __call__(self, examples: Sequence[dict]) -> dict[str, Any]:
        ready, ids = self._examples(examples)
        batch = self.collator(ready)
        if self.end_token_id is not None and "labels" in batch:  # nothing after the caption's end of turn
            labels = batch["labels"]
            ends = labels == self.end_token_id
            labels[(ends.cumsum(dim=1) - ends.long()) > 0] = -100
        if self.masks is not None:
            batch.update(self._mask_tensors(ids))
        return batch


class DavirSFTTrainer(SFTTrainer):
    """TRL's ``SFTTrainer`` with FAC's attention term (Eq. 12) and EPC prompts; ``davir`` holds the settings.

    Everything else — the model, PEFT, the optimizer, logging, checkpoints, accelerate — is TRL's. The FAC map is
    read from the first vision pass of each ``compute_loss`` (the one with gradients)."""

    def __init__(self, *args, davir: DavirTrlSettings | None = None, **kwargs) -> None:
        self.davir = davir or DavirTrlSettings()
        self.family = get_family(self.davir.family)
        if not isinstance(self.family, ChatFamily):
            raise ValueError(
                f"model family {self.davir.family!r} is not a chat model; TRL's SFTTrainer trains the "
                "chat families (qwen2_5_vl, llava_onevision, smolvlm)"
            )
        super().__init__(*args, **kwargs)
        core = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        # the family's S for a pretrained folder (or davir.image_size), checked against the model's patch grid
        probe = SimpleNamespace(image_size=self.davir.image_size, pretrained=True, preset=None)
        self.image_size = self.family.input_size(probe, core.config)
        self.patch_grid = self.family.patch_grid(self.image_size, core.config)
        end = None
        if (
            isinstance(self.data_collator, DataCollatorForVisionLanguageModeling)
            and self.args.completion_only_loss is not False
        ):
            self.data_collator.completion_only_loss = True  # a `messages` dataset arrives as prompt + completion
            end = self.processing_class.tokenizer.convert_tokens_to_ids(self.family.end_of_turn)
        self.data_collator = DavirFacCollator(
            self.data_collator,
            image_size=self.image_size,
            masks=self.davir.masks,
            entities=self.davir.entities,
            epc=self.davir.epc,
            id_key=self.davir.id_key,
            end_token_id=end,
        )
        self.fac_coverage = self._check_coverage()
        self._check_entities()
        self._captured: list[Any] = []
        self.attention_hook = self.family.attention_hook(core).attach()  # after PEFT: sees the LoRA projections
        self._vision_handle = self.family.vision_tower(core).register_forward_hook(self._keep_attention)

    def _check_coverage(self) -> dict | None:
        """At start: how many training pairs have a change mask. None has: a DataError (the wrong cache or
        dataset); some lack one: a warning with the count (they train without FAC's term)."""
        cache = self.data_collator.masks
        dataset = self.train_dataset
        if (
            cache is None
            or self.davir.fac.lambda_attn <= 0
            or self.davir.id_key not in (getattr(dataset, "column_names", None) or ())
        ):
            return None
        coverage = mask_coverage(cache, dataset[self.davir.id_key])
        where = f"the mask cache {cache.root}"
        if coverage["pairs"] and not coverage["with_masks"]:
            raise DataError(
                f"masks={str(cache.root)!r}: none of the {coverage['pairs']} training pairs has a change "
                f"mask in it (first id {coverage['missing'][0]!r}): another dataset's cache? Make it with "
                f"`{MASKS_COMMAND}` for this dataset"
            )
        if coverage["missing"]:
            log.warning(
                "FAC: %d of %d training pairs have no change mask in %s and train without FAC's term (first: %s)",
                len(coverage["missing"]),
                coverage["pairs"],
                where,
                ", ".join(coverage["missing"][:5]),
            )
        return coverage

    def _check_entities(self) -> None:
        """At start: every training pair has entities in the entity cache (EPC's prompt needs them; a pair
        without stops training at its batch)."""
        cache = self.data_collator.entities
        dataset = self.train_dataset
        if cache is None or self.davir.id_key not in (getattr(dataset, "column_names", None) or ()):
            return
        pairs = set(map(str, dataset[self.davir.id_key]))
        missing = sorted(pair_id for pair_id in pairs if not cache.has(pair_id))
        if missing:
            raise DataError(
                f"entities={str(cache.root)!r}: {len(missing)} of {len(pairs)} training pairs have no entities in "
                f"it (first: {', '.join(missing[:5])}): another dataset's cache, or a split it was not run on? "
                f"Make it with `{ENTITIES_COMMAND}` for each split of this dataset"
            )

    def _keep_attention(self, module, inputs, output) -> None:
        captured = self.attention_hook.pop(missing_ok=True)
        if captured is not None:
            self._captured.append(captured)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if self.davir.id_key not in self._signature_columns:  # the pair id reaches the collator
            self._signature_columns = [*self._signature_columns, self.davir.id_key]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        masks = [inputs.pop(key, None) for key in MASK_KEYS]
        self._captured.clear()
        result = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        fac = self.davir.fac
        if masks[0] is None or fac.lambda_attn <= 0:
            return result
        loss, outputs = result if return_outputs else (result, None)
        if not self._captured:
            raise RuntimeError("the FAC attention hook did not fire: the batch reached no vision layer")
        pairs = masks[0].shape[0]
        maps = self.family.attention_maps(self._captured[0], 2 * pairs, self.patch_grid)
        if torch.is_grad_enabled() and self.model.training and not maps.requires_grad:
            raise RuntimeError(
                "FAC's attention map has no gradient: the vision layer ran without autograd (reentrant "
                "gradient checkpointing?); use gradient_checkpointing_kwargs={'use_reentrant': False}"
            )
        attn = fac_attention_loss(maps[0::2], maps[1::2], masks[0], masks[1], masks[2], fac)
        attn_loss = attn.loss
        if num_items_in_batch is not None:  # TRL's loss is a share of the accumulated batch: so is this term
            attn_loss = attn_loss / self.current_gradient_accumulation_steps
        loss = davir_total_loss(loss, attn_loss, fac.lambda_attn)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["attn_loss"].append(float(attn.loss.detach()))
        self._metrics[mode]["fac_pairs"].append(float(attn.num_pairs))
        return (loss, outputs) if return_outputs else loss
