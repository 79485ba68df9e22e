"""Image I/O shared by every reader and pipeline: safe paths, RGB loading, the size policy."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from davir.data.records import ChangePair
from davir.errors import DataError
from davir.io import atomic_path

# Before/after size mismatch (IER): the before image is resized to the after image's size, as the
# IER references do (BLIP2IDC). "error" refuses mismatched pairs instead.
SIZE_POLICIES = ("resize_before_to_after", "error")


def resolve_in_root(root: Path, relative: str, *, source: str, record: str) -> Path:
    """Join a path taken from a downloaded dataset's annotation file to the folder it must stay in.

    Refused (DataError naming the file and record): absolute paths, paths that climb out with "..",
    and paths that leave the folder through a symlink inside it (a planted `x.jpg -> /etc/passwd`).
    The folder itself may be a symlink (datasets often keep `images/` on another disk): containment is
    checked against its resolved location. Missing files are not an error here (readers never open images).
    """
    if not isinstance(relative, str) or not relative.strip():
        raise DataError(f"{source}: record {record!r}: image path is empty or not a string: {relative!r}")
    if PurePosixPath(relative).is_absolute() or PureWindowsPath(relative).is_absolute():
        raise DataError(
            f"{source}: record {record!r}: image path {relative!r} is absolute; paths must be relative to {root}"
        )
    normalised = os.path.normpath(relative)
    if normalised == ".." or normalised.startswith(".." + os.sep):
        raise DataError(f"{source}: record {record!r}: image path {relative!r} escapes the dataset root {root}")
    joined = Path(root) / normalised
    if joined.is_symlink() or any(parent.is_symlink() for parent in _parents_below(joined, Path(root))):
        real_root = os.path.realpath(root)
        real = os.path.realpath(joined)
        if os.path.commonpath([real_root, real]) != real_root:
            raise DataError(
                f"{source}: record {record!r}: image path {relative!r} is a symlink that leads out of "
                f"the dataset folder {root} (to {real})"
            )
    return joined


def _parents_below(path: Path, root: Path):
    """The folders between `root` (excluded) and `path` (excluded)."""
    for parent in path.parents:
        if parent == root or len(parent.parts) <= len(root.parts):
            return
        yield parent


def resolve_user_path(base: Path, value: str, *, source: str, record: str) -> Path:
    """A path from the user's own list of pairs: absolute, `~/…`, or relative to `base` (the list's folder).

    Unlike `resolve_in_root`, anywhere on disk is fine: a user's manifest naming images on other disks,
    or written by `python -m davir.data pairs` next to a dataset, is the normal case.
    """
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{source}: {record}: image path is empty or not a string: {value!r}")
    text = os.path.expanduser(value.strip())  # strings, not pathlib, until the end: a manifest has a million rows
    return Path(os.path.normpath(text if os.path.isabs(text) else os.path.join(base, text)))


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB: RGBA/LA composited on white, palette, grayscale, 16-bit."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        array = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        array = np.clip(array / peak * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(array, mode="L").convert("RGB")
    if image.mode == "F":
        array = np.asarray(image, dtype=np.float64)
        array = np.clip(array * (255.0 if array.max() <= 1.0 else 1.0) + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(array, mode="L").convert("RGB")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def array_to_rgb(array: np.ndarray, *, name: str) -> Image.Image:
    """An image array from the Python API as 8-bit RGB, each dtype in its usual range.

    uint8 0-255; uint16 0-65535 (scaled); other integers only when all values are 0-255; float16/32/64 in
    [0, 1]; bool as black/white. Shapes (H, W), (H, W, 1) grey, (H, W, 3) RGB, (H, W, 4) RGBA (composited
    on white, as `to_rgb` does for files). Anything else is a DataError naming `name`, the dtype and range
    (a float image in 0-255 would otherwise be clipped to white, one in [0, 1] cast to black)."""
    shape = array.shape
    if array.ndim == 3 and shape[2] == 1:
        array = array[..., 0]
    if not (array.ndim == 2 or (array.ndim == 3 and shape[2] in (3, 4))) or 0 in shape:
        raise DataError(
            f"{name}: expected an image array of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got shape {shape}"
        )
    kind = array.dtype.kind
    if kind == "b":
        array = array.astype(np.uint8) * 255
    elif array.dtype == np.uint16:
        array = (array.astype(np.float64) / 257.0 + 0.5).astype(np.uint8)
    elif kind == "f":
        if not np.isfinite(array).all():
            raise DataError(
                f"{name}: a {array.dtype} image array holds NaN or infinite values; an image's "
                "values must be finite, in [0, 1] for floats"
            )
        low, high = float(array.min()), float(array.max())
        if low < 0 or high > 1:
            raise DataError(
                f"{name}: a {array.dtype} image array must hold values in [0, 1], got values from "
                f"{low} to {high}; for 0-255 values pass `array / 255` (or `array.astype(np.uint8)`)"
            )
        array = (array.astype(np.float64) * 255.0 + 0.5).astype(np.uint8)
    elif kind in "iu" and array.dtype != np.uint8:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high > 255:
            raise DataError(
                f"{name}: a {array.dtype} image array must hold values 0-255 (or be uint16, 0-65535), "
                f"got values from {low} to {high}"
            )
        array = array.astype(np.uint8)
    elif array.dtype != np.uint8:
        raise DataError(
            f"{name}: a {array.dtype} array is not an image; give uint8 (0-255), uint16 (0-65535), "
            "float in [0, 1] or bool"
        )
    return to_rgb(Image.fromarray(np.ascontiguousarray(array)))


# EXIF orientations that swap width and height (5-8: the camera was held sideways).
SIDEWAYS_ORIENTATIONS = (5, 6, 7, 8)
EXIF_ORIENTATION = 0x0112


def upright(image: Image.Image) -> Image.Image:
    """The image as a viewer shows it: its EXIF orientation applied (phones store portraits sideways + a tag).

    Every image davir reads goes through here (via `load_rgb` / `load_mask` / `upright_size`), so a tagged
    photo pairs with the same view exported upright, and masks, features and captions see one frame."""
    return ImageOps.exif_transpose(image)


def upright_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) after `upright`, read from the header alone (nothing is decoded)."""
    orientation = image.getexif().get(EXIF_ORIENTATION)
    return (image.height, image.width) if orientation in SIDEWAYS_ORIENTATIONS else image.size


