"""Training support for `train.py`: tasks (DAVIR, lightweight), the loop, the run folder (its config schema,
TrainConfig, is davir.runs.config)."""
