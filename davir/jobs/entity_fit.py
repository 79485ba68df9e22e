"""What `python -m preprocess entities` builds once, before any pair gets entities (Eqs. 8-9; davir/jobs/entities.py).

The mask sources, the entity vocabulary of the fit split's captions, the reference labels, and the fitted
retriever and entity gate fitted on the fit split's change regions (or whole frames). Under `accelerate
launch` the main process runs `fit_shared_parts` while the others wait; they then load what it saved.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from davir.data.caches import EntityCache, MaskCache, PairMasks
from davir.data.images import load_mask, load_pair
from davir.data.records import ChangePair, DatasetIndex
from davir.errors import DataError
from davir.io import path_record, write_json_atomic
from davir.jobs.component_options import component_settings
from davir.preprocessing.components import Component
from davir.preprocessing.retrievers import (
    RETRIEVERS,
    EntityGate,
    PairRegions,
    Retriever,
    frame_pair_features,
    pair_features,
    pair_regions,
)
from davir.text.entity_vocabulary import EntityVocabulary, build_vocabulary, lexicon_mismatch
from davir.text.extractors import PhraseExtractor, get_extractor

GT_MASKS = "gt"
FITTED_INPUT = {False: "regions", True: "whole_frame"}  # what a fitted retriever was fitted on; absent = regions


# ---------------------------------------------------------------------------------------------------
# Mask sources: a MaskCache folder, or the dataset's own ground-truth masks
# ---------------------------------------------------------------------------------------------------


class MaskSource(Protocol):
    def read(self, pair: ChangePair) -> PairMasks: ...

    def describe(self) -> str: ...


class CachedMasks:
    """Masks written by `python -m preprocess masks` (davir.data.caches.MaskCache)."""

    def __init__(self, root: str | Path):
        if not Path(root).is_dir():
            raise DataError(f"mask cache folder {root} does not exist; run `python -m preprocess masks --out {root} …`")
        self.cache = MaskCache(root)

    def read(self, pair: ChangePair) -> PairMasks:
        return self.cache.read(pair.pair_id)

    def describe(self) -> str:
        return str(self.cache.root)


class GroundTruthMasks:
    """The ground-truth change masks a reader attaches to each pair (`gt_mask_before`/`gt_mask_after`)."""

    def read(self, pair: ChangePair) -> PairMasks:
        if not pair.has_gt_mask:
            raise DataError(
                f"pair {pair.pair_id!r} has no ground-truth masks (only the built-in synthetic set "
                "ships them); pass a mask cache to --masks instead of 'gt'"
            )
        return PairMasks(
            before=load_mask(pair.gt_mask_before, record=pair.pair_id),
            after=load_mask(pair.gt_mask_after, record=pair.pair_id),
            info={"pair_id": pair.pair_id},
        )

    def describe(self) -> str:
        return GT_MASKS


def open_mask_source(spec: str) -> MaskSource:
    return GroundTruthMasks() if spec == GT_MASKS else CachedMasks(spec)


def mask_source_record(value: str | None) -> str | None:
    """`--masks` as recorded: the word `gt`, or the mask cache folder as `davir.io.path_record` writes it."""
    return value if value in (None, GT_MASKS) else path_record(value)


def recorded_paths_resolved(settings: dict) -> dict:
    """A cache's recorded settings with its paths as this version records them (an older version recorded a
    relative path as given; it resolves against the current folder): the mask caches here, the retriever's own
    (its weights file) by `Component.as_recorded_today`."""
    resolved = {
        key: mask_source_record(value) if key in ("masks", "fit_masks") else value for key, value in settings.items()
    }
    retriever = settings.get("retriever")
    return RETRIEVERS[retriever].as_recorded_today(resolved) if retriever in RETRIEVERS else resolved


def load_pair_regions(
    pair: ChangePair, masks: MaskSource, *, mask_source: str, pad: float, weighting: str
) -> PairRegions:
    """Load a pair's images and masks and cut out both change regions (Eq. 8)."""
    before, after = load_pair(pair)
    return pair_regions(
        pair.pair_id,
        np.asarray(before),
        np.asarray(after),
        masks.read(pair),
        mask_source=mask_source,
        pad=pad,
        weighting=weighting,
    )


# ---------------------------------------------------------------------------------------------------
# Vocabulary and training labels
# ---------------------------------------------------------------------------------------------------


def split_captions(index: DatasetIndex) -> list[str]:
    return [caption for pair in index for caption in pair.captions]


