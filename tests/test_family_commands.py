"""Every chat family through the same commands, from a user's folder written by save_pretrained (the real classes at
toy size, the family's real tokenizer class trained offline): FAC + EPC training, a kill and --resume (the same loss
curve), evaluate.py --checkpoint, caption.py from another folder, ChangeCaptioner — and the checkpoints hold no
frozen base weight."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import mask_and_entity_caches, write_chat_folder  # noqa: E402

from davir.models.vlm.build import load_davir_model  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CHAT_FAMILIES = ("qwen2_5_vl", "llava_onevision", "smolvlm", "qwen3_vl", "internvl", "gemma3")


@pytest.fixture(scope="module")
def caches(synthetic_set, tmp_path_factory):
    return mask_and_entity_caches(synthetic_set(24, 0), tmp_path_factory.mktemp("family_caches"))


def _user_folder(family: str, root: Path, where: Path) -> Path:
    from davir.data.formats import read_dataset

    texts = [
        c
        for split in ("train", "val", "test")
        for p in read_dataset("clevr_change", root, split).pairs
        for c in p.captions
    ]
    return write_chat_folder(family, where / f"{family}-toy", [*texts, EpcConfig().prompt, EpcConfig().entity_prefix])


def _train_argv(caches, family, folder, run_dir, *extra):
    root, masks, entities = caches
    return [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"data.root={root}",
        f"data.masks={masks}",
        f"data.entities={entities}",
        f"model.family={family}",
        f"model.pretrained={folder}",
        "model.image_size=64",
        "model.train_mode=lora",
        "model.extra_trainable=[]",
        "optim.batch_size=4",
        "optim.max_steps=4",
        "run.save_every=2",
        "run.eval_every=4",
        "run.val_max_pairs=4",
        "run.tensorboard=false",
        "run.log_every=1",
        f"run.output_dir={run_dir}",
        *extra,
    ]


@pytest.mark.parametrize("family", CHAT_FAMILIES)
def test_train_resume_evaluate_caption_from_a_users_folder(family, caches, tmp_path, monkeypatch, capsys, losses_of):
    from davir.cli import caption, evaluate, train
    from davir.inference import ChangeCaptioner

    folder = _user_folder(family, caches[0], tmp_path)
    run_dir = tmp_path / "run"
    assert train.main(_train_argv(caches, family, folder, run_dir)) == 0
    full = losses_of(run_dir)
    assert sorted(full) == [1, 2, 3, 4] and all(np.isfinite(list(full.values())))
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert all(row["train/attn_loss"] > 0 for row in log if "train/loss" in row)  # FAC was on
    saved = json.loads((run_dir / "last" / "davir_config.json").read_text())["config"]
    assert saved["family"] == family and saved["epc"]["use_entities"] is True

    # checkpoints and the saved model hold LoRA only: no frozen base weight
    with safe_open(str(run_dir / "checkpoints" / "step_2" / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert keys and all("lora_" in key for key in keys), sorted(keys)[:5]
    assert sorted(p.name for p in (run_dir / "last").iterdir()) == [
        "adapter",
        "davir_config.json",
        "processor",
        "selection.json",
    ]

    # a kill after step 2, then --resume: the same curve
    shutil.rmtree(run_dir / "checkpoints" / "step_4")
    lines = (run_dir / "train_log.jsonl").read_text().splitlines()
    (run_dir / "train_log.jsonl").write_text("\n".join(lines[:2]) + "\n")
    assert train.main([*_train_argv(caches, family, folder, run_dir), "--resume"]) == 0
    resumed = losses_of(run_dir)
    assert [resumed[s] for s in (1, 2)] == [full[1], full[2]]
    assert [resumed[s] for s in (3, 4)] == pytest.approx([full[3], full[4]], rel=1e-5, abs=1e-6)
    # resuming as another family is refused, naming the setting
    capsys.readouterr()
    assert train.main([*_train_argv(caches, family, folder, run_dir), "model.family=instructblip", "--resume"]) == 2
    assert f"model.family ('{family}' -> 'instructblip')" in capsys.readouterr().err

    assert evaluate.main(["--checkpoint", str(run_dir), "--split", "test", "--no-spice", "--metrics", "BLEU"]) == 0
    metrics = json.loads((run_dir / "eval" / "clevr_change_test" / "metrics.json").read_text())
    assert metrics["localisation"]["attention_share_in_mask"] > 0

    # caption.py from another folder, on a folder of pairs; ChangeCaptioner gives the same captions
    root = caches[0]
    pairs = tmp_path / "pairs"
    (pairs / "before").mkdir(parents=True)
    (pairs / "after").mkdir()
    for i, path in enumerate(sorted((root / "images").iterdir())[:3]):
        shutil.copy(path, pairs / "before" / f"p{i}.png")
        shutil.copy(root / "sc_images" / path.name.replace("default", "semantic"), pairs / "after" / f"p{i}.png")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert caption.main(["--checkpoint", str(run_dir), "--pairs", "../pairs", "--out", "caps.jsonl"]) == 0
    rows = [json.loads(line) for line in (elsewhere / "caps.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2"] and all(r["error"] is None for r in rows)
    captioner = ChangeCaptioner.from_pretrained(run_dir, device="cpu")
    again = captioner.caption(
        [pairs / "before" / f"p{i}.png" for i in range(3)], [pairs / "after" / f"p{i}.png" for i in range(3)]
    )
    assert [r.caption for r in again] == [r["caption"] for r in rows]
    assert type(load_davir_model(run_dir / "last", pretrained=folder)).__name__ == "ChatDavirModel"
