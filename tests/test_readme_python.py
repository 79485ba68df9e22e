"""README.md's "In Python" blocks run as written: train from a config object, caption a folder, score a run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def python_blocks(readme: str) -> list[str]:
    section = readme.split("\n## In Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_has_the_three_examples():
    blocks = python_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) == 3
    assert "train(config)" in blocks[0] and "caption_folder(" in blocks[1] and "evaluate_run(" in blocks[2]


@pytest.mark.slow  # the README's examples end to end (training, scoring, captioning): over a minute of CPU
@pytest.mark.usefixtures("one_torch_thread")
def test_the_readme_python_examples_run_as_written(synthetic_set, tmp_path, monkeypatch, capsys):
    from davir.jobs.features import main as features_main

    root = synthetic_set(16, 4)  # the set tests/test_caption.py uses: made once per worker
    work = tmp_path / "work"
    (work / "my_pairs" / "before").mkdir(parents=True)
    (work / "my_pairs" / "after").mkdir()
    shutil.copytree(root, work / "my_data")
    (work / "configs").symlink_to(REPO / "configs")  # the repository's configs/, as a user working in a checkout
    for i, image in enumerate(sorted((root / "images").iterdir())[:3]):
        shutil.copy(image, work / "my_pairs" / "before" / f"p{i}.png")
        shutil.copy(
            root / "sc_images" / image.name.replace("default", "semantic"), work / "my_pairs" / "after" / f"p{i}.png"
        )
    monkeypatch.chdir(work)
    for split in ("train", "val", "test"):
        assert (
            features_main(
                [
                    "--format",
                    "clevr_change",
                    "--root",
                    "my_data",
                    "--split",
                    split,
                    "--out",
                    "my_features",
                    "--random-init",
                    "--workers",
                    "0",
                    "--no-progress",
                ]
            )
            == 0
        )
    namespace: dict = {}
    for block in python_blocks((REPO / "README.md").read_text(encoding="utf-8")):
        exec(compile(block, "README.md", "exec"), namespace)
    assert (work / "runs" / "mine" / "best").is_dir()
    assert namespace["summary"].captioned == 3 and namespace["summary"].status == 0
    assert len((work / "captions.jsonl").read_text().splitlines()) == 3 and (work / "report.html").is_file()
    result, scores = namespace["result"], namespace["scores"]
    assert result.metrics_file.is_file() and len(result.predictions) > 0
    assert scores.rows["total"].metrics["CIDEr"] == pytest.approx(result.metrics["rows"]["total"]["metrics"]["CIDEr"])
