"""`python -m preprocess features` on the real shared CLEVR-Change images, with a seeded random backbone.

The shared fixture folder holds the images of 6 scenes; the val split lists 1,988 scenes, of which
scenes 19 and 35 are present: 2 × (default, semantic, non-semantic) = 6 distinct images.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from davir.data.feature_cache import FeatureCache
from davir.errors import DataError
from davir.jobs.features import main
from davir.preprocessing.backbone import (
    AUTHORS_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    build_backbone,
    load_resized,
    normalize_batch,
)

VAL_IMAGES = {
    f"{folder}/CLEVR_{kind}_{scene:06d}.png"
    for scene in (19, 35)
    for folder, kind in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic"))
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def clevr_root(shared_datasets):
    return shared_datasets / "clevr_change"


def run_cli(root, out, *extra: str, split: str = "val") -> int:
    """`preprocess features` of a CLEVR-layout set; a later flag in `extra` overrides one given here."""
    return main(
        ["--format", "clevr_change", "--root", str(root), "--split", split, "--out", str(out), "--workers", "0"]
        + ["--batch-size", "4", *extra]
    )


@pytest.fixture(scope="module")
def cache(clevr_root, tmp_path_factory):
    """Shard 0 of 2 first, then an unsharded run that must only add the other shard's images."""
    out = tmp_path_factory.mktemp("features")
    assert run_cli(clevr_root, out, "--random-init", "--skip-missing", "--num-shards", "2", "--shard-index", "0") == 0
    first = json.loads((out / "runs" / "val-s000of002.json").read_text())
    assert run_cli(clevr_root, out, "--random-init", "--skip-missing") == 0
    second = json.loads((out / "runs" / "val-s000of001.json").read_text())
    return out, first, second


