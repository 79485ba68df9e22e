"""The format readers against the real annotation files in ../shared/datasets (official counts)."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest

from davir.cli.data import main as data_cli
from davir.data import FORMATS, load_mask, load_pair, read_dataset
from davir.data.formats import FORMATS as _FORMATS
from davir.data.formats.folder import read_folder
from davir.data.hf import from_hf_dataset, to_hf_dataset
from davir.data.images import save_png_atomic
from davir.data.stats import dataset_stats
from davir.errors import DataError

LEVIR_NO_CHANGE = {
    "there is no difference",
    "the two scenes seem identical",
    "the scene is the same as before",
    "no change has occurred",
    "almost nothing has changed",
}


def test_registry_has_every_format():
    assert set(FORMATS) == {"clevr_change", "clevr_dc", "spot_the_diff", "ier", "levir_cc", "folder"}
    assert _FORMATS["ier"].splits == ("train", "val", "test")
    with pytest.raises(DataError, match="unknown dataset format 'coco'"):
        read_dataset("coco", ".", "val")


# --- Spot-the-Diff -------------------------------------------------------------------------------


def test_spot_the_diff_val_merges_repeated_ids(shared_datasets):
    root = shared_datasets / "spot_the_diff"
    raw = json.loads((root / "annotations" / "val.json").read_text())
    assert len(raw) == 1634
    assert sum(len(record["sentences"]) for record in raw) == 3310

    index = read_dataset("spot_the_diff", root, "val")
    assert len(index) == 1493
    # The raw 3,310 sentences include 6 empty strings: 3,304 kept, 6 counted as skipped.
    assert sum(len(pair.captions) for pair in index) == 3304
    assert len(index.skipped) == 6
    assert all(skip.reason.startswith("empty") for skip in index.skipped)
    assert "record 43 (img_id '8069') sentences[0]" in index.skipped[0].record
    # Four ids whose every sentence is empty stay as pairs without references; FINER's filtered
    # val refs (1,489 ids) are exactly the other ids.
    no_refs = sorted(pair.pair_id for pair in index if not pair.captions)
    assert no_refs == ["13818", "13882", "14542", "8069"]
    finer = json.loads((root / "spot_val_change_captions_reformat.json").read_text())
    assert {image["id"] for image in finer["images"]} == {f"{pair.pair_id}.png" for pair in index if pair.captions}

    pair = index.by_id()["9264"]  # records 47, 1498 and 1633, captions in file order
    assert pair.captions == (
        "people closer",
        "person in the grass",
        "there are two people by the flag pole in the middle of the image",
        "there is only one person on the sidewalk by the building",
        "there is a person standing on the grass by the tree",
        "in the left picture there are people walking further back",
        "in the right picture people are walking more in the foreground",
    )
    assert pair.before == root / "resized_images" / "9264.png"
    assert pair.after == root / "resized_images" / "9264_2.png"
    assert index.pairs[0].pair_id == "5406" and pair.split == "val"


def test_spot_the_diff_train_matches_card_splits(shared_datasets):
    root = shared_datasets / "spot_the_diff"
    index = read_dataset("spot_the_diff", root, "train")
    assert len(index) == 8566
    assert sum(len(pair.captions) for pair in index) == 17623  # 17,676 raw sentences - 53 empty
    assert len(index.skipped) == 53
    card = json.loads((root / "card_splits.json").read_text())
    assert {int(pair.pair_id) for pair in index} == set(card["train"])


# --- IER -----------------------------------------------------------------------------------------


def test_ier_train_and_val(shared_datasets):
    root = shared_datasets / "ier"
    train = read_dataset("ier", root, "train")
    assert len(train) == 3061
    assert Counter(len(pair.captions) for pair in train) == {1: 3061}
    first = train.pairs[0]
    assert first.pair_id == "Zhopped_2"
    assert first.captions == ("change the back ground",)
    # Paths stay textual (no symlink resolution): ../shared may be a link.
    assert first.before == root / "images" / "Zhopped.com_gc9hq_gc9hq.jpg"
    assert first.after == root / "images" / "Zhopped.com_gc9hq_cxyv8.jpg"

    val = read_dataset("ier", root, "val")  # reads valid.json
    assert len(val) == 383 and Counter(len(pair.captions) for pair in val) == {3: 383}
    assert val.pairs[0].captions == ("make color brighter", "Increase the brightness of the image", "add the effect")
    refs = json.loads((root / "IER_val_change_captions_reformat.json").read_text())
    assert [image["id"] for image in refs["images"]] == [pair.pair_id for pair in val]

    with pytest.raises(DataError, match="test.json"):
        read_dataset("ier", root, "test")  # held out of the shared folder


def test_readers_keep_paths_textual_under_a_linked_root(shared_datasets, tmp_path):
    """A dataset behind a symbolic link (as ../shared may be mounted) gives paths under the link,
    so comparisons with `root / ...` hold whether the folder is a directory or a link."""
    link = tmp_path / "ier_link"
    link.symlink_to(shared_datasets / "ier", target_is_directory=True)
    first = read_dataset("ier", link, "train").pairs[0]
    assert first.before == link / "images" / "Zhopped.com_gc9hq_gc9hq.jpg"
    assert first.before != first.before.resolve()
    spot = tmp_path / "spot_link"
    spot.symlink_to(shared_datasets / "spot_the_diff", target_is_directory=True)
    assert read_dataset("spot_the_diff", spot, "val").pairs[0].before == spot / "resized_images" / "5406.png"


# --- LEVIR-CC / LEVIR-MCI ------------------------------------------------------------------------


def test_levir_mci_train_val(shared_datasets):
    root = shared_datasets / "levir_cc" / "LEVIR_MCI"
    counts = {}
    for split, pairs, no_change in (("train", 6815, 3408), ("val", 1333, 666)):
        index = read_dataset("levir_cc", root, split)
        assert len(index) == pairs
        assert Counter(len(pair.captions) for pair in index) == {5: pairs}
        assert sum(1 for pair in index if set(pair.captions) == LEVIR_NO_CHANGE) == no_change
        assert not index.skipped
        counts[split] = index
    pair = counts["train"].by_id()["train_000016"]
    assert pair.captions[0] == "several houses appear on the bareland at the bottom"
    assert pair.before == root / "images" / "train" / "A" / "train_000016.png"
    assert pair.after == root / "images" / "train" / "B" / "train_000016.png"
    assert pair.gt_mask_before is None


def test_levir_mci_example_pairs_load(shared_datasets, tmp_path):
    """The three real example pairs, laid out as LEVIR-MCI with a label mask, load at 256x256."""
    shared = shared_datasets / "levir_cc"
    names = ["train_000016", "train_000051", "train_000054"]
    (tmp_path / "train.txt").write_text("".join(f"{name}.png\n" for name in names))
    (tmp_path / "tokens").mkdir()
    for name in names:
        shutil.copy(shared / "LEVIR_MCI" / "tokens" / f"{name}.txt", tmp_path / "tokens")
    for side in ("A", "B"):
        (tmp_path / "images" / "train" / side).mkdir(parents=True)
        for name in names:
            shutil.copy(shared / "example_pairs" / side / f"{name}.png", tmp_path / "images" / "train" / side)
    mask = np.zeros((256, 256), dtype=bool)
    mask[10:20, 30:50] = True
    save_png_atomic(mask, tmp_path / "images" / "train" / "label" / "train_000016.png")

    index = read_dataset("levir_cc", tmp_path, "train")
    assert [pair.pair_id for pair in index] == names
    pair = index.pairs[0]
    before, after = load_pair(pair)
    assert before.size == after.size == (256, 256) and before.mode == "RGB"
    assert pair.gt_mask_before == pair.gt_mask_after
    assert load_mask(pair.gt_mask_before, record=pair.pair_id).sum() == 200
    stats = dataset_stats("levir_cc", tmp_path, ["train"])["splits"]["train"]
    assert stats["pairs"] == 3 and stats["reference_sentences"] == 15
    assert stats["pairs_with_missing_images"] == 0 and stats["pairs_with_gt_mask"] == 3


def test_levir_karpathy_json(tmp_path):
    captions = {
        "images": [
            {
                "filepath": "train",
                "filename": "train_000001.png",
                "split": "train",
                "changeflag": 1,
                "sentences": [
                    {"raw": " a road is built ", "tokens": ["a", "road", "is", "built"]},
                    {"tokens": ["houses", "appear"]},
                ],
            },
            {
                "filepath": "val",
                "filename": "val_000001.png",
                "split": "val",
                "changeflag": 0,
                "sentences": [{"raw": "there is no difference", "tokens": []}],
            },
        ]
    }
    (tmp_path / "LevirCCcaptions.json").write_text(json.dumps(captions))
    train = read_dataset("levir_cc", tmp_path, "train")
    assert [pair.pair_id for pair in train] == ["train_000001"]
    assert train.pairs[0].captions == ("a road is built", "houses appear")
    assert train.pairs[0].meta == {"changeflag": 1}
    assert train.pairs[0].after == tmp_path / "images" / "train" / "B" / "train_000001.png"
    val = read_dataset("levir_cc", tmp_path, "val")
    assert [pair.captions for pair in val] == [("there is no difference",)]


# --- CLEVR-Change --------------------------------------------------------------------------------

CLEVR_TYPE_COUNTS = {
    "train": {"color": 6764, "material": 6768, "add": 6771, "drop": 6766, "move": 6761, "distractor": 33830},
    "val": {"color": 397, "material": 398, "add": 398, "drop": 398, "move": 397, "distractor": 1988},
    "test": {"color": 797, "material": 797, "add": 797, "drop": 797, "move": 797, "distractor": 3985},
}


@pytest.fixture(scope="module")
def clevr_change(shared_datasets):
    """The three real CLEVR-Change splits, read once for this module (train alone is 67,660 pairs)."""
    return {
        split: read_dataset("clevr_change", shared_datasets / "clevr_change", split)
        for split in ("train", "val", "test")
    }


@pytest.mark.parametrize("split,scenes", [("train", 33830), ("val", 1988), ("test", 3985)])
def test_clevr_change_splits_and_types(clevr_change, split, scenes):
    index = clevr_change[split]
    assert len(index) == 2 * scenes
    assert len({pair.scene_id for pair in index}) == scenes
    assert Counter(pair.change_type for pair in index) == CLEVR_TYPE_COUNTS[split]
    # The caption files are absent from the shared folder: empty captions, reported as skips.
    assert all(pair.captions == () for pair in index)
    assert [skip.source.rsplit("/", 1)[-1] for skip in index.skipped] == [
        "change_captions.json",
        "no_change_captions.json",
    ]


def test_clevr_change_real_triples_resolve(shared_datasets, clevr_change):
    root = shared_datasets / "clevr_change"
    pairs = {**clevr_change["train"].by_id(), **clevr_change["val"].by_id()}
    for scene in (0, 1, 3, 4, 19, 35):
        semantic, distractor = pairs[f"{scene:06d}.png"], pairs[f"{scene:06d}.png_n"]
        assert semantic.before == root / "images" / f"CLEVR_default_{scene:06d}.png"
        assert semantic.after == root / "sc_images" / f"CLEVR_semantic_{scene:06d}.png"
        assert semantic.distractor == distractor.after == root / "nsc_images" / f"CLEVR_nonsemantic_{scene:06d}.png"
        assert semantic.change_type == "color" and distractor.change_type == "distractor"
        for path in (semantic.before, semantic.after, semantic.distractor):
            assert path.is_file(), path
    assert pairs["000019.png"].split == "val" and pairs["000000.png"].split == "train"
    before, after = load_pair(pairs["000035.png"])
    assert before.size == after.size == (480, 320) and before.mode == "RGB"  # RGBA PNGs on disk


def test_clevr_change_with_captions_and_masks(shared_datasets, tmp_path):
    """The synthetic set's layout: caption files and gt_masks/ next to the images."""
    shared = shared_datasets / "clevr_change"
    (tmp_path / "splits.json").write_text(json.dumps({"train": [0, 1], "val": [19], "test": []}))
    shutil.copy(shared / "type_mapping.json", tmp_path)
    (tmp_path / "change_captions.json").write_text(
        json.dumps(
            {
                "CLEVR_default_000000.png": ["the red cube became blue", "  "],
                "CLEVR_default_000019.png": ["the ball changed to green"],
            }
        )
    )
    (tmp_path / "no_change_captions.json").write_text(
        json.dumps(
            {
                "CLEVR_default_000000.png": ["no change has occurred"],
                "CLEVR_default_000001.png": ["the scene remains the same"],
                "CLEVR_default_000019.png": ["the two scenes seem identical"],
            }
        )
    )
    (tmp_path / "gt_masks").mkdir()
    index = read_dataset("clevr_change", tmp_path, "train")
    by_id = index.by_id()
    assert list(by_id) == ["000000.png", "000000.png_n", "000001.png", "000001.png_n"]
    assert by_id["000000.png"].captions == ("the red cube became blue",)
    assert by_id["000000.png_n"].captions == ("no change has occurred",)
    assert by_id["000001.png"].captions == ()  # missing key: kept, counted
    assert by_id["000000.png"].gt_mask_after == tmp_path / "gt_masks" / "after" / "000000.png"
    assert by_id["000000.png_n"].gt_mask_before == tmp_path / "gt_masks" / "before_n" / "000000.png"
    assert sorted(skip.reason.split(";")[0] for skip in index.skipped) == [
        "empty or whitespace-only reference sentence",
        "no captions for this scene",
    ]