class SubjectExtractor:
    """CHEER §4.8: a caption's entity is its *subject* (`PhraseExtractor.subject`), not every noun phrase.

    Wraps an extractor so that `phrases(caption)` is ``[subject]`` (or ``[]``): the vocabulary, the fitted
    retriever's labels and the entity evaluation then all count subjects only. "the red cube changed to
    blue" names "red cube", never "blue".
    """

    def __init__(self, base: PhraseExtractor):
        self.base = base
        self.backend = base.backend

    def phrases(self, caption: str) -> list[str]:
        subject = self.base.subject(caption)
        return [subject] if subject else []

    def subject(self, caption: str) -> str | None:
        return self.base.subject(caption)

    def describe(self) -> dict:
        return {**self.base.describe(), "entities": "subjects"}


def vocabulary_extractor(backend: str, captions: list[str], subjects: bool) -> PhraseExtractor:
    extractor = get_extractor(backend, corpus=captions)
    return SubjectExtractor(extractor) if subjects else extractor  # type: ignore[return-value]


def load_or_build_vocabulary(
    path: Path, fit_index: DatasetIndex, *, min_count: int, backend: str, subjects: bool = False
) -> tuple[EntityVocabulary, PhraseExtractor]:
    """CACHE/vocab.json if present (checked against the settings), else built from the fit split.

    `subjects` (CHEER's image-level entities): the vocabulary holds the captions' subject phrases only.
    """
    captions = split_captions(fit_index)
    if path.is_file():
        vocabulary = EntityVocabulary.load(path)
        expected = {"format": fit_index.format, "split": fit_index.split}
        found = {key: vocabulary.source.get(key) for key in expected}
        stored_subjects = vocabulary.extractor.get("entities") == "subjects"
        if (
            found != expected
            or vocabulary.min_count != min_count
            or stored_subjects != subjects
            or (backend != "auto" and vocabulary.extractor.get("backend") != backend)
        ):
            raise DataError(
                f"{path} was built from {found} with min_count {vocabulary.min_count} and back-end "
                f"{vocabulary.extractor.get('backend')!r} (subjects only: {stored_subjects}); this run asks "
                f"for {expected}, {min_count}, {backend!r} (subjects only: {subjects}) (use another --out)"
            )
        extractor = vocabulary_extractor(vocabulary.extractor.get("backend", "auto"), captions, subjects)
        mismatch = lexicon_mismatch(vocabulary.extractor, extractor.describe())
        if mismatch:  # its phrases and the new pairs' labels would be read with two different word lists
            raise DataError(f"{path} was built with {mismatch}; use another --out for entities of this lexicon")
        return vocabulary, extractor
    if not captions:
        raise DataError(
            f"split {fit_index.split!r} of {fit_index.root} has no captions to build the entity "
            "vocabulary from (CLEVR-style sets need change_captions.json)"
        )
    extractor = vocabulary_extractor(backend, captions, subjects)
    vocabulary = build_vocabulary(
        captions,
        min_count=min_count,
        extractor=extractor,
        source={"format": fit_index.format, "root": str(fit_index.root), "split": fit_index.split},
    )
    if not vocabulary.phrases:
        raise DataError(f"no noun phrase occurs in ≥ {min_count} captions of split {fit_index.split!r}")
    vocabulary.save(path)
    return vocabulary, extractor


def reference_labels(captions: Iterable[str], extractor: PhraseExtractor, vocabulary: set[str]) -> dict[str, float]:
    """Each vocabulary phrase the references name → the share of references naming it."""
    captions = list(captions)
    counts: Counter[str] = Counter()
    for caption in captions:
        counts.update(p for p in set(extractor.phrases(caption)) if p in vocabulary)
    return {phrase: count / len(captions) for phrase, count in counts.items()}


# ---------------------------------------------------------------------------------------------------
# Retrievers
# ---------------------------------------------------------------------------------------------------


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr)


