"""The lightweight methods (subtraction, SCORER, DIRL, RDD, CHEER) as a Task of the one training loop.

`build_task` (davir.training.tasks) builds a `LightweightTask` for every lightweight `config.method`. The task
offers the same interface as `DavirTask` (model, train/val datasets, losses, generation, saving):

* inputs: cached ResNet-101 layer3 features (`data.features`, `python -m preprocess features`) through
  `FeatureField`; the word vocabulary is built from the training captions (change and no-change
  captions, docs/methods/README.md) and saved with the model;
* CLEVR-Change-format data trains on *scenes* (§0.6): the semantic pair and the distractor pair of each
  scene (paired by `scene_id`) go through `clevr_pair_loss` (role swap p = 0.5, losses 0.5/0.5); other
  formats train on plain pairs; validation always scores plain pairs.

What a method's batches carry beside the features and captions, the task asks the method for through one hook,
its captioner's `inputs` class (davir.models.lightweight.inputs): CHEER's retrieved entities and entity bank
(cheer.EntityInputs), RDD's caption segments (rdd.AttributeInputs), a user's method's own. The task names no method.

The text tower (`uses_text_tower`) comes from a local open_clip checkpoint (`lightweight.text_encoder`); without
one a seeded random-init tower of the same architecture is used and the run log (and the saved model's
lightweight_config.json) says so — its features only separate strings, they carry no CLIP semantics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from davir.data.caches import check_cache_root
from davir.data.dataset import ChangeCaptionDataset, stable_index
from davir.data.feature_field import FeatureField
from davir.data.feature_table import PooledFeatureTable, pool_grid, pooled_size
from davir.data.formats import read_dataset
from davir.data.records import DISTRACTOR, ChangePair
from davir.errors import DataError
from davir.io import write_json_atomic
from davir.models.clip_loader import ClipOptions, check_config_file, load_open_clip
from davir.models.lightweight import (
    LightweightCaptioner,
    LightweightConfig,
    build_lightweight_model,
    clevr_pair_loss,
    get_method,
    method_names,
    save_lightweight_model,
)
from davir.models.lightweight.inputs import InputContext
from davir.text.vocab import Vocabulary, tokenize
from davir.training.tasks import flat_scalars, move_to_device, register_task_family

LIGHTWEIGHT_CONFIG = "lightweight_config.json"
WEIGHTS_FILE = "model.safetensors"
VOCAB_FILE = "vocab.json"
SCENE_FORMATS = ("clevr_change",)  # formats whose records are scenes with a semantic and a distractor pair
TEXT_SEED = 0


# --- the frozen text tower ----------------------------------------------------------------------------
@dataclasses.dataclass
class TextEncoder:
    """A frozen open_clip text tower (a CLIP model or a bare TextTransformer) with its tokenizer."""

    module: nn.Module
    tokenizer: Any
    model_name: str
    weights: str  # the checkpoint path, or "random-init(seed=N)"

    @property
    def random_init(self) -> bool:
        return self.weights.startswith("random-init")

    def describe(self) -> dict:
        return {"model": self.model_name, "weights": self.weights}

    def token_ids(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids (B, L), trimmed after the longest <EOT> (later positions never reach the pooled output)."""
        ids = self.tokenizer(list(texts))
        length = int((ids != 0).sum(dim=1).max())
        return ids[:, : max(length, 1)]

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """Projected text features (N, d) of plain strings, float32 on the CPU.

        Runs the tower on ids trimmed after the longest <EOT> (through RDD's `TextTowerAdapter`, which
        slices the causal mask, with no context vectors): the pooled output equals `encode_text` on the
        full 77-token context at a fraction of the cost.
        """
        from davir.models.lightweight.rdd import TextTowerAdapter

        adapter = TextTowerAdapter(self.module)  # shares the tower's (frozen) weights
        empty = torch.zeros(0, adapter.width)
        chunks = [
            adapter(self.token_ids(texts[start : start + batch_size]), empty).float()
            for start in range(0, len(texts), batch_size)
        ]
        return torch.cat(chunks) if chunks else torch.zeros(0)


def text_tower_dims(module: nn.Module) -> tuple[int, int]:
    """(token width, output dim) of an open_clip text tower."""
    tower = getattr(module, "text", module)
    width = tower.token_embedding.weight.shape[1]
    projection = tower.text_projection
    if projection is None:
        return width, width
    return width, projection.out_features if isinstance(projection, nn.Linear) else projection.shape[1]


