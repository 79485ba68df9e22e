"""`python -m davir.data synth --difficulty`: the standard set unchanged byte for byte, and the hard set
(davir/data/synthetic/hard.py; docs/experiments/synthetic_hard.md): 6-10 objects, camera moves with parallax, exact masks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from davir.data.synthetic import SynthConfig, generate_dataset, load_synthetic_set
from davir.errors import DataError

# sha256 over (relative path, sha256 of the bytes) of every file of `synth --scenes 10 --seed 0` (320x240),
# computed with the code before difficulties existed (commit c9b5896).
STANDARD_10_SEED_0 = "5843ccd36db2c266bf869f53c3ffdb1f723da754a2b61f7530707e566a8c84c6"
HARD = SynthConfig(scenes=15, seed=21, difficulty="hard")


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _mask(root: Path, relative: str) -> np.ndarray:
    return np.asarray(Image.open(root / relative)) > 0


@pytest.fixture(scope="module")
def hard(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hard")
    generate_dataset(root, HARD, workers=1)
    return {"root": root, "data": load_synthetic_set(root)}


def test_standard_is_byte_identical_to_the_set_before_difficulties(tmp_path):
    generate_dataset(tmp_path, SynthConfig(scenes=10, seed=0, difficulty="standard"), workers=1)
    assert _digest(tmp_path) == STANDARD_10_SEED_0
    assert "difficulty" not in json.loads((tmp_path / "scenes.json").read_text())["config"]


def test_hard_is_reproducible_by_seed_and_recorded(hard, tmp_path):
    again = tmp_path / "again"
    generate_dataset(again, SynthConfig(scenes=3, seed=21, difficulty="hard"), workers=1)
    first = load_synthetic_set(hard["root"])["scenes"]
    for name in (
        "images/CLEVR_default_000002.png",
        "nsc_images/CLEVR_nonsemantic_000001.png",
        "gt_masks/after/000000.png",
    ):
        assert (again / name).read_bytes() == (hard["root"] / name).read_bytes()
    assert load_synthetic_set(again)["scenes"]["000001"] == first["000001"]
    assert hard["data"]["config"]["difficulty"] == "hard"
    assert (hard["data"]["config"]["min_objects"], hard["data"]["config"]["max_objects"]) == (6, 10)
    with pytest.raises(DataError, match="another config"):  # a standard run into a hard folder is refused
        generate_dataset(hard["root"], SynthConfig(scenes=15, seed=21), workers=1)
    other = tmp_path / "other"
    generate_dataset(other, SynthConfig(scenes=1, seed=22, difficulty="hard"), workers=1)
    assert (other / "images/CLEVR_default_000000.png").read_bytes() != (
        hard["root"] / "images/CLEVR_default_000000.png"
    ).read_bytes()


def test_hard_scenes_hold_6_to_10_objects_some_small_or_partly_hidden(hard):
    scenes = hard["data"]["scenes"]
    counts = [len(s["images"][key]["objects"]) for s in scenes.values() for key in ("before", "after")]
    assert min(counts) >= 6 and max(counts) <= 10
    objects = [o for s in scenes.values() for o in s["images"]["before"]["objects"]]
    assert any(o["visible"] < 0.85 for o in objects) and min(o["visible"] for o in objects) >= 0.35
    assert any(o["size"] == "small" and o["radius"] < 0.35 for o in objects)
    assert any(s["change"]["hard_target"] for s in scenes.values())


def test_camera_moves_show_parallax(hard):
    moved = 0
    for scene in hard["data"]["scenes"].values():
        distractor = scene["distractors"]["nonsemantic"]
        if distractor is None or "camera" not in distractor:
            continue
        moved += 1
        before = {o["id"]: o for o in scene["images"]["before"]["objects"]}
        after = {o["id"]: o for o in scene["images"]["nonsemantic"]["objects"]}
        near = min(before, key=lambda i: before[i]["depth"])
        far = max(before, key=lambda i: before[i]["depth"])
        shift = {i: np.subtract(after[i]["centre_px"], before[i]["centre_px"]) for i in (near, far)}
        # the nearest and the farthest object move differently: no single 2-D shift explains the move
        assert before[near]["depth"] < before[far]["depth"] - 1.0
        assert np.linalg.norm(shift[near] - shift[far]) > 3.0, scene["change"]
    assert moved >= 3


def test_gt_masks_cover_the_changed_object_and_nothing_on_distractor_pairs(hard):
    root = hard["root"]
    for scene in hard["data"]["scenes"].values():
        change, masks = scene["change"], scene["masks"]
        for frame, image in (("before", "before"), ("after", "after")):
            mask = _mask(root, masks[frame])
            if (change["type"], frame) in (("add", "before"), ("drop", "after")):
                assert not mask.any()
                continue
            record = next(o for o in scene["images"][image]["objects"] if o["id"] == change["object"])
            x0, y0, x1, y1 = record["box"]
            assert mask.any() and not mask[:y0].any() and not mask[y1:].any()
            assert not mask[:, :x0].any() and not mask[:, x1:].any()
            assert mask.sum() >= 0.3 * record["visible"] * (x1 - x0) * (y1 - y0) * 0.5
        assert not _mask(root, masks["before_n"]).any() and not _mask(root, masks["after_n"]).any()


def test_hard_illumination_moves_the_shadows(hard):
    scenes = hard["data"]["scenes"].values()
    lit = [s for s in scenes if (s["distractors"]["nonsemantic"] or {}).get("kind") == "illumination"]
    assert lit
    for scene in lit:
        assert scene["distractors"]["nonsemantic"]["light"] != scene["view"]["light"]


def test_difficulty_is_checked():
    with pytest.raises(DataError, match="difficulty"):
        SynthConfig(difficulty="extreme")
    with pytest.raises(DataError, match="max_objects"):
        SynthConfig(max_objects=10)  # standard allows 8 at most, as before
    assert (SynthConfig().min_objects, SynthConfig().max_objects) == (3, 7)
