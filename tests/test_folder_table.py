"""The compact table of a manifest's pairs (what caption.py holds of 1,000,000 rows, issue 30): the same records,
in the same order, as `read_folder(path, "all")`, the same first problem, and caption.py's resume over it."""

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from davir.data.export import write_pairs_manifest
from davir.data.formats import read_dataset
from davir.data.formats.folder import read_folder, read_folder_pairs
from davir.data.formats.folder_rows import FolderRow, Problems, resolve_user_text
from davir.data.formats.folder_table import FolderPairTable, build_table
from davir.data.images import resolve_user_path
from davir.errors import DataError
from davir.inference.captioner import CaptionResult, ChangeCaptioner, PreparedPair
from davir.inference.folder import caption_folder


def same_records(path: Path) -> int:
    """read_folder_pairs gives read_folder's "all" records, field for field (meta and path types too)."""
    expected = read_folder(path, "all")
    got = read_folder_pairs(path)
    assert isinstance(got.pairs, FolderPairTable)
    assert len(got.pairs) == len(expected.pairs)
    assert [got.pairs.pair_id(i) for i in range(len(got.pairs))] == [p.pair_id for p in expected.pairs]
    for mine, theirs in zip(got.pairs, expected.pairs):
        assert mine == theirs and mine.meta == theirs.meta and mine.source_captions == theirs.source_captions
        assert type(mine.before) is type(theirs.before) and type(mine.gt_mask_after) is type(theirs.gt_mask_after)
    assert got.pairs[-1] == expected.pairs[-1] and got.pairs[1:3] == expected.pairs[1:3]
    assert (got.root, got.split, got.skipped, got.notes) == (
        expected.root,
        expected.split,
        expected.skipped,
        expected.notes,
    )
    return len(expected.pairs)


def test_real_annotation_files_as_manifests_read_the_same(shared_datasets, tmp_path):
    # Spot-the-Diff val: one CSV row per reference sentence, so most ids repeat over 2-3 rows (merged).
    csv_manifest = tmp_path / "spot" / "pairs.csv"
    csv_manifest.parent.mkdir()
    write_pairs_manifest("spot_the_diff", str(shared_datasets / "spot_the_diff"), ["val"], str(csv_manifest), num=0)
    assert same_records(csv_manifest) == 1493
    # IER val and CLEVR-Change val as JSON lines: captions lists, no split (drawn per group sharing an image), an
    # extra column (kept in meta, named in the notes), relative and absolute paths, pairs without captions.
    rows = []
    for number, pair in enumerate(
        read_dataset("ier", shared_datasets / "ier", "val").pairs
        + read_dataset("clevr_change", shared_datasets / "clevr_change", "val").pairs[:500]
    ):
        before = os.path.relpath(pair.before, tmp_path) if number % 2 else str(pair.before)
        row = {"id": pair.pair_id, "before": before, "after": str(pair.after), "captions": list(pair.captions)}
        rows.append({**row, **({"scene": number % 7, "note": {"n": number}} if number % 3 == 0 else {})})
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert same_records(tmp_path) == 383 + 500


def test_a_folder_of_image_files_is_read_as_before(tmp_path):
    for name in ("a", "b"):
        for side, value in (("before", 10), ("after", 200)):
            (tmp_path / side).mkdir(exist_ok=True)
            Image.new("RGB", (8, 6), (value,) * 3).save(tmp_path / side / f"{name}.png")
    (tmp_path / "captions.json").write_text(json.dumps({"a": ["one", "two"]}))
    index = read_folder_pairs(tmp_path)
    assert isinstance(index.pairs, list) and index.pairs == read_folder(tmp_path, "all").pairs


def test_every_manifest_field_and_path_form_survives_the_table(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "pairs.jsonl").write_text(
        "\n".join(
            json.dumps(row)
            for row in [
                {
                    "id": "p1",
                    "before": "sub/../a.png",
                    "after": "./b.png/",
                    "caption": "  the  cup\tis gone ",
                    "mask": "m.png",
                    "split": "Valid",
                    "extra": [1, 2.5, None],
                },
                {"id": "p1", "before": "a.png", "after": "b.png", "captions": ["more", "  "], "mask": "m.png"},
                {"id": 7, "before": "//srv/x.png", "after": "~/y.png", "mask": "m.png", "mask_before": "mb.png"},
                {"before": "../up/z.png", "after": "/abs//z2.png", "caption": "", "other": "\ud800 odd"},
                {"id": "p1", "before": "a.png", "after": "b.png", "split": "val", "mask": "m.png"},
                {"id": "q", "before": "q0.png", "after": "q1.png", "caption": "no split given"},
            ]
        )
        + "\n"
    )
    assert same_records(tmp_path / "pairs.jsonl") == 4
    assert read_folder_pairs(tmp_path).pairs[0].captions == ("the cup is gone", "more")
    for value in ("sub/../a.png", "./b.png/", "//srv/x.png", "///x", "~/y.png", "../up/z.png", "/abs//z2.png", "."):
        assert resolve_user_text(tmp_path, value, source="s", record="r") == str(
            resolve_user_path(tmp_path, value, source="s", record="r")
        )


