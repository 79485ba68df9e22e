"""Variants × seeds: train and score a grid of runs, one table of mean ± std (`python -m davir.sweep SWEEP.yaml`)."""
