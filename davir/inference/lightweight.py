"""Captioning with a saved lightweight model (subtraction, SCORER, DIRL, RDD, CHEER).

    model = load_lightweight("runs/scorer_demo/best", device="cpu")
    predictions = caption_pairs_lightweight(model, pairs, feature_cache=FeatureCache("cache"), num_beams=1)

The model folder is what `LightweightTask.save_pretrained` writes: lightweight_config.json,
model.safetensors (the config also in its metadata), vocab.json and, for CHEER, entity_phrases.json.
Image features come from a `preprocess features` cache or are computed online with the same backbone
(a local ResNet-101 state dict, or the seeded random init the model was trained on). CHEER also needs
each pair's retrieved entities (an `EntityCache`). Pairs that cannot be read become `Prediction`s with
an `error`, as in `davir.inference.caption_pairs`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from davir.data.caches import EntityCache
from davir.data.records import ChangePair, DataError
from davir.inference.davir_generation import Prediction
from davir.io import read_json
from davir.models.lightweight import LightweightCaptioner, load_lightweight_model
from davir.runs.files import read_lightweight_info
from davir.text.vocab import Vocabulary

LIGHTWEIGHT_CONFIG = "lightweight_config.json"
# the id `preprocess features --random-init` records (the zero-branch "random-init(seed=N)" of old caches
# cannot be rebuilt: build_backbone no longer makes it)
_RANDOM_INIT = re.compile(r"^random-init\(seed=(\d+),branches=1/sqrt\(blocks\)\)$")


@dataclass
class LightweightBundle:
    """A loaded lightweight model with what captioning needs beside the weights."""

    model: LightweightCaptioner
    vocab: Vocabulary
    info: dict
    model_dir: Path
    entity_phrases: list[str] | None = None
    entity_index: dict[str, int] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.info["method"]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_lightweight(model_dir: str | Path, device: str | torch.device | None = None) -> LightweightBundle:
    """Load a folder written by `LightweightTask.save_pretrained` (eval mode)."""
    model_dir = Path(model_dir)
    config_path = model_dir / LIGHTWEIGHT_CONFIG
    if not config_path.is_file():
        raise DataError(f"{model_dir} is not a saved lightweight model (no {LIGHTWEIGHT_CONFIG})")
    info = read_lightweight_info(model_dir)  # each key checked: a damaged file is named with its key
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_lightweight_model(model_dir / info.get("weights", "model.safetensors"), device=device).eval()
    vocab = Vocabulary.load(model_dir / info.get("vocabulary", "vocab.json"))
    if len(vocab) != model.config.vocab_size:
        raise DataError(f"{model_dir}: vocab.json has {len(vocab)} words but the model was built for {model.config.vocab_size}")
    bundle = LightweightBundle(model, vocab, info, model_dir)
    if info.get("entity_phrases"):
        phrases = read_json(model_dir / info["entity_phrases"])
        if not isinstance(phrases, list) or not all(isinstance(phrase, str) for phrase in phrases):
            raise DataError(f"{model_dir / info['entity_phrases']}: expected a JSON list of entity phrases "
                            f"(named by key 'entity_phrases' of {config_path})")
        bundle.entity_phrases = list(phrases)
        bundle.entity_index = {phrase: i for i, phrase in enumerate(phrases)}
    return bundle


class OnlineFeatures:
    """ResNet-101 layer3 features computed on the fly with the recipe of `preprocess features`."""

    def __init__(self, weights: str | Path | None, *, trained_with: str | None = None, device: str | torch.device = "cpu"):
        from davir.preprocessing.backbone import IMAGENET_STD, build_backbone, file_sha256, shipped_backbone_matching

        match = _RANDOM_INIT.match(str(trained_with or ""))
        if weights is None and match is None:
            weights = shipped_backbone_matching(trained_with)  # the demo's: found, and checked by its hash
            if weights is None:
                raise DataError("the model was trained on features of the backbone "
                                f"{trained_with!r}: give that weights file with --backbone-weights")
        elif weights is not None and trained_with and not match and f"sha256:{file_sha256(Path(weights))}" != trained_with:
            raise DataError(f"{weights} is not the backbone the model was trained on ({trained_with})")
        self.device = torch.device(device)
        self.std = IMAGENET_STD
        self.backbone = build_backbone(weights, random_init=weights is None, seed=int(match.group(1)) if match else 0)
        self.backbone = self.backbone.to(self.device)

    @torch.no_grad()
    def __call__(self, paths: Sequence[Path]) -> torch.Tensor:
        from davir.preprocessing.backbone import load_resized, normalize_batch

        images = torch.stack([torch.from_numpy(load_resized(Path(p), record=str(p))).permute(2, 0, 1) for p in paths])
        features = self.backbone(normalize_batch(images.to(self.device), self.std))
        return features.to(torch.float16).float()  # the cache stores fp16: round the same way


def _check_cache(bundle: LightweightBundle, cache) -> None:
    trained_with = (bundle.info.get("features") or {}).get("weights")
    used = cache.manifest.get("weights")
    if trained_with and used != trained_with:
        raise DataError(f"feature cache {cache.root} was made with backbone {used!r}, the model was trained on "
                        f"{trained_with!r} features")


def caption_pairs_lightweight(
    model: LightweightBundle,
    pairs: Sequence[ChangePair],
    *,
    feature_cache=None,
    backbone_weights: str | Path | None = None,
    entity_cache: EntityCache | None = None,
    batch_size: int = 32,
    num_beams: int = 1,
    max_len: int | None = None,
    progress: bool = True,
) -> list[Prediction]:
    """Caption `pairs` with a loaded lightweight model; features from `feature_cache` or computed online.

    `max_len` bounds the generated tokens (default: the model's decoder length). CHEER needs
    `entity_cache` (the pairs' retrieved entities, the same vocabulary as in training).
    """
    captioner = model.model
    device = model.device
    if feature_cache is not None:
        _check_cache(model, feature_cache)
        online = None
    else:
        online = OnlineFeatures(backbone_weights, trained_with=(model.info.get("features") or {}).get("weights"),
                                device=device)
    is_cheer = model.method == "cheer"
    k = captioner.config.cheer_entities
    if is_cheer and entity_cache is None:
        raise DataError("this CHEER model needs the retrieved entities of every pair: pass an entity cache "
                        "(python -m preprocess entities … --image-level --top-k 3)")
    max_len = captioner.config.max_len if max_len is None else min(max_len, captioner.config.max_len)
    predictions: list[Prediction] = []
    bar = tqdm(total=len(pairs), desc="caption", disable=not progress)
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start: start + batch_size]
        ready, before, after, entities = [], [], [], []
        for pair in chunk:
            try:
                ids = None
                if is_cheer:
                    phrases = [e for e, _ in entity_cache.get(pair.pair_id)[:k]]
                    unknown = [e for e in phrases if e not in model.entity_index]
                    if len(phrases) < k or unknown:
                        raise DataError(f"pair {pair.pair_id!r}: needs {k} entities of the model's vocabulary, got "
                                        f"{phrases} (unknown: {unknown})")
                    ids = [model.entity_index[e] for e in phrases]
                if feature_cache is not None:
                    before.append(feature_cache.get(pair.before))
                    after.append(feature_cache.get(pair.after))
                else:
                    for path in (pair.before, pair.after):
                        if not Path(path).is_file():
                            problem = ("the image path is a folder, not an image file" if Path(path).is_dir()
                                       else "image file is missing")
                            raise DataError(f"pair {pair.pair_id!r}: {problem}: {path}")
                ready.append(pair)
                entities.append(ids)
            except DataError as error:
                predictions.append(Prediction(pair.pair_id, error=str(error)))
        if ready:
            if online is not None:
                features = online([p for pair in ready for p in (pair.before, pair.after)])
                feat_before, feat_after = features[0::2], features[1::2]
            else:
                feat_before, feat_after = torch.stack(before).to(device), torch.stack(after).to(device)
            entity_ids = torch.tensor(entities, dtype=torch.long, device=device) if is_cheer else None
            ids = captioner.generate(feat_before, feat_after, max_len=max_len, beam_size=num_beams, entities=entity_ids)
            for pair, row, entity_row in zip(ready, ids, entities):
                names = [model.entity_phrases[i] for i in entity_row] if is_cheer else []
                predictions.append(Prediction(pair.pair_id, caption=model.vocab.decode(row), entities=names))
        bar.update(len(chunk))
    bar.close()
    order = {pair.pair_id: i for i, pair in enumerate(pairs)}
    return sorted(predictions, key=lambda p: order[p.pair_id])


def run_captioner(model_dir: Path, run_data: dict, *, root: Path, entities: Path | None, device,
                  batch_size: int, num_beams: int, max_new_tokens: int):
    """For `evaluate.py --checkpoint`: a `caption(pairs, progress)` function over the run's caches.

    Features come from the run's `data.features` cache (its manifest names the dataset root, overridden
    by `root`) or, without one, are computed online; CHEER's entities come from `entities` or the run's
    `data.entities` (that cache must cover the evaluated split).
    """
    from davir.data.feature_cache import FeatureCache

    bundle = load_lightweight(model_dir, device=device)
    cache_dir = run_data.get("features")
    feature_cache = FeatureCache(cache_dir, dataset_root=root) if cache_dir else None
    entity_cache = None
    if bundle.method == "cheer":
        entity_dir = entities or run_data.get("entities")
        if entity_dir is None:
            raise DataError("this CHEER model needs retrieved entities: pass --entities CACHE "
                            "(python -m preprocess entities … --image-level --top-k 3)")
        entity_cache = EntityCache(entity_dir)

    def caption(pairs: Sequence[ChangePair], progress: bool = True) -> list[Prediction]:
        return caption_pairs_lightweight(bundle, pairs, feature_cache=feature_cache, entity_cache=entity_cache,
                                         batch_size=batch_size, num_beams=num_beams, max_len=max_new_tokens,
                                         progress=progress)

    return caption
