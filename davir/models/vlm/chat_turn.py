"""One pair's chat turn as text and token ids, shared by davir's chat models and `caption.py --engine vllm`.

    text = turn_text(processor, "qwen2_5_vl", cut_prompt(tokenizer, prompt, 64))   # placeholders unexpanded
    ids = encode_turns(tokenizer, [text])[0]

:class:`davir.models.vlm.chat.ChatDavirModel` expands each image placeholder into the picture's tokens before
encoding; vLLM takes the ids with the placeholders unexpanded and expands them itself, so both start from the same
cut prompt, the same template and the same begin-of-sequence rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cut_prompt(tokenizer, prompt: str, max_tokens: int) -> str:
    """``prompt`` cut to ``max_tokens`` tokens (model.max_prompt_tokens), as training cut it."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return prompt
    return tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)


def turn_text(processor: Any, family: str, prompt: str, images: int = 2) -> str:
    """The user turn (``images`` pictures, then ``prompt``) and the assistant's opening, through the processor's own
    chat template, one image placeholder a picture."""
    messages = [
        {"role": "user", "content": [*({"type": "image"} for _ in range(images)), {"type": "text", "text": prompt}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if text.count(processor.image_token) != images:
        raise ValueError(
            f"the {family} chat template put {text.count(processor.image_token)} image placeholders for {images} images"
        )
    return text


def encode_turns(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each turn. As the processor's own ``apply_chat_template(tokenize=True)``: no second BOS where
    the template writes one (Gemma 3's), the tokenizer's own where it does not."""
    bos = tokenizer.bos_token
    encoded = tokenizer(list(texts), add_special_tokens=not (bos and texts and texts[0].startswith(bos)))
    return [list(ids) for ids in encoded["input_ids"]]
