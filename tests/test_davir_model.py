"""DavirModel on tiny random-weight InstructBLIP classes: presets, prompts, losses, LoRA ranks, segment embeddings,
save/load, generation, and a short overfit run. The 7B preset is checked as a config only. What every family does
(the processor's own inputs, the FAC hook against eager attention, LoRA placement, save and load): the instructblip
cases of tests/test_family_contract.py."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import InstructBlipProcessor

from davir.errors import DataError
from davir.models.families.instructblip import FAMILY, clip_image_processor
from davir.models.losses import fac_attention_loss
from davir.models.presets import build_preset_config, preset_registry
from davir.models.tokenizer import build_word_tokenizer
from davir.models.vlm.build import build_davir_model
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.epc import EpcConfig, entity_prompts
from davir.models.vlm.instructblip import DavirModel
from davir.models.vlm.lora import LoraSettings

CAPTIONS = [
    "the small red circle changed to blue",
    "someone added a large green square",
    "the small cyan square is missing",
    "the large brown triangle moved",
]
PROMPT = "Describe the difference between the two images."


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matrices: one thread is ~10× faster than two competing for a shared 2-core machine.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _pixels(batch: int, seed: int, size: int = 64) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _perturb(model: DavirModel, pattern: str, seed: int = 1) -> None:
    """Give zero-initialised trainable weights (LoRA B, segment embeddings) values, so they change outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if re.search(pattern, name):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


@pytest.fixture(scope="module")
def tiny() -> DavirModel:
    """Tiny preset in LoRA mode with segment embeddings, adapters perturbed away from their zero start."""
    model = build_davir_model(DavirModelConfig(segment_embeddings=True), captions_for_tokenizer=CAPTIONS)
    _perturb(model, r"lora_B|segment_embeddings")
    return model.eval()


