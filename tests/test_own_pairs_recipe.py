"""README "Train DAVIR on your own pairs", line by line, on a small folder made from the synthetic set:
import → masks → entities → train (LoRA on the shipped tiny checkpoint) → evaluate → caption."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from davir.data.synthetic import SynthConfig, generate_dataset

REPO = Path(__file__).resolve().parents[1]
# Only what makes the run small; every other setting is the README's (configs/demo.yaml).
TINY = (
    "optim.max_steps=2 optim.batch_size=4 run.val_max_pairs=2 run.eval_every=0 run.save_every=0 "
    "run.tensorboard=false run.log_every=1 model.pretrained={repo}/assets/tiny_instructblip"
)


def recipe_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"# recipe: own pairs\n(.*?)# end recipe", text, re.S)
    assert block, "README lost its recipe block"
    return block.group(1).rstrip().splitlines()


@pytest.mark.slow  # nine commands, each a fresh Python: about a minute of CPU
def test_readme_recipe_trains_scores_and_captions_a_folder_of_own_pairs(tmp_path):
    data = tmp_path / "synth"
    generate_dataset(data, SynthConfig(scenes=12, seed=5, width=64, height=48), workers=1)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(REPO),
    }
    # The user's folder: a pairs.csv with captions, splits and masks, images copied beside it (no CLEVR files).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "davir.data",
            "pairs",
            "--format",
            "clevr_change",
            "--root",
            str(data),
            "--split",
            "train",
            "--split",
            "val",
            "--split",
            "test",
            "--num",
            "0",
            "--copy-images",
            "--out",
            str(tmp_path / "my_pairs" / "pairs.csv"),
        ],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    script = "\n".join(recipe_lines())
    script = re.sub(r"\bpython (train|evaluate|caption)\.py", rf"{sys.executable} {REPO}/\1.py", script)
    script = script.replace("python -m", f"{sys.executable} -m").replace("configs/", f"{REPO}/configs/")
    script = script.replace(
        "data.entities=cache/my_pairs/entities", "data.entities=cache/my_pairs/entities " + TINY.format(repo=REPO)
    )
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]

    imported = tmp_path / "my_pairs" / "imported"
    rows = [json.loads(line) for line in (imported / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and all(row["captions"] and "mask" in row for row in rows)
    assert {row["split"] for row in rows} <= {"train", "val", "test"}
    metrics = json.loads((tmp_path / "runs" / "my_pairs" / "eval" / "folder_test" / "metrics.json").read_text())
    predictions = json.loads((tmp_path / "runs" / "my_pairs" / "eval" / "folder_test" / "predictions.json").read_text())
    test_ids = {row["id"] for row in rows if row["split"] == "test"}
    assert {row["image_id"] for row in predictions} == test_ids  # scored against the manifest's references
    assert "CIDEr" in json.dumps(metrics) and metrics["localisation"]["images"] > 0  # the manifest's masks
    captions = [json.loads(line) for line in (tmp_path / "my_pairs" / "captions.jsonl").read_text().splitlines()]
    assert len(captions) == 24 and all(isinstance(row["caption"], str) and row["error"] is None for row in captions)
