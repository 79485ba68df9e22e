"""davir-export (issue 29 §1, issue 32 §3): a run's model as one folder to hand to someone. The export, moved away
from the run, its caches and its base model folder, captions new pairs exactly as the run does (adapter with
--base-model, or merged); the merged weights keep every trained vision/projector weight and nothing else moved,
for InstructBLIP and every chat family; the model card carries the run's metric table; lightweight runs too."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.cli import caption as caption_script  # noqa: E402
from davir.cli import export as export_script  # noqa: E402
from davir.errors import DataError  # noqa: E402
from davir.models.families import FAMILIES, get_family  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY_BLIP = REPO / "assets" / "tiny_instructblip"
METRICS = {
    "rows": {
        "total": {
            "metrics": {"BLEU-4": 0.4321, "METEOR": 0.3, "ROUGE_L": 0.6, "CIDEr": 1.234, "SPICE": None},
            "num_pairs": 7,
        }
    },
    "checkpoint": "runs/tiny/best",
    "decoding": {"num_beams": 1, "max_new_tokens": 30},
}


@pytest.fixture(scope="module")
def davir_run(synthetic_set, tmp_path_factory):
    """A tiny DAVIR run (LoRA + extra_trainable + EPC with the fitted retriever and gate) on a copy of the tiny
    pretrained InstructBLIP, with an evaluation's metrics.json; paths relative to its training folder."""
    import os

    from davir.config import load_config
    from davir.jobs import entities, masks
    from davir.runs.config import TrainConfig
    from davir.training.loop import train

    root = synthetic_set(12, 5)
    work = tmp_path_factory.mktemp("export_run")
    shutil.copytree(TINY_BLIP, work / "base" / "tiny_instructblip")
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for split in ("train", "val"):
            common = ["--format", "clevr_change", "--root", str(root), "--split", split, "--no-progress"]
            assert masks.main([*common, "--out", "masks", "--workers", "1"]) == 0
            assert entities.main([*common, "--masks", "masks", "--out", "entities", "--vocab-min-count", "1"]) == 0
        config = load_config(
            TrainConfig,
            REPO / "configs" / "demo.yaml",
            [
                f"data.root={root}",
                "data.masks=masks",
                "data.entities=entities",
                "model.pretrained=base/tiny_instructblip",
                "optim.batch_size=4",
                "optim.max_steps=2",
                "run.val_max_pairs=2",
                "run.eval_every=0",
                "run.tensorboard=false",
                "run.output_dir=runs/tiny",
            ],
        )
        train(config)
    finally:
        os.chdir(cwd)
    run = work / "runs" / "tiny"
    (run / "eval" / "clevr_change_test").mkdir(parents=True)
    (run / "eval" / "clevr_change_test" / "metrics.json").write_text(json.dumps(METRICS))
    return {"work": work, "run": run, "root": root, "base": work / "base" / "tiny_instructblip"}


def pair_folder(folder: Path, root: Path, n: int) -> Path:
    (folder / "before").mkdir(parents=True)
    (folder / "after").mkdir()
    for i, path in enumerate(sorted((root / "images").iterdir())[:n]):
        shutil.copy(path, folder / "before" / f"p{i:02d}.png")
        shutil.copy(root / "sc_images" / path.name.replace("default", "semantic"), folder / "after" / f"p{i:02d}.png")
    return folder