def test_extraction_stores_every_val_image_once_as_fp16(cache, clevr_root):
    out, first, second = cache
    assert first["images_in_split"] == 1988 * 3  # default, semantic and distractor images, shared ones once
    assert first["extracted"] + second["extracted"] == 6 and 0 < first["extracted"] < 6
    assert second["already_cached"] == first["extracted"]  # resume skipped the finished images
    assert second["missing"] == 1988 * 3 - 6 and len(second["missing_examples"]) == 20
    features = FeatureCache(out)
    assert set(features.entries) == VAL_IMAGES
    for name in sorted((out / "features").glob("*.safetensors")):
        with safe_open(str(name), framework="pt") as handle:
            assert handle.get_slice("features").get_dtype() == "F16"
            assert handle.get_slice("features").get_shape()[1:] == [1024, 14, 14]
    tensor = features.get(clevr_root / "images" / "CLEVR_default_000019.png")
    assert tensor.shape == (1024, 14, 14) and tensor.dtype == torch.float32
    assert torch.equal(tensor, features.get("images/CLEVR_default_000019.png"))
    assert not torch.equal(tensor, features.get("sc_images/CLEVR_semantic_000019.png"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"] == "random-init(seed=0,branches=1/sqrt(blocks))" and manifest["std"] == list(
        IMAGENET_STD
    )
    with pytest.raises(DataError, match="no features"):
        features.get("images/CLEVR_default_000000.png")


def test_rerun_does_nothing_and_other_settings_are_refused(cache, clevr_root):
    out, _, _ = cache
    chunks = {p.name: p.stat().st_mtime_ns for p in (out / "features").glob("*.safetensors")}
    assert run_cli(clevr_root, out, "--random-init", "--skip-missing") == 0
    record = json.loads((out / "runs" / "val-s000of001.json").read_text())
    assert record["extracted"] == 0 and record["already_cached"] == 6
    assert {p.name: p.stat().st_mtime_ns for p in (out / "features").glob("*.safetensors")} == chunks
    with pytest.raises(DataError, match="other settings"):
        from davir.jobs.features import build_parser, run

        run(
            build_parser().parse_args(
                [
                    "--format",
                    "clevr_change",
                    "--root",
                    str(clevr_root),
                    "--split",
                    "val",
                    "--out",
                    str(out),
                    "--random-init",
                    "--std-typo",
                    "--skip-missing",
                ]
            )
        )


def keys_cubic(t: float, a: float = -0.75) -> float:
    """OpenCV's bicubic kernel (Keys, a = −0.75)."""
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def bicubic_pixel(image: np.ndarray, out_y: int, out_x: int, size: int = 224) -> np.ndarray:
    """One output pixel of a bicubic resize to size×size, half-pixel centres, edge replication."""
    height, width = image.shape[:2]
    src_y = (out_y + 0.5) * height / size - 0.5
    src_x = (out_x + 0.5) * width / size - 0.5
    y0, x0 = math.floor(src_y), math.floor(src_x)
    value = np.zeros(3)
    for j in range(y0 - 1, y0 + 3):
        for i in range(x0 - 1, x0 + 3):
            weight = keys_cubic(src_y - j) * keys_cubic(src_x - i)
            value += weight * image[min(max(j, 0), height - 1), min(max(i, 0), width - 1)]
    return value


def test_resize_normalisation_and_features_against_a_hand_computation(cache, clevr_root):
    out, _, _ = cache
    path = clevr_root / "images" / "CLEVR_default_000019.png"
    original = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)  # 480×320, alpha is 255 everywhere
    resized = load_resized(path)
    assert resized.shape == (224, 224, 3) and resized.dtype == np.uint8
    for out_y, out_x in ((0, 0), (37, 101), (112, 112), (200, 13), (223, 223)):
        expected = np.clip(bicubic_pixel(original, out_y, out_x), 0, 255)
        assert np.abs(resized[out_y, out_x] - expected).max() <= 1.0, (out_y, out_x)  # OpenCV's fixed point
    batch = torch.from_numpy(resized).permute(2, 0, 1).unsqueeze(0)
    normalized = normalize_batch(batch, IMAGENET_STD)
    r, g, b = (float(v) for v in resized[50, 60])
    assert normalized[0, :, 50, 60].tolist() == pytest.approx(
        [(r / 255 - 0.485) / 0.229, (g / 255 - 0.456) / 0.224, (b / 255 - 0.406) / 0.225], abs=1e-5
    )
    typo = normalize_batch(batch, AUTHORS_STD)
    assert typo[0, 2, 50, 60].item() == pytest.approx((b / 255 - IMAGENET_MEAN[2]) / 0.224, abs=1e-5)
    backbone = build_backbone(None, random_init=True, seed=0)
    with torch.no_grad():
        expected = backbone(normalized)[0].to(torch.float16).float()
    assert torch.equal(FeatureCache(out).get(path), expected)


def test_missing_weights_images_and_cache_give_clear_errors(clevr_root, tmp_path, capsys):
    assert run_cli(clevr_root, tmp_path / "a", "--skip-missing") == 2
    assert "--weights PATH" in capsys.readouterr().err
    assert run_cli(clevr_root, tmp_path / "b", "--weights", str(tmp_path / "absent.pth")) == 2
    assert "weights file is missing" in capsys.readouterr().err
    assert run_cli(clevr_root, tmp_path / "c", "--random-init") == 2  # most val images are not in the fixtures
    assert "--skip-missing" in capsys.readouterr().err
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "wrong.pth")
    with pytest.raises(DataError, match="not a torchvision ResNet-101"):
        build_backbone(tmp_path / "wrong.pth")
    with pytest.raises(DataError, match="not a feature cache"):
        FeatureCache(tmp_path)


