"""What a chat-model family says about itself: the interface every ``ChatFamily`` fills in.

A chat family (Qwen2.5-VL, LLaVA-OneVision, SmolVLM) is a transformers ``*ForConditionalGeneration`` with its
processor. :class:`davir.models.vlm.chat.ChatDavirModel` does everything the families share — the chat turn
with both images, the caption labels, FAC and generation — and asks the family only for what differs:

* the classes, the random-weight presets and how a local folder is checked (``model_type``);
* the image processor's settings for **one fixed grid per run** [D]: every picture is resized to S×S
  (bicubic, as InstructBLIP's processor does) before the family's own processor sees it, so the number of
  image tokens, the patch grid FAC supervises and the masks' grid are the same for every pair and every batch
  (dynamic resolution would give each pair its own grid and its own sequence length; see each family);
* how the per-image pixel tensors become the model's keyword arguments for a batch of pairs;
* where FAC reads the attention (a hook that keeps the fast attention kernel) and how it becomes a patch map;
* the LoRA targets, mapped as App. B maps InstructBLIP's: vision attention (``lora.vision_rank``), the
  projector between vision and language (``lora.qformer_rank``, the Q-Former's place), LLM attention
  (``lora.llm_rank``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from davir.config import ConfigError
from davir.errors import DataError
from davir.models.tokenizer import build_word_tokenizer
from davir.models.vlm.config import DTYPES

# Words of the chat turn the word-level tokenizer of a preset must know (roles of the templates).
CHAT_WORDS = ("system", "user", "assistant", "you are a helpful assistant .")


class ChatFamily(ABC):
    """Base of the chat families; a subclass sets the class attributes and overrides what its model needs."""

    name: str = ""
    model_type: str = ""  # config.json "model_type" of a real folder of this family
    model_class: type | None = None  # transformers *ForConditionalGeneration
    processor_class: type | None = None  # transformers *Processor
    config_class: type | None = None  # transformers *Config
    presets: dict[str, Callable[..., Any]] = {}
    special_tokens: tuple[str, ...] = ()  # the preset tokenizer's added tokens (image placeholders, turn marks)
    chat_template: str = ""  # the preset processor's template (the real one's layout)
    end_of_turn: str = ""  # the token that ends the assistant's answer (the caption's EOS)
    token_type_key: str = "mm_token_type_ids"  # the model's keyword for the processor's per-token modality types
    vision_lora_pattern: str = ""  # regexes over module names inside the core model
    projector_lora_pattern: str = ""
    llm_lora_pattern: str = ""  # with {targets}: the LLM attention projections
    trainable_parts: dict[str, str] = {}  # model.extra_trainable name → attribute path inside the core
    image_kwargs: dict[str, Any] = {}  # fixed keyword arguments of the family's image processor
    fac_reads: str = ""  # one line for the README: what FAC supervises in this family

    @property
    def davir_class(self) -> type:
        """The DAVIR model around this family's core (imported here: that module imports the families)."""
        from davir.models.vlm.chat import ChatDavirModel

        return ChatDavirModel

    # ------------------------------------------------------------------------------------------------ loading
    def check_pretrained_folder(self, path: Path) -> None:
        """A clear error before transformers' own when ``path`` is not a saved model + processor of this family."""
        from davir.io import read_json

        if not path.is_dir():
            raise DataError(
                f"pretrained {self.name} folder not found: {path} (models are never downloaded; give a local folder)"
            )
        missing = [name for name in ("config.json",) if not (path / name).is_file()]
        if not any((path / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")):
            missing.append("preprocessor_config.json or processor_config.json (image processor)")
        if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
            missing.append("tokenizer.json (tokenizer)")
        if missing:
            raise DataError(
                f"{path} is not a saved {self.name} model + processor: missing {', '.join(missing)} "
                f"(expected the files of {self.model_class.__name__}.save_pretrained and "
                f"{self.processor_class.__name__}.save_pretrained)"
            )
        found = read_json(path / "config.json").get("model_type")
        if found != self.model_type:
            raise DataError(
                f"{path} holds a {found!r} model, not {self.model_type!r}: model.family={self.name} "
                f"needs a {self.name} folder (or set model.family to the family of this folder)"
            )

    def load_processor(self, path: Path):
        return self.processor_class.from_pretrained(str(path), local_files_only=True)

    def load_architecture(self, path: Path):
        return self.config_class.from_pretrained(str(path), local_files_only=True)

    def load_core(self, config, device: torch.device) -> nn.Module:
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
        return self.prepare_core(core.to(device), config)

    def random_core(self, architecture, config, device: torch.device) -> nn.Module:
        """Random weights of the family's classes, reproducible from ``config.seed``, built directly on ``device``."""
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
            torch.manual_seed(config.seed)
            core = self.model_class._from_config(
                architecture, attn_implementation=config.attn_implementation, dtype=DTYPES[config.dtype]
            )
        return self.prepare_core(core, config)

    def prepare_core(self, core: nn.Module, config) -> nn.Module:
        """A family's settings of a core just built or loaded, before LoRA (default: none)."""
        return core

    def build_core(self, config, captions_for_tokenizer: Sequence[str] | None, device: torch.device):
        """(core, processor) for a new model: the local folder ``config.pretrained``, or a seeded preset whose
        word-level tokenizer is learned from ``captions_for_tokenizer`` (the training captions)."""
        if config.pretrained is not None:
            path = Path(config.pretrained)
            self.check_pretrained_folder(path)
            return self.load_core(config, device), self.load_processor(path)
        if not captions_for_tokenizer:
            raise ValueError(
                f"preset {config.preset!r} has random weights and needs captions_for_tokenizer "
                "(the training captions) to learn its word-level vocabulary"
            )
        tokenizer = self.preset_tokenizer([*captions_for_tokenizer, config.epc.prompt, config.epc.entity_prefix])
        architecture, processor = self.build_preset(
            config.preset,
            tokenizer,
            image_size=config.image_size,
            patch_size=config.patch_size,
            overrides=config.preset_overrides,
        )
        return self.random_core(architecture, config, device), processor

    # ------------------------------------------------------------------------------------------------ presets
    def preset_tokenizer(self, texts: Sequence[str]):
        """The offline word-level tokenizer of a preset, with the family's special tokens and chat template."""
        tokenizer = build_word_tokenizer([*texts, *CHAT_WORDS])
        tokenizer.add_special_tokens({"additional_special_tokens": list(self.special_tokens)})
        tokenizer.chat_template = self.chat_template
        return tokenizer

    def build_preset(
        self, preset: str, tokenizer, *, image_size: int | None, patch_size: int | None, overrides: dict[str, Any]
    ):
        """(architecture config, processor) of a random-weight preset."""
        architecture = build_from_preset(
            self.presets,
            preset,
            family=self.name,
            tokenizer=tokenizer,
            image_size=image_size,
            patch_size=patch_size,
            **overrides,
        )
        try:
            return architecture, self.preset_processor(tokenizer, architecture)
        except ValueError as err:  # a grid the processor cannot make
            raise ConfigError(
                f"preset {preset!r} of model.family={self.name} (model.image_size={image_size}): {err}"
            ) from err

    @abstractmethod
    def preset_processor(self, tokenizer, architecture):
        """The family's processor around a preset's tokenizer, for the preset's image size."""

    # ------------------------------------------------------------------------------------------------- images
    @abstractmethod
    def input_size(self, model_config, architecture) -> int:
        """S: every picture is resized to S×S before the processor (one grid per run)."""

    @abstractmethod
    def patch_grid(self, size: int, architecture) -> tuple[int, int]:
        """(Hp, Wp) of the attention map FAC supervises."""

    def process_images(self, processor, images: Sequence[Image.Image], size: int) -> dict[str, torch.Tensor]:
        """The family processor's image outputs for S×S copies of ``images`` (tensors)."""
        resized = [image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC) for image in images]
        kwargs = {**getattr(processor, "images_kwargs", {}), **self.image_kwargs}
        return processor.image_processor(images=resized, return_tensors="pt", **kwargs)

    def per_image_pixels(self, processed: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        """(count, …) one pixel tensor per image from ``process_images``'s output."""
        pixels = processed["pixel_values"]
        if pixels.shape[0] != count:
            raise ValueError(f"{self.name}: the processor gave {pixels.shape[0]} pixel tensors for {count} images")
        return pixels

    @abstractmethod
    def pixel_inputs(self, pixels: torch.Tensor, one_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's image keyword arguments for B rows of K pictures each, ``pixels`` (B, K, …) from
        ``per_image_pixels``: images in text order (row 0 before, row 0 after, row 1 before, …; K = 1 for the
        description stage of ``davir.pretrain_tiny``). ``one_image``: ``process_images`` of one S×S picture."""

    # -------------------------------------------------------------------------------------------------- FAC
    @abstractmethod
    def attention_hook(self, core: nn.Module):
        """A hook object on the layer FAC reads: ``attach()``, ``pop()`` → what ``attention_maps`` takes."""

    @abstractmethod
    def attention_maps(self, captured: Any, images: int, grid: tuple[int, int]) -> torch.Tensor:
        """(images, Hp, Wp) patch maps, images in text order, from what the hook captured."""

    def encode_images(self, core: nn.Module, pixels: dict[str, torch.Tensor]) -> Any:
        """One pass of the vision encoder (and projector) over ``pixel_inputs``; the hook captures its attention."""
        return core.get_image_features(**pixels)

    @abstractmethod
    def vision_tower(self, core: nn.Module) -> nn.Module:
        """The vision encoder (its parameters' dtype is the pixels' dtype)."""

    # ------------------------------------------------------------------------------------------------- parts
    @abstractmethod
    def part_of(self, name: str) -> str:
        """The part a parameter belongs to (vision, projector, language_model, lm_head)."""


def build_from_preset(presets: dict[str, Callable[..., Any]], preset: str, *, family: str, **kwargs: Any) -> Any:
    """``presets[preset](**kwargs)``; an unknown name, an override the preset does not take or a grid it cannot
    make is a ConfigError naming the family and the size (train.py: one line, exit 2)."""
    if preset not in presets:
        raise ConfigError(f"unknown model preset {preset!r} for model.family={family}; choose one of {sorted(presets)}")
    try:
        return presets[preset](**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"preset {preset!r} of model.family={family} (model.image_size={kwargs.get('image_size')}): {err}"
        ) from err


def fac_layer_index(config) -> int:
    """The vision encoder layer whose output the projector reads: ``vision_feature_layer`` indexes the hidden
    states (0 the patch embeddings, k ≥ 1 the output of layer k - 1, -1 the last layer's); a list: its deepest."""
    count = config.vision_config.num_hidden_layers
    selected = config.vision_feature_layer
    layers = [selected] if isinstance(selected, int) else list(selected)
    indexes = [layer - 1 if layer >= 0 else count + layer for layer in layers]
    if not layers or any(not 0 <= index < count for index in indexes):
        raise ValueError(
            f"vision_feature_layer={selected!r} names no attention layer of the {count}-layer vision "
            "tower (0 is the patch embeddings; -1 the last layer)"
        )
    return max(indexes)


def locate(module: nn.Module, path: str) -> nn.Module:
    """``module.a.b.c`` from ``"a.b.c"``."""
    for part in path.split("."):
        module = getattr(module, part)
    return module
