"""How a DAVIR model is saved and loaded: one folder, safetensors only (a mixin of every `DavirVLM`; what
differs between model families — processor, architecture, core, the model class — their family says).

The folder records no module path: the class comes from ``model.family``'s entry, so moving a class keeps old
folders loadable."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file, load_model, save_file, save_model

from davir.errors import DataError
from davir.io import follow_umask, read_json, write_json_atomic
from davir.models.families import get_family
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.one_build import MODEL_BUILD_LOCK
from davir.registry import import_modules

CONFIG_FILE = "davir_config.json"
PROCESSOR_DIR = "processor"
ARCHITECTURE_DIR = "architecture"  # the model config of a random-weight preset
ADAPTER_DIR = "adapter"  # PEFT adapter (adapter_config.json + adapter_model.safetensors)
FULL_WEIGHTS_FILE = "model.safetensors"  # every weight of the DavirModel
EXTRA_WEIGHTS_FILE = "trainable_extra.safetensors"  # LoRA mode: trained parts that are not LoRA
FORMAT_VERSION = 1

_Model = TypeVar("_Model", bound="DavirCheckpointMixin")


class DavirCheckpointMixin:
    """`save_pretrained` / `from_pretrained` of the DAVIR models (Q-Former and chat families alike)."""

    imports: tuple[str, ...] = ()  # a config's `imports:` (davir.runs.config), recorded in the saved folder

    def save_pretrained(self, directory: str | Path) -> None:
        """Write a folder :meth:`from_pretrained` reads (safetensors only, no pickles):

        * ``davir_config.json`` (this config) and ``processor/`` (tokenizers + image processor);
        * random-weight presets: ``architecture/config.json`` and ``model.safetensors`` (every weight — the
          random base cannot be re-created otherwise), plus ``adapter/`` in LoRA mode;
        * a pretrained base: full mode ``model.safetensors``; LoRA mode only the PEFT ``adapter/`` and
          ``trainable_extra.safetensors`` (segment embeddings, ``extra_trainable`` parts), the base weights
          being re-read from ``config.pretrained``.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.processor.save_pretrained(str(directory / PROCESSOR_DIR))
        if self.config.pretrained is None:
            self.core.config.save_pretrained(str(directory / ARCHITECTURE_DIR))
        if isinstance(self.wrapped(), PeftModel):
            self.wrapped().save_pretrained(str(directory / ADAPTER_DIR), safe_serialization=True)
        if self.config.train_mode == "full" or self.config.pretrained is None:
            save_model(self, str(directory / FULL_WEIGHTS_FILE))
        else:
            extra = {
                name: parameter.detach().contiguous().cpu()
                for name, parameter in self.named_parameters()
                if parameter.requires_grad and "lora_" not in name
            }
            if extra:
                save_file(extra, str(directory / EXTRA_WEIGHTS_FILE))
        meta = {"format_version": FORMAT_VERSION, "config": self.config.to_dict()}
        if self.imports:  # the user's modules its family (or anything else) needs: read_davir_config imports them
            meta["imports"] = list(self.imports)
        write_json_atomic(directory / CONFIG_FILE, meta)
        follow_umask(directory)  # safetensors and PEFT write weights 0600

    @classmethod
    def from_pretrained(
        cls: type[_Model],
        directory: str | Path,
        *,
        device: str | torch.device | None = None,
        pretrained: str | Path | None = None,
    ) -> _Model:
        """Load a folder written by :meth:`save_pretrained`. ``pretrained`` replaces the base-model folder
        recorded in the config (e.g. the run moved to another machine)."""
        directory = Path(directory)
        config = read_davir_config(directory)
        family = get_family(config.family)
        if not issubclass(cls, family.davir_class):
            raise DataError(
                f"{directory} holds a model.family={config.family} model, which {cls.__name__} does not "
                "load: use davir.models.load_davir_model (it picks the class the folder records)"
            )
        if pretrained is not None:
            config.pretrained = str(pretrained)
        processor_dir = directory / PROCESSOR_DIR
        if not processor_dir.is_dir():
            raise DataError(f"{directory}: missing {PROCESSOR_DIR}/ (tokenizers and image processor)")
        processor = _load_weights(
            processor_dir, lambda: family.load_processor(processor_dir), what="the tokenizers and image processor"
        )
        target = torch.device(device) if device is not None else torch.device("cpu")
        if target.type == "cpu":  # accelerate's CPU processes are "cpu:0"; safetensors accepts only "cpu"
            target = torch.device("cpu")
        with MODEL_BUILD_LOCK:  # transformers' process-wide switches and the seeded global generator (one_build.py)
            if config.pretrained is not None:
                core = family.load_core(config, target)
            else:
                architecture_dir = directory / ARCHITECTURE_DIR
                architecture = _load_weights(
                    architecture_dir, lambda: family.load_architecture(architecture_dir), what="the model architecture"
                )
                core = family.random_core(architecture, config, target)
            with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []):
                torch.manual_seed(config.seed)
                model = cls(config, core, processor).to(target)
        model.imports = recorded_imports(directory)
        full = directory / FULL_WEIGHTS_FILE
        if full.is_file():
            _load_weights(full, lambda: load_model(model, str(full), strict=True, device=str(target)))
            return model
        adapter = directory / ADAPTER_DIR / "adapter_model.safetensors"
        if config.train_mode != "lora" or not adapter.is_file():
            raise DataError(
                f"{directory}: neither {FULL_WEIGHTS_FILE} nor {ADAPTER_DIR}/adapter_model.safetensors found"
            )
        load_adapter_weights(model, adapter, target)
        # The trained parts that are not LoRA (extra_trainable, segment embeddings) must all come back: without
        # them the model would silently run with the base model's language_projection / query_tokens / projector.
        wanted = trained_outside_lora(model)
        extra = directory / EXTRA_WEIGHTS_FILE
        if wanted and not extra.is_file():
            raise DataError(
                f"{extra}: missing — {directory} is a LoRA model whose config trains "
                f"{sorted(wanted)[:3]} in full, and they are saved in {EXTRA_WEIGHTS_FILE}"
            )
        if extra.is_file():
            load_extra_weights(model, extra, wanted, target)
        return model