# ------------------------------------------------------------------------------------------ presets, tokenizer
def test_vicuna7b_preset_has_the_instructblip_vicuna_7b_sizes():
    config = build_preset_config("vicuna7b", vocab_size=40, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    vision, qformer, text = config.vision_config, config.qformer_config, config.text_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.num_attention_heads) == (1408, 39, 16)
    assert (vision.intermediate_size, vision.patch_size, vision.image_size) == (6144, 14, 224)
    assert (vision.image_size // vision.patch_size) ** 2 + 1 == 257
    assert (qformer.hidden_size, qformer.num_hidden_layers, qformer.cross_attention_frequency) == (768, 12, 2)
    assert (qformer.encoder_hidden_size, qformer.vocab_size, config.num_query_tokens) == (1408, 30523, 32)
    assert (text.model_type, text.hidden_size, text.num_hidden_layers) == ("llama", 4096, 32)
    assert text.num_attention_heads == 32
    assert (text.intermediate_size, text.vocab_size) == (11008, 32001)
    assert set(preset_registry) >= {"tiny", "vicuna7b"}


def test_tiny_preset_and_word_tokenizer(tiny):
    vision = tiny.core.config.vision_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.image_size, vision.patch_size) == (128, 3, 64, 8)
    assert vision.initializer_range == 0.02 and tiny.patch_grid == (8, 8)
    assert tiny.core.config.qformer_config.cross_attention_frequency == 1 and tiny.num_query_tokens == 16
    assert 1.9e6 < tiny.trainable_parameter_summary()["all"][1] < 2.2e6
    tokenizer = tiny.tokenizer
    special = (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    assert special == (0, 1, 2, 3)
    ids = tokenizer("The RED circle.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the red circle."
    assert tokenizer("a zebra", add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids("a"), 1]
    # The random query tokens differ from each other (HF's zero init would keep all 16 queries identical).
    assert tiny.core.query_tokens[0].std(dim=0).min() > 0


def test_presets_reject_bad_sizes_and_names():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        build_preset_config("tiny", vocab_size=10, pad_token_id=0, bos_token_id=2, eos_token_id=3, image_size=60)
    with pytest.raises(ValueError, match="unknown model preset"):
        build_preset_config("vicuna13b", vocab_size=10, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    with pytest.raises(ValueError, match="captions_for_tokenizer"):
        build_davir_model(DavirModelConfig())
    # a pretrained folder of another size is the user's config to fix (one line), not a ValueError traceback
    from pathlib import Path

    from davir.config import ConfigError

    shipped = Path(__file__).resolve().parents[1] / "assets" / "tiny_instructblip"
    with pytest.raises(ConfigError, match=f"image_size=32 but the pretrained model at {shipped} was built for 64"):
        build_davir_model(DavirModelConfig(pretrained=str(shipped), image_size=32))


# ---------------------------------------------------------------------------------------- preprocessing, Eq. 10
def test_image_processor_resizes_and_applies_clip_normalisation(tiny):
    solid = Image.new("RGB", (100, 80), (255, 0, 128))
    pixels = tiny.image_processor([solid, solid.convert("L")])
    assert pixels.shape == (2, 3, 64, 64)
    expected = [(1.0 - 0.48145466) / 0.26862954, (0.0 - 0.4578275) / 0.26130258, (128 / 255 - 0.40821073) / 0.27577711]
    torch.testing.assert_close(pixels[0, :, 10, 20], torch.tensor(expected), rtol=0, atol=1e-4)
    # Grey → equal R, G, B values v, so channel 0 = (v − m0)/s0 follows from channel 1 = (v − m1)/s1.
    red_from_green = pixels[1, 1] * 0.26130258 / 0.26862954 + (0.4578275 - 0.48145466) / 0.26862954
    assert torch.allclose(pixels[1, 0], red_from_green, atol=1e-4)


def test_build_prompts_follows_eq10(tiny):
    prompts = tiny.build_prompts([["red circle", "blue cube"], [], ["  green square "]])
    assert prompts == [
        f"{PROMPT} Entity: red circle.",  # k = 1 by default
        PROMPT,  # no entity retrieved
        f"{PROMPT} Entity: green square.",
    ]
    assert tiny.build_prompts(None, batch_size=2) == [PROMPT, PROMPT]
    with pytest.raises(ValueError, match="batch_size"):
        tiny.build_prompts(None)


def test_entity_prompts_with_two_entities_and_entities_off():
    two = EpcConfig(num_entities=2)
    expected = [f"{PROMPT} Entity: red circle, blue cube."]
    assert entity_prompts(two, [["red circle", "blue cube", "cyan sphere"]]) == expected
    assert entity_prompts(EpcConfig(use_entities=False), [["red circle"]]) == [PROMPT]
    custom = EpcConfig(prompt="What changed?", entity_prefix="Objects:")
    assert entity_prompts(custom, [["tree"]]) == ["What changed? Objects: tree."]


# ------------------------------------------------------------------------------------------- forward and losses
def test_caption_loss_counts_only_caption_tokens(tiny):
    prompts = tiny.build_prompts([["red circle"], []])
    with torch.no_grad():
        out = tiny(_pixels(2, 2), _pixels(2, 3), prompts, CAPTIONS[:2])
    visual = 2 * tiny.num_query_tokens
    prompt_ids = [tiny.tokenizer(p)["input_ids"] for p in prompts]
    eos = tiny.tokenizer.eos_token_id
    caption_ids = [tiny.tokenizer(c, add_special_tokens=False)["input_ids"] + [eos] for c in CAPTIONS[:2]]
    length = visual + max(len(p) + len(c) for p, c in zip(prompt_ids, caption_ids))
    assert out.logits.shape == (2, length, len(tiny.tokenizer))
    for row in range(2):
        start = visual + len(prompt_ids[row])
        assert (out.labels[row, :start] == -100).all()  # visual tokens and prompt
        assert out.labels[row, start : start + len(caption_ids[row])].tolist() == caption_ids[row]
        assert (out.labels[row, start + len(caption_ids[row]) :] == -100).all()  # right padding
    # Independent recomputation: CE of the logit one position before each caption token.
    terms = []
    for row in range(2):
        start = visual + len(prompt_ids[row])
        for offset, token in enumerate(caption_ids[row]):
            terms.append(F.cross_entropy(out.logits[row, start + offset - 1][None], torch.tensor([token])))
    assert out.caption_loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)


def test_total_loss_is_caption_plus_lambda_fac_and_fac_reaches_only_the_vision_side(tiny):
    masks = torch.zeros(2, 64, 64)
    masks[0, 8:24, 16:40] = 1.0
    masks[1, 40:64, 0:16] = 1.0
    tiny.zero_grad()
    out = tiny(_pixels(2, 4), _pixels(2, 5), [PROMPT] * 2, CAPTIONS[2:], masks, masks, torch.tensor([True, True]))
    assert out.fac_pairs == 2
    recomputed = fac_attention_loss(out.attention_before, out.attention_after, masks, masks, None, tiny.config.fac)
    assert out.attn_loss.item() == pytest.approx(recomputed.loss.item(), rel=1e-6)
    assert out.loss.item() == pytest.approx(out.caption_loss.item() + 0.1 * out.attn_loss.item(), rel=1e-6)
    out.attn_loss.backward()
    grads = {n: p.grad for n, p in tiny.named_parameters() if p.requires_grad}
    vision_b = [g for n, g in grads.items() if "vision_model" in n and "lora_B" in n]
    llm = [g for n, g in grads.items() if "language_model" in n]
    assert len(vision_b) == 3 and all(g is not None and g.abs().sum() > 0 for g in vision_b)
    assert all(g is None or g.abs().sum() == 0 for g in llm)
    tiny.zero_grad()


def test_empty_or_invalid_masks_give_no_fac_term(tiny):
    full = torch.ones(2, 64, 64)
    with torch.no_grad():
        inputs = (_pixels(2, 6), _pixels(2, 7), [PROMPT] * 2, CAPTIONS[:2])
        empty = tiny(*inputs, torch.zeros(2, 64, 64), torch.zeros(2, 64, 64))
        invalid = tiny(*inputs, full, full, torch.tensor([False, False]))
        no_masks = tiny(*inputs)
    for out in (empty, invalid):
        assert out.fac_pairs == 0 and out.attn_loss.item() == 0.0
        assert out.loss.item() == pytest.approx(out.caption_loss.item())
    assert no_masks.attn_loss is None and no_masks.loss.item() == pytest.approx(empty.caption_loss.item(), rel=1e-6)


# ----------------------------------------------------------------------------------------------------- LoRA
def test_lora_ranks_and_trainable_parameters_per_part():
    config = DavirModelConfig(
        preset_overrides={"qformer_layers": 4, "cross_attention_frequency": 2, "vision_layers": 2, "text_layers": 2},
        lora=LoraSettings(llm_targets=("q_proj", "k_proj", "v_proj")),
    )
    model = build_davir_model(config, captions_for_tokenizer=CAPTIONS)
    lora_layers = {
        name.removeprefix("base_model.model."): module
        for name, module in model.blip.named_modules()
        if hasattr(module, "lora_A") and "default" in module.lora_A
    }
    expected = {f"vision_model.encoder.layers.{i}.self_attn.qkv": 4 for i in range(2)}
    for i in range(4):
        for proj in ("query", "key", "value"):
            expected[f"qformer.encoder.layer.{i}.attention.attention.{proj}"] = 4
            if i % 2 == 0:  # cross-attention only in layers 0 and 2
                expected[f"qformer.encoder.layer.{i}.crossattention.attention.{proj}"] = 4
    for i in range(2):
        for proj in ("q_proj", "k_proj", "v_proj"):
            expected[f"language_model.model.layers.{i}.self_attn.{proj}"] = 8
    assert {name: layer.r["default"] for name, layer in lora_layers.items()} == expected
    for layer in lora_layers.values():
        assert layer.scaling["default"] == pytest.approx(2.0)  # alpha = 2r
        assert layer.lora_dropout["default"].p == pytest.approx(0.05)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(re.search(r"\.lora_[AB]\.default\.weight$", n) for n in trainable)
    summary = model.trainable_parameter_summary()
    assert summary["vision"][0] == 2 * (4 * 128 + 384 * 4)
    assert summary["qformer"][0] == (12 + 6) * (4 * 128 + 128 * 4)
    assert summary["language_model"][0] == 2 * 3 * (8 * 128 + 128 * 8)
    assert summary["query_tokens"][0] == summary["language_projection"][0] == 0
    assert summary["all"][0] == summary["vision"][0] + summary["qformer"][0] + summary["language_model"][0]


def test_llm_gradient_checkpointing_changes_neither_losses_nor_gradients():
    masks = torch.zeros(2, 64, 64)
    masks[:, 16:32, 16:32] = 1.0
    results = []
    for checkpointing in (False, True):
        config = DavirModelConfig(gradient_checkpointing=checkpointing)
        model = build_davir_model(config, captions_for_tokenizer=CAPTIONS)
        _perturb(model, r"lora_B")
        model.eval()  # no dropout, so both passes compute the same function
        out = model(_pixels(2, 14), _pixels(2, 15), [PROMPT] * 2, CAPTIONS[:2], masks, masks)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((out.loss.item(), grads, model.core.language_model.is_activation_checkpointing))
    (loss_plain, grads_plain, off), (loss_ckpt, grads_ckpt, on) = results
    assert (off, on) == (False, True)
    assert loss_ckpt == pytest.approx(loss_plain, rel=1e-6)
    assert grads_plain.keys() == grads_ckpt.keys()
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-4, atol=1e-7)


def test_segment_embeddings_are_a_part_of_their_own(tiny):
    """(Where LoRA sits, o_proj included, and what the other parts train: tests/test_family_contract.py.)"""
    assert tiny.trainable_parameter_summary()["segment_embeddings"] == (2 * 128, 2 * 128)


# ------------------------------------------------------------------------------------------------- generation
def test_batched_generation_equals_one_pair_at_a_time(tiny):
    before, after = _pixels(3, 8), _pixels(3, 9)
    prompts = tiny.build_prompts([["red circle"], [], ["large green square"]])  # different prompt lengths
    batched = tiny.generate(before, after, prompts, max_new_tokens=6)
    single = [
        tiny.generate(before[i : i + 1], after[i : i + 1], prompts[i : i + 1], max_new_tokens=6)[0] for i in range(3)
    ]
    assert batched == single
    assert all(isinstance(c, str) and c for c in batched)
    captions, attention_before, attention_after = tiny.generate(
        before, after, prompts, max_new_tokens=6, return_attention=True
    )
    assert captions == batched and attention_before.shape == attention_after.shape == (3, 8, 8)


# ------------------------------------------------------------------------------------------------ save / load
def test_save_load_lora_mode_gives_identical_logits_and_captions(tiny, tmp_path):
    before, after = _pixels(2, 10), _pixels(2, 11)
    prompts = tiny.build_prompts([["red circle"], []])
    with torch.no_grad():
        reference = tiny(before, after, prompts, CAPTIONS[:2]).logits
    tiny.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "adapter" / "adapter_model.safetensors").is_file()
    loaded = DavirModel.from_pretrained(tmp_path / "model").eval()
    assert loaded.config == tiny.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(before, after, prompts, CAPTIONS[:2]).logits, reference, rtol=0, atol=0)
    reference_captions = tiny.generate(before, after, prompts, max_new_tokens=6)
    assert loaded.generate(before, after, prompts, max_new_tokens=6) == reference_captions


