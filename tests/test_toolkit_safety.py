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

from davir.data.__main__ import main as data_main  # noqa: E402
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
        f"or, if the dataset only moved, pass --moved-from {elsewhere}\n")
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
        "remove or rename one (or import one file: import FILE --from …)\n")
    assert not (tmp_path / "o" / "pairs.jsonl").exists()
