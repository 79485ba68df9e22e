"""open_clip models from a local checkpoint file (never a hub tag): the CLIP retriever and the text towers."""

from __future__ import annotations

from pathlib import Path

from davir.errors import DataError


def load_open_clip(model_name: str, checkpoint: str | Path, *, config: str | Path | None = None, device: str = "cpu"):
    """An open_clip model and its eval transform from a local state-dict file (never a hub tag)."""
    try:
        import open_clip
    except ImportError as error:
        raise DataError("the clip retriever needs open_clip (`pip install open_clip_torch`)") from error
    if checkpoint is None or not Path(checkpoint).is_file():
        raise DataError(
            f"CLIP checkpoint file is missing: {checkpoint} (pass --clip-checkpoint with a local "
            f"open_clip state dict for {model_name}; nothing is downloaded)"
        )
    if config is not None:
        if not Path(config).is_file():
            raise DataError(f"open_clip model config file is missing: {config}")
        open_clip.add_model_config(Path(config))
    check_quickgelu(model_name, checkpoint)
    if model_name not in open_clip.list_models():
        raise DataError(f"unknown open_clip model {model_name!r} (pass --clip-config with its JSON config)")
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=str(checkpoint), device=device, pretrained_image=False
        )
    except RuntimeError as error:
        raise DataError(f"{checkpoint}: not an open_clip {model_name} checkpoint ({error})") from error
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(model_name)


# OpenAI trained its CLIPs with QuickGELU; open_clip's plain names use nn.GELU (the LAION/DataComp weights). OpenAI
# weights under a plain name load without complaint and give silently degraded embeddings.
OPENAI_ARCHITECTURES = (
    "RN50",
    "RN101",
    "RN50x4",
    "RN50x16",
    "RN50x64",
    "ViT-B-32",
    "ViT-B-16",
    "ViT-L-14",
    "ViT-L-14-336",
)


def check_quickgelu(model_name: str, checkpoint: str | Path) -> None:
    """Refuse an OpenAI checkpoint (its file name says so) under a model name without QuickGELU."""
    if model_name in OPENAI_ARCHITECTURES and "openai" in Path(checkpoint).name.lower():
        raise DataError(
            f"{checkpoint}: OpenAI CLIP weights need the QuickGELU variant of the model: pass "
            f"--clip-model {model_name}-quickgelu (with {model_name} the activations differ and the "
            "embeddings are silently degraded)"
        )
