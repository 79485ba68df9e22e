"""A picture grid of a dataset split: `python -m davir.data show --format F --root DIR --out grid.png`.

The picture is written in the format its suffix names: `.png`, `.jpg`/`.jpeg` or `.webp` (another suffix, or
none, is refused before the dataset is read), and marked as this command's (a PNG text chunk, an EXIF Software
tag) so that a later grid may replace it inside the dataset's folder.

One row per pair: before | after | after with the ground-truth change mask in red, and the pair's
first reference caption written under the row. Thumbnails are squashed to squares, as the models see
them. Where the pair has a before-image mask, its outline is drawn in red on the before thumbnail
(so a dropped object, which has no after mask, is still pointed at).

A pair whose image or mask is missing or broken is not drawn: its row is crossed out in red and the pair is
named with the reason in `Grid.failed` (the command lists them on stderr and exits 1, docs/errors.md); the
others are drawn. A split none of whose pairs can be drawn stops with a `DataError`, and nothing is written.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin

from davir.data.formats import read_dataset
from davir.data.images import load_mask, load_pair
from davir.data.records import ChangePair
from davir.data.verify import refuse_dataset_file
from davir.errors import DataError, check_output_file
from davir.io import atomic_path

RED = np.array([255, 0, 0], np.float32)
BLANK = (235, 235, 235)
GAP = 4
# Rows of one picture: 500 rows of 160-px tiles are ~90,000 px tall, what PIL opens without its decompression-bomb
# warning; --num 100000 on a 67k-pair split held every thumbnail and a canvas of tens of GB in memory.
MAX_ROWS = 500
# The PNG text chunk (JPEG, WebP: the EXIF Software tag) that marks a grid this command wrote: only such a file
# inside --root may be replaced.
MARK = ("Software", "davir data show")
EXIF_SOFTWARE = 0x0131
# --out's suffix -> the format written; the largest side each can hold (PNG: none that 500 rows reach).
SUFFIX_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}
MAX_SIDE = {"JPEG": 65_500, "WEBP": 16_383}


@dataclass(frozen=True)
class Grid:
    """What `draw_grid` wrote: the picture, how many pairs it drew, and each pair it could not draw (crossed out
    in the picture) as (pair id, reason naming the record and file)."""

    path: Path
    drawn: int
    failed: tuple[tuple[str, str], ...] = ()

    @property
    def status(self) -> int:
        """The command's exit status (docs/errors.md): 1 when some pairs could not be drawn, else 0."""
        return 1 if self.failed else 0


def is_grid(path: Path) -> bool:
    """Whether `path` is a picture that `draw_grid` wrote (its PNG text chunk, or its EXIF Software tag, says so)."""
    try:
        with Image.open(path) as image:
            if image.format == "PNG":
                return image.text.get(MARK[0]) == MARK[1]
            return image.format in ("JPEG", "WEBP") and image.getexif().get(EXIF_SOFTWARE) == MARK[1]
    except (OSError, ValueError, SyntaxError):
        return False


def grid_format(out: str | Path) -> str:
    """The format `--out` names by its suffix (PNG, JPEG, WEBP); a DataError for another suffix or none."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        what = f"a {out.suffix} file" if out.suffix else "a file without a suffix"
        raise DataError(
            f"--out {out}: show cannot write {what}; give a .png, .jpg/.jpeg or .webp path "
            f"(e.g. {out.with_suffix('.png') if out.name else 'grid.png'})"
        )
    return SUFFIX_FORMATS[suffix]


def _thumbnail(image: Image.Image, tile: int) -> np.ndarray:
    return np.asarray(image.resize((tile, tile), Image.BICUBIC), dtype=np.uint8)


def _mask_thumbnail(path: Path, tile: int, record: str) -> np.ndarray:
    mask = load_mask(path, record=record).astype(np.uint8) * 255
    return np.asarray(Image.fromarray(mask).resize((tile, tile), Image.NEAREST)) > 0


def overlay_mask(image: np.ndarray, mask: np.ndarray, opacity: float = 0.45) -> np.ndarray:
    """The image with the mask's pixels blended towards red."""
    out = image.astype(np.float32)
    out[mask] = (1.0 - opacity) * out[mask] + opacity * RED
    return out.astype(np.uint8)