def load_adapter_weights(model, adapter: Path, target: torch.device) -> None:
    """A PEFT ``adapter_model.safetensors`` into the model's LoRA layers; a key that fits none is a DataError."""
    state = _load_weights(adapter, lambda: load_file(str(adapter), device=str(target)))
    result = _load_weights(adapter, lambda: set_peft_model_state_dict(model.wrapped(), state))
    if getattr(result, "unexpected_keys", None):
        raise DataError(f"{adapter}: weights that fit no LoRA layer of this model: {result.unexpected_keys[:5]}")


def trained_outside_lora(model) -> set[str]:
    """Names of the parameters a LoRA model trains in full (extra_trainable parts, segment embeddings)."""
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad and "lora_" not in name}


def load_extra_weights(model, path: Path, wanted: set[str], target: torch.device) -> None:
    """The weights of ``path`` (a safetensors file) into the model: every name of ``wanted`` must be there, and
    every weight there must fit a parameter (DataErrors naming the file)."""
    weights = _load_weights(path, lambda: load_file(str(path), device=str(target)))
    missing = sorted(wanted - set(weights))
    if missing:
        raise DataError(f"{path}: lacks trained weights this model needs: {missing[:5]}")
    unexpected = _load_weights(path, lambda: model.load_state_dict(weights, strict=False)).unexpected_keys
    if unexpected:
        raise DataError(f"{path}: weights that fit no parameter of this model: {unexpected[:5]}")


