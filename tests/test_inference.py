"""evaluate.py --checkpoint and caption.py on a tiny trained run; the localisation score by hand."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from davir.config import load_config
from davir.evaluation.localisation import attention_localisation, localisation_summary
from davir.inference import CaptionResult
from davir.runs.config import TrainConfig
from davir.runs.paths import resolve_model_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from davir.cli import caption as caption_script  # noqa: E402
from davir.cli import evaluate as evaluate_script  # noqa: E402
from davir.training import loop as train_script  # noqa: E402


def test_attention_localisation_by_hand():
    attention = np.array([[0.5, 0.1], [0.2, 0.2]])
    mask = np.zeros((4, 4), bool)
    mask[0:2, 0:2] = True  # exactly the top-left patch
    score = attention_localisation(attention, mask)
    assert score == {"share": pytest.approx(0.5), "pointing": 1.0, "uniform": 0.25}
    mask_small = np.zeros((4, 4), bool)
    mask_small[3, 3] = True  # a quarter of the bottom-right patch: counts as inside (>= 25 %)
    assert attention_localisation(attention, mask_small)["share"] == pytest.approx(0.2)
    assert attention_localisation(attention, np.zeros((4, 4), bool)) is None
    summary = localisation_summary(
        [CaptionResult("p", "c", attention_before=attention, attention_after=attention)],
        {"p": (mask, np.zeros((4, 4), bool))},
    )
    assert summary["images"] == 1 and summary["share_over_uniform"] == pytest.approx(2.0)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, synthetic_set):
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("inference")
    root = synthetic_set(30, 2)  # read only: shared with any test of this worker that asks for it
    config = load_config(
        TrainConfig,
        REPO / "configs" / "demo.yaml",
        [
            f"data.root={root}",
            "data.masks=null",
            "data.entities=null",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=false",
            "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
            "optim.batch_size=4",
            "optim.max_steps=2",
            "run.val_max_pairs=4",
            "run.tensorboard=false",
            f"run.output_dir={base / 'run'}",
        ],
    )
    train_script.train(config)
    return base / "run", root


def test_evaluate_checkpoint_writes_predictions_metrics_and_types(trained_run):
    run_dir, root = trained_run
    assert resolve_model_dir(run_dir).name in ("best", "last")
    status = evaluate_script.main(
        [
            "--checkpoint",
            str(run_dir),
            "--split",
            "test",
            "--limit",
            "6",
            "--metrics",
            "BLEU,CIDEr",
            "--no-spice",
            "--batch-size",
            "4",
        ]
    )
    assert status == 0
    out = run_dir / "eval" / "clevr_change_test-limit6"  # a --limit never replaces the full split's result
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 6
    metrics = json.loads((out / "metrics.json").read_text())
    assert "total" in json.dumps(metrics) and "distractor" in json.dumps(metrics)
    assert metrics["localisation"]["images"] > 0  # ground-truth masks of the synthetic set
    assert 0.0 <= metrics["localisation"]["attention_share_in_mask"] <= 1.0
    assert (out / "metrics.md").read_text().count("|") > 10


def test_evaluate_checkpoint_limit_is_one_or_more_pairs(trained_run, capsys):
    """`--limit 0` captioned and scored every pair (`if limit:`), where preprocess's --limit 0 made none; now it
    is a usage error in every command, and `--limit 1` captions exactly the split's first pair."""
    run_dir, root = trained_run
    argv = ["--checkpoint", str(run_dir), "--split", "test", "--metrics", "BLEU", "--no-spice", "--limit"]
    with pytest.raises(SystemExit) as stopped:
        evaluate_script.main([*argv, "0"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "evaluate.py: error: argument --limit: must be 1 or more, got 0; omit --limit for all pairs"
    )
    assert not (run_dir / "eval" / "clevr_change_test-limit0").exists()
    assert evaluate_script.main([*argv, "1"]) == 0
    from davir.data.formats import read_dataset

    predictions = json.loads((run_dir / "eval" / "clevr_change_test-limit1" / "predictions.json").read_text())
    assert [row["image_id"] for row in predictions] == [read_dataset("clevr_change", root, "test").pairs[0].pair_id]


def test_evaluate_checkpoint_records_cost_and_faithfulness(trained_run, capsys):
    """Issue 33: metrics.json holds the captioning cost beside the training cost (run_info.json) and the
    stated-difference faithfulness block is printed."""
    run_dir, _ = trained_run
    assert (
        evaluate_script.main(
            [
                "--checkpoint",
                str(run_dir),
                "--split",
                "test",
                "--limit",
                "4",
                "--metrics",
                "BLEU",
                "--no-spice",
                "--batch-size",
                "4",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "Stated-difference faithfulness" in captured.out and "| total | 4 |" in captured.out
    metrics = json.loads((run_dir / "eval" / "clevr_change_test-limit4" / "metrics.json").read_text())
    captioning, training = metrics["compute"]["captioning"], metrics["compute"]["training"]
    assert captioning["pairs"] == 4 and captioning["num_beams"] >= 1 and captioning["device"].startswith("cpu")
    parameters = captioning["parameters"]  # the tiny DAVIR model: LoRA trains a small part of it
    assert 0 < parameters["trainable"] < parameters["total"]
    info = json.loads((run_dir / "run_info.json").read_text())
    assert training == info["compute"] and training["optimizer_steps"] == 2 and training["pairs"] == 2 * 4
    assert "captioning: 4 pairs in" in captured.err
    assert metrics["faithfulness"]["rows"]["total"]["pairs"] == 4


def test_evaluate_on_another_root_keeps_the_runs_own_results(trained_run, tmp_path):
    """Issue 18 case 20: another --root (or a --limit) gets its own eval folder; the earlier result stays."""
    import hashlib
    import shutil

    run_dir, root = trained_run
    own = run_dir / "eval" / "clevr_change_test"
    own.mkdir(parents=True, exist_ok=True)
    (own / "metrics.json").write_text('{"earlier": "300 pairs"}\n')
    other = shutil.copytree(root, tmp_path / "moved_copy")
    status = evaluate_script.main(
        [
            "--checkpoint",
            str(run_dir),
            "--root",
            str(other),
            "--split",
            "test",
            "--limit",
            "2",
            "--metrics",
            "BLEU",
            "--no-spice",
            "--batch-size",
            "2",
        ]
    )
    assert status == 0
    digest = hashlib.sha1(str(other.resolve()).encode()).hexdigest()[:8]
    out = run_dir / "eval" / f"clevr_change_test-moved_copy-{digest}-limit2"
    assert len(json.loads((out / "predictions.json").read_text())) == 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["limit"] == 2 and metrics["references"]["root"] == str(other)
    assert (own / "metrics.json").read_text() == '{"earlier": "300 pairs"}\n'


def test_caption_folder_reports_bad_pairs_and_captions_the_rest(trained_run, tmp_path):
    run_dir, root = trained_run
    pairs = tmp_path / "pairs"
    (pairs / "before").mkdir(parents=True)
    (pairs / "after").mkdir()
    source = sorted((root / "images").iterdir())[:2]
    for i, path in enumerate(source):
        Image.open(path).save(pairs / "before" / f"ok{i}.png")
        Image.open(root / "sc_images" / path.name.replace("default", "semantic")).save(pairs / "after" / f"ok{i}.png")
    (pairs / "before" / "corrupt.png").write_bytes(b"not a png")
    Image.new("RGB", (96, 72)).save(pairs / "after" / "corrupt.png")
    Image.new("RGB", (50, 40)).save(pairs / "before" / "mismatch.png")
    Image.new("RGB", (96, 72)).save(pairs / "after" / "mismatch.png")
    out = tmp_path / "out" / "captions.jsonl"
    # exit 1: done, but some pairs failed, and they are listed (docs/errors.md)
    assert caption_script.main(["--checkpoint", str(run_dir), "--pairs", str(pairs), "--out", str(out)]) == 1
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"ok0", "ok1", "corrupt", "mismatch"}
    assert all(isinstance(rows[k]["caption"], str) and rows[k]["error"] is None for k in ("ok0", "ok1"))
    assert "corrupt" in rows["corrupt"]["error"] and rows["corrupt"]["caption"] is None
    assert "50x40" in rows["mismatch"]["error"]
    report = (out.parent / "report.html").read_text()
    assert "4 pairs · 2 captioned · 2 not captioned" in report
    assert report.index("corrupt") < report.index('id="ok0"')  # failed pairs first; ≤ 100 pairs on the index page
    assert all(f'id="{k}"' in report for k in ("ok0", "ok1"))
    assert not (out.parent / "report_files" / "page-0001.html").exists()
    assert len(list((out.parent / "report_files" / "strips").glob("*.jpg"))) == 2