def test_pretrained_folder_saves_only_adapters_and_reloads_identically(tmp_path):
    # A stand-in for a local instructblip-vicuna-7b folder: tiny weights + processor written the HF way.
    tokenizer = build_word_tokenizer(CAPTIONS + [PROMPT, "Entity:"])
    processor = InstructBlipProcessor(
        image_processor=clip_image_processor(64), tokenizer=tokenizer, qformer_tokenizer=tokenizer, num_query_tokens=16
    )
    architecture = build_preset_config(
        "tiny", vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=2, eos_token_id=3
    )
    base = tmp_path / "instructblip"
    FAMILY.random_core(architecture, DavirModelConfig(seed=3), torch.device("cpu")).save_pretrained(base)
    processor.save_pretrained(base)

    config = DavirModelConfig(pretrained=str(base), extra_trainable=("language_projection",))
    model = build_davir_model(config)
    _perturb(model, r"lora_B|language_projection")
    model.eval()
    before, after, prompts = _pixels(2, 12), _pixels(2, 13), [PROMPT] * 2
    with torch.no_grad():
        reference = model(before, after, prompts, CAPTIONS[:2]).logits
    model.save_pretrained(tmp_path / "run")
    assert not (tmp_path / "run" / "model.safetensors").exists()  # the base is re-read from `pretrained`
    assert (tmp_path / "run" / "trainable_extra.safetensors").is_file()
    loaded = DavirModel.from_pretrained(tmp_path / "run").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(before, after, prompts, CAPTIONS[:2]).logits, reference, rtol=0, atol=0)

    with pytest.raises(DataError, match="not found"):
        build_davir_model(DavirModelConfig(pretrained=str(tmp_path / "missing")))
    with pytest.raises(DataError, match="config.json"):
        build_davir_model(DavirModelConfig(pretrained=str(tmp_path / "run")))