# train.py's keys for the text tower, named by the messages of davir.models.clip_loader
TEXT_TOWER_KEYS = ClipOptions(
    checkpoint="lightweight.text_encoder",
    config="lightweight.text_encoder_config",
    model="lightweight.text_encoder_model",
    joiner="=",
)


def load_text_encoder(
    model_name: str, checkpoint: str | None, *, config: str | None = None, seed: int = TEXT_SEED
) -> TextEncoder:
    """The open_clip text tower of `model_name`: from a local checkpoint, else a seeded random init (no download)."""
    try:
        import open_clip
        from open_clip.model import _build_text_tower
    except ImportError as error:
        raise DataError("CHEER entities and RDD attributes need open_clip (`pip install open_clip_torch`)") from error
    if checkpoint is not None:
        model, _, tokenizer = load_open_clip(model_name, checkpoint, config=config, options=TEXT_TOWER_KEYS)
        return TextEncoder(model.requires_grad_(False).eval(), tokenizer, model_name, str(checkpoint))
    if config is not None:
        open_clip.add_model_config(check_config_file(config, TEXT_TOWER_KEYS))
    model_config = open_clip.get_model_config(model_name)
    if model_config is None:
        raise DataError(
            f"unknown open_clip model {model_name!r} (set lightweight.text_encoder_config to its JSON config)"
        )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        tower = _build_text_tower(model_config["embed_dim"], model_config["text_cfg"])
    finally:
        torch.random.set_rng_state(generator_state)  # do not disturb the run's seeded RNG stream
    return TextEncoder(
        tower.requires_grad_(False).eval(), open_clip.get_tokenizer(model_name), model_name, f"random-init(seed={seed})"
    )


# --- datasets -------------------------------------------------------------------------------------------
class SceneCaptionDataset(ChangeCaptionDataset):
    """CLEVR-Change scenes (§0.6): the semantic pair's example plus a no-change caption of the same scene.

    The change caption is sampled per epoch as in `ChangeCaptionDataset`; the no-change caption is
    sampled the same deterministic way (from another seed), so a resumed run sees the same batches.
    """

    def __init__(
        self, semantic_pairs: Sequence[ChangePair], no_change: dict[str, tuple[str, ...]], fields, *, seed: int = 0
    ):
        super().__init__(semantic_pairs, fields, caption_mode="sample", seed=seed, require_captions=True)
        self.no_change = no_change

    def __getitem__(self, index: int) -> dict[str, Any]:
        example = super().__getitem__(index)
        captions = self.no_change[self.pairs[index].scene_id]
        example["no_change_caption"] = captions[stable_index(self.seed + 1, self.epoch, index, len(captions))]
        return example


def pair_scenes(
    pairs: Sequence[ChangePair], source: str
) -> tuple[list[ChangePair], dict[str, tuple[str, ...]], dict[str, str]]:
    """(semantic pairs, scene_id -> no-change captions, scene_id -> distractor pair id), paired by `scene_id`."""
    semantic: dict[str, ChangePair] = {}
    distractor: dict[str, ChangePair] = {}
    for pair in pairs:
        if pair.scene_id is None:
            raise DataError(f"{source}: pair {pair.pair_id!r} has no scene_id; scene batches need one per record")
        table = distractor if pair.change_type == DISTRACTOR else semantic
        if pair.scene_id in table:
            raise DataError(
                f"{source}: scene {pair.scene_id!r} has two {'distractor' if table is distractor else 'semantic'} pairs"
            )
        table[pair.scene_id] = pair
    unpaired = sorted(set(semantic) ^ set(distractor))
    if unpaired:
        raise DataError(
            f"{source}: {len(unpaired)} scene(s) lack their semantic or distractor pair, e.g. {unpaired[:3]}"
        )
    empty = [scene for scene, pair in distractor.items() if not pair.captions]
    if empty:
        raise DataError(f"{source}: {len(empty)} distractor pair(s) have no no-change caption, e.g. {empty[:3]}")
    scenes = list(semantic.values())
    return (scenes, {s: distractor[s].captions for s in semantic}, {s: distractor[s].pair_id for s in semantic})


