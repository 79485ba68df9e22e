"""Gemma 3: a SigLIP vision tower, a pooling projector and the Gemma 3 LLM (``Gemma3ForConditionalGeneration``).

* **Images** [D]: Gemma 3's processor resizes every picture to the SigLIP input size (896 px in the released
  models) and, only with ``do_pan_and_scan=True``, adds crops of wide or tall pictures. One grid per run: every
  picture is resized to S×S, S the vision config's ``image_size`` (64 ``tiny``, 896 ``4b``; the position
  embeddings and the projector's pooling are fixed to it), and pan-and-scan stays off, so each picture is one
  S×S image. SigLIP cuts it into (S/p)² patches (tiny: 16×16 at patch 4; 4b: 64×64 at patch 14); the projector
  average-pools them k×k, k = (S/p) / √``mm_tokens_per_image`` (4×4 in both presets), RMS-normalises and
  projects them to ``mm_tokens_per_image`` soft tokens (tiny 16, 4b 256). The processor writes a picture as
  ``\\n\\n<start_of_image>`` + that many ``<image_soft_token>`` + ``<end_of_image>\\n\\n``. Both pictures sit in
  one user turn, before first, through the released chat template:
  ``<bos><start_of_turn>user\\n<picture><picture>prompt<end_of_turn>\\n<start_of_turn>model\\n``. The
  template writes the ``<bos>`` itself, so the turn is tokenized without a second one, as the processor's
  ``apply_chat_template(tokenize=True)`` does. The image tokens carry ``token_type_ids`` = 1 (the processor's),
  which gives each picture bidirectional attention over its own tokens in the LLM.
* **FAC** [D]: SigLIP has no [CLS] token and Gemma 3 uses no pooling head. FAC supervises the mean attention
  each patch receives — over all heads and all query patches of the same picture — in the **last SigLIP
  layer** (its output, after ``post_layernorm``, is what the projector pools), on the *unpooled* (S/p)×(S/p)
  patch grid in raster order: the map is 4× finer a side than the soft tokens. The hook recomputes it from
  the layer's ``q_proj``/``k_proj`` outputs (LoRA included), so SDPA/flash stay in place (tests: equal to
  eager attention). Cost: a (S/p)²×(S/p)² matrix per head and picture — 4096² × 16 heads, 1 GiB in float32
  per picture for ``4b``.
* **LoRA**: SigLIP ``q_proj``/``k_proj``/``v_proj`` (``vision_rank``) and the LLM attention projections
  (``llm_rank``). [D] The projector has no linear layer for ``qformer_rank``: it is one (vision width × text
  width) matrix applied by ``matmul`` after an RMSNorm, which PEFT's module LoRA cannot wrap; train it in full
  with ``model.extra_trainable=[projector]`` (1152 × 2560 = 2.9 M weights in ``4b``).

The ``4b`` preset is google/gemma-3-4b-it's published config.json: ``vision_config`` SigLIP 1152 wide, 27
layers, 16 heads, MLP 4304, patch 14 at 896 px, no head; ``text_config`` 2560 wide, 34 layers, MLP 10240,
sliding window 1024, ``rope_scaling`` linear ×8 on the global layers; the rest are ``Gemma3TextConfig``'s
defaults, which the file leaves out (8 heads / 4 KV heads of 256, ``query_pre_attn_scalar`` 256, RoPE θ 1e6
global / 1e4 local, every 6th layer global, vocabulary 262208); ``mm_tokens_per_image`` 256, ``<start_of_image>``
255999, ``<end_of_image>`` 256000, ``<image_soft_token>`` 262144, ``eos_token_id`` [1, 106], tied embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

from davir.models.families import FAMILIES
from davir.models.families.base import ChatFamily
from davir.models.vlm.received_attention import QueryKeyHook

# The released chat template (google/gemma-3-4b-it), image parts included: the system turn folds into the
# first user turn, the assistant's role is "model".
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)
# The tokenizer's named image tokens (gemma-3's tokenizer_config.json "extra_special_tokens"); the processor reads them.
IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
GEMMA3_CHAT_WORDS = ("model",)  # the assistant's role in the template
# Runs of newlines are single tokens of the released vocabulary (the picture's "\n\n<start_of_image>…"); vLLM's
# Gemma 3 processor looks up these four by their text, so the tiny tokenizer has them too.
NEWLINE_TOKENS = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
REAL_IMAGE_SIZE = 896
REAL_VOCAB = 262208


def _check_grid(image_size: int, patch_size: int, tokens_per_image: int) -> None:
    """The projector reshapes the (S/p)² patches to a square and pools them to √tokens a side."""
    side = image_size // patch_size if patch_size > 0 else 0
    per_side = math.isqrt(tokens_per_image) if tokens_per_image > 0 else 0
    if side <= 0 or per_side <= 0 or per_side**2 != tokens_per_image or side % per_side:
        raise ValueError(
            f"image_size // patch_size ({image_size} // {patch_size} = {side}) must be a positive multiple "
            f"of √mm_tokens_per_image (mm_tokens_per_image={tokens_per_image}, a square): the projector "
            "average-pools the patch grid to that many tokens a side"
        )


def tiny_config(
    *,
    tokenizer,
    image_size: int | None = None,
    patch_size: int | None = None,
    vision_hidden: int = 128,
    vision_layers: int = 3,
    vision_heads: int = 4,
    vision_mlp: int = 512,
    tokens_per_image: int = 16,
    text_hidden: int = 128,
    text_layers: int = 2,
    text_heads: int = 4,
    text_kv_heads: int = 2,
    text_head_dim: int = 32,
    text_mlp: int = 512,
    max_positions: int = 1024,
    sliding_window: int = 512,
) -> Gemma3Config:
    """Toy Gemma 3: SigLIP 128/3 layers/4 heads/MLP 512, patch 4 at 64 px (16×16 patches, pooled 4×4 as in the
    released models → 16 soft tokens), Gemma 3 LLM 128/2 layers (one sliding-window, one global, the released
    pattern's last two)/4 heads (2 KV) of 32, MLP 512; transformers' own initialisation (the projector starts at
    zero, as Gemma 3's ``_init_weights`` sets it)."""
    image_size = 64 if image_size is None else image_size
    patch_size = 4 if patch_size is None else patch_size
    _check_grid(image_size, patch_size, tokens_per_image)
    layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(text_layers)]
    return _config(
        tokenizer,
        tokens_per_image=tokens_per_image,
        vision=dict(
            hidden_size=vision_hidden,
            intermediate_size=vision_mlp,
            num_hidden_layers=vision_layers,
            num_attention_heads=vision_heads,
            image_size=image_size,
            patch_size=patch_size,
        ),
        text=dict(
            hidden_size=text_hidden,
            intermediate_size=text_mlp,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=text_kv_heads,
            head_dim=text_head_dim,
            query_pre_attn_scalar=text_head_dim,
            max_position_embeddings=max_positions,
            sliding_window=sliding_window,
            layer_types=layer_types,
        ),
    )


def gemma3_4b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> Gemma3Config:
    """google/gemma-3-4b-it (numbers in the module docstring): SigLIP 1152/27/16 heads at 896 px, patch 14
    (64×64 patches → 256 soft tokens), Gemma 3 2560 wide, 34 layers, 8 heads / 4 KV of 256, MLP 10240."""
    image_size = REAL_IMAGE_SIZE if image_size is None else image_size
    patch_size = 14 if patch_size is None else patch_size
    _check_grid(image_size, patch_size, 256)
    return _config(
        tokenizer,
        tokens_per_image=256,
        vocab=REAL_VOCAB,
        vision=dict(
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=27,
            num_attention_heads=16,
            image_size=image_size,
            patch_size=patch_size,
        ),
        text=dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            max_position_embeddings=131072,
            sliding_window=1024,
            rms_norm_eps=1e-6,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    )


def _config(tokenizer, *, tokens_per_image: int, vision: dict, text: dict, vocab: int = 0) -> Gemma3Config:
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in IMAGE_TOKENS.items()}
    return Gemma3Config(
        vision_config=dict(model_type="siglip_vision_model", vision_use_head=False, **vision),
        text_config=dict(
            model_type="gemma3_text",
            vocab_size=max(vocab, len(tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.convert_tokens_to_ids("<end_of_turn>"),
            **text,
        ),
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
        tie_word_embeddings=True,
    )


class Gemma3Family(ChatFamily):
    name = "gemma3"
    model_type = "gemma3"
    model_class = Gemma3ForConditionalGeneration
    processor_class = Gemma3Processor
    config_class = Gemma3Config
    presets = {"tiny": tiny_config, "4b": gemma3_4b_config}
    special_tokens = ("<start_of_turn>", "<end_of_turn>", *IMAGE_TOKENS.values())
    chat_template = GEMMA3_CHAT_TEMPLATE
    end_of_turn = "<end_of_turn>"
    token_type_key = "token_type_ids"  # Gemma3ForConditionalGeneration's name for the processor's image-token types
    vision_lora_pattern = (
        r"model\.vision_tower\.(?:vision_model\.)?encoder\.layers\.\d+\.self_attn\."
        r"(?:q_proj|k_proj|v_proj)"
    )
    projector_lora_pattern = ""  # [D] one matmul weight, no nn.Linear: extra_trainable=[projector] trains it
    llm_lora_pattern = r"model\.language_model\.layers\.\d+\.self_attn\.(?:{targets})"
    trainable_parts = {"projector": "model.multi_modal_projector"}
    image_kwargs = {"do_pan_and_scan": False}  # one S×S image per picture, no crops [D]
    fac_reads = (
        "mean attention each patch receives in the last SigLIP layer [D] (no [CLS]; the layer the "
        "projector pools), on the unpooled patch grid"
    )

    # ------------------------------------------------------------------------------------------------ presets
    def preset_tokenizer(self, texts: Sequence[str]):
        tokenizer = super().preset_tokenizer([*texts, *GEMMA3_CHAT_WORDS])
        # The processor reads tokenizer.boi_token / eoi_token / image_token (+ _id), as the released tokenizer names them.
        tokenizer._set_model_specific_special_tokens(special_tokens=IMAGE_TOKENS)
        tokenizer.add_tokens(list(NEWLINE_TOKENS))
        return tokenizer

    def preset_processor(self, tokenizer, architecture: Gemma3Config) -> Gemma3Processor:
        size = architecture.vision_config.image_size
        return Gemma3Processor(
            image_processor=Gemma3ImageProcessor(size={"height": size, "width": size}, do_pan_and_scan=False),
            tokenizer=tokenizer,
            chat_template=self.chat_template,
            image_seq_length=architecture.mm_tokens_per_image,
        )

    # ------------------------------------------------------------------------------------------------- images
    def input_size(self, model_config, architecture: Gemma3Config) -> int:
        """S: ``model.image_size``, else the SigLIP input size (896 released); the two must agree (fixed position
        embeddings, and the projector pools a fixed patch grid)."""
        vision = architecture.vision_config
        size = model_config.image_size or vision.image_size
        if size != vision.image_size:
            raise ValueError(
                f"model.image_size={size}, but this {self.name} vision tower takes "
                f"{vision.image_size}×{vision.image_size} pictures (SigLIP's position embeddings and the "
                f"projector's pooling are fixed): set model.image_size={vision.image_size} or leave it "
                "empty"
            )
        _check_grid(size, vision.patch_size, architecture.mm_tokens_per_image)
        return size

    def patch_grid(self, size: int, architecture: Gemma3Config) -> tuple[int, int]:
        """(S/p, S/p): the unpooled SigLIP patches (FAC's grid), not the pooled soft tokens."""
        side = size // architecture.vision_config.patch_size
        return side, side

    def per_image_pixels(self, processed: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        pixels = processed["pixel_values"]  # (count, 3, S, S) without pan-and-scan crops
        crops = processed.get("num_crops")
        if pixels.shape[0] != count or (crops is not None and any(int(c) for c in crops)):
            raise ValueError(
                f"{self.name}: the processor gave {pixels.shape[0]} pixel tensors for {count} pictures "
                "(expected one S×S image each: was pan-and-scan on?)"
            )
        return pixels

    def pixel_inputs(self, pixels: torch.Tensor, one_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``pixel_values`` (B·K, 3, S, S): the pictures in text order (row 0 before, row 0 after, …)."""
        return {"pixel_values": pixels.reshape(-1, *pixels.shape[2:])}

    # -------------------------------------------------------------------------------------------------- FAC
    def fac_attention(self, core: nn.Module) -> nn.Module:
        tower = core.model.vision_tower  # SiglipVisionModel: its encoder directly (transformers 5), or in .vision_model
        return getattr(tower, "vision_model", tower).encoder.layers[-1].self_attn

    def attention_hook(self, core: nn.Module) -> QueryKeyHook:
        attention = self.fac_attention(core)
        return QueryKeyHook(attention, heads=attention.num_heads, scale=attention.scale)

    def attention_maps(self, captured: torch.Tensor, images: int, grid: tuple[int, int]) -> torch.Tensor:
        if captured.shape[0] != images:
            raise ValueError(f"the FAC hook saw {captured.shape[0]} images, expected {images}")
        if captured.shape[1] != grid[0] * grid[1]:
            raise ValueError(f"the FAC hook saw {captured.shape[1]} patches per image, expected {grid[0]}×{grid[1]}")
        return captured.reshape(images, *grid)  # raster order (the patch convolution, flattened)

    def encode_images(self, core: nn.Module, pixels: dict[str, torch.Tensor]) -> Any:
        return core.model.get_image_features(pixel_values=pixels["pixel_values"])

    def vision_tower(self, core: nn.Module) -> nn.Module:
        return core.model.vision_tower

    # ------------------------------------------------------------------------------------------------- parts
    def part_of(self, name: str) -> str:
        if name.startswith("model.multi_modal_projector"):
            return "projector"
        if name.startswith("model.vision_tower"):
            return "vision"
        if name.startswith("model.language_model"):
            return "language_model"
        return name.split(".", 1)[0]


FAMILY = FAMILIES.register("gemma3", Gemma3Family())
