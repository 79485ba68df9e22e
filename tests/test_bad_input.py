"""Bad input: every case is a DataError naming the file and record, or a counted skip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from davir.data import ChangePair, load_pair, load_rgb, read_dataset
from davir.data.formats.folder import read_folder
from davir.data.stats import dataset_stats
from davir.errors import DataError


def write_ier(root: Path, records: list, split_file: str = "valid.json") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    (root / split_file).write_text(json.dumps(records))
    return root


def solid(path: Path, color, size=(8, 6), mode="RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


# --- images ----------------------------------------------------------------------------------------


def test_missing_image_is_counted_by_stats_and_named_by_load_pair(tmp_path):
    root = write_ier(
        tmp_path / "ier",
        [
            {"img0": "a.jpg", "img1": "b.jpg", "sents": ["make it red"], "uid": "u1"},
            {"img0": "a.jpg", "img1": "gone.jpg", "sents": ["make it blue"], "uid": "u2"},
        ],
    )
    solid(root / "images" / "a.jpg", (255, 0, 0))
    solid(root / "images" / "b.jpg", (0, 0, 255))
    val = dataset_stats("ier", root, ["val"])["splits"]["val"]
    assert (val["pairs"], val["pairs_with_missing_images"], val["image_files_checked"], val["image_files_missing"]) == (
        2,
        1,
        3,
        1,
    )
    assert val["missing_image_examples"] == [f"u2: {root / 'images' / 'gone.jpg'}"]

    index = read_dataset("ier", root, "val")
    load_pair(index.pairs[0])
    with pytest.raises(DataError, match=r"record 'u2': image file is missing: .*gone\.jpg"):
        load_pair(index.pairs[1])


def test_corrupt_image_names_record_and_file(tmp_path):
    good = solid(tmp_path / "before" / "p.png", (1, 2, 3))
    bad = tmp_path / "after" / "p.png"
    bad.parent.mkdir()
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    with pytest.raises(DataError, match=r"record 'p': image file is corrupt or not an image: .*after/p\.png"):
        load_pair(ChangePair("p", good, bad))


def test_unusual_modes_load_as_rgb_with_right_values(tmp_path):
    # 16-bit grayscale: 65535 -> 255, 32768 -> 128 (32768/65535*255 = 127.5 rounds up).
    sixteen = np.array([[0, 32768, 65535]], dtype=np.uint16)
    Image.fromarray(sixteen).save(tmp_path / "g16.png")  # uint16 -> a 16-bit PNG
    assert np.asarray(load_rgb(tmp_path / "g16.png")).tolist() == [[[0, 0, 0], [128, 128, 128], [255, 255, 255]]]

    palette = Image.new("P", (2, 1))
    palette.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    palette.putpixel((1, 0), 1)
    palette.save(tmp_path / "p.png")
    assert np.asarray(load_rgb(tmp_path / "p.png")).tolist() == [[[10, 20, 30], [200, 100, 50]]]

    # RGBA is composited on white: opaque keeps the colour, transparent becomes white.
    rgba = np.array([[[200, 100, 50, 255], [200, 100, 50, 0]]], dtype=np.uint8)
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "rgba.png")
    assert np.asarray(load_rgb(tmp_path / "rgba.png")).tolist() == [[[200, 100, 50], [255, 255, 255]]]

    solid(tmp_path / "l.png", 77, size=(1, 1), mode="L")
    image = load_rgb(tmp_path / "l.png")
    assert image.mode == "RGB" and image.getpixel((0, 0)) == (77, 77, 77)


def test_size_mismatch_resizes_before_to_after(tmp_path):
    pair = ChangePair(
        "ier_1",
        solid(tmp_path / "a.png", (10, 200, 30), size=(40, 30)),
        solid(tmp_path / "b.png", (0, 0, 0), size=(20, 10)),
    )
    before, after = load_pair(pair)
    assert before.size == after.size == (20, 10)
    assert before.getpixel((5, 5)) == (10, 200, 30)  # a solid colour survives bicubic resizing
    with pytest.raises(DataError, match=r"record 'ier_1': before .*a\.png is 40x30 but after .*b\.png is 20x10"):
        load_pair(pair, size_policy="error")


# --- annotations -----------------------------------------------------------------------------------


def write_spot(root: Path, records, split="val") -> Path:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    text = records if isinstance(records, str) else json.dumps(records)
    (root / "annotations" / f"{split}.json").write_text(text)
    return root


def test_empty_caption_is_skipped_and_counted(tmp_path):
    root = write_spot(
        tmp_path,
        [
            {"img_id": "7", "sentences": ["the car is gone", "   "]},
            {"img_id": "8", "sentences": [""]},
            {"img_id": "7", "sentences": ["a person appears"]},
        ],
    )
    index = read_dataset("spot_the_diff", root, "val")
    assert [(pair.pair_id, pair.captions) for pair in index] == [
        ("7", ("the car is gone", "a person appears")),
        ("8", ()),
    ]
    assert [(skip.record, skip.reason) for skip in index.skipped] == [
        ("record 0 (img_id '7') sentences[1]", "empty or whitespace-only reference sentence"),
        ("record 1 (img_id '8') sentences[0]", "empty or whitespace-only reference sentence"),
    ]
    stats = dataset_stats("spot_the_diff", root, ["val"])["splits"]["val"]
    assert (stats["pairs"], stats["reference_sentences"], stats["skipped"], stats["pairs_without_captions"]) == (
        2,
        2,
        2,
        1,
    )


@pytest.mark.parametrize(
    "sentences,message",
    [
        (["fine", 3], r"record 1 \(img_id '9'\): sentences\[1\] must be a string, got int 3"),
        ("one string", r"record 1 \(img_id '9'\): 'sentences' must be a list of strings, got str"),
    ],
)
def test_non_string_caption_is_an_error(tmp_path, sentences, message):
    root = write_spot(tmp_path, [{"img_id": "1", "sentences": ["ok"]}, {"img_id": "9", "sentences": sentences}])
    with pytest.raises(DataError, match=r"annotations/val\.json: " + message):
        read_dataset("spot_the_diff", root, "val")


def test_malformed_json_names_line_and_column(tmp_path):
    root = write_spot(tmp_path, '[\n  {"img_id": "1", "sentences": ["a"]},\n  {"img_id": "2" "sentences": []}\n]')
    with pytest.raises(DataError, match=r"val\.json: malformed JSON at line 3 column 18"):
        read_dataset("spot_the_diff", root, "val")


def test_missing_key_and_bad_split_file(tmp_path):
    root = write_spot(tmp_path, [{"img_id": "1"}])
    with pytest.raises(DataError, match=r"val\.json: record 0: missing key\(s\) 'sentences'"):
        read_dataset("spot_the_diff", root, "val")
    (tmp_path / "splits.json").write_text(json.dumps({"train": [1, "2"]}))
    with pytest.raises(DataError, match=r"splits\.json: split 'train' entry 1 must be a non-negative integer, got '2'"):
        read_dataset("clevr_change", tmp_path, "train")


@pytest.mark.parametrize(
    "name,message",
    [
        ("../x.png", r"record 'u': image path '\.\./x\.png' escapes the dataset root"),
        ("/etc/passwd", r"record 'u': image path '/etc/passwd' is absolute"),
        ("C:\\data\\x.png", r"record 'u': image path 'C:.*x\.png' is absolute"),
    ],
)
def test_paths_escaping_the_root_are_errors(tmp_path, name, message):
    root = write_ier(tmp_path, [{"img0": name, "img1": "b.png", "sents": ["s"], "uid": "u"}], "train.json")
    with pytest.raises(DataError, match=r"train\.json: " + message):
        read_dataset("ier", root, "train")


def test_ids_used_as_file_names_must_be_plain(tmp_path):
    root = write_spot(tmp_path, [{"img_id": "../../secret", "sentences": ["a"]}])
    with pytest.raises(DataError, match=r"val\.json: record 0: '\.\./\.\./secret' is not a plain file name"):
        read_dataset("spot_the_diff", root, "val")


def test_duplicate_ids_conflicting_images_or_merged(tmp_path):
    root = write_ier(
        tmp_path / "conflict",
        [
            {"img0": "a.jpg", "img1": "b.jpg", "sents": ["one"], "uid": "Reddit_1"},
            {"img0": "c.jpg", "img1": "d.jpg", "sents": ["two"], "uid": "Reddit_2"},
            {"img0": "z.jpg", "img1": "b.jpg", "sents": ["three"], "uid": "Reddit_1"},
        ],
    )
    with pytest.raises(
        DataError,
        match=(
            r"valid\.json: record 0 \(uid 'Reddit_1'\) and record 2 \(uid 'Reddit_1'\) "
            r"share the id 'Reddit_1' but have different before images: .*a\.jpg vs .*z\.jpg"
        ),
    ):
        read_dataset("ier", root, "val")

    root = write_ier(
        tmp_path / "same",
        [
            {"img0": "a.jpg", "img1": "b.jpg", "sents": ["one"], "uid": "Reddit_1"},
            {"img0": "a.jpg", "img1": "b.jpg", "sents": ["two", "three"], "uid": "Reddit_1"},
        ],
    )
    index = read_dataset("ier", root, "val")
    assert [(pair.pair_id, pair.captions) for pair in index] == [("Reddit_1", ("one", "two", "three"))]


def test_levir_token_file_errors(tmp_path):
    (tmp_path / "val.txt").write_text("val_000001.png\nval_000002.png\n")
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "val_000001.txt").write_text(
        json.dumps([["<START>", "a", "road", "<END>"], ["<START>", "<END>"]])
    )
    index = read_dataset("levir_cc", tmp_path, "val")
    assert [pair.captions for pair in index] == [("a road",), ()]
    assert [skip.reason.split(";")[0] for skip in index.skipped] == [
        "empty or whitespace-only reference sentence",
        "token file missing",
    ]
    (tmp_path / "tokens" / "val_000002.txt").write_text(json.dumps([["a", 5]]))
    with pytest.raises(DataError, match=r"val_000002\.txt: sentence 0: expected a list of token strings"):
        read_dataset("levir_cc", tmp_path, "val")


def test_unknown_split_and_missing_root(tmp_path):
    with pytest.raises(DataError, match="format 'ier' has no split 'valid'"):
        read_dataset("ier", tmp_path, "valid")
    with pytest.raises(DataError, match="does not exist"):
        read_dataset("ier", tmp_path / "nope", "val")


# --- a user's folder of pairs ----------------------------------------------------------------------


def test_folder_subfolders_with_unmatched_file(tmp_path):
    for name in ("kitchen.png", "street.jpg", "lonely.png"):
        solid(tmp_path / "before" / name, (0, 0, 0))
    for name in ("kitchen.png", "street.png"):  # the extension may differ between the two sides
        solid(tmp_path / "after" / name, (9, 9, 9))
    (tmp_path / "after" / "notes.txt").write_text("not an image, ignored")
    index = read_folder(tmp_path)
    assert [(p.pair_id, p.before.name, p.after.name) for p in index] == [
        ("kitchen", "kitchen.png", "kitchen.png"),
        ("street", "street.jpg", "street.png"),
    ]
    assert [(skip.record, skip.reason) for skip in index.skipped] == [
        ("lonely.png", "before image has no matching after image (expected name 'lonely')")
    ]
    assert all(pair.captions == () and pair.split == "test" for pair in index)
    stats = dataset_stats("folder", tmp_path)
    # Pairs without captions are captionable only: all in "test", none in train or val.
    assert list(stats["splits"]) == ["train", "val", "test"] and stats["splits"]["test"]["skipped"] == 1
    assert [stats["splits"][split]["pairs"] for split in ("train", "val", "test")] == [0, 0, 2]


def test_a_link_to_a_missing_image_is_its_pairs_error_not_an_unmatched_partner(tmp_path):
    """before/a.png linking to a file that is gone: the pair is read and fails on loading, naming the link; before,
    the link was passed over and after/a.png reported as having no matching before image."""
    solid(tmp_path / "after" / "a.png", (9, 9, 9))
    (tmp_path / "before").mkdir()
    (tmp_path / "before" / "a.png").symlink_to(tmp_path / "gone.png")
    index = read_folder(tmp_path)
    assert [(p.pair_id, p.before.name) for p in index] == [("a", "a.png")] and index.skipped == []
    with pytest.raises(DataError, match=r"image file is missing: .*before/a\.png"):
        load_pair(index.pairs[0])


def test_folder_side_by_side(tmp_path):
    solid(tmp_path / "room_before.png", (0, 0, 0))
    solid(tmp_path / "room_after.png", (1, 1, 1))
    solid(tmp_path / "yard_after.jpg", (1, 1, 1))
    solid(tmp_path / "unrelated.png", (1, 1, 1))
    index = read_dataset("folder", tmp_path, "test")
    assert [(p.pair_id, p.before.name, p.after.name) for p in index] == [("room", "room_before.png", "room_after.png")]
    assert [skip.record for skip in index.skipped] == ["yard_after.jpg"]
    assert index.skipped[0].reason.startswith("after image has no matching before image")
    before, after = load_pair(index.pairs[0])
    assert before.getpixel((0, 0)) == (0, 0, 0) and after.getpixel((0, 0)) == (1, 1, 1)


def test_folder_manifests(tmp_path):
    solid(tmp_path / "imgs" / "a1.png", (5, 5, 5))
    solid(tmp_path / "imgs" / "a2.png", (6, 6, 6))
    (tmp_path / "pairs.csv").write_text("before,after,id\nimgs/a1.png,imgs/a2.png,first\nimgs/a2.png,imgs/a1.png,\n")
    index = read_folder(tmp_path)
    assert [(p.pair_id, p.before.name, p.after.name) for p in index] == [
        ("first", "a1.png", "a2.png"),
        ("a2", "a2.png", "a1.png"),
    ]
    assert read_folder(tmp_path / "pairs.csv").pairs == index.pairs  # the manifest file itself

    jsonl = tmp_path / "sub" / "pairs.jsonl"
    jsonl.parent.mkdir()
    # The user's own list may point anywhere: relative to the manifest's folder (climbing out) or absolute.
    jsonl.write_text('{"before": "../imgs/a1.png", "after": "%s"}\n' % (tmp_path / "imgs" / "a2.png"))
    (pair,) = read_folder(jsonl).pairs
    assert pair.before == tmp_path / "imgs" / "a1.png" and pair.after == tmp_path / "imgs" / "a2.png"
    jsonl.write_text('{"before": "b.png", "after": "c.png", "id": "p"}\n\n{"before": "d.png"}\n')
    with pytest.raises(DataError, match=r"pairs\.jsonl: line 3: the 'after' path is missing or empty"):
        read_folder(tmp_path / "sub")
    (tmp_path / "bad.csv").write_text("left,right\na.png,b.png\n")
    with pytest.raises(DataError, match=r"bad\.csv: the header must name the columns before,after"):
        read_folder(tmp_path / "bad.csv")


def test_folder_without_pairs_is_an_error(tmp_path):
    (tmp_path / "readme.txt").write_text("nothing here")
    with pytest.raises(DataError, match="found no image pairs"):
        read_folder(tmp_path)


# --- outputs and caches, through the commands a user runs (issue 18; policy in docs/errors.md) ------


from davir.cli import evaluate as evaluate_cli  # noqa: E402
from davir.cli import train as train_cli  # noqa: E402
from davir.cli.preprocess import main as preprocess_main  # noqa: E402
from davir.data.caches import EntityCache  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = [
    "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
    "optim.max_steps=1",
    "optim.batch_size=2",
    "run.val_max_pairs=2",
    "run.tensorboard=false",
]


def first_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    return next(line for line in lines if line.startswith("error:"))


@pytest.fixture(scope="module")
def tiny_synth(tmp_path_factory):
    from davir.data.synthetic import SynthConfig, generate_dataset

    root = tmp_path_factory.mktemp("synth") / "data"
    generate_dataset(root, SynthConfig(scenes=16, seed=5, width=64, height=48), workers=1)
    return root


@pytest.fixture
def read_only_dir(tmp_path, make_read_only):
    """A folder nobody can write to (root included), holding earlier work that must survive."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    (folder / "earlier.json").write_text('{"kept": true}\n')
    yield make_read_only(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["earlier.json"]  # nothing written, nothing lost


def write_scoring_inputs(tmp_path: Path) -> tuple[Path, Path]:
    predictions, references = tmp_path / "preds.json", tmp_path / "refs.json"
    predictions.write_text(json.dumps({"1": "the red cube moved", "2": "nothing changed"}))
    references.write_text(json.dumps({"1": ["the red cube moved"], "2": ["nothing has changed"]}))
    return predictions, references


def test_read_only_outputs_stop_every_command_before_the_work(read_only_dir, tiny_synth, capsys):
    predictions, references = write_scoring_inputs(read_only_dir.parent)
    status = evaluate_cli.main(
        [
            "--predictions",
            str(predictions),
            "--references",
            str(references),
            "--metrics",
            "BLEU",
            "--no-spice",
            "--out",
            str(read_only_dir / "m.json"),
        ]
    )
    assert status == 2
    assert first_error_line(capsys) == (
        f"error: --out {read_only_dir / 'm.json'} is not writable: permission denied in {read_only_dir}"
    )
    assert "BLEU" not in capsys.readouterr().out  # failed before scoring, not after

    status = train_cli.main(
        [
            "--config",
            str(REPO / "configs" / "demo.yaml"),
            f"data.root={tiny_synth}",
            f"run.output_dir={read_only_dir / 'run'}",
            *TINY_MODEL,
        ]
    )
    assert status == 2
    assert first_error_line(capsys) == (
        f"error: run folder (run.output_dir) {read_only_dir / 'run'} is not writable: "
        f"permission denied in {read_only_dir}"
    )

    for command in (["masks"], ["entities", "--image-level"], ["features", "--random-init"]):
        status = preprocess_main(
            [
                *command,
                "--format",
                "clevr_change",
                "--root",
                str(tiny_synth),
                "--split",
                "test",
                "--out",
                str(read_only_dir / "cache"),
                "--no-progress",
            ][: None if command[0] != "features" else -1]
        )
        assert status == 2, command
        assert first_error_line(capsys) == (
            f"error: --out {read_only_dir / 'cache'} is not writable: permission denied in {read_only_dir}"
        ), command


def test_out_on_a_file_or_a_folder_is_one_line_and_leaves_nothing(tmp_path, tiny_synth, capsys):
    predictions, references = write_scoring_inputs(tmp_path)
    a_file = tmp_path / "plain.txt"
    a_file.write_text("keep me\n")
    a_folder = tmp_path / "results"
    a_folder.mkdir()
    score = ["--predictions", str(predictions), "--references", str(references), "--metrics", "BLEU", "--no-spice"]

    assert evaluate_cli.main([*score, "--out", str(a_file / "m.json")]) == 2
    assert (
        first_error_line(capsys)
        == f"error: --out {a_file / 'm.json'} cannot be written: {a_file} is a file, not a folder"
    )
    assert evaluate_cli.main([*score, "--out", str(a_folder)]) == 2
    assert first_error_line(capsys) == (
        f"error: --out {a_folder} is a folder; give a file path (e.g. {a_folder / 'metrics.json'})"
    )
    assert evaluate_cli.main([*score, "--markdown", str(a_file / "sub" / "t.md")]) == 2
    assert (
        first_error_line(capsys)
        == f"error: --markdown {a_file / 'sub' / 't.md'} cannot be written: {a_file} is a file, not a folder"
    )
    for command in ("masks", "entities"):
        extra = ["--image-level"] if command == "entities" else []
        args = [
            command,
            "--format",
            "clevr_change",
            "--root",
            str(tiny_synth),
            "--split",
            "test",
            "--no-progress",
            *extra,
        ]
        assert preprocess_main([*args, "--out", str(a_file)]) == 2
        assert first_error_line(capsys) == f"error: --out {a_file} cannot be used: {a_file} is a file, not a folder"
        assert preprocess_main([*args, "--out", str(a_file / "cache")]) == 2
        assert (
            first_error_line(capsys)
            == f"error: --out {a_file / 'cache'} cannot be used: {a_file} is a file, not a folder"
        )
    assert a_file.read_text() == "keep me\n" and list(a_folder.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "preds.json", "refs.json", "results"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--digits", "-1"], "argument --digits: must be 0 or more, got -1"),
        (["--limit", "-1"], "argument --limit: must be 1 or more, got -1; omit --limit for all pairs"),
        (["--limit", "0"], "argument --limit: must be 1 or more, got 0; omit --limit for all pairs"),
    ],
)
def test_negative_counts_are_usage_errors_before_the_work(tmp_path, capsys, flags, message):
    """--digits -1 failed only after scoring, with Python's 'Format specifier missing precision'; --limit -1 captioned
    every pair but the last (a slice), and --limit 0 every pair, where `preprocess masks --limit 0` made none."""
    predictions, references = write_scoring_inputs(tmp_path)
    score = ["--predictions", str(predictions), "--references", str(references), "--metrics", "BLEU", "--no-spice"]
    with pytest.raises(SystemExit) as stopped:
        evaluate_cli.main([*score, *flags, "--out", str(tmp_path / "metrics.json")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize("value", ["0", "-1"])
@pytest.mark.parametrize("command", ["masks", "entities", "mask-eval", "entities --fit-limit"])
def test_preprocess_limit_below_one_is_a_usage_error(tiny_synth, tmp_path, capsys, command, value):
    """`--limit -1` sliced the split to all pairs but the last and reported the cache "complete"; `--limit 0` made
    a "complete" cache of no pair (evaluate.py's --limit 0 captioned them all); `--fit-limit -1` fitted on all but
    the last pair."""
    command, _, flag = command.partition(" ")
    flag = flag or "--limit"
    where = ["--format", "clevr_change", "--root", str(tiny_synth), "--split", "test"]
    out = ["--masks", str(tmp_path / "masks")] if command == "mask-eval" else ["--out", str(tmp_path / "cache")]
    extra = ["--image-level"] if flag == "--limit" and command == "entities" else []
    try:
        status = preprocess_main([command, *where, *out, *extra, "--no-progress", flag, value])
    except SystemExit as stopped:
        status = stopped.code
    assert status == 2
    everything = "every pair of --fit-split" if flag == "--fit-limit" else "all pairs"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m preprocess {command}: error: argument {flag}: must be 1 or more, got {value}; "
        f"omit {flag} for {everything}"
    )
    assert list(tmp_path.iterdir()) == []


def test_preprocess_limit_one_takes_exactly_one_pair(tiny_synth, tmp_path, capsys):
    """One meaning of --limit in every command: N >= 1 pairs (evaluate.py's: tests/test_inference.py)."""
    where = ["--format", "clevr_change", "--root", str(tiny_synth), "--split", "test", "--no-progress"]
    first = read_dataset("clevr_change", tiny_synth, "test").pairs[0].pair_id
    masks = tmp_path / "masks"
    assert preprocess_main(["masks", *where, "--out", str(masks), "--limit", "1"]) == 0
    manifest = json.loads((masks / "manifest.json").read_text())
    assert manifest["counts"]["pairs"] == manifest["counts"]["computed"] == 1
    assert sorted(p.name for p in (masks / "masks").glob("*.json")) == [f"{first}.json"]
    entities = tmp_path / "entities"
    assert preprocess_main(["entities", *where, "--image-level", "--out", str(entities), "--limit", "1"]) == 0
    assert list(EntityCache(entities).table()) == [first]
    capsys.readouterr()
    assert preprocess_main(["mask-eval", *where[:-1], "--masks", str(masks), "--limit", "1"]) == 0
    table = capsys.readouterr().out
    result = json.loads(table[table.index("\n{") + 1 :])
    assert (result["pairs"], result["missing_from_cache"]) == (1, 0)


@pytest.mark.parametrize("command", ["pretrain_tiny", "pretrain_backbone"])
def test_train_limit_below_one_is_a_usage_error(capsys, command):
    """`python -m davir.pretrain_tiny --train-limit 0` trained on no scene (-1: all but the last); the flag reads
    as every command's --limit."""
    import importlib

    main = importlib.import_module(f"davir.cli.{command}").main
    with pytest.raises(SystemExit) as stopped:
        main(["--train-limit", "0"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m davir.{command}: error: argument --train-limit: must be 1 or more, got 0; "
        "omit --train-limit for every train scene"
    )


def test_library_limits_take_none_or_one_or_more(tiny_synth, tmp_path):
    """The library side agrees with the flags: `limit=0` was "all" to evaluate_run (`if limit:`) and "none" to
    mask_eval.evaluate (`pairs[:0]`)."""
    from davir.evaluation import evaluate_run
    from davir.jobs.mask_eval import evaluate

    for limit in (0, -1, 1.5, True):
        with pytest.raises(
            DataError, match=rf"^limit must be a whole number of 1 or more \(None for every pair\), got {limit!r}$"
        ):
            evaluate("clevr_change", tiny_synth, "test", tmp_path / "masks", limit)
        with pytest.raises(DataError, match=r"^limit must be a whole number of 1 or more"):
            evaluate_run(tmp_path / "no-run-read", "test", limit=limit)


def test_an_output_on_an_input_file_is_refused_and_the_input_kept(tmp_path, capsys, monkeypatch):
    """`--out preds.json` wrote the scores over the predictions being scored (exit 0, the predictions gone)."""
    predictions, references = write_scoring_inputs(tmp_path)
    kept = {path: path.read_bytes() for path in (predictions, references)}
    monkeypatch.chdir(tmp_path)
    score = ["--predictions", "preds.json", "--references", str(references), "--metrics", "BLEU", "--no-spice"]
    for flags, message in (
        (["--out", str(predictions)], f"--out {predictions} is the --predictions file"),
        (["--markdown", "./refs.json"], "--markdown refs.json is the --references file"),
        (["--out", "m.json", "--markdown", str(tmp_path / "m.json")], f"--markdown {tmp_path / 'm.json'} is the --out"),
    ):
        assert evaluate_cli.main([*score, *flags]) == 2, flags
        assert first_error_line(capsys).startswith(f"error: {message}"), flags
    assert {path: path.read_bytes() for path in kept} == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preds.json", "refs.json"]


def test_one_check_refuses_an_output_over_an_input_however_the_path_is_written(tmp_path, monkeypatch):
    """davir.errors.refuse_outputs_over_inputs, which `davir.data pairs|import`, caption.py and evaluate.py share:
    relative, absolute and symlinked texts of one file are one file; the message names the flag, both texts and
    what to do."""
    from davir.errors import refuse_outputs_over_inputs

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "pairs.csv").write_text("id,before,after\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    manifest = tmp_path / "real" / "pairs.csv"
    for out in ("real/pairs.csv", str(manifest), "link/pairs.csv", "link/../real/./pairs.csv"):
        with pytest.raises(DataError) as refused:
            refuse_outputs_over_inputs({"--out": out}, {"the manifest being read": manifest}, hint="e.g. out.csv")
        named = "" if Path(out) == manifest else f" ({manifest})"  # the file read named when written otherwise
        assert str(refused.value) == (
            f"--out {Path(out)} is the manifest being read{named}, which it would replace; give another --out, "
            "e.g. out.csv"
        )
    with pytest.raises(DataError, match=rf"^--html {manifest} is the manifest being read, which it would replace; "):
        refuse_outputs_over_inputs({"--out": "other.csv", "--html": manifest}, {"the manifest being read": manifest})
    # outputs elsewhere, and absent (None) inputs or outputs, pass; nothing is created by the check
    refuse_outputs_over_inputs({"--out": "real/other.csv", "--markdown": None}, {"a": manifest, "b": None})
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["pairs.csv"]


def test_atomic_write_onto_a_folder_leaves_no_temporary(tmp_path):
    from davir.io import write_json_atomic

    (tmp_path / "metrics.json").mkdir()
    with pytest.raises(IsADirectoryError):
        write_json_atomic(tmp_path / "metrics.json", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


@pytest.mark.parametrize(
    "part,message",
    [
        ([["a", 1.0]], r"part-x\.json: an entity part must be a JSON object .*got list"),
        (
            {"p1": [["red cube", 0.9]], "p2": "red cube"},
            r"part-x\.json: pair 'p2': expected a list of \[entity, score\], got str",
        ),
        (
            {"p1": [["red cube", 0.9, 3]]},
            r"part-x\.json: pair 'p1' entry 0: expected \[entity, score\], got \['red cube', 0\.9, 3\]",
        ),
        ({"p1": [["red cube", "high"]]}, r"part-x\.json: pair 'p1' entry 0: expected \[entity, score\]"),
    ],
)
def test_entity_part_of_the_wrong_shape_names_the_file(tmp_path, part, message):
    (tmp_path / "entities").mkdir()
    (tmp_path / "entities" / "part-x.json").write_text(json.dumps(part))
    with pytest.raises(DataError, match=message):
        EntityCache(tmp_path).has("p1")


def test_caches_built_for_other_data_are_refused_and_a_failed_start_leaves_no_run(tiny_synth, tmp_path, capsys):
    elsewhere = tmp_path / "old_place" / "data"
    masks, entities = tmp_path / "masks", tmp_path / "entities"
    masks.mkdir()
    (masks / "manifest.json").write_text(json.dumps({"root": str(elsewhere), "split": "train"}))
    (entities / "entities").mkdir(parents=True)
    (entities / "entities" / "manifest.json").write_text(json.dumps({"splits": {"train": {"root": str(elsewhere)}}}))
    (entities / "entities" / "part-train-0000000.json").write_text(json.dumps({"0": [["red cube", 0.9, "x"]]}))
    run = tmp_path / "run"
    common = [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"data.root={tiny_synth}",
        f"run.output_dir={run}",
        *TINY_MODEL,
    ]

    status = train_cli.main(
        [*common, f"data.masks={masks}", "model.fac.lambda_attn=0.1", "model.epc.use_entities=false"]
    )
    assert status == 2
    assert first_error_line(capsys) == (
        f"error: data.masks={masks} was built from dataset root {elsewhere} ({masks / 'manifest.json'}), but data.root "
        f"is {tiny_synth.resolve()}: rebuild the cache for this dataset, or, if the dataset only moved, set "
        f"data.moved_from={elsewhere}"
    )
    assert not run.exists()  # a failed start claims no run folder: the corrected rerun is not refused

    # The dataset moved: the override accepts the old root, and the next problem (a bad entity part) is named.
    status = train_cli.main(
        [
            *common,
            f"data.entities={entities}",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=true",
            f"data.moved_from={elsewhere}",
        ]
    )
    assert status == 2
    assert first_error_line(capsys).startswith(
        f"error: {entities / 'entities' / 'part-train-0000000.json'}: pair '0' entry 0: expected [entity, score]"
    )
    assert not (run / "config.yaml").exists() and not (run / "run_info.json").exists()


def test_preprocess_help_is_usage_and_success(capsys):
    """`python -m preprocess --help` answers with the commands on stdout and status 0; no command is still an error."""
    assert preprocess_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m preprocess" in out and "mask-eval" in out
    assert preprocess_main([]) == 2
    assert "usage: python -m preprocess" in capsys.readouterr().err
