"""The built-in synthetic change dataset (davir/data/synthetic/) and the picture grid (davir/data/show.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from davir.data import read_dataset
from davir.data.records import CHANGE_TYPES
from davir.data.show import draw_grid
from davir.data.synthetic import (
    COLORS,
    MATERIAL_WORDS,
    MATERIALS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SHAPES,
    SIZE_WORDS,
    SIZES,
    SynthConfig,
    generate_dataset,
    load_scenes,
)
from davir.errors import DataError

SCENES = 30
CONFIG = SynthConfig(scenes=SCENES, seed=7, width=160, height=120, semantic_distractor_rate=0.3)

# caption word -> (attribute, value), synonyms included
WORDS = {word: ("size", size) for size, words in SIZE_WORDS.items() for word in words}
WORDS.update({color: ("color", color) for color in COLORS})
WORDS.update({word: ("material", material) for material, words in MATERIAL_WORDS.items() for word in words})
WORDS.update({word: ("shape", shape) for shape, words in SHAPE_WORDS.items() for word in words})


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict:
    """The same config rendered twice: in this process and with two worker processes."""
    base = tmp_path_factory.mktemp("synth")
    one, two = base / "one_worker", base / "two_workers"
    summary = generate_dataset(one, CONFIG, workers=1)
    generate_dataset(two, CONFIG, workers=2)
    return {"root": one, "other": two, "summary": summary, "scenes": load_scenes(one)}


def _load(root: Path, relative: str) -> np.ndarray:
    return np.asarray(Image.open(root / relative))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(generated):
    first, second = _files(generated["root"]), _files(generated["other"])
    # 7 PNGs per scene + 5 JSON files
    assert len(first) == 7 * SCENES + 5
    assert first.keys() == second.keys()
    different = [name for name in first if first[name] != second[name]]
    assert different == []


def test_another_seed_gives_other_scenes(tmp_path, generated):
    config = SynthConfig(**{**asdict(CONFIG), "scenes": 3, "seed": 8})
    generate_dataset(tmp_path, config, workers=1)
    ours = _load(generated["root"], "images/CLEVR_default_000000.png")
    theirs = _load(tmp_path, "images/CLEVR_default_000000.png")
    assert ours.shape == theirs.shape == (120, 160, 3)
    assert not np.array_equal(ours, theirs)


def test_summary_counts(generated):
    summary = generated["summary"]
    assert summary["scenes"] == SCENES and summary["pairs"] == 2 * SCENES
    # types come in shuffled blocks of five consecutive ids: 30 scenes = 6 of each
    assert summary["change_types"] == {t: 6 for t in CHANGE_TYPES}
    assert summary["splits"] == {"train": 24, "val": 3, "test": 3}
    assert summary["reused_existing"] is False


def test_splits_partition_the_scene_ids_and_types_cover_every_change(generated):
    root = generated["root"]
    splits = json.loads((root / "splits.json").read_text())
    ids = splits["train"] + splits["val"] + splits["test"]
    assert sorted(ids) == list(range(SCENES))
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (24, 3, 3)
    mapping = json.loads((root / "type_mapping.json").read_text())
    assert sorted(mapping) == sorted(CHANGE_TYPES)
    assert sorted(name for names in mapping.values() for name in names) == [f"{i:06d}.png" for i in range(SCENES)]
    for change_type, names in mapping.items():
        for name in names:
            assert generated["scenes"][name[:6]]["change"]["type"] == change_type


def test_semantic_masks_cover_exactly_the_changed_pixels(generated):
    root, scenes = generated["root"], generated["scenes"]
    checked = 0
    for key, record in scenes.items():
        change_type = record["change"]["type"]
        before = _load(root, record["images"]["before"]["file"]).astype(int)
        after = _load(root, record["images"]["after"]["file"]).astype(int)
        mask_before = _load(root, f"gt_masks/before/{key}.png")
        mask_after = _load(root, f"gt_masks/after/{key}.png")
        assert mask_before.shape == mask_after.shape == (120, 160)
        assert set(np.unique(mask_before)) <= {0, 255} and set(np.unique(mask_after)) <= {0, 255}
        mask_before, mask_after = mask_before > 0, mask_after > 0
        assert mask_before.any() == (change_type != "add"), key
        assert mask_after.any() == (change_type != "drop"), key
        # each mask lies inside the changed object's box in its own image (equal to it when fully visible)
        for frame, mask in (("before", mask_before), ("after", mask_after)):
            if not mask.any():
                continue
            objects = {o["id"]: o for o in record["images"][frame]["objects"]}
            changed = objects[record["change"]["object"]]
            rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
            box = [cols[0], rows[0], cols[-1] + 1, rows[-1] + 1]
            x0, y0, x1, y1 = changed["box"]
            assert x0 <= box[0] and y0 <= box[1] and box[2] <= x1 and box[3] <= y1, (key, frame)
            if changed["visible"] == 1.0:
                assert box == changed["box"], (key, frame)
        if record["distractors"]["semantic"] is not None:
            continue
        differs = (before != after).any(axis=2)
        union = mask_before | mask_after
        assert not differs[~union].any(), f"scene {key}: pixels outside the change masks differ"
        for mask in (mask_before, mask_after):
            if mask.any():
                assert differs[mask].mean() > 0.6, key
        checked += 1
    assert checked >= 12  # ~70% of the 30 semantic pairs carry no distractor


def test_distractor_pairs_have_empty_masks_and_a_real_distractor(generated):
    root, scenes = generated["root"], generated["scenes"]
    kinds = set()
    for key, record in scenes.items():
        assert not _load(root, f"gt_masks/before_n/{key}.png").any()
        assert not _load(root, f"gt_masks/after_n/{key}.png").any()
        before = _load(root, record["images"]["before"]["file"])
        nonsemantic = _load(root, record["images"]["nonsemantic"]["file"])
        assert (before != nonsemantic).any(axis=2).mean() > 0.05, key
        distractor = record["distractors"]["nonsemantic"]
        kinds.add(distractor["kind"])
        assert ("camera" in distractor) == (distractor["kind"] in ("viewpoint", "both"))
        assert ("illumination" in distractor) == (distractor["kind"] in ("illumination", "both"))
        # the same objects, attributes unchanged
        strip = [
            {k: o[k] for k in ("id", "shape", "color", "material", "size")}
            for o in record["images"]["before"]["objects"]
        ]
        assert strip == [
            {k: o[k] for k in ("id", "shape", "color", "material", "size")}
            for o in record["images"]["nonsemantic"]["objects"]
        ]
    assert kinds == {"illumination", "viewpoint", "both"}


def _attributes(words: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"size": [], "color": [], "material": [], "shape": []}
    for word in words:
        if word in WORDS:
            attribute, value = WORDS[word]
            found[attribute].append(value)
    return found


def test_captions_name_the_true_attributes_of_the_changed_object(generated):
    root, scenes = generated["root"], generated["scenes"]
    change_captions = json.loads((root / "change_captions.json").read_text())
    no_change = json.loads((root / "no_change_captions.json").read_text())
    assert sorted(change_captions) == sorted(no_change) == [f"CLEVR_default_{i:06d}.png" for i in range(SCENES)]
    for key, record in scenes.items():
        change = record["change"]
        frame = "after" if change["type"] == "add" else "before"
        subject = {o["id"]: o for o in record["images"][frame]["objects"]}[change["object"]]
        captions = change_captions[f"CLEVR_default_{key}.png"]
        assert 3 <= len(captions) <= 5 and len(set(captions)) == len(captions)
        assert captions == record["captions"]
        for caption in captions:
            found = _attributes(caption.split())
            assert found["size"] == [subject["size"]] and found["shape"] == [subject["shape"]], caption
            if change["type"] == "color":
                assert found["color"] == [subject["color"], change["new"]] and change["new"] != subject["color"], (
                    caption
                )
                assert found["material"] == [subject["material"]]
            elif change["type"] == "material":
                assert found["material"] == [subject["material"], change["new"]], caption
                assert change["new"] != subject["material"] and found["color"] == [subject["color"]]
            else:
                assert found["color"] == [subject["color"]] and found["material"] == [subject["material"]], caption
        references = no_change[f"CLEVR_default_{key}.png"]
        assert 3 <= len(references) <= 5 and set(references) <= set(NO_CHANGE_CAPTIONS)


def test_scene_records_describe_each_image(generated):
    for key, record in generated["scenes"].items():
        counts = {frame: len(record["images"][frame]["objects"]) for frame in ("before", "after", "nonsemantic")}
        assert all(3 <= n <= 7 for n in counts.values()), key
        expected_after = counts["before"] + {"add": 1, "drop": -1}.get(record["change"]["type"], 0)
        assert counts["after"] == expected_after
        for image in record["images"].values():
            objects = image["objects"]
            assert all(o["visible"] >= 0.6 for o in objects)
            assert sorted(o["depth_order"] for o in objects) == list(range(len(objects)))
            assert all(
                o["shape"] in SHAPES and o["color"] in COLORS and o["material"] in MATERIALS and o["size"] in SIZES
                for o in objects
            )
            assert all(0 <= o["box"][0] < o["box"][2] <= 160 and 0 <= o["box"][1] < o["box"][3] <= 120 for o in objects)
            left_to_right = sorted(objects, key=lambda o: (o["box"][0] + o["box"][2]) / 2)
            phrases = image["description"].split(" , ")
            assert phrases == [f"{o['size']} {o['color']} {o['material']} {o['shape']}" for o in left_to_right]
        if record["change"]["type"] == "move":
            before = {o["id"]: o for o in record["images"]["before"]["objects"]}[record["change"]["object"]]
            assert record["change"]["from"] == before["position"]
            assert np.hypot(*np.subtract(record["change"]["to"], record["change"]["from"])) >= 1.5


def test_the_clevr_change_reader_serves_the_set(generated):
    root = generated["root"]
    index = read_dataset("clevr_change", root, "train")
    assert len(index) == 2 * 24 and not index.skipped
    semantic = [p for p in index if not p.pair_id.endswith("_n")]
    assert {p.change_type for p in semantic} <= set(CHANGE_TYPES)
    for pair in index:
        assert pair.before.is_file() and pair.after.is_file() and pair.has_gt_mask
        assert pair.gt_mask_before.is_file() and pair.gt_mask_after.is_file()
        assert 3 <= len(pair.captions) <= 5


def test_rerun_reuses_a_complete_folder_and_refuses_another_config(generated):
    summary = generate_dataset(generated["root"], CONFIG, workers=1)
    assert summary["reused_existing"] is True and summary["scenes"] == SCENES
    with pytest.raises(DataError, match="another config"):
        generate_dataset(generated["root"], SynthConfig(**{**asdict(CONFIG), "seed": 8}), workers=1)


def test_bad_config_and_missing_scenes_file_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="scenes must be at least 1"):
        SynthConfig(scenes=0)
    with pytest.raises(DataError, match="semantic_distractor_rate"):
        SynthConfig(semantic_distractor_rate=1.5)
    with pytest.raises(DataError, match="missing"):
        load_scenes(tmp_path)


def test_draw_grid_shows_before_after_and_the_mask_in_red(generated, tmp_path):
    root = generated["root"]
    tile = 48
    drawn = draw_grid("clevr_change", root, "test", tmp_path / "grid.png", num=2, tile=tile)
    assert (drawn.path, drawn.drawn, drawn.failed, drawn.status) == (tmp_path / "grid.png", 2, (), 0)
    grid = np.asarray(Image.open(drawn.path).convert("RGB")).astype(int)
    assert grid.shape[1] == 3 * tile + 4 * 4
    first = read_dataset("clevr_change", root, "test").pairs[0]  # the semantic pair of the first test scene
    overlay = grid[4 : 4 + tile, 4 + 2 * (tile + 4) : 4 + 2 * (tile + 4) + tile]
    after = np.asarray(Image.open(first.after).resize((tile, tile), Image.BICUBIC)).astype(int)
    has_mask = bool(np.asarray(Image.open(first.gt_mask_after)).any())
    # the overlay tile is the after thumbnail, reddened exactly where the (resized) mask is
    reddened = (overlay != after).any(axis=2)
    assert reddened.any() == has_mask
    assert (overlay[reddened][:, 0] >= after[reddened][:, 0]).all()


def test_show_draws_the_other_pairs_when_one_cannot_be_read_and_names_it(generated, tmp_path, capsys):
    """One pair whose image was broken or missing stopped the whole grid (exit 2, nothing drawn). Now the others are
    drawn, that pair's row is crossed out, and it is named with its reason on stderr: exit 1, as caption.py treats
    a bad pair. A split none of whose pairs can be drawn stops (exit 2) and writes nothing."""
    import shutil

    from davir.cli.data import main

    root = tmp_path / "synth"
    shutil.copytree(generated["root"], root)
    pairs = read_dataset("clevr_change", root, "test").pairs[:4]
    clean = tmp_path / "clean.png"
    assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", str(clean), "--num", "4"]) == 0
    capsys.readouterr()
    pairs[1].after.write_bytes(b"not a picture")  # corrupt
    pairs[3].gt_mask_after.unlink()  # missing
    out = tmp_path / "grid.png"
    assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", str(out), "--num", "4"]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{out}\n"
    assert captured.err.splitlines() == [
        f"not drawn: record {pairs[1].pair_id!r}: image file is corrupt or not an image: {pairs[1].after} "
        f"(cannot identify image file {str(pairs[1].after)!r})",
        f"not drawn: record {pairs[3].pair_id!r}: mask file is missing: {pairs[3].gt_mask_after}",
        f"error: 2 of 4 pair(s) could not be drawn (crossed out in {out}; listed above)",
    ]
    want, got = (np.asarray(Image.open(path).convert("RGB")).astype(int) for path in (clean, out))
    assert want.shape == got.shape
    row = (want != got).any(axis=(1, 2))  # the picture rows that differ from the clean grid's
    tile, row_height = 160, (want.shape[0] - 4) // 4  # the four labels are one line each here
    assert row_height == 160 + 4 + 12 + 4
    changed = {y // row_height for y in np.flatnonzero(row)}
    assert changed == {1, 3}
    crossed = got[4 + row_height + tile // 2 - 20, 4 + tile // 2 - 20]  # on the first tile's diagonal
    assert tuple(crossed) == (255, 0, 0)

    for pair in pairs:  # none left to draw
        pair.before.unlink(missing_ok=True)
    argv = ["show", "--format", "clevr_change", "--root", str(root), "--out", str(tmp_path / "none.png"), "--num", "4"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: {root}: none of the 4 pair(s) of split 'test' could be drawn, nothing written; the first: "
        f"record {pairs[0].pair_id!r}: image file is missing: {pairs[0].before}\n"
    )
    assert not (tmp_path / "none.png").exists() and not list(tmp_path.glob(".none.png*"))


def test_show_writes_the_format_its_out_suffix_names_and_refuses_others_before_reading(
    generated, tmp_path, capsys, monkeypatch
):
    """`show --out grid.jpg` (or .webp) wrote PNG bytes under that name. It writes the format the suffix names now
    (.png, .jpg/.jpeg, .webp; marked, so that a rerun inside --root replaces its own grid), and another suffix or
    none is refused before the dataset is read (exit 2); so is a grid larger than the format holds."""
    import shutil

    from davir.cli.data import main
    from davir.data import show

    root = tmp_path / "synth"
    shutil.copytree(generated["root"], root)
    pictures = {}
    for name, image_format in [("g.png", "PNG"), ("g.jpg", "JPEG"), ("G.JPEG", "JPEG"), ("g.webp", "WEBP")]:
        for _ in range(2):  # inside --root, then again over its own grid
            assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", str(root / name)]) == 0
        with Image.open(root / name) as image:
            assert image.format == image_format
            pictures[name] = np.asarray(image.convert("RGB")).astype(int)
    capsys.readouterr()
    for name in ("g.jpg", "G.JPEG", "g.webp"):  # the same grid, up to the lossy coding
        assert pictures[name].shape == pictures["g.png"].shape
        assert np.abs(pictures[name] - pictures["g.png"]).mean() < 4

    monkeypatch.setattr(show, "read_dataset", lambda *args: pytest.fail("the dataset was read"))
    for name, what in [("g.gif", "a .gif file"), ("grid", "a file without a suffix")]:
        out = tmp_path / name
        assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"error: --out {out}: show cannot write {what}; give a .png, .jpg/.jpeg or .webp path "
            f"(e.g. {out.with_suffix('.png')})\n"
        )
        assert not out.exists()
    monkeypatch.undo()
    monkeypatch.setattr(show, "pair_row", lambda *args: pytest.fail("an image was read"))
    with pytest.raises(DataError, match=r"is 16,516 x [0-9,]+ px, more than WEBP holds \(16,383 px a side\)"):
        draw_grid("clevr_change", root, "test", tmp_path / "big.webp", num=1, tile=5500)
    assert not (tmp_path / "big.webp").exists()


def test_show_never_writes_its_grid_over_a_file_of_the_dataset(generated, tmp_path, capsys):
    """`davir.data show --out` on one of the dataset's images (of any split) or its annotation file wrote the grid
    over it, exit 0: exit 2 now, the file named, nothing written; a new grid inside --root, and the rerun over
    it, are fine. --num above one picture's rows (100000: every thumbnail held at once) is refused too."""
    import shutil

    from davir.cli.data import main

    root = tmp_path / "synth é"
    shutil.copytree(generated["root"], root)
    test_pair = read_dataset("clevr_change", root, "test").pairs[0]
    train_pair = read_dataset("clevr_change", root, "train").pairs[0]
    of_the_dataset = f"is a file of the dataset at --root {root} (not an earlier `davir.data show` output)"
    (root / "notes.png").write_bytes(train_pair.before.read_bytes())  # a file of the user's in the dataset's folder
    replaced = "which it would replace; give another --out"
    refusals = {  # what follows "error: --out OUT"
        test_pair.after: f" is the after image of record {test_pair.pair_id!r}, {replaced}",  # a pair being drawn
        train_pair.before: f" {of_the_dataset}, {replaced}",  # an image of another split
        root / "notes.png": f" {of_the_dataset}, {replaced}",
        # an annotation file is refused sooner, by its suffix (show writes pictures), before the dataset is read
        root / "splits.json": ": show cannot write a .json file; give a .png, .jpg/.jpeg or .webp path "
        f"(e.g. {root / 'splits.png'})",
    }
    kept = {path: path.read_bytes() for path in refusals}
    for out, message in refusals.items():
        assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"error: --out {out}{message}\n"
    assert {path: path.read_bytes() for path in kept} == kept
    for _ in range(2):
        assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", str(root / "grid.png")]) == 0
    assert Image.open(root / "grid.png").size[0] == 3 * 160 + 4 * 4
    capsys.readouterr()
    assert main(["show", "--format", "clevr_change", "--root", str(root), "--out", "g.png", "--num", "100000"]) == 2
    assert capsys.readouterr().err == "error: show: --num must be 1 to 500 (the rows of one picture), got 100000\n"
