"""Adding a model family is one new file and one registration line, outside the package: a toy Q-Former family
(InstructBLIP's classes, its own preset and image statistics) and a toy chat family (Qwen2.5-VL's classes, its own
preset), in tests/fixtures/user_modules/. Each builds, runs forward + generate and saves/loads as its family's
DAVIR model; the chat one trains through train.py from a config's `imports:` and captions from the run, which
imports the module itself."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from davir.config import ConfigError, load_config
from davir.errors import DataError
from davir.models.families import FAMILIES
from davir.models.vlm.base import DavirVLM
from davir.models.vlm.build import build_davir_model, load_davir_model
from davir.models.vlm.chat import ChatDavirModel
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.instructblip import DavirModel

REPO = Path(__file__).resolve().parents[1]
USER_MODULES = Path(__file__).resolve().parent / "fixtures" / "user_modules"
TOYS = {"toy_qformer": "toy_qformer_family", "toy_chat": "toy_chat_family"}
CAPTIONS = ["the red cube has moved", "a small blue sphere has appeared", "the green cylinder is gone"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def user_modules(monkeypatch):
    """tests/fixtures/user_modules on sys.path; the toy families and their modules gone again afterwards."""
    monkeypatch.syspath_prepend(str(USER_MODULES))
    yield
    for family, module in TOYS.items():
        FAMILIES.unregister(family)
        sys.modules.pop(module, None)


def _pictures(count: int, seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)) for _ in range(count)]


def _forward_generate_save_load(model: DavirVLM, tmp_path: Path) -> None:
    before = model.image_processor(_pictures(2, 1))
    after = model.image_processor(_pictures(2, 2))
    prompts = model.build_prompts([["red cube"], ["blue sphere"]])
    masks = torch.zeros(2, 16, 16)
    masks[:, 4:9, 4:9] = 1.0
    out = model(before, after, prompts, CAPTIONS[:2], masks, masks, torch.tensor([True, True]))
    assert torch.isfinite(out.loss) and out.attn_loss is not None and out.attn_loss.item() > 0
    assert out.attention_before.shape == (2, *model.patch_grid)
    out.loss.backward()  # the gradient reaches the trained weights
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
    captions = model.generate(before, after, prompts, max_new_tokens=4)
    assert len(captions) == 2 and all(isinstance(c, str) for c in captions)

    model.save_pretrained(tmp_path / "saved")
    loaded = load_davir_model(tmp_path / "saved")
    assert type(loaded) is type(model) and loaded.config == model.config
    model.eval(), loaded.eval()
    with torch.no_grad():
        logits = model(before, after, prompts, CAPTIONS[:2]).logits
        again = loaded(before, after, prompts, CAPTIONS[:2]).logits
    torch.testing.assert_close(again, logits)
    other = ChatDavirModel if isinstance(model, DavirModel) else DavirModel
    with pytest.raises(DataError, match=f"model.family={model.config.family} model, which {other.__name__}"):
        other.from_pretrained(tmp_path / "saved")


def test_a_qformer_family_is_one_file_and_one_registration(user_modules, tmp_path):
    import toy_qformer_family  # noqa: F401 - registers toy_qformer

    config = DavirModelConfig(family="toy_qformer", preset="micro", train_mode="full")
    model = build_davir_model(config, captions_for_tokenizer=CAPTIONS)
    assert type(model) is DavirModel and FAMILIES["toy_qformer"].davir_class is DavirModel
    # its own preset and image statistics, not InstructBLIP's
    assert model.num_query_tokens == 8 and len(model.core.vision_model.encoder.layers) == 2
    assert list(model.processor.image_processor.image_mean) == [0.5, 0.5, 0.5]
    pixels = model.image_processor([Image.new("RGB", (64, 64), (255, 255, 255))])
    assert pixels.shape == (1, 3, 64, 64) and torch.allclose(pixels, torch.ones_like(pixels))  # (1 - 0.5) / 0.5
    _forward_generate_save_load(model, tmp_path)

    # davir-export's merged weights: the processor as saved (the chat families' image settings are not its)
    from davir.export import weights

    weights.copy_processor(tmp_path / "saved", tmp_path / "merged")
    before = (tmp_path / "merged" / "processor_config.json").read_text()
    assert weights.write_merged(tmp_path / "saved", tmp_path / "merged", None) == 64
    assert (tmp_path / "merged" / "processor_config.json").read_text() == before
    assert (tmp_path / "merged" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_chat_family_is_one_file_and_one_registration(user_modules, tmp_path):
    import toy_chat_family  # noqa: F401 - registers toy_chat

    config = DavirModelConfig(family="toy_chat", preset="micro", train_mode="lora", extra_trainable=("projector",))
    model = build_davir_model(config, captions_for_tokenizer=CAPTIONS)
    assert type(model) is ChatDavirModel and model.family is FAMILIES["toy_chat"]
    assert model.core.config.text_config.hidden_size == 64 and len(model.core.model.visual.blocks) == 2
    assert model.trainable_parameter_summary()["projector"][0] > 0  # extra_trainable from the family's parts
    _forward_generate_save_load(model, tmp_path)


def test_family_names_are_read_live(user_modules, tmp_path):
    from davir.runs.config import TrainConfig

    with pytest.raises(
        ValueError,
        match=r"model.family='toy_chat' is not a registered model family; choose from "
        r"instructblip, qwen2_5_vl",
    ):
        DavirModelConfig(family="toy_chat")
    # a config's imports: come first, so its model.for_family may name the family they register
    (tmp_path / "toy.yaml").write_text(
        "imports: [toy_chat_family]\nmodel:\n  family: toy_chat\n  for_family:\n"
        "    toy_chat: {preset: micro, train_mode: full}\n"
    )
    config = load_config(TrainConfig, tmp_path / "toy.yaml")
    assert (config.model.family, config.model.preset, config.model.train_mode) == ("toy_chat", "micro", "full")
    assert "toy_chat" in FAMILIES.names() and DavirModelConfig(family="toy_chat").family == "toy_chat"


@pytest.mark.slow
def test_imports_register_a_users_family_for_training_and_captioning(
    user_modules, synthetic_set, tmp_path, monkeypatch, capsys
):
    from davir.cli import caption, train

    root = synthetic_set(8, 0)
    run_dir = tmp_path / "run"
    argv = [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"data.root={root}",
        "data.masks=null",
        "data.entities=null",
        "imports=[toy_chat_family]",
        "model.family=toy_chat",
        "model.pretrained=null",
        "model.preset=micro",
        "model.train_mode=full",
        "model.extra_trainable=[]",
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        "optim.batch_size=4",
        "optim.max_steps=2",
        "run.val_max_pairs=2",
        "run.tensorboard=false",
        f"run.output_dir={run_dir}",
    ]
    assert "toy_chat" not in FAMILIES.names()
    assert train.main(argv) == 0
    meta = json.loads((run_dir / "last" / "davir_config.json").read_text())
    assert meta["imports"] == ["toy_chat_family"] and meta["config"]["family"] == "toy_chat"

    # a fresh process knows nothing of the toy: caption.py imports what the run recorded
    FAMILIES.unregister("toy_chat")
    sys.modules.pop("toy_chat_family")
    pairs = tmp_path / "pairs"
    (pairs / "before").mkdir(parents=True)
    (pairs / "after").mkdir()
    for i, path in enumerate(sorted((root / "images").iterdir())[:2]):
        shutil.copy(path, pairs / "before" / f"p{i}.png")
        shutil.copy(root / "sc_images" / path.name.replace("default", "semantic"), pairs / "after" / f"p{i}.png")
    assert caption.main(["--checkpoint", str(run_dir), "--pairs", str(pairs), "--out", str(tmp_path / "c.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1"] and all(r["error"] is None for r in rows)
    assert "toy_chat" in FAMILIES.names()

    # a module that is not there: one line naming the key, exit 2
    capsys.readouterr()
    assert train.main([*argv, "imports=[no_such_family_module]", "run.overwrite=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "imports: cannot import 'no_such_family_module'" in err[0], err


def test_a_saved_folder_records_no_module_path(tmp_path):
    """The class comes from the family's entry, not from a path in the folder: moving classes keeps every saved
    folder (and the shipped assets) loadable."""
    model = build_davir_model(DavirModelConfig(pretrained=str(REPO / "assets" / "tiny_instructblip")))
    model.save_pretrained(tmp_path / "saved")
    texts = [p.read_text(errors="ignore") for p in (tmp_path / "saved").rglob("*.json")]
    assert texts and not any("davir.models" in text or "DavirModel" in text for text in texts)
    assert "imports" not in json.loads((tmp_path / "saved" / "davir_config.json").read_text())
    assert type(load_davir_model(tmp_path / "saved")) is DavirModel


def test_a_damaged_imports_record_is_a_data_error(tmp_path):
    from davir.models.vlm.checkpoint import read_davir_config

    (tmp_path / "davir_config.json").write_text(
        json.dumps({"format_version": 1, "config": {}, "imports": ["no_such_family_module"]})
    )
    with pytest.raises(DataError, match=r"davir_config.json: imports: cannot import 'no_such_family_module'"):
        read_davir_config(tmp_path)
    (tmp_path / "davir_config.json").write_text(json.dumps({"format_version": 1, "config": {}, "imports": "x"}))
    with pytest.raises(DataError, match="key 'imports' must be a list of module names"):
        read_davir_config(tmp_path)
    with pytest.raises(ConfigError, match="imports must be a list of module names"):
        from davir.runs.config import TrainConfig

        load_config(TrainConfig, None, ["imports=toy"])


@pytest.mark.parametrize(
    "family, size",
    [
        ("instructblip", 30),
        ("qwen2_5_vl", 30),
        ("llava_onevision", 4),
        ("smolvlm", 30),
        ("qwen3_vl", 30),
        ("internvl", 30),
        ("gemma3", 30),
    ],
)
def test_a_preset_grid_the_family_cannot_make_is_a_config_error(family, size):
    """A size the family's tiny patch grid cannot take (LLaVA-OneVision's SigLIP floors S/p, so only a picture
    smaller than one patch): a ConfigError (train.py: `config error: …`, exit 2) naming the family and the size,
    not the ValueError of the preset builder or the processor."""
    config = DavirModelConfig(family=family, preset="tiny", image_size=size)
    with pytest.raises(ConfigError) as raised:
        build_davir_model(config, captions_for_tokenizer=CAPTIONS)
    assert f"model.image_size={size}" in str(raised.value) and family in str(raised.value), raised.value


def test_train_says_a_bad_image_size_in_one_line(synthetic_set, tmp_path, capsys):
    from davir.cli import train

    root = synthetic_set(8, 0)
    argv = [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"data.root={root}",
        "data.masks=null",
        "data.entities=null",
        "model.family=smolvlm",
        "model.image_size=40",
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        "optim.max_steps=1",
        f"run.output_dir={tmp_path / 'run'}",
    ]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "config error: preset 'tiny' of model.family=smolvlm (model.image_size=40)"
    ), err
