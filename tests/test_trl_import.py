"""`python -m davir.data import --from trl` on TRL datasets that are not what davir writes (issue 49): rows that
are no pair (item 7) and image paths leading out of the dataset's folder (item 12). The reader
(`davir.data.toolkits.trl.read`) yields a `Skipped` row naming the file, the row and the key when the import
passes its options (the import counts and lists them); without options its first bad row is a DataError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from davir.cli.data import main as data_main
from davir.data.toolkits import export_toolkit, trl
from davir.errors import DataError
from davir.integrations.prompts import epc_prompt_for

OPTIONS = SimpleNamespace(allow_outside=False, split=None, datasets=())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dataset(synthetic_set, tmp_path_factory):
    """A TRL dataset as one downloads it: the export's train rows with the images copied into the folder and
    named relative to it (davir's own export names absolute paths)."""
    root = synthetic_set(24, 0)
    base = tmp_path_factory.mktemp("trl_import")
    export_toolkit("trl", "clevr_change", root, ["train"], base / "export", prompt_for=epc_prompt_for())
    rows = _rows(base / "export" / "train.jsonl")[:6]
    folder = base / "downloaded"
    for row in rows:
        names = []
        for image in row["images"]:
            name = f"images/{Path(image).parent.name}_{Path(image).name}"
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image, folder / name)
            names.append(name)
        row["images"] = names
    _write(folder / "train.jsonl", rows)
    return SimpleNamespace(folder=folder, rows=rows)


def _broken(rows: list[dict]) -> list:
    """Six good rows, one broken in each way a downloaded TRL file can be (lines 2-8)."""
    good = rows[0]
    prompt, completion = good["prompt"], good["completion"]
    user = prompt[0]
    return [
        good,
        {**good, "prompt": ["Describe the difference"]},  # a turn that is text
        {"id": "m", "images": good["images"], "messages": ["a note", user, *completion]},
        {**good, "prompt": [{**user, "content": [*user["content"][:2], "text"]}]},  # a part that is text
        {**good, "completion": [{"role": "assistant", "content": 5}]},  # an answer of 5
        {**good, "completion": [{"role": "assistant", "content": [{"type": "text", "text": ["a"]}]}]},
        [prompt, completion],  # a row that is a list
        {**good, "images": good["images"] * 2},  # four images
        *rows[1:],
    ]


EXPECTED = [
    "line 2: 'prompt'/'completion' turn 0 must be a JSON object with 'role' and 'content', got str",
    "line 3: 'messages' turn 0 must be a JSON object with 'role' and 'content', got str",
    "line 4: the user turn's content part 2 must be a JSON object, got str",
    "line 5: the assistant turn's 'content' must be text or a list of parts, got int",
    "line 6: the assistant turn's content part 0: 'text' must be a string, got list",
    "line 7: expected a JSON object, got list",
    "line 8: 'images' must list two images, before then after (4 given)",
]


def test_reader_skips_and_names_rows_that_are_no_pair(dataset, tmp_path):
    """Issue 49.7: a `messages` entry that is not a mapping (and the other malformed shapes) is a Skipped row
    naming the file, the row and the key, never an AttributeError; the good rows are read."""
    path = _write(tmp_path / "train.jsonl", _broken(dataset.rows))
    read = list(trl.read(path, OPTIONS))
    skipped = [talk.reason for _, talk in read if isinstance(talk, trl.Skipped)]
    assert skipped == [f"{path}: {reason}" for reason in EXPECTED]
    talks = [talk for _, talk in read if not isinstance(talk, trl.Skipped)]
    assert [talk.pair_id for talk in talks] == [row["id"] for row in dataset.rows]
    assert talks[0].answer == dataset.rows[0]["completion"][0]["content"][0]["text"] and talks[0].split == "train"
    # a caller that counts no skips: the first bad row is one DataError naming the file, row and key
    with pytest.raises(DataError) as error:
        list(trl.read(path))
    assert str(error.value) == f"{path}: {EXPECTED[0]}"


def test_import_names_a_trl_row_that_is_no_pair(dataset, tmp_path, capsys):
    """`import --from trl` with a `messages` entry that is text: the row, file and key on stderr, no traceback
    (was AttributeError, exit 1). Exit 2 where the import counts no skipped rows; where it does, the row is
    listed (`skipped: …`) and the others imported, exit 1."""
    shutil.copytree(dataset.folder, tmp_path / "data")
    path = _write(tmp_path / "data" / "train.jsonl", [dataset.rows[0], _broken(dataset.rows)[2]])
    status = data_main(["import", str(path), "--from", "trl", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    reason = f"{path}: {EXPECTED[1].replace('line 3', 'line 2')}"
    assert "Traceback" not in err and reason in err
    assert (status == 2 and err == f"error: {reason}\n") or (status == 1 and f"skipped: {reason}\n" in err)


def test_reader_keeps_to_the_dataset_folder(dataset, tmp_path):
    """Issue 49.12: images named by `../`, by an absolute path elsewhere or through a symlink leading out of the
    downloaded folder are refused row by row (named, the others read), a split file leading out stops the read;
    `allow_outside` reads them, as does a caller without the import's options (davir's own export)."""
    folder = tmp_path / "downloaded"
    shutil.copytree(dataset.folder, folder)
    outside = tmp_path / "outside.png"
    shutil.copyfile(folder / dataset.rows[0]["images"][0], outside)
    (folder / "images" / "link.png").symlink_to(outside)
    good = dataset.rows[0]
    rows = [
        good,
        {**good, "images": ["../outside.png", good["images"][1]]},
        {**good, "images": [good["images"][0], str(outside)]},
        {**good, "images": ["images/link.png", good["images"][1]]},
        {**good, "images": ["images/../images/" + Path(good["images"][0]).name, good["images"][1]]},
    ]
    path = _write(folder / "train.jsonl", rows)
    read = list(trl.read(folder, OPTIONS))
    skipped = [talk.reason for _, talk in read if isinstance(talk, trl.Skipped)]
    where = f" lies outside the dataset folder {folder}"
    advice = "; pass --allow-outside to read images outside it (davir's own export names absolute paths)"
    assert skipped == [
        f"{path}: line 2: the before image {outside}{where}{advice}",
        f"{path}: line 3: the after image {outside}{where}{advice}",
        f"{path}: line 4: the before image {folder / 'images' / 'link.png'}{where} (through a "
        f"symlink, to {outside}){advice}",
    ]
    inside = [talk for _, talk in read if not isinstance(talk, trl.Skipped)]
    assert [talk.before for talk in inside] == [str(folder / good["images"][0])] * 2
    for options in (SimpleNamespace(**{**vars(OPTIONS), "allow_outside": True}), None):
        befores = [talk.before for _, talk in trl.read(folder, options)]
        assert befores[1:4] == [str(outside), str(folder / good["images"][0]), str(folder / "images" / "link.png")]

    # a split file that is a symlink out of the folder: the whole read stops, naming it
    elsewhere = _write(tmp_path / "elsewhere" / "val.jsonl", [good])
    (folder / "val.jsonl").symlink_to(elsewhere)
    with pytest.raises(DataError) as error:
        list(trl.read(folder, OPTIONS))
    assert str(error.value) == (
        f"{folder / 'val.jsonl'} leads out of the dataset folder {folder} (to {elsewhere}); "
        "a downloaded dataset is read only inside its folder: pass --allow-outside if you "
        "trust it"
    )
    assert len(list(trl.read(folder, None))) == len(rows) + 1
