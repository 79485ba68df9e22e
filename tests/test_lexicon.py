"""One answer on every machine (issue 50, item 1): the text layer reads the WordNet word lists shipped with davir,
never an OS package, and the records carry their sha256.

Before, the chunker read Debian's `wordnet-base` in /usr/share/wordnet (`davir.text.lexicon.DEFAULT_WORDNET_DIR`)
and fell back to corpus rules without it: the same predictions scored object F1 88.4 with it and 76.4 without, and
entity caches differed. The tests point that old location at a WordNet folder and at nothing in turn (the two
machines), and require identical metrics.json and entity caches."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from davir.errors import DataError
from davir.text import lexicon as lexicon_module
from davir.text.lexicon import SHIPPED_FILE, SHIPPED_SHA256, WordNetLexicon, shipped_lexicon

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "faithfulness_runs.json.gz"
SYSTEM_WORDNET = Path("/usr/share/wordnet")
FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
SS_TYPE = {"n": "1", "v": "2", "a": "3", "r": "4"}


def write_wordnet_folder(lexicon: WordNetLexicon, folder: Path, *, drop: frozenset[str] = frozenset()) -> Path:
    """A WordNet dict folder in WordNet's own file formats holding `lexicon` (less the lemmas `drop`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for pos, name in FILES.items():
        lines = ["  1 This software and database is being provided to you, the LICENSEE, by  "]
        lines += [f"{lemma} {pos} 1 0 00000000  " for lemma in sorted(lexicon.index[pos] - drop)]
        (folder / f"index.{name}").write_text("\n".join(lines) + "\n")
        (folder / f"{name}.exc").write_text(
            "".join(f"{word} {' '.join(bases)}\n" for word, bases in sorted(lexicon.exceptions[pos].items()))
        )
    (folder / "cntlist.rev").write_text(
        "".join(f"{lemma}%{SS_TYPE[pos]}:00:00:: 1 {count}\n" for (lemma, pos), count in sorted(lexicon.counts.items()))
    )
    return folder


@pytest.fixture(scope="module")
def wordnet_folder(tmp_path_factory) -> Path:
    """Debian's /usr/share/wordnet where installed, else the same lists written back in WordNet's formats."""
    if (SYSTEM_WORDNET / "index.noun").is_file():
        return SYSTEM_WORDNET
    return write_wordnet_folder(shipped_lexicon(), tmp_path_factory.mktemp("wordnet"))


@pytest.fixture(scope="module")
def other_wordnet(tmp_path_factory) -> Path:
    """Another lexicon: the shipped one without the noun "cube"."""
    return write_wordnet_folder(shipped_lexicon(), tmp_path_factory.mktemp("other_wordnet"), drop=frozenset({"cube"}))


def machine(monkeypatch, folder: Path | None, tmp_path: Path) -> None:
    """Be a machine with WordNet where davir used to look for it (`folder`), or without (None); no override."""
    monkeypatch.delenv("DAVIR_WORDNET_DIR", raising=False)
    monkeypatch.setattr(lexicon_module, "DEFAULT_WORDNET_DIR", str(folder or tmp_path / "no_wordnet"), raising=False)
    from davir.text import extractors

    if hasattr(extractors, "_default_extractor"):
        extractors._default_extractor.cache_clear()


# --- the shipped file ------------------------------------------------------------------------------------------


def test_the_shipped_lexicon_is_the_recorded_one_and_regenerates_byte_for_byte(wordnet_folder, tmp_path, capsys):
    from davir.text import build_lexicon

    text = gzip.decompress(SHIPPED_FILE.read_bytes())
    assert hashlib.sha256(text).hexdigest() == SHIPPED_SHA256
    assert SHIPPED_FILE.stat().st_size < 1_000_000  # 706 KB: the lemmas, exceptions and counts only
    assert (SHIPPED_FILE.parent / "WORDNET_LICENSE").read_text().count("WordNet 3.0 Copyright 2006") == 1
    lexicon = shipped_lexicon()
    assert lexicon.describe() == {"name": "wordnet-3.0", "sha256": SHIPPED_SHA256, "source": "shipped", "shipped": True}
    assert {pos: len(words) for pos, words in lexicon.index.items()} == {"n": 117798, "v": 11529, "a": 21479, "r": 4481}
    # Regenerating from a WordNet folder gives the same bytes, twice (gzip without name or time stamp).
    for out in (tmp_path / "a.txt.gz", tmp_path / "b.txt.gz"):
        assert build_lexicon.main(["--wordnet", str(wordnet_folder), "--out", str(out)]) == 0
        assert out.read_bytes() == SHIPPED_FILE.read_bytes()
    assert f"sha256 {SHIPPED_SHA256}" in capsys.readouterr().out
    # The folder read directly gives the same answers, hence the same sha256.
    assert WordNetLexicon.from_folder(wordnet_folder).sha256 == SHIPPED_SHA256
    assert build_lexicon.main(["--wordnet", str(tmp_path / "none")]) == 2
    assert "error: --wordnet WordNet index file is missing" in capsys.readouterr().err


