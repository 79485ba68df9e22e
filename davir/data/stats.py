"""Per-split counts of a dataset on disk (`python -m davir.data stats --format NAME --root DIR`).

Works on annotations alone: image files are only checked for existence (never opened), and a split
whose annotation file is absent is reported with its error instead of stopping the other splits.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from davir.data.formats import FORMATS, read_dataset
from davir.data.records import DatasetIndex
from davir.errors import DataError

MAX_EXAMPLES = 5
# DAVIR trains on at most model.max_caption_tokens - 1 tokens of a reference (davir/models/vlm/config.py, not
# imported: the data layer stands below the models). A word is at least one token, so a reference with more
# words is surely cut in training; train.py prints the exact count with the model's own tokenizer.
DAVIR_CAPTION_TOKENS = 48
LONG_REFERENCE_WORDS = DAVIR_CAPTION_TOKENS - 1
# Split names that are aliases of another split of the same format (not counted twice by default).
SPLIT_ALIASES = {"folder": {"all"}}


def has_words(caption: str) -> bool:
    """False for a reference of punctuation alone ("...", "—"): it teaches a captioner nothing."""
    return any(character.isalnum() for character in caption)


def reference_counts(index: DatasetIndex) -> dict:
    """The longest reference in words, the references surely cut in training, and those without words."""
    long, wordless, longest = [], [], 0
    for pair in index.pairs:
        for caption in pair.captions:
            words = len(caption.split())
            longest = max(longest, words)
            if words > LONG_REFERENCE_WORDS:
                long.append(f"{pair.pair_id}: {words} words")
            if not has_words(caption):
                wordless.append(f"{pair.pair_id}: {caption!r}")
    return {
        "longest_reference_words": longest,
        f"references_over_{LONG_REFERENCE_WORDS}_words": len(long),
        "long_reference_examples": long[:MAX_EXAMPLES],
        "references_without_words": len(wordless),
        "wordless_reference_examples": wordless[:MAX_EXAMPLES],
    }


def split_stats(index: DatasetIndex, exists=os.path.isfile) -> dict:
    """Counts of one split: pairs, references (over-long, without words), missing image files, change types, skips."""
    known: dict[str, bool] = {}

    def present(path) -> bool:
        # CLEVR-Change's before image is shared by its two pairs: stat each file once.
        key = str(path)
        if key not in known:
            known[key] = exists(key)
        return known[key]

    missing_pairs, missing_examples = 0, []
    for pair in index.pairs:
        absent = [
            str(path) for path in (pair.before, pair.after, pair.distractor) if path is not None and not present(path)
        ]
        if absent:
            missing_pairs += 1
            if len(missing_examples) < MAX_EXAMPLES:
                missing_examples.append(f"{pair.pair_id}: {absent[0]}")
    types = Counter(pair.change_type for pair in index.pairs if pair.change_type is not None)
    result = {
        "pairs": len(index.pairs),
        "reference_sentences": sum(len(pair.captions) for pair in index.pairs),
        "pairs_without_captions": sum(1 for pair in index.pairs if not pair.captions),
        **reference_counts(index),
        "pairs_with_missing_images": missing_pairs,
        "image_files_checked": len(known),
        "image_files_missing": sum(1 for ok in known.values() if not ok),
        "missing_image_examples": missing_examples,
        "pairs_with_gt_mask": sum(1 for pair in index.pairs if pair.has_gt_mask),
        "skipped": len(index.skipped),
        "skipped_examples": [f"{skip.source}: {skip.record}: {skip.reason}" for skip in index.skipped[:MAX_EXAMPLES]],
    }
    reasons = Counter(skip.reason for skip in index.skipped)
    if reasons:
        result["skipped_by_reason"] = dict(reasons.most_common())
    if types:
        result["change_types"] = dict(sorted(types.items()))
    if index.notes:
        result["notes"] = list(index.notes)
    return result


def unreadable_splits(stats: dict) -> dict[str, str]:
    """split -> error message, for the splits of a `dataset_stats` result that could not be read."""
    return {split: counts["error"] for split, counts in stats["splits"].items() if "error" in counts}


def dataset_stats(format: str, root: str | Path, splits: Iterable[str] | None = None) -> dict:
    """{"format", "root", "splits": {split: counts or {"error": message}}} for the named splits (default: all)."""
    FORMATS.check(format, key="--format")
    root = Path(root)
    if not root.exists():
        raise DataError(f"dataset root {root} does not exist")
    if splits is None:
        splits = [name for name in FORMATS[format].splits if name not in SPLIT_ALIASES.get(format, set())]
    result: dict = {"format": format, "root": str(root), "splits": {}}
    for split in splits:
        try:
            index = read_dataset(format, root, split)
        except DataError as error:
            # One absent split (e.g. a held-out test.json) must not hide the others' counts.
            result["splits"][split] = {"error": str(error)}
            continue
        result["splits"][split] = split_stats(index)
    return result
