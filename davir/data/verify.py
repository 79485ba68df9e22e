"""`python -m davir.data verify --format F --root R`: is my download complete?

Per split: the pairs the reader finds against the official count (docs/datasets.md; CLEVR-Change
counts its semantic and distractor pair per scene), the distinct image files against the official
count where one is known, and every missing, empty or undecodable image with the record that needs
it, and every record the reader leaves out with its pair (a folder's file without its partner, a train pair
without a caption). A split the reader finds no pair in is EMPTY, whether or not a count is published, unless its
format may leave that split empty (`MAY_BE_EMPTY`) and the reader left nothing out of it. Exit status 1 when
anything is short, empty or broken (2 for bad arguments), 0 when complete.
`--quick` checks existence and size only (no decoding): seconds instead of minutes on 100k images.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from davir.data.formats import FORMATS, read_dataset
from davir.data.records import ChangePair, DatasetIndex
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
# format -> (splits that may hold no pair, why). A folder's pairs without captions are all test, and its seeded split
# (10 % val, 10 % test) of a few pairs can leave val or test without one (docs/datasets.md, "Your own folder of
# pairs"); its reader refuses a folder with no pair at all. Every other split with no pair is EMPTY.
MAY_BE_EMPTY: dict[str, tuple[frozenset[str], str]] = {
    "folder": (frozenset({"train", "val", "test"}), "a folder's pairs may all be in its other splits")
}


@dataclass
class SplitCheck:
    split: str
    pairs: int = 0
    images: int = 0
    expected_pairs: int | None = None
    expected_images: int | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    # Records the reader left out with their pair (SkippedRecord.drops_pair): "source: record: reason".
    left_out: list[str] = field(default_factory=list)
    may_be_empty: bool = False  # the format allows this split no pair (MAY_BE_EMPTY)

    @property
    def empty(self) -> bool:
        """Read, and not one pair in it."""
        return self.error is None and self.pairs == 0

    @property
    def complete(self) -> bool:
        return (
            self.error is None
            and not self.problems
            and not self.left_out
            and (not self.empty or self.may_be_empty)
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
            "left_out": self.left_out,
            "empty": self.empty,
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


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` lies in `folder`, as typed (absolute) or with links resolved."""
    for a, b in ((os.path.abspath(path), os.path.abspath(folder)), (os.path.realpath(path), os.path.realpath(folder))):
        if a == b or a.startswith(b.rstrip(os.sep) + os.sep):
            return True
    return False


def refuse_dataset_file(
    out: str | Path,
    root: str | Path,
    pairs: Iterable[ChangePair] = (),
    *,
    flag: str = "--out",
    command: str,
    own: Callable[[Path], bool] = lambda path: False,
) -> None:
    """An output of `davir.data verify|show` never replaces a file of the dataset it reads: a DataError when
    `out` is an image or mask of `pairs` (wherever a folder's manifest put it), or an existing file inside `root`
    (an annotation file, an image of another split) that `own` does not recognise as this command's earlier
    output. Nothing is read or written but the names (and `own`'s look at the file)."""
    out, root = Path(out), Path(root)
    real = os.path.realpath(out)
    folders: dict[str, str] = {}  # each folder resolved once: 100k images share a few folders

    def resolved(path: Path) -> str:
        folder, name = os.path.split(os.path.abspath(path))
        if folder not in folders:
            folders[folder] = os.path.realpath(folder)
        joined = os.path.join(folders[folder], name)
        return os.path.realpath(joined) if os.path.islink(joined) else joined

    for pair in pairs:
        roles = (("before", pair.before), ("after", pair.after), ("distractor", pair.distractor))
        roles += (("before mask", pair.gt_mask_before), ("after mask", pair.gt_mask_after))
        for role, path in roles:
            if path is not None and resolved(path) == real:
                raise DataError(
                    f"{flag} {out} is the {role} image of record {pair.pair_id!r}, which it would replace; "
                    f"give another {flag}"
                )
    if os.path.lexists(out) and _inside(out, root) and not own(out):
        raise DataError(
            f"{flag} {out} is a file of the dataset at --root {root} (not an earlier `{command}` output), "
            f"which it would replace; give another {flag}"
        )


REPORT_KEYS = {"format", "root", "decoded", "splits"}


