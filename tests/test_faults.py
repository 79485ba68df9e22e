"""Fault injection (issue 18): each long job — masks, entities, features, training, caption.py, sweeps — is
killed with SIGKILL at seeded random moments while it works, rerun, and its output compared with an
uninterrupted run: byte for byte (masks, entities, features, caption.py's JSONL), loss for loss (training) or
metric for metric (sweeps). Small on purpose (a few pairs / steps); marked `faults` (pyproject.toml), and run
by `make test`."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from davir.data.caches import EntityCache

REPO = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# SIGKILLs at seeded moments of fresh train/preprocess/caption/sweep processes, then resumes: 5-8 minutes of CPU
pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture(scope="module")
def data(synthetic_set):
    return synthetic_set(40, 7, width=64, height=48, val_fraction=0.1, test_fraction=0.2)  # read only


def tiny_caption_run(data: Path, folder: Path, *, pairs: int) -> tuple[Path, Path]:
    """A 1-step DAVIR checkpoint (FOLDER/run) on `data` and a FOLDER/pairs.csv of its first `pairs` image pairs."""
    from davir.config import load_config
    from davir.jobs import masks as masks_job
    from davir.runs.config import TrainConfig
    from davir.training import loop

    assert (
        masks_job.main(
            [
                "--format",
                "clevr_change",
                "--root",
                str(data),
                "--split",
                "train",
                "--out",
                str(folder / "masks"),
                "--limit",
                "4",
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    loop.train(
        load_config(
            TrainConfig,
            REPO / "configs" / "demo.yaml",
            [
                f"data.root={data}",
                f"data.masks={folder / 'masks'}",
                "data.entities=null",
                "model.fac.lambda_attn=0",
                "model.epc.use_entities=false",
                "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
                "optim.batch_size=2",
                "optim.max_steps=1",
                "run.eval_every=0",
                "run.val_max_pairs=2",
                "run.tensorboard=false",
                f"run.output_dir={folder / 'run'}",
            ],
        )
    )
    manifest = folder / "pairs.csv"
    rows = ["id,before,after"] + [
        f"p{i:02d},{path},{str(path).replace('images', 'sc_images').replace('default', 'semantic')}"
        for i, path in enumerate(sorted((data / "images").iterdir())[:pairs])
    ]
    manifest.write_text("\n".join(rows) + "\n")
    return folder / "run", manifest


def run(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def kill_while_working(argv: list[str], started, rng: random.Random, *, max_delay: float, timeout: float = 180) -> bool:
    """Start the job, wait until `started()` (it has written something), then SIGKILL it after a random
    delay in [0, max_delay). Returns False when the job finished before the kill landed."""
    process = subprocess.Popen(
        [sys.executable, *argv], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    while not started() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0, max_delay))
    finished = process.poll() is not None
    if not finished:
        process.send_signal(signal.SIGKILL)
    process.wait()
    return not finished


def tree(folder: Path, *, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part in skip for part in p.relative_to(folder).parts)
    }


def no_temporaries(folder: Path) -> None:
    assert [p for p in folder.rglob("*.tmp")] == []


def test_masks_killed_three_times_resume_byte_identical(data, tmp_path):
    rng = random.Random(181)
    argv = lambda out: [
        "-m",
        "preprocess",
        "masks",
        "--format",
        "clevr_change",
        "--root",
        str(data),
        "--split",
        "test",
        "--out",
        str(out),
        "--no-progress",
        "--workers",
        "1",
    ]  # noqa: E731
    reference = run(argv(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-2000:]
    out = tmp_path / "killed"
    kills = sum(
        kill_while_working(argv(out), lambda: any((out / "masks").glob("*.json")), rng, max_delay=0.6) for _ in range(3)
    )
    assert kills >= 1  # at least one kill landed mid-run
    final = run(argv(out))
    assert final.returncode == 0, final.stderr[-2000:]
    no_temporaries(out)
    assert tree(out / "masks") == tree(tmp_path / "reference" / "masks")


def test_entities_killed_resume_with_the_same_entities(data, tmp_path):
    rng = random.Random(182)
    argv = lambda out: [
        "-m",
        "preprocess",
        "entities",
        "--format",
        "clevr_change",
        "--root",
        str(data),
        "--split",  # noqa: E731
        "test",
        "--out",
        str(out),
        "--no-progress",
        "--image-level",
        "--retriever",
        "fitted",
        "--top-k",
        "3",
        "--chunk-size",
        "1",
        "--fit-split",
        "test",
    ]
    reference = run(argv(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-2000:]
    out = tmp_path / "killed"
    kills = sum(
        kill_while_working(argv(out), lambda: any((out / "entities").glob("part-*.json")), rng, max_delay=0.5)
        for _ in range(2)
    )
    assert kills >= 1
    final = run(argv(out))
    assert final.returncode == 0, final.stderr[-2000:]
    no_temporaries(out)
    assert EntityCache(out).table() == EntityCache(tmp_path / "reference").table()
    assert tree(out, skip=("entities",)) == tree(tmp_path / "reference", skip=("entities",))  # vocabulary, retriever


def test_features_killed_resume_byte_identical(data, tmp_path):
    import torch

    from davir.data.feature_cache import FeatureCache

    rng = random.Random(183)
    argv = lambda out: [
        "-m",
        "preprocess",
        "features",
        "--format",
        "clevr_change",
        "--root",
        str(data),
        "--split",  # noqa: E731
        "val",
        "--out",
        str(out),
        "--random-init",
        "--batch-size",
        "2",
        "--chunk-size",
        "2",
        "--workers",
        "0",
    ]
    reference = run(argv(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-2000:]
    out = tmp_path / "killed"
    started = lambda: any(out.glob("features/*.safetensors"))  # noqa: E731  (a first chunk is stored)
    killed = [kill_while_working(argv(out), started, rng, max_delay=0.5) for _ in range(2)]
    assert sum(killed) >= 1
    if all(killed):  # no run finished: its settings are recorded, but the folder does not pass for a cache
        assert not (out / "manifest.json").exists() and (out / "manifest.incomplete.json").is_file()
    final = run(argv(out))
    assert final.returncode == 0, final.stderr[-2000:]
    no_temporaries(out)
    assert not (out / "manifest.incomplete.json").exists()
    assert (out / "manifest.json").read_bytes() == (tmp_path / "reference" / "manifest.json").read_bytes()
    got, want = FeatureCache(out, dataset_root=data), FeatureCache(tmp_path / "reference", dataset_root=data)
    assert sorted(got.entries) == sorted(want.entries) and len(got) > 0
    for key in want.entries:
        assert torch.equal(got.get(key), want.get(key)), key


def test_training_killed_resumes_loss_for_loss(data, tmp_path, losses_of):
    rng = random.Random(184)
    argv = lambda out: [
        "train.py",
        f"data.root={data}",
        "data.masks=null",
        "data.entities=null",  # noqa: E731
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
        "optim.batch_size=2",
        "optim.max_steps=4",
        "run.log_every=1",
        "run.save_every=1",
        "run.eval_every=0",
        "run.val_max_pairs=2",
        "run.tensorboard=false",
        f"run.output_dir={out}",
    ]
    reference = run(argv(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-2000:]
    out = tmp_path / "killed"
    first = out / "checkpoints" / "step_1" / "COMPLETE"
    assert kill_while_working(argv(out), first.is_file, rng, max_delay=1.0)
    resumed = run([*argv(out), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    want, got = losses_of(tmp_path / "reference"), losses_of(out)
    assert sorted(got) == sorted(want) == list(range(1, 5))
    assert [got[s] for s in sorted(got)] == pytest.approx([want[s] for s in sorted(want)], rel=1e-5, abs=1e-6)
    # Killed after the last step's checkpoint but before `last` was written: the resume trains no step 5.
    shutil.rmtree(tmp_path / "reference" / "last")
    finished = run([*argv(tmp_path / "reference"), "--resume"])
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert sorted(losses_of(tmp_path / "reference")) == [1, 2, 3, 4]
    assert (tmp_path / "reference" / "last").is_dir()


@pytest.mark.usefixtures("one_torch_thread")  # as in the killed processes (ENV)
def test_sweep_killed_resumes_with_the_same_table(data, tmp_path):
    """`python -m davir.sweep` killed in a cell's training or scoring (a seeded moment of the first cell or the
    second), then rerun: every cell's metrics, predictions and the summary equal an uninterrupted sweep's."""
    rng = random.Random(186)
    tiny = [
        "data.masks=null",
        "data.entities=null",
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
        "optim.batch_size=2",
        "optim.max_steps=2",
        "run.eval_every=0",
        "run.val_max_pairs=2",
        "run.tensorboard=false",
        f"data.root={data}",
    ]

    def sweep_file(out: Path) -> Path:
        path = out.with_suffix(".yaml")
        path.write_text(
            yaml.safe_dump(
                {
                    "title": "fault test",
                    "out": str(out),
                    "seeds": [0],
                    "overrides": tiny,
                    "evaluate": {"spice": False, "metrics": ["BLEU", "CIDEr"]},
                    "variants": [
                        {"name": "lr a", "config": str(REPO / "configs" / "demo.yaml"), "overrides": ["optim.lr=1e-4"]},
                        {"name": "lr b", "config": str(REPO / "configs" / "demo.yaml"), "overrides": ["optim.lr=3e-4"]},
                    ],
                }
            )
        )
        return path

    from davir.cli import sweep

    # the uninterrupted sweep and the final rerun in this process, at 1 thread as the killed one: the same
    # arithmetic, bit for bit (and no second start of torch)
    assert sweep.main([str(sweep_file(tmp_path / "reference"))]) == 0
    out = tmp_path / "killed"
    argv = ["-m", "davir.sweep", str(sweep_file(out))]
    assert kill_while_working(argv, lambda: (out / "lr_a" / "seed0").is_dir(), rng, max_delay=6.0, timeout=300)
    assert sweep.main([str(out.with_suffix(".yaml"))]) == 0
    no_temporaries(out)
    for cell in ("lr_a", "lr_b"):
        want, got = (
            json.loads(next((folder / cell / "seed0" / "eval").glob("*/metrics.json")).read_text())
            for folder in (tmp_path / "reference", out)
        )
        assert (got["rows"], got["synthetic"]) == (want["rows"], want["synthetic"]), cell
        assert json.loads(Path(got["predictions"]).read_text()) == json.loads(Path(want["predictions"]).read_text())
    from davir.sweep.grid import COST_COLUMNS

    def scores(summary: dict) -> dict:
        """The summary less what differs between two runs of the same cells: minutes and the compute cost."""
        costs = {column.title for column in COST_COLUMNS}
        variants = {
            name: {k: v for k, v in record.items() if k not in costs} for name, record in summary["variants"].items()
        }
        return {**{k: v for k, v in summary.items() if k != "minutes"}, "variants": variants}

    want, got = (json.loads((folder / "summary.json").read_text()) for folder in (tmp_path / "reference", out))
    assert scores(got) == scores(want)
    assert set(got["variants"]["lr a"]) > set(scores(got)["variants"]["lr a"])  # the cost is there, not compared


@pytest.mark.usefixtures("one_torch_thread")  # as in the killed processes (ENV)
def test_caption_killed_twice_resumes_byte_identical(data, tmp_path):
    """caption.py SIGKILLed at seeded moments while it appends batches, rerun: the JSONL equals an uninterrupted
    run's byte for byte (no lost, repeated or broken line), and the report is complete."""
    from davir.cli import caption as caption_cli

    rng = random.Random(187)
    run_dir, pairs = tiny_caption_run(data, tmp_path, pairs=24)
    argv = lambda out: [
        "--checkpoint",
        str(run_dir),
        "--pairs",
        str(pairs),
        "--out",
        str(out),  # noqa: E731
        "--batch-size",
        "2",
        "--workers",
        "0",
        "--quiet",
    ]
    assert caption_cli.main(argv(tmp_path / "reference" / "c.jsonl")) == 0
    out = tmp_path / "killed" / "c.jsonl"
    kills = sum(
        kill_while_working(
            ["caption.py", *argv(out)], lambda: out.is_file() and out.stat().st_size > 0, rng, max_delay=1.0
        )
        for _ in range(2)
    )
    assert kills >= 1
    assert caption_cli.main(argv(out)) == 0
    assert out.read_bytes() == (tmp_path / "reference" / "c.jsonl").read_bytes()
    assert len(out.read_text().splitlines()) == 24
    assert json.loads(out.with_name("c.jsonl.manifest.json").read_text())["status"] == "complete"
    assert len(list((tmp_path / "killed" / "report_files" / "strips").glob("*.jpg"))) == 24  # every pair in the report
    no_temporaries(tmp_path / "killed")