def fit_split_descriptors(
    fit_index: DatasetIndex,
    masks: MaskSource | None,
    vocabulary: EntityVocabulary,
    extractor: PhraseExtractor,
    *,
    region_options: dict,
    limit: int | None = None,
    progress: bool = True,
    image_level: bool = False,
    named_only: bool = True,
) -> tuple[list[np.ndarray], list[dict[str, float]]]:
    """The (2, F) descriptors and reference labels of the fit split's pairs (the first `limit`).

    Region level: the descriptors of the masked change regions. `image_level`: of the two whole frames
    (no masks; `masks` may be None). `named_only` keeps only the pairs whose references name a
    vocabulary phrase (all the fitted retriever uses); the entity gate also needs the others.
    """
    phrases = set(vocabulary.phrases)
    pairs = fit_index.pairs[:limit] if limit is not None else fit_index.pairs
    labelled = [(pair, reference_labels(pair.captions, extractor, phrases)) for pair in pairs]
    if named_only:
        labelled = [(pair, label) for pair, label in labelled if label]
    if not any(label for _, label in labelled):
        raise DataError(f"no pair of split {fit_index.split!r} names a vocabulary phrase in its references")
    features, labels = [], []
    what = "frames" if image_level else "regions"
    for pair, label in _progress(labelled, len(labelled), f"fit {what} ({fit_index.split})", progress):
        if image_level:
            before, after = load_pair(pair)
            features.append(frame_pair_features(np.asarray(before), np.asarray(after)))
        else:
            features.append(pair_features(load_pair_regions(pair, masks, **region_options)))  # not the crops
        labels.append(label)
    return features, labels


def fit_retriever(
    entry: Component,
    settings,
    features: list[np.ndarray],
    labels: list[dict[str, float]],
    vocabulary: EntityVocabulary,
    *,
    fit_split: str,
    image_level: bool = False,
) -> Retriever:
    """A retriever that declares `fit` (the `fitted` one), fitted on `fit_split_descriptors` (pairs naming no
    phrase are skipped by the fit); its `training` records the split and the input (regions or whole frames)."""
    retriever = entry.declared["fit"](settings, features, labels, vocabulary.phrases)
    retriever.training["fit_split"] = fit_split
    retriever.training["input"] = FITTED_INPUT[image_level]
    return retriever


def fit_entity_gate(
    features: list[np.ndarray], labels: list[dict[str, float]], *, threshold: float, fit_split: str
) -> EntityGate:
    """The entity gate, fitted on `fit_split_descriptors(…, named_only=False)`: does a pair name an entity?"""
    gate = EntityGate(threshold=threshold)
    gate.fit(features, [bool(label) for label in labels])
    gate.training["fit_split"] = fit_split
    return gate


def fit_shared_parts(
    args: argparse.Namespace,
    out: Path,
    fit_index: DatasetIndex,
    masks: MaskSource | None,
    settings: dict,
    manifest: dict,
    region_options: dict,
) -> None:
    """What every process of a launch reads and one writes: the vocabulary, the fitted retriever and gate
    (fitted once, on the fit split), the settings pinned in the manifest, no temporaries of a killed run."""
    vocabulary, extractor = load_or_build_vocabulary(
        out / "vocab.json",
        fit_index,
        min_count=args.vocab_min_count,
        backend=args.phrase_backend,
        subjects=args.image_level,
    )
    retriever_folder, gate_folder = out / "retriever", out / "gate"
    entry = RETRIEVERS[args.retriever]
    fits_retriever = entry.declared.get("fit") is not None and not entry.declared["is_fitted"](retriever_folder)
    fit_gate = settings.get("entity_gate") == "fitted" and not EntityGate.exists(gate_folder)
    if fits_retriever or fit_gate:  # one pass over the fit split serves both
        fit_masks = (
            None
            if args.image_level
            else (masks if args.fit_masks in (None, args.masks) else open_mask_source(args.fit_masks))
        )
        features, labels = fit_split_descriptors(
            fit_index,
            fit_masks,
            vocabulary,
            extractor,
            region_options=region_options,
            limit=args.fit_limit,
            progress=not args.no_progress,
            image_level=args.image_level,
            named_only=not fit_gate,
        )
        if fits_retriever:
            fit_retriever(
                entry,
                component_settings(RETRIEVERS, args.retriever, args),
                features,
                labels,
                vocabulary,
                fit_split=fit_index.split,
                image_level=args.image_level,
            ).save(retriever_folder)
        if fit_gate:
            fit_entity_gate(features, labels, threshold=args.gate_threshold, fit_split=fit_index.split).save(
                gate_folder
            )
    write_json_atomic(out / "entities" / "manifest.json", manifest)  # pin the settings before the first part
    # A killed run may leave the temporary file of the part it was writing: remove this split's (issue 18).
    folder = EntityCache(out).folder
    for stale in folder.glob(f".part-{args.split}-*.tmp") if folder.is_dir() else []:
        stale.unlink(missing_ok=True)
