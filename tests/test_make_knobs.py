"""The Makefile's knobs reach every command they name: DEMO_DIR / DEMO_SEED / DEMO_SCENES through the data, the
features and the lightweight sweep; a demo folder made with other settings is refused, not silently reused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"

pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (VENV / "bin" / "python").is_file(),
                                reason="needs make and the project's .venv (make install)")


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A scratch copy of the checkout (the files git knows, as they are now), so nothing lands in the real one."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, text=True, check=True).stdout.split("\0")
    target = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _make(clone: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`make` in the scratch clone from another folder, the project's venv taken as installed (-o)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["make", "-C", str(clone), "-o", f"{VENV}/.installed", f"VENV={VENV}", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd="/")


def test_demo_folder_of_other_data_is_refused_naming_both_settings(clone, tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / ".data-ready").write_text("scenes=1500 seed=0\n")
    done = _make(clone, "demo-lightweight", f"DEMO_DIR={demo}", "DEMO_SEED=7")
    assert done.returncode != 0
    assert f"error: {demo} holds demo data made with scenes=1500 seed=0, not scenes=1500 seed=7" in done.stderr
    assert "make clean-demo" in done.stderr
    assert sorted(p.name for p in demo.iterdir()) == [".data-ready"]  # nothing was made or touched

    (demo / ".data-ready").write_text("")  # a marker of the old Makefile: it said nothing of its settings
    done = _make(clone, "demo-data", f"DEMO_DIR={demo}")
    assert done.returncode != 0 and "made with settings it did not record" in done.stderr


def test_demo_lightweight_elsewhere_uses_that_folder_and_seed(clone, tmp_path):
    """A tiny `make demo-lightweight DEMO_DIR=… DEMO_SEED=3`: every step reads and writes that folder."""
    demo, runs = tmp_path / "demo", tmp_path / "runs"
    tiny = ["--seeds 0", "--set optim.max_steps=2", "--set run.eval_every=2", "--set run.val_max_pairs=4",
            "--set optim.batch_size=4"]
    done = _make(clone, "demo-lightweight", f"DEMO_DIR={demo}", "DEMO_SEED=3", "DEMO_SCENES=16", f"LW_RUNS={runs}",
                 "SWEEP_ARGS=" + " ".join(tiny))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (demo / ".data-ready").read_text().strip() == "scenes=16 seed=3"
    scenes = json.loads((demo / "data" / "scenes.json").read_text())
    assert scenes["config"]["seed"] == 3 and scenes["config"]["scenes"] == 16
    for cell, entities in (("subtraction", None), ("cheer", str(demo / "entities_image"))):
        config = yaml.safe_load((runs / cell / "seed0" / "config.yaml").read_text())
        assert config["data"]["root"] == str(demo / "data")
        assert config["data"]["features"] == str(demo / "features")
        assert config["data"]["entities"] == entities
        assert (runs / cell / "seed0" / "eval" / "clevr_change_test" / "metrics.json").is_file()
    assert (runs / "summary.md").is_file()
    assert not (clone / "runs").exists() and not (clone / "outputs").exists()  # nothing went to the defaults

    again = _make(clone, "demo-lightweight", f"DEMO_DIR={demo}", "DEMO_SEED=4", "DEMO_SCENES=16", f"LW_RUNS={runs}",
                  "SWEEP_ARGS=" + " ".join(tiny))
    assert again.returncode != 0 and "not scenes=16 seed=4" in again.stderr