def captions(checkpoint: Path, pairs: Path, out: Path, *extra) -> dict[str, str]:
    argv = ["--checkpoint", checkpoint, "--pairs", pairs, "--out", out, "--workers", "0", "--quiet", *extra]
    assert caption_script.main([str(a) for a in argv]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(row["error"] is None for row in rows)
    return {row["id"]: (row["caption"], [e for e, _ in row.get("entities") or []]) for row in rows}


@pytest.fixture(scope="module")
def exported(davir_run, tmp_path_factory):
    """The run's captions of 6 pairs, then the adapter and merged exports moved to a fresh folder, the run, its
    caches and its base renamed away."""
    work = davir_run["work"]
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    pairs = pair_folder(elsewhere / "pairs", davir_run["root"], 6)
    reference = captions(davir_run["run"], pairs, elsewhere / "run.jsonl")
    for merge in (False, True):
        name = "merged" if merge else "adapter"
        argv = ["--checkpoint", str(davir_run["run"]), "--out", str(work / "exports" / name), "--license", "mit"]
        assert export_script.main(argv + (["--merge"] if merge else [])) == 0
        shutil.move(work / "exports" / name, elsewhere / name)
    for name in ("runs", "masks", "entities", "base"):
        (work / name).rename(work / f"{name}.away")
    yield {"elsewhere": elsewhere, "pairs": pairs, "reference": reference, "away": work / "base.away"}
    for name in ("runs", "masks", "entities", "base"):
        (work / f"{name}.away").rename(work / name)


def test_adapter_export_is_the_hf_layout_and_carries_the_card(exported):
    folder = exported["elsewhere"] / "adapter"
    names = {p.name for p in folder.iterdir()}
    assert {
        "adapter_model.safetensors",
        "adapter_config.json",
        "trainable_extra.safetensors",
        "davir_config.json",
        "davir_export.json",
        "README.md",
        "config.yaml",
        "tokenizer.json",
        "preprocessing",
    } <= names
    assert "model.safetensors" not in names and "checkpoints" not in names and "adapter" not in names
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny_instructblip"
    entity_files = {
        str(p.relative_to(folder / "preprocessing")) for p in (folder / "preprocessing").rglob("*") if p.is_file()
    }
    assert {"masks/manifest.json", "entities/vocab.json", "entities/entities/manifest.json"} <= entity_files
    assert any(f.startswith("entities/retriever/") for f in entity_files)
    assert any(f.startswith("entities/gate/") for f in entity_files)
    assert not any("part-" in f for f in entity_files)  # no training entries
    card = (folder / "README.md").read_text()
    assert "license: mit" in card and "base_model: tiny_instructblip" in card
    assert "| total | n/a | n/a | n/a | 43.2 | 30.0 | 60.0 | 123.4 | n/a | 7 |" in card
    assert "## Reproduce" in card and "training_config.yaml" in card and (folder / "training_config.yaml").is_file()
    assert "upload_folder" in card


def test_exports_hold_no_absolute_path_of_the_training_machine(exported, davir_run):
    """Issue 49 item 14: davir_export.json, training_run_info.json, eval/*/metrics.json, the preprocessing
    manifests and the card name no folder of the machine that trained (the run's folder, its data root)."""
    machine = {str(davir_run["work"]), str(davir_run["work"].resolve()), str(davir_run["root"])}
    for name in ("adapter", "merged"):
        folder = exported["elsewhere"] / name
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix in (".json", ".yaml", ".md", ".jsonl"):
                text = path.read_text(encoding="utf-8")
                assert not [m for m in machine if m in text], (path, [m for m in machine if m in text])


def test_adapter_export_captions_as_the_run_with_the_base_given(exported, tmp_path):
    folder, base = exported["elsewhere"] / "adapter", exported["away"] / "tiny_instructblip"
    got = captions(folder, exported["pairs"], tmp_path / "a.jsonl", "--base-model", base)
    assert got == exported["reference"]
    from davir.inference import ChangeCaptioner

    captioner = ChangeCaptioner.from_pretrained(folder, base_model=base, device="cpu")
    pairs = exported["pairs"]
    results = captioner.caption(
        [pairs / "before" / "p00.png", pairs / "before" / "p01.png"],
        [pairs / "after" / "p00.png", pairs / "after" / "p01.png"],
    )
    assert [r.caption for r in results] == [exported["reference"][k][0] for k in ("p00", "p01")]


def test_the_printed_caption_command_pastes_for_a_folder_with_spaces(exported, tmp_path):
    """davir-export's closing lines: the caption command names the export so a shell reads it back whole."""
    import shlex

    from davir.export.exporter import summary

    spaced = tmp_path / "my exports" / "merged é"
    shutil.copytree(exported["elsewhere"] / "merged", spaced)
    line = next(line for line in summary(spaced).splitlines() if line.startswith("caption with: "))
    assert shlex.split(line.removeprefix("caption with: "))[:3] == ["davir-caption", "--checkpoint", str(spaced)]


def test_adapter_export_without_its_base_names_the_flag(exported, tmp_path, capsys):
    folder = exported["elsewhere"] / "adapter"
    argv = ["--checkpoint", folder, "--pairs", exported["pairs"], "--out", tmp_path / "x.jsonl", "--quiet"]
    assert caption_script.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "--base-model" in err and "tiny_instructblip" in err and "--merge" in err
    from davir.inference import ChangeCaptioner

    with pytest.raises(DataError, match="base_model="):
        ChangeCaptioner.from_pretrained(folder, device="cpu")


def test_merged_export_captions_as_the_run_without_a_base(exported, tmp_path):
    folder = exported["elsewhere"] / "merged"
    assert captions(folder, exported["pairs"], tmp_path / "m.jsonl") == exported["reference"]
    # a plain folder of the family: what vLLM / SGLang would load
    from transformers import InstructBlipForConditionalGeneration, InstructBlipProcessor

    model = InstructBlipForConditionalGeneration.from_pretrained(str(folder), local_files_only=True)
    InstructBlipProcessor.from_pretrained(str(folder), local_files_only=True)
    assert model.config.model_type == "instructblip"


# ------------------------------------------------------------------------------------- merge, every family
def _perturb(model, seed: int = 1) -> None:
    """Non-zero LoRA B matrices and moved extra_trainable parts, as training leaves them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


def _expected_changes(model) -> set[str]:
    """Core parameter names the merge must change: the weight of every LoRA-adapted module, every part trained
    in full."""
    from peft.tuners.lora import LoraLayer

    core = model.core
    names = {f"{name}.weight" for name, module in core.named_modules() if isinstance(module, LoraLayer)}
    trained = {name for name, parameter in core.named_parameters() if parameter.requires_grad and "lora_" not in name}
    return {name.replace(".base_layer", "") for name in names | trained}


@pytest.mark.parametrize("family", FAMILIES.names())
def test_merged_export_keeps_the_vision_lora_and_captions_as_the_model(family, tmp_path):
    from davir.export.loading import load_exported_model
    from davir.models.vlm.build import build_davir_model
    from davir.models.vlm.config import DavirModelConfig
    from davir.models.vlm.epc import EpcConfig

    fam = get_family(family)
    if family == "instructblip":
        base, extra, size = TINY_BLIP, ("language_projection", "query_tokens"), {}
    else:
        texts = [
            "the small red cube moved",
            "there is no change",
            "the large blue sphere turned green",
            EpcConfig().prompt,
            EpcConfig().entity_prefix,
        ]
        base, extra, size = (
            write_chat_folder(family, tmp_path / "base", texts),
            tuple(fam.trainable_parts)[:1],
            {"image_size": 64},
        )
    config = DavirModelConfig(
        family=family, pretrained=str(base), extra_trainable=extra, epc=EpcConfig(use_entities=False), **size
    )
    model = build_davir_model(config).eval()
    _perturb(model)
    expected = _expected_changes(model)
    model.save_pretrained(tmp_path / "model")
    pictures = [
        Image.fromarray(
            torch.randint(
                0, 256, (40 + 8 * i, 56, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
            ).numpy()
        )
        for i in range(4)
    ]
    pixels = model.image_processor(pictures)
    prompts = model.build_prompts(None, batch_size=2)
    with torch.no_grad():
        want = model.generate(pixels[0::2], pixels[1::2], prompts, max_new_tokens=6, num_beams=1)

    assert (
        export_script.main(["--checkpoint", str(tmp_path / "model"), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    )
    merged = fam.model_class.from_pretrained(str(tmp_path / "merged"), local_files_only=True).state_dict()
    original = fam.model_class.from_pretrained(str(base), local_files_only=True).state_dict()
    assert set(merged) == set(original)
    changed = {name for name in original if not torch.equal(merged[name], original[name])}
    assert changed == expected
    vision = (
        {name for name in changed if fam.part_of(name) == "vision"}
        if family != "instructblip"
        else {name for name in changed if name.startswith("vision_model.")}
    )
    assert vision and all(any(k in n for k in ("qkv", "q_proj", "k_proj", "v_proj")) for n in vision), sorted(vision)[
        :5
    ]  # the vision LoRA (attention projections) is in the merged weights
    loaded = load_exported_model(tmp_path / "merged", device="cpu")
    with torch.no_grad():
        got = loaded.generate(pixels[0::2], pixels[1::2], prompts, max_new_tokens=6, num_beams=1)
    assert got == want
    # the adapter export of the same model, over its base, keeps the same trained weights
    assert export_script.main(["--checkpoint", str(tmp_path / "model"), "--out", str(tmp_path / "adapter")]) == 0
    loaded = load_exported_model(tmp_path / "adapter", device="cpu", base_model=base)
    with torch.no_grad():
        assert loaded.generate(pixels[0::2], pixels[1::2], prompts, max_new_tokens=6, num_beams=1) == want


# ------------------------------------------------------------------------------------------------ lightweight
def test_lightweight_run_exports_and_captions_identically(synthetic_set, tmp_path):
    from davir.config import load_config
    from davir.jobs.features import main as features_main
    from davir.runs.config import TrainConfig
    from davir.training.loop import train

    root = synthetic_set(12, 5)
    features = tmp_path / "features"
    # the val split's few pairs only, for training too: ResNet-101 features on CPU are the slow part here
    assert (
        features_main(
            [
                "--format",
                "clevr_change",
                "--root",
                str(root),
                "--split",
                "val",
                "--out",
                str(features),
                "--random-init",
                "--workers",
                "0",
                "--batch-size",
                "32",
            ]
        )
        == 0
    )
    run = train(
        load_config(
            TrainConfig,
            None,
            [
                "method=subtraction",
                "data.format=clevr_change",
                f"data.root={root}",
                f"data.features={features}",
                "data.train_split=val",
                f"run.output_dir={tmp_path / 'run'}",
                "optim.batch_size=1",
                "optim.max_steps=2",
                "run.eval_every=0",
                "run.val_max_pairs=2",
                "run.tensorboard=false",
                "lightweight.hidden=32",
                "lightweight.heads=2",
                "lightweight.encoder_layers=1",
                "lightweight.layers=1",
                "lightweight.ffn_dim=64",
                "lightweight.word_emb=16",
            ],
        )
    )
    pairs = pair_folder(tmp_path / "pairs", root, 2)
    reference = captions(run, pairs, tmp_path / "run.jsonl")
    assert export_script.main(["--checkpoint", str(run), "--out", str(tmp_path / "exp" / "lw")]) == 0
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "exp" / "lw", moved)
    run.rename(run.with_name("run.away"))
    features.rename(features.with_name("features.away"))
    info = json.loads((moved / "davir_export.json").read_text())
    assert info["weights"] == "lightweight" and info["model"]["backbone"].startswith("random-init")
    assert json.loads((moved / "lightweight_config.json").read_text())["features"]["cache"] is None
    assert captions(moved, pairs, tmp_path / "exp.jsonl") == reference  # caption.py → ChangeCaptioner.from_pretrained


def test_vllm_engine_says_what_is_missing(exported, tmp_path, capsys):
    """`caption.py --engine vllm` serves a merged export of a chat family on a GPU with vLLM installed; here each
    missing piece is one clear line and exit 2, before any pair is read."""
    from davir.cli import caption
    from davir.inference.vllm_engine import check_vllm_available

    for folder, message in (
        (exported["elsewhere"] / "adapter", "serves a merged export"),
        (
            exported["elsewhere"] / "merged",
            "model.family=instructblip is not served through vLLM (vLLM has no InstructBLIP",
        ),
    ):
        assert (
            caption.main(
                [
                    "--checkpoint",
                    str(folder),
                    "--pairs",
                    str(exported["pairs"]),
                    "--engine",
                    "vllm",
                    "--out",
                    str(tmp_path / "c.jsonl"),
                ]
            )
            == 2
        )
        assert message in capsys.readouterr().err
    with pytest.raises(DataError, match="vLLM is not installed|needs a CUDA GPU"):
        check_vllm_available()
