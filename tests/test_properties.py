"""Property-based tests (hypothesis) of every reader and of the folder manifests (issue 18).

Random malformed JSON / CSV / JSONL text and random records of roughly the right shape: a reader either
returns a DatasetIndex or raises the toolkit's own DataError (never KeyError, TypeError, AttributeError,
"not enough values to unpack"…), and it never writes anything next to the data.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from davir.data import read_dataset
from davir.data.formats.folder import read_folder
from davir.errors import DataError

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["", " ", "../x.png", "/etc/passwd", "a.png", "0", "train"]),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def records(keys: list[str]):
    """Objects that mostly carry the format's keys, with values of any JSON type (sometimes the right one)."""
    return st.dictionaries(
        st.sampled_from(keys) | st.text(max_size=4),
        JSON_VALUES | st.lists(st.text(max_size=8), max_size=3),
        max_size=len(keys) + 1,
    )


def file_text(structured):
    """A file's text: the structured strategy as JSON, its JSON cut short, or arbitrary text."""
    return st.one_of(
        structured.map(json.dumps),
        structured.map(json.dumps).flatmap(lambda text: st.integers(0, len(text)).map(lambda n: text[:n])),
        st.text(max_size=40),
    )


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def read_only_ok(format: str, files: dict[str, str], split: str) -> None:
    """Write the files, read the split: a DatasetIndex or a DataError, and no file written by the reader."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")
        before = snapshot(root)
        try:
            index = read_dataset(format, root, split)
        except DataError as error:
            assert str(error), "a DataError must say what is wrong"
        else:
            assert all(isinstance(pair.pair_id, str) and pair.pair_id for pair in index.pairs)
            assert all(isinstance(c, str) and c.strip() for pair in index.pairs for c in pair.captions)
        assert snapshot(root) == before


SPLIT_IDS = st.dictionaries(
    st.sampled_from(["train", "val", "test"]) | st.text(max_size=3),
    st.lists(st.integers(-2, 5) | SCALARS, max_size=4) | JSON_VALUES,
    max_size=3,
)
CAPTIONS_BY_NAME = st.dictionaries(
    st.sampled_from(["CLEVR_default_000000.png", "CLEVR_default_000001.png", "000000.png", "0", "1"])
    | st.text(max_size=6),
    st.lists(st.text(max_size=10) | SCALARS, max_size=3) | JSON_VALUES,
    max_size=3,
)


@SETTINGS
@given(
    splits=file_text(SPLIT_IDS),
    types=file_text(
        st.dictionaries(
            st.sampled_from(["color", "material", "add", "drop", "move"]) | st.text(max_size=4),
            st.lists(st.sampled_from(["000000.png", "000001.png"]) | SCALARS, max_size=3) | JSON_VALUES,
            max_size=3,
        )
    ),
    change=file_text(CAPTIONS_BY_NAME),
    no_change=file_text(CAPTIONS_BY_NAME),
    optional=st.sets(st.sampled_from(["types", "change", "no_change"])),
)
def test_clevr_change_reader(splits, types, change, no_change, optional):
    files = {
        "splits.json": splits,
        "type_mapping.json": types,
        "change_captions.json": change,
        "no_change_captions.json": no_change,
    }
    for key, name in (
        ("types", "type_mapping.json"),
        ("change", "change_captions.json"),
        ("no_change", "no_change_captions.json"),
    ):
        if key in optional:
            files.pop(name)
    read_only_ok("clevr_change", files, "train")


@SETTINGS
@given(raw=st.booleans(), splits=file_text(SPLIT_IDS), captions=file_text(CAPTIONS_BY_NAME))
def test_clevr_dc_reader(raw, splits, captions):
    names = ("split.json", "captions.json") if raw else ("splits.json", "change_captions.json")
    read_only_ok("clevr_dc", dict(zip(names, (splits, captions))), "train")


@SETTINGS
@given(text=file_text(st.lists(records(["img0", "img1", "sents", "uid"]), max_size=4)))
def test_ier_reader(text):
    read_only_ok("ier", {"train.json": text}, "train")


@SETTINGS
@given(text=file_text(st.lists(records(["img_id", "sentences"]), max_size=4)))
def test_spot_the_diff_reader(text):
    read_only_ok("spot_the_diff", {"annotations/train.json": text}, "train")


LEVIR_SENTENCE = st.dictionaries(
    st.sampled_from(["raw", "tokens"]) | st.text(max_size=3),
    st.lists(st.text(max_size=5) | SCALARS, max_size=3) | SCALARS,
    max_size=2,
)
LEVIR_ENTRY = st.dictionaries(
    st.sampled_from(["filepath", "filename", "split", "sentences", "changeflag"]) | st.text(max_size=3),
    st.sampled_from(["train", "train_000001.png"]) | st.lists(LEVIR_SENTENCE | SCALARS, max_size=3) | JSON_VALUES,
    max_size=6,
)


@SETTINGS
@given(
    text=file_text(
        st.dictionaries(
            st.sampled_from(["images"]) | st.text(max_size=3),
            st.lists(LEVIR_ENTRY, max_size=4) | JSON_VALUES,
            max_size=2,
        )
    )
)
def test_levir_cc_karpathy_reader(text):
    read_only_ok("levir_cc", {"LevirCCcaptions.json": text}, "train")


@SETTINGS
@given(
    names=st.lists(
        st.sampled_from(["train_000001.png", "train_000002.png", "../x.png", ""]) | st.text(max_size=8), max_size=3
    ),
    tokens=st.lists(
        file_text(
            st.lists(
                st.lists(st.sampled_from(["<START>", "<END>", "a", "road"]) | SCALARS, max_size=4) | SCALARS, max_size=3
            )
        ),
        max_size=3,
    ),
)
def test_levir_cc_mci_reader(names, tokens):
    files = {"train.txt": "\n".join(names) + "\n"}
    for name, text in zip(["train_000001", "train_000002", "other"], tokens):
        files[f"tokens/{name}.txt"] = text
    read_only_ok("levir_cc", files, "train")


# --- the folder manifests: pairs.csv and pairs.jsonl ------------------------------------------------

CELLS = st.sampled_from(
    ["a.png", "b.png", "../a.png", "/abs.png", "", " ", "x,y", '"q"', "id1", "sub/c.png"]
) | st.text(max_size=8)


def csv_text():
    header = st.sampled_from(["before,after", "before,after,id", "after,before", "left,right", "before", ""]) | st.text(
        max_size=12
    )
    row = st.lists(CELLS, min_size=0, max_size=4).map(",".join)
    return st.tuples(header, st.lists(row, max_size=5)).map(lambda hr: "\n".join([hr[0], *hr[1]]) + "\n") | st.text(
        max_size=60
    )


def jsonl_text():
    entry = st.dictionaries(
        st.sampled_from(["before", "after", "id"]) | st.text(max_size=3), CELLS | JSON_VALUES, max_size=4
    )
    line = entry.map(json.dumps) | JSON_VALUES.map(json.dumps) | st.text(max_size=20)
    return st.lists(line, max_size=5).map("\n".join)


def folder_ok(name: str, text: str, as_file: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / name).write_text(text, encoding="utf-8")
        for image in ("a.png", "b.png"):  # the files exist, so good rows become pairs (images are never opened)
            (root / image).write_bytes(b"\x89PNG\r\n\x1a\n")
        before = snapshot(root)
        try:
            index = read_folder(root / name if as_file else root)
        except DataError as error:
            assert str(error)
        else:
            assert all(pair.pair_id for pair in index.pairs)
            assert len({pair.pair_id for pair in index.pairs}) == len(index.pairs)
        assert snapshot(root) == before


@SETTINGS
@given(text=csv_text(), as_file=st.booleans())
def test_folder_csv_manifest(text, as_file):
    folder_ok("pairs.csv", text, as_file)


@SETTINGS
@given(text=jsonl_text(), as_file=st.booleans())
def test_folder_jsonl_manifest(text, as_file):
    folder_ok("pairs.jsonl", text, as_file)


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00bad", b"\x00" * 8])
def test_binary_manifests_and_annotations_are_data_errors(tmp_path, payload):
    for name in ("pairs.csv", "pairs.jsonl"):
        path = tmp_path / name
        path.write_bytes(payload)
        with pytest.raises(DataError, match=name.replace(".", r"\.")):
            read_folder(path)
    (tmp_path / "train.json").write_bytes(payload)
    with pytest.raises(DataError, match=r"train\.json"):
        read_dataset("ier", tmp_path, "train")
