"""The training loop end to end on a tiny synthetic set: run folder, resume, NaN guard, two processes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from davir.config import ConfigError, load_config
from davir.io import read_jsonl
from davir.models.vlm.instructblip import DavirModel
from davir.runs.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from davir.training import loop as train_script  # noqa: E402


@pytest.fixture(scope="module")
def synth_root(synthetic_set):
    return synthetic_set(40, 0)


def _config(root, out, *extra):
    return load_config(
        TrainConfig,
        REPO / "configs" / "demo.yaml",
        [
            f"data.root={root}",
            "data.masks=null",
            "data.entities=null",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=false",
            "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
            "optim.batch_size=4",
            "optim.max_steps=4",
            "run.log_every=1",
            "run.save_every=2",
            "run.eval_every=0",
            "run.val_max_pairs=4",
            "run.tensorboard=false",
            f"run.output_dir={out}",
            *extra,
        ],
    )


def test_run_folder_and_resume_reproduces_the_loss_curve(synth_root, tmp_path, losses_of):
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    train_script.train(_config(synth_root, run_dir))
    full = list(losses_of(run_dir).values())
    assert len(full) == 4 and all(torch.isfinite(torch.tensor(full)))
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["seed"] == 0 and info["packages"]["torch"] and "commit" in info["git"]
    assert (run_dir / "config.yaml").is_file() and (run_dir / "last" / "davir_config.json").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_4"]
    DavirModel.from_pretrained(run_dir / "last")  # the saved model loads

    # Simulate a kill after step 2: drop what came later, then resume.
    shutil.rmtree(run_dir / "checkpoints" / "step_4")
    log = (run_dir / "train_log.jsonl").read_text().splitlines()
    (run_dir / "train_log.jsonl").write_text("\n".join(log[:2]) + "\n")
    train_script.train(_config(synth_root, run_dir), resume=True)
    resumed = list(losses_of(run_dir).values())
    assert resumed[:2] == full[:2]
    assert resumed[2:] == pytest.approx(full[2:], rel=1e-5, abs=1e-6)


def test_existing_run_is_not_overwritten(synth_root, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("x: 1\n")
    with pytest.raises(Exception, match="already holds a run"):
        train_script.train(_config(synth_root, tmp_path / "run"))


def test_non_finite_loss_stops_with_a_clear_message(synth_root, tmp_path, monkeypatch):
    from davir.training import davir_task as tasks

    original = tasks.DavirTask.training_losses

    def poisoned(self, batch):
        losses = original(self, batch)
        return {**losses, "loss": losses["loss"] * float("nan")}

    monkeypatch.setattr(tasks.DavirTask, "training_losses", poisoned)
    with pytest.raises(train_script.NonFiniteLoss, match=r"loss became nan at step 1 .*no checkpoint saved yet"):
        train_script.train(_config(synth_root, tmp_path / "run"))


def test_missing_mask_cache_names_the_command(synth_root, tmp_path):
    config = _config(synth_root, tmp_path / "run", "model.fac.lambda_attn=0.1", f"data.masks={tmp_path / 'none'}")
    with pytest.raises(Exception, match=r"have no change mask .*python -m preprocess masks --format clevr_change"):
        train_script.train(config)


@pytest.mark.skipif(
    shutil.which("accelerate") is None and not (Path(sys.executable).parent / "accelerate").exists(),
    reason="accelerate CLI not installed",
)
@pytest.mark.slow  # accelerate launch of two fresh processes: about a minute of CPU
def test_two_cpu_processes(synth_root, tmp_path):
    """`accelerate launch` with two gloo processes trains a few steps and leaves one run folder."""
    launcher = Path(sys.executable).parent / "accelerate"
    # accelerate launch's MULTI_CPU path starts one process without MPI; torchrun-style launch + ACCELERATE_USE_CPU
    # gives two gloo processes (the earlier `--config_file cpu.yaml --num_processes 2` ran one).
    command = [
        str(launcher),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(REPO / "train.py"),
        f"data.root={synth_root}",
        "data.masks=null",
        "data.entities=null",
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
        "optim.batch_size=2",
        # 1 epoch of 8 pairs: 2 steps per process (the count comes from the sharded loader, not 4)
        "optim.max_steps=null",
        "optim.epochs=1",
        "data.max_train_pairs=8",
        "optim.warmup_ratio=0",
        "run.log_every=1",
        "run.save_every=2",
        "run.eval_every=2",
        "run.val_max_pairs=3",
        "run.tensorboard=false",
        f"run.output_dir={tmp_path / 'ddp'}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "ddp" / "checkpoints" / "step_2" / "COMPLETE").is_file()
    assert "batch 2 x 2 process(es)" in result.stdout and "= 2 optimizer steps in total" in result.stdout
    rows = read_jsonl(tmp_path / "ddp" / "train_log.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    # accelerate steps the scheduler once per process: the cosine spans 2 steps x 2 processes (half-way after 1)
    assert [row["train/lr"] for row in rows] == pytest.approx([0.5e-3, 0.0], abs=1e-9)
    # validation captions its pairs on both processes; every val pair comes back once
    assert len(json.loads((tmp_path / "ddp" / "val" / "step_2.json").read_text())["predictions"]) == 3


def test_overwrite_deletes_nothing_a_run_did_not_write(synth_root, tmp_path, monkeypatch):
    """run.overwrite replaces an earlier run, not the user's files beside it (a run trained into a folder that held
    them): it stops before the model is built, naming them, and nothing is deleted."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_99").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("x: 1\n")
    (run_dir / "notes.txt").write_text("my notes\n")
    (run_dir / "photos").mkdir()
    (run_dir / ".best.staging").mkdir()  # a killed run's own leftovers are a run's files
    monkeypatch.setattr(train_script, "build_task", lambda *args: pytest.fail("the model was built"))
    with pytest.raises(ConfigError) as error:
        train_script.train(_config(synth_root, run_dir, "run.overwrite=true", "optim.max_steps=2"))
    assert str(error.value) == (
        f"run.overwrite: {run_dir} holds notes.txt, photos, which no run wrote; nothing was deleted: move them "
        "out of the run folder, or give another run.output_dir"
    )
    assert sorted(path.name for path in run_dir.iterdir()) == [
        ".best.staging",
        "checkpoints",
        "config.yaml",
        "notes.txt",
        "photos",
    ]


def test_overwrite_starts_a_clean_run_folder(synth_root, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_99").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("x: 1\n")
    (run_dir / "train_log.jsonl").write_text('{"step": 99, "train/loss": 1.0}\n')
    train_script.train(_config(synth_root, run_dir, "run.overwrite=true", "optim.max_steps=2"))
    assert not (run_dir / "checkpoints" / "step_99").exists()
    assert [row["step"] for row in read_jsonl(run_dir / "train_log.jsonl")] == [1, 2]