# --- the task --------------------------------------------------------------------------------------------
def check_feature_shape(lw: LightweightConfig, shape, cache) -> None:
    """Refuse a model built for other grids than the cache holds, before any work: the front-end would only
    fail at the first batch, with a shape error that names neither the setting nor the cache."""
    if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(n, int) for n in shape)):
        raise DataError(f"{Path(cache) / 'manifest.json'}: 'shape' must be [channels, height, width], got {shape!r}")
    channels, height, _ = shape
    problems = []
    if lw.backbone_channels != channels:
        fix = f"{channels} + the 2 coordinate channels" if lw.coord_channels else "no coordinate channels"
        problems.append(
            f"lightweight.feat_dim={lw.feat_dim} expects {lw.backbone_channels} feature channels; "
            f"set lightweight.feat_dim={channels + 2 if lw.coord_channels else channels} ({fix})"
        )
    if lw.grid_size != height:
        problems.append(
            f"lightweight.grid_size={lw.grid_size} expects {lw.grid_size} × {lw.grid_size} grids; "
            f"set lightweight.grid_size={height}"
        )
    if problems:
        raise DataError(f"the features in {cache} are {' × '.join(map(str, shape))}: {'; '.join(problems)}")


def feature_statistics(
    cache, pairs: Sequence[ChangePair], limit: int = 256, pool: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of the cached grid features of (up to `limit`, evenly spread) train images,
    average-pooled by `pool` as the front-end will see them.

    The front-end standardises its input with them [D] (`FeatureFrontend.set_feature_statistics`).
    """
    images = list(dict.fromkeys(p for pair in pairs for p in (pair.before, pair.after) if p is not None))
    images = images[:: max(1, len(images) // limit)][:limit]
    total = total_sq = None
    count = 0
    for path in images:
        grid = pool_grid(cache.get(path).double(), pool).flatten(1)  # (C, H·W)
        total = grid.sum(1) if total is None else total + grid.sum(1)
        total_sq = grid.pow(2).sum(1) if total_sq is None else total_sq + grid.pow(2).sum(1)
        count += grid.shape[1]
    mean = total / count
    std = (total_sq / count - mean.pow(2)).clamp(min=0).sqrt()
    return mean.float(), std.float()


@register_task_family("lightweight", method_names)
class LightweightTask:
    """One lightweight change captioner on cached grid features (see the module docstring)."""

    def __init__(self, config, accelerator: Accelerator):
        from davir.data.feature_cache import FeatureCache, not_a_cache

        self.config = config
        self.accelerator = accelerator
        self.notes: list[str] = []
        data = config.data
        method = config.method
        if data.features is None:
            raise DataError(
                f"{method} trains on cached ResNet-101 features but data.features is not set: run "
                f"`python -m preprocess features --format {data.format} --root {data.root} --split "
                f"{data.train_split} --out CACHE --weights resnet101.pth` (and for {data.val_split}), "
                "then set data.features=CACHE"
            )
        problem = not_a_cache(
            data.features,
            what=f"data.features={data.features}",
            command=f"python -m preprocess features --format {data.format} --root {data.root} --split "
            f"{data.train_split} --out {data.features} …",
        )
        if problem is not None:
            raise problem
        check_cache_root(data.features, data.root, key="data.features", moved_from=data.moved_from)
        self.features = FeatureCache(data.features, dataset_root=data.root)
        check_feature_shape(config.lightweight, self.features.manifest.get("shape"), data.features)
        train_index = read_dataset(data.format, data.root, data.train_split)
        train_pairs = train_index.pairs[: data.max_train_pairs] if data.max_train_pairs else train_index.pairs
        val_pairs = read_dataset(data.format, data.root, data.val_split).pairs[: config.run.val_max_pairs]
        self.scene_mode = data.format in SCENE_FORMATS

        # Vocabulary from the training captions (change and no-change, §0.5); the decoder's size follows it.
        captions = [c for p in train_pairs for c in p.captions]
        if not captions:
            raise DataError(
                f"{data.format} {data.train_split} at {data.root} has no captions to build the vocabulary from"
            )
        self.vocab = Vocabulary.build(captions)
        longest = max(len(tokenize(c)) for c in captions) + 2
        lw: LightweightConfig = config.lightweight  # the settings of `method` (TrainConfig built them)
        if longest > lw.max_len:
            raise DataError(
                f"the longest training caption has {longest} tokens with <START>/<END>, more than "
                f"lightweight.max_len={lw.max_len}; raise it"
            )
        if lw.vocab_size != len(self.vocab):
            self.note(
                f"vocabulary of the training captions has {len(self.vocab)} words (config said "
                f"{lw.vocab_size}); the decoder uses {len(self.vocab)}"
            )
            lw = dataclasses.replace(lw, vocab_size=len(self.vocab))

        fields: list = []
        source = (
            f"python -m preprocess {{cmd}} --format {data.format} --root {data.root} --split {{split}} --out {{out}}"
        )
        check_features = [(data.train_split, train_pairs), (data.val_split, val_pairs)]
        for split, pairs in check_features:
            images = {
                p
                for pair in pairs
                for p in (pair.before, pair.after, pair.distractor if self.scene_mode else None)
                if p is not None
            }
            missing = [str(p) for p in images if p not in self.features]
            if missing:
                raise DataError(
                    f"{len(missing)} of {len(images)} images of {split} have no features in {data.features}, "
                    f"e.g. {missing[:2]}; run `{source.format(cmd='features', split=split, out=data.features)} …`"
                )

        # Text tower (CHEER entity bank, RDD attribute tokens).
        self.text_encoder: TextEncoder | None = None
        if lw.uses_text_tower:
            model_name = lw.text_model
            self.text_encoder = load_text_encoder(model_name, lw.text_encoder, config=lw.text_encoder_config)
            if self.text_encoder.random_init:
                self.note(
                    f"no open_clip weights (lightweight.text_encoder unset): using a RANDOM-INIT {model_name} text "
                    f"tower ({self.text_encoder.weights}); its features separate strings but carry no CLIP semantics"
                )
            width, out_dim = text_tower_dims(self.text_encoder.module)
            wanted = lw.text_tower_sizes(width, out_dim)
            changed = {k: v for k, v in wanted.items() if getattr(lw, k) != v}
            if changed:
                self.note(
                    f"text tower {model_name} sets {changed} (config had { {k: getattr(lw, k) for k in changed} })"
                )
                lw = dataclasses.replace(lw, **changed)

        # What the method's batches carry beside features and captions (CHEER's entities, RDD's caption segments).
        from davir.preprocessing.profiles import check_cache_profiles

        self.inputs = get_method(method).captioner.inputs(
            InputContext(data, train_pairs, val_pairs, source, self.note, self.text_encoder, check_cache_profiles)
        )
        lw = self.inputs.prepare(lw)

        self.lightweight = lw
        extra = {"text_tower": self.text_encoder.module} if lw.attaches_text_tower else {}
        self.model: nn.Module = build_lightweight_model(lw, **extra).to(accelerator.device)
        if lw.frontend_init == "scaled":  # [D] "paper": the raw features, as the references
            mean, std = feature_statistics(self.features, train_pairs, pool=lw.feature_pool)
            self.model.frontend.set_feature_statistics(mean.to(accelerator.device), std.to(accelerator.device))
        self.feature_source = self._preloaded_features(train_pairs + list(val_pairs), lw)
        self.inputs.model_built(self.model)
        self.feature_weights = str(self.features.manifest.get("weights"))

        # Datasets.
        val_fields = [FeatureField(self.feature_source), *self.inputs.fields()]
        if self.scene_mode:
            if data.caption_mode != "sample":
                raise DataError(
                    "CLEVR-Change scene batches sample one change and one no-change caption per scene; "
                    "set data.caption_mode=sample"
                )
            scenes, no_change, distractor_ids = pair_scenes(train_pairs, f"{data.format} {data.train_split}")
            fields = [
                FeatureField(self.feature_source, distractor=True),
                *self.inputs.fields(distractor_ids=distractor_ids),
            ]
            self.train_dataset = SceneCaptionDataset(scenes, no_change, fields, seed=config.run.seed)
        else:
            fields = [FeatureField(self.feature_source), *self.inputs.fields()]
            self.train_dataset = ChangeCaptionDataset(
                train_pairs, fields, caption_mode=data.caption_mode, seed=config.run.seed, require_captions=True
            )
        self.val_dataset = ChangeCaptionDataset(val_pairs, val_fields, seed=config.run.seed)
        for line in self.notes:
            accelerator.print(f"[{method}] note: {line}")

    # --- setup helpers ----------------------------------------------------------------------------------
    def note(self, line: str) -> None:
        """A fact about this run that the log and the saved model must state."""
        self.notes.append(line)

    def _preloaded_features(self, pairs: Sequence[ChangePair], lw: LightweightConfig):
        """The run's features in memory, pooled once (`PooledFeatureTable`), when they fit `data.preload_features_gb`."""
        images = list(
            dict.fromkeys(p for pair in pairs for p in (pair.before, pair.after, pair.distractor) if p is not None)
        )
        tokens = pooled_size(lw.grid_size, lw.feature_pool)
        size_gb = len(images) * lw.backbone_channels * tokens * tokens * 4 / 1e9  # float32
        if not size_gb or size_gb > self.config.data.preload_features_gb:
            return self.features
        return PooledFeatureTable.load(self.features, images, pool=lw.feature_pool)

    # --- the Task interface -------------------------------------------------------------------------------
    def unwrapped(self) -> LightweightCaptioner:
        return self.accelerator.unwrap_model(self.model)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def to_device(self, batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
        return move_to_device(batch, device)

    def after_optimizer_step(self) -> None:
        self.unwrapped().after_optimizer_step()

    def training_losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        device = batch["feat_before"].device
        max_len = self.lightweight.max_len
        captions_in, captions_target = (t.to(device) for t in self.vocab.caption_tensors(batch["caption"], max_len))
        extras = self.inputs.model_inputs(batch, device)
        if "no_change_caption" in batch:  # a CLEVR-Change scene batch (§0.6)
            no_change_in, no_change_target = (
                t.to(device) for t in self.vocab.caption_tensors(batch["no_change_caption"], max_len)
            )
            scene = {
                "feat_before": batch["feat_before"],
                "feat_after": batch["feat_after"],
                "feat_distractor": batch["feat_distractor"],
                "captions_in": captions_in,
                "captions_target": captions_target,
                "no_change_in": no_change_in,
                "no_change_target": no_change_target,
            }
            if extras:  # the method's own inputs, of each pair
                distractor = self.inputs.model_inputs(batch, device, pair="distractor")
                scene.update({**extras, **{f"{key}_distractor": distractor.get(key) for key in extras}})
            return clevr_pair_loss(self.model, scene)
        return self.model(batch["feat_before"], batch["feat_after"], captions_in, captions_target, **extras)

    @torch.no_grad()
    def generate(self, batch: dict[str, Any], *, max_new_tokens: int = 30, num_beams: int = 1) -> list[str]:
        model = self.unwrapped()
        device = batch["feat_before"].device
        inputs = self.inputs.model_inputs(batch, device, pair="generate")
        ids = model.generate(
            batch["feat_before"],
            batch["feat_after"],
            max_len=min(max_new_tokens, model.config.max_len),
            beam_size=num_beams,
            **inputs,
        )
        return [self.vocab.decode(row) for row in ids]

    def save_pretrained(self, directory) -> None:
        """model.safetensors (config in its metadata) + vocab.json (+ entity_phrases.json) + lightweight_config.json."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model = self.unwrapped()
        save_lightweight_model(model, directory / WEIGHTS_FILE)
        self.vocab.save(directory / VOCAB_FILE)
        saved = self.inputs.save(directory)  # the method's own files (CHEER: entity_phrases.json)
        write_json_atomic(
            directory / LIGHTWEIGHT_CONFIG,
            {
                "method": self.config.method,
                "config": model.config.to_dict(),
                "weights": WEIGHTS_FILE,
                "vocabulary": VOCAB_FILE,
                "entity_phrases": None,  # a key of every lightweight_config.json (davir.runs.files)
                **saved,
                "features": {"weights": self.feature_weights, "cache": str(self.config.data.features)},
                "text_encoder": self.text_encoder.describe() if self.text_encoder else None,
                "acr_prompts": getattr(model.config, "acr_prompts", None),  # RDD's setting; null for the others
                "data_format": self.config.data.format,
                "notes": self.notes,
            },
        )

    def tracker_config(self) -> dict:
        return flat_scalars(self.config)


__all__ = ["LightweightTask", "SceneCaptionDataset", "TextEncoder", "load_text_encoder", "pair_scenes"]
