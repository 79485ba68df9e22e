"""Training support for `train.py`: typed configs, tasks (DAVIR, lightweight), the run folder."""
