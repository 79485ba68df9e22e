"""The paper configs, preprocessing profiles, the meaning of λ, test-time decoding and the smaller paper-path
defects (tokenizer truncation side, FSDP validation, OpenAI CLIP's QuickGELU)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from davir.config import load_config
from davir.errors import DataError
from davir.models.losses import FacConfig, fac_attention_loss
from davir.preprocessing.profiles import (
    ENTITY_OPTIONS,
    MASK_OPTIONS,
    check_cache_profiles,
    entity_profile,
    mask_profile,
)
from davir.runs.config import TrainConfig
from davir.runs.paths import run_decoding

REPO = Path(__file__).resolve().parents[1]
PAPER_CONFIGS = sorted((REPO / "configs").glob("davir_*.yaml"))


# --------------------------------------------------------------------------------------- the paper configs (5, 6)
@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_configs_follow_the_paper_as_written(path):
    config = load_config(TrainConfig, path, [])
    fac, model = config.model.fac, config.model
    # Eq. 7: KL(softmax(A) || softmax(M^)), one mask (the after image's) for both maps; λ = 0.1 (Table 7).
    assert (fac.loss_type, fac.attn_norm, fac.mask_source, fac.kl_direction) == (
        "kl",
        "softmax",
        "after_only",
        "attn_mask",
    )
    assert fac.lambda_attn == 0.1 and model.epc.use_entities and model.epc.num_entities == 1
    # App. B: LoRA 4/4/8, everything else frozen; 20 epochs of batch 16 at 1e-5.
    assert (model.lora.vision_rank, model.lora.qformer_rank, model.lora.llm_rank) == (4, 4, 8)
    assert model.extra_trainable == () and not model.segment_embeddings and model.train_mode == "lora"
    assert (config.optim.epochs, config.optim.batch_size, config.optim.lr) == (20, 16, 1e-5)
    # an epoch = one pass over the pairs, one reference each (FINER-MLLM's convention, the usual step counts)
    assert config.data.caption_mode == "sample" and config.optim.max_steps is None
    assert config.data.preprocessing_profile == "paper" and not config.data.allow_profile_mismatch
    text = path.read_text()
    assert "--profile paper" in text and "ViT-L-14 " not in text  # OpenAI CLIP = ViT-L-14-quickgelu


def test_demo_config_expects_the_toolkit_profile():
    assert load_config(TrainConfig, REPO / "configs" / "demo.yaml", []).data.preprocessing_profile == "toolkit"


# ------------------------------------------------------------------------------------------ what λ means (5)
def test_initial_attention_kl_by_hand_softmax_vs_sum():
    """Uniform attention (a fresh model's) against a mask on k of N patches, no blur: with σ = softmax
    (Eq. 7 as written) KL = log(Z/N) − k/N, Z = k·e + (N − k): 0.033 nats for k = 13 of 256; with the sum
    norm and its 1e-6 floor KL ≈ (1 − k/N)·log(k/(N·eps)) + (k/N)·log(k/N): 10.1 nats, ~300x more, so the
    same λ weighs the attention term ~300x more."""
    n_side, k = 16, 13
    mask = torch.zeros(1, n_side, n_side)
    mask.view(-1)[:k] = 1.0
    attention = torch.full((1, n_side, n_side), 1.0 / n_side**2)
    n = n_side**2
    z = k * math.e + (n - k)
    expected_softmax = math.log(z / n) - k / n
    eps = 1e-6
    p_in, p_out = (1 + eps) / (k + n * eps), eps / (k + n * eps)
    expected_sum = ((n - k) / n) * math.log((1 / n) / p_out) + (k / n) * math.log((1 / n) / p_in)
    for norm, expected in (("softmax", expected_softmax), ("sum", expected_sum)):
        config = FacConfig(attn_norm=norm, mask_source="after_only", blur_kernel_size=1)
        loss = fac_attention_loss(attention, attention, None, mask, config=config).loss
        assert float(loss) == pytest.approx(2 * expected, rel=1e-5)  # Eq. 7 sums the before and after terms
    assert expected_softmax == pytest.approx(0.0329, abs=1e-4) and expected_sum == pytest.approx(10.14, abs=0.01)


def test_paper_fac_supervises_both_maps_with_the_one_after_mask():
    before_mask, after_mask = torch.zeros(1, 4, 4), torch.zeros(1, 4, 4)
    before_mask[0, 0, 0], after_mask[0, 3, 3] = 1, 1
    attention = torch.rand(1, 4, 4)
    paper = FacConfig(attn_norm="softmax", mask_source="after_only", blur_kernel_size=1)
    both_after = fac_attention_loss(attention, attention, after_mask, after_mask, config=paper).loss
    assert float(fac_attention_loss(attention, attention, before_mask, after_mask, config=paper).loss) == float(
        both_after
    )


# ------------------------------------------------------------------------------------------ profiles (4)
def _mask_settings(**changes):
    regions = {"register": "ecc", "photometric": "affine", "tolerance_px": 2, "cluster_stride": 2, "tau": 0.4}
    regions.update({k: v for k, v in changes.items() if k in regions})
    return {
        "regions": regions,
        "segmenter": {"segmenter": changes.get("segmenter", "classical")},
        "segment_both": changes.get("segment_both", True),
    }


def test_profiles_are_derived_from_the_recorded_settings():
    from davir.preprocessing.change_regions import RegionSettings

    defaults = RegionSettings()
    toolkit = MASK_OPTIONS["toolkit"]
    assert (defaults.register, defaults.photometric, defaults.tolerance_px, defaults.cluster_stride) == (
        toolkit["register"],
        toolkit["photometric"],
        toolkit["tolerance_px"],
        toolkit["cluster_stride"],
    )
    assert mask_profile(_mask_settings()) == "toolkit"
    assert (
        mask_profile(
            _mask_settings(
                segmenter="sam",
                segment_both=False,
                register="none",
                photometric="none",
                tolerance_px=0,
                cluster_stride=1,
            )
        )
        == "paper"
    )
    assert mask_profile(_mask_settings(segmenter="sam")) == "custom"
    paper = {
        "retrieval": "region",
        **{k: ENTITY_OPTIONS["paper"][k] for k in ("retriever", "entity_gate", "mask_source", "mask_weighting")},
    }
    assert entity_profile(paper) == "paper" and entity_profile({**paper, "entity_gate": "fitted"}) == "custom"
    assert entity_profile({**paper, "retrieval": "image"}) == "custom"


@pytest.fixture(scope="module")
def toolkit_masks(tmp_path_factory):
    from davir.data.synthetic import SynthConfig, generate_dataset
    from davir.jobs import masks

    sys.path.insert(0, str(REPO))
    base = tmp_path_factory.mktemp("profiles")
    generate_dataset(base / "data", SynthConfig(scenes=20, seed=1, width=96, height=72), workers=1)
    assert (
        masks.main(
            [
                "--format",
                "clevr_change",
                "--root",
                str(base / "data"),
                "--split",
                "train",
                "--out",
                str(base / "masks"),
                "--limit",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    return base


def test_mask_manifest_records_its_profile(toolkit_masks):
    manifest = json.loads((toolkit_masks / "masks" / "manifest.json").read_text())
    assert manifest["profile"] == "toolkit" and manifest["profile_requested"] == "toolkit"
    assert manifest["profile_deviations"] == {}


def test_train_refuses_a_cache_of_another_profile(toolkit_masks, capsys):
    from davir.cli import train

    argv = [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"data.root={toolkit_masks / 'data'}",
        f"data.masks={toolkit_masks / 'masks'}",
        "data.entities=null",
        "model.epc.use_entities=false",
        "data.preprocessing_profile=paper",
        f"run.output_dir={toolkit_masks / 'run'}",
        "run.tensorboard=false",
    ]
    assert train.main(argv) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert (
        first.startswith(
            f"error: the masks cache {toolkit_masks / 'masks'} was made with preprocessing profile 'toolkit'"
        )
        and "expects profile 'paper'" in first
    )
    assert "--profile paper" in first and "data.allow_profile_mismatch=true" in first
    assert not (toolkit_masks / "run").exists()  # a refused run leaves no run folder behind
    # Overridden explicitly: a warning, and the run goes on (to the next check: only 2 pairs have masks).
    assert train.main([*argv, "data.allow_profile_mismatch=true"]) == 2
    captured = capsys.readouterr()
    assert "warning: the masks cache" in captured.out and "(accepted)" in captured.out
    assert "have no change mask" in captured.err


def test_check_cache_profiles_entities(tmp_path):
    cache = tmp_path / "entities"
    (cache / "entities").mkdir(parents=True)
    (cache / "entities" / "manifest.json").write_text(
        json.dumps(
            {
                "settings": {
                    "retrieval": "region",
                    "retriever": "fitted",
                    "entity_gate": "fitted",
                    "mask_source": "per_image",
                    "mask_weighting": "binary",
                }
            }
        )
    )
    assert check_cache_profiles("toolkit", entities=cache) == {"entities": "toolkit"}
    with pytest.raises(DataError, match=r"entities cache .* profile 'toolkit' .* expects profile 'paper'"):
        check_cache_profiles("paper", entities=cache, where="the run R", override="--allow-profile-mismatch")
    assert check_cache_profiles(None, entities=cache) == {"entities": "toolkit"}  # no expectation, no check


def test_a_cheer_paper_cache_is_not_a_davir_paper_cache(tmp_path):
    """Both levels have a `paper` profile: CHEER's image-level entities (CLIP, S_bef − S_aft) pass a CHEER run's
    check, and a DAVIR run (region-level entities, Eqs. 8-9) refuses them by their level, naming it."""
    cache = tmp_path / "entities"
    (cache / "entities").mkdir(parents=True)
    (cache / "entities" / "manifest.json").write_text(
        json.dumps({"settings": {"retrieval": "image", "retriever": "clip", "image_score": "bef_minus_aft"}})
    )
    assert check_cache_profiles("paper", entities=cache, entity_level="image") == {"entities": "paper"}
    assert check_cache_profiles("paper", entities=cache) == {"entities": "paper"}  # the profile alone cannot tell
    with pytest.raises(DataError, match=r"holds image-level entities, but the run R needs region-level ones"):
        check_cache_profiles("paper", entities=cache, where="the run R", entity_level="region")


# ------------------------------------------------------------------------------------------ decoding (3)
def test_run_decoding_defaults_to_the_runs_validation_settings(tmp_path):
    (tmp_path / "run" / "best").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("run:\n  num_beams: 5\n  max_new_tokens: 40\n")
    decoding = run_decoding(tmp_path / "run" / "best")
    assert (decoding["num_beams"], decoding["max_new_tokens"]) == (5, 40)
    assert decoding["source"]["num_beams"] == str(tmp_path / "run" / "config.yaml")
    assert run_decoding(tmp_path / "run", num_beams=1)["num_beams"] == 1  # a flag overrides
    assert (run_decoding(None)["num_beams"], run_decoding(None)["max_new_tokens"]) == (1, 30)
    with pytest.raises(DataError, match="num_beams must be >= 1"):
        run_decoding(tmp_path / "run", num_beams=0)


# ------------------------------------------------------------------------------------------ smaller ones (7)
def test_captions_are_truncated_at_the_end_whatever_the_tokenizer_says():
    from davir.models.families.instructblip import FAMILY
    from davir.models.vlm.config import DavirModelConfig
    from davir.models.vlm.instructblip import DavirModel

    caption = "the small red metal cube has moved to the left of the sphere"
    config = DavirModelConfig(
        train_mode="full",
        max_caption_tokens=4,
        preset_overrides={"vision_layers": 1, "qformer_layers": 1, "text_layers": 1},
    )
    core, processor = FAMILY.build_core(config, [caption, config.epc.prompt], torch.device("cpu"))
    processor.tokenizer.truncation_side = "left"  # as the HF InstructBLIP folders ship it
    processor.qformer_tokenizer.truncation_side = "left"
    model = DavirModel(config, core, processor)
    ids = model._caption_ids([caption])[0]
    assert model.tokenizer.decode(ids[:-1]) == "the small red" and ids[-1] == model.tokenizer.eos_token_id


def test_fsdp_validation_keeps_every_rank_generating():
    from accelerate.utils import DistributedType

    from davir.training.validation import Validator

    class FakeAccelerator:
        distributed_type, num_processes = DistributedType.FSDP, 2

    validator = Validator.__new__(Validator)
    validator.accelerator = FakeAccelerator()
    assert validator.generate_kwargs() == {"synced_gpus": True}
    FakeAccelerator.num_processes = 1
    assert validator.generate_kwargs() == {}


def test_openai_clip_weights_need_quickgelu(tmp_path):
    from davir.models.clip_loader import load_open_clip

    checkpoint = tmp_path / "clip-vit-l-14-openai.bin"
    checkpoint.write_bytes(b"x")
    with pytest.raises(DataError, match="--clip-model ViT-L-14-quickgelu"):
        load_open_clip("ViT-L-14", checkpoint)
