"""The paper's model: InstructBLIP (EVA ViT + Q-Former + LLaMA/Vicuna), a Q-Former family wrapped by
:class:`davir.models.vlm.instructblip.DavirModel`.

Both images pass the shared ViT and Q-Former; their query tokens are placed before the prompt in the LLM's
``inputs_embeds``; FAC supervises the last ViT layer's [CLS]→patch attention (Eq. 5). Presets ``tiny`` and
``vicuna7b`` (``davir.models.presets``); LoRA as App. B (``davir.models.vlm.lora``).

Another Q-Former family (the same transformers classes with other presets or image statistics) subclasses
:class:`InstructBlipFamily`, sets its ``name`` and what differs, and registers one instance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    BlipImageProcessor,
    InstructBlipConfig,
    InstructBlipForConditionalGeneration,
    InstructBlipProcessor,
)
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

from davir.config import ConfigError
from davir.errors import DataError
from davir.io import read_json
from davir.models.families import FAMILIES
from davir.models.families.base import build_from_preset
from davir.models.presets import preset_registry
from davir.models.tokenizer import build_word_tokenizer
from davir.models.vlm.config import DTYPES, EXTRA_TRAINABLE_PARTS, DavirModelConfig
from davir.models.vlm.instructblip import DavirModel


class InstructBlipFamily:
    """A Q-Former family: what differs between two of them is said by these attributes."""

    name = "instructblip"
    model_type = "instructblip"  # config.json "model_type" of a real folder of this family
    davir_class = DavirModel  # the DAVIR model around this family's core
    model_class = InstructBlipForConditionalGeneration
    processor_class = InstructBlipProcessor
    config_class = InstructBlipConfig
    presets: dict[str, Callable[..., InstructBlipConfig]] = preset_registry
    image_mean: Sequence[float] = OPENAI_CLIP_MEAN  # a preset's image processor (a real folder brings its own)
    image_std: Sequence[float] = OPENAI_CLIP_STD
    trainable_parts = {part: part for part in EXTRA_TRAINABLE_PARTS}  # model.extra_trainable names
    segment_embeddings = True  # model.segment_embeddings is available
    fac_reads = "the last ViT layer's [CLS]→patch attention (Eq. 5), 16×16 patches at 224 px"

    # ------------------------------------------------------------------------------------------------ loading
    def check_pretrained_folder(self, path: Path) -> None:
        """A clear error, before transformers' own, when ``path`` is not a local model + processor of this family."""
        if not path.is_dir():
            raise DataError(
                f"pretrained InstructBLIP folder not found: {path} (models are never downloaded; give a local folder)"
            )
        missing = []
        if not (path / "config.json").is_file():
            missing.append("config.json (model)")
        if not any((path / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")):
            missing.append("preprocessor_config.json or processor_config.json (image processor)")
        if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
            missing.append("tokenizer.json or tokenizer.model (LLM tokenizer)")
        if missing:
            raise DataError(
                f"{path} is not a saved InstructBLIP model + processor: missing {', '.join(missing)} "
                "(expected the files of InstructBlipForConditionalGeneration.save_pretrained and "
                "InstructBlipProcessor.save_pretrained, "
                "e.g. a local copy of Salesforce/instructblip-vicuna-7b)"
            )
        found = read_json(path / "config.json").get("model_type")
        if found != self.model_type:
            raise DataError(
                f"{path} holds a {found!r} model, not {self.model_type!r}: model.family={self.name} "
                f"needs a {self.name} folder (or set model.family to the family of this folder)"
            )

    def load_processor(self, path: Path) -> InstructBlipProcessor:
        return self.processor_class.from_pretrained(str(path), local_files_only=True)

    def load_architecture(self, path: Path) -> InstructBlipConfig:
        return self.config_class.from_pretrained(str(path), local_files_only=True)

    def load_core(self, config: DavirModelConfig, device: torch.device) -> InstructBlipForConditionalGeneration:
        """The model of the local folder ``config.pretrained`` on ``device`` (checked first)."""
        from davir.models.vlm.checkpoint import load_folder_weights

        path = Path(config.pretrained)
        self.check_pretrained_folder(path)
        core = load_folder_weights(
            path,
            lambda: self.model_class.from_pretrained(
                str(path),
                local_files_only=True,
                dtype=DTYPES[config.dtype],
                attn_implementation=config.attn_implementation,
            ),
        )
        vision = core.config.vision_config
        for name, wanted, actual in (
            ("image_size", config.image_size, vision.image_size),
            ("patch_size", config.patch_size, vision.patch_size),
        ):
            if wanted is not None and wanted != actual:
                raise ConfigError(f"{name}={wanted} but the pretrained model at {path} was built for {actual}")
        return core.to(device)

    def random_core(
        self, architecture: InstructBlipConfig, config: DavirModelConfig, device: torch.device
    ) -> InstructBlipForConditionalGeneration:
        """Random weights, reproducible from ``config.seed``, built directly on ``device``."""
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
            torch.manual_seed(config.seed)
            core = self.model_class._from_config(
                architecture, attn_implementation=config.attn_implementation, dtype=DTYPES[config.dtype]
            )
            # HF initialises the query tokens to zeros (they come from a checkpoint); identical queries would stay
            # identical under training, so draw them like LAVIS does (normal, std = Q-Former initializer_range).
            with torch.no_grad():
                core.query_tokens.normal_(mean=0.0, std=architecture.qformer_config.initializer_range)
        return core

    def build_core(
        self, config: DavirModelConfig, captions_for_tokenizer: Sequence[str] | None, target: torch.device
    ) -> tuple[InstructBlipForConditionalGeneration, InstructBlipProcessor]:
        """(core, processor) for a new model: the local folder ``config.pretrained``, or a seeded preset whose
        word-level tokenizer is learned from ``captions_for_tokenizer`` (the training captions)."""
        if config.pretrained is not None:
            path = Path(config.pretrained)
            self.check_pretrained_folder(path)
            return self.load_core(config, target), self.load_processor(path)
        if not captions_for_tokenizer:
            raise ValueError(
                f"preset {config.preset!r} has random weights and needs captions_for_tokenizer "
                "(the training captions) to learn its word-level vocabulary"
            )
        epc = config.epc
        tokenizer = build_word_tokenizer([*captions_for_tokenizer, epc.prompt, epc.entity_prefix])
        processor = self.processor_class(
            image_processor=self.image_processor(64),  # replaced below once the image size is known
            tokenizer=tokenizer,
            qformer_tokenizer=tokenizer,
            num_query_tokens=None,
        )
        architecture = self.build_preset(
            config.preset,
            vocab_size=len(tokenizer),  # after the processor added its "<image>" token
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            image_size=config.image_size,
            patch_size=config.patch_size,
            **config.preset_overrides,
        )
        processor.image_processor = self.image_processor(architecture.vision_config.image_size)
        processor.num_query_tokens = architecture.num_query_tokens
        return self.random_core(architecture, config, target), processor

    # ------------------------------------------------------------------------------------------------ presets
    def build_preset(self, name: str, **kwargs: Any) -> InstructBlipConfig:
        """``presets[name](**kwargs)`` with a clear error for an unknown name or override."""
        return build_from_preset(self.presets, name, family=self.name, **kwargs)

    def image_processor(self, image_size: int) -> BlipImageProcessor:
        """InstructBLIP's own preprocessing: bicubic resize to S×S, rescale to [0, 1], the family's mean/std."""
        return BlipImageProcessor(
            do_resize=True,
            size={"height": image_size, "width": image_size},
            resample=PILImageResampling.BICUBIC,
            do_rescale=True,
            do_normalize=True,
            image_mean=list(self.image_mean),
            image_std=list(self.image_std),
            do_convert_rgb=True,
        )


def clip_image_processor(image_size: int) -> BlipImageProcessor:
    """InstructBLIP's preset image processor (CLIP mean/std) at ``image_size``."""
    return FAMILY.image_processor(image_size)


FAMILY = FAMILIES.register("instructblip", InstructBlipFamily())
