"""Change-mask extraction (DAVIR §3.1, Eqs. 2-3): the equations on hand-made arrays, the classical and
the SAM segmenters, the resumable/sharded CLI, the evaluation and the picture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from davir.data import read_dataset
from davir.data.caches import MaskCache, cache_key
from davir.data.images import load_mask
from davir.io import temporary_path
from davir.jobs import mask_eval, masks
from davir.preprocessing import mask_pipeline
from davir.preprocessing.change_regions import (
    RegionSettings,
    change_mask_union,
    cluster_changed_pixels,
    cluster_region,
    difference_map,
    find_change_regions,
    iou_filter,
    mask_iou,
    threshold_difference,
    tolerant_difference_map,
    union_of_masks,
)
from davir.preprocessing.segmenters import SAM_TYPES, SEGMENTERS, ClassicalSegmenter, SegmentRequest, build_segmenter

# Eq. 2 exactly as written: no registration, photometric matching, tolerance, blur or opening.
LITERAL = dict(register="none", photometric="none", tolerance_px=0, blur_sigma=0.0, open_px=0)


# ---------------------------------------------------------------------------------------------
# Eq. 2 on hand-made arrays
# ---------------------------------------------------------------------------------------------


def two_square_pair() -> tuple[np.ndarray, np.ndarray]:
    """Grey 40x60 before; after: square A (rows 5-14, cols 5-14) +60 on all channels, square B
    (rows 20-29, cols 40-49) +90 on red only. Mean-RGB differences: A 60/255, B 30/255."""
    before = np.full((40, 60, 3), 100, np.uint8)
    after = before.copy()
    after[5:15, 5:15] += 60
    after[20:30, 40:50, 0] += 90
    return before, after


def test_difference_map_and_threshold_on_two_squares():
    before, after = two_square_pair()
    diff = difference_map(before, after, blur_sigma=0)
    assert diff.shape == (40, 60)
    assert np.allclose(diff[5:15, 5:15], 60 / 255) and np.allclose(diff[20:30, 40:50], 30 / 255)
    assert np.count_nonzero(diff) == 200
    both = threshold_difference(diff, 0.1)  # 30/255 = 0.118 and 60/255 = 0.235 both pass
    assert both.sum() == 200 and both[5:15, 5:15].all() and both[20:30, 40:50].all()
    only_a = threshold_difference(diff, 0.2)
    assert only_a.sum() == 100 and only_a[5:15, 5:15].all()
    # An opening of radius 1 (a 3x3 cross) removes a single-pixel speck and keeps each 10x10 square
    # but for its 4 corner pixels.
    speck = np.zeros_like(diff)
    speck[35, 2] = 0.5
    opened = threshold_difference(diff + speck, 0.1, open_px=1)
    assert opened.sum() == 2 * (100 - 4) and not opened[35, 2]


def test_tolerant_difference_ignores_a_one_pixel_shift_but_not_a_new_colour():
    before, after = two_square_pair()
    # A new colour: the tolerant map finds every pixel of both squares, exactly like the plain one.
    assert np.array_equal(tolerant_difference_map(before, after, 0, 1) > 0.1, difference_map(before, after, 0) > 0.1)
    # The same square moved right by one pixel: plain differencing sees two thin strips, r = 1 sees nothing.
    shifted = np.roll(after, 1, axis=1)
    assert (difference_map(after, shifted, 0) > 0.1).sum() == 2 * 10 + 2 * 10
    assert (tolerant_difference_map(after, shifted, 0, 1) > 0.1).sum() == 0


def test_dbscan_clusters_give_exact_boxes_and_centres():
    changed = np.zeros((60, 80), bool)
    changed[10:20, 5:25] = True  # 200 px: box x 5..25, y 10..20, centroid (14.5, 14.5)
    changed[40:50, 50:60] = True  # 100 px
    changed[55, 2] = True  # a lone pixel: DBSCAN noise
    for stride in (1, 2):
        clusters = cluster_changed_pixels(changed, eps=1.5, min_samples=4, stride=stride)
        assert [c.size for c in clusters] == [200, 100], stride
        assert clusters[0].box == (5, 10, 25, 20) and clusters[1].box == (50, 40, 60, 50)
        assert clusters[0].centre == (15.0, 15.0) and clusters[1].centre == (55.0, 45.0)
        assert [c.label for c in clusters] == [0, 1]
    # min_area drops the 100-px cluster (under 150 px of 4,800) but keeps the 200-px one.
    assert [c.size for c in cluster_changed_pixels(changed, 1.5, 4, min_area=150 / 4800, stride=1)] == [200]


def test_ring_cluster_centre_lies_on_the_cluster_and_hull_region_is_solid():
    changed = np.zeros((40, 40), bool)
    changed[10:30, 10:30] = True
    changed[13:27, 13:27] = False  # a 3-px-wide square ring; the centroid (19.5, 19.5) is empty
    (cluster,) = cluster_changed_pixels(changed, eps=1.5, min_samples=3, stride=1)
    x, y = cluster.centre
    assert changed[int(y), int(x)]
    assert cluster.box == (10, 10, 30, 30)
    hull = cluster_region(cluster, changed.shape, hull=True)
    assert hull.sum() == 400 and hull[10:30, 10:30].all()  # the hull of a square ring is the full square
    closed = cluster_region(cluster, changed.shape, close_px=0, hull=False)
    assert closed.sum() == 400  # hole filling closes the ring too
    assert cluster_region(cluster, changed.shape, hull=True, dilate_px=1).sum() == 22 * 22 - 4


def test_prompts_are_scaled_back_to_image_resolution():
    before = np.full((336, 448, 3), 90, np.uint8)
    after = before.copy()
    after[100:160, 200:280] = (200, 40, 40)
    regions = find_change_regions(before, after, RegionSettings(**LITERAL, work_size=224, cluster_stride=1))
    assert regions.work_size == (168, 224)
    assert len(regions.clusters) == 1 and regions.clusters[0].box == (100, 50, 140, 80)
    (prompt,) = regions.prompts_after
    assert prompt.box == (200.0, 100.0, 280.0, 160.0)
    assert prompt.point == (240.0, 130.0)  # working centre (120.0, 65.0) × 2
    assert regions.regions_after[0].shape == (336, 448)
    # R_c: the 40x30 working rectangle dilated by a 3x3 cross (corners stay out), upsampled ×2
    assert regions.regions_after[0].sum() == (42 * 32 - 4) * 4


# ---------------------------------------------------------------------------------------------
# Eq. 3 on hand-made arrays
# ---------------------------------------------------------------------------------------------


def test_iou_filter_keeps_and_drops_by_tau():
    region = np.zeros((20, 30), bool)
    region[5:15, 5:15] = True  # 100 px
    shifted = np.zeros_like(region)
    shifted[5:15, 10:20] = True  # overlap 50, union 150 → IoU 1/3
    inside = np.zeros_like(region)
    inside[5:15, 5:13] = True  # 80 px inside → IoU 0.8
    empty = np.zeros_like(region)
    keep, ious = iou_filter([shifted, inside, empty], [region] * 3, tau=0.5)
    assert ious == pytest.approx([1 / 3, 0.8, 0.0])
    assert keep == [False, True, False]
    assert iou_filter([shifted, inside, empty], [region] * 3, tau=0.3)[0] == [True, True, False]
    assert iou_filter([inside], [region], tau=0.8)[0] == [True]  # IoU ≥ τ, boundary included
    assert mask_iou(empty, empty) == 0.0

    union = union_of_masks([shifted, inside, empty], [True, True, False], region.shape)
    assert union.sum() == np.count_nonzero(shifted | inside) == 150  # cols 5-19 of rows 5-14
    assert not union_of_masks([shifted], [False], region.shape).any()


def test_change_mask_union_picks_the_best_of_several_candidates():
    region = np.zeros((10, 10), bool)
    region[2:8, 2:8] = True  # 36 px
    poor, good, fair = np.zeros((3, 10, 10), bool)
    poor[0:2, 0:10] = True  # IoU 0
    good[2:8, 2:7] = True  # 30/36
    fair[0:10, 0:10] = True  # 36/100
    mask, keep, ious, choice = change_mask_union([np.stack([poor, good, fair])], [region], 0.5, (10, 10))
    assert choice == [1] and keep == [True] and ious == pytest.approx([30 / 36])
    assert np.array_equal(mask, good)


# ---------------------------------------------------------------------------------------------
# Synthetic pairs: classical segmenter, CLI (resume, shards, viz), evaluation
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    from davir.data.synthetic import SynthConfig, generate_dataset

    root = tmp_path_factory.mktemp("synth")
    generate_dataset(root, SynthConfig(scenes=10, seed=0, semantic_distractor_rate=0.0), workers=1)
    return root


def test_classical_segmenter_recovers_the_changed_object_in_the_right_frame(synth_root):
    pairs = [p for p in read_dataset("clevr_change", synth_root, "train") if p.change_type in ("color", "add", "drop")]
    assert {p.change_type for p in pairs} == {"color", "add", "drop"}
    segmenter = build_segmenter("classical")
    for pair in pairs:
        _, result = mask_pipeline.compute_pair(pair, RegionSettings(), segmenter)
        gt_before = load_mask(pair.gt_mask_before)
        gt_after = load_mask(pair.gt_mask_after)
        assert mask_eval.iou(result.before | result.after, gt_before | gt_after) > 0.7, pair.pair_id
        if pair.change_type == "add":  # the object exists only after: the before mask stays empty
            assert not result.before.any() and mask_eval.iou(result.after, gt_after) > 0.7
        if pair.change_type == "drop":  # and only before for a drop
            assert not result.after.any() and mask_eval.iou(result.before, gt_before) > 0.7


def test_other_classical_methods_run():
    before, after = two_square_pair()
    regions = find_change_regions(before, after, RegionSettings(**LITERAL, cluster_stride=1))
    for method in ("grabcut", "region"):
        (answers,) = ClassicalSegmenter(method).segment(
            [SegmentRequest(after, regions.prompts_after, regions.regions_after)]
        )
        assert len(answers) == 2 and answers[0].masks.shape == (1, 40, 60)
    with pytest.raises(ValueError, match="classical method"):
        ClassicalSegmenter("watershed")


def _run(argv: list[str]) -> int:
    return masks.main(argv + ["--no-progress"])


def test_resume_after_kill_recomputes_only_the_unfinished_pair(synth_root, tmp_path, capsys):
    out = tmp_path / "cache"
    base = [
        "--format",
        "clevr_change",
        "--root",
        str(synth_root),
        "--split",
        "train",
        "--out",
        str(out),
        "--limit",
        "6",
    ]
    assert _run(base + ["--viz", str(tmp_path / "viz"), "--viz-count", "2"]) == 0
    cache = MaskCache(out)
    ids = [p.pair_id for p in read_dataset("clevr_change", synth_root, "train").pairs[:6]]
    assert all(cache.has(i) for i in ids)
    assert len(list((tmp_path / "viz").glob("*.png"))) == 2
    first = json.loads((out / "manifest.json").read_text())
    assert first["status"] == "complete" and first["counts"]["computed"] == 6

    # "Kill" mid-pair: the JSON (written last) of one pair is gone, and a half-written temp file is left.
    victim = ids[2]
    json_path = cache.folder / f"{cache_key(victim)}.json"
    json_path.unlink()
    stray = cache.folder / f".{cache_key(victim)}_after.png.tmp"
    stray.write_bytes(b"\x89PNG half")
    # Today's temporaries carry pid + random part (davir.io.temporary_path): removed just the same.
    named = temporary_path(cache.folder / f"{cache_key(victim)}_before.png")
    named.write_bytes(b"\x89PNG half")
    half_manifest = temporary_path(out / "manifest.json")  # killed while the manifest was being written
    half_manifest.write_text('{"status": "runn')
    stamps = {i: (cache.folder / f"{cache_key(i)}.json").stat().st_mtime_ns for i in ids if i != victim}

    assert _run(base) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["reused"] == 5 and manifest["counts"]["computed"] == 1
    assert manifest["counts"]["stale_temporaries_removed"] == 3 and not stray.exists() and not named.exists()
    assert not half_manifest.exists() and not list(out.glob(".*.tmp"))
    assert {i: (cache.folder / f"{cache_key(i)}.json").stat().st_mtime_ns for i in stamps} == stamps
    assert not list(cache.folder.glob(".*.tmp"))
    for pair_id in ids:  # every entry reads back whole
        entry = cache.read(pair_id)
        assert entry.before.shape == entry.after.shape == (240, 320)
    capsys.readouterr()

    # Resuming with other settings would mix two kinds of masks in one cache: refused, naming what differs.
    assert _run(base + ["--threshold", "0.2"]) == 2
    assert "other settings (regions.threshold: 0.05 -> 0.2)" in capsys.readouterr().err


def test_shards_partition_the_pairs_and_keep_separate_manifests(synth_root, tmp_path):
    out = tmp_path / "cache"
    base = [
        "--format",
        "clevr_change",
        "--root",
        str(synth_root),
        "--split",
        "train",
        "--out",
        str(out),
        "--num-shards",
        "3",
        "--register",
        "none",
        "--after-only",
    ]
    done = []
    for shard in range(3):
        assert _run(base + ["--shard-index", str(shard)]) == 0
        done.append(json.loads((out / f"manifest-shard-{shard}.json").read_text())["counts"]["computed"])
    assert not (out / "manifest.json").exists()
    assert done == [6, 5, 5]  # 16 pairs: i % 3
    merged = mask_pipeline.read_manifest(out)
    assert merged["counts"]["pairs"] == merged["counts"]["computed"] == 16 and merged["status"] == "complete"
    cache = MaskCache(out)
    assert all(cache.has(p.pair_id) for p in read_dataset("clevr_change", synth_root, "train"))
    assert cache.read("000001.png").before is None  # --after-only writes no before mask


def test_missing_image_is_a_counted_failure_and_a_rerun_retries_it(synth_root, tmp_path, capsys):
    import shutil

    root = tmp_path / "data"
    shutil.copytree(synth_root, root)
    (root / "sc_images" / "CLEVR_semantic_000001.png").unlink()
    out = tmp_path / "cache"
    argv = ["--format", "clevr_change", "--root", str(root), "--split", "train", "--out", str(out), "--limit", "4"]
    assert _run(argv) == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["failed"] == 1 and manifest["counts"]["computed"] == 3
    assert manifest["failures"][0]["record"] == "000001.png"
    assert "CLEVR_semantic_000001.png" in manifest["failures"][0]["reason"]
    assert "000001.png" in capsys.readouterr().err


def test_mask_eval_numbers_on_hand_placed_predictions(synth_root, tmp_path):
    """Perfect masks for the semantic pairs, one 10x10 block on one distractor pair."""
    pairs = read_dataset("clevr_change", synth_root, "train").pairs
    cache = MaskCache(tmp_path / "cache")
    distractors = [p for p in pairs if p.change_type == "distractor"]
    for pair in pairs:
        before, after = load_mask(pair.gt_mask_before), load_mask(pair.gt_mask_after)
        if pair is distractors[0]:
            after = after.copy()
            after[0:10, 0:10] = True
        cache.write(pair.pair_id, before, after, {})
    result = mask_eval.evaluate("clevr_change", synth_root, "train", tmp_path / "cache")
    assert result["iou_union"] == result["iou_before"] == result["iou_after"] == 1.0
    assert all(t["precision"] == t["recall"] == 1.0 for t in result["per_type"].values())
    assert result["distractor"]["pairs"] == len(distractors) == 8
    assert result["distractor"]["fp_area_mean"] == pytest.approx(100 / (240 * 320) / 8, abs=1e-6)
    assert result["distractor"]["any_fp_share"] == 1 / 8
    # A cache missing a pair says so in the result (and mask-eval exits 1).
    (cache.folder / f"{cache_key(pairs[0].pair_id)}.json").unlink()
    assert (
        mask_eval.main(
            [
                "--format",
                "clevr_change",
                "--root",
                str(synth_root),
                "--split",
                "train",
                "--masks",
                str(tmp_path / "cache"),
                "--out",
                str(tmp_path / "m.json"),
            ]
        )
        == 1
    )
    assert json.loads((tmp_path / "m.json").read_text())["missing_from_cache"] == 1


def test_viz_picture_has_five_panels():
    from davir.viz import draw_mask_panels

    before, after = two_square_pair()
    regions = find_change_regions(before, after, RegionSettings(**LITERAL, cluster_stride=1))
    labels = np.full(regions.work_size, -1)
    mask = np.zeros((40, 60), bool)
    mask[5:15, 5:15] = True
    picture = draw_mask_panels(
        before,
        after,
        regions.diff,
        labels,
        [p.box for p in regions.prompts_after],
        [p.point for p in regions.prompts_after],
        [True, False],
        mask,
        mask,
        title="t",
        caption="the red square changed",
        panel_height=80,
    )
    assert picture.size == (5 * 120 + 4 * 4, 80 + 30 + 18)


# ---------------------------------------------------------------------------------------------
# SAM through the --sam-checkpoint path, with a tiny random model of segment-anything's own classes
# ---------------------------------------------------------------------------------------------

from paper_fixtures import build_tiny_sam  # noqa: E402  (segment-anything classes, tiny sizes)


@pytest.fixture
def tiny_sam_checkpoint(tmp_path, monkeypatch) -> Path:
    import torch

    torch.manual_seed(0)
    monkeypatch.setitem(SAM_TYPES, "tiny_test", build_tiny_sam)
    path = tmp_path / "tiny_sam.pth"
    torch.save(build_tiny_sam().state_dict(), path)
    return path


@pytest.mark.parametrize("image_resize", ["device", "pil"])
def test_sam_batched_path_matches_the_official_predictor(tiny_sam_checkpoint, image_resize):
    from segment_anything import SamPredictor

    before, after = two_square_pair()
    segmenter = build_segmenter(
        "sam", checkpoint=tiny_sam_checkpoint, sam_type="tiny_test", device="cpu", image_resize=image_resize
    )
    assert segmenter.bf16 is False  # fp32 on the CPU
    regions = find_change_regions(before, after, RegionSettings(**LITERAL, cluster_stride=1))
    requests = [
        SegmentRequest(after, regions.prompts_after, regions.regions_after),
        SegmentRequest(before, regions.prompts_before, regions.regions_before),
    ]
    batched = segmenter.segment(requests)
    official = SamPredictor(segmenter.sam)
    for request, answers in zip(requests, batched):
        official.set_image(request.image)
        assert np.allclose(segmenter.encode([request.image]).numpy(), official.features.numpy(), atol=1e-4)
        for prompt, answer in zip(request.prompts, answers):
            expected, scores, _ = official.predict(
                point_coords=np.array([prompt.point]),
                point_labels=np.array([1]),
                box=np.array(prompt.box),
                multimask_output=True,
            )
            assert answer.masks.shape == expected.shape == (3, 40, 60)
            assert np.mean(answer.masks == expected) > 0.999 and np.allclose(answer.scores, scores, atol=1e-4)


@pytest.mark.parametrize("method", ["torch-bilinear-antialias-uint8", "torch-bilinear-antialias-float-rounded"])
def test_sam_resize_on_the_device_stays_within_one_level_of_the_official_transform(shared_datasets, method):
    """The batched path resizes where SAM runs (uint8 on the CPU, float on a GPU, tested here on the CPU) instead
    of the official PIL resize on the host: every pixel within one grey level of it, most of them equal."""
    from PIL import Image
    from segment_anything.utils.transforms import ResizeLongestSide

    from davir.preprocessing.segmenters.sam import resize_longest_side

    clevr = np.array(Image.open(shared_datasets / "clevr_change/images/CLEVR_default_000000.png").convert("RGB"))
    large = np.array(Image.fromarray(clevr).resize((1800, 1200)))  # downscaled to 1024: the antialiasing counts
    read_only = clevr[:300, :17]
    read_only.flags.writeable = False  # a strided, read-only view, as a memory-mapped cache gives
    allowed = 0.003 if method.endswith("uint8") else 0.2
    for image in (clevr, large, read_only):
        expected = ResizeLongestSide(1024).apply_image(image).astype(np.int16)
        got = resize_longest_side(image, 1024, "cpu", method)[0].permute(1, 2, 0).numpy()
        assert got.shape == expected.shape and np.array_equal(got, np.round(got))
        difference = np.abs(got.astype(np.int16) - expected)
        assert difference.max() <= 1 and np.mean(difference > 0) <= allowed, (image.shape, np.mean(difference > 0))


def test_sam_cli_loads_the_checkpoint_and_writes_masks(synth_root, tiny_sam_checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cache"
    argv = [
        "--format",
        "clevr_change",
        "--root",
        str(synth_root),
        "--split",
        "train",
        "--out",
        str(out),
        "--limit",
        "3",
        "--segmenter",
        "sam",
        "--sam-type",
        "tiny_test",
        "--device",
        "cpu",
        "--sam-batch-size",
        "4",
    ]
    assert _run(argv + ["--sam-checkpoint", str(tmp_path / "missing.pth")]) == 2
    assert f"SAM checkpoint not found: {tmp_path / 'missing.pth'}" in capsys.readouterr().err
    assert _run(argv + ["--sam-checkpoint", str(tiny_sam_checkpoint)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["segmenter"]["sam_type"] == "tiny_test" and manifest["counts"]["computed"] == 3
    entry = MaskCache(out).read("000001.png")
    assert entry.before.shape == entry.after.shape == (240, 320)
    assert entry.info["clusters"] and all("score_after" in c for c in entry.info["clusters"])
    # The weights are recorded as an absolute path: the same file given relative, from another folder, through a
    # symlink, resumes the cache (and an online rebuild finds it from anywhere).
    assert manifest["settings"]["segmenter"]["sam_checkpoint"] == str(tiny_sam_checkpoint.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "weights").symlink_to(tiny_sam_checkpoint.parent)
    monkeypatch.chdir(elsewhere)
    assert _run([*argv, "--sam-checkpoint", "weights/tiny_sam.pth", "--limit", "4"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["reused"] == 3 and manifest["counts"]["computed"] == 1
    # A manifest of an older version recorded the path as given: relative to where that run started.
    monkeypatch.chdir(tiny_sam_checkpoint.parent)
    manifest["comparable_settings"]["segmenter"]["sam_checkpoint"] = tiny_sam_checkpoint.name
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert _run([*argv, "--sam-checkpoint", tiny_sam_checkpoint.name, "--limit", "4"]) == 0
    capsys.readouterr()
    # The resize is part of what a resume compares. A cache of a version before the device resize (no key: PIL's
    # resize) is not extended with the device resize, and is finished with --sam-resize pil.
    recorded = manifest["comparable_settings"]["segmenter"]
    assert (recorded["image_resize"], recorded["resize_arithmetic"]) == ("device", "torch-bilinear-antialias-uint8")
    del recorded["image_resize"], recorded["resize_arithmetic"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert _run(argv + ["--sam-checkpoint", str(tiny_sam_checkpoint), "--limit", "5"]) == 2
    assert (
        "this cache was made with other settings (segmenter.image_resize: 'pil' -> 'device'; "
        "segmenter.resize_arithmetic: None -> 'torch-bilinear-antialias-uint8')" in capsys.readouterr().err
    )
    assert _run(argv + ["--sam-checkpoint", str(tiny_sam_checkpoint), "--limit", "5", "--sam-resize", "pil"]) == 0
    finished = json.loads((out / "manifest.json").read_text())
    assert finished["counts"]["computed"] == 1 and finished["settings"]["segmenter"]["image_resize"] == "pil"
    # caption.py's online masks rebuild SAM from a cache's record: an old one as it ran (PIL), a new one as recorded
    assert SEGMENTERS["sam"].settings_from_record({"sam_type": "tiny_test"}).image_resize == "pil"
    assert SEGMENTERS["sam"].settings_from_record(manifest["settings"]["segmenter"]).image_resize == "device"


def test_another_dataset_root_is_refused_before_any_work(synth_root, tmp_path, capsys, monkeypatch):
    """Masks of another dataset into a cache took the pair ids already there as done (000002.png is in every
    CLEVR-layout set) and rewrote the manifest to the new root, so train.py's root check then passed on the old
    dataset's masks; entities read a --masks cache of another root the same way. Both are refused now, before
    any work, and --moved-from accepts a dataset that only moved."""
    import shutil

    from davir.jobs import entities

    other = tmp_path / "other dataset"
    shutil.copytree(synth_root, other)
    out = tmp_path / "cache"
    base = ["--format", "clevr_change", "--split", "train", "--out", str(out), "--limit", "2"]
    assert _run(base + ["--root", str(synth_root)]) == 0
    manifest = (out / "manifest.json").read_bytes()
    recorded = synth_root.resolve()
    capsys.readouterr()
    assert _run(base + ["--root", str(other)]) == 2
    assert capsys.readouterr().err == (
        f"error: --out={out} was built from dataset root {recorded} ({out / 'manifest.json'}), but --root is "
        f"{other}: use another --out for this dataset, or, if the dataset only moved, pass --moved-from {recorded}\n"
    )
    assert (out / "manifest.json").read_bytes() == manifest

    entity_argv = ["--format", "clevr_change", "--root", str(other), "--split", "train", "--out", str(tmp_path / "e")]
    assert entities.main(entity_argv + ["--masks", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: --masks={out} was built from dataset root {recorded} ({out / 'manifest.json'}), but --root is "
        f"{other}: use another --masks for this dataset"
    )
    assert not (tmp_path / "e").exists()

    # the same root through a symlink, relative, and a moved dataset with --moved-from: resumed
    link = tmp_path / "link"
    link.symlink_to(synth_root, target_is_directory=True)
    monkeypatch.chdir(synth_root.parent)
    for root, extra in ((link, []), (synth_root.name, []), (other, ["--moved-from", str(recorded)])):
        assert _run(base + ["--root", str(root), *extra]) == 0, root
        assert json.loads((out / "manifest.json").read_text())["counts"]["reused"] == 2
