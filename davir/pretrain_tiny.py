"""Pretrain the tiny InstructBLIP-class checkpoint that the demo fine-tunes with DAVIR.

    python -m davir.data synth --out /tmp/synth_pt8k --scenes 8000 --seed 1     # not the demo's seed 0
    python -m davir.pretrain_tiny --out assets/tiny_instructblip --data /tmp/synth_pt8k --seed 1 --desc-order canonical …

A real DAVIR run starts from a pretrained InstructBLIP; the demo mirrors that with a ~2 M-parameter model
of the same classes (``InstructBlipForConditionalGeneration`` + ``InstructBlipProcessor``), pretrained here
on the built-in synthetic set with full training:

1. **single-image description** (``--desc-steps``): one image's 16 query tokens and the prompt
   "Describe the image." → its objects left to right ("small red metal sphere , large gray rubber cube");
   docs/demo_calibration.md shows this is what lets a tiny model learn to look at all;
2. **change captioning** (``--change-steps``): both images, the base DAVIR prompt "Describe the
   difference between the two images." → one reference caption drawn each time, on the semantic and the
   distractor ("no change") pairs; ``--desc-mix`` of the batches stay description batches.

No FAC: that is what the demo's DAVIR fine-tune adds. ``--entity-share`` prompts that share of the change
batches like EPC (Eq. 10, "… Entity: small red metal sphere.") with the changed object as entity, wrong or
missing as often as a retriever errs (``EntityNoise``), so that the checkpoint can already read an entity
prompt; the other change batches keep the base prompt. Images are decoded once into
a uint8 tensor at the model resolution (steps are pure compute). Every ``--eval-every`` steps the model
captions held-out test pairs greedily (also with entity prompts under ``--entity-share``); the best checkpoint
(type + object accuracy, with entity prompts when they were trained) so far is written to
``--out`` as ``InstructBlipForConditionalGeneration.save_pretrained`` (safetensors) +
``InstructBlipProcessor.save_pretrained`` + ``pretrain_info.json`` (command, seed, versions, curve), which
``build_davir_model(DavirModelConfig(pretrained=OUT))`` loads like a real InstructBLIP folder.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from davir.data.records import DataError
from davir.data.synthetic import (
    CHANGE_TEMPLATES,
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
    SynthConfig,
    generate_dataset,
    image_names,
    load_scenes,
    load_synthetic_set,
    object_phrase,
)
from davir.io import read_json, write_json_atomic
from davir.losses import FacConfig, caption_cross_entropy
from davir.metrics.synthetic import pair_truths, score_synthetic
from davir.models.davir import DavirModel, DavirModelConfig, EpcConfig, build_davir_model, entity_prompts

DESCRIBE_PROMPT = "Describe the image."
ENTITY_PROMPTS = EpcConfig()  # the DAVIR base prompt and Eq. 10 entity prompts, as the demo fine-tune builds them
CHANGE_PROMPT = ENTITY_PROMPTS.prompt
INFO_FILE = "pretrain_info.json"


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


# ---------------------------------------------------------------------------------------------------------------------
# Data held in memory
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class SceneTensors:
    """Scenes of one split: images (N, 3 views, 3, S, S) uint8 (before, after, nonsemantic), descriptions
    per view, change captions and "no change" captions per scene, the scene ids, the changed object's phrase
    (``subjects``, the entity an oracle retriever would return) and the phrases of the before image's objects."""

    ids: list[str]
    images: torch.Tensor
    descriptions: list[tuple[str, str, str]]
    captions: list[list[str]]
    no_change: list[list[str]]
    subjects: list[str]
    objects: list[list[str]]


VIEWS = ("before", "after", "nonsemantic")


def _load_image(path: Path, size: int) -> np.ndarray:
    # The InstructBLIP processor's own resize: PIL bicubic to size×size on the uint8 RGB image.
    try:
        with Image.open(path) as image:
            resized = image.convert("RGB").resize((size, size), Image.BICUBIC)
    except OSError as err:
        raise DataError(f"{path}: cannot read image ({err})") from err
    return np.asarray(resized).transpose(2, 0, 1)


