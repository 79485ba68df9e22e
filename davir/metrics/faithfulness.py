"""Stated-difference faithfulness: are the differences a caption states the ones its references state?

    scores = score_faithfulness(predictions, references, groups)   # groups optional: {pair id: change type}
    scores["rows"]["total"]["objects"]["f1"], scores["rows"]["total"]["hallucination_rate"]
    print(format_faithfulness_table(scores))

The scores (objects, kinds, differences, no-change accuracy) and their rows: docs/experiments/results.md,
"Stated-difference faithfulness"; the reader: docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from davir.data.records import DISTRACTOR
from davir.metrics.captions import TOTAL, group_order
from davir.metrics.io import align_ids, canonical_groups, canonical_id
from davir.text.differences import ChangeObject, DifferenceReader, Statement

LEVELS = ("objects", "kinds", "differences")


@dataclass
class Counts:
    """Matched / stated / referenced counts of one level, and the P/R/F1 they give."""

    stated: int = 0
    supported: int = 0
    referenced: int = 0
    recalled: int = 0

    def add(self, other: Counts) -> None:
        self.stated += other.stated
        self.supported += other.supported
        self.referenced += other.referenced
        self.recalled += other.recalled

    def to_dict(self) -> dict[str, Any]:
        precision = self.supported / self.stated if self.stated else None
        recall = self.recalled / self.referenced if self.referenced else None
        if precision is None or recall is None:
            f1 = None
        else:
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "stated": self.stated,
            "supported": self.supported,
            "referenced": self.referenced,
            "recalled": self.recalled,
        }


@dataclass
class PairJudgement:
    """What one caption states against its references, level by level."""

    counts: dict[str, Counts]
    references_say_no_change: bool
    caption_says_no_change: bool
    unsupported: list[str] = field(default_factory=list)  # stated objects no reference supports (for reports)


def referenced_objects(statements: list[Statement], *, with_kind: bool = False) -> dict[Any, frozenset[str]]:
    """What the references name: one entry per head noun (per (kind, head) ``with_kind``, where only clauses
    with a kind count), holding every modifier any reference gives it."""
    found: dict[Any, set[str]] = {}
    for statement in statements:
        for difference in statement.differences:
            if difference.object is None or (with_kind and difference.kind is None):
                continue
            key = (difference.kind, difference.object.head) if with_kind else difference.object.head
            found.setdefault(key, set()).update(difference.object.modifiers)
    return {key: frozenset(modifiers) for key, modifiers in found.items()}


def _supports(obj: ChangeObject, modifiers: frozenset[str] | None) -> bool:
    return modifiers is not None and obj.modifiers <= modifiers


def judge_pair(caption: Statement, references: list[Statement], *, distractor: bool | None = None) -> PairJudgement:
    """Count one caption's stated objects, kinds and differences against its references' statements.

    ``distractor``: whether the pair is a no-change pair (its group); None = most references say no change.
    """
    objects = caption.objects()
    referenced = referenced_objects(references)
    supported = [o for o in objects if _supports(o, referenced.get(o.head))]
    recalled = {
        head
        for head, modifiers in referenced.items()
        if any(o.head == head and _supports(o, modifiers) for o in objects)
    }
    object_counts = Counts(len(objects), len(supported), len(referenced), len(recalled))

    caption_kinds = caption.kinds()
    reference_kinds = set().union(*(s.kinds() for s in references)) if references else set()
    common = caption_kinds & reference_kinds
    kind_counts = Counts(len(caption_kinds), len(common), len(reference_kinds), len(common))

    stated_differences = list(
        dict.fromkeys((d.kind, d.object) for d in caption.differences if d.kind is not None and d.object is not None)
    )
    referenced_differences = referenced_objects(references, with_kind=True)
    supported_differences = [
        (k, o) for k, o in stated_differences if _supports(o, referenced_differences.get((k, o.head)))
    ]
    recalled_differences = {
        key
        for key, modifiers in referenced_differences.items()
        if any((k, o.head) == key and _supports(o, modifiers) for k, o in stated_differences)
    }
    difference_counts = Counts(
        len(stated_differences), len(supported_differences), len(referenced_differences), len(recalled_differences)
    )
    if distractor is None:
        distractor = sum(s.no_change for s in references) * 2 > len(references)
    return PairJudgement(
        {"objects": object_counts, "kinds": kind_counts, "differences": difference_counts},
        distractor,
        caption.no_change,
        [o.text() for o in objects if o not in supported],
    )


def _row(judgements: list[PairJudgement]) -> dict[str, Any]:
    totals = {level: Counts() for level in LEVELS}
    for judgement in judgements:
        for level in LEVELS:
            totals[level].add(judgement.counts[level])
    row: dict[str, Any] = {"pairs": len(judgements), **{level: totals[level].to_dict() for level in LEVELS}}
    precision = row["objects"]["precision"]
    row["hallucination_rate"] = None if precision is None else 1.0 - precision
    no_change = [j for j in judgements if j.references_say_no_change]
    row["no_change"] = {
        "pairs": len(no_change),
        "accuracy": sum(j.caption_says_no_change for j in no_change) / len(no_change) if no_change else None,
    }
    return row


def score_faithfulness(
    predictions: Mapping[Any, str],
    references: Mapping[Any, list[str]],
    groups: Mapping[Any, str] | None = None,
    *,
    reader: DifferenceReader | None = None,
    keep_pairs: bool = False,
) -> dict[str, Any]:
    """Stated-difference faithfulness of ``predictions`` ({pair id: caption}) against ``references``
    ({pair id: [sentences]}), per group of ``groups`` and in total. Ids are matched as the caption metrics
    match them (`align_ids`); predictions without references are not scored. ``keep_pairs`` adds each pair's
    judgement (for hand checks)."""
    reader = reader or DifferenceReader()
    aligned = align_ids(predictions, references)
    by_key = canonical_groups(groups or {})
    judged: dict[str, PairJudgement] = {}
    members: dict[str, list[str]] = {}
    for pair_id, caption in aligned.predictions.items():
        group = by_key.get(canonical_id(pair_id))
        distractor = None if group is None else group == DISTRACTOR
        judged[pair_id] = judge_pair(
            reader.read(caption), [reader.read(r) for r in aligned.references[pair_id]], distractor=distractor
        )
        if group is not None:
            members.setdefault(group, []).append(pair_id)
    rows = {name: _row([judged[p] for p in members[name]]) for name in group_order(members)}
    rows[TOTAL] = _row(list(judged.values()))
    result: dict[str, Any] = {"rows": rows, "reader": reader.describe()}
    if keep_pairs:
        result["pairs"] = {
            pair_id: {
                "caption": aligned.predictions[pair_id],
                "references": aligned.references[pair_id],
                "objects": [o.text() for o in reader.read(aligned.predictions[pair_id]).objects()],
                "unsupported": j.unsupported,
                "no_change": j.caption_says_no_change,
                "references_say_no_change": j.references_say_no_change,
            }
            for pair_id, j in judged.items()
        }
    return result


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def format_faithfulness_table(scores: Mapping[str, Any]) -> str:
    """A Markdown table (x100) of object P/R/F1, hallucination rate, kind and difference F1, no-change accuracy."""
    lines = [
        "| rows | pairs | object P | object R | object F1 | hallucinated | kind F1 | difference F1 | no-change acc. |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in scores["rows"].items():
        cells = [_percent(row["objects"][k]) for k in ("precision", "recall", "f1")]
        cells += [_percent(row["hallucination_rate"]), _percent(row["kinds"]["f1"]), _percent(row["differences"]["f1"])]
        no_change = row["no_change"]
        cells.append(
            "—" if no_change["accuracy"] is None else f"{_percent(no_change['accuracy'])} ({no_change['pairs']})"
        )
        lines.append(f"| {name} | {row['pairs']} | " + " | ".join(cells) + " |")
    lines.append(
        "\nScale: x100. hallucinated = stated objects no reference names (1 − object P); "
        "no-change acc. on pairs whose references say nothing changed (their count)."
    )
    return "\n".join(lines) + "\n"


__all__ = [
    "LEVELS",
    "Counts",
    "PairJudgement",
    "format_faithfulness_table",
    "judge_pair",
    "referenced_objects",
    "score_faithfulness",
]
