"""Caption metrics as the official coco-caption flow computes them, their inputs and their tables.

from davir.metrics import load_predictions, load_references, score_captions, format_table
result = score_captions(load_predictions("preds.json"), load_references("refs.json"))
print(format_table({"total": result}))
"""

from davir.metrics.captions import (
    COCO_NAMES,
    METRICS,
    SCORE_NAMES,
    SEMANTIC,
    TOTAL,
    CaptionScores,
    MetricsError,
    from_coco_names,
    group_order,
    ptb_tokenize,
    score_by_group,
    score_captions,
)
from davir.metrics.io import (
    AlignedCaptions,
    IdMismatch,
    align_ids,
    canonical_id,
    groups_from_index,
    load_predictions,
    load_references,
    references_from_index,
    write_predictions,
)
from davir.metrics.protocols import load_references_from_dataset
from davir.metrics.spice import SPICE_ENV, SPICE_HINT, prepare_spice
from davir.metrics.tables import SCALE_NOTE, format_group_table, format_table, results_to_json, write_results_json

__all__ = [
    "COCO_NAMES",
    "METRICS",
    "SCALE_NOTE",
    "SCORE_NAMES",
    "SEMANTIC",
    "SPICE_ENV",
    "SPICE_HINT",
    "TOTAL",
    "AlignedCaptions",
    "CaptionScores",
    "IdMismatch",
    "MetricsError",
    "align_ids",
    "canonical_id",
    "format_group_table",
    "format_table",
    "from_coco_names",
    "group_order",
    "groups_from_index",
    "load_predictions",
    "load_references",
    "load_references_from_dataset",
    "prepare_spice",
    "ptb_tokenize",
    "references_from_index",
    "results_to_json",
    "score_by_group",
    "score_captions",
    "write_predictions",
    "write_results_json",
]
