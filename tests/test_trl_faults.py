"""The TRL integration and the TRL reader when something is off (issue 49): a mask cache that is not there or
belongs to other data, photos with an EXIF orientation, malformed TRL rows, and image paths that leave the
downloaded dataset's folder."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.data.caches import EntityCache, MaskCache  # noqa: E402
from davir.data.formats import read_dataset  # noqa: E402
from davir.data.images import load_mask  # noqa: E402
from davir.data.toolkits import export_toolkit  # noqa: E402
from davir.errors import DataError  # noqa: E402
from davir.integrations.prompts import epc_prompt_for  # noqa: E402
from davir.models.losses import FacConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIZE = 64


@pytest.fixture(scope="module")
def setup(synthetic_set, tmp_path_factory):
    root = synthetic_set(24, 0)
    base = tmp_path_factory.mktemp("trl_faults")
    export_toolkit("trl", "clevr_change", root, ["train"], base / "trl", prompt_for=epc_prompt_for())
    pairs = read_dataset("clevr_change", root, "train").pairs
    texts = [c for p in pairs for c in p.captions] + [EpcConfig().prompt, EpcConfig().entity_prefix]
    return SimpleNamespace(base=base, pairs=pairs, folder=write_chat_folder("qwen2_5_vl", base / "qwen", texts))


def _dataset(path: Path):
    from datasets import Image, Sequence, load_dataset

    return load_dataset("json", data_files={"train": str(path)})["train"].cast_column("images", Sequence(Image()))


def _trainer(setup, masks, dataset=None, entities=None):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration
    from trl import SFTConfig

    from davir.integrations.trl import DavirSFTTrainer, DavirTrlSettings

    args = SFTConfig(
        output_dir=str(setup.base / "run"),
        max_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        max_length=None,
        disable_tqdm=True,
    )
    return DavirSFTTrainer(
        model=Qwen2_5_VLForConditionalGeneration.from_pretrained(str(setup.folder)),
        args=args,
        train_dataset=dataset or _dataset(setup.base / "trl" / "train.jsonl"),
        processing_class=AutoProcessor.from_pretrained(str(setup.folder)),
        davir=DavirTrlSettings(
            family="qwen2_5_vl", image_size=SIZE, masks=masks, entities=entities, fac=FacConfig(lambda_attn=1.0)
        ),
    )


def test_a_mask_cache_that_is_not_there_stops_the_trainer(setup, tmp_path, caplog):
    """Issue 49.4: a typo in `masks=` is an error (it turned FAC off: every pair invalid, `fac_pairs=0`); a cache
    for other data (no pair of the dataset in it) too; pairs without a mask are counted at start."""
    with pytest.raises(DataError, match="no such folder"):
        _trainer(setup, tmp_path / "cahces" / "masks")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a davir mask cache"):
        _trainer(setup, tmp_path / "empty")
    other = MaskCache(tmp_path / "other")
    other.write("not-a-pair-of-this-set", np.ones((4, 4), bool), np.ones((4, 4), bool), {"source": "gt"})
    total = len(setup.pairs)
    assert total == 40
    with pytest.raises(DataError, match=rf"none of the {total} training pairs has a change mask"):
        _trainer(setup, tmp_path / "other")

    cache = MaskCache(tmp_path / "masks")
    for pair in setup.pairs[:-4]:
        cache.write(pair.pair_id, load_mask(pair.gt_mask_before), load_mask(pair.gt_mask_after), {"source": "gt"})
    with caplog.at_level(logging.WARNING, logger="davir.integrations.trl"):
        trainer = _trainer(setup, tmp_path / "masks")
    assert trainer.fac_coverage["pairs"] == total and trainer.fac_coverage["with_masks"] == total - 4
    assert sorted(trainer.fac_coverage["missing"]) == sorted(p.pair_id for p in setup.pairs[-4:])
    assert f"FAC: 4 of {total} training pairs have no change mask" in caplog.text


def test_an_entity_cache_that_is_not_there_stops_the_trainer_at_start(setup, tmp_path):
    """A typo in `entities=` was accepted, and the first batch of `trainer.train()` stopped with "pair … has no
    retrieved entities in TYPO; run `preprocess entities --out TYPO …`": it is an error at construction, as for
    `masks=`, and so is a cache lacking training pairs (EPC needs each pair's entities)."""
    with pytest.raises(DataError, match="entities=.*no such folder"):
        _trainer(setup, None, entities=tmp_path / "entitiez")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a davir entity cache"):
        _trainer(setup, None, entities=tmp_path / "empty")
    cache = EntityCache(tmp_path / "entities")
    cache.write_part("train-0", {pair.pair_id: [("red cube", 0.9)] for pair in setup.pairs[:-3]})
    with pytest.raises(DataError, match=rf"3 of {len(setup.pairs)} training pairs have no entities"):
        _trainer(setup, None, entities=tmp_path / "entities")
    cache.write_part("train-1", {pair.pair_id: [("red cube", 0.9)] for pair in setup.pairs[-3:]})
    trainer = _trainer(setup, None, entities=tmp_path / "entities")
    assert "red cube" in trainer.data_collator.prompt_for(setup.pairs[-1].pair_id)


def _sideways_photo(path: Path) -> Path:
    """A 96×72 picture stored sideways with EXIF orientation 6 (a phone portrait): red in the stored top-left,
    which a viewer (and every davir reader) shows at the top right of the 72×96 upright picture."""
    from PIL import Image

    stored = Image.new("RGB", (96, 72), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 24, 24))
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(path, exif=exif.tobytes())
    return path


