"""Training checkpoints (RUN/checkpoints/step_N/): what they hold, how they are checked, where --resume starts.

* **Only what training changes.** A LoRA run of InstructBLIP-Vicuna-7B has ~16 GB of frozen bf16 weights
  and a few MB that move. `accelerator.save_state` would write all of them into every checkpoint (three
  coexist during save-then-prune: ~47 GB beside the ~32 GB base folder). A save hook keeps, of the model's
  state dict, the trainable parameters and the buffers only; the frozen weights come back from where
  they came from the first time (the pretrained folder, or the seeded preset). Optimizer, scheduler,
  sampler and RNG states are accelerate's own files. (Under FSDP/DeepSpeed accelerate saves sharded states
  through its own paths; they are left as they are.)
* **Checked before use.** `COMPLETE` (written last) lists every file with its size and SHA-256. `--resume`
  takes the newest checkpoint whose files all match and load; a damaged one (truncated weights, a corrupt
  `random_states_0.pkl`, …) is named in a warning and the previous complete checkpoint is used — never a
  silent resume with other RNG state. With no usable checkpoint left, the run stops with a DataError that
  names each checkpoint and its problem.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from safetensors import SafetensorError
from safetensors.torch import load_file

from davir.errors import DataError
from davir.io import follow_umask
from davir.runs.files import check_keys
from davir.training.run import list_checkpoints, mark_complete, read_checkpoint_state

MODEL_FILE = "model.safetensors"  # accelerate's name for the (first) model's weights
RNG_FILE = "random_states_{index}.pkl"
SHARDED_TYPES = (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)
# COMPLETE: the trainer state beside the file manifest (the loop and Validator.restore read these keys)
TRAINER_STATE_KEYS = {
    "step": (int,),
    "best_score": (int, float, type(None)),
    "best_step": (int, type(None)),
    "files": (dict,),
}


def trainable_state_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys of `model` that training can change: parameters with requires_grad, and buffers."""
    keys = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    keys |= {name for name, _ in model.named_buffers()}
    return keys


def has_frozen_parameters(model: torch.nn.Module) -> bool:
    return any(not parameter.requires_grad for parameter in model.parameters())


def install_trainable_state_hooks(accelerator: Accelerator) -> bool:
    """Make `save_state`/`load_state` write and read only the trainable part of models with frozen weights.

    Returns whether the hooks were installed (not under FSDP/DeepSpeed/Megatron, which save shards their way).
    """
    if accelerator.distributed_type in SHARDED_TYPES:
        return False

    def save_hook(models, weights, output_dir):
        for i, model in enumerate(models):
            if i < len(weights) and has_frozen_parameters(model):
                keep = trainable_state_keys(model)
                weights[i] = {key: value for key, value in weights[i].items() if key in keep}

    def load_hook(models, input_dir):
        for i in reversed(range(len(models))):
            model = models[i]
            if not has_frozen_parameters(model):
                continue
            load_trainable_state(
                model, Path(input_dir) / (MODEL_FILE if i == 0 else f"model_{i}.safetensors"), device=accelerator.device
            )
            models.pop(i)  # loaded here; accelerate would load it strictly and miss the frozen weights

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    return True


