import numpy as np
import pytest
import torch
from PIL import Image

from davir.data.caches import EntityCache, MaskCache, cache_key
from davir.data.dataset import (
    ChangeCaptionDataset,
    EntityField,
    GroundTruthMaskField,
    ImageField,
    MaskField,
    collate_examples,
)
from davir.data.records import ChangePair
from davir.errors import DataError


def _pair(tmp_path, pair_id="000001.png", captions=("a", "b", "c")):
    before = tmp_path / f"{cache_key(pair_id)}_b.png"
    after = tmp_path / f"{cache_key(pair_id)}_a.png"
    Image.new("RGB", (8, 8), (10, 20, 30)).save(before)
    Image.new("RGB", (8, 8), (40, 50, 60)).save(after)
    return ChangePair(pair_id=pair_id, before=before, after=after, captions=tuple(captions), split="train")


def test_cache_key_is_safe_and_injective():
    assert cache_key("000123.png_n") == "000123.png_n"
    assert cache_key("a/b") != cache_key("a_b")
    assert "/" not in cache_key("../../etc/passwd")
    assert not cache_key(".hidden").startswith(".")


def test_mask_cache_round_trip_and_field(tmp_path):
    cache = MaskCache(tmp_path / "cache")
    after = np.zeros((8, 8), bool)
    after[0:4, 0:4] = True  # a quarter of the image
    cache.write("p1", None, after, {"boxes": [[0, 0, 4, 4]]})
    assert cache.has("p1") and not cache.has("p2")
    entry = cache.read("p1")
    assert entry.before is None and entry.after.sum() == 16 and entry.info["boxes"] == [[0, 0, 4, 4]]
    field = MaskField(cache, size=4, source="per_image")
    out = field(ChangePair("p1", tmp_path / "x", tmp_path / "y"))
    # before is missing → the union is used; 8x8 → 4x4 box-resampling keeps exact coverage
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(out["mask_before"], expected) and torch.equal(out["mask_after"], expected)
    assert out["mask_valid"] is True
    with pytest.raises(DataError, match="python -m preprocess masks"):
        cache.read("missing")


def test_empty_mask_is_not_valid(tmp_path):
    cache = MaskCache(tmp_path)
    cache.write("p", np.zeros((4, 4), bool), np.zeros((4, 4), bool), {})
    out = MaskField(cache, size=2)(ChangePair("p", tmp_path, tmp_path))
    assert out["mask_valid"] is False and out["mask_after"].sum() == 0


def test_gt_mask_field_partial_coverage(tmp_path):
    mask = np.zeros((4, 4), np.uint8)
    mask[0, 0] = 255  # one pixel of four in the top-left 2x2 block
    Image.fromarray(mask).save(tmp_path / "m.png")
    pair = ChangePair("p", tmp_path, tmp_path, gt_mask_before=tmp_path / "m.png", gt_mask_after=tmp_path / "m.png")
    out = GroundTruthMaskField(size=2)(pair)
    assert out["gt_mask_before"][0, 0].item() == pytest.approx(0.25) and out["gt_mask_before"].sum() == pytest.approx(
        0.25
    )


def test_entities_and_images_collate(tmp_path):
    pairs = [_pair(tmp_path, "p1"), _pair(tmp_path, "p2")]
    entities = EntityCache(tmp_path / "cache")
    entities.write_part("0", {"p1": [("red sphere", 0.9), ("cube", 0.1)], "p2": [("cube", 0.7)]})
    processor = lambda images: torch.stack(
        [torch.from_numpy(np.asarray(i, np.float32)).permute(2, 0, 1) for i in images]
    )
    dataset = ChangeCaptionDataset(pairs, [ImageField(processor), EntityField(entities, top_k=1)])
    batch = collate_examples([dataset[0], dataset[1]])
    assert batch["pixel_before"].shape == (2, 3, 8, 8) and batch["pixel_after"][0, 0, 0, 0].item() == 40
    assert batch["entities"] == [["red sphere"], ["cube"]]
    assert batch["pair_id"] == ["p1", "p2"]


def test_caption_sampling_is_deterministic_per_epoch(tmp_path):
    pairs = [_pair(tmp_path, f"p{i}", captions=tuple(f"c{j}" for j in range(5))) for i in range(20)]
    dataset = ChangeCaptionDataset(pairs, seed=3)
    first = [dataset[i]["caption"] for i in range(20)]
    assert first == [ChangeCaptionDataset(pairs, seed=3)[i]["caption"] for i in range(20)]
    dataset.set_epoch(1)
    assert [dataset[i]["caption"] for i in range(20)] != first
    expanded = ChangeCaptionDataset(pairs[:2], caption_mode="expand")
    assert len(expanded) == 10 and [expanded[i]["caption"] for i in range(5)] == ["c0", "c1", "c2", "c3", "c4"]


def test_require_captions_names_pairs(tmp_path):
    with pytest.raises(DataError, match="no reference caption.*'p'"):
        ChangeCaptionDataset([_pair(tmp_path, "p", captions=())], require_captions=True)
