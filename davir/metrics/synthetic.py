"""Caption accuracy on the built-in synthetic set: read a caption back into (change type, object, new value).

    from davir.metrics.synthetic import pair_truths, score_synthetic
    truths = pair_truths(load_scenes(root), split="test")   # {"000123.png": truth, "000123.png_n": none}
    scores = score_synthetic(predictions, truths)           # scores.to_dict()["overall"]["type_accuracy"]

Type, object and exact accuracy: docs/metrics.md, "Accuracy on the built-in synthetic set".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from davir.data.formats.clevr_change import DISTRACTOR_SUFFIX
from davir.data.synthetic import (
    CHANGE_TEMPLATES,
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
)
from davir.errors import DataError

NO_CHANGE = "none"
TYPES = ("color", "material", "add", "drop", "move", NO_CHANGE)
ATTRIBUTES = ("size", "color", "material", "shape")

# word -> (attribute, canonical value), from the generator's own synonym tables.
WORD_ATTRIBUTE: dict[str, tuple[str, str]] = {
    word: (attribute, value)
    for attribute, table in (
        ("size", SIZE_WORDS),
        ("color", COLOR_WORDS),
        ("material", MATERIAL_WORDS),
        ("shape", SHAPE_WORDS),
    )
    for value, words in table.items()
    for word in words
}


def normalise_caption(text: str) -> str:
    """Lower case, punctuation removed, single spaces (the form every template is matched in)."""
    return " ".join(re.sub(r"[^a-z ]+", " ", text.lower()).split())


def _template_regex(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{obj\}", r"(?P<obj>[a-z]+(?: [a-z]+)*?)")
    pattern = pattern.replace(r"\{new\}", r"(?P<new>[a-z]+)")
    return re.compile(f"^{pattern}$")


# (template family, compiled regex); colour and material share their templates, told apart by the new value.
_TEMPLATE_PATTERNS: list[tuple[str, re.Pattern[str]]] = []
for _family, _templates in CHANGE_TEMPLATES.items():
    if _family == "material":
        continue  # same sentences as "color"
    for _template in _templates:
        _TEMPLATE_PATTERNS.append((_family, _template_regex(_template)))
_NO_CHANGE_SET = frozenset(normalise_caption(c) for c in NO_CHANGE_CAPTIONS)


@dataclass(frozen=True)
class ParsedCaption:
    """What a caption says: ``change_type`` (one of TYPES, None when no template matches), the named object's
    attributes (None when the phrase is not a valid attribute phrase or the type names no object) and the
    new colour/material (canonical word) for colour/material changes."""

    change_type: str | None
    attributes: dict[str, str] | None = None
    new: str | None = None


def parse_object_phrase(phrase: str) -> dict[str, str] | None:
    """``"tiny red shiny ball"`` → ``{"size": "small", "color": "red", "material": "metal", "shape": "sphere"}``.

    Each word must be an attribute word of the generator and each attribute may appear once; None otherwise.
    """
    attributes: dict[str, str] = {}
    for word in normalise_caption(phrase).split():
        if word not in WORD_ATTRIBUTE:
            return None
        attribute, value = WORD_ATTRIBUTE[word]
        if attribute in attributes:
            return None
        attributes[attribute] = value
    return attributes or None


def parse_caption(text: str) -> ParsedCaption:
    """Read a synthetic-style caption back into change type, object attributes and new value."""
    sentence = normalise_caption(text)
    if sentence in _NO_CHANGE_SET:
        return ParsedCaption(NO_CHANGE)
    # Several templates can match one sentence ("the X has been moved" also fits "the {obj} moved" with
    # obj = "X has been"); the reading whose object phrase is valid wins, else the first match.
    candidates: list[ParsedCaption] = []
    for family, pattern in _TEMPLATE_PATTERNS:
        match = pattern.match(sentence)
        if match is None:
            continue
        attributes = parse_object_phrase(match.group("obj"))
        if family != "color":
            candidates.append(ParsedCaption(family, attributes))
            continue
        attribute, value = WORD_ATTRIBUTE.get(match.group("new"), (None, None))
        if attribute in ("color", "material"):  # "changed to sphere" is no colour/material change
            candidates.append(ParsedCaption(attribute, attributes, value))
    for candidate in candidates:
        if candidate.attributes is not None:
            return candidate
    if candidates:
        return candidates[0]
    return ParsedCaption(None)


@dataclass(frozen=True)
class PairTruth:
    """The truth of one pair: change type (TYPES), the changed object's attributes, the new value."""

    change_type: str
    attributes: dict[str, str] | None = None
    new: str | None = None