# ------------------------------------------------------------------------------------- full mode: overfit, save
@pytest.fixture(scope="module")
def overfit():
    """Tiny model, every weight trained (random weights), 60 AdamW steps on 4 fixed pairs. Seeded: dropout draws from
    the global generator, which other tests in the same process move. 25 steps missed the bar below for 1 of 8
    seeds (0.45), 60 steps reach 0.008-0.044 for all 8."""
    torch.manual_seed(0)
    model = build_davir_model(DavirModelConfig(train_mode="full"), captions_for_tokenizer=CAPTIONS)
    before, after = _pixels(4, 20), _pixels(4, 21)
    prompts = [PROMPT] * 4
    model.eval()
    with torch.no_grad():
        initial = model(before, after, prompts, CAPTIONS).caption_loss.item()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    model.train()
    for _ in range(60):
        loss = model(before, after, prompts, CAPTIONS).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        final = model(before, after, prompts, CAPTIONS).caption_loss.item()
    return model, (before, after, prompts), initial, final


def test_full_mode_trains_every_weight_without_lora(overfit):
    model = overfit[0]
    summary = model.trainable_parameter_summary()
    assert summary["all"][0] == summary["all"][1] > 2e6
    assert not any("lora_" in n for n, _ in model.named_parameters())


def test_overfitting_four_pairs_uses_the_images(overfit):
    _, _, initial, final = overfit
    assert initial > math.log(10)  # ~uniform over a 35-word vocabulary at the start
    # Without looking at the images the best possible token-mean loss on these 4 captions (28 tokens) is
    # [3·ln(4/3) + ln 4 ("the"/"someone") + 2·ln(3/2) + ln 3 ("small"/"large") + 2·ln 2 ("red"/"cyan")] / 28.
    blind_floor = (3 * math.log(4 / 3) + math.log(4) + 2 * math.log(3 / 2) + math.log(3) + 2 * math.log(2)) / 28
    assert blind_floor == pytest.approx(0.198, abs=1e-3)
    assert final < 0.75 * blind_floor


def test_save_load_full_mode_gives_identical_logits_and_captions(overfit, tmp_path):
    model, (before, after, prompts), _, _ = overfit
    with torch.no_grad():
        reference = model(before, after, prompts, CAPTIONS).logits
    model.save_pretrained(tmp_path / "full")
    assert not (tmp_path / "full" / "adapter").exists()
    loaded = DavirModel.from_pretrained(tmp_path / "full").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(before, after, prompts, CAPTIONS).logits, reference, rtol=0, atol=0)
    captions = loaded.generate(before, after, prompts, max_new_tokens=10)
    assert captions == model.generate(before, after, prompts, max_new_tokens=10)
    assert sum(c == ref for c, ref in zip(captions, CAPTIONS)) >= 3  # memorised, image by image