def is_verify_report(path: Path) -> bool:
    """Whether `path` holds what `verify --out` writes (a JSON object of exactly its keys)."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and set(document) == REPORT_KEYS


def verify_split(
    format: str, root: Path, split: str, *, decode: bool = True, index: DatasetIndex | DataError | None = None
) -> SplitCheck:
    """`index`: the split as `read_dataset` read it (or the DataError it raised), when the caller has it."""
    expected = OFFICIAL_COUNTS.get(format, {}).get(split, (None, None))
    may_be_empty = split in MAY_BE_EMPTY.get(format, ((), ""))[0]
    check = SplitCheck(split, expected_pairs=expected[0], expected_images=expected[1], may_be_empty=may_be_empty)
    if index is None:
        try:
            index = read_dataset(format, root, split)
        except DataError as error:
            index = error
    if isinstance(index, DataError):
        check.error = str(index)
        return check
    check.pairs = len(index.pairs)
    check.left_out = [f"{skip.source}: {skip.record}: {skip.reason}" for skip in index.skipped if skip.drops_pair]
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
    format: str,
    root: str | Path,
    splits: list[str] | None = None,
    *,
    decode: bool = True,
    out: str | Path | None = None,
) -> list[SplitCheck]:
    """Every split's check. `out`: where the caller will write the report; refused before any image is looked
    at when it would replace a file of the dataset (`refuse_dataset_file`)."""
    FORMATS.check(format, key="--format")
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"dataset root {root} does not exist or is not a folder")
    splits = splits or [split for split in FORMATS[format].splits if split != "all"]
    indexes: dict[str, DatasetIndex | DataError] = {}
    for split in splits:
        try:
            indexes[split] = read_dataset(format, root, split)
        except DataError as error:
            indexes[split] = error
    if out is not None:
        pairs = (pair for index in indexes.values() if not isinstance(index, DataError) for pair in index.pairs)
        refuse_dataset_file(out, root, pairs, command="davir.data verify", own=is_verify_report)
    return [verify_split(format, root, split, decode=decode, index=indexes[split]) for split in splits]


def _left_out(check: SplitCheck) -> list[str]:
    return [f"{len(check.left_out):,} record(s) left out by the reader"] if check.left_out else []


def _shortfalls(check: SplitCheck) -> list[str]:
    """Why a split is not complete: its unusable images, and counts that are not the official ones (a download
    whose every file decodes but that lacks pairs said "0 unusable image(s)")."""
    reasons = [f"{len(check.problems):,} unusable image(s)"] if check.problems else []
    reasons += _left_out(check)
    for what, found, expected in (
        ("pairs", check.pairs, check.expected_pairs),
        ("images", check.images, check.expected_images),
    ):
        if expected is not None and found != expected:
            reasons.append(
                f"{expected - found:,} {what} short"
                if found < expected
                else f"{found - expected:,} {what} more than the official count"
            )
    return reasons


def format_checks(format: str, checks: list[SplitCheck]) -> tuple[list[str], list[str]]:
    """(summary lines for stdout, problem lines for stderr). A record left out of every split (a folder's file
    without its partner) is listed once, under the first."""
    summary, problems = [], []
    listed: set[str] = set()
    for check in checks:
        if check.error:
            summary.append(f"{format} {check.split}: cannot be read: {check.error}")
            continue
        pairs = f"{check.pairs:,} pairs" + (f" of {check.expected_pairs:,}" if check.expected_pairs is not None else "")
        images = f"{check.images:,} images" + (
            f" of {check.expected_images:,}" if check.expected_images is not None else ""
        )
        if check.empty and check.may_be_empty and not check.left_out:
            state = f"empty ({MAY_BE_EMPTY[format][1]})"
        elif check.empty:  # "complete" called a split of no pair fine; "N pairs short" hid that it had none
            state = "; ".join(["EMPTY: no pairs", *_left_out(check)])
        elif check.complete:
            state = "complete"
        else:
            state = "INCOMPLETE: " + "; ".join(_shortfalls(check))
        summary.append(f"{format} {check.split}: {pairs}, {images}: {state}")
        new_left_out = [line for line in check.left_out if line not in listed]
        listed.update(new_left_out)
        for kind, lines in (("", check.problems), ("left out: ", new_left_out)):
            problems.extend(f"{format} {check.split}: {kind}{line}" for line in lines[:SHOWN])
            if len(lines) > SHOWN:
                problems.append(f"{format} {check.split}: {kind}… and {len(lines) - SHOWN:,} more (all in --out)")
    return summary, problems