def test_collator_reads_pictures_upright(tmp_path):
    """Issue 49.5: image paths (and pictures decoded without EXIF) are turned as the mask cache's masks were made:
    the collator hands TRL the upright picture, as `davir.data.images.load_rgb` reads it."""
    from PIL import Image

    from davir.data.images import load_rgb
    from davir.integrations.trl import DavirFacCollator

    photo = _sideways_photo(tmp_path / "photo.jpg")
    seen: list[dict] = []
    collator = DavirFacCollator(lambda examples: seen.extend(examples) or {}, image_size=SIZE)
    raw = Image.open(photo)  # decoded by the user without EXIF orientation
    collator(
        [
            {"id": "a", "images": [str(photo), raw], "prompt": [], "completion": []},
            {
                "id": "b",
                "images": [{"path": None, "bytes": photo.read_bytes()}, {"path": str(photo)}],
                "prompt": [],
                "completion": [],
            },
        ]
    )
    expected = np.asarray(load_rgb(photo).resize((SIZE, SIZE), Image.Resampling.BICUBIC))
    assert load_rgb(photo).size == (72, 96)
    for picture in [image for example in seen for image in example["images"]]:
        pixels = np.asarray(picture)
        assert pixels.shape == (SIZE, SIZE, 3) and np.array_equal(pixels, expected)
        assert pixels[4, SIZE - 5, 0] > 200 and pixels[4, 4, 0] < 50  # red at the top right, not the top left


def _trl_settings(**settings):
    from davir.integrations.trl import DavirTrlSettings

    return DavirTrlSettings(**settings)


@pytest.mark.parametrize(
    "settings, message",
    [
        (lambda: FacConfig(lambda_attn=float("nan")), "lambda_attn must be a finite number >= 0, got nan"),
        (lambda: FacConfig(lambda_attn=float("inf")), "lambda_attn must be a finite number >= 0, got inf"),
        (lambda: FacConfig(blur_sigma=float("nan")), "blur_sigma and eps must be positive"),
        (lambda: _trl_settings(image_size=0), "image_size must be a whole number of pixels >= 1 or None, got 0"),
        (lambda: _trl_settings(image_size=448.0), "image_size must be a whole number"),
    ],
)
def test_settings_built_in_python_refuse_what_would_train_wrong(settings, message):
    """The TRL API's settings are built in Python, past the config loader's checks: λ = NaN trained on a NaN loss
    (NaN < 0 is False), and image_size=0 silently meant the family's default size."""
    with pytest.raises(ValueError, match=message):
        settings()