def test_a_damaged_shipped_lexicon_is_refused(tmp_path, monkeypatch):
    damaged = tmp_path / "lexicon.txt.gz"
    damaged.write_bytes(gzip.compress(gzip.decompress(SHIPPED_FILE.read_bytes()).replace(b"\ncube ", b"\ncubes ")))
    monkeypatch.setattr(lexicon_module, "SHIPPED_FILE", damaged)
    shipped_lexicon.cache_clear()
    try:
        with pytest.raises(DataError, match="has sha256 .* not the 3f16f03a.*reinstall davir"):
            shipped_lexicon()
    finally:
        shipped_lexicon.cache_clear()


# --- bullet 3: one predictions file, with and without /usr/share/wordnet → identical metrics.json -------------------


@pytest.fixture(scope="module")
def predictions_and_references(tmp_path_factory) -> tuple[Path, Path]:
    """The CHEER demo run's test captions (seed 0) and the demo test set's references, as evaluate.py reads them."""
    data = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    run = next(
        r for r in data["runs"] if r["run"] == "runs/lightweight_demo/cheer/seed0" and r["dataset"] == "demo_test"
    )
    folder = tmp_path_factory.mktemp("scored")
    (folder / "predictions.json").write_text(json.dumps(run["captions"]))
    (folder / "references.json").write_text(json.dumps(data["datasets"]["demo_test"]["references"]))
    return folder / "predictions.json", folder / "references.json"


