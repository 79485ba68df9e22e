"""The tiny model: its two prompts, the words it must know, and its random-weight build."""

from __future__ import annotations

import torch

from davir.data.synthetic import (
    CHANGE_TEMPLATES,
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
)
from davir.models.losses import FacConfig
from davir.models.vlm.build import build_davir_model
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.epc import EpcConfig
from davir.models.vlm.instructblip import DavirModel

DESCRIBE_PROMPT = "Describe the image."
ENTITY_PROMPTS = EpcConfig()  # the DAVIR base prompt and Eq. 10 entity prompts, as the demo fine-tune builds them
CHANGE_PROMPT = ENTITY_PROMPTS.prompt


def vocabulary_texts() -> list[str]:
    """Every word the demo can need: all template words, synonyms, colours/materials, "no change" captions,
    the description separator, both prompts, "Entity:" and punctuation (the vocabulary must not depend on
    which captions a data set happens to contain)."""
    texts = [DESCRIBE_PROMPT, CHANGE_PROMPT, ENTITY_PROMPTS.entity_prefix, ", .", *NO_CHANGE_CAPTIONS]
    for table in (SIZE_WORDS, COLOR_WORDS, MATERIAL_WORDS, SHAPE_WORDS):
        texts.extend(word for words in table.values() for word in words)
    for templates in CHANGE_TEMPLATES.values():
        texts.extend(t.replace("{obj}", "").replace("{new}", "") for t in templates)
    return texts


def build_tiny_model(
    *, image_size: int = 64, patch_size: int = 8, seed: int = 0, query_tokens: int = 0, family: str = "instructblip"
) -> DavirModel:
    """The random-weight tiny preset of ``family`` in full-training mode (no FAC, no entity prompt), with the
    word-level tokenizer of :func:`vocabulary_texts` (InstructBLIP: for both the LLM and the Q-Former)."""
    config = DavirModelConfig(
        family=family,
        preset="tiny",
        image_size=image_size,
        patch_size=patch_size,
        train_mode="full",
        fac=FacConfig(lambda_attn=0.0),
        epc=EpcConfig(use_entities=False),
        seed=seed,
        preset_overrides=({"num_query_tokens": query_tokens} if query_tokens else {}),
    )
    return build_davir_model(config, captions_for_tokenizer=vocabulary_texts())


def add_language_layers(model: DavirModel, count: int) -> int:
    """Append ``count`` decoder layers to the LLM of ``model.core``, each starting as the identity (its attention
    output and MLP down projections zero, so the residual stream passes through): the grown model computes exactly
    what the checkpoint did, and the new layers learn from the next step. The config is updated, so the folder
    ``save_pretrained`` writes loads as the deeper model. Returns the new depth.

    Why: the tiny chat preset's two LLM layers have to find the named object in both pictures *and* compare them,
    where InstructBLIP's Q-Former reads the prompt and looks before its LLM does (docs/experiments/tiny_pretraining.md)."""
    if count < 0:
        raise ValueError(f"add-llm-layers must be ≥ 0, got {count}")
    decoder = model.core.get_decoder()
    config, layers = decoder.config, decoder.layers
    layer_class, dtype = type(layers[0]), next(layers[-1].parameters()).dtype
    if count and getattr(config, "layer_types", None):  # a layer reads its own type at construction
        config.layer_types = list(config.layer_types) + [config.layer_types[-1]] * count
    for _ in range(count):
        layer = layer_class(config, layer_idx=len(layers)).to(dtype)
        layer.apply(model.core._init_weights)
        for output in (layer.self_attn.o_proj, layer.mlp.down_proj):
            torch.nn.init.zeros_(output.weight)
            if output.bias is not None:
                torch.nn.init.zeros_(output.bias)
        layers.append(layer)
    config.num_hidden_layers = len(layers)
    return len(layers)