def test_captioning_finds_the_shipped_tiny_backbone_by_its_hash_and_names_the_flag_otherwise():
    from davir.inference.sources import OnlineFeatures
    from davir.preprocessing.backbone import SHIPPED_BACKBONE, file_sha256

    online = OnlineFeatures(None, trained_with=f"sha256:{file_sha256(SHIPPED_BACKBONE)}")
    shipped = torch.load(SHIPPED_BACKBONE, map_location="cpu", weights_only=True)
    assert torch.equal(online.backbone.state_dict()["0.weight"], shipped["conv1.weight"])
    with pytest.raises(DataError, match="sha256:0{64}'?: give that weights file with --backbone-weights"):
        OnlineFeatures(None, trained_with="sha256:" + "0" * 64)
    other = SHIPPED_BACKBONE.with_name("head.pth")  # a file given by hand is checked against the model's backbone
    with pytest.raises(DataError, match="head.pth is not the backbone the model was trained on"):
        OnlineFeatures(other, trained_with=f"sha256:{file_sha256(SHIPPED_BACKBONE)}")


# --- a bad image, a stopped run, another dataset (a small synthetic set: 6 images in its test split) -----------
def extract(root, out, *extra: str) -> int:
    """The small set's test split, a random backbone, chunks of 2 images (three chunks from its 6)."""
    return run_cli(
        root, out, "--random-init", "--batch-size", "2", "--chunk-size", "2", "--no-progress", *extra, split="test"
    )


@pytest.fixture(scope="module")
def small_set(synthetic_set):
    """A 16-scene synthetic set (read only): test pairs 000002.png(_n) and 000005.png(_n), whose before image
    images/CLEVR_default_00000N.png each pair and its no-change pair `_n` share."""
    return synthetic_set(16, 5, width=64, height=48)


