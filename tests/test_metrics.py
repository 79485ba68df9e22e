"""Caption metrics: equality with the official coco-caption numbers, hand-computed BLEU/ROUGE-L/CIDEr-D,
id matching, SPICE's unavailable path, per-type tables, file formats and the evaluate.py CLI."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from unittest.mock import patch

import numpy as np
import psutil
import pytest

from davir.data.records import ChangePair, DatasetIndex
from davir.errors import DataError
from davir.metrics import (
    SCALE_NOTE,
    SPICE_ENV,
    SPICE_HINT,
    align_ids,
    canonical_id,
    format_group_table,
    format_table,
    from_coco_names,
    groups_from_index,
    load_predictions,
    load_references,
    ptb_tokenize,
    references_from_index,
    results_to_json,
    score_by_group,
    score_captions,
    write_predictions,
)
from davir.metrics import captions as captions_module
from davir.metrics import spice as spice_module
from davir.metrics.captions import MetricsError, meteor_scorer, shared_meteor
from davir.metrics.spice import prepare_spice

REPO = Path(__file__).resolve().parents[1]
SPOT = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "spot_the_diff"
SPOT_PREDICTIONS = SPOT / "eval_example_val" / "ssgpa_spot_val_total_captions.json"
SPOT_REFERENCES = SPOT / "spot_val_change_captions_reformat.json"
SPOT_EXPECTED = SPOT / "eval_example_val" / "expected_scores.json"
TOLERANCE = {"METEOR": 1.5e-3}  # METEOR drifts ~1e-3 across Java/paraphrase installs; the rest 5e-4


def java_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "java" in p.name().lower()]


@pytest.fixture(scope="module")
def spot_run():
    """The shared Spot-the-Diff val example scored once (all metrics; a few seconds of Java)."""
    predictions = load_predictions(SPOT_PREDICTIONS)
    references = load_references(SPOT_REFERENCES)
    result = score_captions(predictions, references, spice=False)
    return result, java_children()


def test_spot_example_equals_official_coco_caption(spot_run):
    result, _ = spot_run
    expected = json.loads(SPOT_EXPECTED.read_text())
    official = from_coco_names(expected["computed_here"])
    assert set(official) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE_L", "CIDEr"}
    for name, value in official.items():
        assert abs(result.metrics[name] - value) <= TOLERANCE.get(name, 5e-4), (name, result.metrics[name], value)
    stats = expected["bleu_stats"]
    assert result.bleu_stats == {key: stats[key] for key in ("testlen", "reflen", "guess", "correct")}
    assert (
        (result.num_pairs, result.num_references) == (expected["num_pairs"], expected["num_references"]) == (1489, 3293)
    )
    assert result.mismatch.ok and result.num_empty_predictions == 0
    # Per-image CIDEr averages to the corpus CIDEr (pycocoevalcap's CIDEr is a mean over images).
    assert len(result.per_image_cider) == 1489
    assert np.mean(list(result.per_image_cider.values())) == pytest.approx(result.metrics["CIDEr"], abs=1e-12)
    assert result.metrics["SPICE"] is None and result.notes == ["SPICE not computed (disabled)"]


def test_meteor_java_process_is_closed(spot_run):
    _, children_after_scoring = spot_run
    assert children_after_scoring == []
    with pytest.raises(RuntimeError, match="boom"):
        with meteor_scorer() as meteor:
            process = meteor.meteor_p
            assert process.poll() is None
            raise RuntimeError("boom")
    assert process.returncode is not None and process.stdin.closed and process.stdout.closed
    assert not psutil.pid_exists(process.pid) or psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE
    # A METEOR process that died mid-run is a clear error, and closing still works (no stuck lock).
    with meteor_scorer() as meteor:
        meteor.meteor_p.kill()
        meteor.meteor_p.wait()
        with pytest.raises(MetricsError, match=r"METEOR \(java\) failed"):
            captions_module._meteor(meteor, {"a": ["a red cube"]}, {"a": ["a red ball"]})
    assert not meteor.lock.locked() and meteor.meteor_p.stdin.closed


@pytest.mark.slow
def test_shared_meteor_keeps_one_java_process_for_the_block():
    predictions, references = {"1.png": "a red cube was added"}, {"1": ["a red cube has been added"]}
    started = []
    real_start = captions_module._start_meteor

    def counting_start():
        started.append(real_start())
        return started[-1]

    with patch.object(captions_module, "_start_meteor", counting_start):
        with shared_meteor():
            first = score_captions(predictions, references, metrics=("METEOR",), spice=False).metrics["METEOR"]
            second = score_captions(predictions, references, metrics=("METEOR",), spice=False).metrics["METEOR"]
            assert len(started) == 1 and started[0].meteor_p.poll() is None  # one for the block, still open
            started[0].meteor_p.kill()  # a process that died between runs is replaced, not reused
            started[0].meteor_p.wait()
            third = score_captions(predictions, references, metrics=("METEOR",), spice=False).metrics["METEOR"]
            assert len(started) == 2
        assert all(meteor.meteor_p.poll() is not None and meteor.meteor_p.stdin.closed for meteor in started)
    # the score of a fresh process per call (the default path), to the last digit
    assert first == second == third == pytest.approx(0.9377567140600315, abs=1e-12)


def test_bleu_and_rouge_by_hand():
    # A: 6 hypothesis tokens vs "the cat is on the mat": matches 1-g 5/6, 2-g 3/5, 3-g 1/4, 4-g 0/3.
    # B: "the cat" vs the same reference: 1-g 2/2, 2-g 1/1, no 3-/4-grams; brevity penalty over the corpus.
    predictions = {"1.png": "The cat sat on the mat.", "2.png": "the cat", "99.png": "no reference for me"}
    references = {"1": ["the cat is on the mat"], "2": ["The cat is on the mat ."]}
    result = score_captions(predictions, references, metrics=("BLEU", "ROUGE_L"), spice=False)
    brevity = math.exp(1 - 12 / 8)
    p1, p2, p3 = 7 / 8, 4 / 6, 1 / 4
    assert result.metrics["BLEU-1"] == pytest.approx(p1 * brevity, abs=1e-6)
    assert result.metrics["BLEU-2"] == pytest.approx((p1 * p2) ** 0.5 * brevity, abs=1e-6)
    assert result.metrics["BLEU-3"] == pytest.approx((p1 * p2 * p3) ** (1 / 3) * brevity, abs=1e-6)
    assert result.metrics["BLEU-4"] < 1e-3  # no 4-gram matches
    assert result.bleu_stats == {"testlen": 8, "reflen": 12, "guess": [8, 6, 4, 3], "correct": [7, 4, 1, 0]}
    # ROUGE-L, beta 1.2: A has LCS 5 of 6/6 tokens (F = 5/6); B has LCS 2, P = 1, R = 2/6.
    rouge_b = (1 + 1.44) * 1 * (2 / 6) / (2 / 6 + 1.44 * 1)
    assert result.per_image["ROUGE_L"] == pytest.approx({"1.png": 5 / 6, "2.png": rouge_b})
    assert result.metrics["ROUGE_L"] == pytest.approx((5 / 6 + rouge_b) / 2)
    # The id without a reference is reported, not scored.
    assert result.num_pairs == 2 and result.mismatch.predictions_without_reference == ["99.png"]
    assert "METEOR" not in result.metrics and "CIDEr" not in result.metrics


def test_cider_d_by_hand():
    # Two pairs with disjoint vocabularies: every reference n-gram has df 1 of N=2, so every weight is
    # log 2 and cancels. Pair "b" is a perfect match: similarity 1 for n=1..4 -> 10. Pair "a":
    # n=1 {a, red, ball} vs {a, red, cube}: 2/3; n=2 {a red, red ball} vs {a red, red cube}: 1/2;
    # n=3: 0; n=4: no n-grams -> 0; equal lengths -> no penalty; 10 * mean = 10 * (2/3 + 1/2) / 4.
    predictions = {"a": "a red ball", "b": "the blue sphere is gone"}
    references = {"a": ["a red cube"], "b": ["The blue sphere is gone."]}
    result = score_captions(predictions, references, metrics=("CIDEr", "BLEU"), spice=False)
    cider_a = 10 * (2 / 3 + 1 / 2) / 4
    assert result.per_image_cider == pytest.approx({"a": cider_a, "b": 10.0})
    assert result.metrics["CIDEr"] == pytest.approx((cider_a + 10.0) / 2)
    assert result.per_image["BLEU-4"]["b"] == pytest.approx(1.0, abs=1e-6)


def test_empty_prediction_and_line_breaks():
    tokens = ptb_tokenize({"a": ["The cube\r\nis RED.", "x\u2028y"], "b": ["Hello, World!"]})
    assert tokens == {"a": ["the cube is red", "x y"], "b": ["hello world"]}
    predictions = {"1": "", "2": "the ball moved", "3": "."}
    references = {"1": ["a cube is added"], "2": ["the ball moved"], "3": ["the sphere is gone"]}
    result = score_captions(predictions, references, metrics=("BLEU", "ROUGE_L", "CIDEr"), spice=False)
    assert result.num_empty_predictions == 2
    for pair_id in ("1", "3"):
        assert result.per_image_cider[pair_id] == 0.0 and result.per_image["ROUGE_L"][pair_id] == 0.0
    # A perfect 3-word match has no 4-grams: similarity 1 for n=1..3 and 0 for n=4 -> 10 * 3/4.
    assert result.per_image_cider["2"] == pytest.approx(7.5)


def test_canonical_ids():
    assert canonical_id(256) == canonical_id("256") == canonical_id("256.png") == canonical_id("000256.png") == "256"
    assert canonical_id("000123.png_n") == "123_n" != canonical_id("000123.png")
    assert canonical_id(" Reddit_1052 ") == "Reddit_1052" and canonical_id("train_000016.PNG") == "train_000016"
    aligned = align_ids({"256.png": "x", "000123.png_n": "y"}, {256: ["r1"], "000123.png": ["r2"], "123.png_n": ["r3"]})
    assert aligned.predictions == {"256.png": "x", "000123.png_n": "y"}
    assert aligned.references == {"256.png": ["r1"], "000123.png_n": ["r3"]}
    assert aligned.mismatch.references_without_prediction == ["000123.png"]
    # One pair spelled twice in the references merges (as COCO merges annotations of one image).
    assert align_ids({"7": "x"}, {"7": ["a"], "7.png": ["b"]}).references == {"7": ["a", "b"]}


def test_mismatch_report_and_strict_mode():
    predictions = {"1.png": "a", "2.png": "b", **{f"extra{k}": "c" for k in range(6)}}
    references = {"1": ["a"], "2": ["b"], "3": ["c"]}
    aligned = align_ids(predictions, references)
    assert list(aligned.predictions) == ["1.png", "2.png"]
    report = aligned.mismatch.to_dict()
    assert report["predictions_without_reference"] == {"count": 6, "examples": [f"extra{k}" for k in range(5)]}
    assert report["references_without_prediction"] == {"count": 1, "examples": ["3"]}
    lines = aligned.mismatch.lines()
    assert lines[0].startswith("6 prediction id(s) have no reference") and "'extra4', ...)" in lines[0]
    assert lines[1] == "1 reference id(s) have no prediction and are not scored (e.g. '3')"
    with pytest.raises(DataError, match=r"strict mode.*6 prediction id\(s\)"):
        align_ids(predictions, references, strict=True)
    with pytest.raises(DataError, match="'256', '256.png' name the same pair"):
        align_ids({"256": "a", "256.png": "b"}, {"256": ["r"]})
    with pytest.raises(DataError, match="id '4' has an empty reference list"):
        align_ids({"4": "a"}, {"4": []})
    with pytest.raises(DataError, match="no prediction id matches"):
        align_ids({"5": "a"}, {"6": ["r"]})


def _no_download(*args, **kwargs):
    raise AssertionError("SPICE must not try to download CoreNLP")


class _ForbiddenSpice:
    def __init__(self):
        raise AssertionError("Spice() must not be constructed without the CoreNLP jars")


def test_spice_unavailable_reports_none_without_network(tmp_path, monkeypatch):
    monkeypatch.setattr(spice_module, "spice_lib_dir", lambda: tmp_path / "lib")
    monkeypatch.setattr(spice_module, "Spice", _ForbiddenSpice)
    monkeypatch.setattr(urllib.request, "urlretrieve", _no_download)
    monkeypatch.delenv(SPICE_ENV, raising=False)
    result = score_captions({"1": "a red cube is added"}, {"1": ["a red cube is added"]}, metrics=("BLEU",))
    assert result.metrics["SPICE"] is None
    assert result.notes == [SPICE_HINT] and SPICE_ENV in SPICE_HINT and "--spice-corenlp" in SPICE_HINT
    # A folder without the jars is named in the one-line message.
    monkeypatch.setenv(SPICE_ENV, str(tmp_path / "empty"))
    ready, message = prepare_spice()
    assert not ready and str(tmp_path / "empty") in message and "stanford-corenlp-3.6.0-models.jar" in message
    table = format_table({"total": result})
    assert "| total | 100.0 | 100.0 | 100.0 | 100.0 | n/a | 1 |" in table and SPICE_HINT in table


def test_spice_with_provided_jars_links_them_and_never_crashes(tmp_path, monkeypatch):
    lib, corenlp = tmp_path / "lib", tmp_path / "corenlp"
    lib.mkdir()
    corenlp.mkdir()
    for jar in ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar"):
        (corenlp / jar).write_bytes(b"jar")
    monkeypatch.setattr(spice_module, "spice_lib_dir", lambda: lib)
    monkeypatch.delenv(SPICE_ENV, raising=False)
    seen_options = []

    class RecordingSpice:  # stands in for the java run; returns per-image F-scores in sorted-id order
        def compute_score(self, gts, res):
            seen_options.append(os.environ.get("JDK_JAVA_OPTIONS", ""))
            return 0.0, [{"All": {"f": {"a": 0.25, "b": 0.75}[k]}} for k in sorted(gts)]

    monkeypatch.setattr(spice_module, "Spice", RecordingSpice)
    result = score_captions({"b": "x y", "a": "x z"}, {"a": ["x z"], "b": ["x y"]}, metrics=("BLEU",), spice=corenlp)
    assert (lib / "stanford-corenlp-3.6.0-models.jar").resolve() == (
        corenlp / "stanford-corenlp-3.6.0-models.jar"
    ).resolve()
    assert result.metrics["SPICE"] == pytest.approx(0.5) and result.per_image["SPICE"] == {"a": 0.25, "b": 0.75}
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in seen_options[0]

    class FailingSpice:
        def compute_score(self, gts, res):
            raise subprocess.CalledProcessError(1, ["java", "-jar", "spice-1.0.jar"])

    monkeypatch.setattr(spice_module, "Spice", FailingSpice)
    result = score_captions({"a": "x z"}, {"a": ["x z"]}, metrics=("BLEU",), spice=True)  # jars now in lib
    assert result.metrics["SPICE"] is None and result.notes[0].startswith("SPICE n/a: the SPICE run failed")


def clevr_pair(pair_id: str, change_type: str, captions: tuple[str, ...]) -> ChangePair:
    scene = pair_id[:6]
    return ChangePair(
        pair_id=pair_id,
        before=Path(f"images/CLEVR_default_{scene}.png"),
        after=Path(f"sc_images/CLEVR_semantic_{scene}.png"),
        captions=captions,
        change_type=change_type,
    )


def test_score_by_group_on_clevr_style_ids():
    no_change = ("the scene remains the same", "no change has occurred")
    index = DatasetIndex(
        "clevr_change",
        Path("."),
        "test",
        [
            clevr_pair("000001.png", "color", ("the red cube became blue",)),
            clevr_pair("000002.png", "color", ("a green sphere changed to yellow",)),
            clevr_pair("008001.png", "material", ("the small metal ball became rubber",)),
            clevr_pair("000001.png_n", "distractor", no_change),
            clevr_pair("000002.png_n", "distractor", no_change),
        ],
    )
    references, without = references_from_index(index)
    groups = groups_from_index(index)
    predictions = {
        "1.png": "the red cube became blue",
        "2.png": "a green sphere changed to yellow",
        "8001.png": "the small metal ball became rubber",
        "1.png_n": "the scene remains the same",
        "2.png_n": "a cube moved",
        "9.png": "unknown pair",
    }
    references["000009.png"] = ["a cube was added"]
    results = score_by_group(predictions, references, groups, metrics=("BLEU", "CIDEr"), spice=False)
    assert list(results) == ["color", "material", "distractor", "semantic", "total"]
    assert [results[k].num_pairs for k in results] == [2, 1, 2, 3, 6]
    # IDF is the subset's own: two perfect color pairs with disjoint words -> 10 each; the single
    # material pair has N=1, so log(N) - log(df) = 0 for every n-gram and CIDEr-D is 0 despite a perfect match.
    assert results["color"].metrics["CIDEr"] == pytest.approx(10.0)
    assert results["material"].metrics["CIDEr"] == 0.0
    assert results["material"].metrics["BLEU-4"] == pytest.approx(1.0, abs=1e-6)
    assert results["semantic"].metrics["BLEU-4"] == pytest.approx(1.0, abs=1e-6)
    assert results["distractor"].metrics["BLEU-4"] < results["semantic"].metrics["BLEU-4"]
    assert any("1 scored pair(s) have no group" in note and "'9.png'" in note for note in results["total"].notes)
    table = format_group_table(results)
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:7]]
    assert rows == ["color", "material", "distractor", "semantic", "total"]
    assert "| color | 100.0 | 100.0 | 100.0 | 100.0 | 1000.0 | n/a | 2 |" in table and SCALE_NOTE in table
    document = results_to_json(results, per_image=["total"])
    assert "per_image" in document["rows"]["total"] and "per_image" not in document["rows"]["color"]
    json.dumps(document)


def test_prediction_and_reference_formats_load_alike(tmp_path):
    expected = {"256.png": "the car is gone", "7": "", "000123.png_n": "nothing changed"}
    coco = tmp_path / "results.json"
    coco.write_text(json.dumps([{"image_id": k, "caption": v} for k, v in expected.items()]))
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps(expected))
    jsonl = tmp_path / "preds.jsonl"
    jsonl.write_text(
        '{"image_id": "256.png", "caption": "the car is gone", "id": 3}\n\n'
        '{"id": "7", "caption": ""}\n{"pair_id": "000123.png_n", "caption": "nothing changed"}\n'
    )
    assert load_predictions(coco) == load_predictions(mapping) == load_predictions(jsonl) == expected
    for out in (tmp_path / "written.json", tmp_path / "written.jsonl"):
        write_predictions(out, expected)
        assert load_predictions(out) == expected

    references = {"256.png": ["person with umbrella is gone", "car up at top is missing"], "5406.png": ["truck left"]}
    coco_refs = tmp_path / "refs_coco.json"
    coco_refs.write_text(
        json.dumps(
            {
                "type": "captions",
                # Spot-the-Diff style: one images entry per record, so ids repeat; annotations interleave.
                "images": [{"id": "256.png"}, {"id": "5406.png"}, {"id": "256.png"}],
                "annotations": [
                    {"image_id": "256.png", "caption": "person with umbrella is gone", "id": 0},
                    {"image_id": "5406.png", "caption": "truck left", "id": 1},
                    {"image_id": "256.png", "caption": "car up at top is missing", "id": 2},
                ],
            }
        )
    )
    plain_refs = tmp_path / "refs.json"
    plain_refs.write_text(json.dumps(references))
    index = DatasetIndex(
        "spot_the_diff",
        tmp_path,
        "val",
        [
            ChangePair("256.png", Path("256.png"), Path("256_2.png"), captions=tuple(references["256.png"])),
            ChangePair("5406.png", Path("5406.png"), Path("5406_2.png"), captions=("truck left",)),
            ChangePair("8069", Path("8069.png"), Path("8069_2.png")),
        ],
    )
    from_index, without = references_from_index(index)
    assert load_references(coco_refs) == load_references(plain_refs) == from_index == references
    assert without == ["8069"] and groups_from_index(index) == {}


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("broken.json", '[{"image_id": 1, ', "malformed JSON"),
        ("number.json", "42", "expected a list"),
        ("nocaption.json", '[{"image_id": "1"}]', "entry 0 (id '1'): has no \"caption\""),
        ("noid.json", '[{"caption": "x"}]', "entry 0: has no id"),
        ("twice.json", '[{"image_id": "1", "caption": "x"}, {"image_id": "1", "caption": "y"}]', "more than one"),
        ("bad.jsonl", '{"id": "1", "caption": "x"}\nnot json\n', "line 2"),
        ("nullcaption.jsonl", '{"id": "1", "caption": null}\n', "caption must be a string"),
    ],
)
def test_malformed_prediction_files_name_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=re.escape(message)) as error:
        load_predictions(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("load, what", [(load_predictions, "predictions"), (load_references, "references")])
def test_a_missing_scoring_file_is_named_for_what_it_is(tmp_path, load, what):
    """A mistyped --predictions or --references path was reported as a missing "annotation file", which sent the
    user to look at the dataset; a folder given for the file got the same line."""
    with pytest.raises(DataError, match=re.escape(f"{what} file is missing: {tmp_path / 'typo.json'}")):
        load(tmp_path / "typo.json")
    with pytest.raises(DataError, match=re.escape(f"{what} file {tmp_path} is a folder; give the file itself")):
        load(tmp_path)


@pytest.mark.parametrize(
    "content, message",
    [
        ({"1": []}, "id '1': has an empty reference list"),
        ({"1": "one caption"}, "expected a list of reference captions"),
        (
            {"images": [{"id": "2"}], "annotations": [{"image_id": "1", "caption": "x"}]},
            "image id '2' has no annotation",
        ),
        ({"annotations": [{"image_id": "1"}]}, "annotation 0"),
        ([["x"]], "expected a COCO captions file"),
    ],
)
def test_malformed_reference_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(content))
    with pytest.raises(DataError, match=re.escape(message)) as error:
        load_references(path)
    assert str(path) in str(error.value)


def test_evaluate_cli_on_the_shared_example(tmp_path):
    out, markdown = tmp_path / "metrics.json", tmp_path / "table.md"
    completed = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            "--predictions",
            str(SPOT_PREDICTIONS),
            "--references",
            str(SPOT_REFERENCES),
            "--metrics",
            "BLEU,ROUGE_L,CIDEr",
            "--no-spice",
            "--out",
            str(out),
            "--markdown",
            str(markdown),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "| total | 35.1 | 23.2 | 15.2 | 9.6 | 30.5 | 29.5 | n/a | 1489 |" in completed.stdout
    assert markdown.read_text() == completed.stdout
    document = json.loads(out.read_text())
    total = document["rows"]["total"]
    official = from_coco_names(json.loads(SPOT_EXPECTED.read_text())["computed_here"])
    for name in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE_L", "CIDEr"):
        assert abs(total["metrics"][name] - official[name]) <= 5e-4
    assert total["metrics"]["SPICE"] is None and "METEOR" not in total["metrics"]
    assert total["notes"] == ["SPICE not computed (disabled)"] and total["bleu_stats"]["correct"] == [
        5283,
        2030,
        746,
        226,
    ]
    assert total["num_pairs"] == 1489 and len(total["per_image"]["CIDEr"]) == 1489
    assert document["predictions"] == str(SPOT_PREDICTIONS) and document["references"]["file"] == str(SPOT_REFERENCES)
    assert document["references"]["official_protocol"]["name"] == "spot_the_diff val"


def load_evaluate_module():
    spec = importlib.util.spec_from_file_location("davir_evaluate_cli", REPO / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_cli_per_type_table_through_the_data_layer(tmp_path, capsys, two_pair_clevr_change):
    root = two_pair_clevr_change
    predictions = tmp_path / "total_results.json"
    predictions.write_text(
        json.dumps(
            [
                {"image_id": "000001.png", "caption": "the red cube became blue"},
                {"image_id": "008001.png", "caption": "the metal ball became rubber"},
                {"image_id": "000001.png_n", "caption": "the scene remains the same"},
                {"image_id": "008001.png_n", "caption": "the scene remains the same"},
            ]
        )
    )
    evaluate = load_evaluate_module()
    out = tmp_path / "metrics.json"
    code = evaluate.main(
        [
            "--predictions",
            str(predictions),
            "--format",
            "clevr_change",
            "--root",
            str(root),
            "--split",
            "test",
            "--metrics",
            "BLEU",
            "--no-spice",
            "--strict",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "| change type | BLEU-1 |" in printed
    for row in ("| color | 100.0 |", "| material | 100.0 |", "| semantic | 100.0 |", "| total |", "| distractor |"):
        assert row in printed
    document = json.loads(out.read_text())
    assert list(document["rows"]) == ["color", "material", "distractor", "semantic", "total"]
    assert document["references"]["format"] == "clevr_change"

    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert evaluate.main(["--predictions", str(broken), "--references", str(SPOT_REFERENCES)]) == 2
    assert f"error: {broken}: malformed JSON" in capsys.readouterr().err


def test_an_empty_split_is_named_as_empty_not_sent_looking_for_caption_files():
    """A small folder's seeded split can hold no pair: the error says so, where a split of uncaptioned pairs points
    at the caption files; both for the plain references and the evaluation protocol's."""
    from davir.metrics.protocols import references_for_evaluation

    empty = DatasetIndex("folder", Path("mine"), "test", [])
    uncaptioned = DatasetIndex("folder", Path("mine"), "test", [clevr_pair("000001.png", "color", ())])
    for read in (references_from_index, references_for_evaluation):
        with pytest.raises(DataError, match=r"folder test at mine: the split holds no pairs, nothing to score"):
            read(empty)
        with pytest.raises(DataError, match=r"no pair has reference captions, .*are the caption files in place"):
            read(uncaptioned)


def test_prediction_and_reference_files_saved_with_a_byte_order_mark_read_as_without(tmp_path):
    """Notepad and PowerShell write UTF-8 with a byte order mark: the same predictions and references, with and
    without it, are the same data (JSON and JSON Lines)."""
    predictions = [{"image_id": "1", "caption": "the cube turned red"}]
    references = {"1": ["the cube became red"]}
    for name, text in (
        ("p.json", json.dumps(predictions)),
        ("p.jsonl", json.dumps(predictions[0]) + "\n"),
        ("r.json", json.dumps(references)),
    ):
        (tmp_path / name).write_text(text, encoding="utf-8-sig")
    assert (
        load_predictions(tmp_path / "p.json") == load_predictions(tmp_path / "p.jsonl") == {"1": "the cube turned red"}
    )
    assert load_references(tmp_path / "r.json") == references
