"""open_clip models from a local checkpoint file (never a hub tag): the CLIP retriever and the text towers."""

from __future__ import annotations

from pathlib import Path

from davir.data.records import DataError


def load_open_clip(model_name: str, checkpoint: str | Path, *, config: str | Path | None = None, device: str = "cpu"):
    """An open_clip model and its eval transform from a local state-dict file (never a hub tag)."""
    try:
        import open_clip
    except ImportError as error:
        raise DataError("the clip retriever needs open_clip (`pip install open_clip_torch`)") from error
    if checkpoint is None or not Path(checkpoint).is_file():
        raise DataError(f"CLIP checkpoint file is missing: {checkpoint} (pass --clip-checkpoint with a local "
                        f"open_clip state dict for {model_name}; nothing is downloaded)")
    if config is not None:
        if not Path(config).is_file():
            raise DataError(f"open_clip model config file is missing: {config}")
        open_clip.add_model_config(Path(config))
    if model_name not in open_clip.list_models():
        raise DataError(f"unknown open_clip model {model_name!r} (pass --clip-config with its JSON config)")
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=str(checkpoint), device=device, pretrained_image=False)
    except RuntimeError as error:
        raise DataError(f"{checkpoint}: not an open_clip {model_name} checkpoint ({error})") from error
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(model_name)
