"""Stated-difference faithfulness (davir.text.differences, davir.metrics.faithfulness): the reader on the
generator's own sentences, P/R/F1 against hand-computed counts, evaluate.py's block, and the check that its
object F1 ranks the repository's runs as the exact object accuracy does."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from davir.data.synthetic import (
    CHANGE_TEMPLATES,
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
)
from davir.metrics.faithfulness import format_faithfulness_table, score_faithfulness
from davir.text.differences import SYNONYMS, ChangeObject, Difference, DifferenceReader
from davir.text.extractors import get_extractor

# The reader chunks with the WordNet lexicon shipped with davir (davir/text/data), on every machine.
REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "faithfulness_runs.json.gz"
KIND_OF_TYPE = {"color": "attribute", "material": "attribute", "add": "added", "drop": "removed", "move": "moved"}


@pytest.fixture(scope="module")
def reader():
    return DifferenceReader(get_extractor("wordnet"))


def test_every_generator_sentence_reads_back_as_its_change(reader):
    """All 17 change templates × objects written with every synonym: the kind of the template's type and the
    object in canonical spelling; the 5 no-change sentences say no change."""
    objects = [
        ("tiny", "red", "shiny", "ball"),
        ("large", "cyan", "matte", "cylinder"),
        ("big", "gray", "metallic", "block"),
    ]
    for change_type, templates in CHANGE_TEMPLATES.items():
        for template in templates:
            for words in objects:
                statement = reader.read(template.format(obj=" ".join(words), new="blue"))
                canonical = [SYNONYMS.get(w, w) for w in words]
                assert statement.differences == (
                    Difference(KIND_OF_TYPE[change_type], ChangeObject(canonical[-1], frozenset(canonical[:-1]))),
                ), template
                assert not statement.no_change
    for sentence in NO_CHANGE_CAPTIONS:
        assert reader.read(sentence).no_change and reader.read(sentence).differences == (), sentence


def test_synonyms_cover_the_generators_word_tables():
    for table in (SIZE_WORDS, COLOR_WORDS, MATERIAL_WORDS, SHAPE_WORDS):
        for canonical, words in table.items():
            assert {SYNONYMS.get(word, word) for word in words} == {canonical}


@pytest.mark.parametrize(
    "caption, expected",
    [
        (
            "the white car in the lower left corner is gone and a man appeared",
            [("removed", "car", {"white"}), ("added", "person", set())],
        ),
        ("there is a blue truck in the parking lot", [(None, "truck", {"blue"})]),
        ("there are more people on the sidewalk", [("added", "person", set())]),
        ("a large group of people has moved", [("moved", "person", set())]),  # the people, not the group
        ("someone walked away", [("removed", "person", set())]),
        ("the sphere changed its location", [("moved", "sphere", set())]),  # not an attribute change
    ],
)
def test_clauses_kinds_and_objects_of_real_style_captions(reader, caption, expected):
    statement = reader.read(caption)
    assert [(d.kind, d.object.head, set(d.object.modifiers)) for d in statement.differences] == expected
    assert not statement.no_change


def test_no_change_needs_a_cue_and_no_object(reader):
    assert reader.read("nothing has changed").no_change  # its "changed" is no attribute change
    assert reader.read("there is no difference").no_change
    assert reader.read("the car is the same").differences == () and not reader.read("the car is the same").no_change
    assert not reader.read("the scene").no_change  # no cue: states nothing either way


def test_precision_recall_f1_by_hand(reader):
    references = {
        "a": ["the small red cube is gone", "the tiny red block is missing"],  # one object: cube {small, red}
        "b": ["the big blue sphere moved", "the large blue ball has been moved"],
        "c": ["nothing has changed", "there is no change"],
        "d": ["nothing has changed", "there is no change"],
        "e": ["the red car is gone and a man appeared"],  # two objects: car {red}, person
    }
    predictions = {
        "a": "the small red cube is gone",  # supported, recalled
        "b": "the large green sphere moved",  # green is no modifier of any reference's sphere: hallucinated
        "c": "a small cyan cylinder has appeared",  # a change stated on a no-change pair: hallucinated
        "d": "the scene remains the same",  # right: no change
        "e": "the car is gone",  # supported (no modifier to contradict); the man not recalled
    }
    groups = {"a": "drop", "b": "move", "c": "distractor", "d": "distractor"}  # e: no group, total only
    scores = score_faithfulness(predictions, references, groups, reader=reader)
    total = scores["rows"]["total"]
    # objects: stated 1+1+1+0+1 = 4, supported 1+0+0+0+1 = 2; referenced 1+1+0+0+2 = 4, recalled 1+0+0+0+1 = 2
    assert {k: total["objects"][k] for k in ("stated", "supported", "referenced", "recalled")} == {
        "stated": 4,
        "supported": 2,
        "referenced": 4,
        "recalled": 2,
    }
    assert (total["objects"]["precision"], total["objects"]["recall"], total["objects"]["f1"]) == (0.5, 0.5, 0.5)
    assert total["hallucination_rate"] == 0.5
    # kinds: a {removed}/{removed}, b {moved}/{moved}, c {added}/{}, e {removed}/{removed, added}:
    # stated 4, supported 3, referenced 4, recalled 3
    assert (total["kinds"]["precision"], total["kinds"]["recall"], total["kinds"]["f1"]) == (0.75, 0.75, 0.75)
    # differences (kind and object): a right, b wrong object, c wrong, e right of 2 → 2/4 and 2/4
    assert (total["differences"]["precision"], total["differences"]["recall"]) == (0.5, 0.5)
    assert total["no_change"] == {"pairs": 2, "accuracy": 0.5}  # c wrong, d right
    assert list(scores["rows"]) == ["drop", "move", "distractor", "total"]
    assert scores["rows"]["drop"]["objects"]["f1"] == 1.0 and scores["rows"]["move"]["objects"]["f1"] == 0.0
    distractor = scores["rows"]["distractor"]
    assert distractor["hallucination_rate"] == 1.0 and distractor["objects"]["recall"] is None
    table = format_faithfulness_table(scores)
    assert "| total | 5 | 50.0 | 50.0 | 50.0 | 50.0 | 75.0 | 50.0 | 50.0 (2) |" in table
    assert "| distractor | 2 | 0.0 | — | — | 100.0 | — | — | 50.0 (2) |" in table


def test_no_change_pairs_without_groups_follow_most_references(reader):
    references = {"1": ["there is no change", "nothing has changed", "a car is gone"], "2": ["a car is gone"]}
    scores = score_faithfulness({"1": "there is no change", "2": "there is no change"}, references, reader=reader)
    assert scores["rows"]["total"]["no_change"] == {"pairs": 1, "accuracy": 1.0}  # pair 1: 2 of 3 say no change
    assert scores["rows"]["total"]["objects"]["recall"] == 0.0  # both cars missed


def test_object_f1_ranks_the_runs_as_exact_object_accuracy_does(reader):
    """Issue 33: over the runs on the built-in set (tests/fixtures, made by bench/faithfulness_fixture.py from
    runs/: every method and seed), Spearman(object F1, exact object accuracy) ≥ 0.8."""
    from scipy.stats import spearmanr

    fixture = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    assert len(fixture["runs"]) >= 15
    f1, accuracy = [], []
    for run in fixture["runs"]:
        data = fixture["datasets"][run["dataset"]]
        scores = score_faithfulness(run["captions"], data["references"], data["groups"], reader=reader)
        f1.append(scores["rows"]["total"]["objects"]["f1"])
        accuracy.append(run["object_accuracy"])
    rho = spearmanr(f1, accuracy).statistic
    assert rho >= 0.8, (rho, list(zip(accuracy, f1)))


def test_evaluate_prints_and_writes_the_faithfulness_block(tmp_path, capsys, two_pair_clevr_change):
    from davir.cli import evaluate

    root = two_pair_clevr_change
    predictions = tmp_path / "predictions.json"
    predictions.write_text(
        json.dumps(
            [
                {"image_id": "000001.png", "caption": "the red cube became blue"},
                {"image_id": "008001.png", "caption": "the metal sphere became rubber"},  # ball = sphere
                {"image_id": "000001.png_n", "caption": "the scene remains the same"},
                {"image_id": "008001.png_n", "caption": "a red cube has appeared"},
            ]
        )
    )  # hallucinated
    out = tmp_path / "metrics.json"
    assert (
        evaluate.main(
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
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    # objects: stated 3, supported 2 (P 66.7), referenced 2, recalled 2 (R 100) → F1 80.0; no-change 1 of 2
    assert "| total | 4 | 66.7 | 100.0 | 80.0 | 33.3 | 80.0 | 80.0 | 50.0 (2) |" in printed
    assert "| color | 1 | 100.0 | 100.0 | 100.0 | 0.0 | 100.0 | 100.0 | — |" in printed
    document = json.loads(out.read_text())
    assert document["faithfulness"]["rows"]["total"]["objects"]["f1"] == pytest.approx(0.8)
    assert document["faithfulness"]["rows"]["distractor"]["no_change"] == {"pairs": 2, "accuracy": 0.5}