def score(predictions: Path, references: Path, out: Path, capsys) -> tuple[bytes, str]:
    from davir.cli import evaluate

    assert (
        evaluate.main(
            [
                "--predictions",
                str(predictions),
                "--references",
                str(references),
                "--metrics",
                "BLEU",
                "--no-spice",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out.read_bytes(), capsys.readouterr().out


def test_scores_are_the_same_with_and_without_an_os_wordnet(
    predictions_and_references, wordnet_folder, other_wordnet, tmp_path, monkeypatch, capsys
):
    predictions, references = predictions_and_references
    machine(monkeypatch, wordnet_folder, tmp_path)
    with_wordnet, _ = score(predictions, references, tmp_path / "with.json", capsys)
    machine(monkeypatch, None, tmp_path)
    without_wordnet, printed = score(predictions, references, tmp_path / "without.json", capsys)
    assert with_wordnet == without_wordnet  # was object F1 88.4 vs 76.4, no-change accuracy 95.3 vs 0.0
    document = json.loads(without_wordnet)
    assert document["lexicon"] == {
        "name": "wordnet-3.0",
        "sha256": SHIPPED_SHA256,
        "source": "shipped",
        "shipped": True,
    }
    assert document["faithfulness"]["reader"]["lexicon"] == document["lexicon"]
    total = document["faithfulness"]["rows"]["total"]
    assert (round(100 * total["objects"]["f1"], 1), round(100 * total["differences"]["f1"], 1)) == (88.4, 85.8)
    assert total["no_change"] == {"pairs": 150, "accuracy": pytest.approx(143 / 150)}
    assert "not the one shipped with davir" not in printed

    # A research override (another WordNet folder) is marked: its own sha256, not shipped, a note under the table.
    monkeypatch.setenv("DAVIR_WORDNET_DIR", str(other_wordnet))
    marked, printed = score(predictions, references, tmp_path / "other.json", capsys)
    lexicon = json.loads(marked)["lexicon"]
    assert lexicon["shipped"] is False and lexicon["name"] == "wordnet-custom" and lexicon["sha256"] != SHIPPED_SHA256
    assert lexicon["source"] == str(other_wordnet)
    assert "not the one shipped with davir: these faithfulness numbers are not comparable" in printed


# --- bullet 2/3: the entity cache is byte-identical either way, carries the sha256, and another lexicon's is refused --


def build_entities(dataset: Path, out: Path, capsys) -> tuple[int, str]:
    from davir.jobs import entities

    code = entities.main(
        [
            "--format",
            "clevr_change",
            "--root",
            str(dataset),
            "--split",
            "test",
            "--fit-split",
            "train",
            "--masks",
            "gt",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    return code, capsys.readouterr().err


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.name.endswith(".lock")
    }


def test_entity_caches_are_the_same_with_and_without_an_os_wordnet(
    synthetic_set, wordnet_folder, other_wordnet, tmp_path, monkeypatch, capsys
):
    from davir.jobs import entity_eval
    from davir.preprocessing.profiles import check_cache_profiles

    dataset = synthetic_set(24, 3)
    out = tmp_path / "entities"
    machine(monkeypatch, wordnet_folder, tmp_path)
    assert build_entities(dataset, out, capsys)[0] == 0
    with_wordnet = files_of(out)
    shutil.move(out, tmp_path / "entities_with")
    machine(monkeypatch, None, tmp_path)
    assert build_entities(dataset, out, capsys)[0] == 0
    assert files_of(out) == with_wordnet  # vocabulary, entities, retriever, gate and manifest, byte for byte
    vocabulary = json.loads(with_wordnet["vocab.json"])
    assert vocabulary["extractor"]["lexicon"]["sha256"] == SHIPPED_SHA256
    assert json.loads(with_wordnet["entities/manifest.json"])["lexicon"]["sha256"] == SHIPPED_SHA256
    assert check_cache_profiles(None, entities=out) == {"entities": "toolkit"}

    # Under another lexicon the cache is refused: by a rerun into it, and by training / evaluate / caption.
    monkeypatch.setenv("DAVIR_WORDNET_DIR", str(other_wordnet))
    code, err = build_entities(dataset, out, capsys)
    assert code == 2 and "vocab.json was built with the lexicon with sha256 3f16f03abeed…, not this davir's" in err
    with pytest.raises(
        DataError,
        match=r"the entities cache .* was made with the lexicon with sha256 3f16f03abeed…, "
        r"not this davir's lexicon .*allow_profile_mismatch",
    ):
        check_cache_profiles(None, entities=out)
    warnings: list[str] = []
    check_cache_profiles(None, entities=out, allow_mismatch=True, warn=warnings.append)
    assert len(warnings) == 1 and "(accepted)" in warnings[0]
    evaluation = ["--format", "clevr_change", "--root", str(dataset), "--split", "test", "--entities", str(out)]
    assert entity_eval.main(evaluation) == 0  # the diagnostic still runs, marked
    assert "not this davir's lexicon" in json.loads((out / "entity_eval_test.json").read_text())["lexicon_mismatch"]
    monkeypatch.delenv("DAVIR_WORDNET_DIR")
    assert entity_eval.main(evaluation) == 0
    assert json.loads((out / "entity_eval_test.json").read_text())["lexicon_mismatch"] is None

    # A cache from before davir shipped its lexicon (WordNet of the machine, unrecorded) is refused too.
    manifest_path = out / "entities" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["vocabulary"]["extractor"] = {"backend": "wordnet", "wordnet_dir": "/usr/share/wordnet"}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="an unrecorded WordNet"):
        check_cache_profiles(None, entities=out)


def test_run_info_records_the_lexicon(tmp_path, monkeypatch):
    from davir.training.run import write_run_info

    write_run_info(tmp_path, seed=3)
    assert json.loads((tmp_path / "run_info.json").read_text())["lexicon"]["sha256"] == SHIPPED_SHA256
    monkeypatch.setenv("DAVIR_WORDNET_DIR", str(tmp_path / "none"))  # recorded, not a crash after the folder is made
    write_run_info(tmp_path, seed=3)
    assert "index.noun" in json.loads((tmp_path / "run_info.json").read_text())["lexicon"]["error"]
