"""The Python API of captioning and evaluation, with no command line: caption_folder, evaluate_run, typed options,
and the one captioning path shared by caption.py, evaluate.py --checkpoint and ChangeCaptioner."""

import json
from pathlib import Path

import pytest

from davir.data.formats import read_dataset
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.evaluation import EvaluationOptions, ReferenceSource, evaluate_run, score_predictions
from davir.inference import CaptionerOptions, ChangeCaptioner, caption_folder
from davir.metrics import load_predictions
from tests.test_caption import pair_folder, rows_of, trained  # noqa: F401 - `trained`: the tiny DAVIR run fixture

# What differs between two evaluations of the same run: the time and memory captioning took.
RUN_DEPENDENT = ("wall_s", "pairs_per_s", "peak_memory_mb")


def without_timing(metrics: dict) -> dict:
    metrics = json.loads(json.dumps(metrics))
    for key in RUN_DEPENDENT:
        metrics["compute"]["captioning"].pop(key)
    return metrics


def test_caption_folder_from_python_with_a_checkpoint_a_captioner_or_records(trained, tmp_path, capsys):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 3)
    summary = caption_folder(
        trained / "runs" / "tiny", pairs, workers=0, progress=False, options=CaptionerOptions(device="cpu")
    )
    out = pairs / "captions.jsonl"  # the default: beside the pairs
    assert (summary.status, summary.out, summary.captioned, summary.failed, summary.this_run) == (0, out, 3, 0, 3)
    rows = rows_of(out)
    assert [r["id"] for r in rows] == ["p00", "p01", "p02"] and all(r["caption"] and r["error"] is None for r in rows)
    assert summary.html.is_file() and "captioned 3 pair(s), 0 not captioned" in capsys.readouterr().out

    # a loaded captioner and ChangePair records (one of them unreadable) give the same rows, that one failed
    captioner = ChangeCaptioner.from_pretrained(trained / "runs" / "tiny", device="cpu")
    records = [
        ChangePair(f"p{i:02d}", pairs / "before" / f"p{i:02d}.png", pairs / "after" / f"p{i:02d}.png") for i in range(3)
    ] + [ChangePair("gone", pairs / "before" / "gone.png", pairs / "after" / "p00.png")]
    again = caption_folder(captioner, records, tmp_path / "records.jsonl", workers=0, progress=False)
    assert (again.status, again.captioned, again.failed) == (1, 3, 1)  # 1: done, a pair failed and is listed
    by_id = {r["id"]: r for r in rows_of(tmp_path / "records.jsonl")}
    assert [by_id[r["id"]]["caption"] for r in rows] == [r["caption"] for r in rows]
    assert "image file is missing" in by_id["gone"]["error"] and by_id["gone"]["caption"] is None
    with pytest.raises(DataError, match="give `out`"):
        caption_folder(captioner, records)


def test_unknown_options_are_a_type_error_naming_them_and_the_valid_ones(tmp_path):
    with pytest.raises(TypeError) as caught:
        ChangeCaptioner.from_pretrained(tmp_path, num_beam=3)  # checked before anything is read
    assert "'num_beam'" in str(caught.value) and "num_beams" in str(caught.value) and "masks_from" in str(caught.value)
    with pytest.raises(TypeError, match=r"'beams'.*valid: .*batch_size"):
        evaluate_run(tmp_path, "test", beams=2)


def test_evaluate_run_writes_what_evaluate_py_writes(trained, tmp_path, capsys):
    from davir.cli import evaluate as evaluate_script

    run = trained / "runs" / "tiny"
    assert (
        evaluate_script.main(
            [
                "--checkpoint",
                str(run),
                "--split",
                "train",
                "--limit",
                "3",
                "--no-spice",
                "--metrics",
                "BLEU,CIDEr",
                "--out",
                str(tmp_path / "cli.json"),
            ]
        )
        == 0
    )
    cli_err = capsys.readouterr().err
    result = evaluate_run(
        run,
        "train",
        limit=3,
        spice=False,
        metrics=("BLEU", "CIDEr"),
        out=tmp_path / "api.json",
        echo=False,
        progress=False,
    )
    assert capsys.readouterr().out == ""  # echo=False: nothing printed
    written = json.loads((tmp_path / "cli.json").read_text())
    assert without_timing(result.metrics) == without_timing(written)
    assert json.loads((tmp_path / "api.json").read_text()) == result.metrics
    assert result.metrics["rows"]["total"]["num_pairs"] == 3 and written["limit"] == 3
    assert result.predictions == load_predictions(result.predictions_file) and len(result.predictions) == 3
    assert result.failed == {} and result.out_dir == run / "eval" / "clevr_change_train-limit3"
    assert result.decoding == written["decoding"] and f"decoding: num_beams={result.decoding['num_beams']}" in cli_err

    # the same numbers from score_predictions on the written predictions (what evaluate.py --predictions runs)
    scored = score_predictions(
        result.predictions,
        ReferenceSource.dataset("clevr_change", trained / "data", "train"),
        metrics=("BLEU", "CIDEr"),
        spice=False,
    )
    assert scored.metrics["rows"] == written["rows"] and scored.out is None
    assert scored.total.metrics["CIDEr"] == written["rows"]["total"]["metrics"]["CIDEr"]


def test_evaluate_and_the_api_caption_a_pair_alike(trained, tmp_path):
    """One captioning path: the split's pair captioned by evaluate_run (its caches as sources, batches of the
    split) and by ChangeCaptioner.caption on its two image files give one caption."""
    run = trained / "runs" / "tiny"
    result = evaluate_run(
        run,
        "train",
        EvaluationOptions(
            limit=4,
            batch_size=2,
            spice=False,
            metrics=("BLEU",),
            out=tmp_path / "m.json",
            markdown=tmp_path / "m.md",
            echo=False,
            progress=False,
        ),
    )
    pairs = read_dataset("clevr_change", trained / "data", "train").pairs[:4]
    captioner = ChangeCaptioner.from_pretrained(run, CaptionerOptions(device="cpu"))
    for pair in (pairs[0], pairs[3]):
        assert captioner.caption(Path(pair.before), Path(pair.after)).caption == result.predictions[pair.pair_id]
    records = captioner.caption_records(pairs, batch_size=3)
    assert [r.caption for r in records] == [result.predictions[p.pair_id] for p in pairs]
