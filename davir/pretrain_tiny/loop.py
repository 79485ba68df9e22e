"""The two-stage pretraining loop (description, then change captioning) with its learning-rate schedule."""

from __future__ import annotations

import json
import math
import random
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from davir.config import ConfigError
from davir.data.records import CHANGE_TYPES
from davir.data.synthetic import SynthConfig, generate_dataset, load_synthetic_set
from davir.errors import DataError
from davir.io import read_json, write_json_atomic
from davir.metrics.synthetic import pair_truths
from davir.models.losses import FacConfig
from davir.models.vlm.build import build_davir_model
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.epc import EpcConfig, entity_prompts
from davir.pretrain_tiny.batches import (
    EntityNoise,
    change_type_weights,
    description_loss,
    noisy_entities,
    sample_change_batch,
    sample_description_batch,
)
from davir.pretrain_tiny.checkpoint import INFO_FILE, LAST_FOLDER, check_out, package_versions, save_checkpoint
from davir.pretrain_tiny.data import ModelPixels, canonical_description, load_split
from davir.pretrain_tiny.evaluation import description_accuracy, evaluate
from davir.pretrain_tiny.model import (
    CHANGE_PROMPT,
    DESCRIBE_PROMPT,
    ENTITY_PROMPTS,
    add_language_layers,
    build_tiny_model,
)


