"""Your own labelled pairs: the folder format both ways, `davir.data import` / `verify` / `stats` / `pairs` as a user
runs them (exit code + the first line naming the file and row), and the symlink guard of dataset annotation files."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from davir.data.formats import read_dataset
from davir.data.formats.folder import SplitOptions, read_folder
from davir.errors import DataError

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"


def run(*args, cwd=REPO):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def solid(path: Path, value: int, size=(16, 12)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, value, value)).save(path)
    return path


# --- the folder format with captions, splits and masks ------------------------------------------------------------


def test_manifest_with_captions_splits_and_masks(tmp_path):
    for name, value in (("a0", 1), ("a1", 2), ("b0", 3), ("b1", 4), ("c0", 5), ("c1", 6)):
        solid(tmp_path / "img" / f"{name}.png", value)
    Image.new("L", (16, 12), 255).save(tmp_path / "img" / "m.png")
    (tmp_path / "pairs.csv").write_text(
        "id,before,after,caption,split,mask\n"
        "p1,img/a0.png,img/a1.png,the cup is gone,train,img/m.png\n"
        'p1,img/a0.png,img/a1.png,"the cup, on the left, was removed",train,img/m.png\n'
        "p2,img/b0.png,img/b1.png,a chair appeared,Valid,\n"
        "p3,img/c0.png,img/c1.png,,test,\n"
    )
    train = read_folder(tmp_path, "train")
    assert [(p.pair_id, p.captions, p.split) for p in train] == [
        ("p1", ("the cup is gone", "the cup, on the left, was removed"), "train")
    ]
    assert train.pairs[0].gt_mask_after == train.pairs[0].gt_mask_before == tmp_path / "img" / "m.png"
    assert [p.pair_id for p in read_dataset("folder", tmp_path, "val")] == ["p2"]
    test = read_folder(tmp_path, "test")
    assert [(p.pair_id, p.captions) for p in test] == [("p3", ())]  # captionable, not trainable
    assert [p.pair_id for p in read_folder(tmp_path)] == ["p1", "p2", "p3"]  # "all": what caption.py reads

    # The same pair without a caption but put in train: never trained on, a counted skip.
    (tmp_path / "pairs.csv").write_text("id,before,after,caption,split\np3,img/c0.png,img/c1.png,,train\n")
    index = read_folder(tmp_path, "train")
    assert index.pairs == [] and index.skipped[0].record == "line 2 (id 'p3')"
    assert index.skipped[0].reason.startswith("no reference caption: captionable, never trainable")


def test_seeded_split_keeps_pairs_that_share_an_image_together(tmp_path):
    rows = ["id,before,after,captions"]
    for scene in range(60):
        solid(tmp_path / f"s{scene}_0.png", scene)
        solid(tmp_path / f"s{scene}_1.png", scene + 1)
        solid(tmp_path / f"s{scene}_2.png", scene + 2)
        rows.append(f's{scene},s{scene}_0.png,s{scene}_1.png,"[""a change""]"')
        rows.append(f's{scene}_n,s{scene}_0.png,s{scene}_2.png,"[""no change"", ""nothing""]"')  # shares the before
    rows.append("lonely,s0_1.png,s0_2.png,")  # no caption: always test
    manifest = tmp_path / "mine.csv"
    manifest.write_text("\n".join(rows) + "\n")
    options = SplitOptions(seed=3, val_fraction=0.2, test_fraction=0.2)
    split_of = {p.pair_id: p.split for p in read_folder(manifest, "all", options=options)}
    assert split_of["lonely"] == "test"
    assert all(split_of[f"s{i}"] == split_of[f"s{i}_n"] for i in range(60))  # no image in two splits
    counts = {s: sum(1 for i in range(60) if split_of[f"s{i}"] == s) for s in ("train", "val", "test")}
    assert counts["train"] > counts["val"] > 0 and counts["test"] > 0 and sum(counts.values()) == 60
    assert split_of == {p.pair_id: p.split for p in read_folder(manifest, "all", options=options)}  # deterministic
    other = {
        p.pair_id: p.split
        for p in read_folder(manifest, "all", options=SplitOptions(seed=4, val_fraction=0.2, test_fraction=0.2))
    }
    assert other != split_of
    assert read_folder(manifest, "train", options=options).pairs[0].captions in (
        ("a change",),
        ("no change", "nothing"),
    )


def test_folders_with_captions_json_and_masks(tmp_path):
    for name in ("k", "s"):
        solid(tmp_path / "before" / f"{name}.png", 1)
        solid(tmp_path / "after" / f"{name}.jpg", 2)
    (tmp_path / "masks").mkdir()
    Image.new("L", (16, 12), 0).save(tmp_path / "masks" / "k.png")
    (tmp_path / "captions.json").write_text(json.dumps({"k.png": ["a cup appeared", "cup added"], "nobody": ["x"]}))
    index = read_folder(tmp_path, "all")
    by_id = index.by_id()
    assert by_id["k"].captions == ("a cup appeared", "cup added") and by_id["s"].captions == ()
    assert by_id["k"].gt_mask_after == tmp_path / "masks" / "k.png" and by_id["s"].gt_mask_after is None
    assert by_id["s"].split == "test"
    assert "1 key(s) name no pair" in index.notes[0]


def test_extra_values_and_unknown_columns(tmp_path):
    solid(tmp_path / "a.png", 1)
    solid(tmp_path / "b.png", 2)
    (tmp_path / "pairs.csv").write_text("before,after,caption,notes\na.png,b.png,a cup, on the left,gone\n")
    result = run("-m", "davir.data", "stats", "--format", "folder", "--root", str(tmp_path), "--split", "all")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith(
        f"error: folder split 'all' cannot be read: {tmp_path / 'pairs.csv'}: "
        "line 2: 5 values but the header names 4 columns"
    )
    (tmp_path / "pairs.csv").write_text('before,after,caption,notes\na.png,b.png,"a cup, on the left",checked by Ann\n')
    result = run("-m", "davir.data", "stats", "--format", "folder", "--root", str(tmp_path))
    assert result.returncode == 0
    notes = json.loads(result.stdout)["splits"]["train"]["notes"]
    assert notes[0].startswith(f"{tmp_path / 'pairs.csv'}: column(s) 'notes' are not davir columns")
    assert read_folder(tmp_path).pairs[0].meta == {"notes": "checked by Ann"}


def test_an_unclosed_quote_is_an_error_naming_its_line_not_the_rest_of_the_file_in_one_caption(tmp_path):
    for name, value in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        solid(tmp_path / f"{name}.png", value)
    manifest = tmp_path / "pairs.csv"
    manifest.write_text('id,before,after,caption\nx,a.png,b.png,"a cup moved\ny,c.png,d.png,a chair left\n')
    result = run("-m", "davir.data", "import", str(manifest), "--out", str(tmp_path / "imported"))
    assert result.returncode == 2 and not (tmp_path / "imported").exists()
    assert result.stderr.splitlines() == [
        f"error: {manifest}: line 2: a quoted value is not closed before the end of the file; "
        'close it with a " (a quote inside a quoted value is written twice: "the 5"" screen")'
    ]
    manifest.write_text('id,before,after,caption\nx,a.png,b.png,"the 5" screen"\ny,c.png,d.png,a chair left\n')
    with pytest.raises(DataError, match=r"pairs\.csv: line 2: a quoted value goes on after its closing quote"):
        read_folder(manifest)
    manifest.write_text('id,before,after,caption\nx,a.png,b.png,"the 5"" screen, left"\ny,c.png,d.png,the 5" tv\n')
    assert [p.captions for p in read_folder(manifest, "all")] == [('the 5" screen, left',), ('the 5" tv',)]


def test_a_manifest_saved_with_a_byte_order_mark_reads_as_csv_and_jsonl(tmp_path):
    """Windows editors and Excel start UTF-8 text with a BOM: it is no part of the first row, in either manifest."""
    solid(tmp_path / "a.png", 1)
    solid(tmp_path / "b.png", 2)
    (tmp_path / "pairs.csv").write_bytes(b"\xef\xbb\xbfid,before,after,caption\r\nx,a.png,b.png,a cup\r\n")
    (tmp_path / "pairs.jsonl").write_bytes(
        b'\xef\xbb\xbf{"id": "x", "before": "a.png", "after": "b.png", "caption": "a cup"}\r\n'
    )
    for name in ("pairs.csv", "pairs.jsonl"):
        (pair,) = read_folder(tmp_path / name, "all").pairs
        assert (pair.pair_id, pair.before, pair.captions) == ("x", tmp_path / "a.png", ("a cup",))


def test_header_only_or_empty_manifest_is_an_error(tmp_path):
    (tmp_path / "pairs.csv").write_text("before,after,id\n")
    result = run("caption.py", "--checkpoint", str(tmp_path / "no_run"), "--pairs", str(tmp_path / "pairs.csv"))
    assert result.returncode == 2 and not (tmp_path / "captions.jsonl").exists()
    assert result.stderr.splitlines()[0] == (
        f"error: {tmp_path / 'pairs.csv'}: the manifest lists no pairs (a header and no rows); add one row per pair"
    )
    (tmp_path / "pairs.csv").unlink()
    (tmp_path / "pairs.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"pairs\.jsonl: the manifest lists no pairs"):
        read_folder(tmp_path)


# --- manifests anywhere on disk (issue 20) -----------------------------------------------------------------------


def test_pairs_output_and_absolute_paths_are_accepted_anywhere(tmp_path):
    from davir.data.synthetic import SynthConfig, generate_dataset

    root = tmp_path / "data"
    generate_dataset(root, SynthConfig(scenes=10, seed=0, width=64, height=48), workers=1)
    out = tmp_path / "elsewhere" / "deeper" / "p.csv"  # the images are "../../data/…" from here
    result = run(
        "-m",
        "davir.data",
        "pairs",
        "--format",
        "clevr_change",
        "--root",
        str(root),
        "--split",
        "train",
        "--num",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text().splitlines()[1].split(",")[1].startswith("../../data/images/")
    pairs = read_folder(out).pairs
    original = read_dataset("clevr_change", root, "train").pairs[:2]
    assert [(p.pair_id, p.after.resolve(), p.captions) for p in pairs] == [
        (p.pair_id, p.after.resolve(), p.captions) for p in original
    ]
    absolute = tmp_path / "abs.csv"
    absolute.write_text(f"before,after\n{original[0].before.resolve()},{original[0].after.resolve()}\n")
    assert read_folder(absolute).pairs[0].after == original[0].after.resolve()


# --- dataset annotation files stay inside their root (issue 18.8) ------------------------------------------------


def test_pairs_out_on_the_folder_manifest_it_reads_is_refused(tmp_path):
    """`pairs --format folder --root my_pairs --num 2 --out my_pairs/pairs.csv` would cut the user's list to two
    pairs: the manifest being read is never --out."""
    for name, value in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        solid(tmp_path / f"{name}.png", value)
    manifest = tmp_path / "pairs.csv"
    text = "id,before,after,caption,split\nx,a.png,b.png,a cup,test\ny,c.png,d.png,a chair,test\n"
    manifest.write_text(text)
    for root in (tmp_path, manifest):
        args = ("--format", "folder", "--root", str(root), "--num", "1", "--out", str(manifest))
        result = run("-m", "davir.data", "pairs", *args)
        assert result.returncode == 2 and manifest.read_text() == text
        assert result.stderr.splitlines() == [
            f"error: --out {manifest} is the manifest of --root {root}, which it would replace; give another --out"
        ]


def test_symlink_out_of_a_dataset_root_is_refused(tmp_path):
    secret = tmp_path / "outside" / "secret.jpg"
    solid(secret, 9)
    root = tmp_path / "ier"
    (root / "images").mkdir(parents=True)
    solid(root / "images" / "a.jpg", 1)
    (root / "images" / "b.jpg").symlink_to(secret)
    (root / "train.json").write_text(json.dumps([{"img0": "a.jpg", "img1": "b.jpg", "sents": ["x"], "uid": "u1"}]))
    result = run("-m", "davir.data", "stats", "--format", "ier", "--root", str(root), "--split", "train")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith(
        f"error: ier split 'train' cannot be read: {root / 'train.json'}: record 'u1': image path 'b.jpg' is a symlink "
        f"that leads out of the dataset folder {root / 'images'}"
    )
    # The image folder itself on another disk (a symlinked images/) is the normal case and accepted.
    (root / "images" / "b.jpg").unlink()
    solid(tmp_path / "disk" / "a.jpg", 1)
    solid(tmp_path / "disk" / "b.jpg", 2)
    shutil.rmtree(root / "images")
    (root / "images").symlink_to(tmp_path / "disk")
    assert [p.after.name for p in read_dataset("ier", root, "train")] == ["b.jpg"]


def test_symlink_out_of_a_benchmark_image_folder_is_refused_for_every_reader(tmp_path):
    """Readers that join plain file names to fixed folders (Spot-the-Diff here; LEVIR-CC, CLEVR-Change and CLEVR-DC
    alike, through read_dataset): a planted link is found by one walk of the tree."""
    secret = solid(tmp_path / "outside" / "secret.png", 9)
    root = tmp_path / "spot"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "train.json").write_text(
        json.dumps([{"img_id": "1", "sentences": ["a car left"]}, {"img_id": "2", "sentences": ["a man came"]}])
    )
    for name in ("1.png", "1_2.png", "2.png"):
        solid(root / "resized_images" / name, 1)
    (root / "resized_images" / "2_2.png").symlink_to(secret)
    with pytest.raises(DataError) as error:
        read_dataset("spot_the_diff", root, "train")
    assert str(error.value) == (
        f"spot_the_diff split 'train' at {root}: pair '2': {root / 'resized_images' / '2_2.png'} "
        f"is a symlink that leads out of its dataset folder {root / 'resized_images'} (to {secret})"
    )
    # A link that stays inside its folder, and a symlinked image folder on another disk, are normal.
    (root / "resized_images" / "2_2.png").unlink()
    (root / "resized_images" / "2_2.png").symlink_to(root / "resized_images" / "1_2.png")
    disk = tmp_path / "disk"
    shutil.move(root / "resized_images", disk)
    (root / "resized_images").symlink_to(disk)
    assert [p.pair_id for p in read_dataset("spot_the_diff", root, "train")] == ["1", "2"]


# --- stats exit status (issue 18.21) -----------------------------------------------------------------------------


def test_stats_exits_non_zero_when_the_requested_split_is_unreadable(tmp_path):
    shutil.copy(SHARED / "ier" / "valid.json", tmp_path / "valid.json")
    result = run("-m", "davir.data", "stats", "--format", "ier", "--root", str(tmp_path), "--split", "test")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: ier split 'test' cannot be read: annotation file is missing: {tmp_path / 'test.json'}"
    ]
    result = run("-m", "davir.data", "stats", "--format", "ier", "--root", str(tmp_path))  # val readable: a note
    assert result.returncode == 0 and json.loads(result.stdout)["splits"]["val"]["pairs"] == 383


# --- import: every bad row in one pass ---------------------------------------------------------------------------


def test_import_flags_every_kind_of_bad_row_in_one_pass(tmp_path):
    images = tmp_path / "imgs"
    for name, value in (("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5), ("f", 6)):
        solid(images / f"{name}.png", value)
    solid(images / "big.png", 7, size=(32, 24))
    (images / "broken.png").write_bytes(b"\x89PNG not really")
    (images / "empty.png").write_bytes(b"")
    shutil.copy(images / "a.png", images / "a_copy.png")  # same bytes under another name
    manifest = tmp_path / "pairs.csv"
    manifest.write_text(
        "id,before,after,caption,split\n"
        "ok,imgs/a.png,imgs/b.png,a cup appeared,train\n"  # line 2
        "bad1,imgs/broken.png,imgs/b.png,x,train\n"  # line 3: undecodable
        "bad2,imgs/c.png,imgs/big.png,x,train\n"  # line 4: size mismatch
        "bad3,imgs/c.png,imgs/d.png,,train\n"  # line 5: empty caption
        "ok,imgs/c.png,imgs/b.png,another,train\n"  # line 6: same id, other before
        "bad4,imgs/a_copy.png,imgs/e.png,leaks,test\n"  # line 7: train image in test
        "bad5,imgs/missing.png,imgs/empty.png,x,train\n"  # line 8: missing + empty
        "bad6,imgs/f.png,imgs/d.png,x,holdout\n"
    )  # line 9: unknown split
    out = tmp_path / "imported"
    result = run("-m", "davir.data", "import", str(manifest), "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"error: 8 problem(s) in {manifest}; nothing imported")
    source = str(manifest)
    expected = [
        f"{source}: line 9: split 'holdout' is not one of train, val, test",
        f"{source}: line 6: repeats the id 'ok' of line 2 but with a different before image",
        f"{source}: line 3: before: not a readable image: {images / 'broken.png'}",
        f"{source}: line 4: before is 16x12 but after is 32x24",
        f"{source}: line 5: empty caption",
        f"{source}: line 8: before: file is missing: {images / 'missing.png'}",
        f"{source}: line 8: after: file is empty: {images / 'empty.png'}",
        f"{source}: line 7: leakage: an image of this test pair is also in train (line 2)",
    ]
    for line, start in zip(lines[1:], expected):
        assert line.startswith(start), (line, start)
    assert len(lines) == 1 + len(expected)
    assert not (out / "pairs.jsonl").exists()
    report = json.loads((out / "report.json").read_text())
    assert len(report["problems"]) == 8 and (out / "summary.html").read_text().count("<img") > 0


def test_import_writes_a_normalised_manifest_that_reads_back(tmp_path):
    for name, value in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        solid(tmp_path / "imgs" / f"{name}.png", value)
    (tmp_path / "pairs.jsonl").write_text(
        '{"id": "x", "before": "imgs/a.png", "after": "imgs/b.png", "captions": ["a cup appeared", "cup added"]}\n'
        '{"id": "y", "before": "imgs/c.png", "after": "imgs/d.png", "caption": "a chair left", "split": "test"}\n'
    )
    out = tmp_path / "imported"
    result = run(
        "-m", "davir.data", "import", str(tmp_path), "--out", str(out), "--test-fraction", "0", "--val-fraction", "0"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("imported 2 pair(s) (train 1, val 0, test 1; 0 without captions) with 3 caption(s)")
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert rows[0] == {
        "id": "x",
        "before": str(tmp_path / "imgs" / "a.png"),
        "after": str(tmp_path / "imgs" / "b.png"),
        "captions": ["a cup appeared", "cup added"],
        "split": "train",
    }
    assert [(p.pair_id, p.split, p.captions) for p in read_folder(out)] == [
        ("x", "train", ("a cup appeared", "cup added")),
        ("y", "test", ("a chair left",)),
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["captions"]["words_per_caption"] == {"min": 2, "median": 3, "mean": 2.67, "max": 3}
    assert report["captions"]["vocabulary"] == 6


def test_import_resolves_linked_folders_and_linked_files_in_the_manifest_it_writes(tmp_path):
    """pairs.jsonl names the real files: a symlinked folder and a symlinked file are both followed (the import
    resolves each folder once, then looks at each file), and extra JSONL keys stay in the order first seen."""
    solid(tmp_path / "store" / "a.png", 1)
    solid(tmp_path / "store" / "b.png", 2)
    solid(tmp_path / "store" / "c.png", 3)
    solid(tmp_path / "store" / "d.png", 4)
    (tmp_path / "linked").symlink_to(tmp_path / "store", target_is_directory=True)
    (tmp_path / "store" / "b-link.png").symlink_to(tmp_path / "store" / "b.png")
    (tmp_path / "pairs.jsonl").write_text(
        '{"id": "x", "before": "linked/a.png", "after": "linked/b-link.png", "caption": "a cup", "zone": 3, '
        '"camera": "c1"}\n{"id": "y", "before": "store/c.png", "after": "store/d.png", "caption": "a cup", '
        '"operator": "ann", "zone": 4}\n'
    )
    out = tmp_path / "imported"
    assert run("-m", "davir.data", "import", str(tmp_path), "--out", str(out)).returncode == 0
    first = json.loads((out / "pairs.jsonl").read_text().splitlines()[0])
    assert (first["before"], first["after"]) == (str(tmp_path / "store" / "a.png"), str(tmp_path / "store" / "b.png"))
    index = read_folder(tmp_path / "pairs.jsonl")
    assert [p.meta for p in index.pairs] == [{"zone": 3, "camera": "c1"}, {"operator": "ann", "zone": 4}]
    assert "'zone', 'camera', 'operator'" in index.notes[0]


def test_import_into_the_folder_of_its_own_pairs_jsonl_keeps_that_manifest(tmp_path):
    """--out holding the manifest being imported: the normalised pairs.jsonl would replace the user's (its extra
    columns and relative paths gone), and a failing import would delete it. Refused before anything is written."""
    for name, value in (("a", 1), ("b", 2)):
        solid(tmp_path / "imgs" / f"{name}.png", value)
    manifest = tmp_path / "pairs.jsonl"
    text = '{"id": "x", "before": "imgs/a.png", "after": "imgs/b.png", "caption": "a cup", "camera": "c1"}\n'
    for good in (text, text + '{"id": "y", "before": "imgs/missing.png", "after": "imgs/b.png", "caption": "z"}\n'):
        manifest.write_text(good)
        for source in (manifest, tmp_path):
            result = run("-m", "davir.data", "import", str(source), "--out", str(tmp_path))
            assert result.returncode == 2 and manifest.read_text() == good
            assert result.stderr.splitlines() == [
                f"error: --out {manifest} is the manifest being imported, which it would replace; give another "
                f"--out, e.g. {tmp_path / 'imported'}"
            ]
            assert sorted(path.name for path in tmp_path.iterdir()) == ["imgs", "pairs.jsonl"]


def test_import_replaces_only_the_files_of_an_earlier_import(tmp_path):
    """An --out holding a pairs.jsonl (or report.json, summary.html, toolkit_pairs.jsonl) that no import wrote, e.g.
    the user's own manifest in the folder they point --out at: the import replaced it, and a failing import deleted
    it. Refused (exit 2, the file named, nothing written); an import's own --out (its report.json says so, or has the
    keys an older import's report has) is imported into again, the normal way to import a fixed manifest."""
    for name, value in (("a", 1), ("b", 2)):
        solid(tmp_path / "imgs" / f"{name}.png", value)
    source = tmp_path / "src" / "pairs.csv"
    source.parent.mkdir()
    good = f"id,before,after,caption\nx,{tmp_path / 'imgs' / 'a.png'},{tmp_path / 'imgs' / 'b.png'},a cup\n"
    bad = good + f"y,{tmp_path / 'imgs' / 'missing.png'},{tmp_path / 'imgs' / 'b.png'},a chair\n"
    mine = tmp_path / "mine"
    mine.mkdir()
    hand_written = '{"id": "z", "before": "../imgs/a.png", "after": "../imgs/b.png", "caption": "my own"}\n'
    (mine / "pairs.jsonl").write_text(hand_written)
    (tmp_path / "link").symlink_to(mine)
    for text in (good, bad):  # a clean import replaced it, a failing one deleted it
        source.write_text(text)
        for out, cwd in ((mine, REPO), (Path("mine"), tmp_path), (tmp_path / "link", REPO)):
            result = run("-m", "davir.data", "import", str(source), "--out", str(out), cwd=cwd)
            assert result.returncode == 2 and result.stderr.splitlines() == [
                f"error: --out {out}: {out / 'pairs.jsonl'} would be replaced, and no davir import wrote it "
                f"({out / 'report.json'} is missing); give a new or empty --out, e.g. {out / 'imported'}, or move "
                "it away"
            ]
            assert sorted(p.name for p in mine.iterdir()) == ["pairs.jsonl"]
            assert (mine / "pairs.jsonl").read_text() == hand_written
    # a report.json of the user's own, beside their summary.html: both named, both kept
    (mine / "pairs.jsonl").unlink()
    (mine / "report.json").write_text('{"source": "my lab notebook"}\n')
    (mine / "summary.html").write_text("<p>mine</p>\n")
    result = run("-m", "davir.data", "import", str(source), "--out", str(mine))
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"error: --out {mine}: {mine / 'report.json'}, {mine / 'summary.html'} would be replaced, and no davir import "
        f"wrote them ({mine / 'report.json'} is not an import's report); give a new or empty --out, e.g. "
        f"{mine / 'imported'}, or move them away"
    ]
    assert (mine / "report.json").read_text() == '{"source": "my lab notebook"}\n'

    # an import's own --out: imported into again, fixed or broken, through any path to it
    out = tmp_path / "imported"
    source.write_text(good)
    assert run("-m", "davir.data", "import", str(source), "--out", str(out)).returncode == 0
    report = json.loads((out / "report.json").read_text())
    assert report["written_by"] == "davir import"
    result = run("-m", "davir.data", "import", str(source), "--out", "imported", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    source.write_text(bad)
    result = run("-m", "davir.data", "import", str(source), "--out", str(out))
    assert result.returncode == 2 and result.stderr.startswith(f"error: 1 problem(s) in {source}; nothing imported")
    assert not (out / "pairs.jsonl").exists()  # the import's own earlier manifest goes, never left beside a failure
    # a report of a version before "written_by", recognised by its keys
    source.write_text(good)
    del report["written_by"]
    (out / "report.json").write_text(json.dumps(report))
    assert run("-m", "davir.data", "import", str(source), "--out", str(out)).returncode == 0
    assert [p.pair_id for p in read_folder(out)] == ["x"]


def test_import_checks_its_out_folder_before_reading_a_pair(tmp_path, monkeypatch, capsys):
    from davir.cli.data import main as data_main
    from davir.data import importer

    solid(tmp_path / "a.png", 1)
    solid(tmp_path / "b.png", 2)
    (tmp_path / "pairs.csv").write_text("id,before,after,caption\nx,a.png,b.png,a cup\n")
    (tmp_path / "taken").write_text("a file of mine\n")
    monkeypatch.setattr(importer, "check_pairs", lambda *args, **kwargs: pytest.fail("the pairs were read"))
    for out in (tmp_path / "taken", tmp_path / "taken" / "imported"):
        assert data_main(["import", str(tmp_path / "pairs.csv"), "--out", str(out)]) == 2
        assert (
            capsys.readouterr().err
            == f"error: --out {out} cannot be used: {tmp_path / 'taken'} is a file, not a folder\n"
        )
    assert (tmp_path / "taken").read_text() == "a file of mine\n"


# --- verify: is my download complete? ----------------------------------------------------------------------------


def test_verify_lists_missing_and_broken_images_with_their_records(tmp_path):
    root = tmp_path / "clevr_change"
    shutil.copytree(SHARED / "clevr_change", root, ignore=shutil.ignore_patterns("predictions_example"))
    (root / "images" / "CLEVR_default_000001.png").write_bytes(b"")
    result = run(
        "-m",
        "davir.data",
        "verify",
        "--format",
        "clevr_change",
        "--root",
        str(root),
        "--split",
        "train",
        "--quick",
        "--out",
        str(tmp_path / "verify.json"),
    )
    assert result.returncode == 1
    assert result.stdout.splitlines()[0].startswith(
        "clevr_change train: 67,660 pairs of 67,660, 101,490 images of 101,490: INCOMPLETE"
    )
    problems = result.stderr.splitlines()
    assert problems[0].startswith("clevr_change train: record '001956.png': before image missing: ")
    recorded = json.loads((tmp_path / "verify.json").read_text())["splits"][0]["problems"]
    assert (
        f"record '000001.png': before image empty (0 bytes): {root / 'images' / 'CLEVR_default_000001.png'}" in recorded
    )
    assert problems[-1] == f"error: clevr_change at {root} is incomplete in train"


def _verify_folder(root: Path, *, outside: Path) -> Path:
    """A folder of two pairs whose manifest names one image outside the folder (`outside`)."""
    solid(root / "a.png", 10), solid(root / "b.png", 20), solid(outside, 30)
    (root / "pairs.csv").write_text(f"id,before,after,caption\np1,a.png,b.png,x\np2,a.png,{outside},y\n")
    return root


def test_verify_out_never_replaces_a_file_of_the_dataset(tmp_path, capsys):
    """`verify --out` on the dataset's annotation file or one of its images (a folder's manifest may name one
    anywhere) wrote the report over it, exit 1: exit 2 now, the file named, nothing written; a new file inside
    --root and a rerun over the earlier report are fine."""
    from davir.cli.data import main

    root = _verify_folder(tmp_path / "my pairs é", outside=tmp_path / "elsewhere" / "c.png")
    before = {p: p.read_bytes() for p in (root / "pairs.csv", root / "b.png", tmp_path / "elsewhere" / "c.png")}
    link = tmp_path / "link"
    link.symlink_to(root)
    for out, message in [
        (
            root / "pairs.csv",
            f"--out {root / 'pairs.csv'} is a file of the dataset at --root {root} (not an earlier "
            "`davir.data verify` output), which it would replace; give another --out",
        ),
        (link / "pairs.csv", f"--out {link / 'pairs.csv'} is a file of the dataset at --root {root}"),
        (root / "b.png", f"--out {root / 'b.png'} is the after image of record 'p1', which it would replace"),
        (
            tmp_path / "elsewhere" / "c.png",
            f"--out {tmp_path / 'elsewhere' / 'c.png'} is the after image of record 'p2'",
        ),
    ]:
        assert main(["verify", "--format", "folder", "--root", str(root), "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith(f"error: {message}")
    assert {p: p.read_bytes() for p in before} == before
    assert main(["verify", "--format", "folder", "--root", str(root), "--out", str(root)]) == 2
    assert (
        capsys.readouterr().err == f"error: --out {root} is a folder; give a file path (e.g. {root / 'verify.json'})\n"
    )

    for _ in range(2):  # a new report inside the dataset, then the rerun over it
        assert main(["verify", "--format", "folder", "--root", str(root), "--out", str(root / "verify.json")]) == 0
        assert sum(split["pairs"] for split in json.loads((root / "verify.json").read_text())["splits"]) == 2
    capsys.readouterr()


def test_verify_says_why_a_split_is_incomplete():
    """A split whose images all decode but that lacks pairs was "INCOMPLETE: 0 unusable image(s)"; the summary now
    names each shortfall."""
    from davir.data.verify import SplitCheck, format_checks

    checks = [
        SplitCheck("train", pairs=2_400, images=3_600, expected_pairs=67_660, expected_images=101_490),
        SplitCheck("val", pairs=3_976, images=5_964, expected_pairs=3_976, expected_images=5_964, problems=["x"]),
        SplitCheck("test", pairs=7_970, images=11_955, expected_pairs=7_970, expected_images=11_955),
    ]
    summary, _ = format_checks("clevr_change", checks)
    assert summary == [
        "clevr_change train: 2,400 pairs of 67,660, 3,600 images of 101,490: INCOMPLETE: 65,260 pairs short; "
        "97,890 images short",
        "clevr_change val: 3,976 pairs of 3,976, 5,964 images of 5,964: INCOMPLETE: 1 unusable image(s)",
        "clevr_change test: 7,970 pairs of 7,970, 11,955 images of 11,955: complete",
    ]


def test_verify_calls_a_split_of_no_pair_empty_not_complete(tmp_path, capsys, monkeypatch):
    """A split the reader found no pair in, of a format with no official count, was "0 pairs, 0 images: complete",
    exit 0: it is "EMPTY: no pairs" now, exit 1 as for any shortfall (a benchmark split of no pair says so too,
    not only "N pairs short"). A folder's split may be empty (its pairs without captions are all test; a few
    captioned pairs may leave val or test without one): it is named empty, and not a shortfall."""
    from davir.cli.data import main
    from davir.data.formats import FORMATS
    from davir.data.formats.registry import DatasetFormat
    from davir.data.records import ChangePair, DatasetIndex
    from davir.data.verify import SplitCheck, format_checks

    solid(tmp_path / "a.png", 1), solid(tmp_path / "b.png", 2)

    def read_toy(root, split):
        pairs = [ChangePair("p1", root / "a.png", root / "b.png", ("a cup",), split)] if split == "test" else []
        return DatasetIndex("toy_split", root, split, pairs)

    monkeypatch.setitem(FORMATS, "toy_split", DatasetFormat("toy_split", read_toy, ("train", "test")))
    report = tmp_path / "verify.json"
    assert main(["verify", "--format", "toy_split", "--root", str(tmp_path), "--out", str(report)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "toy_split train: 0 pairs, 0 images: EMPTY: no pairs",
        "toy_split test: 1 pairs, 2 images: complete",
    ]
    assert captured.err == f"error: toy_split at {tmp_path} is incomplete in train (empty)\n"
    train, test = json.loads(report.read_text())["splits"]
    assert (train["empty"], train["complete"], test["empty"], test["complete"]) == (True, False, False, True)
    assert main(["verify", "--format", "toy_split", "--root", str(tmp_path), "--split", "test"]) == 0
    capsys.readouterr()

    summary, _ = format_checks(
        "clevr_change", [SplitCheck("test", pairs=0, images=0, expected_pairs=7_970, expected_images=11_955)]
    )
    assert summary == ["clevr_change test: 0 pairs of 7,970, 0 images of 11,955: EMPTY: no pairs"]

    root = tmp_path / "mine"  # two captioned pairs: the seeded split leaves at least one split without a pair
    solid(root / "a.png", 1), solid(root / "b.png", 2), solid(root / "c.png", 3)
    (root / "pairs.csv").write_text("id,before,after,caption\np1,a.png,b.png,x\np2,a.png,c.png,y\n")
    assert main(["verify", "--format", "folder", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    empty = [line for line in lines if line.split(": ")[1] == "0 pairs, 0 images"]
    assert empty and all(
        line.endswith(": empty (a folder's pairs may all be in its other splits)") for line in empty
    ), lines
    assert all(line.endswith(": complete") for line in lines if line not in empty), lines


def test_verify_counts_the_pairs_the_reader_left_out(tmp_path, capsys):
    """A folder's file without its partner, and a train pair without a caption, are pairs the reader leaves out
    (counted skips). `verify` said "complete" beside them, and "empty (… may all be in its other splits)" for a
    train split whose every pair was left out: they are shortfalls now, each listed once, exit 1."""
    from davir.cli.data import main

    root = tmp_path / "loose"  # x has both pictures, y only its before picture
    solid(root / "before" / "x.png", 1), solid(root / "after" / "x.png", 2), solid(root / "before" / "y.png", 3)
    report = tmp_path / "verify.json"
    assert main(["verify", "--format", "folder", "--root", str(root), "--out", str(report)]) == 1
    captured = capsys.readouterr()
    reason = f"{root}: y.png: before image has no matching after image (expected name 'y')"
    assert captured.out.splitlines() == [
        "folder train: 0 pairs, 0 images: EMPTY: no pairs; 1 record(s) left out by the reader",
        "folder val: 0 pairs, 0 images: EMPTY: no pairs; 1 record(s) left out by the reader",
        "folder test: 1 pairs, 2 images: INCOMPLETE: 1 record(s) left out by the reader",
    ]
    assert captured.err.splitlines() == [
        f"folder train: left out: {reason}",
        f"error: folder at {root} is incomplete in train (empty), val (empty), test",
    ]
    assert [split["left_out"] for split in json.loads(report.read_text())["splits"]] == [[reason]] * 3

    root = tmp_path / "untrainable"  # the manifest puts a pair without a caption into train
    solid(root / "a.png", 1), solid(root / "b.png", 2)
    (root / "pairs.csv").write_text("id,before,after,caption,split\np1,a.png,b.png,,train\n")
    assert main(["verify", "--format", "folder", "--root", str(root), "--split", "train"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "folder train: 0 pairs, 0 images: EMPTY: no pairs; 1 record(s) left out by the reader\n"
    assert captured.err.splitlines()[0].startswith(f"folder train: left out: {root / 'pairs.csv'}: line 2 (id 'p1'): ")

    (root / "pairs.csv").write_text("id,before,after,caption,split\np1,a.png,b.png,a cup,train\n")
    assert main(["verify", "--format", "folder", "--root", str(root), "--split", "train"]) == 0
    assert capsys.readouterr().out == "folder train: 1 pairs, 2 images: complete\n"


@pytest.mark.parametrize("command", ["stats", "verify", "show"])
def test_the_dataset_commands_say_what_format_and_root_take(command, capsys):
    from davir.cli.data import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--format FORMAT the dataset's format: clevr_change, clevr_dc, spot_the_diff, ier, levir_cc or folder" in text
    )
    assert "--root ROOT the folder holding the dataset's annotation files" in text


# --- a user's own masks as FAC's target (data.fac_masks: ground_truth) -------------------------------------------


def _folder_with_masks(root: Path, *, drop_mask_of: str | None = None) -> Path:
    rows = ["id,before,after,caption,split,mask"]
    for i, split in enumerate(["train"] * 4 + ["val"] * 2):
        solid(root / "img" / f"b{i}.png", 40, size=(32, 24))
        after = Image.new("RGB", (32, 24), (40, 40, 40))
        after.paste((220, 30, 30), (0, 0, 16, 12))  # the change: the top-left quarter turned red
        after.save(root / "img" / f"a{i}.png")
        mask = Image.new("L", (32, 24), 0)
        mask.paste(255, (0, 0, 16, 12))
        mask.save(root / "img" / f"m{i}.png")
        given = "" if f"p{i}" == drop_mask_of else f"img/m{i}.png"
        rows.append(f"p{i},img/b{i}.png,img/a{i}.png,the top left turned red,{split},{given}")
    (root / "pairs.csv").write_text("\n".join(rows) + "\n")
    return root


def test_the_manifests_masks_become_the_fac_target(tmp_path, monkeypatch):
    import torch

    from davir.config import load_config
    from davir.data.dataset import MaskField, RecordMasks
    from davir.runs.config import TrainConfig
    from davir.training import loop

    root = _folder_with_masks(tmp_path / "pairs")
    pairs = read_folder(root, "train").pairs
    # The mask on a 4×4 grid: the top-left quarter of the image is exactly the top-left 2×2 cells.
    field = MaskField(RecordMasks(pairs), size=4, source="after_only")(pairs[0])
    want = torch.zeros(4, 4)
    want[:2, :2] = 1.0
    assert torch.equal(field["mask_after"], want) and torch.equal(field["mask_before"], want) and field["mask_valid"]

    overrides = [
        f"data.root={root}",
        "data.format=folder",
        "data.fac_masks=ground_truth",
        "data.masks=null",
        "data.entities=null",
        "model.epc.use_entities=false",
        "model.fac.lambda_attn=0.1",
        f"model.pretrained={REPO / 'assets' / 'tiny_instructblip'}",
        "optim.batch_size=2",
        "optim.max_steps=2",
        "run.log_every=1",
        "run.eval_every=0",
        "run.save_every=0",
        "run.val_max_pairs=2",
        "run.tensorboard=false",
    ]
    run_dir = tmp_path / "run"
    loop.train(load_config(TrainConfig, REPO / "configs" / "demo.yaml", [*overrides, f"run.output_dir={run_dir}"]))
    logged = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    attention = [row[key] for row in logged for key in row if key.startswith("train/") and "attn" in key]
    assert attention and all(value > 0 for value in attention)  # FAC trained against the user's masks

    # One train pair without a mask: refused before the model is built, naming the pair and the way out.
    bad = _folder_with_masks(tmp_path / "bad", drop_mask_of="p2")
    import davir.models.vlm.build as davir_models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the missing mask was found")

    monkeypatch.setattr(davir_models, "build_davir_model", no_model)
    with pytest.raises(DataError) as error:
        loop.train(
            load_config(
                TrainConfig,
                REPO / "configs" / "demo.yaml",
                [*overrides, f"data.root={bad}", f"run.output_dir={tmp_path / 'run2'}"],
            )
        )
    assert "data.fac_masks=ground_truth, but 1 of 4 train pairs" in str(error.value) and "'p2'" in str(error.value)
    assert "`mask` column" in str(error.value)
