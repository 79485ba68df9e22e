"""Scoring captions and generate-then-score: the library side of `evaluate.py` / `davir-evaluate`."""
