"""FLOPs of a DAVIR training step estimated from InstructBLIP's layer shapes (``bench/train_step.py``'s
``estimate``, and ``--estimate-only`` on the 'meta' device)."""

from __future__ import annotations

import torch

from davir.models.vlm.instructblip import DavirModel


def llm_sequence_length(model: DavirModel, prompts: list[str], captions: list[str]) -> int:
    """Length of the LLM input of ``DavirModel.forward``: 2Q visual tokens + the longest [prompt | caption | EOS]
    (prompt with BOS, both truncated as the model does). Checked against the forward's labels in timed runs."""
    config = model.config
    prompt_ids = model.tokenizer(
        list(prompts), add_special_tokens=True, truncation=True, max_length=config.max_prompt_tokens
    )["input_ids"]
    caption_ids = model.tokenizer(
        [c.strip() for c in captions],
        add_special_tokens=False,
        truncation=True,
        max_length=config.max_caption_tokens - 1,
    )["input_ids"]
    return 2 * model.num_query_tokens + max(len(p) + len(c) + 1 for p, c in zip(prompt_ids, caption_ids))


def round_significant(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def _qformer_tokens(name: str, queries: int, text: int, image_tokens: int) -> int:
    """Tokens per image that pass through the Q-Former Linear ``name`` (HF InstructBlipQFormerLayer)."""
    if ".crossattention.attention.key" in name or ".crossattention.attention.value" in name:
        return image_tokens
    if ".crossattention." in name or "_query." in name:  # cross-attention q/out, query FFN: the queries only
        return queries
    if ".attention." in name:  # self-attention over [queries | instruction]
        return queries + text
    if ".intermediate." in name or ".output." in name:  # text FFN: the instruction tokens only
        return text
    return 0  # embeddings


def step_tflop_estimate(
    model: DavirModel, prompts: list[str], llm_length: int, batch: int, checkpointing: bool
) -> dict:
    """Matrix-multiply TFLOP of one training step from the layer shapes (the compute floor).

    Forward: 2 · weights · tokens for every frozen Linear, plus the attention products (4 · T² · width per
    layer); LoRA branches are left out (rank 4-8: under 1 %). Backward: with LoRA in every ViT, Q-Former and LLM
    layer the gradient flows through all of them, but frozen weights need only the input gradient, so backward
    ≈ one more forward; LLM checkpointing recomputes the LLM forward once more. The patch embedding needs no
    backward (nothing trainable below it).
    """
    core = model.core
    vision, text = core.config.vision_config, core.config.text_config
    images = 2 * batch
    patches = (vision.image_size // vision.patch_size) ** 2
    image_tokens = patches + 1
    queries = model.num_query_tokens
    qformer_text = model.qformer_tokenizer(list(prompts), padding=True)["input_ids"]
    text_tokens = max(len(ids) for ids in qformer_text)

    def linears(root: torch.nn.Module):
        for name, module in root.named_modules():
            if isinstance(module, torch.nn.Linear) and "lora_" not in name:
                yield name, module.weight.numel()

    vit = 2 * sum(n for _, n in linears(core.vision_model)) * image_tokens * images
    vit += 4 * image_tokens**2 * vision.hidden_size * vision.num_hidden_layers * images
    patch_embedding = 2 * core.vision_model.embeddings.patch_embedding.weight.numel() * patches * images
    qformer_config = core.config.qformer_config
    qformer = (
        2
        * images
        * sum(n * _qformer_tokens(name, queries, text_tokens, image_tokens) for name, n in linears(core.qformer))
    )
    cross_layers = len(range(0, qformer_config.num_hidden_layers, qformer_config.cross_attention_frequency))
    qformer += (
        4
        * images
        * qformer_config.hidden_size
        * ((queries + text_tokens) ** 2 * qformer_config.num_hidden_layers + queries * image_tokens * cross_layers)
    )
    projection = 2 * core.language_projection.weight.numel() * queries * images
    llm = 2 * sum(n for _, n in linears(core.language_model)) * llm_length * batch
    llm += 4 * llm_length**2 * text.hidden_size * text.num_hidden_layers * batch
    forward = {"vision": vit + patch_embedding, "qformer": qformer, "projection": projection, "llm": llm}
    total = forward["vision"] + vit + 2 * (qformer + projection) + (3 if checkpointing else 2) * llm
    return {
        "forward_tflop": {part: round_significant(value / 1e12) for part, value in forward.items()},
        "step_tflop": round_significant(total / 1e12),
        "llm_share_of_step": round((3 if checkpointing else 2) * llm / total, 3),
        "qformer_text_tokens": text_tokens,
    }
