"""open_clip models from a local checkpoint file (never a hub tag): the CLIP retriever and the text towers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from davir.errors import DataError


@dataclass(frozen=True)
class ClipOptions:
    """How the caller's user gives the checkpoint, config and model name, for the messages that ask to change
    one: the entities job's flags, or train.py's `lightweight.*` keys (`TEXT_TOWER_KEYS`)."""

    checkpoint: str = "--clip-checkpoint"
    config: str = "--clip-config"
    model: str = "--clip-model"
    joiner: str = " "  # between an option and its value: `--clip-model X`, `lightweight.text_encoder_model=X`

    def give(self, option: str, value: str) -> str:
        return f"{getattr(self, option)}{self.joiner}{value}"


CLIP_FLAGS = ClipOptions()


def check_config_file(config: str | Path, options: ClipOptions = CLIP_FLAGS) -> Path:
    """The JSON model config a user named, as a path, or an error naming the option it came from."""
    if not Path(config).is_file():
        raise DataError(
            f"{options.config}: open_clip model config file is missing: {config} "
            f"(a relative path counts from the current folder, {Path.cwd()})"
        )
    return Path(config)


def load_open_clip(
    model_name: str,
    checkpoint: str | Path,
    *,
    config: str | Path | None = None,
    device: str = "cpu",
    options: ClipOptions = CLIP_FLAGS,
):
    """An open_clip model and its eval transform from a local state-dict file (never a hub tag)."""
    try:
        import open_clip
    except ImportError as error:
        raise DataError("the clip retriever needs open_clip (`pip install open_clip_torch`)") from error
    if checkpoint is None or not Path(checkpoint).is_file():
        raise DataError(
            f"CLIP checkpoint file is missing: {checkpoint} (pass {options.give('checkpoint', 'FILE')}, a local "
            f"open_clip state dict for {model_name}; nothing is downloaded)"
        )
    if config is not None:
        open_clip.add_model_config(check_config_file(config, options))
    check_quickgelu(model_name, checkpoint, options)
    if model_name not in open_clip.list_models():
        raise DataError(f"unknown open_clip model {model_name!r} (pass {options.config} with its JSON config)")
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


def check_quickgelu(model_name: str, checkpoint: str | Path, options: ClipOptions = CLIP_FLAGS) -> None:
    """Refuse an OpenAI checkpoint (its file name says so) under a model name without QuickGELU."""
    if model_name in OPENAI_ARCHITECTURES and "openai" in Path(checkpoint).name.lower():
        raise DataError(
            f"{checkpoint}: OpenAI CLIP weights need the QuickGELU variant of the model: pass "
            f"{options.give('model', model_name + '-quickgelu')} (with {model_name} the activations differ and the "
            "embeddings are silently degraded)"
        )