def load_split(root: Path, split: str, size: int, *, limit: int | None = None,
               scenes: dict[str, Any] | None = None) -> SceneTensors:
    """Decode the scenes of ``split`` once (all three views at ``size`` px) with their texts; ``scenes``:
    the set's records when the caller has read them already."""
    scenes = load_scenes(root) if scenes is None else scenes
    no_change_file = read_json(root / "no_change_captions.json")
    ids = sorted(k for k, r in scenes.items() if r.get("split") == split)[:limit]
    if not ids:
        raise DataError(f"{root / 'scenes.json'}: no scenes in split {split!r}")
    images = np.empty((len(ids), 3, 3, size, size), dtype=np.uint8)
    descriptions, captions, no_change, subjects, objects = [], [], [], [], []
    for row, scene_id in enumerate(ids):
        record = scenes[scene_id]
        for view_index, view in enumerate(VIEWS):
            images[row, view_index] = _load_image(root / record["images"][view]["file"], size)
        descriptions.append(tuple(record["images"][view]["description"] for view in VIEWS))
        captions.append(list(record["captions"]))
        key = Path(image_names(int(scene_id))["before"]).name
        no_change.append(list(no_change_file.get(key) or NO_CHANGE_CAPTIONS[-1:]))
        subjects.append(str(record["change"]["subject"]))
        objects.append([object_phrase(o) for o in record["images"]["before"]["objects"]])
    return SceneTensors(ids, torch.from_numpy(images), descriptions, captions, no_change, subjects, objects)


DESCRIPTION_ORDERS = ("left-to-right", "canonical")
_ATTRIBUTE_RANK = {
    **{value: i for i, value in enumerate(COLOR_WORDS)}, **{value: i for i, value in enumerate(SHAPE_WORDS)},
    **{value: i for i, value in enumerate(MATERIAL_WORDS)}, **{value: i for i, value in enumerate(SIZE_WORDS)},
}


def canonical_description(description: str) -> str:
    """Re-order a left-to-right description by attributes (colour, shape, material, size in the generator's
    order): the same set of objects, but reading it needs no spatial ordering, only "which are present"."""
    phrases = [p.strip() for p in description.split(" , ") if p.strip()]

    def key(phrase: str) -> tuple[int, ...]:
        size, color, material, shape = phrase.split()
        return (_ATTRIBUTE_RANK[color], _ATTRIBUTE_RANK[shape], _ATTRIBUTE_RANK[material], _ATTRIBUTE_RANK[size])

    return " , ".join(sorted(phrases, key=key))


class Normaliser:
    """uint8 (…, 3, S, S) → CLIP-normalised float, as InstructBLIP's image processor does after resizing."""

    def __init__(self) -> None:
        self.mean = torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1)
        self.std = torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255.0 - self.mean) / self.std


# ---------------------------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------------------------


def description_loss(model: DavirModel, pixels: torch.Tensor, captions: list[str], prompt: str = DESCRIBE_PROMPT
                     ) -> torch.Tensor:
    """Single-image captioning: [one image's Q visual tokens | prompt | caption], token CE on the caption.

    Same layout as ``DavirModel.forward`` with one image instead of two (the before/after pair)."""
    batch = pixels.shape[0]
    qformer = model.qformer_tokenizer([prompt] * batch, padding=True, return_tensors="pt")
    features = model.core.get_image_features(
        pixels, qformer_input_ids=qformer["input_ids"], qformer_attention_mask=qformer["attention_mask"],
        return_dict=True,
    )
    model.attention_hook.pop()  # the FAC hook recorded this pass; not used here
    logits, labels = model.language_pass(features.pooler_output, [prompt] * batch, captions)
    return caption_cross_entropy(logits, labels)


def sample_description_batch(data: SceneTensors, batch: int, rng: random.Random, norm: Normaliser
                             ) -> tuple[torch.Tensor, list[str]]:
    rows = [rng.randrange(len(data.ids)) for _ in range(batch)]
    views = [rng.randrange(3) for _ in range(batch)]
    pixels = norm(data.images[rows, views])
    return pixels, [data.descriptions[r][v] for r, v in zip(rows, views)]


@dataclass
class ChangeBatch:
    """Sampled pairs: pixels, one reference each, their rows in the split and whether each is a changed pair."""

    before: torch.Tensor
    after: torch.Tensor
    captions: list[str]
    rows: list[int]
    semantic: list[bool]


