"""The entity vocabulary: entity phrases that training captions name often enough, saved as vocab.json."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from davir.errors import DataError
from davir.io import read_json, write_json_atomic
from davir.text.extractors import PhraseExtractor, get_extractor


@dataclass
class EntityVocabulary:
    """Entity phrases from training captions kept with frequency ≥ min_count, most frequent first."""

    phrases: list[str]
    counts: dict[str, int]
    min_count: int
    extractor: dict
    source: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.phrases)

    def index(self) -> dict[str, int]:
        return {phrase: position for position, phrase in enumerate(self.phrases)}

    def to_dict(self) -> dict:
        return {
            "phrases": self.phrases,
            "counts": self.counts,
            "min_count": self.min_count,
            "extractor": self.extractor,
            "source": self.source,
        }

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> EntityVocabulary:
        data = read_json(Path(path))
        if not isinstance(data, dict) or not isinstance(data.get("phrases"), list):
            raise DataError(f"{path}: not an entity vocabulary (expected an object with a 'phrases' list)")
        if not all(isinstance(p, str) and p for p in data["phrases"]):
            raise DataError(f"{path}: 'phrases' must be non-empty strings")
        return cls(
            phrases=list(data["phrases"]),
            counts={str(k): int(v) for k, v in data.get("counts", {}).items()},
            min_count=int(data.get("min_count", 1)),
            extractor=dict(data.get("extractor", {})),
            source=dict(data.get("source", {})),
        )


def bare_attributes(counts: Counter[str]) -> set[str]:
    """One-word phrases whose word the corpus mostly uses as a modifier of other phrases.

    "the rubber sphere changed to metal" makes "metal" a noun phrase, but across the captions
    "metal" modifies far more phrases than it heads (here: at least twice as many): it names an
    attribute, not an entity.
    """
    heads: Counter[str] = Counter()
    modifiers: Counter[str] = Counter()
    for phrase, count in counts.items():
        words = phrase.split()
        heads[words[-1]] += count
        for word in words[:-1]:
            modifiers[word] += count
    return {p for p in counts if " " not in p and modifiers[p] >= 2 * heads[p]}


def build_vocabulary(
    captions: Iterable[str], *, min_count: int = 2, extractor: PhraseExtractor | None = None, source: dict | None = None
) -> EntityVocabulary:
    """Count each caption's distinct entity phrases; keep those named by ≥ min_count captions.

    One-word phrases that are mostly modifiers elsewhere (`bare_attributes`) are left out.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be ≥ 1, got {min_count}")
    captions = list(captions)
    if extractor is None:
        extractor = get_extractor("auto", corpus=captions)
    counts: Counter[str] = Counter()
    for caption in captions:
        counts.update(set(extractor.phrases(caption)))
    attributes = bare_attributes(counts)
    kept = sorted(
        (p for p, c in counts.items() if c >= min_count and p not in attributes), key=lambda p: (-counts[p], p)
    )
    return EntityVocabulary(
        phrases=kept,
        counts={p: counts[p] for p in kept},
        min_count=min_count,
        extractor=extractor.describe(),
        source={
            **(source or {}),
            "captions": len(captions),
            "distinct_phrases": len(counts),
            "bare_attributes_dropped": sorted(p for p in attributes if counts[p] >= min_count),
        },
    )


def lexicon_mismatch(recorded: dict, current: dict) -> str | None:
    """Why entities recorded with extractor `recorded` (a vocabulary's `extractor`) were not read with the word lists
    of extractor `current` (`describe()`), or None when they were (or when neither reads a lexicon)."""
    if recorded.get("backend") != "wordnet" and current.get("backend") != "wordnet":
        return None
    if recorded.get("backend") != current.get("backend"):
        return f"back-end {recorded.get('backend')!r}, not {current.get('backend')!r}"
    made = (recorded.get("lexicon") or {}).get("sha256")
    wanted = (current.get("lexicon") or {}).get("sha256")
    if made == wanted:
        return None
    made_text = (
        f"the lexicon with sha256 {made[:12]}…"
        if made
        else "an unrecorded WordNet (before davir shipped its own word lists)"
    )
    return f"{made_text}, not this davir's lexicon (sha256 {str(wanted)[:12]}…)"


def extractor_for(vocabulary: EntityVocabulary, corpus: Iterable[str] | None = None) -> PhraseExtractor:
    """The extractor a vocabulary was built with, so references are chunked the same way."""
    return get_extractor(vocabulary.extractor.get("backend", "auto"), corpus=corpus)