# --- CLEVR-DC ------------------------------------------------------------------------------------


def test_clevr_dc_raw_splits(shared_datasets):
    root = shared_datasets / "clevr_dc"
    sizes = {}
    for split, (start, stop) in (("train", (0, 6800)), ("val", (6800, 7200)), ("test", (7200, 8000))):
        index = read_dataset("clevr_dc", root, split)
        sizes[split] = len(index)
        # 6 blocks of 8,000: each split takes the same slice of every block.
        expected = [f"{block * 8000 + offset:06d}.png" for block in range(6) for offset in range(start, stop)]
        assert sorted(pair.pair_id for pair in index) == expected
        assert all(pair.change_type is None for pair in index)
    assert sizes == {"train": 40800, "val": 2400, "test": 4800}
    pair = read_dataset("clevr_dc", root, "val").pairs[0]
    assert (pair.pair_id, pair.scene_id) == ("006800.png", "6800")
    assert pair.before == root / "bef" / "6800.png" and pair.after == root / "aft" / "6800.png"


def test_clevr_dc_captions_both_layouts(shared_datasets, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(shared_datasets / "clevr_dc" / "split.json", raw)
    (raw / "captions.json").write_text(json.dumps({"6800": ["the cube moved"], "6801": ["nothing changed", "same"]}))
    val = read_dataset("clevr_dc", raw, "val")
    assert val.by_id()["006801.png"].captions == ("nothing changed", "same")
    assert len(val.skipped) == 2398  # every other val pair has no captions in this tiny file

    dirl = tmp_path / "dirl"
    dirl.mkdir()
    (dirl / "splits.json").write_text(json.dumps({"train": [3], "val": [], "test": [12]}))
    (dirl / "change_captions.json").write_text(json.dumps({"000003.png": ["a ball was added"], "000012.png": ["x"]}))
    train = read_dataset("clevr_dc", dirl, "train")
    assert [(p.pair_id, p.before, p.after, p.captions) for p in train] == [
        ("000003.png", dirl / "images" / "000003.png", dirl / "sc_images" / "000003.png", ("a ball was added",))
    ]

    with pytest.raises(DataError, match="not a CLEVR-DC folder"):
        read_dataset("clevr_dc", tmp_path, "train")


# --- stats CLI and the datasets.Dataset view --------------------------------------------------------


def test_stats_cli_on_spot_the_diff(shared_datasets, capsys):
    root = shared_datasets / "spot_the_diff"
    # test.json is held out: a requested split that cannot be read fails the command (issue 18), JSON still printed
    assert (
        data_cli(["stats", "--format", "spot_the_diff", "--root", str(root), "--split", "val", "--split", "test"]) == 2
    )
    captured = capsys.readouterr()
    assert captured.err.startswith("error: spot_the_diff split 'test' cannot be read: annotation file is missing: ")
    result = json.loads(captured.out)
    val = result["splits"]["val"]
    assert (val["pairs"], val["reference_sentences"], val["pairs_without_captions"], val["skipped"]) == (
        1493,
        3304,
        4,
        6,
    )
    assert val["pairs_with_missing_images"] == 1493 and val["image_files_missing"] == 2986
    assert len(val["skipped_examples"]) == 5
    assert "test.json" in result["splits"]["test"]["error"]


def test_stats_clevr_change_counts_real_images(shared_datasets):
    val = dataset_stats("clevr_change", shared_datasets / "clevr_change", ["val"])["splits"]["val"]
    # Scenes 19 and 35 (4 pairs, 6 files) are on disk; the other 1,986 scenes are not.
    assert val["pairs"] == 3976 and val["pairs_with_missing_images"] == 3972
    assert val["image_files_checked"] == 3 * 1988 and val["image_files_missing"] == 3 * 1986
    assert val["change_types"]["distractor"] == 1988
    assert val["reference_sentences"] == 0 and val["skipped"] == 2


def test_hf_dataset_round_trip(shared_datasets, clevr_change):
    indexes = [read_dataset("ier", shared_datasets / "ier", "val"), clevr_change["val"]]
    dataset = to_hf_dataset(indexes)
    assert len(dataset) == 383 + 3976
    assert dataset.features["change_type"].dtype == "string"
    val_ier = dataset.filter(lambda row: row["split"] == "val" and row["change_type"] is None)
    assert len(val_ier) == 383
    assert from_hf_dataset(val_ier) == indexes[0].pairs
    assert from_hf_dataset(dataset.select(range(383, 385))) == indexes[1].pairs[:2]
    # A column that is None in every row still works (IER has no distractor, mask or type).
    only_ier = to_hf_dataset(indexes[0])
    assert only_ier["distractor"][:2] == [None, None] and only_ier["captions"][0] == list(indexes[0].pairs[0].captions)
    assert len(to_hf_dataset([])) == 0


def test_folder_reader_is_registered(tmp_path):
    (tmp_path / "x_before.png").write_bytes(b"")
    (tmp_path / "x_after.png").write_bytes(b"")
    assert [pair.pair_id for pair in read_dataset("folder", tmp_path, "all")] == ["x"]
    assert read_folder(tmp_path).pairs[0].split == "test"


def test_pairs_manifest_round_trips_through_the_folder_reader(tmp_path):
    """`python -m davir.data pairs` writes a manifest that caption.py's folder reader reads back."""
    from davir.cli.data import main as data_main
    from davir.data.formats.folder import read_folder
    from davir.data.synthetic import SynthConfig, generate_dataset

    root = tmp_path / "synth"
    generate_dataset(root, SynthConfig(scenes=10, seed=0, width=64, height=48), workers=1)
    out = root / "demo_pairs.csv"
    assert (
        data_main(
            [
                "pairs",
                "--format",
                "clevr_change",
                "--root",
                str(root),
                "--split",
                "train",
                "--num",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    pairs = read_folder(out).pairs
    original = read_dataset("clevr_change", root, "train").pairs[:3]
    assert [p.pair_id for p in pairs] == [p.pair_id for p in original]
    assert [p.after.resolve() for p in pairs] == [p.after.resolve() for p in original]
