"""The run folder: what a result needs to be reproduced, and the best/last model checkpoints.

    RUN/config.yaml          the exact TrainConfig the run used
    RUN/run_info.json        seed, command line, package versions, git commit (dirty flag)
    RUN/checkpoints/step_N/  `accelerator.save_state` (model, optimizer, scheduler, RNG, train state)
    RUN/last/, RUN/best/     `save_pretrained` of the model, loadable by evaluate.py/caption.py
    RUN/logs/                TensorBoard
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from davir.io import read_json, write_json_atomic

PACKAGES = ("torch", "torchvision", "transformers", "peft", "accelerate", "datasets", "numpy",
            "scikit-learn", "opencv-python-headless", "pycocoevalcap", "segment-anything", "open_clip_torch")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo: Path | None = None) -> dict[str, str | bool | None]:
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def write_run_info(run_dir: Path, *, seed: int, extra: dict | None = None) -> None:
    write_json_atomic(run_dir / "run_info.json", {
        "command": sys.argv,
        "cwd": str(Path.cwd()),  # what the config's relative paths are relative to (davir.runs.paths)
        "seed": seed,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "git": git_state(),
        **(extra or {}),
    })


def mark_run_finished(run_dir: Path, step: int, *, compute: dict | None = None) -> None:
    """The final marker: training reached its last step and saved last/ (evaluate.py notes runs without it).
    ``compute`` (davir.runtime.cost) is what this training session cost."""
    from davir.runs.files import read_run_info

    info = read_run_info(run_dir) or {}
    extra = {"compute": compute} if compute is not None else {}
    write_json_atomic(Path(run_dir) / "run_info.json", {**info, "finished": True, "final_step": step, **extra})


_STEP = re.compile(r"^step_(\d+)$")


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.match(p.name)) and (p / "COMPLETE").is_file()]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def mark_complete(checkpoint: Path, state: dict) -> None:
    """A checkpoint counts only once this marker exists, so a kill mid-save never resumes from half a state."""
    write_json_atomic(checkpoint / "COMPLETE", state)


def read_checkpoint_state(checkpoint: Path) -> dict:
    return read_json(checkpoint / "COMPLETE")


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for _, path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)


def replace_dir_atomic(source: Path, target: Path) -> None:
    """Move a finished folder into place, replacing an older one without a window where neither exists whole."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        target.rename(old)
    Path(source).rename(target)
    if old.exists():
        shutil.rmtree(old)


def run_decoding(run_dir: str | Path | None, *, num_beams: int | None = None,
                 max_new_tokens: int | None = None) -> dict:
    """The decoding a run selected its `best/` with (its config's `run.num_beams` / `run.max_new_tokens`),
    overridden by any value given here; what `evaluate.py --checkpoint` and `caption.py` use by default.

    ``run_dir`` is a run folder (holding config.yaml) or a model folder inside one (best/, last/); None or a
    folder without a run config gives the TrainConfig defaults. Returns ``{"num_beams", "max_new_tokens",
    "source"}``, source naming where each value came from (for metrics.json)."""
    from davir.runs.files import read_run_config
    from davir.training.config import RunConfig

    defaults = RunConfig()
    settings: dict = {}
    config_file = None
    for candidate in ((Path(run_dir), Path(run_dir).parent) if run_dir is not None else ()):
        if (candidate / "config.yaml").is_file():
            config_file = candidate / "config.yaml"
            break
    if config_file is not None:  # checked: run.num_beams / max_new_tokens are integers ≥ 1 if present
        settings = read_run_config(config_file).get("run") or {}
    decoding, source = {}, {}
    for key, given in (("num_beams", num_beams), ("max_new_tokens", max_new_tokens)):
        if given is not None:
            decoding[key], source[key] = int(given), "command line"
        elif key in settings:
            decoding[key], source[key] = int(settings[key]), str(config_file)
        else:
            decoding[key], source[key] = getattr(defaults, key), "TrainConfig default"
        if decoding[key] < 1:
            from davir.errors import DataError

            raise DataError(f"{key} must be >= 1, got {decoding[key]} (from {source[key]})")
    return {**decoding, "source": source}