def _schedule(optimizer: torch.optim.Optimizer, steps: int, warmup: float = 0.05) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to 2% (one per stage)."""
    warm = max(1, int(steps * warmup))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, steps - warm))
        return 0.02 + 0.98 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(frozen=True)
class TinyPretrainSettings:
    """What `python -m davir.pretrain_tiny` takes (davir/cli/pretrain_tiny.py documents each option)."""

    out: str | Path
    family: str = "instructblip"  # the model family of the tiny preset (davir.models.families)
    data: str | Path | None = None  # an existing synthetic set; None: generate `scenes` scenes
    scenes: int = 2000
    data_seed: int = 1  # not the demo's seed 0, so no demo scene is seen
    workers: int = 0
    seed: int = 0
    init: str | Path | None = None  # continue from a folder this command wrote
    desc_steps: int = 3000
    change_steps: int = 3000
    desc_mix: float = 0.2
    entity_share: float = 0.0
    entity_wrong: float = EntityNoise.wrong
    entity_on_distractor: float = EntityNoise.on_distractor
    desc_order: str = "left-to-right"
    type_weights: dict[str, float] = field(default_factory=dict)  # change type → weight of its changed pairs
    batch_size: int = 32
    lr: float = 1e-3
    image_size: int = 64
    patch_size: int = 8
    query_tokens: int = 0
    add_llm_layers: int = 0  # identity-initialised LLM layers appended to the --init model
    threads: int = 2
    eval_every: int = 500
    eval_scenes: int = 100
    train_limit: int | None = None
    cider: bool = True
    quiet: bool = False
    argv: tuple[str, ...] = field(default=())  # the command line, recorded in the info file

    def __post_init__(self) -> None:
        from davir.models.families import FAMILIES

        FAMILIES.check(self.family, key="family")
        for name in ("desc_mix", "entity_share", "entity_wrong", "entity_on_distractor"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name.replace('_', '-')} must be a share in [0, 1], got {getattr(self, name)}")
        for kind, weight in self.type_weights.items():
            if kind not in CHANGE_TYPES or not weight > 0:
                raise ValueError(f"type-weights: {kind}={weight}; give positive weights of {', '.join(CHANGE_TYPES)}")
        if self.add_llm_layers < 0:
            raise ValueError(f"add-llm-layers must be ≥ 0, got {self.add_llm_layers}")
        # counts a negative or zero value of which did something else: --desc-steps -1 skipped the stage,
        # --eval-every -1 scored every step, --train-limit -1 dropped the last scene, --batch-size 0 and
        # --threads 0 ended in tracebacks
        least = {
            "scenes": 1,
            "data_seed": 0,
            "workers": 0,
            "desc_steps": 0,
            "change_steps": 0,
            "batch_size": 1,
            "image_size": 1,
            "patch_size": 1,
            "query_tokens": 0,
            "threads": 1,
            "eval_every": 1,
            "eval_scenes": 1,
            "train_limit": 1,
        }
        for name, minimum in least.items():
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise ValueError(f"{name.replace('_', '-')} must be {minimum} or more, got {value}")
        if self.desc_steps == self.change_steps == 0:
            raise ValueError("desc-steps and --change-steps are both 0: nothing to train")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")


def pretrain(settings: TinyPretrainSettings) -> dict[str, Any]:
    """Run both stages; returns the final info (also written to ``settings.out``)."""
    started = time.time()
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    out = check_out(settings.out, settings.init)
    log = print if not settings.quiet else (lambda *a, **k: None)

    if settings.data is None:
        data_root = Path(tempfile.mkdtemp(prefix="davir_pretrain_")) / "synth"
        generate_dataset(
            data_root, SynthConfig(scenes=settings.scenes, seed=settings.data_seed), workers=settings.workers
        )
    else:
        data_root = Path(settings.data)
    synthetic_set = load_synthetic_set(data_root)  # scenes.json is read once: it is large
    scenes, data_config = synthetic_set["scenes"], synthetic_set.get("config", {})
    train = load_split(data_root, "train", settings.image_size, limit=settings.train_limit, scenes=scenes)
    test = load_split(data_root, "test", settings.image_size, limit=settings.eval_scenes, scenes=scenes)
    if settings.desc_order == "canonical":
        for split_data in (train, test):
            split_data.descriptions = [
                tuple(canonical_description(d) for d in views) for views in split_data.descriptions
            ]
    truths = pair_truths(scenes, split="test")
    log(f"loaded {len(train.ids)} train / {len(test.ids)} test scenes in {time.time() - started:.0f}s", flush=True)

    if settings.init is not None:  # continue from an earlier checkpoint of this command (its curve is kept)
        try:
            model = build_davir_model(
                DavirModelConfig(
                    family=settings.family,
                    pretrained=str(settings.init),
                    image_size=settings.image_size,
                    patch_size=settings.patch_size if settings.family == "instructblip" else None,
                    train_mode="full",
                    fac=FacConfig(lambda_attn=0.0),
                    epc=EpcConfig(use_entities=False),
                    seed=settings.seed,
                )
            )
        except ConfigError as error:
            # the instructblip family's check of the folder against the sizes asked for, in --init's words
            if "but the pretrained model at" not in str(error):
                raise
            raise DataError(f"--init {settings.init}: {error}; give its --image-size and --patch-size") from None
    else:
        model = build_tiny_model(
            image_size=settings.image_size,
            patch_size=settings.patch_size,
            seed=settings.seed,
            query_tokens=settings.query_tokens,
            family=settings.family,
        )
    if settings.add_llm_layers:
        depth = add_language_layers(model, settings.add_llm_layers)
        log(f"LLM grown to {depth} layers (+{settings.add_llm_layers}, starting as the identity)", flush=True)
    norm = ModelPixels(model)  # uint8 images → the model's pixels (InstructBLIP: CLIP mean/std)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.2f} M parameters, vocabulary {len(model.tokenizer)}", flush=True)

    info: dict[str, Any] = {
        "command": "python -m davir.pretrain_tiny " + " ".join(shlex.quote(a) for a in settings.argv),
        "family": settings.family,
        "seed": settings.seed,
        "data": str(data_root),
        "train_scenes": len(train.ids),
        "eval_scenes": len(test.ids),
        # the generator settings of the data (its seed must differ from the demo's seed 0: other scenes)
        "data_seed": data_config.get("seed"),
        "data_config": data_config,
        "versions": package_versions(),
        "parameters": params,
        "describe_prompt": DESCRIBE_PROMPT,
        "change_prompt": CHANGE_PROMPT,
        "curve": [],
        "best": None,
    }
    if settings.init is not None:
        earlier = read_json(Path(settings.init) / INFO_FILE)
        # the whole chain of stages, newest first: a checkpoint made in several stages can be made again
        info["init"] = {
            "folder": str(settings.init),
            "command": earlier.get("command"),
            "seed": earlier.get("seed"),
            "curve": earlier.get("curve", []),
            "init": earlier.get("init"),
        }
    noise = EntityNoise(wrong=settings.entity_wrong, on_distractor=settings.entity_on_distractor)
    changed_weights = change_type_weights(train, settings.type_weights)
    best_score = -1.0
    step_total = 0
    for stage, steps in (("describe", settings.desc_steps), ("change", settings.change_steps)):
        if steps <= 0:
            continue
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01)
        scheduler = _schedule(optimizer, steps)
        running, stage_start = [], time.time()
        for step in range(1, steps + 1):
            if stage == "describe" or rng.random() < settings.desc_mix:
                pixels, captions = sample_description_batch(train, settings.batch_size, rng, norm)
                loss = description_loss(model, pixels, captions)
            else:
                pairs = sample_change_batch(train, settings.batch_size, rng, norm, changed_weights)
                if rng.random() < settings.entity_share:  # EPC-style prompts with retriever-like entities
                    prompts = entity_prompts(
                        ENTITY_PROMPTS, noisy_entities(train, pairs.rows, pairs.semantic, rng, noise)
                    )
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
            if step % settings.eval_every == 0 or step == steps:
                point: dict[str, Any] = {
                    "stage": stage,
                    "step": step,
                    "total_step": step_total,
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
                    if settings.entity_share > 0:  # what the EPC fine-tune starts from
                        with_entities = evaluate(model, test, truths, norm, entities=True)
                        point["with_entities"] = {
                            k: with_entities[k]
                            for k in ("type_accuracy", "object_accuracy", "exact_accuracy", "per_type")
                        }
                info["curve"].append(point)
                log(json.dumps(point), flush=True)
                scored = point.get("with_entities", point)
                score = (
                    scored.get("type_accuracy", 0.0) + scored.get("object_accuracy", 0.0) if stage == "change" else -0.5
                )
                if stage == "describe" and step == steps or stage == "change" and score > best_score:
                    best_score = max(best_score, score)
                    info["best"] = point
                    info["minutes"] = round((time.time() - started) / 60, 2)
                    save_checkpoint(model, out, info)
        log(f"stage {stage}: {steps} steps in {(time.time() - stage_start) / 60:.1f} min", flush=True)

    info["minutes"] = round((time.time() - started) / 60, 2)
    save_checkpoint(model, out / LAST_FOLDER, {**info, "weights": "the last step's; the folder above holds the best"})
    # The saved folder holds the best model; re-evaluate it with CIDEr for the record.
    best = build_davir_model(
        DavirModelConfig(
            family=settings.family,
            pretrained=str(out),
            epc=EpcConfig(use_entities=False),
            image_size=None if settings.family == "instructblip" else settings.image_size,
        )
    )
    norm = ModelPixels(best)
    info["final_eval"] = evaluate(best, test, truths, norm, cider=settings.cider)
    if settings.entity_share > 0:
        info["final_eval_with_entities"] = evaluate(best, test, truths, norm, cider=settings.cider, entities=True)
    write_json_atomic(out / INFO_FILE, info)
    log(json.dumps(info["final_eval"]), flush=True)
    return info
