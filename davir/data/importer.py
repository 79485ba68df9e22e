"""`python -m davir.data import SOURCE --out DIR`: check a user's pairs end to end before any training.

SOURCE is a `folder`-format manifest (pairs.csv / pairs.jsonl) or folder. One pass names every problem by its row
("pairs.csv: line 7: …") in DIR/report.json and DIR/summary.html; DIR/pairs.jsonl is written only when there is
none, else the exit status is 2. What is checked: docs/recipes.md, "Train DAVIR on your own pairs".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from davir.data.formats.folder import SplitOptions, assign_splits, folder_contents, manifest_of, to_change_pair
from davir.data.formats.folder_rows import Problems
from davir.data.images import upright_size
from davir.data.stats import has_words
from davir.errors import DataError, check_output_dir, refuse_outputs_over_inputs
from davir.io import atomic_path, write_json_atomic

WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
LONG_CAPTION_WORDS = 40  # more words than a change caption usually has (and than 30 new tokens hold)
SAMPLE_ROWS = 12


def _image_facts(path: Path) -> tuple[tuple[int, int] | None, str | None, str | None]:
    """(size, content hash, problem) of one image file."""
    if not path.exists():
        return None, None, f"file is missing: {path}"
    if path.is_dir():
        return None, None, f"the path is a folder, not an image file: {path}"
    if not path.is_file():
        return None, None, f"not a file: {path}"
    data = path.read_bytes()
    if not data:
        return None, None, f"file is empty: {path}"
    try:
        with Image.open(path) as image:
            image.load()
            size = upright_size(image)  # as every reader will see it (EXIF orientation applied)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        return None, None, f"not a readable image: {path} ({error})"
    return size, hashlib.blake2b(data, digest_size=16).hexdigest(), None


class _ChangePairs(Sequence):
    """The good pairs as ChangePairs, made when read: the merged rows are in memory already, and a million
    ChangePairs beside them would double what the import holds."""

    def __init__(self):
        self.rows: list[tuple] = []  # (FolderPair, split)

    def append(self, pair, split: str) -> None:
        self.rows.append((pair, split))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [to_change_pair(*row) for row in self.rows[index]]
        return to_change_pair(*self.rows[index])

    def __iter__(self):
        return (to_change_pair(*row) for row in self.rows)


def caption_statistics(captions: list[str]) -> dict:
    """Counts of captions, words per caption, vocabulary (lower-cased words) and its rare words."""
    lengths: list[int] = []
    vocabulary: Counter[str] = Counter()
    for caption in captions:  # one caption's words at a time: a million captions' word lists would not fit
        words = WORD.findall(caption.lower())
        lengths.append(len(words))
        vocabulary.update(words)
    if not captions:
        return {"captions": 0}
    return {
        "captions": len(captions),
        "words_per_caption": {
            "min": min(lengths),
            "median": statistics.median(lengths),
            "mean": round(statistics.fmean(lengths), 2),
            "max": max(lengths),
        },
        "vocabulary": len(vocabulary),
        "words_seen_once": sum(1 for count in vocabulary.values() if count == 1),
        "most_common_words": vocabulary.most_common(15),
        f"captions_over_{LONG_CAPTION_WORDS}_words": sum(1 for n in lengths if n > LONG_CAPTION_WORDS),
        "captions_without_words": sum(1 for caption in captions if not has_words(caption)),
    }


def check_pairs(
    source: str | Path,
    *,
    options: SplitOptions = SplitOptions(),
    allow_uncaptioned: bool = False,
    allow_size_mismatch: bool = False,
    encoding: str | None = None,
) -> dict:
    """Every problem of a folder/manifest in one pass; returns the report (see the module docstring)."""
    source = Path(source)
    problems = Problems(str(source if source.is_file() else source), strict=False)
    contents = folder_contents(source, problems, encoding=encoding)
    problems.source = contents.source
    split_of = assign_splits(contents.pairs, options)

    facts: dict[str, tuple] = {}  # by path text: hashing a str is far cheaper than a Path's, a million times over

    def image(path: Path, record: str, role: str):
        key = str(path)
        found = facts.get(key)
        if found is None:
            found = facts[key] = _image_facts(path)
        size, digest, problem = found
        if problem:
            problems.add(record, f"{role}: {problem}")
        return size, digest

    holders: dict[str, dict[str, str]] = defaultdict(dict)  # image hash -> split -> first record using it
    good, uncaptioned, warnings = _ChangePairs(), 0, []
    for pair in contents.pairs:
        record = pair.records[0] if len(pair.records) == 1 else f"{pair.records[0]} (id {pair.pair_id!r})"
        bad = len(problems.items)
        split = split_of[pair.pair_id]
        empty_rows = pair.empty_caption_records
        if not pair.captions:
            uncaptioned += 1
        warnings.extend(
            f"{problems.source}: {record}: caption {caption!r} has no words (punctuation only); it teaches "
            "the model nothing: fix or delete it"
            for caption in pair.captions
            if not has_words(caption)
        )
        if empty_rows and (pair.captions or not allow_uncaptioned):
            for row in empty_rows:
                problems.add(row, "empty caption")
        elif not pair.captions and pair.split in ("train", "val"):
            problems.add(
                record, f"is in split {pair.split!r} but has no caption (a pair without one can only be captioned)"
            )
        elif not pair.captions and not allow_uncaptioned and contents.has_captions:
            problems.add(record, "has no caption (pass --allow-uncaptioned to keep it for captioning only)")
        before_size, before_hash = image(pair.first.before, record, "before")
        after_size, after_hash = image(pair.first.after, record, "after")
        if before_size and after_size and before_size != after_size and not allow_size_mismatch:
            problems.add(
                record,
                f"before is {before_size[0]}x{before_size[1]} but after is {after_size[0]}x{after_size[1]} "
                "(--allow-size-mismatch resizes before to after, as for IER)",
            )
        for role, path, frame in (
            ("mask", pair.first.mask, after_size),
            ("mask_before", pair.first.mask_before, before_size),
        ):
            if path is not None:
                size, _ = image(path, record, role)
                if size and frame and size != frame:
                    problems.add(record, f"{role} is {size[0]}x{size[1]} but its image is {frame[0]}x{frame[1]}")
        if pair.captions and len(problems.items) == bad:  # leakage among otherwise good pairs
            for digest in (before_hash, after_hash):
                if digest is not None:
                    holders[digest].setdefault(split, record)
        if len(problems.items) == bad:
            good.append(pair, split)
    for by_split in holders.values():
        if len(by_split) > 1:
            named = sorted(by_split.items(), key=lambda item: ("train", "val", "test").index(item[0]))
            first_split, first_record = named[0]
            for split, record in named[1:]:
                problems.add(
                    record, f"leakage: an image of this {split} pair is also in {first_split} ({first_record})"
                )

    captions = [caption for pair in contents.pairs for caption in pair.captions]
    splits = Counter(split_of[pair.pair_id] for pair in contents.pairs if pair.captions)
    return {
        "source": contents.source,
        "pairs": len(contents.pairs),
        "rows_merged": sum(len(pair.records) for pair in contents.pairs),
        "pairs_by_split": {split: splits.get(split, 0) for split in ("train", "val", "test")},
        "pairs_without_captions": uncaptioned,
        "images_checked": len(facts),
        "split_options": {
            "seed": options.seed,
            "val_fraction": options.val_fraction,
            "test_fraction": options.test_fraction,
        },
        "captions": caption_statistics(captions),
        "skipped": [f"{skip.source}: {skip.record}: {skip.reason}" for skip in contents.skipped],
        "notes": contents.notes,
        "warnings": warnings,
        "problems": problems.lines(),
        "_pairs": good,
    }


class _Resolver:
    """`Path.resolve()` of many files in few folders: each folder resolved once, then one lstat per file (a
    symlinked file is still followed), instead of an lstat per component of every path."""

    def __init__(self):
        self.folders: dict[str, str] = {}

    def __call__(self, path: Path) -> str:
        folder, name = os.path.split(str(path))
        if name in ("", ".", ".."):
            return str(path.resolve())
        real = self.folders.get(folder)
        if real is None:
            real = self.folders[folder] = os.path.realpath(folder or ".")
        joined = os.path.join(real, name)
        return os.path.realpath(joined) if os.path.islink(joined) else joined


def normalised_lines(pairs):
    """pairs.jsonl, one line per pair (absolute resolved paths), as a stream of lines."""
    resolve = _Resolver()
    for pair in pairs:
        row = {
            "id": pair.pair_id,
            "before": resolve(pair.before),
            "after": resolve(pair.after),
            "captions": list(pair.captions),
            "split": pair.split,
        }
        if pair.gt_mask_after is not None:
            row["mask"] = resolve(pair.gt_mask_after)
            if pair.gt_mask_before != pair.gt_mask_after:
                row["mask_before"] = resolve(pair.gt_mask_before)
        yield json.dumps(row, ensure_ascii=False) + "\n"


def write_normalised_manifest(path: Path, pairs) -> None:
    """pairs.jsonl written line by line through a temporary file (atomic; never the whole text in memory)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(normalised_lines(pairs))
        handle.flush()
        os.fsync(handle.fileno())


