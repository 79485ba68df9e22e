"""Caption text as users write it: Latin-1 manifests, over-long and punctuation-only references counted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from davir.config import load_config
from davir.data.formats.folder import read_folder
from davir.data.stats import dataset_stats
from davir.errors import DataError
from davir.runs.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
LONG_CAPTION = " ".join(["the red cube moved"] * 500)  # 2,000 words


def run(*args, cwd=REPO):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def images(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (32, 24), (10 * i, 80, 200 - 10 * i)).save(folder / f"{i}.png")


# --- encodings ------------------------------------------------------------------------------------------------------


def test_a_latin1_manifest_names_line_and_column_and_how_to_convert_it(tmp_path):
    images(tmp_path / "imgs", 4)
    manifest = tmp_path / "pairs.csv"
    manifest.write_bytes(
        "id,before,after,caption,split\n"
        "a,imgs/0.png,imgs/1.png,a cup appeared,train\n"
        "b,imgs/2.png,imgs/3.png,the café sign is gone,train\n".encode("latin-1")
    )
    with pytest.raises(DataError) as caught:
        read_folder(manifest)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: line 3, column 32: not a UTF-8 CSV file (byte 0xe9)"), message
    assert f"iconv -f latin1 -t utf-8 {manifest} >" in message and "--encoding latin-1" in message
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_bytes('{"before": "imgs/0.png", "after": "imgs/1.png", "caption": "déjà vu"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"pairs\.jsonl: line 1, column 62: not a UTF-8 JSON-lines file \(byte 0xe9\)"):
        read_folder(jsonl)

    result = run("-m", "davir.data", "import", str(manifest), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {manifest}: line 3, column 32:")
    result = run("-m", "davir.data", "import", str(manifest), "--out", str(tmp_path / "out"), "--encoding", "latin-1")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "out" / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [row["captions"] for row in rows] == [["a cup appeared"], ["the café sign is gone"]]
    assert read_folder(tmp_path / "out" / "pairs.jsonl").pairs[1].captions == ("the café sign is gone",)
    result = run("-m", "davir.data", "import", str(manifest), "--out", str(tmp_path / "o2"), "--encoding", "latin-42")
    assert result.returncode == 2 and result.stderr.startswith("error: --encoding latin-42: unknown encoding")


# --- over-long and punctuation-only references ----------------------------------------------------------------------


def write_manifest(tmp_path: Path, captions: list[str], splits: list[str] | None = None) -> Path:
    images(tmp_path / "imgs", 2 * len(captions))
    lines = ["id,before,after,caption,split"]
    for i, caption in enumerate(captions):
        split = splits[i] if splits else "train"
        lines.append(f'p{i},imgs/{2 * i}.png,imgs/{2 * i + 1}.png,"{caption}",{split}')
    manifest = tmp_path / "pairs.csv"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def test_stats_counts_references_cut_in_training_and_references_without_words(tmp_path):
    write_manifest(tmp_path, ["a cup appeared", LONG_CAPTION, "...", "the chair left", " — !"])
    counts = dataset_stats("folder", tmp_path, ["all"])["splits"]["all"]
    assert counts["reference_sentences"] == 5
    assert counts["longest_reference_words"] == 2000
    assert counts["references_over_47_words"] == 1 and counts["long_reference_examples"] == ["p1: 2000 words"]
    assert counts["references_without_words"] == 2
    assert counts["wordless_reference_examples"] == ["p2: '...'", "p4: '— !'"]


def test_stats_agrees_with_the_davir_models_caption_budget():
    from davir.data.stats import DAVIR_CAPTION_TOKENS
    from davir.models.vlm.config import DavirModelConfig

    assert DAVIR_CAPTION_TOKENS == DavirModelConfig().max_caption_tokens


def test_import_lists_punctuation_only_captions_as_warnings(tmp_path):
    manifest = write_manifest(tmp_path, ["a cup appeared", "...", "the chair left"])
    out = tmp_path / "out"
    result = run("-m", "davir.data", "import", str(manifest), "--out", str(out))
    assert result.returncode == 0, result.stderr
    warning = f"{manifest}: line 3: caption '...' has no words (punctuation only)"
    assert f"warning: {warning}" in result.stderr.splitlines()[0]
    assert "1 warning(s)" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["warnings"][0].startswith(warning) and len(report["warnings"]) == 1
    assert report["captions"]["captions_without_words"] == 1
    assert "has no words" in (out / "summary.html").read_text()


def test_training_start_says_how_many_references_are_cut(tmp_path, capsys):
    from davir.training import loop as train_loop

    torch.set_num_threads(1)
    captions = ["a cup appeared", LONG_CAPTION, "the chair left", "a box moved", "a cup appeared", "nothing changed"]
    write_manifest(tmp_path, captions, ["train"] * 4 + ["val"] * 2)  # the folder reader finds pairs.csv
    config = load_config(
        TrainConfig,
        REPO / "configs" / "demo.yaml",
        [
            "data.format=folder",
            f"data.root={tmp_path}",
            "data.masks=null",
            "data.entities=null",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=false",
            f"model.pretrained={REPO / 'assets' / 'tiny_instructblip'}",
            "optim.batch_size=2",
            "optim.max_steps=1",
            "run.val_max_pairs=2",
            "run.eval_every=0",
            "run.tensorboard=false",
            f"run.output_dir={tmp_path / 'run'}",
        ],
    )
    train_loop.train(config)
    lines = [line for line in capsys.readouterr().out.splitlines() if "training references" in line]
    assert lines == [
        "note: 1 of 4 training references is longer than model.max_caption_tokens=48 allows "
        "(47 tokens and the end of sentence; the longest has 2000): training sees only its first "
        "47 tokens"
    ], lines
