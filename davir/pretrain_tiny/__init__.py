"""Pretrain the tiny InstructBLIP-class checkpoint that the demo fine-tunes with DAVIR.

    python -m davir.data synth --out /tmp/synth_pt8k --scenes 8000 --seed 1     # not the demo's seed 0
    python -m davir.pretrain_tiny --out assets/tiny_instructblip --data /tmp/synth_pt8k --seed 1 --desc-order canonical …

Two stages of full training on the synthetic set, single-image description then change captioning, with entity
prompts on a share of the change batches; ``--family qwen2_5_vl`` makes ``assets/tiny_qwen2_5_vl``. The stages,
the evaluation, the written folder and the modules: docs/experiments/tiny_pretraining.md, "The command".
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
    "CHANGE_PROMPT",
    "DESCRIBE_PROMPT",
    "DESCRIPTION_ORDERS",
    "ENTITY_PROMPTS",
    "INFO_FILE",
    "LAST_FOLDER",
    "VIEWS",
    "ChangeBatch",
    "EntityNoise",
    "Normaliser",
    "SceneTensors",
    "add_language_layers",
    "build_tiny_model",
    "canonical_description",
    "change_type_weights",
    "description_accuracy",
    "description_loss",
    "evaluate",
    "evaluation_entities",
    "load_split",
    "TinyPretrainSettings",
    "noisy_entities",
    "package_versions",
    "pretrain",
    "sample_change_batch",
    "sample_description_batch",
    "save_checkpoint",
    "vocabulary_texts",
]