def write_summary(path: Path, report: dict, pairs) -> None:
    """The one-page HTML: the numbers, the problems, and a grid of sample pairs (mask overlaid)."""
    from davir.data.images import load_mask, load_pair
    from davir.viz.report import ReportRow, write_report

    rows = []
    step = max(1, len(pairs) // SAMPLE_ROWS)
    for pair in pairs[::step][:SAMPLE_ROWS]:
        before, after = load_pair(pair)
        mask = load_mask(pair.gt_mask_after, record=pair.pair_id) if pair.gt_mask_after is not None else None
        rows.append(
            ReportRow(
                f"{pair.pair_id} [{pair.split}]",
                caption=pair.captions[0] if pair.captions else None,
                before=before,
                after=after,
                mask=mask,
                references=list(pair.captions[1:4]),
            )
        )
    stats = report["captions"]
    summary = {
        "source": report["source"],
        "pairs": f"{report['pairs']} ({report['rows_merged']} rows); with captions by split: "
        + ", ".join(f"{k} {v}" for k, v in report["pairs_by_split"].items())
        + f"; without captions (captionable only): {report['pairs_without_captions']}",
        "captions": (
            f"{stats['captions']}, words per caption {stats['words_per_caption']}, vocabulary {stats['vocabulary']} "
            f"({stats['words_seen_once']} seen once)"
        )
        if stats.get("captions")
        else "none",
        "problems": str(len(report["problems"]))
        + ("" if not report["problems"] else ": " + " | ".join(report["problems"][:20])),
    }
    if report["notes"]:
        summary["notes"] = " | ".join(report["notes"])
    if report.get("toolkit_rows_skipped"):
        summary["skipped rows"] = f"{report['toolkit_rows_skipped']}: " + " | ".join(report["skipped"][:20])
    if report["warnings"]:
        summary["warnings"] = f"{len(report['warnings'])}: " + " | ".join(report["warnings"][:20])
    write_report(path, rows, title=f"davir import — {Path(report['source']).name}", summary=summary)


WRITTEN = ("pairs.jsonl", "report.json", "summary.html", "toolkit_pairs.jsonl")  # what an import writes into --out
WRITER = "davir import"  # report.json's "written_by": the folder is an import's output, its files the import's own
# The keys every import's report.json has held since the first version: a report from before "written_by".
REPORT_KEYS = frozenset(
    ("source", "pairs", "rows_merged", "pairs_by_split", "pairs_without_captions", "images_checked")
    + ("split_options", "captions", "skipped", "notes", "problems")
)


def is_import_output(out: Path) -> bool:
    """Whether `out` holds the report.json of an earlier import (its files are then the import's to replace)."""
    try:
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, a folder, unreadable, not JSON (not UTF-8 included)
        return False
    return isinstance(report, dict) and (report.get("written_by") == WRITER or REPORT_KEYS <= report.keys())


def check_out_holds_no_foreign_files(out: Path) -> None:
    """Refuse an `out` holding a file of an import's name (WRITTEN) when `out` is no earlier import's output: the
    import would replace it (a failing one deletes pairs.jsonl), e.g. a hand-written pairs.jsonl of the user's.
    Importing again into an import's own --out (the way to import a fixed manifest) is the normal case."""
    found = [out / name for name in WRITTEN if os.path.lexists(out / name)]
    if not found or is_import_output(out):
        return
    why = "is not an import's report" if os.path.lexists(out / "report.json") else "is missing"
    it = "it" if len(found) == 1 else "them"
    raise DataError(
        f"--out {out}: {', '.join(str(path) for path in found)} would be replaced, and no davir import wrote {it} "
        f"({out / 'report.json'} {why}); give a new or empty --out, e.g. {out / 'imported'}, or move {it} away"
    )


def check_out_spares_source(source: Path, out: Path, toolkit: str | None) -> None:
    """Refuse an `out` where the import would write over the manifest it reads: the normalised pairs.jsonl would
    replace the user's (their extra columns and relative paths gone), and a failing import would delete it."""
    read = manifest_of(source) if toolkit is None else source if source.is_file() else None
    for name in WRITTEN:
        refuse_outputs_over_inputs(
            {"--out": out / name}, {"the manifest being imported": read}, hint=f"e.g. {out / 'imported'}"
        )


def import_pairs(
    source: str | Path, out: str | Path, *, toolkit: str | None = None, toolkit_options=None, **kwargs
) -> tuple[int, dict]:
    """Check `source`, write report.json + summary.html (+ pairs.jsonl when clean) into `out`; (exit status, report).
    `toolkit` (llamafactory, swift, trl): `source` is that toolkit's dataset, turned into `out/toolkit_pairs.jsonl`
    (a folder manifest, davir/data/toolkits; `toolkit_options`: its ImportOptions) before the same checks; its rows
    that are no pair davir can import are left out and listed (report "skipped", "toolkit_rows_skipped"): status 1."""
    out = check_output_dir(out, what="--out")  # before a million rows are read, not after
    check_out_spares_source(Path(source), out, toolkit)
    check_out_holds_no_foreign_files(out)
    skipped: list[str] = []
    if toolkit is not None:
        from davir.data.toolkits import ImportOptions, toolkit_manifest

        source, skipped = toolkit_manifest(
            toolkit, source, out / "toolkit_pairs.jsonl", toolkit_options or ImportOptions()
        )
    report = check_pairs(source, **kwargs)
    pairs = report.pop("_pairs")
    if toolkit is not None:
        report["toolkit_rows_skipped"] = len(skipped)
        report["skipped"] = skipped + report["skipped"]
    report = {"written_by": WRITER, **report}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "report.json", report)
    write_summary(out / "summary.html", report, pairs)
    manifest = out / "pairs.jsonl"
    if report["problems"]:
        if manifest.exists():
            manifest.unlink()  # never leave an earlier clean manifest beside a failing report
        return 2, report
    if not pairs:
        raise DataError(f"{source}: no pairs to import")
    write_normalised_manifest(manifest, pairs)
    return (1 if skipped else 0), report
