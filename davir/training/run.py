"""The run folder: what a result needs to be reproduced, and the best/last model checkpoints.

RUN/config.yaml          the exact TrainConfig the run used
RUN/run_info.json        seed, command line, package versions, git commit (dirty flag)
RUN/checkpoints/step_N/  `accelerator.save_state` (model, optimizer, scheduler, RNG, train state)
RUN/last/, RUN/best/     `save_pretrained` of the model, loadable by evaluate.py/caption.py
RUN/logs/                TensorBoard
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from davir.io import read_json, write_json_atomic
from davir.text.lexicon import lexicon_record

PACKAGES = (
    "torch",
    "torchvision",
    "transformers",
    "peft",
    "accelerate",
    "datasets",
    "numpy",
    "scikit-learn",
    "opencv-python-headless",
    "pycocoevalcap",
    "segment-anything",
    "open_clip_torch",
)


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(package: Path | None = None) -> dict[str, str | bool | None]:
    """The commit (and dirty flag) of davir's own checkout; None for both for an installed davir, or without git.

    Only a repository whose top folder holds the package, with the package tracked, counts: never the repository
    of the current folder, nor one a site-packages happens to sit in (a user's project is not davir's commit)."""
    unknown = {"commit": None, "dirty": None}
    package = Path(package or Path(__file__).resolve().parents[1])  # davir/
    # GIT_DIR & co. in the environment would point git at another repository than the package's.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=package, env=env, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() / package.name != package.resolve():
            return unknown
        git("ls-files", "--error-unmatch", "__init__.py")  # an untracked copy (pip --target) inside a repository
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return unknown


def write_run_info(run_dir: Path, *, seed: int, extra: dict | None = None) -> None:
    write_json_atomic(
        run_dir / "run_info.json",
        {
            "command": sys.argv,
            "cwd": str(Path.cwd()),  # what the config's relative paths are relative to (davir.runs.paths)
            "seed": seed,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "packages": package_versions(),
            "git": git_state(),
            # the word lists that read its captions and entities (davir.text.lexicon): another one, other prompts
            "lexicon": lexicon_record(strict=False),
            **(extra or {}),
        },
    )


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
    found = [
        (int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.match(p.name)) and (p / "COMPLETE").is_file()
    ]
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
