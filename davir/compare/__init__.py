"""Runs side by side (seeds pooled), the published numbers with their sources, the leaderboard.

python -m davir.compare runs/lightweight_demo/*/seed* [--dataset clevr_change]
"""