def read_davir_config(directory: str | Path) -> DavirModelConfig:
    """The DavirModelConfig of a saved model folder; a damaged davir_config.json is a DataError naming the
    file and the key (caption.py and evaluate.py read it before anything else of the folder)."""
    from davir.config import ConfigError

    path = Path(directory) / CONFIG_FILE
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise DataError(
            f"{path}: expected an object with keys 'format_version' and 'config', got {type(meta).__name__}"
        )
    for key in ("format_version", "config"):
        if key not in meta:
            raise DataError(
                f"{path}: missing key '{key}' (not a DAVIR model config of format version {FORMAT_VERSION})"
            )
    if meta["format_version"] != FORMAT_VERSION:
        raise DataError(
            f"{path}: key 'format_version' is {meta['format_version']!r}; this version reads {FORMAT_VERSION}"
        )
    if not isinstance(meta["config"], dict):
        raise DataError(f"{path}: key 'config' must be an object, got {meta['config']!r}")
    import_modules(recorded_imports(directory), key=f"{path}: imports")  # before the config names their family
    try:
        return DavirModelConfig.from_dict(meta["config"], where=f"{path}: config")
    except ConfigError as error:
        message = str(error)
        raise DataError(message if message.startswith(str(path)) else f"{path}: config.{message}") from None


def recorded_imports(directory: str | Path) -> tuple[str, ...]:
    """The user's modules a saved folder's davir_config.json names (``imports``; none in older folders)."""
    path = Path(directory) / CONFIG_FILE
    modules = read_json(path).get("imports", [])
    if not isinstance(modules, list) or not all(isinstance(module, str) for module in modules):
        raise DataError(f"{path}: key 'imports' must be a list of module names, got {modules!r}")
    return tuple(modules)


def _load_weights(path: Path, load, what: str = "these weights"):
    """Run `load` (reading or applying the weights of `path`); a corrupt, empty, truncated or wrong-shape
    file becomes a DataError naming it."""
    try:
        return load()
    except DataError:
        raise
    except Exception as error:  # noqa: BLE001 - safetensors/torch raise SafetensorError, RuntimeError, OSError …
        if isinstance(error, MemoryError):
            raise
        raise _weights_error(path, what, error) from error


def load_folder_weights(folder: Path, load, what: str = "the model weights"):
    """Run `load` (a `from_pretrained` of the model folder `folder`); a failure to read its weights becomes a
    DataError naming the weight file that fails (a truncated safetensors file, a pickle holding more than
    tensors), else the folder. Other errors (a config the model class refuses) go through as they are."""
    import pickle

    from safetensors import SafetensorError

    try:
        return load()
    except (SafetensorError, pickle.UnpicklingError, EOFError, OSError, RuntimeError) as error:
        raise _weights_error(_failing_weight_file(Path(folder), error), what, error) from error


def _is_unsafe_pickle(error: BaseException) -> bool:
    import pickle

    return isinstance(error, pickle.UnpicklingError) or "weights_only" in str(error)


def _weights_error(path: Path, what: str, error: BaseException) -> DataError:
    if _is_unsafe_pickle(error):  # torch's own message advises weights_only=False, which would run the pickle
        return DataError(
            f"{path}: refused: a pickle that holds more than plain tensors (loading it could run "
            "code); give the weights as .safetensors, or a .bin of tensors only"
        )
    detail = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    return DataError(
        f"{path}: cannot load {what} ({type(error).__name__}: {detail}); the file is "
        "corrupt, truncated or from another model — save or copy it again"
    )


def _failing_weight_file(folder: Path, error: BaseException) -> Path:
    """The weight file of `folder` that a failed load most likely stopped on (the folder when none is found)."""
    from safetensors import safe_open

    tensors = sorted(folder.glob("*.safetensors"))
    for path in tensors:  # opening reads and checks the header against the file's size: cheap
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception:  # noqa: BLE001 - SafetensorError, OSError
            return path
    pickles = sorted(folder.glob("*.bin"))
    if pickles and (_is_unsafe_pickle(error) or not tensors):
        return pickles[0] if len(pickles) == 1 else folder
    return folder