@pytest.fixture(scope="module")
def small_cache(small_set, tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "features"
    assert extract(small_set, out, "--workers", "0") == 0
    return out


def tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_unreadable_image_names_its_pairs_and_file_and_leaves_no_manifest(
    small_set, small_cache, tmp_path, capsys, workers
):
    """The error named the image's key as its 'record' and no pair; with loader workers (the default) it was
    torch's "Caught DataError in DataLoader worker process 1" and the worker's traceback. The stopped run left
    manifest.json, so the folder passed for a finished cache."""
    root = tmp_path / "data"
    shutil.copytree(small_set, root)
    bad = root / "images" / "CLEVR_default_000005.png"
    bad.write_bytes(b"not a png")
    out = tmp_path / "features"
    assert extract(root, out, "--workers", workers) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "DataLoader" not in err
    assert err.startswith(f"error: record '000005.png': image file is corrupt or not an image: {bad} (")
    assert err.endswith(" (the image of 1 other pair too: '000005.png_n')\n")
    # the chunk of the images before it was stored; no manifest.json, the settings in the unfinished record
    assert sorted(p.name for p in (out / "features").iterdir()) == ["s000of001-000000.safetensors"]
    assert not (out / "manifest.json").exists() and not (out / "index.json").exists()
    unfinished = json.loads((out / "manifest.incomplete.json").read_text())
    assert unfinished["status"] == "incomplete" and unfinished["dataset_root"] == str(root.resolve())
    with pytest.raises(DataError, match=r"its feature extraction has not finished .*rerun `python -m preprocess"):
        FeatureCache(out)

    shutil.copyfile(small_set / "images" / "CLEVR_default_000005.png", bad)  # fixed: the rerun resumes
    assert extract(root, out, "--workers", workers) == 0
    record = json.loads((out / "runs" / "test-s000of001.json").read_text())
    assert (record["already_cached"], record["extracted"]) == (2, 4)
    assert not (out / "manifest.incomplete.json").exists()
    got, want = FeatureCache(out), FeatureCache(small_cache)
    assert got.manifest == {**want.manifest, "dataset_root": str(root.resolve())}
    assert sorted(got.entries) == sorted(want.entries) and len(got) == 6
    for key in want.entries:
        assert torch.equal(got.get(key), want.get(key)), key


def test_a_missing_image_names_its_pair(small_set, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(small_set, root)
    (root / "sc_images" / "CLEVR_semantic_000002.png").unlink()
    assert extract(root, tmp_path / "features", "--workers", "2") == 2
    assert capsys.readouterr().err == (
        f"error: 1 of 6 images to extract are missing (e.g. {root}/sc_images/CLEVR_semantic_000002.png of pair "
        "'000002.png'); pass --skip-missing to extract the others and count these in the run record\n"
    )


def test_a_rerun_after_a_kill_removes_its_temporaries_and_reads_only_whole_chunks(small_set, small_cache, tmp_path):
    """What SIGKILL leaves mid-extraction (tests/test_faults.py kills real runs): the unfinished record, whole
    chunks, and a chunk's temporary half written. The rerun removes the temporary and stores the rest."""
    out = tmp_path / "features"
    shutil.copytree(small_cache, out)
    for name in ("manifest.json", "index.json", "features/s000of001-000002.safetensors"):
        (out / name).unlink()
    shutil.rmtree(out / "runs")
    unfinished = {**json.loads((small_cache / "manifest.json").read_text()), "status": "incomplete"}
    (out / "manifest.incomplete.json").write_text(json.dumps(unfinished))
    half = out / "features" / ".s000of001-000002.safetensors.4242.0badcafe.tmp"
    half.write_bytes((small_cache / "features" / "s000of001-000002.safetensors").read_bytes()[:1000])
    (out / ".index.json.4242.0badcafe.tmp").write_text('{"chunks": [')
    with pytest.raises(DataError, match="has not finished"):
        FeatureCache(out)
    assert extract(small_set, out, "--workers", "0") == 0
    assert json.loads((out / "runs" / "test-s000of001.json").read_text())["extracted"] == 2
    assert list(out.rglob("*.tmp")) == [] and not (out / "manifest.incomplete.json").exists()
    assert tree(out / "features") == tree(small_cache / "features")
    assert (out / "manifest.json").read_bytes() == (small_cache / "manifest.json").read_bytes()


def test_another_dataset_root_is_refused_before_any_work(small_set, small_cache, tmp_path, capsys, monkeypatch):
    """Extracting another dataset into a cache skipped every image name it already held (images/000002.png is
    in every CLEVR-layout set) and stored the others beside them: two datasets mixed under one manifest."""
    other = tmp_path / "other"
    shutil.copytree(small_set, other)
    out = tmp_path / "features"
    shutil.copytree(small_cache, out)
    kept = tree(out)
    assert extract(other, out, "--workers", "0") == 2
    recorded = small_set.resolve()
    assert capsys.readouterr().err == (
        f"error: --out={out} was built from dataset root {recorded} ({out / 'manifest.json'}), but --root is "
        f"{other}: use another --out for this dataset, or, if the dataset only moved, pass --moved-from {recorded}\n"
    )
    assert tree(out) == kept
    # the same root given relative, or through a symlink, is that dataset; --moved-from accepts a moved one
    link = tmp_path / "link"
    link.symlink_to(small_set, target_is_directory=True)
    monkeypatch.chdir(small_set.parent)
    for root, extra in ((small_set.name, []), (link, []), (other, ["--moved-from", str(recorded)])):
        assert extract(root, out, "--workers", "0", *extra) == 0, root
        record = json.loads((out / "runs" / "test-s000of001.json").read_text())
        assert (record["extracted"], record["already_cached"]) == (0, 6)
    # an unfinished first run records its root too
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "manifest.incomplete.json").write_text(json.dumps({"dataset_root": str(recorded)}))
    assert extract(other, unfinished, "--workers", "0") == 2
    assert f"was built from dataset root {recorded} ({unfinished / 'manifest.incomplete.json'})" in (
        capsys.readouterr().err
    )
    assert sorted(p.name for p in unfinished.iterdir()) == ["manifest.incomplete.json"]
