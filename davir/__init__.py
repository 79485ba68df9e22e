"""davir: image change captioning — DAVIR (InstructBLIP + LoRA + FAC + EPC) and the ResNet-101 methods."""

__version__ = "0.1.0"

__all__ = ["ChangeCaptioner", "__version__"]


def __getattr__(name: str):
    # `from davir import ChangeCaptioner` without importing torch/transformers for every `import davir`.
    if name == "ChangeCaptioner":
        from davir.inference.captioner import ChangeCaptioner

        return ChangeCaptioner
    raise AttributeError(f"module 'davir' has no attribute {name!r}")
