"""Scoring captions and generate-then-score: the library side of `evaluate.py` / `davir-evaluate`.

from davir.evaluation import evaluate_run, score_predictions, ReferenceSource
evaluate_run("runs/demo", "test", limit=40, spice=False).metrics             # --checkpoint
score_predictions(predictions, ReferenceSource.file("refs.json"), out="m.json")  # --predictions
"""

from davir.evaluation.checkpoint import EvaluationOptions, EvaluationResult, evaluate_run
from davir.evaluation.scoring import ReferenceSource, ScoreResult, score_predictions

__all__ = [
    "EvaluationOptions",
    "EvaluationResult",
    "ReferenceSource",
    "ScoreResult",
    "evaluate_run",
    "score_predictions",
]