def sample_change_batch(data: SceneTensors, batch: int, rng: random.Random, norm: Normaliser) -> ChangeBatch:
    """Half semantic pairs, half distractor pairs (as in the data), one reference drawn per pair."""
    rows = [rng.randrange(len(data.ids)) for _ in range(batch)]
    semantic = [rng.random() < 0.5 for _ in range(batch)]
    after_views = [1 if s else 2 for s in semantic]
    before = norm(data.images[rows, [0] * batch])
    after = norm(data.images[rows, after_views])
    captions = [rng.choice(data.captions[r] if s else data.no_change[r]) for r, s in zip(rows, semantic)]
    return ChangeBatch(before, after, captions, rows, semantic)


@dataclass(frozen=True)
class EntityNoise:
    """How the pretraining's entities imitate a real retriever's: ``wrong`` is the share of changed pairs
    whose entity is another object of the scene, ``on_distractor`` the share of distractor ("no change")
    pairs that get one of the scene's objects instead of no entity (the demo's fitted retriever: top-1 0.89
    on changed pairs, an entity on 23% of distractor pairs)."""

    wrong: float = 0.1
    on_distractor: float = 0.25

    def __post_init__(self) -> None:
        for name in ("wrong", "on_distractor"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"entity noise {name} must be a share in [0, 1], got {getattr(self, name)}")


def noisy_entities(data: SceneTensors, rows: list[int], semantic: list[bool], rng: random.Random,
                   noise: EntityNoise) -> list[list[str]]:
    """One entity per pair (or none): the changed object's phrase, or with the ``noise`` shares another
    object of the scene (changed pairs) or one of its objects (distractor pairs), as retrieval errs."""
    entities = []
    for row, changed in zip(rows, semantic):
        if changed:
            others = [o for o in data.objects[row] if o != data.subjects[row]] or data.objects[row]
            entities.append([rng.choice(others)] if rng.random() < noise.wrong else [data.subjects[row]])
        else:
            entities.append([rng.choice(data.objects[row])] if rng.random() < noise.on_distractor else [])
    return entities


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------------------


def evaluation_entities(data: SceneTensors, rows: list[int], *, changed: bool) -> list[list[str]]:
    """The fixed entities `evaluate` prompts with: the changed object for a changed pair; for a distractor
    pair, one of the scene's objects on every fourth row (a retriever's false entity), else none."""
    if changed:
        return [[data.subjects[r]] for r in rows]
    return [[data.objects[r][r % len(data.objects[r])]] if r % 4 == 0 else [] for r in rows]


@torch.no_grad()
def evaluate(model: DavirModel, data: SceneTensors, truths: dict[str, Any], norm: Normaliser, *,
             cider: bool = False, batch: int = 50, entities: bool = False) -> dict[str, Any]:
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
        result["caption_scores"] = {name: round(float(value), 4) for name, value in text.metrics.items()
                                    if value is not None}
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
    qformer = model.qformer_tokenizer([DESCRIBE_PROMPT] * batch, padding=True, return_tensors="pt")
    visual = model.core.get_image_features(
        pixels, qformer_input_ids=qformer["input_ids"], qformer_attention_mask=qformer["attention_mask"],
        return_dict=True,
    ).pooler_output
    model.attention_hook.pop()
    prompt = torch.tensor(model._prompt_ids([DESCRIBE_PROMPT])[0]).repeat(batch, 1)
    embeds = torch.cat([visual, model._embed(prompt)], dim=1)
    output = model.core.language_model.generate(
        inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long), max_new_tokens=40,
        do_sample=False, pad_token_id=model.tokenizer.pad_token_id, eos_token_id=model.tokenizer.eos_token_id,
    )
    return [t.strip() for t in model.tokenizer.batch_decode(output, skip_special_tokens=True)]


# ---------------------------------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------------------------------


def save_checkpoint(model: DavirModel, out: str | Path, info: dict[str, Any]) -> None:
    """Write the HF folder (model safetensors + processor) and ``pretrain_info.json`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.core.save_pretrained(str(out), safe_serialization=True)
    model.processor.save_pretrained(str(out))
    write_json_atomic(out / INFO_FILE, info)


def package_versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


# ---------------------------------------------------------------------------------------------------------------------
# Main loop
# ---------------------------------------------------------------------------------------------------------------------


def _schedule(optimizer: torch.optim.Optimizer, steps: int, warmup: float = 0.05) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to 2% (one per stage)."""
    warm = max(1, int(steps * warmup))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, steps - warm))
        return 0.02 + 0.98 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_tiny_model(*, image_size: int = 64, patch_size: int = 8, seed: int = 0, query_tokens: int = 0
                     ) -> DavirModel:
    """The random-weight tiny preset in full-training mode (no FAC, no entity prompt), with the word-level
    tokenizer of :func:`vocabulary_texts` for both the LLM and the Q-Former."""
    config = DavirModelConfig(
        preset="tiny", image_size=image_size, patch_size=patch_size, train_mode="full",
        fac=FacConfig(lambda_attn=0.0), epc=EpcConfig(use_entities=False), seed=seed,
        preset_overrides=({"num_query_tokens": query_tokens} if query_tokens else {}),
    )
    return build_davir_model(config, captions_for_tokenizer=vocabulary_texts())


