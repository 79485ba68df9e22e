"""bench/fac_object_reference.py: the share a map spread over every object scores in the change mask, by hand and on a
generated set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import fac_object_reference  # noqa: E402


def test_two_equal_objects_one_changed_give_half_the_map_in_the_mask():
    """64×64 image, 8×8 grid of 8-px patches: objects on patches (0-1, 0-1) and (4-5, 4-5); the first changed. A
    map spread over both objects has half its mass in the mask; the uniform map 4/64."""
    scene = {
        "images": {
            side: {"objects": [{"box": [0, 0, 16, 16]}, {"box": [32, 32, 48, 48]}]} for side in ("before", "after")
        }
    }
    everything = fac_object_reference.objects_mask(scene, "after", (64, 64))
    assert everything.sum() == 2 * 16 * 16
    change = np.zeros((64, 64), dtype=bool)
    change[0:16, 0:16] = True
    result = fac_object_reference.all_objects_reference([("p", "after", change, everything)], grid=8)
    assert result["images"] == 1
    assert result["all_objects_share"] == pytest.approx(0.5, abs=1e-4)
    assert result["uniform_share"] == pytest.approx(4 / 64, abs=1e-4)
    assert 0.5 < result["fac_target_share"] < 1.0  # Eq. 6's blur puts some of the target beside the object


def test_on_a_generated_set_objects_beat_uniform(synthetic_set, capsys):
    root = synthetic_set(20, 0)
    assert fac_object_reference.main(["--data", str(root), "--split", "train", "--grids", "4,8"]) == 0
    report = json.loads(capsys.readouterr().out)
    for grid in ("4x4", "8x8"):
        row = report["all_objects_reference"][grid]
        assert row["images"] > 0
        assert row["uniform_share"] < row["all_objects_share"] < row["fac_target_share"] <= 1.0


def test_a_set_without_scenes_or_a_wrong_run_folder_stops_with_one_line(synthetic_set, tmp_path, capsys):
    assert fac_object_reference.main(["--data", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path / 'scenes.json'} not found: the reference needs a generated set's object boxes"
    )
    root = synthetic_set(20, 0)
    assert fac_object_reference.main(["--data", str(root), "--split", "train", "--runs", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'run'} is neither a saved model") and "Traceback" not in err
