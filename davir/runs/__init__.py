"""What a run folder holds: its files read with their keys checked (`files`), its recorded paths (`paths`) and the
schema its config.yaml follows (`config`: TrainConfig, what train.py takes; it imports torch, so the others import
it only when they read a config)."""
