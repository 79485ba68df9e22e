"""Pretrain the tiny InstructBLIP-class checkpoint that the demo fine-tunes with DAVIR.

    python -m davir.data synth --out /tmp/synth_pt8k --scenes 8000 --seed 1     # not the demo's seed 0
    python -m davir.pretrain_tiny --out assets/tiny_instructblip --data /tmp/synth_pt8k --seed 1 --desc-order canonical …

``--family qwen2_5_vl`` makes ``assets/tiny_qwen2_5_vl`` the same way (a chat turn with one picture in the
description stage, both pictures in the change stage; docs/experiments/tiny_pretraining.md).

A real DAVIR run starts from a pretrained InstructBLIP; the demo mirrors that with a ~2 M-parameter model
of the same classes (``InstructBlipForConditionalGeneration`` + ``InstructBlipProcessor``), pretrained here
on the built-in synthetic set with full training:

1. **single-image description** (``--desc-steps``): one image's 16 query tokens and the prompt
   "Describe the image." → its objects left to right ("small red metal sphere , large gray rubber cube");
   docs/experiments/demo_calibration.md shows this is what lets a tiny model learn to look at all;
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
``build_davir_model(DavirModelConfig(pretrained=OUT))`` loads like a real InstructBLIP folder. ``OUT/last``
holds the same files for the final step's weights, to continue a stage that was still improving (``--init``).

The package, one idea a module: ``model`` (prompts, vocabulary, the tiny build), ``data`` (scenes in memory),
``batches`` (sampled batches, the description loss, entity noise), ``evaluation`` (held-out scoring),
``checkpoint`` (the written folder) and ``loop`` (the two stages); the command line is davir.cli.pretrain_tiny.
"""

from davir.pretrain_tiny.batches import (
    ChangeBatch,
    EntityNoise,
    change_type_weights,
    description_loss,
    noisy_entities,
    sample_change_batch,
    sample_description_batch,
)
from davir.pretrain_tiny.checkpoint import INFO_FILE, LAST_FOLDER, package_versions, save_checkpoint
from davir.pretrain_tiny.data import (
    DESCRIPTION_ORDERS,
    VIEWS,
    Normaliser,
    SceneTensors,
    canonical_description,
    load_split,
)
from davir.pretrain_tiny.evaluation import description_accuracy, evaluate, evaluation_entities
from davir.pretrain_tiny.loop import TinyPretrainSettings, pretrain
from davir.pretrain_tiny.model import (
    CHANGE_PROMPT,
    DESCRIBE_PROMPT,
    ENTITY_PROMPTS,
    add_language_layers,
    build_tiny_model,
    vocabulary_texts,
)

__all__ = [
    "CHANGE_PROMPT", "DESCRIBE_PROMPT", "DESCRIPTION_ORDERS", "ENTITY_PROMPTS", "INFO_FILE", "LAST_FOLDER", "VIEWS",
    "ChangeBatch", "EntityNoise", "Normaliser", "SceneTensors", "add_language_layers", "build_tiny_model",
    "canonical_description",
    "change_type_weights",
    "description_accuracy", "description_loss", "evaluate", "evaluation_entities", "load_split",
    "TinyPretrainSettings", "noisy_entities", "package_versions", "pretrain", "sample_change_batch",
    "sample_description_batch",
    "save_checkpoint", "vocabulary_texts",
]
