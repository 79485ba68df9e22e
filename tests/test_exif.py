"""EXIF orientation: a phone photo (stored sideways, tagged) is read upright by every reader of images."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_caption import pair_folder, rows_of, run, trained  # noqa: F401 - `trained` is the tiny run fixture

from davir.data.images import load_pair, load_rgb
from davir.data.records import ChangePair

ORIENTATION = 0x0112
# How to store an upright picture so that a viewer honouring tag N shows it upright: the inverse of the
# display transform the EXIF spec gives for N (6 = "rotate 90° clockwise to view", 8 = counter-clockwise).
STORED_AS = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def upright_picture() -> Image.Image:
    """64x48, four differently coloured quadrants: each of the eight orientations looks different."""
    array = np.zeros((48, 64, 3), dtype=np.uint8)
    array[:24, :32] = (220, 30, 30)
    array[:24, 32:] = (30, 200, 30)
    array[24:, :32] = (30, 30, 220)
    array[24:, 32:] = (240, 240, 240)
    return Image.fromarray(array)


def save_tagged(image: Image.Image, path: Path, tag: int, *, fmt: str = "JPEG") -> Path:
    """`image` (upright) stored as a camera does for orientation `tag`: transformed pixels + the tag."""
    stored = image if STORED_AS[tag] is None else image.transpose(STORED_AS[tag])
    exif = Image.Exif()
    exif[ORIENTATION] = tag
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"quality": 95, "subsampling": 0} if fmt == "JPEG" else {}
    stored.save(path, fmt, exif=exif.tobytes(), **options)
    return path


@pytest.mark.parametrize("tag", range(1, 9))
def test_load_rgb_returns_the_upright_picture_for_all_eight_orientations(tmp_path, tag):
    picture = upright_picture()
    loaded = load_rgb(save_tagged(picture, tmp_path / f"o{tag}.jpg", tag))
    assert loaded.size == picture.size
    difference = np.abs(np.asarray(loaded, dtype=int) - np.asarray(picture, dtype=int))
    assert difference.mean() < 4, f"orientation {tag} read as another picture (mean difference {difference.mean():.1f})"
    # the decode-at-working-resolution path (caption.py's max_side) turns it upright too
    small = load_rgb(tmp_path / f"o{tag}.jpg", max_side=16)
    assert small.width > small.height


def test_a_tagged_photo_pairs_with_the_same_view_exported_upright(tmp_path):
    picture = upright_picture()
    before = save_tagged(picture, tmp_path / "phone.jpg", 6)
    after = save_tagged(picture, tmp_path / "exported.jpg", 1)
    loaded = load_pair(ChangePair("p", before, after), size_policy="error")  # not "48x64 but after is 64x48"
    assert [image.size for image in loaded] == [(64, 48), (64, 48)]
    bounded = load_pair(ChangePair("p", before, after), size_policy="error", max_side=32)
    assert bounded[0].size == bounded[1].size


def test_import_checks_sizes_and_masks_in_the_upright_frame(tmp_path):
    from davir.data.importer import check_pairs

    picture = upright_picture()
    save_tagged(picture, tmp_path / "imgs" / "before.jpg", 8)
    save_tagged(picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT), tmp_path / "imgs" / "after.jpg", 1)
    Image.new("L", picture.size, 255).save(tmp_path / "imgs" / "mask.png")
    (tmp_path / "pairs.csv").write_text(
        "id,before,after,caption,mask\na,imgs/before.jpg,imgs/after.jpg,the picture was mirrored,imgs/mask.png\n"
    )
    report = check_pairs(tmp_path / "pairs.csv")
    assert report["problems"] == []
    assert report["pairs"] == 1 and len(report.pop("_pairs")) == 1


def tagged_copies(upright: Path, tagged: Path, jpegs: Path) -> None:
    """The pairs of `jpegs` (before/ and after/ JPEGs) twice: stored with orientation tags (one tag per file,
    all eight used, a tagged before with an untagged after among them) under `tagged`, and as the upright
    pixels a viewer shows, saved losslessly, under `upright`."""
    tags = iter([6, 1, 8, 3, 2, 5, 7, 4, 1, 6])
    for side in ("before", "after"):
        (upright / side).mkdir(parents=True)
        for path in sorted((jpegs / side).iterdir()):
            tag = next(tags)
            target = save_tagged(Image.open(path).convert("RGB"), tagged / side / f"{path.stem}.jpg", tag)
            with Image.open(target) as stored:
                pixels = stored.convert("RGB")
            inverse = {
                Image.Transpose.ROTATE_90: Image.Transpose.ROTATE_270,
                Image.Transpose.ROTATE_270: Image.Transpose.ROTATE_90,
            }
            if STORED_AS[tag] is not None:
                pixels = pixels.transpose(inverse.get(STORED_AS[tag], STORED_AS[tag]))
            pixels.save(upright / side / f"{path.stem}.png")


def test_tagged_pairs_caption_exactly_as_the_same_pairs_saved_upright(trained, tmp_path, capsys):  # noqa: F811
    pngs = pair_folder(tmp_path / "pngs", trained / "data", 5)  # 96x72: a sideways read changes the size
    tagged_copies(tmp_path / "upright", tmp_path / "tagged", pngs)
    results = {}
    for name in ("upright", "tagged"):
        out = tmp_path / f"{name}.jsonl"
        status, _, err = run(
            [
                "--checkpoint",
                trained / "runs" / "tiny",
                "--pairs",
                tmp_path / name,
                "--out",
                out,
                "--quiet",
                "--workers",
                "0",
            ],
            capsys,
        )
        assert status == 0, err
        results[name] = [(r["id"], r["caption"], r["entities"], r["error"]) for r in rows_of(out)]
    assert len(results["tagged"]) == 5 and all(row[1] and row[3] is None for row in results["tagged"])
    assert results["tagged"] == results["upright"]


def test_masks_of_tagged_pairs_are_those_of_the_upright_pairs(trained, tmp_path):  # noqa: F811
    from davir.jobs import masks as masks_job

    pngs = pair_folder(tmp_path / "pngs", trained / "data", 3)
    tagged_copies(tmp_path / "upright", tmp_path / "tagged", pngs)
    masks = {}
    for name in ("upright", "tagged"):
        assert (
            masks_job.main(
                [
                    "--format",
                    "folder",
                    "--root",
                    str(tmp_path / name),
                    "--split",
                    "all",
                    "--out",
                    str(tmp_path / f"masks_{name}"),
                    "--workers",
                    "1",
                ]
            )
            == 0
        )
        masks[name] = {
            path.relative_to(tmp_path / f"masks_{name}"): np.asarray(Image.open(path))
            for path in sorted((tmp_path / f"masks_{name}").rglob("*.png"))
        }
    assert masks["tagged"].keys() == masks["upright"].keys() and masks["tagged"]
    for key, mask in masks["upright"].items():
        assert mask.shape == (72, 96) and np.array_equal(masks["tagged"][key], mask), key