def load_rgb(path: Path, *, record: str = "?", max_side: int | None = None) -> Image.Image:
    """Load one image as upright RGB, with a clear error naming the record for a missing, corrupt or oversized file.

    `max_side`: decode no larger than needed for a long side of at least `max_side` px — JPEG decodes at
    1/2, 1/4 or 1/8 scale (`draft`), other formats are box-reduced by an integer factor right after
    decoding — so a huge photo costs its working resolution, not its full size, in memory and time.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"record {record!r}: the image path is a folder, not an image file: {path}")
    if not path.is_file():
        raise DataError(f"record {record!r}: image file is missing: {path}")
    try:
        with Image.open(path) as image:
            if max_side is not None and max(image.size) > max_side:
                factor = max(image.size) // max_side
                if image.format == "JPEG":
                    image.draft("RGB", (image.width // factor, image.height // factor))
                image.load()
                factor = max(image.size) // max_side
                if factor > 1:
                    return to_rgb(upright(image)).reduce(factor)
            image.load()
            return to_rgb(upright(image))
    except Image.DecompressionBombError as error:
        raise DataError(f"record {record!r}: image is too large to decode safely: {path} ({error})") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DataError(f"record {record!r}: image file is corrupt or not an image: {path} ({error})") from error


def load_mask(path: Path, *, record: str = "?") -> np.ndarray:
    """Load a binary mask PNG as a bool array (H, W); any non-zero pixel is inside the mask."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"record {record!r}: the mask path is a folder, not an image file: {path}")
    if not path.is_file():
        raise DataError(f"record {record!r}: mask file is missing: {path}")
    try:
        with Image.open(path) as image:
            return np.asarray(upright(image).convert("L")) > 0
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DataError(f"record {record!r}: mask file is corrupt: {path} ({error})") from error


def load_pair(
    pair: ChangePair, *, size_policy: str = "resize_before_to_after", max_side: int | None = None
) -> tuple[Image.Image, Image.Image]:
    """Load (before, after) as RGB images of one size, applying the documented size policy.

    `max_side` bounds the decoded size (see `load_rgb`); the size policy compares the files' own sizes.
    """
    if size_policy not in SIZE_POLICIES:
        raise ValueError(f"size_policy must be one of {SIZE_POLICIES}, got {size_policy!r}")
    before = load_rgb(pair.before, record=pair.pair_id, max_side=max_side)
    after = load_rgb(pair.after, record=pair.pair_id, max_side=max_side)
    if before.size != after.size:
        # With `max_side` the decoded sizes may differ for files of one size (a JPEG draft): compare the files.
        sizes = (_file_size(pair.before), _file_size(pair.after)) if max_side else (before.size, after.size)
        if size_policy == "error" and sizes[0] != sizes[1]:
            raise DataError(
                f"record {pair.pair_id!r}: before {pair.before} is {sizes[0][0]}x{sizes[0][1]} but "
                f"after {pair.after} is {sizes[1][0]}x{sizes[1][1]}"
            )
        before = before.resize(after.size, Image.BICUBIC)
    return before, after


def _file_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        return upright_size(image)


def save_png_atomic(image: Image.Image | np.ndarray, path: Path, *, compress_level: int = 6) -> None:
    """Write a PNG through a temporary file and an atomic rename, so a kill never leaves half a file.

    `compress_level` is zlib's 0-9 (6 = PIL's default); bulk writers use 1, about twice as fast.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(image, np.ndarray):
        array = image.astype(np.uint8) * 255 if image.dtype == bool else image
        image = Image.fromarray(array)
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG", compress_level=compress_level)
