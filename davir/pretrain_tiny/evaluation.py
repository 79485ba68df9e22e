"""Held-out scoring during pretraining: greedy change captions (type / object accuracy, CIDEr) and descriptions."""

from __future__ import annotations

from typing import Any

import torch

from davir.metrics.synthetic import score_synthetic
from davir.models.vlm.epc import entity_prompts
from davir.models.vlm.instructblip import DavirModel
from davir.pretrain_tiny.data import Normaliser, SceneTensors
from davir.pretrain_tiny.model import CHANGE_PROMPT, DESCRIBE_PROMPT, ENTITY_PROMPTS


def evaluation_entities(data: SceneTensors, rows: list[int], *, changed: bool) -> list[list[str]]:
    """The fixed entities `evaluate` prompts with: the changed object for a changed pair; for a distractor
    pair, one of the scene's objects on every fourth row (a retriever's false entity), else none."""
    if changed:
        return [[data.subjects[r]] for r in rows]
    return [[data.objects[r][r % len(data.objects[r])]] if r % 4 == 0 else [] for r in rows]


@torch.no_grad()
def evaluate(
    model: DavirModel,
    data: SceneTensors,
    truths: dict[str, Any],
    norm: Normaliser,
    *,
    cider: bool = False,
    batch: int = 50,
    entities: bool = False,
) -> dict[str, Any]:
    """Greedy captions of both pairs of every scene in ``data``; type/object accuracy (and CIDEr).

    ``entities``: prompt with EPC entity prompts, fixed per scene so that runs compare
    (`evaluation_entities`)."""
    predictions: dict[str, str] = {}
    references: dict[str, list[str]] = {}
    for start in range(0, len(data.ids), batch):
        rows = list(range(start, min(start + batch, len(data.ids))))
        before = norm(data.images[rows, 0])
        for suffix, view, refs in (("", 1, data.captions), ("_n", 2, data.no_change)):
            after = norm(data.images[rows, view])
            if entities:
                prompts = entity_prompts(ENTITY_PROMPTS, evaluation_entities(data, rows, changed=view == 1))
            else:
                prompts = [CHANGE_PROMPT] * len(rows)
            captions = model.generate(before, after, prompts, max_new_tokens=16)
            for r, caption in zip(rows, captions):
                key = f"{data.ids[r]}.png{suffix}"
                predictions[key] = caption
                references[key] = refs[r]
    scores = score_synthetic(predictions, truths).to_dict()
    result: dict[str, Any] = {
        "type_accuracy": scores["overall"]["type_accuracy"],
        "object_accuracy": scores["overall"]["object_accuracy"],
        "exact_accuracy": scores["overall"]["exact_accuracy"],
        "per_type": scores["per_type"],
        "unparsed": scores["unparsed"],
        "examples": dict(list(predictions.items())[:6]),
    }
    if cider:
        from davir.metrics import score_captions

        text = score_captions(predictions, references, metrics=("BLEU", "CIDEr"), spice=False)
        result["caption_scores"] = {
            name: round(float(value), 4) for name, value in text.metrics.items() if value is not None
        }
    return result


@torch.no_grad()
def description_accuracy(model: DavirModel, data: SceneTensors, norm: Normaliser, *, count: int = 100) -> float:
    """Share of held-out before images whose greedy description is exactly right (stage-1 progress)."""
    model.eval()
    try:
        rows = list(range(min(count, len(data.ids))))
        pixels = norm(data.images[rows, 0])
        right = 0
        for r, text in zip(rows, _describe(model, pixels)):
            right += text.replace(" ,", ",") == data.descriptions[r][0].replace(" ,", ",")
        return right / len(rows)
    finally:
        model.train()


def _describe(model: DavirModel, pixels: torch.Tensor) -> list[str]:
    batch = pixels.shape[0]
    if model.config.family != "instructblip":  # a chat turn with the one picture
        return model.generate_turns([pixels], [DESCRIBE_PROMPT] * batch, max_new_tokens=40)
    qformer = model.qformer_tokenizer([DESCRIBE_PROMPT] * batch, padding=True, return_tensors="pt")
    visual = model.core.get_image_features(
        pixels,
        qformer_input_ids=qformer["input_ids"],
        qformer_attention_mask=qformer["attention_mask"],
        return_dict=True,
    ).pooler_output
    model.attention_hook.pop()
    prompt = torch.tensor(model._prompt_ids([DESCRIBE_PROMPT])[0]).repeat(batch, 1)
    embeds = torch.cat([visual, model._embed(prompt)], dim=1)
    output = model.core.language_model.generate(
        inputs_embeds=embeds,
        attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
        max_new_tokens=40,
        do_sample=False,
        pad_token_id=model.tokenizer.pad_token_id,
        eos_token_id=model.tokenizer.eos_token_id,
    )
    return [t.strip() for t in model.tokenizer.batch_decode(output, skip_special_tokens=True)]
