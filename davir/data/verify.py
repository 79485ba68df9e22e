"""`python -m davir.data verify --format F --root R`: is my download complete?

Per split: the pairs the reader finds against the official count (docs/datasets.md; CLEVR-Change
counts its semantic and distractor pair per scene), the distinct image files against the official
count where one is known, and every missing, empty or undecodable image with the record that needs
it. Exit status 1 when anything is short or broken (2 for bad arguments), 0 when complete.
`--quick` checks existence and size only (no decoding): seconds instead of minutes on 100k images.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from davir.data.formats import FORMATS, read_dataset
from davir.errors import DataError

# format -> split -> (pairs, distinct image files); None where no count is published.
OFFICIAL_COUNTS: dict[str, dict[str, tuple[int, int | None]]] = {
    "clevr_change": {"train": (67_660, 101_490), "val": (3_976, 5_964), "test": (7_970, 11_955)},
    "clevr_dc": {"train": (40_800, 81_600), "val": (2_400, 4_800), "test": (4_800, 9_600)},
    "spot_the_diff": {"train": (8_566, 17_132), "val": (1_493, 2_986), "test": (1_270, 2_540)},
    "ier": {"train": (3_061, None), "val": (383, None), "test": (495, None)},
    "levir_cc": {"train": (6_815, 13_630), "val": (1_333, 2_666), "test": (1_929, 3_858)},
}
SHOWN = 20  # problems printed per split (all of them go to --out)


@dataclass
class SplitCheck:
    split: str
    pairs: int = 0
    images: int = 0
    expected_pairs: int | None = None
    expected_images: int | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return (
            self.error is None
            and not self.problems
            and (self.expected_pairs is None or self.pairs == self.expected_pairs)
            and (self.expected_images is None or self.images == self.expected_images)
        )

    def to_dict(self) -> dict:
        return {
            "split": self.split,
            "pairs": self.pairs,
            "expected_pairs": self.expected_pairs,
            "images": self.images,
            "expected_images": self.expected_images,
            "error": self.error,
            "problems": self.problems,
            "complete": self.complete,
        }


def image_problem(path: Path, *, decode: bool) -> str | None:
    """Why an image file is unusable (missing, empty, undecodable), or None."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        return f"unreadable ({error.strerror})"
    if size == 0:
        return "empty (0 bytes)"
    if decode:
        try:
            with Image.open(path) as image:
                image.load()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
            return f"undecodable ({error})"
    return None


def verify_split(format: str, root: Path, split: str, *, decode: bool = True) -> SplitCheck:
    expected = OFFICIAL_COUNTS.get(format, {}).get(split, (None, None))
    check = SplitCheck(split, expected_pairs=expected[0], expected_images=expected[1])
    try:
        index = read_dataset(format, root, split)
    except DataError as error:
        check.error = str(error)
        return check
    check.pairs = len(index.pairs)
    seen: dict[Path, str | None] = {}
    for pair in index.pairs:
        roles = (("before", pair.before), ("after", pair.after), ("distractor", pair.distractor))
        for role, path in roles:
            if path is None or (role == "distractor" and path == pair.after):
                continue
            if path not in seen:
                seen[path] = image_problem(path, decode=decode)
                if seen[path]:
                    check.problems.append(f"record {pair.pair_id!r}: {role} image {seen[path]}: {path}")
    check.images = len(seen)
    return check


def verify_dataset(
    format: str, root: str | Path, splits: list[str] | None = None, *, decode: bool = True
) -> list[SplitCheck]:
    FORMATS.check(format, key="--format")
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"dataset root {root} does not exist or is not a folder")
    splits = splits or [split for split in FORMATS[format].splits if split != "all"]
    return [verify_split(format, root, split, decode=decode) for split in splits]


def format_checks(format: str, checks: list[SplitCheck]) -> tuple[list[str], list[str]]:
    """(summary lines for stdout, problem lines for stderr)."""
    summary, problems = [], []
    for check in checks:
        if check.error:
            summary.append(f"{format} {check.split}: cannot be read: {check.error}")
            continue
        pairs = f"{check.pairs:,} pairs" + (f" of {check.expected_pairs:,}" if check.expected_pairs is not None else "")
        images = f"{check.images:,} images" + (
            f" of {check.expected_images:,}" if check.expected_images is not None else ""
        )
        state = "complete" if check.complete else f"INCOMPLETE: {len(check.problems):,} unusable image(s)"
        summary.append(f"{format} {check.split}: {pairs}, {images}: {state}")
        problems.extend(f"{format} {check.split}: {line}" for line in check.problems[:SHOWN])
        if len(check.problems) > SHOWN:
            problems.append(f"{format} {check.split}: … and {len(check.problems) - SHOWN:,} more (all in --out)")
    return summary, problems
