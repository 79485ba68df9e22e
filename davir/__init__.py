"""davir: image change captioning — DAVIR (InstructBLIP + LoRA + FAC + EPC) and the ResNet-101 methods."""

__version__ = "0.1.0"