def outline_mask(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The image with the mask's outline drawn in red (1 px)."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    out = image.copy()
    cv2.drawContours(out, contours, -1, (255, 0, 0), 1)
    return out


def crossed_tile(tile: int, text: str = "not drawn") -> np.ndarray:
    """The tile of a pair that could not be drawn: blank, crossed out in red, `text` in its middle where it fits."""
    image = Image.new("RGB", (tile, tile), BLANK)
    draw = ImageDraw.Draw(image)
    width = max(1, tile // 40)
    draw.line([(0, 0), (tile - 1, tile - 1)], fill=(255, 0, 0), width=width)
    draw.line([(0, tile - 1), (tile - 1, 0)], fill=(255, 0, 0), width=width)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=ImageFont.load_default())
    if text and right - left + 8 <= tile:
        x, y = (tile - (right - left)) // 2, (tile - (bottom - top)) // 2
        draw.rectangle((x - 3, y - 3 + top, x + right - left + 2, y + bottom + 2), fill=(255, 255, 255))
        draw.text((x - left, y), text, fill=(0, 0, 0), font=ImageFont.load_default())
    return np.asarray(image)


def pair_row(pair: ChangePair, tile: int) -> list[np.ndarray]:
    """The three thumbnails of one pair: before, after, mask overlay (blank when the pair has no mask)."""
    before, after = load_pair(pair)
    before_tile, after_tile = _thumbnail(before, tile), _thumbnail(after, tile)
    if not pair.has_gt_mask:
        return [before_tile, after_tile, np.full((tile, tile, 3), BLANK, np.uint8)]
    mask_before = _mask_thumbnail(pair.gt_mask_before, tile, pair.pair_id)
    mask_after = _mask_thumbnail(pair.gt_mask_after, tile, pair.pair_id)
    if mask_before.any():
        before_tile = outline_mask(before_tile, mask_before)
    return [before_tile, after_tile, overlay_mask(after_tile, mask_after)]


def draw_grid(format: str, root: str | Path, split: str, out: str | Path, num: int = 12, tile: int = 160) -> Grid:
    """Draw the first `num` pairs of a split (read with `read_dataset`) as rows of
    before | after | mask-overlay thumbnails (`tile` pixels square) with the first caption under each
    row; save the picture atomically to `out`, in the format its suffix names (`grid_format`). A pair whose image
    or mask cannot be read is crossed out and listed in the returned `Grid.failed`; when no pair can be drawn, a
    DataError and nothing written. `out` is never a file of the dataset (`davir.data.verify.refuse_dataset_file`):
    inside `root` only a new file or an earlier grid."""
    if not 1 <= num <= MAX_ROWS:
        raise DataError(f"show: --num must be 1 to {MAX_ROWS} (the rows of one picture), got {num}")
    if tile < 16:
        raise DataError(f"show: tile must be at least 16 pixels, got {tile}")
    check_output_file(out, what="--out", example="grid.png")
    image_format = grid_format(out)  # before anything is read: `--out grid.jpg` wrote PNG bytes
    index = read_dataset(format, root, split)
    refuse_dataset_file(out, root, index.pairs, command="davir.data show", own=is_grid)
    pairs = index.pairs[:num]
    if not pairs:
        raise DataError(f"{root}: split {split!r} of format {format!r} has no pairs to draw")

    font = ImageFont.load_default()
    width = 3 * tile + 4 * GAP
    chars_per_line = max(16, width // 6)
    labels = []
    for pair in pairs:
        caption = pair.captions[0] if pair.captions else "(no caption)"
        labels.append(textwrap.wrap(f"{pair.pair_id} [{pair.change_type or '-'}] {caption}", chars_per_line) or [""])
    line_height = 12
    height = GAP + sum(tile + GAP + line_height * len(lines) + GAP for lines in labels)
    if max(width, height) > MAX_SIDE.get(image_format, max(width, height)):  # before any image is read
        raise DataError(
            f"--out {out}: a grid of {len(pairs)} rows is {width:,} x {height:,} px, more than {image_format} holds "
            f"({MAX_SIDE[image_format]:,} px a side); write a .png, or draw fewer rows (--num)"
        )
    rows: list[tuple[list[np.ndarray], list[str]]] = []
    failed: list[tuple[str, str]] = []
    for pair, lines in zip(pairs, labels):
        try:
            tiles = pair_row(pair, tile)
        except DataError as error:  # one pair's missing or broken file: the others are drawn (docs/errors.md)
            reason = str(error)
            if not reason.startswith(f"record {pair.pair_id!r}"):
                reason = f"record {pair.pair_id!r}: {reason}"
            failed.append((pair.pair_id, reason))
            tiles = [crossed_tile(tile), crossed_tile(tile, ""), crossed_tile(tile, "")]
        rows.append((tiles, lines))
    if len(failed) == len(pairs):
        raise DataError(
            f"{root}: none of the {len(pairs)} pair(s) of split {split!r} could be drawn, nothing written; "
            f"the first: {failed[0][1]}"
        )

    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    y = GAP
    for tiles, lines in rows:
        for column, thumbnail in enumerate(tiles):
            canvas.paste(Image.fromarray(thumbnail), (GAP + column * (tile + GAP), y))
        y += tile + GAP
        for line in lines:
            draw.text((GAP, y), line, fill=(0, 0, 0), font=font)
            y += line_height
        y += GAP
    out = Path(out)
    if image_format == "PNG":
        info = PngImagePlugin.PngInfo()
        info.add_text(*MARK)
        options = {"pnginfo": info}
    else:  # JPEG, WEBP: the mark in EXIF; quality 90 keeps the captions' small text legible
        exif = Image.Exif()
        exif[EXIF_SOFTWARE] = MARK[1]
        options = {"exif": exif, "quality": 90}
    with atomic_path(out) as tmp:
        canvas.save(tmp, format=image_format, **options)
    return Grid(out, drawn=len(pairs) - len(failed), failed=tuple(failed))
