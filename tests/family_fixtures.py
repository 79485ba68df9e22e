"""A user's folder of a chat model family, at toy size: the real classes with random weights, the real tokenizer
class (a byte-level BPE trained offline on the given texts, as Qwen2's is built), written by ``save_pretrained``.

    write_chat_folder("qwen2_5_vl", tmp / "qwen", texts)   # then DavirModelConfig(family=..., pretrained=folder)
"""

from __future__ import annotations

from pathlib import Path

import torch

# Smaller than the families' `tiny` presets: the tests train a few steps, they do not learn.
SIZES = {
    "qwen2_5_vl": {
        "vision_hidden": 64,
        "vision_layers": 2,
        "vision_mlp": 128,
        "text_hidden": 64,
        "text_layers": 1,
        "text_mlp": 128,
    },
    "llava_onevision": {
        "vision_hidden": 64,
        "vision_layers": 2,
        "vision_mlp": 128,
        "text_hidden": 64,
        "text_layers": 1,
        "text_mlp": 128,
    },
    "smolvlm": {
        "vision_hidden": 64,
        "vision_layers": 2,
        "vision_mlp": 128,
        "text_hidden": 64,
        "text_layers": 1,
        "text_mlp": 128,
    },
    "qwen3_vl": {
        "vision_hidden": 64,
        "vision_layers": 2,
        "vision_mlp": 128,
        "text_hidden": 64,
        "text_layers": 1,
        "text_mlp": 128,
    },
    "internvl": {
        "vision_hidden": 64,
        "vision_layers": 2,
        "vision_mlp": 128,
        "text_hidden": 64,
        "text_layers": 1,
        "text_mlp": 128,
    },
    "gemma3": {
        "vision_hidden": 64,
        "vision_layers": 2,
        "vision_mlp": 128,
        "text_hidden": 64,
        "text_layers": 2,
        "text_mlp": 128,
    },
}
# The tokenizer class each family's released folders use (SmolLM2's is GPT-2's byte-level BPE; Gemma's is a
# SentencePiece-style BPE with byte fallback).
TOKENIZER_CLASSES = {
    "qwen2_5_vl": "Qwen2Tokenizer",
    "llava_onevision": "Qwen2Tokenizer",
    "smolvlm": "GPT2TokenizerFast",
    "qwen3_vl": "Qwen2Tokenizer",
    "internvl": "Qwen2Tokenizer",
    "gemma3": "GemmaTokenizer",
}


def byte_level_tokenizer(texts: list[str], specials: list[str], *, tokenizer_class=None, vocab_size: int = 300):
    """A byte-level BPE (GPT-2 / Qwen2 style) trained on ``texts``, in ``tokenizer_class`` (Qwen2Tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    tokenizer_class = tokenizer_class or Qwen2Tokenizer
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + vocab_size,
        special_tokens=["<|endoftext|>", *specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = tokenizer_class(
        tokenizer_object=core, unk_token=None, bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def gemma_tokenizer(texts: list[str], specials: list[str], *, vocab_size: int = 300):
    """Gemma's tokenizer class (BPE over "▁"-joined text with byte fallback, ``<bos>`` in front) on a vocabulary
    trained on ``texts``: pad 0, eos 1, bos 2, unk 3, mask 4 as in Gemma, then ``specials``, the 256 byte tokens,
    the learned pieces. The image tokens are named as gemma-3's tokenizer_config.json names them."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    from davir.models.families.gemma3 import IMAGE_TOKENS, NEWLINE_TOKENS

    core = Tokenizer(models.BPE(byte_fallback=True))
    core.normalizer = normalizers.Replace(" ", "▁")
    core.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # pieces within words
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    learned = json.loads(core.to_str())["model"]
    names = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", *specials, *(f"<0x{b:02X}>" for b in range(256))]
    vocab = {name: index for index, name in enumerate(names)}
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, extra_special_tokens=IMAGE_TOKENS)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.add_tokens(list(NEWLINE_TOKENS))  # runs of newlines are pieces of the released vocabulary
    return tokenizer


def write_chat_folder(family_name: str, folder: Path, texts: list[str], *, seed: int = 0, image_size: int = 64) -> Path:
    """``<Family>ForConditionalGeneration`` + its processor at toy size, saved to ``folder`` as a user has it."""
    import transformers

    from davir.models.families import get_family

    family = get_family(family_name)
    if family_name == "gemma3":
        tokenizer = gemma_tokenizer(texts, list(family.special_tokens))
    else:
        tokenizer = byte_level_tokenizer(
            texts, list(family.special_tokens), tokenizer_class=getattr(transformers, TOKENIZER_CLASSES[family_name])
        )
    tokenizer.chat_template = family.chat_template
    architecture, processor = family.build_preset(
        "tiny", tokenizer, image_size=image_size, patch_size=None, overrides=SIZES.get(family_name, {})
    )
    torch.manual_seed(seed)
    model = family.model_class(architecture)
    folder = Path(folder)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return folder


def mask_and_entity_caches(root: Path, base: Path) -> tuple[Path, Path, Path]:
    """(root, masks, entities): the classical masks and the entities of every split of a synthetic set under
    `base`, as a user's preprocessing makes them (a vocabulary of every phrase: small sets)."""
    from davir.jobs import entities, masks

    for split in ("train", "val", "test"):
        common = ["--format", "clevr_change", "--root", str(root), "--split", split, "--no-progress"]
        assert masks.main([*common, "--out", str(base / "masks")]) == 0
        entity_cache = ["--masks", str(base / "masks"), "--out", str(base / "entities"), "--vocab-min-count", "1"]
        assert entities.main([*common, *entity_cache]) == 0
    return root, base / "masks", base / "entities"
