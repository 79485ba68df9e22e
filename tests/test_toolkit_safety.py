"""`python -m davir.data export --to …` / `import --from …` with files a user cares about and datasets a user did not
write (issue 49 items 2, 3, 6, 7, 12; issue 50 item 3): nothing is overwritten or half-written, a cache for other
data is refused, each malformed or escaping row is skipped and listed (exit 1), and a downloaded dataset is read
only inside its folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from davir.cli.data import main as data_main  # noqa: E402
from davir.data.formats import read_dataset  # noqa: E402


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo(synthetic_set):
    return synthetic_set(24, 0)


def _export(toolkit: str, demo: Path, out: Path, *extra: str) -> list[str]:
    return ["export", "--to", toolkit, "--format", "clevr_change", "--root", str(demo), "--out", str(out), *extra]


def test_export_never_replaces_a_file_it_did_not_write(demo, tmp_path, capsys):
    out = tmp_path / "swift"
    out.mkdir()
    (out / "train.jsonl").write_text("my own training data\n")
    assert data_main(_export("swift", demo, out)) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {out / 'train.jsonl'}") and "--overwrite" in error
    assert (out / "train.jsonl").read_text() == "my own training data\n"
    assert sorted(p.name for p in out.iterdir()) == ["train.jsonl"]  # nothing else written, no temporary left

    assert data_main(_export("swift", demo, out, "--overwrite")) == 0
    train = len(read_dataset("clevr_change", demo, "train").pairs)
    assert len({row["id"] for row in _rows(out / "train.jsonl")}) == train
    # its own files, unchanged since it wrote them, are replaced by a rerun without --overwrite
    assert data_main(_export("swift", demo, out)) == 0
    # a file edited since is the user's again
    (out / "val.jsonl").write_text((out / "val.jsonl").read_text() + '{"id": "mine"}\n')
    edited = (out / "val.jsonl").read_text()
    capsys.readouterr()
    assert data_main(_export("swift", demo, out)) == 2
    assert f"{out / 'val.jsonl'}" in capsys.readouterr().err and (out / "val.jsonl").read_text() == edited


def test_export_checks_dataset_info_before_writing_anything(demo, tmp_path, capsys):
    out = tmp_path / "lf"
    out.mkdir()
    (out / "dataset_info.json").write_text('["not", "an", "object"]')
    assert data_main(_export("llamafactory", demo, out)) == 2
    assert "dataset_info.json is not a JSON object" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["dataset_info.json"]
    # an entry of that name that davir did not write is not replaced either
    (out / "dataset_info.json").write_text(json.dumps({"davir_demo_val": {"file_name": "theirs.json"}}))
    assert data_main(_export("llamafactory", demo, out, "--name", "demo")) == 2
    assert "davir_demo_val" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["dataset_info.json"]
    assert data_main(_export("llamafactory", demo, out, "--name", "other")) == 0
    info = json.loads((out / "dataset_info.json").read_text())
    assert set(info) == {"davir_demo_val", "davir_other_train", "davir_other_val", "davir_other_test"}


def test_export_refuses_an_entity_cache_made_for_another_dataset(demo, tmp_path, capsys):
    from davir.data.caches import EntityCache

    pairs = read_dataset("clevr_change", demo, "test").pairs
    cache = EntityCache(tmp_path / "entities")
    cache.write_part("test-0", {pair.pair_id: [["small red cube", 0.9]] for pair in pairs})
    elsewhere = tmp_path / "another" / "dataset"
    (cache.folder / "manifest.json").write_text(json.dumps({"splits": {"test": {"root": str(elsewhere)}}}))
    argv = _export("trl", demo, tmp_path / "trl", "--split", "test", "--entities", str(tmp_path / "entities"))
    assert data_main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: --entities={tmp_path / 'entities'} was built from dataset root {elsewhere} "
        f"({cache.folder / 'manifest.json'}), but --root is {demo.resolve()}: rebuild the cache for this dataset, "
        f"or, if the dataset only moved, pass --moved-from {elsewhere}\n"
    )
    assert not (tmp_path / "trl").exists()
    # the same dataset, moved: accepted as train.py accepts it with data.moved_from
    assert data_main([*argv, "--moved-from", str(elsewhere)]) == 0
    assert len(_rows(tmp_path / "trl" / "test.jsonl")) == sum(len(p.captions) for p in pairs)


@pytest.fixture(scope="module")
def swift_export(demo, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("swift_export") / "swift"
    assert data_main(_export("swift", demo, out)) == 0
    return out


@pytest.mark.parametrize("toolkit", ["swift", "llamafactory"])
def test_import_refuses_two_files_of_one_split(swift_export, tmp_path, toolkit, capsys):
    folder = tmp_path / "two"
    folder.mkdir()
    rows = _rows(swift_export / "val.jsonl")
    _write_rows(folder / "val.jsonl", rows)
    (folder / "val.json").write_text(json.dumps(rows))
    assert data_main(["import", str(folder), "--from", toolkit, "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        f"error: {folder}: both val.jsonl and val.json hold split 'val'; davir reads one file per split: "
        "remove or rename one (or import one file: import FILE --from …)\n"
    )
    assert not (tmp_path / "o" / "pairs.jsonl").exists()


def _downloaded(demo: Path, folder: Path, count: int = 4) -> list[tuple[str, str, str, str]]:
    """A third-party dataset folder: `count` pairs' images copied into folder/images, as (id, before, after,
    caption) with paths relative to the folder."""
    import shutil

    (folder / "images").mkdir(parents=True)
    pairs = []
    for pair in read_dataset("clevr_change", demo, "train").pairs[:count]:
        names = []
        for role, path in (("before", pair.before), ("after", pair.after)):
            shutil.copyfile(path, folder / "images" / f"{role}_{Path(path).name}")
            names.append(f"images/{role}_{Path(path).name}")
        pairs.append((pair.pair_id, *names, pair.captions[0]))
    return pairs


def _swift_row(pair_id, before, after, caption) -> dict:
    return {
        "id": pair_id,
        "images": [before, after],
        "messages": [
            {"role": "user", "content": "<image><image>What changed?"},
            {"role": "assistant", "content": caption},
        ],
    }


def test_import_skips_and_names_each_malformed_row(demo, tmp_path, capsys):
    """One rule for a row that is no pair (issue 49 item 7): skipped, named by file, row and key; the others are
    imported; exit 1. Never an AttributeError."""
    folder = tmp_path / "download"
    good = _downloaded(demo, folder, 3)
    rows = [_swift_row(*pair) for pair in good]
    user_string = _swift_row(good[0][0] + "x", *good[0][1:])
    user_string["messages"][0] = "<image><image>What changed?"
    answer_list = _swift_row(good[1][0] + "y", *good[1][1:])
    answer_list["messages"][1]["content"] = ["a list", "of captions"]
    answer_number = _swift_row(good[2][0] + "z", *good[2][1:])
    answer_number["messages"][1]["content"] = 5
    data = _write_rows(
        folder / "train.jsonl", [rows[0], user_string, rows[1], answer_list, answer_number, rows[2], [1]]
    )
    for toolkit in ("llamafactory", "swift"):
        out = tmp_path / f"out_{toolkit}"
        assert data_main(["import", str(data), "--from", toolkit, "--out", str(out)]) == 1
        captured = capsys.readouterr()
        assert [line for line in captured.err.splitlines() if line.startswith("skipped:")] == [
            f"skipped: {data}: line 2: 'messages' turn 0 must be a JSON object, got str",
            f"skipped: {data}: line 4: the assistant turn's 'content' must be text, got list",
            f"skipped: {data}: line 5: the assistant turn's 'content' must be text, got int",
            f"skipped: {data}: line 7: expected a JSON object, got list",
        ]
        assert "3 pair(s)" in captured.out and "4 row(s) of" in captured.out
        imported = _rows(out / "pairs.jsonl")
        assert [(row["id"], row["captions"], row["split"]) for row in imported] == [
            (pair_id, [caption], "train") for pair_id, _, _, caption in good
        ]
        report = json.loads((out / "report.json").read_text())
        assert report["toolkit_rows_skipped"] == 4 and len(report["skipped"]) == 4


def _lf_row(pair_id, before, after, caption, *, system: bool = False) -> dict:
    row = _swift_row(pair_id, before, after, caption)
    if system:
        row["messages"].insert(0, {"role": "system", "content": "You compare pictures."})
    return row


def test_llamafactory_import_takes_the_pairs_that_are_pairs(demo, tmp_path, capsys):
    """LLaMA-Factory's own data/ layout (issue 50 item 3): a dataset_info.json listing other datasets, a file named
    like a dataset, system turns; records that are no pair are skipped and each named; a dataset chosen by name."""
    folder = tmp_path / "data"
    good = _downloaded(demo, folder, 4)
    one_image = _lf_row("one", *good[0][1:])
    one_image["images"] = one_image["images"][:1]
    one_image["messages"][0]["content"] = "<image>What is this?"
    three = _lf_row("three", *good[1][1:])
    three["images"].append(good[2][1])
    three["messages"][0]["content"] = "<image><image><image>What changed?"
    second_turn = _lf_row("chat", *good[2][1:])
    second_turn["messages"] += [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": "no"}]
    rows = [
        _lf_row(*good[0], system=True),
        one_image,
        _lf_row(*good[1]),
        three,
        second_turn,
        _lf_row(*good[2], system=True),
        _lf_row(*good[3]),
    ]
    (folder / "pairs_demo.json").write_text(json.dumps(rows))
    (folder / "alpaca_en_demo.json").write_text(json.dumps([{"instruction": "hi", "output": "hello"}]))
    entry = {
        "file_name": "pairs_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }
    (folder / "dataset_info.json").write_text(
        json.dumps(
            {
                "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
                "open_hub": {"hf_hub_url": "someone/data"},
                "pairs_demo": entry,
            }
        )
    )

    out = tmp_path / "out"
    assert data_main(["import", str(folder), "--from", "llamafactory", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {folder / 'dataset_info.json'} lists 3 datasets, 2 of which davir cannot read (e.g. 'alpaca_en_demo': "
        "formatting 'alpaca'; davir reads sharegpt (multi-image conversations)); choose with --dataset NAME: "
        "pairs_demo\n"
    )
    assert data_main(["import", str(folder), "--from", "llamafactory", "--dataset", "open_hub", "--out", str(out)]) == 2
    assert "dataset 'open_hub': no local file_name" in capsys.readouterr().err

    argv = ["import", str(folder), "--from", "llamafactory", "--dataset", "pairs_demo", "--out", str(out)]
    assert data_main([*argv, "--split", "val"]) == 1
    err = capsys.readouterr().err
    data = folder / "pairs_demo.json"
    assert [line for line in err.splitlines() if line.startswith("skipped:")] == [
        f"skipped: {data}: record 1: 'images' must list two images, before then after (1 given)",
        f"skipped: {data}: record 3: 'images' must list two images, before then after (3 given)",
        f"skipped: {data}: record 4: 'messages' holds the turns ['user', 'assistant', 'user', 'assistant']; davir "
        "imports one 'user' turn then one 'assistant' turn (a pair and its caption)",
    ]
    imported = _rows(out / "pairs.jsonl")
    assert [(row["id"], row["captions"], row["split"]) for row in imported] == [
        (pair_id, [caption], "val") for pair_id, _, _, caption in good
    ]
    assert imported[0]["before"] == str((folder / good[0][1]).resolve())

    # the split the entry declares when --split is not given; the file alone, named like a dataset, likewise
    entry["split"] = "test"
    (folder / "dataset_info.json").write_text(json.dumps({"pairs_demo": entry}))
    assert data_main(["import", str(folder), "--from", "llamafactory", "--out", str(out)]) == 1
    assert {row["split"] for row in _rows(out / "pairs.jsonl")} == {"test"}
    assert data_main(["import", str(data), "--from", "llamafactory", "--out", str(out)]) == 1
    assert {row["split"] for row in _rows(out / "pairs.jsonl")} == {"test"}
    (folder / "dataset_info.json").unlink()  # no split anywhere: the import's seeded split, as for a folder
    assert (
        data_main(
            [
                "import",
                str(data),
                "--from",
                "llamafactory",
                "--out",
                str(out),
                "--val-fraction",
                "0.5",
                "--test-fraction",
                "0",
            ]
        )
        == 1
    )
    assert sorted(row["split"] for row in _rows(out / "pairs.jsonl")) == ["train", "train", "val", "val"]


def _trl_row(pair_id, before, after, caption) -> dict:
    return {
        "id": pair_id,
        "images": [before, after],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "What changed?"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": caption}]},
        ],
    }


@pytest.mark.parametrize("toolkit", ["llamafactory", "swift", "trl"])
def test_a_downloaded_dataset_is_read_only_inside_its_folder(demo, tmp_path, toolkit, capsys):
    """Issue 49 item 12: `../`, absolute paths and symlinks leading out of the dataset folder are refused row by
    row (named, exit 1) unless --allow-outside; a split file or dataset_info file_name leading out stops it."""
    folder, outside = tmp_path / "download", tmp_path / "outside"
    good = _downloaded(demo, folder, 2)
    secret = _downloaded(demo, outside, 4)[2:]  # two other pairs, outside the dataset folder
    (folder / "images" / "link.png").symlink_to(outside / secret[1][2])
    make = {"llamafactory": _swift_row, "swift": _swift_row, "trl": _trl_row}[toolkit]
    rows = [
        make(*good[0]),
        make("climb", "../outside/" + secret[0][1], good[1][2], "up"),
        make("absolute", good[1][1], str(outside / secret[0][2]), "abs"),
        make("linked", good[1][1], "images/link.png", "link"),
        make(*good[1]),
    ]
    data = _write_rows(folder / "train.jsonl", rows)
    out = tmp_path / "out"
    assert data_main(["import", str(folder), "--from", toolkit, "--out", str(out)]) == 1
    skipped = [line for line in capsys.readouterr().err.splitlines() if line.startswith("skipped:")]
    where = f" lies outside the dataset folder {folder}"
    assert skipped == [
        f"skipped: {data}: line 2: the before image {outside / secret[0][1]}{where}; pass --allow-outside to read "
        "images outside it (davir's own export names absolute paths)",
        f"skipped: {data}: line 3: the after image {outside / secret[0][2]}{where}; pass --allow-outside to read "
        "images outside it (davir's own export names absolute paths)",
        f"skipped: {data}: line 4: the after image {folder / 'images' / 'link.png'}{where} (through a symlink, to "
        f"{outside / secret[1][2]}); pass --allow-outside to read images outside it (davir's own export names "
        "absolute paths)",
    ]
    imported = _rows(out / "pairs.jsonl")
    assert [row["id"] for row in imported] == [good[0][0], good[1][0]]
    assert not any(str(outside) in line for line in (out / "pairs.jsonl").read_text().splitlines())
    # the user trusts it: every row read
    assert data_main(["import", str(folder), "--from", toolkit, "--out", str(out), "--allow-outside"]) == 0
    assert len(_rows(out / "pairs.jsonl")) == 5

    # a split file that is a symlink leading out stops the import
    data.unlink()
    _write_rows(outside / "train.jsonl", [make(*good[0])])
    data.symlink_to(outside / "train.jsonl")
    capsys.readouterr()
    assert data_main(["import", str(folder), "--from", toolkit, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {data} leads out of the dataset folder {folder} (to {outside / 'train.jsonl'}); a downloaded "
        "dataset is read only inside its folder: pass --allow-outside if you trust it\n"
    )


@pytest.mark.parametrize("file_name", ["../outside/train.jsonl", "/etc/passwd"])
def test_a_dataset_info_file_name_leading_out_is_refused(demo, tmp_path, file_name, capsys):
    folder = tmp_path / "download"
    good = _downloaded(demo, folder, 1)
    _write_rows(tmp_path / "outside" / "train.jsonl", [_swift_row(*good[0])])
    (folder / "dataset_info.json").write_text(
        json.dumps(
            {
                "theirs": {
                    "file_name": file_name,
                    "formatting": "sharegpt",
                    "columns": {"messages": "messages", "images": "images"},
                }
            }
        )
    )
    assert data_main(["import", str(folder), "--from", "llamafactory", "--out", str(tmp_path / "o")]) == 2
    real = Path(file_name) if file_name.startswith("/") else tmp_path / "outside" / "train.jsonl"
    assert capsys.readouterr().err == (
        f"error: {folder / 'dataset_info.json'}: dataset 'theirs': file_name {file_name!r} leads out of the dataset "
        f"folder {folder} (to {real}); a downloaded dataset is read only inside its folder: pass --allow-outside if "
        "you trust it\n"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("odd", "why"),
    [
        ({"tags": ["role"]}, "'tags' must be a JSON object, got list"),
        ({"columns": {"messages": "messages", "images": ["images"]}}, "columns.images must be a name, got ['images']"),
        ({"tags": {"role_tag": ["role"]}}, "tags.role_tag must be a name, got ['role']"),
    ],
)
def test_a_dataset_info_entry_of_odd_shape_is_named_not_a_traceback(demo, tmp_path, odd, why, capsys):
    """A hand-edited dataset_info.json entry whose columns or tags are not names is an entry davir cannot read:
    one line naming it (exit 2), read or not through --dataset, nothing written."""
    folder = tmp_path / "download"
    good = _downloaded(demo, folder, 1)
    _write_rows(folder / "mine.jsonl", [_swift_row(*good[0])])
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    entry = {
        "file_name": "mine.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
    }
    (folder / "dataset_info.json").write_text(json.dumps({"mine": {**entry, "tags": tags, **odd}}))
    out = tmp_path / "o"
    assert data_main(["import", str(folder), "--from", "llamafactory", "--dataset", "mine", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {folder / 'dataset_info.json'}: dataset 'mine': {why}\n"
    assert data_main(["import", str(folder), "--from", "llamafactory", "--out", str(out)]) == 2
    assert f"(e.g. 'mine': {why}); choose with --dataset NAME" in capsys.readouterr().err
    assert not out.exists()
