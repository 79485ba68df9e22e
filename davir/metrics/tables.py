"""Markdown tables and JSON files of caption scores.

Rows are groups (CLEVR-Change change types, "semantic", "total") or runs (one per checkpoint or
method); columns are the metrics. Values are printed x100, as papers print them; the JSON keeps the
toolkit's own scale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from davir.io import write_json_atomic
from davir.metrics.captions import SCORE_NAMES, CaptionScores

SCALE_NOTE = "Scores are the toolkit values x100, as papers print them; CIDEr is pycocoevalcap's CIDEr-D."
JSON_SCALE = "toolkit values (BLEU/METEOR/ROUGE_L/SPICE in 0..1, CIDEr-D unbounded); papers print them x100"


def _cell(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{100.0 * value:.{digits}f}"


def format_table(
    rows: Mapping[str, CaptionScores], *, row_label: str = "", digits: int = 1, columns: Iterable[str] | None = None
) -> str:
    """A Markdown table: one row per entry of `rows`, one column per metric (x100) and the pair count.

    Below it: the scale note and, once each, the notes of the rows (e.g. how to enable SPICE).
    """
    if not rows:
        raise ValueError("no rows to tabulate")
    present = {name for result in rows.values() for name in result.metrics}
    names = [name for name in (columns if columns is not None else SCORE_NAMES) if name in present]
    header = [row_label or " ", *names, "pairs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for label, result in rows.items():
        cells = [label, *(_cell(result.metrics.get(name), digits) for name in names), str(result.num_pairs)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [SCALE_NOTE]
    for result in rows.values():
        for note in result.notes:
            if note not in notes:
                notes.append(note)
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def format_group_table(results: Mapping[str, CaptionScores], *, digits: int = 1) -> str:
    """`score_by_group`'s rows (color ... distractor, semantic, total) as a Markdown table."""
    return format_table(results, row_label="change type", digits=digits)


def results_to_json(rows: Mapping[str, CaptionScores], *, per_image: Iterable[str] = ()) -> dict:
    """{"scale", "rows": {name: scores...}}; per-image scores only for the rows named in `per_image`."""
    with_images = set(per_image)
    return {
        "scale": JSON_SCALE,
        "rows": {name: result.to_dict(per_image=name in with_images) for name, result in rows.items()},
    }


def write_results_json(
    path: str | Path, rows: Mapping[str, CaptionScores], *, per_image: Iterable[str] = (), extra: Mapping | None = None
) -> None:
    """Write `results_to_json(rows)` (plus the `extra` keys, e.g. the input files) atomically."""
    document = dict(extra or {})
    document.update(results_to_json(rows, per_image=per_image))
    write_json_atomic(Path(path), document)
