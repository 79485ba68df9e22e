"""Scoring captions against references: the library side of `evaluate.py --predictions`.

    result = score_predictions({"p1": "the cube moved"}, ReferenceSource.dataset("clevr_change", "data", "test"),
                               metrics=("BLEU", "CIDEr"), spice=False, out="metrics.json")
    result.total.scores, result.metrics                          # the table's numbers, metrics.json's document

References come from a file or a dataset split; which pairs and sentences count is davir.metrics.protocols'.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from davir.errors import check_output_dir, check_output_file, refuse_outputs_over_inputs
from davir.io import write_json_atomic, write_text_atomic
from davir.metrics import (
    METRICS,
    TOTAL,
    canonical_id,
    format_group_table,
    format_table,
    results_to_json,
    score_by_group,
    score_captions,
)


@dataclass(frozen=True)
class ReferenceSource:
    """Where the references come from: a file (`path`), or a dataset split (`format`, `root`, `split`).

    `split` also names the split of a davir synthetic set whose scenes score a file's predictions
    (`synthetic_scenes`); `empty` is the rule for empty sentences of a file (see --empty-references)."""

    path: Path | None = None
    format: str | None = None
    root: Path | None = None
    split: str = "test"
    empty: str = "auto"

    @classmethod
    def file(cls, path: str | Path, *, empty: str = "auto", split: str = "test") -> ReferenceSource:
        return cls(path=Path(path), empty=empty, split=split)

    @classmethod
    def dataset(cls, format: str, root: str | Path, split: str = "test") -> ReferenceSource:
        return cls(format=format, root=Path(root), split=split)

    def load(self):
        """The ReferenceSet (references, groups, source description for the JSON, notes)."""
        from davir.data.formats import read_dataset
        from davir.metrics.protocols import load_reference_file, references_for_evaluation

        if self.path is not None:
            return load_reference_file(self.path, empty=self.empty)
        return references_for_evaluation(read_dataset(self.format, self.root, self.split))


@dataclass
class ScoreResult:
    """The scores of a set of predictions: per row (`rows`, TOTAL and any groups), the tables as printed
    (`text`), the synthetic set's accuracies when the references are one, the stated-difference
    faithfulness, the notes, and `metrics`: the metrics.json document (written to `out` when given)."""

    rows: dict
    text: str
    faithfulness: dict
    synthetic: object = None
    notes: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    out: Path | None = None
    markdown: Path | None = None

    @property
    def total(self):
        return self.rows[TOTAL]


def score_predictions(
    predictions: dict[str, str],
    references: ReferenceSource | str | Path,
    *,
    metrics: Sequence[str] = METRICS,
    spice: bool | str | Path = True,
    strict: bool = False,
    synthetic_scenes: str | Path | None = None,
    digits: int = 1,
    out: str | Path | None = None,
    markdown: str | Path | None = None,
    predictions_source: str | None = None,
    echo: bool = False,
) -> ScoreResult:
    """Score `predictions` ({pair id: caption}) against `references` (a ReferenceSource, or a reference file's
    path); write metrics.json to `out` and the tables to `markdown` when given; `echo`: print as evaluate.py.

    `spice`: True = SPICE when CoreNLP is installed, a folder = its jars, False = none. `strict`: predictions and
    references must cover the same pairs. `synthetic_scenes`: the folder of the davir synthetic set these pairs
    come from (found by itself for a clevr_change split with scenes.json)."""
    source = references if isinstance(references, ReferenceSource) else ReferenceSource.file(references)
    chosen = source.load()
    metrics = list(metrics)
    if chosen.groups:
        rows = score_by_group(
            predictions, chosen.references, chosen.groups, metrics=metrics, spice=spice, strict=strict
        )
    else:
        rows = {TOTAL: score_captions(predictions, chosen.references, metrics=metrics, spice=spice, strict=strict)}
    total = rows[TOTAL]
    say = print if echo else (lambda *args, **kwargs: None)

    text = format_table({TOTAL: total}, digits=digits)
    if len(rows) > 1:
        text += "\n" + format_group_table(rows, digits=digits)
    say(text, end="")
    notes = chosen.notes + total.mismatch.lines()
    for line in notes:
        say(f"note: {line}", file=sys.stderr)

    synthetic = synthetic_accuracy(predictions, source, scenes=synthetic_scenes)
    if synthetic is not None:
        from davir.metrics.synthetic import format_synthetic_table

        synthetic_text = "\nBuilt-in synthetic set: does each caption name the right change and object?\n\n"
        synthetic_text += format_synthetic_table(synthetic)
        say(synthetic_text, end="")
        text += synthetic_text
    from davir.metrics.faithfulness import format_faithfulness_table, score_faithfulness

    faithfulness = score_faithfulness(predictions, chosen.references, chosen.groups)
    faithfulness_text = (
        "\nStated-difference faithfulness: are the objects and changes each caption states the ones "
        "its references state?\n\n" + format_faithfulness_table(faithfulness)
    )
    lexicon = faithfulness["reader"].get("lexicon")
    if lexicon is not None and not lexicon["shipped"]:  # $DAVIR_WORDNET_DIR: these numbers are not the comparable ones
        faithfulness_text += (
            f"\nnote: read with the lexicon of {lexicon['source']} (sha256 {lexicon['sha256'][:12]}…), "
            "not the one shipped with davir: these faithfulness numbers are not comparable\n"
        )
    say(faithfulness_text, end="")
    text += faithfulness_text
    if markdown is not None:
        write_text_atomic(markdown, text)
    # Which word lists read the captions (davir.text.lexicon): scores made with another one are not comparable.
    extra = {
        "predictions": predictions_source,
        "references": chosen.source,
        "lexicon": lexicon,
        "faithfulness": faithfulness,
    }
    if synthetic is not None:
        extra["synthetic"] = synthetic.to_dict()
    document = {**extra, **results_to_json(rows, per_image=[TOTAL])}
    if out is not None:
        write_json_atomic(Path(out), document)
        say(f"wrote {out}", file=sys.stderr)
    return ScoreResult(
        rows,
        text,
        faithfulness,
        synthetic,
        notes,
        json.loads(json.dumps(document)),
        None if out is None else Path(out),
        None if markdown is None else Path(markdown),
    )


def synthetic_accuracy(predictions: dict[str, str], references: ReferenceSource, *, scenes: str | Path | None = None):
    """Type/object/exact accuracy (davir.metrics.synthetic) when the references are a davir synthetic set
    (clevr_change layout with the generator's scenes.json, or `scenes`: a copy of the set in another format,
    e.g. the folder format, keeps its ids); None for every other data set."""
    if scenes is None:
        if (
            references.format != "clevr_change"
            or references.root is None
            or not (Path(references.root) / "scenes.json").is_file()
        ):
            return None
        scenes = references.root
    from davir.data.synthetic import load_scenes
    from davir.metrics.synthetic import pair_truths, score_synthetic

    truths = pair_truths(load_scenes(scenes), split=references.split)
    # Ids matched as the caption metrics match them (canonical_id): "3", 3 and "000003.png" are one pair, so a
    # file's spelling of the ids does not decide which pairs this table counts.
    truth_key = {canonical_id(key): key for key in truths}
    matched = {truth_key[canonical_id(k)]: v for k, v in predictions.items() if canonical_id(k) in truth_key}
    return score_synthetic(matched, truths)


def check_outputs(
    out: str | Path | None = None,
    markdown: str | Path | None = None,
    out_dir: Path | None = None,
    inputs: dict[str, str | Path | None] | None = None,
) -> None:
    """Stop before scoring or captioning when an output cannot be written (docs/errors.md), or would replace one of
    `inputs` ({flag: file read}) or the other output: `--out preds.json` wrote the scores over the predictions."""
    if out_dir is not None:
        check_output_dir(out_dir, what="evaluation folder")
    if out is not None:
        check_output_file(out, what="--out")
    if markdown is not None:
        check_output_file(markdown, what="--markdown")
    read = {f"the {flag} file": path for flag, path in (inputs or {}).items()}
    refuse_outputs_over_inputs({"--out": out}, read)
    refuse_outputs_over_inputs({"--markdown": markdown}, {**read, "the --out file": out})
