"""`preprocess masks --localisation object` (davir.preprocessing.object_localisation) [D]: on hard synthetic pairs
(camera moves with parallax) it finds the changed object and marks nothing on distractor-only pairs; the cache
records the choice and its profile is `custom`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from davir.data.synthetic import SynthConfig, generate_dataset, load_scenes
from davir.jobs.masks import main as masks_main
from davir.preprocessing.object_localisation import ObjectSettings, localise_objects
from davir.preprocessing.profiles import mask_cache_profile, mask_localisation, mask_profile

SCENES = 10


@pytest.fixture(scope="module")
def hard(tmp_path_factory):
    root = tmp_path_factory.mktemp("hard_objects")
    generate_dataset(root, SynthConfig(scenes=SCENES, seed=31, difficulty="hard"), workers=1)
    return root


def _rgb(root, relative):
    return np.asarray(Image.open(root / relative).convert("RGB"))


def _mask(root, relative):
    return np.asarray(Image.open(root / relative)) > 0


def _iou(a, b):
    union = np.count_nonzero(a | b)
    return np.count_nonzero(a & b) / union if union else 1.0


def test_object_localisation_finds_the_change_and_ignores_parallax(hard):
    ious, false_positive, moved_camera = [], [], 0
    for scene in load_scenes(hard).values():
        before = _rgb(hard, scene["images"]["before"]["file"])
        found = localise_objects(before, _rgb(hard, scene["images"]["after"]["file"]), ObjectSettings())
        truth = _mask(hard, scene["masks"]["before"]) | _mask(hard, scene["masks"]["after"])
        ious.append(_iou(found.before | found.after, truth))
        distractor = localise_objects(before, _rgb(hard, scene["images"]["nonsemantic"]["file"]))
        false_positive.append(float((distractor.before | distractor.after).mean()))
        moved_camera += "camera" in (scene["distractors"]["nonsemantic"] or {})
    assert moved_camera >= 3  # the distractor pairs include camera moves with parallax
    assert np.mean(ious) >= 0.7 and sum(i >= 0.5 for i in ious) >= SCENES - 2, ious
    assert np.mean(false_positive) <= 0.02 and max(false_positive) <= 0.05, false_positive


def test_masks_cli_records_the_object_localisation(hard, tmp_path):
    out = tmp_path / "masks"
    assert (
        masks_main(
            [
                "--format",
                "clevr_change",
                "--root",
                str(hard),
                "--split",
                "test",
                "--out",
                str(out),
                "--localisation",
                "object",
                "--no-progress",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["localisation"] == "object"
    assert manifest["settings"]["object"] == ObjectSettings().to_dict()
    assert manifest["profile"] == "custom" and mask_cache_profile(out)[0] == "custom"
    assert manifest["profile_deviations"] == {"localisation": {"profile": "pixel", "chosen": "object"}}
    assert mask_localisation(manifest["settings"]) == "object"
    # a cache from before the option (no "localisation" recorded) is pixel-level, and keeps its profile
    assert mask_localisation({}) == "pixel"
    old = {
        "regions": {"register": "ecc", "photometric": "affine", "tolerance_px": 2, "cluster_stride": 2},
        "segmenter": {"segmenter": "classical"},
        "segment_both": True,
    }
    assert mask_profile(old) == "toolkit"
    # a rerun with pixel localisation into the object cache is refused (other settings)
    assert (
        masks_main(
            ["--format", "clevr_change", "--root", str(hard), "--split", "test", "--out", str(out), "--no-progress"]
        )
        == 2
    )

    # caption.py follows what the cache recorded: online masks of a new pair are object-level, equal to the cache's
    from davir.data.caches import MaskCache
    from davir.data.formats import read_dataset
    from davir.preprocessing.online import OnlineMasks

    online = OnlineMasks.from_cache(out)
    assert online.settings_dict()["localisation"] == "object"
    pair = read_dataset("clevr_change", hard, "test").pairs[0]
    cached = MaskCache(out).read(pair.pair_id)
    fresh = online(pair)
    assert np.array_equal(fresh.after, cached.after) and np.array_equal(fresh.before, cached.before)
