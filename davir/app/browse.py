"""Reading a `captions.jsonl` from `caption.py` for the app's browse tab: counts, a filter, the report's strips.

    listing = read_captions("outputs/demo/captions.jsonl", failed_only=False, word="cube", limit=50)
    listing.rows                                  # the first `limit` matching rows, in input order
    strip_of(listing.path, row)                   # the report's strip of a row (report_files/strips/…), or None

Which rows a word matches: docs/recipes.md, "Look at a model in a browser".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from davir.errors import DataError
from davir.inference.caption_store import CaptionStore
from davir.io import iter_jsonl
from davir.viz.folder_report import report_files, strip_name


@dataclass
class Listing:
    path: Path
    total: int = 0
    captioned: int = 0
    failed: int = 0
    matched: int = 0
    rows: list[dict] = field(default_factory=list)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[\w'-]+", text.lower()))


def _row_text(row: dict) -> str:
    entities = " ".join(str(e[0]) for e in row.get("entities") or [] if e)
    return " ".join(
        [
            str(row.get("id", "")),
            row.get("caption") or "",
            entities,
            " ".join(row.get("references") or []),
            row.get("error") or "",
        ]
    )


def read_captions(path: str | Path, *, failed_only: bool = False, word: str = "", limit: int = 50) -> Listing:
    """Count the JSONL's pairs and keep the first `limit` that pass the filters (see the module docstring)."""
    path = Path(str(path).strip()).expanduser()
    if not str(path).strip() or str(path) == ".":
        raise DataError("give a captions.jsonl (the JSONL `caption.py --out` wrote)")
    if path.is_dir():
        path = path / "captions.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: no such file (a captions.jsonl written by `caption.py --out`)")
    wanted = _words(word or "")
    listing = Listing(path)
    for number, row in iter_jsonl(path):
        if not isinstance(row, dict) or "id" not in row:
            raise DataError(f'{path}: line {number} is not a caption.py row (no "id")')
        listing.total += 1
        failed = row.get("error") is not None
        listing.failed += failed
        listing.captioned += not failed
        if (failed_only and not failed) or (wanted and not wanted <= _words(_row_text(row))):
            continue
        listing.matched += 1
        if len(listing.rows) < limit:
            listing.rows.append(row)
    return listing


def report_dir_of(jsonl: Path, html: str | Path | None = None) -> Path:
    """The report's files folder: REPORT_files beside `html`; without it, the folder the JSONL's manifest records
    (caption.py's --html), else that of report.html beside the JSONL (caption.py's default)."""
    if html:
        return report_files(Path(html))
    recorded = CaptionStore.recorded_report_files(Path(jsonl))
    return Path(recorded) if recorded else report_files(Path(jsonl).with_name("report.html"))


def strip_of(jsonl: Path, row: dict, html: str | Path | None = None) -> Path | None:
    """The strip `caption.py`'s report holds for `row`, when there is one."""
    if row.get("index") is None or row.get("error") is not None:
        return None
    strip = report_dir_of(jsonl, html) / "strips" / strip_name(int(row["index"]))
    return strip if strip.is_file() else None
