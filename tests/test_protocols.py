"""Official evaluation protocols: scoring through a reader equals scoring against the official file.

Each benchmark split with an official reference file in ../shared/datasets is scored twice with the
same predictions, as a user would (`evaluate.py --format/--root/--split` and `evaluate.py --references`),
and the two must agree to 1e-9. Spot-the-Diff test (its raw test.json is held out of ../shared) is
checked on a stand-in built the way the official code builds its file.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import evaluate
from davir.data import read_dataset
from davir.metrics import canonical_id, load_references, references_from_index, score_captions
from davir.metrics.protocols import (
    PROTOCOLS,
    lavis_pre_caption,
    load_reference_file,
    official_protocol_of,
    reference_fingerprint,
    references_for_evaluation,
)

SCORES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE_L", "CIDEr")


def canonical(references: dict[str, list[str]]) -> dict[str, list[str]]:
    return {canonical_id(k): v for k, v in references.items()}


# METEOR's java start (paraphrase table) costs ~10 s a run, and the real Spot-the-Diff val predictions are
# already scored with every metric against the official file in tests/test_metrics.py: here every check uses
# the tokenizer-only metrics, next to an equality of the reference sentences themselves (which is what makes
# METEOR equal too).
FAST = ("--metrics", "BLEU,ROUGE_L,CIDEr")


def run_evaluate(tmp_path: Path, name: str, predictions: Path, *reference_args: str) -> dict:
    out = tmp_path / f"{name}.json"
    status = evaluate.main(["--predictions", str(predictions), *reference_args, "--no-spice", "--out", str(out)])
    assert status == 0
    return json.loads(out.read_text())


def scores_of(document: dict) -> tuple[dict, int, int]:
    total = document["rows"]["total"]
    return total["metrics"], total["num_pairs"], total["num_references"]


def assert_same_scores(a: dict, b: dict) -> None:
    (metrics_a, pairs_a, refs_a), (metrics_b, pairs_b, refs_b) = scores_of(a), scores_of(b)
    assert (pairs_a, refs_a) == (pairs_b, refs_b)
    assert set(metrics_a) == set(metrics_b)
    for name in (name for name in SCORES if name in metrics_a):
        assert metrics_a[name] == pytest.approx(metrics_b[name], abs=1e-9), name


# --- Spot-the-Diff val (FINER-MLLM's filtered references) ------------------------------------------


def test_spot_the_diff_val_reader_equals_official_file(shared_datasets, tmp_path):
    root = shared_datasets / "spot_the_diff"
    official_file = root / "spot_val_change_captions_reformat.json"
    official = load_references(official_file)
    chosen = references_for_evaluation(read_dataset("spot_the_diff", root, "val"))
    # Pair for pair and sentence for sentence (the file's order of ids aside).
    assert canonical(chosen.references) == canonical(official)
    assert (len(chosen.references), sum(map(len, chosen.references.values()))) == (1489, 3293)
    assert chosen.without == ["8069", "13818", "13882", "14542"]
    # The training captions are not the official references (15 pairs differ: 32-word truncation,
    # list markers "1", "2", ...), so the protocol is what makes the two agree.
    cleaned, _ = references_from_index(read_dataset("spot_the_diff", root, "val"))
    assert sum(cleaned[k] != v for k, v in chosen.references.items()) == 15

    predictions = root / "eval_example_val" / "ssgpa_spot_val_total_captions.json"
    through_reader = run_evaluate(
        tmp_path, "reader", predictions, "--format", "spot_the_diff", "--root", str(root), "--split", "val", *FAST
    )
    through_file = run_evaluate(tmp_path, "file", predictions, "--references", str(official_file), *FAST)
    assert_same_scores(through_reader, through_file)
    expected = json.loads((root / "eval_example_val" / "expected_scores.json").read_text())["computed_here"]
    assert through_reader["rows"]["total"]["metrics"]["CIDEr"] == pytest.approx(expected["CIDEr"], abs=1e-9)
    assert through_reader["references"]["protocol"]["name"] == "spot_the_diff val"
    assert through_file["references"]["official_protocol"]["name"] == "spot_the_diff val"


# --- IER val (FINER-MLLM's references went through LAVIS pre_caption) -------------------------------


def test_ier_val_reader_equals_official_file(shared_datasets, tmp_path):
    root = shared_datasets / "ier"
    official_file = root / "IER_val_change_captions_reformat.json"
    index = read_dataset("ier", root, "val")
    chosen = references_for_evaluation(index)
    assert canonical(chosen.references) == canonical(load_references(official_file))
    cleaned, _ = references_from_index(index)
    assert sum(a != b for k in cleaned for a, b in zip(cleaned[k], chosen.references[k])) == 611  # of 1,149

    # Predictions that tell the two reference sets apart: each pair's own raw sentence with the most
    # punctuation (quotes, "j. trump", "inc." as the annotator wrote them).
    predictions = {
        pair.pair_id: max(pair.source_captions, key=lambda s: sum(not c.isalnum() and c != " " for c in s))
        for pair in index
    }
    predictions_file = tmp_path / "ier_val_predictions.json"
    predictions_file.write_text(json.dumps(predictions))
    through_reader = run_evaluate(
        tmp_path, "reader", predictions_file, "--format", "ier", "--root", str(root), "--split", "val", *FAST
    )
    through_file = run_evaluate(tmp_path, "file", predictions_file, "--references", str(official_file), *FAST)
    assert_same_scores(through_reader, through_file)
    assert scores_of(through_reader)[1:] == (383, 1149)
    # The training captions score differently (BLEU-4 1.0 vs 0.998): the protocol matters here.
    cleaned_scores = score_captions(predictions, cleaned, metrics=["BLEU", "CIDEr"], spice=False).metrics
    assert cleaned_scores["BLEU-4"] - scores_of(through_file)[0]["BLEU-4"] > 1e-3


def test_lavis_pre_caption_examples():
    assert (
        lavis_pre_caption('Change the word "TRUMP" to "JUMP", remove "MAKE AMERICA GREAT AGAIN!"')
        == "change the word trump to jump , remove make america great again"
    )
    assert lavis_pre_caption("Inc.  of J. Trump ") == "inc of j trump"
    assert lavis_pre_caption(" ".join(map(str, range(40))), 32) == " ".join(map(str, range(32)))


# --- Spot-the-Diff test: empty references are part of the official protocol ------------------------


def official_coco_file(records: list[dict], path: Path) -> Path:
    """The official reference file as FINER-MLLM's `preprocess/eval_utils.py::coco_gt_format_save`
    writes it from the raw records: one image entry per record, every sentence verbatim."""
    images, annotations = [], []
    for record in records:
        image_id = f"{record['img_id']}.png"
        images.append({"filename": image_id, "id": image_id})
        for caption in record["sentences"]:
            annotations.append({"caption": caption, "id": len(annotations), "image_id": image_id})
    path.write_text(
        json.dumps({"info": {}, "licenses": {}, "type": "captions", "images": images, "annotations": annotations})
    )
    return path


def test_spot_the_diff_test_protocol_keeps_empty_references(shared_datasets, tmp_path):
    """The raw val records laid out as a test split (they hold 6 empty sentences, 4 pairs with nothing
    else): through the reader, test is scored like the official file, empty references included."""
    records = json.loads((shared_datasets / "spot_the_diff" / "annotations" / "val.json").read_text())
    root = tmp_path / "spot"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "test.json").write_text(json.dumps(records))
    official_file = official_coco_file(records, tmp_path / "spot_test_reformat.json")

    chosen = references_for_evaluation(read_dataset("spot_the_diff", root, "test"))
    assert canonical(chosen.references) == canonical(load_references(official_file))
    assert (len(chosen.references), sum(map(len, chosen.references.values()))) == (1493, 3310)
    assert chosen.source["empty_references"]["sentences"] == 6
    assert chosen.without == []

    predictions = {
        pair_id: "the car is gone" if n % 3 else captions[-1]
        for n, (pair_id, captions) in enumerate(chosen.references.items())
    }
    predictions_file = tmp_path / "predictions.json"
    predictions_file.write_text(json.dumps(predictions))
    # This stand-in is no published file, so keeping its empty references is asked for explicitly.
    through_reader = run_evaluate(
        tmp_path, "reader", predictions_file, "--format", "spot_the_diff", "--root", str(root), "--split", "test", *FAST
    )
    through_file = run_evaluate(
        tmp_path, "file", predictions_file, "--references", str(official_file), "--empty-references", "keep", *FAST
    )
    assert_same_scores(through_reader, through_file)
    assert scores_of(through_reader)[1:] == (1493, 3310)


def test_official_files_are_recognised_by_content(shared_datasets, tmp_path):
    official_file = shared_datasets / "spot_the_diff" / "spot_val_change_captions_reformat.json"
    references = load_references(official_file)
    assert official_protocol_of(references) is PROTOCOLS[("spot_the_diff", "val")]
    # Another serialisation of the same file ({id: [captions]}, ids without ".png", reversed) is the same file.
    other = {k.removesuffix(".png"): list(reversed(v)) for k, v in reversed(list(references.items()))}
    assert reference_fingerprint(other) == PROTOCOLS[("spot_the_diff", "val")].fingerprint
    first = next(iter(other))
    other[first] = other[first][:-1] + [other[first][-1] + " again"]
    assert official_protocol_of(other) is None
    ier = load_references(shared_datasets / "ier" / "IER_val_change_captions_reformat.json")
    assert official_protocol_of(ier) is PROTOCOLS[("ier", "val")]
    assert Counter(p.format for p in PROTOCOLS.values()) == {"spot_the_diff": 2, "ier": 2}


# --- 18.18: empty references in a user's references file -------------------------------------------


def test_empty_references_in_a_users_file_are_skipped_counted_and_reported(tmp_path, capsys):
    references = tmp_path / "refs.json"
    references.write_text(
        json.dumps(
            {
                "1": ["a red car is gone", "the red car left"],
                "2": ["", "  "],  # nothing to score against
                "3": ["a man appears", ""],  # one empty sentence among real ones
            }
        )
    )
    predictions = tmp_path / "preds.json"
    predictions.write_text(json.dumps({"1": "the red car is gone", "2": "a man appears", "3": "a man appears"}))
    out = tmp_path / "metrics.json"
    status = evaluate.main(
        [
            "--predictions",
            str(predictions),
            "--references",
            str(references),
            "--metrics",
            "BLEU,CIDEr",
            "--no-spice",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes[0] == (
        f"note: {references}: 3 empty reference sentence(s) skipped (not an official reference file); "
        "1 pair(s) left without references are not scored ('2')"
    )
    document = json.loads(out.read_text())
    assert document["references"]["empty_references"] == {
        "policy": "skipped (not an official reference file)",
        "sentences": 3,
        "pairs_with_only_empty": {"count": 1, "examples": ["2"]},
    }
    total = document["rows"]["total"]
    assert (total["num_pairs"], total["num_references"]) == (2, 3)
    assert total["mismatch"]["predictions_without_reference"]["examples"] == ["2"]

    # --empty-references keep scores them as coco-caption would: pair 2 joins with CIDEr 0.
    kept = load_reference_file(references, empty="keep")
    assert kept.references["2"] == ["", "  "] and kept.without == []
    assert "2 pair" not in kept.notes[0] and "kept (--empty-references keep)" in kept.notes[0]


def test_only_empty_references_is_an_error_naming_the_file(tmp_path, capsys):
    references = tmp_path / "refs.json"
    references.write_text(json.dumps({"1": [""], "2": [" "]}))
    predictions = tmp_path / "preds.json"
    predictions.write_text(json.dumps({"1": "x", "2": "y"}))
    assert evaluate.main(["--predictions", str(predictions), "--references", str(references), "--no-spice"]) == 2
    assert (
        capsys.readouterr().err.splitlines()[0]
        == f"error: {references}: every reference sentence is empty, nothing to score"
    )


def test_empty_references_policy_with_a_dataset_split_is_a_usage_error(tmp_path, capsys):
    """--empty-references keep|skip with --format/--root (or --checkpoint) was silently ignored: the split is scored
    under its protocol whatever the flag says. A usage error now, before anything is read or written; `auto`, the
    rule the split follows, is accepted."""
    from PIL import Image

    for name in ("a", "b"):
        Image.new("RGB", (8, 6), (1, 2, 3) if name == "a" else (4, 5, 6)).save(tmp_path / f"{name}.png")
    (tmp_path / "pairs.csv").write_text("id,before,after,caption,split\nx,a.png,b.png,a cup appeared,test\n")
    predictions = tmp_path / "preds.json"
    predictions.write_text(json.dumps({"x": "a cup appeared"}))
    out = tmp_path / "metrics.json"
    dataset = ["--format", "folder", "--root", str(tmp_path), "--split", "test"]
    for source, name in (
        (["--predictions", str(predictions), *dataset], "--format/--root"),
        (["--checkpoint", str(tmp_path / "no_run")], "--checkpoint"),
    ):
        for policy in ("keep", "skip"):
            with pytest.raises(SystemExit) as stopped:
                evaluate.main([*source, "--empty-references", policy, "--no-spice", "--out", str(out)])
            assert stopped.value.code == 2
            assert capsys.readouterr().err.splitlines()[-1] == (
                f"evaluate.py: error: --empty-references {policy} applies to a --references file only; the dataset "
                f"split of {name} is scored under its protocol (empty sentences as its official reference file has "
                "them, else skipped: auto's rule)"
            )
            assert not out.exists()
    document = run_evaluate(tmp_path, "auto", predictions, *dataset, "--empty-references", "auto", *FAST)
    assert document["references"]["empty_references"]["policy"] == "skipped"


def test_flags_of_generating_predictions_with_a_predictions_file_are_a_usage_error(tmp_path, capsys):
    """--limit, --batch-size, --num-beams … with --predictions were silently ignored (the file was scored whole, as
    it is); a usage error now, naming them, before anything is read or written."""
    predictions = tmp_path / "preds.json"
    predictions.write_text(json.dumps({"x": "a cup appeared"}))
    references = tmp_path / "refs.json"
    references.write_text(json.dumps({"x": ["a cup appeared"]}))
    out = tmp_path / "metrics.json"
    base = ["--predictions", str(predictions), "--references", str(references), "--no-spice", "--out", str(out)]
    for extra, named in (
        (["--limit", "1"], "--limit applies"),
        (
            ["--batch-size", "4", "--num-beams", "3", "--masks", str(tmp_path)],
            "--masks, --batch-size, --num-beams apply",
        ),
    ):
        with pytest.raises(SystemExit) as stopped:
            evaluate.main(base + extra)
        assert stopped.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"evaluate.py: error: {named} to generating predictions with --checkpoint; --predictions scores a file "
            "of captions as it is"
        )
        assert not out.exists()
