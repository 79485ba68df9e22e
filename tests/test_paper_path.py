"""The paper path end to end, as a researcher runs it, on the CPU with tiny weights of the real classes.

SAM masks (`preprocess masks --profile paper`) → CLIP entities (`preprocess entities --profile paper`) → LoRA
fine-tune of a local InstructBLIP folder with `configs/davir_spot_the_diff.yaml`, only paths and sizes
overridden (a checkpoint, a kill, `--resume`) → `evaluate.py --checkpoint` (decoding from the run) →
`caption.py` on a folder of pairs (online SAM + CLIP), whose masks and entities must equal the cached ones.
The data are the built-in synthetic set in the CLEVR-Change layout (no Spot-the-Diff images here).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_fixtures import TINY_SAM_TYPE, build_tiny_sam, write_tiny_clip, write_tiny_instructblip, write_tiny_sam  # noqa: E402

from davir.data.caches import EntityCache, MaskCache  # noqa: E402
from davir.data.synthetic import SynthConfig, generate_dataset  # noqa: E402
from davir.io import read_jsonl  # noqa: E402

SPLITS = ("train", "val", "test")


def _reset_accelerate_state():
    # The paper config trains in bf16: a process-wide AcceleratorState left by an earlier test (mixed precision
    # "no") would refuse it, and ours would refuse theirs, as two trainings in one Python process would.
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="module", autouse=True)
def fresh_accelerate_state():
    _reset_accelerate_state()
    yield
    _reset_accelerate_state()


@pytest.fixture(scope="module")
def paper_world(tmp_path_factory):
    """Data, weights and the paper-profile caches, as files on disk (module scope: built once)."""
    from davir.data.formats import read_dataset
    from davir.jobs import entities, masks
    from davir.preprocessing.segmenters.sam import SAM_TYPES

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("paper")
    root = base / "data"
    generate_dataset(root, SynthConfig(scenes=20, seed=0, width=96, height=72), workers=1)
    texts = [c for split in SPLITS for p in read_dataset("clevr_change", root, split).pairs for c in p.captions]
    from davir.models.vlm.epc import EpcConfig

    blip = write_tiny_instructblip(base / "instructblip", [*texts, EpcConfig().prompt, EpcConfig().entity_prefix])
    sam = write_tiny_sam(base / "sam_tiny.pth")
    clip_name, clip_checkpoint, clip_config = write_tiny_clip(base / "clip")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(SAM_TYPES, TINY_SAM_TYPE, build_tiny_sam)
        for split in SPLITS:
            assert (
                masks.main(
                    [
                        "--profile",
                        "paper",
                        "--format",
                        "clevr_change",
                        "--root",
                        str(root),
                        "--split",
                        split,
                        "--out",
                        str(base / "masks"),
                        "--sam-type",
                        TINY_SAM_TYPE,
                        "--sam-checkpoint",
                        str(sam),
                        "--device",
                        "cpu",
                        "--no-progress",
                    ]
                )
                == 0
            )
            assert (
                entities.main(
                    [
                        "--profile",
                        "paper",
                        "--format",
                        "clevr_change",
                        "--root",
                        str(root),
                        "--split",
                        split,
                        "--masks",
                        str(base / "masks"),
                        "--out",
                        str(base / "entities"),
                        "--clip-model",
                        clip_name,
                        "--clip-checkpoint",
                        str(clip_checkpoint),
                        "--clip-config",
                        str(clip_config),
                        "--device",
                        "cpu",
                        "--vocab-min-count",
                        "1",
                        "--no-progress",
                    ]
                )
                == 0
            )
        yield {
            "base": base,
            "root": root,
            "blip": blip,
            "sam": sam,
            "masks": base / "masks",
            "entities": base / "entities",
        }


def _train_argv(world, run_dir, *extra):
    w = world
    return [
        "--config",
        str(REPO / "configs" / "davir_spot_the_diff.yaml"),
        "data.format=clevr_change",
        f"data.root={w['root']}",
        f"data.masks={w['masks']}",
        f"data.entities={w['entities']}",
        f"model.pretrained={w['blip']}",
        f"run.output_dir={run_dir}",
        "optim.batch_size=4",
        "optim.max_steps=4",
        "run.save_every=2",
        "run.eval_every=4",
        "run.val_max_pairs=4",
        "run.tensorboard=false",
        "run.log_every=1",
        *extra,
    ]


@pytest.fixture(scope="module")
def paper_run(paper_world, tmp_path_factory):
    """`train.py --config configs/davir_spot_the_diff.yaml` on the paper caches: 4 steps, checkpoints at 2 and 4."""
    from davir.cli import train

    run_dir = tmp_path_factory.mktemp("paper_run") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train.main(_train_argv(paper_world, run_dir)) == 0
    (run_dir / "stdout.txt").write_text(printed.getvalue())
    return run_dir


def test_paper_path_train_resume_evaluate(paper_world, paper_run, tmp_path, capsys, losses_of):
    from davir.cli import evaluate, train

    w = paper_world
    # The caches say which profile made them; the paper config accepts them.
    manifest = json.loads((w["masks"] / "manifest.json").read_text())
    assert manifest["profile"] == "paper" and manifest["settings"]["segment_both"] is False
    assert (
        manifest["settings"]["regions"]["register"] == "none"
        and manifest["settings"]["segmenter"]["segmenter"] == "sam"
    )
    assert json.loads((w["entities"] / "entities" / "manifest.json").read_text())["profile"] == "paper"

    # --- train: a checkpoint at step 2, the end at step 4; the total step count is printed at the start.
    run_dir = tmp_path / "run"
    shutil.copytree(paper_run, run_dir)  # the copy is killed and resumed below
    out = (run_dir / "stdout.txt").read_text()
    assert "caption_mode sample: 32 pairs" in out and "= 4 optimizer steps in total" in out
    full = losses_of(run_dir)
    assert sorted(full) == [1, 2, 3, 4] and all(np.isfinite(list(full.values())))

    # The checkpoint holds what training changed (LoRA + buffers), none of the frozen base weights.
    checkpoint = run_dir / "checkpoints" / "step_2"
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert keys and all("lora_" in k or not k.endswith(".weight") or "position" in k for k in keys), sorted(keys)[:5]
    assert not any(k.endswith("language_model.model.embed_tokens.weight") for k in keys)
    complete = json.loads((checkpoint / "COMPLETE").read_text())
    assert "model.safetensors" in complete["files"] and "random_states_0.pkl" in complete["files"]

    # --- a kill after step 2, then --resume: the same loss curve.
    shutil.rmtree(run_dir / "checkpoints" / "step_4")
    log = (run_dir / "train_log.jsonl").read_text().splitlines()
    (run_dir / "train_log.jsonl").write_text("\n".join(log[:2]) + "\n")
    assert train.main([*_train_argv(w, run_dir), "--resume"]) == 0
    resumed = losses_of(run_dir)
    assert [resumed[s] for s in (1, 2)] == [full[1], full[2]]
    assert [resumed[s] for s in (3, 4)] == pytest.approx([full[3], full[4]], rel=1e-4, abs=1e-5)

    # --- evaluate.py --checkpoint decodes as best/ was selected (the config's beam 5, 40 tokens).
    capsys.readouterr()
    assert (
        evaluate.main(["--checkpoint", str(run_dir), "--split", "test", "--no-spice", "--metrics", "BLEU,CIDEr"]) == 0
    )
    metrics = json.loads((run_dir / "eval" / "clevr_change_test" / "metrics.json").read_text())
    assert (metrics["decoding"]["num_beams"], metrics["decoding"]["max_new_tokens"]) == (5, 40)
    assert metrics["decoding"]["source"]["num_beams"].endswith("config.yaml")


def test_paper_path_caption_py_matches_the_caches(paper_world, paper_run, tmp_path):
    """caption.py on a folder (online SAM + CLIP): pairs also in the caches get the cached masks and entities."""
    from davir.cli import caption
    from davir.data.formats import read_dataset
    from davir.preprocessing.online import OnlineMasks
    from davir.preprocessing.segmenters.sam import SAM_TYPES

    w, run_dir = paper_world, paper_run
    # Two pairs also in the caches, one new (the first reversed).
    tests = read_dataset("clevr_change", w["root"], "test").pairs[:2]
    folder = tmp_path / "pairs"
    (folder / "before").mkdir(parents=True)
    (folder / "after").mkdir()
    for pair in tests:
        shutil.copy(pair.before, folder / "before" / f"{pair.pair_id}.png")
        shutil.copy(pair.after, folder / "after" / f"{pair.pair_id}.png")
    shutil.copy(tests[0].after, folder / "before" / "reversed.png")
    shutil.copy(tests[0].before, folder / "after" / "reversed.png")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(SAM_TYPES, TINY_SAM_TYPE, build_tiny_sam)
        status = caption.main(
            ["--checkpoint", str(run_dir), "--pairs", str(folder), "--out", str(tmp_path / "c.jsonl")]
        )
        assert status == 0
        rows = {row["id"]: row for row in read_jsonl(tmp_path / "c.jsonl")}
        assert set(rows) == {p.pair_id for p in tests} | {"reversed"}
        assert all(row["caption"] is not None and row["error"] is None for row in rows.values())
        cached_entities, cached_masks = EntityCache(w["entities"]), MaskCache(w["masks"])
        online = OnlineMasks.from_cache(w["masks"])
        for pair in tests:
            assert rows[pair.pair_id]["entities"] == [
                [e, round(s, 4)] for e, s in cached_entities.get(pair.pair_id)[:5]
            ]
            made, stored = online(pair), cached_masks.read(pair.pair_id)
            assert made.before is None and stored.before is None  # the paper segments the after image only
            assert np.array_equal(made.after, stored.after)
