"""The Makefile's knobs reach every command they name: DEMO_DIR / DEMO_SEED / DEMO_SCENES through the data, the
features and the lightweight sweep; a demo folder made with other settings is refused, not silently reused."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not (VENV / "bin" / "python").is_file(),
    reason="needs make and the project's .venv (make install)",
)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A scratch copy of the checkout (the files git knows, as they are now), so nothing lands in the real one."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
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
    return subprocess.run(
        ["make", "-C", str(clone), "-o", f"{VENV}/.installed", f"VENV={VENV}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd="/",
    )


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


def test_hard_targets_refuse_a_folder_of_other_data_naming_their_own_clean_target(clone, tmp_path):
    hard = tmp_path / "hard"
    hard.mkdir()
    (hard / ".data-ready").write_text("scenes=1500 seed=0\n")  # a standard demo folder
    for target in ("demo-hard", "ablation-hard"):
        done = _make(clone, target, f"HARD_DIR={hard}")
        assert done.returncode != 0
        assert (
            f"error: {hard} holds demo data made with scenes=1500 seed=0, not scenes=1500 seed=0 difficulty=hard"
            in done.stderr
        )
        assert f"make clean-demo-hard HARD_DIR={hard}" in done.stderr  # not clean-demo, which removes runs/demo
        assert sorted(p.name for p in hard.iterdir()) == [".data-ready"]


def recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the venv's python that writes its arguments, one call a line, and does nothing else: `make`
    runs its recipes for real (loops, background jobs, waits, the data marker) in a second, not a CPU-minute."""
    log, shim = tmp_path / "calls.txt", tmp_path / "python"
    # one write per call (printf's argument list, then echo's newline, would interleave between the shard jobs)
    shim.write_text(f'#!/bin/bash\nline=$(printf "%q " "$@")\necho "$line" >> {log}\n')
    shim.chmod(0o755)
    return shim, log


def calls(log: Path) -> list[list[str]]:
    return [shlex.split(line) for line in log.read_text().splitlines()]


def option(call: list[str], name: str) -> str:
    return call[call.index(name) + 1]


def test_demo_lightweight_elsewhere_uses_that_folder_and_seed(clone, tmp_path):
    """`make demo-lightweight DEMO_DIR=… DEMO_SEED=3 DEMO_SCENES=16 LW_RUNS=…`: every command reads and writes
    that folder and seed (each command's own tests show it honours the flags it is given)."""
    demo, runs = tmp_path / "demo", tmp_path / "runs"
    shim, log = recording_python(tmp_path)
    demo.mkdir()  # the synth command, recorded here, would make it
    knobs = [
        f"DEMO_DIR={demo}",
        "DEMO_SEED=3",
        "DEMO_SCENES=16",
        f"LW_RUNS={runs}",
        "SWEEP_ARGS=--seeds 0",
        f"PY={shim}",
    ]
    done = _make(clone, "demo-lightweight", *knobs)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (demo / ".data-ready").read_text().strip() == "scenes=16 seed=3"
    made = calls(log)
    synth = [c for c in made if c[:3] == ["-m", "davir.data", "synth"]]
    assert len(synth) == 1 and option(synth[0], "--scenes") == "16" and option(synth[0], "--seed") == "3"
    assert option(synth[0], "--out") == str(demo / "data")
    jobs = [c for c in made if c[:2] == ["-m", "preprocess"]]
    assert {(c[2], option(c, "--split")) for c in jobs if c[2] in ("masks", "entities", "features")} == {
        (job, split) for job in ("masks", "entities", "features") for split in ("train", "val", "test")
    }
    for call in jobs:
        assert option(call, "--root") == str(demo / "data"), call
        written = (
            option(call, "--out")
            if "--out" in call
            else option(call, "--masks" if call[2] == "mask-eval" else "--entities")
        )
        assert Path(written).parent == demo, call
    features = [c for c in jobs if c[2] == "features"]
    assert sorted((option(c, "--split"), option(c, "--shard-index")) for c in features) == sorted(
        (split, shard) for split in ("train", "val", "test") for shard in "01"
    )
    sweeps = [c for c in made if c[:2] == ["-m", "davir.sweep"]]
    assert len(sweeps) == 3 and all(
        option(c, "--var") == f"demo_dir={demo}" and option(c, "--out") == str(runs) and option(c, "--seeds") == "0"
        for c in sweeps
    )
    assert sorted(name for c in sweeps if "--variants" in c for name in c[c.index("--variants") + 1 :]) == sorted(
        ["subtraction", "SCORER+CBR", "DIRL+CCR", "RDD+ACR", "CHEER"]
    )
    assert "--variants" not in sweeps[-1]  # the summary pass, after both halves
    assert not any(arg.startswith(("outputs/", "runs/")) for call in made for arg in call)
    assert not (clone / "runs").exists() and not (clone / "outputs").exists()  # nothing went to the defaults

    again = _make(clone, "demo-lightweight", *knobs[:1], "DEMO_SEED=4", *knobs[2:])
    assert again.returncode != 0 and "not scenes=16 seed=4" in again.stderr


def test_demo_family_reaches_the_demo_and_its_ablation(clone, tmp_path):
    """`make demo` / `make ablation-demo` with DEMO_FAMILY=qwen2_5_vl: the family reaches training and the sweep, and
    its runs get their own folders; without it, the InstructBLIP commands are unchanged."""
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / ".data-ready").write_text("scenes=1500 seed=0\n")  # the data is made: only the family's commands run
    for family, suffix in (("qwen2_5_vl", "_qwen2_5_vl"), ("instructblip", "")):
        (tmp_path / family).mkdir()
        shim, log = recording_python(tmp_path / family)
        for target in ("demo", "ablation-demo"):
            done = _make(clone, target, f"DEMO_DIR={demo}", f"DEMO_FAMILY={family}", f"PY={shim}")
            assert done.returncode == 0, done.stderr[-3000:]
        made = calls(log)
        train = next(c for c in made if c[0] == "train.py")
        assert f"model.family={family}" in train and f"run.output_dir=runs/demo{suffix}" in train
        assert [option(c, "--checkpoint") for c in made if c[0] in ("evaluate.py", "caption.py")] == [
            f"runs/demo{suffix}"
        ] * 2
        sweep = next(c for c in made if c[:2] == ["-m", "davir.sweep"])
        assert option(sweep, "--out") == f"runs/ablation_demo{suffix}"
        assert (option(sweep, "--set") == f"model.family={family}") if suffix else "--set" not in sweep