def load_trainable_state(model: torch.nn.Module, path: Path, *, device) -> None:
    """Load a trainable-only state dict into `model`; the file must hold exactly its trainable keys."""
    try:
        state = load_file(str(path), device=str(device))
    except (OSError, SafetensorError, ValueError) as error:
        raise DataError(f"{path}: cannot read the checkpoint weights ({error})") from error
    expected = trainable_state_keys(model) & set(model.state_dict().keys())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise DataError(
            f"{path}: the checkpoint does not fit this model's trainable parameters "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); was the config changed?"
        )
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise DataError(f"{path}: {error}") from error


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_manifest(checkpoint: Path) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} of every file in a checkpoint folder (COMPLETE excluded)."""
    return {
        str(path.relative_to(checkpoint)): {"bytes": path.stat().st_size, "sha256": file_digest(path)}
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != "COMPLETE"
    }


def save_checkpoint(accelerator: Accelerator, run_dir: Path, step: int, state: dict) -> Path:
    """`save_state` into RUN/checkpoints/step_N, then COMPLETE (the step, `state`, the file manifest)."""
    checkpoint = Path(run_dir) / "checkpoints" / f"step_{step}"
    accelerator.save_state(str(checkpoint))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        follow_umask(checkpoint)  # save_state's safetensors files are 0600
        files = file_manifest(checkpoint)
        mark_complete(checkpoint, {"step": step, **state, "files": files})
        size = sum(entry["bytes"] for entry in files.values())
        accelerator.print(f"checkpoint {checkpoint}: {size / 1e6:.1f} MB in {len(files)} files")
    accelerator.wait_for_everyone()
    return checkpoint


def checkpoint_problems(checkpoint: Path, *, process_index: int = 0) -> list[str]:
    """What is wrong with a complete checkpoint's files ([] when it can be resumed from).

    With a manifest (every checkpoint this version writes) each listed file must exist with its size and
    SHA-256; older checkpoints get a read test of the weights and this process's RNG state."""
    checkpoint = Path(checkpoint)
    try:
        state = read_checkpoint_state(checkpoint)
    except (OSError, ValueError) as error:
        return [f"{checkpoint / 'COMPLETE'}: unreadable ({error})"]
    try:
        check_keys(state, checkpoint / "COMPLETE", TRAINER_STATE_KEYS, ("step",))
    except DataError as error:  # a key missing or of the wrong type: the step to resume at is unknown
        return [str(error)]
    problems = []
    files = state.get("files")
    if isinstance(files, dict):
        for name, expected in files.items():
            path = checkpoint / name
            if not isinstance(expected, dict):
                problems.append(f"{checkpoint / 'COMPLETE'}: key 'files.{name}' must be an object of bytes and sha256")
            elif not path.is_file():
                problems.append(f"{path}: missing")
            elif path.stat().st_size != expected.get("bytes"):
                problems.append(f"{path}: {path.stat().st_size} bytes, {expected.get('bytes')} when saved (truncated?)")
            elif file_digest(path) != expected.get("sha256"):
                problems.append(f"{path}: contents differ from when it was saved (SHA-256 mismatch)")
        rng = RNG_FILE.format(index=process_index)
        if rng not in files:
            problems.append(f"{checkpoint / rng}: no RNG state saved for process {process_index}")
        return problems
    from accelerate.utils import load

    for path in sorted(checkpoint.glob("*.safetensors")):
        try:
            load_file(str(path))
        except (OSError, SafetensorError, ValueError) as error:
            problems.append(f"{path}: unreadable ({error})")
    for path in [*sorted(checkpoint.glob("*.bin")), checkpoint / RNG_FILE.format(index=process_index)]:
        try:
            load(path, map_location="cpu")
        except Exception as error:  # noqa: BLE001 - any unpickling failure means the file is unusable
            problems.append(f"{path}: unreadable ({type(error).__name__}: {error})")
    return problems


def usable_checkpoint(run_dir: Path, *, process_index: int = 0, warn=print) -> Path | None:
    """The newest complete checkpoint without problems; each damaged newer one is named through `warn`.

    None when the run has no complete checkpoint; a DataError naming every problem when all are damaged."""
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return None
    rejected = []
    for _, path in reversed(checkpoints):
        problems = checkpoint_problems(path, process_index=process_index)
        if not problems:
            if rejected:
                warn(
                    f"warning: --resume falls back to {path}: the newer checkpoint(s) are damaged: "
                    + "; ".join(rejected)
                )
            return path
        rejected.append("; ".join(problems))
    raise DataError(
        f"--resume: every complete checkpoint under {Path(run_dir) / 'checkpoints'} is damaged: "
        + "; ".join(rejected)
        + " (delete them to start from scratch)"
    )


def load_checkpoint(accelerator: Accelerator, checkpoint: Path) -> dict:
    """`load_state` from a checked checkpoint, RNG state included (accelerate only logs a failed RNG load);
    returns its COMPLETE state. Any failure is a DataError naming the checkpoint."""
    from accelerate.utils import load

    rng_file = checkpoint / RNG_FILE.format(index=accelerator.process_index)
    try:
        load(rng_file, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - accelerate would silently keep the current RNG state
        raise DataError(
            f"{rng_file}: cannot restore the RNG state ({type(error).__name__}: {error}); a resume "
            "with other RNG state would not reproduce the run"
        ) from error
    try:
        accelerator.load_state(str(checkpoint))
    except DataError:
        raise
    except Exception as error:  # noqa: BLE001 - torch/safetensors raise many types for a bad file
        raise DataError(f"{checkpoint}: cannot load the checkpoint ({type(error).__name__}: {error})") from error
    return read_checkpoint_state(checkpoint)
