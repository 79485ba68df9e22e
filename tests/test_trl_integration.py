"""FAC inside TRL's SFTTrainer (davir.integrations.trl) on the CPU: a toy Qwen2.5-VL folder trained on the TRL
export of the synthetic set, masks read from a davir mask cache by pair id. The attention term is logged, the
EPC prompt comes from an entity cache, and after 60 steps the attention share inside the change mask (the measure
evaluate.py reports, davir.evaluation.localisation) is higher with FAC than with the same run without it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.data.caches import EntityCache, MaskCache  # noqa: E402
from davir.data.formats import read_dataset  # noqa: E402
from davir.data.images import load_mask  # noqa: E402
from davir.data.toolkits import export_toolkit  # noqa: E402
from davir.evaluation.localisation import localisation_summary  # noqa: E402
from davir.integrations.prompts import epc_prompt_for  # noqa: E402
from davir.models.families import get_family  # noqa: E402
from davir.models.losses import FacConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIZE, GRID, STEPS = 64, (8, 8), 60


@pytest.fixture(scope="module")
def setup(synthetic_set, tmp_path_factory):
    """The TRL export of the train split, a mask cache of its ground-truth masks, and a user's toy Qwen2.5-VL."""
    root = synthetic_set(24, 0)
    base = tmp_path_factory.mktemp("trl_fac")
    pairs = read_dataset("clevr_change", root, "train").pairs
    cache = MaskCache(base / "masks")
    for pair in pairs:
        cache.write(pair.pair_id, load_mask(pair.gt_mask_before), load_mask(pair.gt_mask_after), {"source": "gt"})
    export_toolkit("trl", "clevr_change", root, ["train"], base / "trl", prompt_for=epc_prompt_for())
    texts = [c for p in pairs for c in p.captions] + [EpcConfig().prompt, EpcConfig().entity_prefix, "small red cube"]
    folder = write_chat_folder("qwen2_5_vl", base / "qwen", texts)
    return SimpleNamespace(base=base, pairs=pairs, folder=folder)


def _dataset(setup):
    from datasets import Image as ImageFeature
    from datasets import Sequence, load_dataset

    dataset = load_dataset("json", data_files={"train": str(setup.base / "trl" / "train.jsonl")})["train"]
    return dataset.cast_column("images", Sequence(ImageFeature()))


def _trainer(setup, lambda_attn: float, **settings):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration
    from trl import SFTConfig

    from davir.integrations.trl import DavirSFTTrainer, DavirTrlSettings

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(setup.folder))
    processor = AutoProcessor.from_pretrained(str(setup.folder))
    args = SFTConfig(
        output_dir=str(setup.base / f"run_{lambda_attn}"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        seed=0,
        max_length=None,
        disable_tqdm=True,
    )
    fac = FacConfig(lambda_attn=lambda_attn, attn_norm="sum", mask_source="per_image")
    davir = DavirTrlSettings(family="qwen2_5_vl", image_size=SIZE, masks=setup.base / "masks", fac=fac, **settings)
    return DavirSFTTrainer(
        model=model, args=args, train_dataset=_dataset(setup), processing_class=processor, davir=davir
    ), processor


def attention_share(model, processor, pairs) -> dict:
    """localisation_summary over the changed pairs: FAC's map from the family's own hook, after one vision pass."""
    family = get_family("qwen2_5_vl")
    hook = family.attention_hook(model).attach()
    results, masks = [], {}
    try:
        with torch.no_grad():
            for pair in pairs:
                pictures = [
                    Image.open(path).convert("RGB").resize((SIZE, SIZE), Image.Resampling.BICUBIC)
                    for path in (pair.before, pair.after)
                ]
                pixels = processor.image_processor(images=pictures, return_tensors="pt")
                model.model.get_image_features(pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
                before, after = family.attention_maps(hook.pop(), 2, GRID).numpy()
                results.append(
                    SimpleNamespace(pair_id=pair.pair_id, error=None, attention_before=before, attention_after=after)
                )
                masks[pair.pair_id] = (load_mask(pair.gt_mask_before), load_mask(pair.gt_mask_after))
    finally:
        hook.detach()
    return localisation_summary(results, masks)


@pytest.mark.slow
def test_fac_in_sft_trainer_raises_the_attention_share(setup):
    changed = [p for p in setup.pairs if load_mask(p.gt_mask_after).any() or load_mask(p.gt_mask_before).any()][:8]
    shares, logs = {}, {}
    for lambda_attn in (0.0, 1.0):
        trainer, processor = _trainer(setup, lambda_attn)
        start = attention_share(trainer.model, processor, changed)
        trainer.train()
        logs[lambda_attn] = [row for row in trainer.state.log_history if "loss" in row]
        shares[lambda_attn] = attention_share(trainer.model, processor, changed)["attention_share_in_mask"]
    print(
        f"attention share in mask after {STEPS} steps: start {start['attention_share_in_mask']:.3f} (uniform "
        f"{start['uniform_share']:.3f}), without FAC {shares[0.0]:.3f}, with FAC {shares[1.0]:.3f}"
    )
    # the attention term is logged beside TRL's own metrics, on the pairs that have a change
    assert all("attn_loss" in row and row["attn_loss"] > 0 and row["fac_pairs"] > 0 for row in logs[1.0])
    assert len(logs[1.0]) == STEPS // 10 and all("attn_loss" not in row for row in logs[0.0])
    assert logs[1.0][-1]["attn_loss"] < logs[1.0][0]["attn_loss"]
    assert shares[1.0] > shares[0.0] + 0.05 and shares[1.0] > 2 * start["uniform_share"]


def test_collator_reads_masks_and_entities_by_pair_id(setup):
    """The batch carries each pair's masks on the S×S picture (a pair missing from the cache is left out of FAC),
    and the user turn's text becomes the pair's EPC prompt from the entity cache."""
    first = setup.pairs[0]
    entities = EntityCache(setup.base / "entities")
    # every training pair has entities (the trainer checks at start), and so has the collated "no-masks" row
    pair_ids = [pair.pair_id for pair in setup.pairs] + ["no-masks"]
    entities.write_part("0", {pair_id: [["small red cube", 0.9]] for pair_id in pair_ids})
    trainer, processor = _trainer(setup, 1.0, entities=setup.base / "entities")
    row = _dataset(setup)[0]
    assert row["id"] == first.pair_id
    batch = trainer.data_collator([row, dict(row, id="no-masks")])
    assert batch["davir_masks_after"].shape == (2, SIZE, SIZE) and batch["davir_mask_valid"].tolist() == [True, False]
    expected = Image.fromarray(load_mask(first.gt_mask_after).astype("float32"), mode="F").resize(
        (SIZE, SIZE), Image.BOX
    )
    assert torch.allclose(batch["davir_masks_after"][0], torch.tensor(list(expected.getdata())).reshape(SIZE, SIZE))
    assert batch["image_grid_thw"].tolist() == [[1, 8, 8]] * 4  # S×S pictures: one patch grid for every image
    text = processor.tokenizer.decode(batch["input_ids"][0])
    assert f"{EpcConfig().prompt} Entity: small red cube." in text
    trainer._set_signature_columns_if_needed()  # what Trainer keeps of the dataset's columns: the pair id too
    assert "id" in trainer._signature_columns and "images" in trainer._signature_columns
