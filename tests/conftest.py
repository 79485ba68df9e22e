"""Shared fixtures: the real annotation files in ../shared/datasets, and no hub access in tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Tests never download: any accidental hub call fails fast instead of hanging on the network.
os.environ["HF_HUB_OFFLINE"] = "1"
# `make test` runs the files on two pytest-xdist workers (one per core of the CI machine): one math thread each
# (and in the commands they start), so two workers do not fight over the same two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.hookimpl(tryfirst=True)  # before -m deselects: `make test`'s files that hold a slow test are its long ones
def pytest_collection_modifyitems(config, items):
    """Files holding a `slow` test first, then those holding a `faults` one, the rest as collected.

    `make test` hands whole files to the xdist workers in this order (--dist loadfile --no-loadscope-reorder), so
    the minute-long end-to-end files start at once instead of ending the run on one worker while the other idles
    (xdist's own order, most tests first, put these one- and two-test files last)."""

    def file_of(item):
        return item.nodeid.split("::")[0]

    rank: dict[str, int] = {}
    for item in items:
        level = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("faults") else 2
        rank[file_of(item)] = min(rank.get(file_of(item), 2), level)
    items.sort(key=lambda item: rank[file_of(item)])  # stable: a file's tests stay together and in order


@pytest.fixture(scope="module", autouse=True)
def fresh_accelerate_state():
    """Each test file ends with Accelerate's process-wide state cleared: a file that left it in bf16 (TRL's trainer,
    a paper config) would make the next file's fp32 `Accelerator()` refuse to start on the same xdist worker, so a
    file's result would depend on which files that worker happened to run before it."""
    yield
    state = sys.modules.get("accelerate.state")  # not imported: nothing to clear, and no import paid for it
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The folder of real annotation files and image pairs (never copied into the repository)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(
            f"real dataset fixtures not found at {SHARED_DATASETS} (expected ../shared/datasets next to the repo)"
        )
    return SHARED_DATASETS


@pytest.fixture
def make_read_only():
    """make_read_only(folder): no new file can be created in `folder`, for root too (CI runs as root).

    A user gets this from permissions (chmod 555); root writes through those, so as root the folder is made
    immutable (chattr +i, which root can't write through either). Skips only where neither works."""
    locked: list[Path] = []

    def lock(folder: Path) -> Path:
        folder = Path(folder)
        if os.geteuid() != 0:
            folder.chmod(0o555)
        elif not (
            shutil.which("chattr")
            and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        ):
            pytest.skip(f"root, and chattr +i does not work on {folder}'s file system: nothing is read-only here")
        locked.append(folder)
        try:
            (folder / ".write-check").touch()
        except OSError:
            return folder
        (folder / ".write-check").unlink()
        pytest.skip(f"{folder} is still writable after locking it")

    yield lock
    for folder in locked:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o755)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module of tiny models (`pytestmark = pytest.mark.usefixtures(...)`): on a
    shared 2-core machine one thread is much faster than two contending, and the arithmetic matches the
    1-thread commands the fault tests start."""
    import torch  # not at the top: the thread variables above must be set before torch is first imported

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def two_pair_clevr_change(tmp_path) -> Path:
    """A CLEVR-Change folder of two test pairs (a colour and a material change), each with its distractor."""
    import json

    root = tmp_path / "clevr_change"
    root.mkdir()
    (root / "splits.json").write_text(json.dumps({"train": [], "val": [], "test": [1, 8001]}))
    (root / "type_mapping.json").write_text(json.dumps({"color": ["000001.png"], "material": ["008001.png"]}))
    (root / "change_captions.json").write_text(
        json.dumps(
            {
                "CLEVR_default_000001.png": ["the red cube became blue"],
                "CLEVR_default_008001.png": ["the metal ball became rubber"],
            }
        )
    )
    (root / "no_change_captions.json").write_text(
        json.dumps(
            {
                "CLEVR_default_000001.png": ["the scene remains the same"],
                "CLEVR_default_008001.png": ["no change has occurred"],
            }
        )
    )
    return root


@pytest.fixture(scope="session")
def synthetic_set(tmp_path_factory):
    """synthetic_set(scenes, seed, **size): a built-in synthetic CLEVR-Change-layout set, made once per session
    (per pytest-xdist worker) for each distinct request and shared by every test that asks for the same one.
    Tests only read it; one that changes files copies it first."""
    from davir.data.synthetic import SynthConfig, generate_dataset

    made: dict[tuple, Path] = {}

    def make(scenes: int, seed: int, *, width: int = 96, height: int = 72, **settings) -> Path:
        key = (scenes, seed, width, height, tuple(sorted(settings.items())))
        if key not in made:
            root = tmp_path_factory.mktemp(f"synth_{scenes}_{seed}")
            generate_dataset(
                root, SynthConfig(scenes=scenes, seed=seed, width=width, height=height, **settings), workers=1
            )
            made[key] = root
        return made[key]

    return make


def train_losses(run_dir: Path) -> dict[int, float]:
    """{step: train/loss} of a run folder's train_log.jsonl, in step order (a resumed step's last value)."""
    from davir.io import read_jsonl

    losses = {row["step"]: row["train/loss"] for row in read_jsonl(Path(run_dir) / "train_log.jsonl")}
    return dict(sorted(losses.items()))


@pytest.fixture(scope="session")
def losses_of():
    """losses_of(run_dir) -> {step: train/loss}: the loss curve a run logged (for resume-equals-uninterrupted checks)."""
    return train_losses
