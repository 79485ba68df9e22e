"""Training checkpoints hold only what training changes, are checked on --resume (fallback past a damaged one),
and model folders with missing or damaged weight files fail with an error naming the file."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from davir.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TINY = "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}"


@pytest.fixture(scope="module")
def synth_root(synthetic_set):
    return synthetic_set(30, 0)


def _argv(root, out, *extra):
    return [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"data.root={root}",
        "data.masks=null",
        "data.entities=null",
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        TINY,
        "optim.batch_size=4",
        "optim.max_steps=4",
        "run.log_every=1",
        "run.save_every=2",
        "run.eval_every=0",
        "run.val_max_pairs=4",
        "run.tensorboard=false",
        f"run.output_dir={out}",
        *extra,
    ]


def _kill_after_step_2(run_dir):
    log = (run_dir / "train_log.jsonl").read_text().splitlines()
    (run_dir / "train_log.jsonl").write_text("\n".join(log[:2]) + "\n")


@pytest.fixture(scope="module")
def finished_run(synth_root, tmp_path_factory):
    """A 4-step LoRA run of the tiny preset with complete checkpoints at steps 2 and 4."""
    from davir.cli import train

    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    assert train.main(_argv(synth_root, run_dir)) == 0
    return run_dir


def _copy(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def test_lora_checkpoint_holds_only_the_trainable_weights(finished_run):
    from davir.models.vlm.instructblip import DavirModel

    model = DavirModel.from_pretrained(finished_run / "last")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    with safe_open(str(finished_run / "checkpoints" / "step_2" / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
        stored = sum(handle.get_tensor(k).numel() for k in keys)
    assert trainable <= keys and not (keys & frozen)
    assert keys - trainable == keys & {n for n, _ in model.named_buffers()}  # the rest are buffers
    assert stored < 0.5 * sum(p.numel() for p in model.parameters())
    manifest = json.loads((finished_run / "checkpoints" / "step_2" / "COMPLETE").read_text())["files"]
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= set(manifest)


@pytest.mark.parametrize("damage", ["truncated_weights", "truncated_optimizer", "corrupt_rng"])
def test_resume_falls_back_past_a_damaged_checkpoint(finished_run, synth_root, tmp_path, capsys, damage, losses_of):
    from davir.cli import train

    run_dir = _copy(finished_run, tmp_path)
    full = list(losses_of(finished_run).values())
    name = {
        "truncated_weights": "model.safetensors",
        "truncated_optimizer": "optimizer.bin",
        "corrupt_rng": "random_states_0.pkl",
    }[damage]
    path = run_dir / "checkpoints" / "step_4" / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage.startswith("truncated") else b"\x80\x04garbage" + data[12:])
    _kill_after_step_2(run_dir)
    capsys.readouterr()
    assert train.main([*_argv(synth_root, run_dir), "--resume"]) == 0
    out = capsys.readouterr().out
    warning = next(line for line in out.splitlines() if line.startswith("warning:"))
    assert "falls back to" in warning and str(run_dir / "checkpoints" / "step_2") in warning and str(path) in warning
    assert "resumed from" in out and "step_2 at step 2" in out
    assert list(losses_of(run_dir).values()) == pytest.approx(full, rel=1e-5, abs=1e-6)


def test_resume_refuses_when_every_checkpoint_is_damaged(finished_run, synth_root, tmp_path, capsys):
    from davir.cli import train

    run_dir = _copy(finished_run, tmp_path)
    for step in (2, 4):
        (run_dir / "checkpoints" / f"step_{step}" / "random_states_0.pkl").write_bytes(b"not a pickle")
    capsys.readouterr()
    assert train.main([*_argv(synth_root, run_dir), "--resume"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: --resume: every complete checkpoint")
    assert str(run_dir / "checkpoints" / "step_4" / "random_states_0.pkl") in first


def test_unreadable_rng_state_of_an_old_checkpoint_is_refused(finished_run, tmp_path):
    """A checkpoint without a manifest (older version) still gets its RNG state read before resuming."""
    from davir.training.checkpoints import checkpoint_problems

    run_dir = _copy(finished_run, tmp_path)
    checkpoint = run_dir / "checkpoints" / "step_4"
    state = json.loads((checkpoint / "COMPLETE").read_text())
    state.pop("files")
    (checkpoint / "COMPLETE").write_text(json.dumps(state))
    assert checkpoint_problems(checkpoint) == []
    (checkpoint / "random_states_0.pkl").write_bytes(b"garbage")
    (problem,) = checkpoint_problems(checkpoint)
    assert problem.startswith(f"{checkpoint / 'random_states_0.pkl'}: unreadable")


# ---------------------------------------------------------------------------------------------------------------
# --resume with settings other than the run's: applied and recorded, or refused naming the keys
# ---------------------------------------------------------------------------------------------------------------


def _lrs(run_dir):
    rows = {row["step"]: row["train/lr"] for row in read_jsonl(run_dir / "train_log.jsonl")}
    return [rows[s] for s in sorted(rows)]


def test_resume_after_a_kill_logs_each_step_once(finished_run, synth_root, tmp_path, capsys):
    """Killed after logging steps 3-4 but before their checkpoint: the resume from step 2 trains them again, and
    train_log.jsonl ends as the uninterrupted run's (each step once), not with steps 3-4 twice. A --resume that
    finds no checkpoint starts the log anew too."""
    from davir.cli import train

    run_dir = _copy(finished_run, tmp_path)
    full = read_jsonl(finished_run / "train_log.jsonl")
    shutil.rmtree(run_dir / "checkpoints" / "step_4")
    assert [row["step"] for row in read_jsonl(run_dir / "train_log.jsonl")] == [1, 2, 3, 4]
    assert train.main([*_argv(synth_root, run_dir), "--resume"]) == 0
    rows = read_jsonl(run_dir / "train_log.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert [row["train/loss"] for row in rows] == pytest.approx([row["train/loss"] for row in full], rel=1e-5)

    shutil.rmtree(run_dir / "checkpoints")
    assert train.main([*_argv(synth_root, run_dir), "--resume"]) == 0
    assert "starting from scratch" in capsys.readouterr().out
    assert [row["step"] for row in read_jsonl(run_dir / "train_log.jsonl")] == [1, 2, 3, 4]


def test_resume_applies_a_new_lr_from_the_resume_step_and_records_it(finished_run, synth_root, tmp_path, capsys):
    """optim.lr=5e-4 (the run's: 1e-3) on resume at step 2: the schedule's base rate is halved from step 3 on,
    run.save_every takes effect too; config.yaml holds the new values, run_info.json since which step."""
    import yaml

    from davir.cli import train

    run_dir = _copy(finished_run, tmp_path)
    full = _lrs(finished_run)
    shutil.rmtree(run_dir / "checkpoints" / "step_4")
    _kill_after_step_2(run_dir)
    capsys.readouterr()
    assert train.main([*_argv(synth_root, run_dir, "optim.lr=5e-4", "run.save_every=1"), "--resume"]) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("note: resumed with"))
    assert "from step 3" in note and "optim.lr 0.001 -> 0.0005" in note and "run.save_every 2 -> 1" in note
    assert f"learning rate now {full[1] / 2:.3g} (was {full[1]:.3g})" in note
    lrs = _lrs(run_dir)
    assert lrs[:2] == full[:2] and lrs[2:] == pytest.approx([lr / 2 for lr in full[2:]], rel=1e-9, abs=1e-12)
    assert (run_dir / "checkpoints" / "step_3" / "COMPLETE").is_file()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (saved["optim"]["lr"], saved["run"]["save_every"]) == (5e-4, 1)
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["resume_changes"] == [
        {"step": 3, "key": "optim.lr", "from": 1e-3, "to": 5e-4},
        {"step": 3, "key": "run.save_every", "from": 2, "to": 1},
    ]
    assert info["finished"] is True and info["final_step"] == 4


def test_resume_to_a_longer_run_records_the_new_length(finished_run, synth_root, tmp_path, capsys):
    from davir.cli import train

    run_dir = _copy(finished_run, tmp_path)
    capsys.readouterr()
    assert train.main([*_argv(synth_root, run_dir, "optim.max_steps=6"), "--resume"]) == 0
    assert [row["step"] for row in read_jsonl(run_dir / "train_log.jsonl")] == [1, 2, 3, 4, 5, 6]
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["resume_changes"] == [{"step": 5, "key": "optim.max_steps", "from": 4, "to": 6}]
    assert (info["max_steps"], info["final_step"]) == (6, 6)
    capsys.readouterr()
    assert train.main([*_argv(synth_root, run_dir, "optim.max_steps=5"), "--resume"]) == 2
    assert "below step 6 that its checkpoint reached" in capsys.readouterr().err


def test_resume_history_after_a_fallback_or_a_kill_between_the_two_files():
    from davir.training.resume import merged_history

    lr = {"key": "optim.lr", "from": 1e-3, "to": 5e-4}
    # the checkpoint of step 4 was damaged: resumed at step 2, the recorded change (config.yaml has it) applies from 3
    assert merged_history([{"step": 5, **lr}], [], step=2) == [{"step": 3, **lr}]
    # killed after run_info.json, before config.yaml: the change is found again, and recorded once
    assert merged_history([{"step": 5, **lr}], [{"step": 5, **lr}], step=4) == [{"step": 5, **lr}]
    # the same change made again later is a second entry
    assert merged_history([{"step": 3, **lr}], [{"step": 7, **lr}], step=6) == [{"step": 3, **lr}, {"step": 7, **lr}]


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["optim.batch_size=2"], "optim.batch_size (4 -> 2)"),
        (["model.lora.llm_rank=4", "run.seed=3"], "model.lora.llm_rank (16 -> 4), run.seed (0 -> 3)"),
        (["run.best_metric=BLEU-4"], "run.best_metric ('CIDEr' -> 'BLEU-4')"),
        (["data.root=/elsewhere"], "data.root ("),
    ],
)
def test_resume_refuses_settings_that_change_what_is_trained(
    finished_run, synth_root, tmp_path, capsys, overrides, named
):
    from davir.cli import train

    run_dir = _copy(finished_run, tmp_path)
    before = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "run_info.json", "train_log.jsonl")}
    capsys.readouterr()
    assert train.main([*_argv(synth_root, run_dir, *overrides), "--resume"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"config error: --resume: {run_dir / 'config.yaml'} was trained with other values")
    assert named in first
    assert {name: (run_dir / name).read_bytes() for name in before} == before  # config.yaml still tells the truth


def test_resume_from_another_folder_takes_the_same_data_given_another_way(
    finished_run, synth_root, tmp_path, capsys, monkeypatch
):
    """The run was trained with data.root absolute and model.pretrained relative to the repository; a resume from
    another folder gives data.root relative, then through a symlink, and model.pretrained absolute: the same
    folders, so no change. A path naming another folder is still refused."""
    from davir.cli import train

    pretrained = f"model.pretrained={REPO / 'assets' / 'tiny_instructblip'}"

    run_dir = _copy(finished_run, tmp_path)
    (tmp_path / "link").symlink_to(synth_root)
    capsys.readouterr()
    monkeypatch.chdir(synth_root.parent)
    assert train.main([*_argv(synth_root.name, run_dir, pretrained, "optim.max_steps=5"), "--resume"]) == 0
    monkeypatch.chdir(tmp_path)  # config.yaml now says the relative name, relative to synth_root's parent
    assert train.main([*_argv("link", run_dir, pretrained, "optim.max_steps=6"), "--resume"]) == 0
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["resume_changes"] == [
        {"step": 5, "key": "optim.max_steps", "from": 4, "to": 5},
        {"step": 6, "key": "optim.max_steps", "from": 5, "to": 6},
    ]
    capsys.readouterr()
    assert (
        train.main([*_argv("run", run_dir, pretrained, "optim.max_steps=6"), "--resume"]) == 2
    )  # a folder, another one
    assert "data.root ('link' -> 'run')" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# Model folders (evaluate.py / caption.py / from_pretrained)
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_on_pretrained(tmp_path_factory, synth_root):
    """A LoRA model over a local 'pretrained' InstructBLIP folder, with language_projection trained in full."""
    from davir.data.formats import read_dataset
    from davir.models.vlm.build import build_davir_model
    from davir.models.vlm.config import DavirModelConfig

    base = tmp_path_factory.mktemp("pretrained")
    captions = [c for p in read_dataset("clevr_change", synth_root, "train").pairs for c in p.captions]
    preset = build_davir_model(
        DavirModelConfig(
            train_mode="full", preset_overrides={"vision_layers": 1, "qformer_layers": 1, "text_layers": 1}
        ),
        captions_for_tokenizer=captions,
    )
    preset.core.save_pretrained(str(base / "blip"))
    preset.processor.save_pretrained(str(base / "blip"))
    model = build_davir_model(
        DavirModelConfig(pretrained=str(base / "blip"), train_mode="lora", extra_trainable=("language_projection",))
    )
    with torch.no_grad():
        model.core.language_projection.weight.add_(1.0)  # "trained": differs from the base folder
    model.save_pretrained(base / "model")
    return base / "model"


def _evaluate(model_dir, root, capsys):
    from davir.cli import evaluate

    capsys.readouterr()
    status = evaluate.main(
        [
            "--checkpoint",
            str(model_dir),
            "--format",
            "clevr_change",
            "--root",
            str(root),
            "--split",
            "test",
            "--limit",
            "2",
            "--no-spice",
            "--metrics",
            "BLEU",
        ]
    )
    return status, capsys.readouterr().err.splitlines()


def test_lora_folder_without_its_trained_extras_is_refused(lora_on_pretrained, synth_root, tmp_path, capsys):
    from davir.models.vlm.instructblip import DavirModel

    loaded = DavirModel.from_pretrained(lora_on_pretrained)
    assert loaded.core.language_projection.weight.sum() != 0  # the intact folder loads its extras
    folder = tmp_path / "model"
    shutil.copytree(lora_on_pretrained, folder)
    (folder / "trainable_extra.safetensors").unlink()
    status, err = _evaluate(folder, synth_root, capsys)
    assert status == 2
    line = next(e for e in err if e.startswith("error:"))
    assert line.startswith(f"error: {folder / 'trainable_extra.safetensors'}: missing") and str(folder) in line


@pytest.mark.parametrize("damage", ["empty", "garbage", "truncated", "wrong_shape"])
def test_damaged_weight_files_name_the_file(lora_on_pretrained, synth_root, tmp_path, capsys, damage):
    folder = tmp_path / "model"
    shutil.copytree(lora_on_pretrained, folder)
    target = folder / (
        "adapter/adapter_model.safetensors" if damage != "wrong_shape" else "trainable_extra.safetensors"
    )
    data = target.read_bytes()
    if damage == "empty":
        target.write_bytes(b"")
    elif damage == "garbage":
        target.write_bytes(b"\x00" * 64)
    elif damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
    else:
        with safe_open(str(target), "pt") as handle:
            tensors = {k: torch.zeros(handle.get_tensor(k).shape[0] + 1, 3) for k in handle.keys()}
        save_file(tensors, str(target))
    status, err = _evaluate(folder, synth_root, capsys)
    assert status == 2
    line = next(e for e in err if e.startswith("error:"))
    assert line.startswith(f"error: {target}:"), line


def test_evaluate_refuses_a_mask_or_entity_cache_of_another_dataset_root(
    finished_run, synth_root, synthetic_set, tmp_path, capsys
):
    """Pair ids repeat across datasets (CLEVR_default_000003.png): a mask or entity cache made from another root
    would answer, silently, for other images. evaluate.py refuses it before any caption, naming both roots."""
    from davir.cli import evaluate
    from davir.errors import DataError
    from davir.evaluation.checkpoint import EvaluationOptions, _entity_source
    from davir.jobs import masks

    other = synthetic_set(30, 1)
    cache = tmp_path / "masks"
    common = ["--format", "clevr_change", "--split", "test", "--limit", "2", "--workers", "1", "--no-progress"]
    assert masks.main([*common, "--root", str(other), "--out", str(cache)]) == 0
    capsys.readouterr()
    argv = ["--checkpoint", str(finished_run), "--root", str(synth_root), "--split", "test", "--limit", "2"]
    assert evaluate.main([*argv, "--no-spice", "--metrics", "BLEU", "--masks", str(cache)]) == 2
    err = capsys.readouterr().err
    assert f"the mask cache {cache} was made from dataset root {other}" in err and "not captioned" not in err
    assert err.strip().splitlines()[-1].startswith("error: the mask cache")

    entities = tmp_path / "entities"
    (entities / "entities").mkdir(parents=True)
    (entities / "entities" / "manifest.json").write_text(json.dumps({"splits": {"test": {"root": str(other)}}}))

    class PromptedEngine:  # a DAVIR model trained with entity prompts
        uses_entities = True

    for run_data, options in (
        ({"entities": str(entities)}, EvaluationOptions()),
        ({}, EvaluationOptions(entities=entities)),
    ):
        with pytest.raises(DataError, match=f"the entity cache {entities} was made from dataset root {other}"):
            _entity_source(
                PromptedEngine(),
                options,
                run_data,
                finished_run,
                format="clevr_change",
                root=synth_root,
                split="test",
                pairs=[],
            )
    # the run's data.moved_from counts as the evaluated root
    moved = {"entities": str(entities), "moved_from": str(other)}
    assert (
        _entity_source(
            PromptedEngine(),
            EvaluationOptions(),
            moved,
            finished_run,
            format="clevr_change",
            root=synth_root,
            split="test",
            pairs=[],
        )
        is not None
    )


THREADED_LOADS = """
import sys, threading
import torch
from torch.nn import init
from transformers import InstructBlipForConditionalGeneration, PreTrainedModel
from davir.models import load_davir_model

folder = sys.argv[1]
switches = lambda: (PreTrainedModel.init_weights, PreTrainedModel.tie_weights, init.normal_, torch.get_default_dtype())
found = switches()
inside = {"first": threading.Event(), "second": threading.Event()}
first_done = threading.Event()
build = InstructBlipForConditionalGeneration.__init__

def build_then_wait(self, *args, **kwargs):
    # The worst order for transformers' switches: the second load starts inside the first, and ends after it.
    build(self, *args, **kwargs)
    name = threading.current_thread().name
    if name == "first":
        inside["first"].set()
        inside["second"].wait(timeout=3)
    elif name == "second":
        inside["second"].set()
        first_done.wait(timeout=30)

InstructBlipForConditionalGeneration.__init__ = build_then_wait
models = {}

def load(name):
    models[name] = load_davir_model(folder)
    if name == "first":
        first_done.set()

first = threading.Thread(target=load, args=("first",), name="first")
first.start()
inside["first"].wait(timeout=60)
second = threading.Thread(target=load, args=("second",), name="second")
second.start()
first.join(); second.join()
print([now is then or now == then for now, then in zip(switches(), found)])
from transformers import LlamaConfig, LlamaForCausalLM  # a model built later, with a tied LM head as Gemma 3's

later = LlamaForCausalLM(
    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, tie_word_embeddings=True)
)
print(later.lm_head.weight is later.model.embed_tokens.weight)
"""


def test_two_threads_loading_models_leave_transformers_as_they_found_it(tmp_path):
    """transformers loads under process-wide switches (init and tie as no-ops, torch's default dtype) that it puts
    back on the way out; two threads loading at once put back each other's no-ops, and every model built later in
    that process had random, untied LM heads. Loads take turns (davir.models.vlm.one_build)."""
    import subprocess

    from davir.models import DavirModelConfig, build_davir_model

    config = DavirModelConfig(family="instructblip", pretrained=str(REPO / "assets" / "tiny_instructblip"))
    build_davir_model(config).save_pretrained(tmp_path / "model")  # loading it runs transformers' from_pretrained
    script = tmp_path / "threads.py"
    script.write_text(THREADED_LOADS)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["[True, True, True, True]", "True"], result.stdout
