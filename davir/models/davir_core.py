"""The InstructBLIP inside a DavirModel: a local pretrained folder (checked, never downloaded) or a seeded
random-weight preset with its word-level tokenizer, each with its `InstructBlipProcessor`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    BlipImageProcessor,
    InstructBlipConfig,
    InstructBlipForConditionalGeneration,
    InstructBlipProcessor,
)
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

from davir.errors import DataError
from davir.io import read_json
from davir.models.davir_config import DTYPES, DavirModelConfig
from davir.models.presets import build_preset_config
from davir.models.tokenizer import build_word_tokenizer


def clip_image_processor(image_size: int) -> BlipImageProcessor:
    # InstructBLIP's own preprocessing: bicubic resize to S×S, rescale to [0, 1], CLIP mean/std.
    return BlipImageProcessor(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        resample=PILImageResampling.BICUBIC,
        do_rescale=True,
        do_normalize=True,
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        do_convert_rgb=True,
    )


def check_pretrained_folder(path: Path) -> None:
    """A clear error, before transformers' own, when ``path`` is not a local InstructBLIP model + processor."""
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
    if found != "instructblip":
        raise DataError(f"{path} holds a {found!r} model, not 'instructblip': model.family=instructblip needs an "
                        "InstructBLIP folder (or set model.family to the family of this folder)")


def random_core(
    architecture: InstructBlipConfig, config: DavirModelConfig, device: torch.device
) -> InstructBlipForConditionalGeneration:
    """Random-weight InstructBLIP, reproducible from ``config.seed``, built directly on ``device``."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(config.seed)
        core = InstructBlipForConditionalGeneration._from_config(
            architecture, attn_implementation=config.attn_implementation, dtype=DTYPES[config.dtype]
        )
        # HF initialises the query tokens to zeros (they come from a checkpoint); identical queries would stay
        # identical under training, so draw them like LAVIS does (normal, std = Q-Former initializer_range).
        with torch.no_grad():
            core.query_tokens.normal_(mean=0.0, std=architecture.qformer_config.initializer_range)
    return core


def load_pretrained_core(config: DavirModelConfig, device: torch.device) -> InstructBlipForConditionalGeneration:
    path = Path(config.pretrained)
    check_pretrained_folder(path)
    from davir.models.davir_checkpoint import load_folder_weights  # (it imports the families, which import this)

    core = load_folder_weights(path, lambda: InstructBlipForConditionalGeneration.from_pretrained(
        str(path), local_files_only=True, dtype=DTYPES[config.dtype], attn_implementation=config.attn_implementation
    ))
    vision = core.config.vision_config
    for name, wanted, actual in (
        ("image_size", config.image_size, vision.image_size),
        ("patch_size", config.patch_size, vision.patch_size),
    ):
        if wanted is not None and wanted != actual:
            raise ValueError(f"{name}={wanted} but the pretrained model at {path} was built for {actual}")
    return core.to(device)

def build_core(
    config: DavirModelConfig, captions_for_tokenizer: Sequence[str] | None, target: torch.device
) -> tuple[InstructBlipForConditionalGeneration, InstructBlipProcessor]:
    """The InstructBLIP and its processor that :func:`davir.models.davir.build_davir_model` wraps, on ``target``."""
    if config.pretrained is not None:
        path = Path(config.pretrained)
        check_pretrained_folder(path)
        processor = InstructBlipProcessor.from_pretrained(str(path), local_files_only=True)
        core = load_pretrained_core(config, target)
    else:
        if not captions_for_tokenizer:
            raise ValueError(
                f"preset {config.preset!r} has random weights and needs captions_for_tokenizer "
                "(the training captions) to learn its word-level vocabulary"
            )
        epc = config.epc
        tokenizer = build_word_tokenizer([*captions_for_tokenizer, epc.prompt, epc.entity_prefix])
        processor = InstructBlipProcessor(
            image_processor=clip_image_processor(64),  # replaced below once the image size is known
            tokenizer=tokenizer,
            qformer_tokenizer=tokenizer,
            num_query_tokens=None,
        )
        architecture = build_preset_config(
            config.preset,
            vocab_size=len(tokenizer),  # after the processor added its "<image>" token
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            image_size=config.image_size,
            patch_size=config.patch_size,
            **config.preset_overrides,
        )
        processor.image_processor = clip_image_processor(architecture.vision_config.image_size)
        processor.num_query_tokens = architecture.num_query_tokens
        core = random_core(architecture, config, target)
    return core, processor