@pytest.mark.parametrize(
    "body, message",
    [
        # an image conflict on line 3 and a bad split on line 4: the parse problem is raised first, as before
        (
            "id,before,after,split\np,a.png,b.png,train\np,a.png,c.png,train\nr,a.png,b.png,nope\n",
            "line 4: split 'nope'",
        ),
        (
            "id,before,after,split\np,a.png,b.png,train\np,a.png,c.png,train\nr,a.png,b.png,test\n",
            "line 3: repeats the id 'p' of line 2 but with a different after image",
        ),
        ("id,before,after,split\np,a.png,b.png,train\np,a.png,b.png,val\n", "line 3: puts id 'p' in split 'val'"),
        ("before,after\n", "lists no pairs"),
    ],
)
def test_the_first_problem_is_the_same(tmp_path, body, message):
    (tmp_path / "pairs.csv").write_text(body)
    errors = []
    for read in (lambda: read_folder(tmp_path, "all"), lambda: read_folder_pairs(tmp_path)):
        with pytest.raises(DataError) as caught:
            read()
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and message in errors[0]


def test_a_caption_the_reader_never_makes_is_kept_whole(tmp_path):
    rows = [
        FolderRow("line 2", "p", tmp_path / "a", tmp_path / "b", captions=["two\nlines", "x"]),
        FolderRow("line 3", "p", tmp_path / "a", tmp_path / "b", captions=["y"]),
    ]
    table = build_table(rows, Problems("s"))
    table.set_splits({})
    assert table[0].captions == ("two\nlines", "x", "y") and table[0].split == "test"


class FakeCaptioner(ChangeCaptioner):
    """caption_folder's whole path without a model: the caption names the pair; `prepared` lists what it did."""

    def __init__(self):
        self.prepared: list[int] = []
        self.run = type("Run", (), {"model_dir": Path("fake")})()

    def settings(self) -> dict:
        return {"model": "fake"}

    def prepare(self, pair, *, index=0, keep_images=False):
        self.prepared.append(index)
        return PreparedPair(pair, index)

    def generate(self, prepared, *, attention=False):
        return [CaptionResult(p.pair.pair_id, f"{p.pair.pair_id} from {p.pair.before.name}") for p in prepared]


def test_caption_folder_resumes_exactly_over_the_table(tmp_path):
    rows = [
        {"id": f"p{i}", "before": f"b{i % 3}.png", "after": f"a{i}.png", "captions": [f"c{i}"] * (i % 2)}
        for i in range(11)
    ] + [{"id": "p4", "before": "b1.png", "after": "a4.png", "caption": "again"}]
    manifest = tmp_path / "pairs.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    records = read_folder(manifest, "all").pairs
    # the records themselves (what caption.py materialised before): the bytes the table path must give
    listed = tmp_path / "listed" / "c.jsonl"
    caption_folder(FakeCaptioner(), records, listed, batch_size=4, workers=0, progress=False)
    out = tmp_path / "out" / "c.jsonl"
    captioner = FakeCaptioner()
    summary = caption_folder(captioner, manifest, out, batch_size=4, workers=0, progress=False)
    assert summary.status == 0 and captioner.prepared == list(range(11))
    assert out.read_bytes() == listed.read_bytes()
    assert json.loads(out.read_text().splitlines()[4])["references"] == ["again"]
    # A kill after some lines, in the middle of another: the rerun prepares exactly the pairs not done.
    lines = out.read_text().splitlines(keepends=True)
    kept = [lines[i] for i in (0, 1, 2, 5, 9)]
    out.write_text("".join(kept) + lines[6][:10])
    captioner = FakeCaptioner()
    summary = caption_folder(captioner, manifest, out, batch_size=4, workers=0, progress=False)
    assert captioner.prepared == [3, 4, 6, 7, 8, 10] and summary.this_run == 6
    assert out.read_bytes() == listed.read_bytes()
    # Two shards of a scheduler give the same file.
    sharded = tmp_path / "sharded" / "c.jsonl"
    for shard in (1, 0):
        caption_folder(
            FakeCaptioner(), manifest, sharded, batch_size=4, workers=0, progress=False, num_shards=2, shard_index=shard
        )
    assert sharded.read_bytes() == listed.read_bytes()
