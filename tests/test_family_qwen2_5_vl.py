"""model.family=qwen2_5_vl: the real Qwen2.5-VL classes at toy size, from a folder written by save_pretrained with a
byte-level BPE Qwen2Tokenizer trained offline — the processor's own tokens and pixels, FAC's hook against eager
attention, the window-order map put back in raster order, the LoRA targets, and the whole command path (FAC +
EPC training, kill and --resume, evaluate.py --checkpoint, caption.py from another folder, ChangeCaptioner)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.errors import DataError  # noqa: E402
from davir.models.davir import build_davir_model, load_davir_model  # noqa: E402
from davir.models.davir_config import DavirModelConfig  # noqa: E402
from davir.models.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXTS = ["the small red metal cube moved", "there is no change", "the large blue rubber sphere changed to green",
         "the scene is the same as before", EpcConfig().prompt, EpcConfig().entity_prefix]


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, synthetic_set):
    from davir.data.formats import read_dataset

    root = synthetic_set(24, 0)
    texts = [c for split in ("train", "val", "test") for p in read_dataset("clevr_change", root, split).pairs
             for c in p.captions]
    return write_chat_folder("qwen2_5_vl", tmp_path_factory.mktemp("qwen") / "Qwen2.5-VL-toy", [*TEXTS, *texts])


def _pictures(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (48, 60, 3), dtype=np.uint8)) for _ in range(count)]


def test_tokens_and_pixels_are_the_processors_own(user_folder):
    model = build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder), image_size=64))
    assert type(model.tokenizer).__name__ == "Qwen2Tokenizer" and model.image_size == 64 and model.patch_grid == (8, 8)
    pictures = _pictures(2)
    prompt = model.build_prompts([["small red metal cube"]])[0]
    assert prompt == "Describe the difference between the two images. Entity: small red metal cube."
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": prompt}]}]
    text = model.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reference = model.processor(text=[text], images=[p.resize((64, 64), Image.Resampling.BICUBIC) for p in pictures],
                                return_tensors="pt")
    pixels = model.image_processor(pictures)
    assert model._prompt_ids([prompt])[0] == reference["input_ids"][0].tolist()
    assert torch.equal(model._pixel_inputs(pixels[:1], pixels[1:])["pixel_values"], reference["pixel_values"])
    assert torch.equal(model._pixel_inputs(pixels[:1], pixels[1:])["image_grid_thw"], reference["image_grid_thw"])
    # 16 image tokens (8×8 patches, 2×2 merger) per picture, before then after, then the prompt
    image_id = model.processor.image_token_id
    ids = reference["input_ids"][0].tolist()
    assert ids.count(image_id) == 32 and ids.index(image_id) < len(ids) - 20


def test_raster_order_undoes_the_window_permutation():
    """Each patch of a 16×16 grid is painted with its raster number; the processor lists the patches by merge unit,
    the ViT permutes merge units into windows (HF's own get_vision_window_index): raster_order finds each back."""
    from transformers import Qwen2VLImageProcessor
    from transformers.vision_utils import get_vision_window_index

    from davir.models.families.qwen2_5_vl import raster_order

    side, patch, merge, window = 16, 4, 2, 16  # 4 × 4 windows of 2 × 2 merge units
    image = np.zeros((side * patch, side * patch, 3), dtype=np.uint8)
    for r in range(side * side):
        row, col = divmod(r, side)
        image[row * patch:(row + 1) * patch, col * patch:(col + 1) * patch] = r
    processor = Qwen2VLImageProcessor(patch_size=patch, merge_size=merge, temporal_patch_size=2, do_normalize=False,
                                      do_rescale=False, size={"shortest_edge": 16, "longest_edge": 10 ** 6})
    pixels = processor(images=[Image.fromarray(image)], return_tensors="pt")["pixel_values"]
    processor_order = pixels[:, 0].round().long()  # the raster number of each patch, in the processor's order
    window_index, _ = get_vision_window_index(torch.tensor([[1, side, side]]), spatial_merge_size=merge,
                                              window_size=window * patch // 4 * 2, patch_size=patch)
    block_order = processor_order.reshape(-1, merge * merge)[window_index].reshape(-1)
    assert sorted(block_order.tolist()) == list(range(side * side))
    assert block_order.tolist() != sorted(block_order.tolist())  # the permutation is not the identity
    order = raster_order((side, side), merge, window * patch // 4 * 2, patch)
    assert block_order[order].tolist() == list(range(side * side))


def _hooked_and_eager_maps(attn_implementation: str):
    """The FAC maps of the hook, and the eager attention's probabilities of the same block (recorded by wrapping
    the eager attention function the block calls), on the same seeded weights."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    model = build_davir_model(DavirModelConfig(family="qwen2_5_vl", preset="tiny", train_mode="lora",
                                               attn_implementation=attn_implementation, seed=3),
                              captions_for_tokenizer=TEXTS)
    visual = model.core.model.visual
    target = visual.blocks[max(visual.fullatt_block_indexes)].attn
    recorded: list[torch.Tensor] = []
    original = qwen.eager_attention_forward

    def recording(module, *args, **kwargs):
        output, weights = original(module, *args, **kwargs)
        if module is target:
            recorded.append(weights.detach())
        return output, weights

    pixels = model.image_processor(_pictures(4, seed=1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qwen, "eager_attention_forward", recording)
        output = model(pixels[0::2], pixels[1::2], model.build_prompts(None, batch_size=2))
    maps = torch.stack([output.attention_before, output.attention_after], dim=1).reshape(4, 8, 8)
    return model, maps, recorded


def test_fac_hook_equals_eager_attention_and_keeps_sdpa():
    model, hooked, recorded = _hooked_and_eager_maps("eager")
    assert len(recorded) == 4 and recorded[0].shape == (1, 4, 64, 64)  # one chunk per image, 4 heads
    received = torch.stack([w[0].float().mean(dim=(0, 1)) for w in recorded])  # mean over heads and queries
    family = model.family
    geometry = (2, model.core.config.vision_config.window_size, 8)
    eager_maps = family.attention_maps((received, geometry), 4, (8, 8))
    assert torch.allclose(hooked, eager_maps, atol=1e-6, rtol=0)
    assert torch.allclose(hooked.sum(dim=(1, 2)), torch.ones(4), atol=1e-5)
    _, fast, not_called = _hooked_and_eager_maps("sdpa")  # same seed: same weights, SDPA kernel in place
    assert not not_called and torch.allclose(fast, hooked, atol=1e-6, rtol=0)


def test_lora_targets_exist_and_only_they_train(user_folder):
    model = build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder), image_size=64))
    adapted = {name.split(".lora_A")[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    assert any(".visual.blocks.1.attn.qkv" in n for n in adapted)
    assert any(".visual.merger.mlp.0" in n for n in adapted) and any(".visual.merger.mlp.2" in n for n in adapted)
    assert {p for p in ("q_proj", "k_proj", "v_proj", "o_proj")
            if any(f"language_model.layers.0.self_attn.{p}" in n for n in adapted)} == {"q_proj", "k_proj", "v_proj",
                                                                                      "o_proj"}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert {"vision", "projector", "language_model"} <= set(summary) and summary["all"][0] == sum(
        p.numel() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="extra_trainable.*qwen2_5_vl.*projector"):
        DavirModelConfig(family="qwen2_5_vl", extra_trainable=("query_tokens",))
    with pytest.raises(ValueError, match="segment_embeddings"):
        DavirModelConfig(family="qwen2_5_vl", segment_embeddings=True)
    with pytest.raises(DataError, match="holds a 'qwen2_5_vl' model.*model.family=instructblip"):
        build_davir_model(DavirModelConfig(pretrained=str(user_folder)))


# ---------------------------------------------------------------------------------------------------------------------
# The command path
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def caches(synthetic_set, tmp_path_factory):
    from preprocess import entities, masks

    root = synthetic_set(24, 0)
    base = tmp_path_factory.mktemp("qwen_caches")
    for split in ("train", "val", "test"):
        common = ["--format", "clevr_change", "--root", str(root), "--split", split, "--no-progress"]
        assert masks.main([*common, "--out", str(base / "masks")]) == 0
        assert entities.main([*common, "--masks", str(base / "masks"), "--out", str(base / "entities"),
                              "--vocab-min-count", "1"]) == 0
    return root, base / "masks", base / "entities"


def _train_argv(caches, folder, run_dir, *extra):
    root, masks, entities = caches
    return ["--config", str(REPO / "configs" / "demo.yaml"), f"data.root={root}", f"data.masks={masks}",
            f"data.entities={entities}", "model.family=qwen2_5_vl", f"model.pretrained={folder}",
            "model.image_size=64", "model.extra_trainable=[]", "optim.batch_size=4", "optim.max_steps=4",
            "run.save_every=2", "run.eval_every=4", "run.val_max_pairs=4", "run.tensorboard=false", "run.log_every=1",
            f"run.output_dir={run_dir}", *extra]


def test_train_resume_evaluate_caption_from_a_users_folder(user_folder, caches, tmp_path, monkeypatch, capsys,
                                                           losses_of):
    from davir.cli import caption, evaluate, train
    from davir.inference import ChangeCaptioner

    run_dir = tmp_path / "run"
    assert train.main(_train_argv(caches, user_folder, run_dir)) == 0
    full = losses_of(run_dir)
    assert sorted(full) == [1, 2, 3, 4] and all(np.isfinite(list(full.values())))
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert all(row["train/attn_loss"] > 0 for row in log if "train/loss" in row)  # FAC was on
    saved = json.loads((run_dir / "last" / "davir_config.json").read_text())["config"]
    assert saved["family"] == "qwen2_5_vl" and saved["epc"]["use_entities"] is True

    # checkpoints and the saved model hold LoRA only: no frozen base weight
    with safe_open(str(run_dir / "checkpoints" / "step_2" / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert keys and all("lora_" in key for key in keys), sorted(keys)[:5]
    assert sorted(p.name for p in (run_dir / "last").iterdir()) == ["adapter", "davir_config.json", "processor",
                                                                "selection.json"]

    # a kill after step 2, then --resume: the same curve
    shutil.rmtree(run_dir / "checkpoints" / "step_4")
    lines = (run_dir / "train_log.jsonl").read_text().splitlines()
    (run_dir / "train_log.jsonl").write_text("\n".join(lines[:2]) + "\n")
    assert train.main([*_train_argv(caches, user_folder, run_dir), "--resume"]) == 0
    resumed = losses_of(run_dir)
    assert [resumed[s] for s in (1, 2)] == [full[1], full[2]]
    assert [resumed[s] for s in (3, 4)] == pytest.approx([full[3], full[4]], rel=1e-5, abs=1e-6)
    # resuming as another family is refused, naming the setting
    capsys.readouterr()
    assert train.main([*_train_argv(caches, user_folder, run_dir), "model.family=instructblip", "--resume"]) == 2
    assert "model.family ('qwen2_5_vl' -> 'instructblip')" in capsys.readouterr().err

    assert evaluate.main(["--checkpoint", str(run_dir), "--split", "test", "--no-spice", "--metrics", "BLEU"]) == 0
    metrics = json.loads((run_dir / "eval" / "clevr_change_test" / "metrics.json").read_text())
    assert metrics["localisation"]["attention_share_in_mask"] > 0

    # caption.py from another folder, on a folder of pairs; ChangeCaptioner gives the same captions
    root = caches[0]
    pairs = tmp_path / "pairs"
    (pairs / "before").mkdir(parents=True)
    (pairs / "after").mkdir()
    for i, path in enumerate(sorted((root / "images").iterdir())[:3]):
        shutil.copy(path, pairs / "before" / f"p{i}.png")
        shutil.copy(root / "sc_images" / path.name.replace("default", "semantic"), pairs / "after" / f"p{i}.png")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert caption.main(["--checkpoint", str(run_dir), "--pairs", "../pairs", "--out", "caps.jsonl"]) == 0
    rows = [json.loads(line) for line in (elsewhere / "caps.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2"] and all(r["error"] is None for r in rows)
    captioner = ChangeCaptioner.from_pretrained(run_dir, device="cpu")
    again = captioner.caption([pairs / "before" / f"p{i}.png" for i in range(3)],
                              [pairs / "after" / f"p{i}.png" for i in range(3)])
    assert [r.caption for r in again] == [r["caption"] for r in rows]
    assert type(load_davir_model(run_dir / "last", pretrained=user_folder)).__name__ == "ChatDavirModel"