def pretrain(args: argparse.Namespace) -> dict[str, Any]:
    """Run both stages; returns the final info (also written to ``args.out``)."""
    started = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    out = Path(args.out)
    log = print if not args.quiet else (lambda *a, **k: None)

    if args.data is None:
        data_root = Path(tempfile.mkdtemp(prefix="davir_pretrain_")) / "synth"
        generate_dataset(data_root, SynthConfig(scenes=args.scenes, seed=args.data_seed), workers=args.workers)
    else:
        data_root = Path(args.data)
    norm = Normaliser()
    synthetic_set = load_synthetic_set(data_root)  # scenes.json is read once: it is large
    scenes, data_config = synthetic_set["scenes"], synthetic_set.get("config", {})
    train = load_split(data_root, "train", args.image_size, limit=args.train_limit, scenes=scenes)
    test = load_split(data_root, "test", args.image_size, limit=args.eval_scenes, scenes=scenes)
    if args.desc_order == "canonical":
        for split_data in (train, test):
            split_data.descriptions = [tuple(canonical_description(d) for d in views)
                                       for views in split_data.descriptions]
    truths = pair_truths(scenes, split="test")
    log(f"loaded {len(train.ids)} train / {len(test.ids)} test scenes in {time.time() - started:.0f}s", flush=True)

    if args.init is not None:  # continue from an earlier checkpoint of this command (its curve is kept)
        model = build_davir_model(DavirModelConfig(
            pretrained=str(args.init), image_size=args.image_size, patch_size=args.patch_size, train_mode="full",
            fac=FacConfig(lambda_attn=0.0), epc=EpcConfig(use_entities=False), seed=args.seed,
        ))
    else:
        model = build_tiny_model(image_size=args.image_size, patch_size=args.patch_size, seed=args.seed,
                                 query_tokens=args.query_tokens)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.2f} M parameters, vocabulary {len(model.tokenizer)}", flush=True)

    info: dict[str, Any] = {
        "command": "python -m davir.pretrain_tiny " + " ".join(shlex.quote(a) for a in args.argv),
        "seed": args.seed, "data": str(data_root), "train_scenes": len(train.ids), "eval_scenes": len(test.ids),
        # the generator settings of the data (its seed must differ from the demo's seed 0: other scenes)
        "data_seed": data_config.get("seed"), "data_config": data_config,
        "versions": package_versions(), "parameters": params, "describe_prompt": DESCRIBE_PROMPT,
        "change_prompt": CHANGE_PROMPT, "curve": [], "best": None,
    }
    if args.init is not None:
        earlier = read_json(Path(args.init) / INFO_FILE)
        info["init"] = {"folder": str(args.init), "command": earlier.get("command"), "seed": earlier.get("seed"),
                        "curve": earlier.get("curve", [])}
    noise = EntityNoise(wrong=args.entity_wrong, on_distractor=args.entity_on_distractor)
    best_score = -1.0
    step_total = 0
    for stage, steps in (("describe", args.desc_steps), ("change", args.change_steps)):
        if steps <= 0:
            continue
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        scheduler = _schedule(optimizer, steps)
        running, stage_start = [], time.time()
        for step in range(1, steps + 1):
            if stage == "describe" or rng.random() < args.desc_mix:
                pixels, captions = sample_description_batch(train, args.batch_size, rng, norm)
                loss = description_loss(model, pixels, captions)
            else:
                pairs = sample_change_batch(train, args.batch_size, rng, norm)
                if rng.random() < args.entity_share:  # EPC-style prompts with retriever-like entities
                    prompts = entity_prompts(ENTITY_PROMPTS, noisy_entities(train, pairs.rows, pairs.semantic, rng, noise))
                else:
                    prompts = [CHANGE_PROMPT] * len(pairs.captions)
                loss = model(pairs.before, pairs.after, prompts, pairs.captions).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            running.append(loss.item())
            step_total += 1
            if step % args.eval_every == 0 or step == steps:
                point: dict[str, Any] = {
                    "stage": stage, "step": step, "total_step": step_total,
                    "minutes": round((time.time() - started) / 60, 2),
                    "loss": round(sum(running) / len(running), 4),
                }
                running = []
                if stage == "describe":
                    point["description_exact"] = description_accuracy(model, test, norm)
                else:
                    result = evaluate(model, test, truths, norm)
                    point.update({k: result[k] for k in ("type_accuracy", "object_accuracy", "exact_accuracy")})
                    point["examples"] = result["examples"]
                    if args.entity_share > 0:  # what the EPC fine-tune starts from
                        with_entities = evaluate(model, test, truths, norm, entities=True)
                        point["with_entities"] = {k: with_entities[k] for k in
                                                  ("type_accuracy", "object_accuracy", "exact_accuracy", "per_type")}
                info["curve"].append(point)
                log(json.dumps(point), flush=True)
                scored = point.get("with_entities", point)
                score = scored.get("type_accuracy", 0.0) + scored.get("object_accuracy", 0.0) if stage == "change" else -0.5
                if stage == "describe" and step == steps or stage == "change" and score > best_score:
                    best_score = max(best_score, score)
                    info["best"] = point
                    info["minutes"] = round((time.time() - started) / 60, 2)
                    save_checkpoint(model, out, info)
        log(f"stage {stage}: {steps} steps in {(time.time() - stage_start) / 60:.1f} min", flush=True)

    info["minutes"] = round((time.time() - started) / 60, 2)
    # The saved folder holds the best model; re-evaluate it with CIDEr for the record.
    best = build_davir_model(DavirModelConfig(pretrained=str(out), epc=EpcConfig(use_entities=False)))
    info["final_eval"] = evaluate(best, test, truths, norm, cider=args.cider)
    if args.entity_share > 0:
        info["final_eval_with_entities"] = evaluate(best, test, truths, norm, cider=args.cider, entities=True)
    write_json_atomic(out / INFO_FILE, info)
    log(json.dumps(info["final_eval"]), flush=True)
    return info


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m davir.pretrain_tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write the checkpoint into")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", help="an existing synthetic set (python -m davir.data synth)")
    source.add_argument("--scenes", type=int, default=2000, help="generate a set of this many scenes (no --data)")
    parser.add_argument("--data-seed", type=int, default=1,
                        help="generator seed of the --scenes set (default 1: not the demo's seed 0, so no demo scene is seen)")
    parser.add_argument("--workers", type=int, default=0, help="processes for generating (0 = one per core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", help="continue from a folder this command wrote (default: random weights)")
    parser.add_argument("--desc-steps", type=int, default=3000)
    parser.add_argument("--change-steps", type=int, default=3000)
    parser.add_argument("--desc-mix", type=float, default=0.2, help="share of description batches in stage 2")
    parser.add_argument("--entity-share", type=float, default=0.0,
                        help="share of change batches prompted with EPC entity prompts (Eq. 10) instead of the base prompt")
    parser.add_argument("--entity-wrong", type=float, default=EntityNoise.wrong,
                        help="share of changed pairs whose entity is another object of the scene")
    parser.add_argument("--entity-on-distractor", type=float, default=EntityNoise.on_distractor,
                        help="share of distractor pairs given one of the scene's objects as entity")
    parser.add_argument("--desc-order", choices=DESCRIPTION_ORDERS, default="left-to-right",
                        help="object order of the description targets")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--query-tokens", type=int, default=0, help="0 = the preset's 16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--eval-scenes", type=int, default=100, help="test scenes scored (2 pairs each)")
    parser.add_argument("--train-limit", type=int, default=None, help="use only the first N train scenes")
    parser.add_argument("--no-cider", dest="cider", action="store_false",
                        help="skip BLEU/CIDEr in the final evaluation (needs Java)")
    parser.add_argument("--quiet", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    for name in ("desc_mix", "entity_share", "entity_wrong", "entity_on_distractor"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be a share in [0, 1], got {getattr(args, name)}")
    try:
        pretrain(args)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
