"""DAVIR as a task of the training loop: InstructBLIP + LoRA, FAC change masks, EPC entity prompts."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator

from davir.data.caches import EntityCache, MaskCache, check_cache_root
from davir.data.dataset import ChangeCaptionDataset, EntityField, ImageField, MaskField, RecordMasks
from davir.data.formats import read_dataset
from davir.errors import DataError
from davir.preprocessing.profiles import check_cache_profiles
from davir.training.tasks import flat_scalars, move_to_device, register_task, require_cached


@register_task("davir")
class DavirTask:
    """InstructBLIP + LoRA with FAC (change masks → attention KL) and EPC (entities in the prompt)."""

    def __init__(self, config, accelerator: Accelerator):
        from davir.models.vlm.build import build_davir_model

        self.config = config
        self.accelerator = accelerator
        data, model_config = config.data, config.model
        train_pairs = read_dataset(data.format, data.root, data.train_split).pairs
        if data.max_train_pairs:
            train_pairs = train_pairs[: data.max_train_pairs]
        val_pairs = read_dataset(data.format, data.root, data.val_split).pairs[: config.run.val_max_pairs]
        fac_cache = data.masks if model_config.fac.lambda_attn > 0 and data.fac_masks == "cache" else None
        for key, cache in (
            ("data.masks", fac_cache),
            ("data.entities", data.entities if model_config.epc.use_entities else None),
        ):
            if cache is not None:  # before the model is built: a wrong cache stops the run at once
                check_cache_root(cache, data.root, key=key, moved_from=data.moved_from)
        # Still before the (7B) model is built: caches of another preprocessing profile are refused.
        check_cache_profiles(
            data.preprocessing_profile,
            masks=fac_cache,
            entities=data.entities if model_config.epc.use_entities else None,
            allow_mismatch=data.allow_profile_mismatch,
            warn=accelerator.print,
            where="data.preprocessing_profile of this config",
            entity_level="region",
        )
        if model_config.fac.lambda_attn > 0 and data.fac_masks == "ground_truth":  # also before the model
            record_masks = RecordMasks([*train_pairs, *val_pairs])
            for split, pairs in ((data.train_split, train_pairs), (data.val_split, val_pairs)):
                missing = [p.pair_id for p in pairs if not record_masks.has(p.pair_id)]
                if missing:
                    raise DataError(
                        f"data.fac_masks=ground_truth, but {len(missing)} of {len(pairs)} {split} pairs "
                        f"of {data.root} have no ground-truth change mask (first: {missing[:3]}): give "
                        "a `mask` column in the manifest (or masks/NAME.png beside before/ and after/), "
                        "or use the computed masks (data.fac_masks=cache, data.masks=CACHE)"
                    )
        self.model = build_davir_model(
            model_config,
            captions_for_tokenizer=[c for p in train_pairs for c in p.captions],
            device=accelerator.device,
            imports=config.imports,
        )
        self._note_cut_references([c for p in train_pairs for c in p.captions])
        fields: list = [ImageField(self.model.image_processor, size_policy=data.size_policy)]
        source = (
            f"python -m preprocess {{cmd}} --format {data.format} --root {data.root} --split {{split}} --out {{out}}"
        )
        self.uses_fac = model_config.fac.lambda_attn > 0
        self.uses_entities = model_config.epc.use_entities
        if self.uses_fac and data.fac_masks == "ground_truth":
            fields.append(MaskField(record_masks, size=self.model.image_size, source=model_config.fac.mask_source))
        elif self.uses_fac:
            if data.masks is None:
                raise DataError(
                    "FAC is on (model.fac.lambda_attn > 0) but data.masks is not set: run "
                    f"`{source.format(cmd='masks', split=data.train_split, out='CACHE')}` (and for "
                    f"{data.val_split}), then set data.masks=CACHE — or model.fac.lambda_attn=0"
                )
            masks = MaskCache(data.masks)
            for split, pairs in ((data.train_split, train_pairs), (data.val_split, val_pairs)):
                require_cached(
                    pairs,
                    masks.has,
                    what=f"change mask in {data.masks}",
                    command=source.format(cmd="masks", split=split, out=data.masks),
                )
            fields.append(MaskField(masks, size=self.model.image_size, source=model_config.fac.mask_source))
        if self.uses_entities:
            if data.entities is None:
                raise DataError(
                    "EPC is on (model.epc.use_entities) but data.entities is not set: run "
                    f"`{source.format(cmd='entities', split=data.train_split, out='CACHE')} --masks MASKS`, "
                    "then set data.entities=CACHE — or model.epc.use_entities=false"
                )
            entities = EntityCache(data.entities)
            for split, pairs in ((data.train_split, train_pairs), (data.val_split, val_pairs)):
                require_cached(
                    pairs,
                    entities.has,
                    what=f"retrieved entities in {data.entities}",
                    command=source.format(cmd="entities", split=split, out=data.entities) + f" --masks {data.masks}",
                )
            fields.append(EntityField(entities, top_k=model_config.epc.num_entities))
        self.train_dataset = ChangeCaptionDataset(
            train_pairs, fields, caption_mode=data.caption_mode, seed=config.run.seed, require_captions=True
        )
        self.val_dataset = ChangeCaptionDataset(val_pairs, fields, seed=config.run.seed)

    def _note_cut_references(self, captions: list[str]) -> None:
        """One line when training references exceed the caption budget: they would be cut without a word."""
        budget = self.model.config.max_caption_tokens - 1  # the end-of-sentence token takes the last place
        lengths = self.model.caption_lengths(captions)
        cut = sum(1 for length in lengths if length > budget)
        if cut:
            one = cut == 1
            self.accelerator.print(
                f"note: {cut} of {len(lengths)} training references {'is' if one else 'are'} longer than "
                f"model.max_caption_tokens={budget + 1} allows ({budget} tokens and the end of sentence; the longest "
                f"has {max(lengths)}): training sees only {'its' if one else 'their'} first {budget} tokens"
            )

    def unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def to_device(self, batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
        return move_to_device(batch, device)

    def after_optimizer_step(self) -> None:
        """Nothing to do for DAVIR (the lightweight methods clamp their logit scales here)."""

    def prompts(self, batch: dict[str, Any]) -> list[str]:
        return self.unwrapped().build_prompts(batch.get("entities"), batch_size=len(batch["pair_id"]))

    def training_losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        output = self.model(
            pixel_before=batch["pixel_before"],
            pixel_after=batch["pixel_after"],
            prompts=self.prompts(batch),
            captions=batch["caption"],
            masks_before=batch.get("mask_before"),
            masks_after=batch.get("mask_after"),
            mask_valid=batch.get("mask_valid"),
        )
        losses = {"loss": output.loss, "caption_loss": output.caption_loss}
        if output.attn_loss is not None:
            losses["attn_loss"] = output.attn_loss
        return losses

    @torch.no_grad()
    def generate(
        self, batch: dict[str, Any], *, max_new_tokens: int = 30, num_beams: int = 1, **generate_kwargs: Any
    ) -> list[str]:
        return self.unwrapped().generate(
            batch["pixel_before"],
            batch["pixel_after"],
            self.prompts(batch),
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            **generate_kwargs,
        )

    def save_pretrained(self, directory) -> None:
        self.unwrapped().save_pretrained(directory)

    def tracker_config(self) -> dict:
        return flat_scalars(self.config)