def pair_truths(scenes: Mapping[str, Any], *, split: str | None = None) -> dict[str, PairTruth]:
    """Truth of both pairs of every scene (``load_scenes`` records), keyed like the ``clevr_change`` reader:
    ``"%06d.png"`` (semantic pair) and ``"%06d.png_n"`` (distractor pair, type ``none``).

    ``split`` keeps the scenes of that split only. A record without a usable change is a DataError naming it.
    """
    truths: dict[str, PairTruth] = {}
    for scene_id, record in scenes.items():
        if split is not None and record.get("split") != split:
            continue
        change = record.get("change") if isinstance(record, Mapping) else None
        if not isinstance(change, Mapping) or change.get("type") not in TYPES[:-1]:
            raise DataError(f"scenes.json scene {scene_id}: no change record with a known type ({TYPES[:-1]})")
        attributes = parse_object_phrase(str(change.get("subject", "")))
        if attributes is None or set(attributes) != set(ATTRIBUTES):
            raise DataError(
                f"scenes.json scene {scene_id}: change subject {change.get('subject')!r} is not a "
                "full attribute phrase (size colour material shape)"
            )
        name = f"{scene_id}.png"
        truths[name] = PairTruth(change["type"], attributes, change.get("new"))
        truths[name + DISTRACTOR_SUFFIX] = PairTruth(NO_CHANGE)
    return truths


@dataclass
class TypeScores:
    """Counts of one change type (or of all pairs): pairs, right type, right object, exact."""

    pairs: int = 0
    type_right: int = 0
    object_pairs: int = 0
    object_right: int = 0
    exact: int = 0

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "pairs": self.pairs,
            "type_accuracy": self.type_right / self.pairs if self.pairs else None,
            "object_accuracy": self.object_right / self.object_pairs if self.object_pairs else None,
            "exact_accuracy": self.exact / self.pairs if self.pairs else None,
        }


@dataclass
class SyntheticScores:
    """Per truth type and overall; ``unparsed`` counts predictions that match no template."""

    per_type: dict[str, TypeScores] = field(default_factory=dict)
    overall: TypeScores = field(default_factory=TypeScores)
    unparsed: int = 0
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)  # truth type -> predicted type -> count

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "per_type": {t: self.per_type[t].to_dict() for t in TYPES if t in self.per_type},
            "unparsed": self.unparsed,
            "confusion": self.confusion,
        }


def score_synthetic(predictions: Mapping[str, str], truths: Mapping[str, PairTruth]) -> SyntheticScores:
    """Type, object and exact accuracy of ``predictions`` ({pair id: caption}) against ``truths``.

    Every prediction must have a truth (a DataError names the first that has none); truths without a
    prediction are not scored.
    """
    missing = [key for key in predictions if key not in truths]
    if missing:
        raise DataError(f"synthetic scoring: {len(missing)} predictions have no truth, e.g. {missing[0]!r}")
    scores = SyntheticScores()
    for key, caption in predictions.items():
        truth = truths[key]
        parsed = parse_caption(caption)
        if parsed.change_type is None:
            scores.unparsed += 1
        row = scores.confusion.setdefault(truth.change_type, {})
        predicted = parsed.change_type or "unparsed"
        row[predicted] = row.get(predicted, 0) + 1
        type_right = parsed.change_type == truth.change_type
        names_object = truth.change_type != NO_CHANGE
        object_right = names_object and parsed.attributes == truth.attributes
        new_right = truth.change_type not in ("color", "material") or parsed.new == truth.new
        exact = type_right and new_right and (object_right or not names_object)
        for bucket in (scores.per_type.setdefault(truth.change_type, TypeScores()), scores.overall):
            bucket.pairs += 1
            bucket.type_right += type_right
            bucket.exact += exact
            if names_object:
                bucket.object_pairs += 1
                bucket.object_right += object_right
    return scores


def format_synthetic_table(scores: SyntheticScores) -> str:
    """A Markdown table of type / object / exact accuracy per truth type and overall (x100, as the caption
    tables), with the count of captions that match no template."""
    lines = ["| change type | type acc. | object acc. | exact | pairs |", "|---|---|---|---|---|"]
    rows = [(t, scores.per_type[t]) for t in TYPES if t in scores.per_type] + [("total", scores.overall)]
    for name, bucket in rows:
        values = bucket.to_dict()
        cells = [
            "—" if values[k] is None else f"{100 * values[k]:.1f}"
            for k in ("type_accuracy", "object_accuracy", "exact_accuracy")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {bucket.pairs} |")
    lines.append(f"\nScale: x100. Captions matching no template (counted wrong): {scores.unparsed}.")
    return "\n".join(lines) + "\n"


__all__ = [
    "ATTRIBUTES",
    "NO_CHANGE",
    "TYPES",
    "PairTruth",
    "ParsedCaption",
    "SyntheticScores",
    "TypeScores",
    "format_synthetic_table",
    "normalise_caption",
    "pair_truths",
    "parse_caption",
    "parse_object_phrase",
    "score_synthetic",
]
