"""The files of a run folder on load (each damaged file named with its key, exit 2), and evaluate.py on a run
that has not finished training (a `note:`, and metrics.json recording which saved model and step it scored)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from davir.config import load_config
from davir.errors import DataError
from davir.runs.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from davir.cli import caption as caption_script  # noqa: E402
from davir.cli import evaluate as evaluate_script  # noqa: E402
from davir.training import loop as train_loop  # noqa: E402

EVALUATE = ["--split", "test", "--limit", "2", "--metrics", "BLEU", "--no-spice", "--batch-size", "2"]


class Killed(Exception):
    """Stands for a kill right after the step-2 checkpoint."""


def _config(root, out, *extra):
    return load_config(
        TrainConfig,
        REPO / "configs" / "demo.yaml",
        [
            f"data.root={root}",
            "data.masks=null",
            "data.entities=null",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=false",
            "optim.batch_size=4",
            "optim.max_steps=4",
            "run.log_every=1",
            "run.save_every=2",
            "run.eval_every=2",
            "run.val_max_pairs=2",
            "run.tensorboard=false",
            f"run.output_dir={out}",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic_set):
    """(data root, a run stopped after step 2 of 4 with best/ from step 2, the same run resumed to the end)."""
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("run_folder")
    root = synthetic_set(24, 3)  # read only: shared with any test of this worker that asks for it
    unfinished = base / "unfinished"
    original = train_loop.save_checkpoint

    def save_then_die(accelerator, run_dir, step, state):
        original(accelerator, run_dir, step, state)
        raise Killed(step)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_loop, "save_checkpoint", save_then_die)
        with pytest.raises(Killed):
            train_loop.train(_config(root, unfinished))
    finished = base / "finished"
    shutil.copytree(unfinished, finished)
    train_loop.train(_config(root, finished), resume=True)
    return root, unfinished, finished


def _copy(run_dir, tmp_path):
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def _error(capsys) -> str:
    return next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error:"))


def _pairs(root, tmp_path) -> Path:
    folder = tmp_path / "pairs"
    (folder / "before").mkdir(parents=True)
    (folder / "after").mkdir()
    image = sorted((root / "images").iterdir())[0]
    Image.open(image).save(folder / "before" / "p.png")
    Image.open(root / "sc_images" / image.name.replace("default", "semantic")).save(folder / "after" / "p.png")
    return folder


# ------------------------------------------------------------------------------------- unfinished runs (3)
def test_evaluate_notes_an_unfinished_run_and_records_the_step_it_scored(runs, capsys):
    _, unfinished, _ = runs
    assert not (unfinished / "last").exists() and (unfinished / "best" / "selection.json").is_file()
    capsys.readouterr()
    assert evaluate_script.main(["--checkpoint", str(unfinished), *EVALUATE]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert any(
        f"the run {unfinished} has not finished training" in n and "best/ is from step 2 of 4" in n for n in notes
    ), notes
    metrics = json.loads((unfinished / "eval" / "clevr_change_test-limit2" / "metrics.json").read_text())
    assert (
        metrics["checkpoint_folder"],
        metrics["checkpoint_step"],
        metrics["run_finished"],
        metrics["run_max_steps"],
    ) == ("best", 2, False, 4)


def test_evaluate_of_a_finished_run_has_no_note_and_records_its_step(runs, capsys):
    _, _, finished = runs
    info = json.loads((finished / "run_info.json").read_text())
    assert (info["finished"], info["final_step"], info["max_steps"]) == (True, 4, 4)
    best_step = json.loads((finished / "best" / "selection.json").read_text())["step"]
    capsys.readouterr()
    assert evaluate_script.main(["--checkpoint", str(finished / "last"), *EVALUATE]) == 0
    assert "not finished" not in capsys.readouterr().err
    metrics = json.loads((finished / "eval" / "clevr_change_test-limit2" / "metrics.json").read_text())
    assert (metrics["checkpoint_folder"], metrics["checkpoint_step"], metrics["run_finished"]) == ("last", 4, True)
    assert best_step in (2, 4)


# ------------------------------------------------------------------------------- damaged run files (2)
def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _edit_yaml(path: Path, edit) -> None:
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


DAMAGE = {
    "davir_config without config": (
        "best/davir_config.json",
        lambda d: d.pop("config"),
        "davir_config.json: missing key 'config'",
    ),
    "davir_config config not an object": (
        "best/davir_config.json",
        lambda d: d.update(config=[1]),
        "davir_config.json: key 'config' must be an object",
    ),
    "davir_config wrong type": (
        "best/davir_config.json",
        lambda d: d["config"]["lora"].update(llm_rank="big"),
        "davir_config.json: config.lora.llm_rank: expected an integer, got 'big'",
    ),
    "config.yaml wrong type": (
        "config.yaml",
        lambda d: d["run"].update(num_beams="five"),
        "config.yaml.run.num_beams: expected an integer, got 'five'",
    ),
    "config.yaml unknown key": (
        "config.yaml",
        lambda d: d["optim"].update(lrr=1),
        "config.yaml.optim: unknown key(s) ['lrr']",
    ),
    "config.yaml run not a mapping": (
        "config.yaml",
        lambda d: d.update(run=3),
        "config.yaml: key 'run' must be a mapping, got 3",
    ),
    "run_info cwd wrong type": (
        "run_info.json",
        lambda d: d.update(cwd=5),
        "run_info.json: key 'cwd' must be a string, got 5",
    ),
    "run_info finished wrong type": (
        "run_info.json",
        lambda d: d.update(finished="yes"),
        "run_info.json: key 'finished' must be true/false, got 'yes'",
    ),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
@pytest.mark.parametrize("command", ["caption", "evaluate"])
def test_a_damaged_run_file_is_named_with_its_key(runs, tmp_path, capsys, case, command):
    root, _, finished = runs
    run_dir = _copy(finished, tmp_path)
    name, edit, expected = DAMAGE[case]
    (_edit_yaml if name.endswith(".yaml") else _edit_json)(run_dir / name, edit)
    capsys.readouterr()
    if command == "caption":
        status = caption_script.main(
            [
                "--checkpoint",
                str(run_dir),
                "--pairs",
                str(_pairs(root, tmp_path)),
                "--out",
                str(tmp_path / "out" / "c.jsonl"),
                "--quiet",
            ]
        )
    else:
        status = evaluate_script.main(["--checkpoint", str(run_dir), *EVALUATE])
    assert status == 2
    line = _error(capsys)
    assert expected in line and str(run_dir / name) in line, line


def test_evaluate_names_the_missing_data_keys_of_config_yaml(runs, tmp_path, capsys):
    _, _, finished = runs
    run_dir = _copy(finished, tmp_path)
    _edit_yaml(run_dir / "config.yaml", lambda d: d["data"].pop("root"))
    capsys.readouterr()
    assert evaluate_script.main(["--checkpoint", str(run_dir), *EVALUATE]) == 2
    assert _error(capsys) == (f"error: {run_dir / 'config.yaml'}: missing key 'data.root'; pass --format and --root")


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda d: d.pop("step"), "selection.json: missing key 'step'"),
        (lambda d: d.update(step="two"), "selection.json: key 'step' must be an integer, got 'two'"),
    ],
)
def test_evaluate_names_a_damaged_selection_file(runs, tmp_path, capsys, edit, expected):
    _, _, finished = runs
    run_dir = _copy(finished, tmp_path)
    _edit_json(run_dir / "best" / "selection.json", edit)
    capsys.readouterr()
    assert evaluate_script.main(["--checkpoint", str(run_dir), *EVALUATE]) == 2
    assert expected in _error(capsys)


def test_a_checkpoint_whose_trainer_state_lacks_its_step_is_not_resumed_from(runs, tmp_path):
    from davir.training.checkpoints import checkpoint_problems, usable_checkpoint

    _, _, finished = runs
    run_dir = _copy(finished, tmp_path)
    _edit_json(run_dir / "checkpoints" / "step_4" / "COMPLETE", lambda d: d.pop("step"))
    _edit_json(run_dir / "checkpoints" / "step_2" / "COMPLETE", lambda d: d.update(best_step="2"))
    assert checkpoint_problems(run_dir / "checkpoints" / "step_4") == [
        f"{run_dir / 'checkpoints' / 'step_4' / 'COMPLETE'}: missing key 'step'"
    ]
    with pytest.raises(DataError, match=r"step_2/COMPLETE: key 'best_step' must be an integer or null, got '2'"):
        usable_checkpoint(run_dir)


# ------------------------------------------------------------------------- a lightweight model folder (2)
@pytest.fixture
def lightweight_model(tmp_path):
    """A saved subtraction model folder, as LightweightTask.save_pretrained writes it (without training)."""
    from davir.models.lightweight import LightweightConfig, build_lightweight_model, save_lightweight_model
    from davir.text.vocab import Vocabulary

    vocab = Vocabulary.build(["the cube has moved left", "no change was made"])
    config = LightweightConfig(
        method="subtraction",
        feat_dim=1026,
        hidden=16,
        heads=2,
        word_emb=8,
        ffn_dim=32,
        layers=1,
        vocab_size=len(vocab),
        max_len=8,
        dropout=0.0,
    )
    folder = tmp_path / "model"
    save_lightweight_model(build_lightweight_model(config), folder / "model.safetensors")
    vocab.save(folder / "vocab.json")
    (folder / "lightweight_config.json").write_text(
        json.dumps(
            {
                "method": "subtraction",
                "weights": "model.safetensors",
                "vocabulary": "vocab.json",
                "entity_phrases": None,
                "features": {"weights": "random-init(seed=0,branches=1/sqrt(blocks))", "cache": None},
            }
        )
    )
    return folder


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda d: d.pop("method"), "missing key 'method'"),
        (lambda d: d.update(method="nope"), "key 'method' is 'nope', not one of"),
        (lambda d: d.update(features="cache"), "key 'features' must be a mapping or null, got 'cache'"),
        (lambda d: d["features"].update(weights=3), "key 'features.weights' must be a string or null, got 3"),
        (lambda d: d.update(vocabulary="../vocab.json"), "key 'vocabulary' must name a file inside"),
        (lambda d: d.update(entity_phrases="vocab.json"), "expected a JSON list of entity phrases"),
    ],
)
def test_a_damaged_lightweight_config_is_named_with_its_key(runs, lightweight_model, tmp_path, capsys, edit, expected):
    from davir.inference.lightweight import load_lightweight

    root, _, _ = runs
    load_lightweight(lightweight_model, device="cpu")  # intact, it loads
    _edit_json(lightweight_model / "lightweight_config.json", edit)
    capsys.readouterr()
    status = evaluate_script.main(
        ["--checkpoint", str(lightweight_model), "--format", "clevr_change", "--root", str(root), *EVALUATE]
    )
    assert status == 2
    line = _error(capsys)
    assert expected in line and str(lightweight_model) in line, line


def test_a_damaged_config_in_the_lightweight_weights_file_is_named(lightweight_model):
    from safetensors.torch import load_file, save_file

    from davir.inference.lightweight import load_lightweight

    weights = lightweight_model / "model.safetensors"
    save_file(
        load_file(str(weights)),
        str(weights),
        metadata={"davir.lightweight_config": '{"method": "subtraction", "hidden": "wide"}'},
    )
    with pytest.raises(
        DataError,
        match=r"model.safetensors: metadata 'davir.lightweight_config' is not a "
        r"lightweight model config",
    ):
        load_lightweight(lightweight_model, device="cpu")
