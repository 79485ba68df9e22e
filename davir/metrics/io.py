"""Loading predictions and references for scoring, and matching their ids.

    predictions = load_predictions("predictions.json")   # COCO results list, {id: caption} or JSONL
    references = load_references("refs.json")            # COCO captions file or {id: [captions]}
    aligned = align_ids(predictions, references)         # 256, "256", "256.png", "000256.png": one pair

The accepted forms and the id rule: docs/metrics.md, "Prediction and reference files".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from davir.data.records import DatasetIndex
from davir.errors import DataError
from davir.io import read_json, read_jsonl, write_json_atomic, write_text_atomic

# Keys a prediction row may use for its id, most specific first: a row with both "image_id" and "id"
# is a COCO annotation-style row whose "id" numbers the sentence, not the image.
PREDICTION_ID_KEYS = ("pair_id", "image_id", "id")
# Image extensions an id may carry ("256.png" is pair "256").
_ID_PATTERN = re.compile(r"^(?P<stem>.*?)(?:\.(?:png|jpe?g|bmp|gif|tiff?|webp))?(?P<suffix>_n)?$", re.IGNORECASE)
# How many example ids a mismatch report shows.
MAX_EXAMPLES = 5


def canonical_id(value: Any) -> str:
    """The key two spellings of one pair share: extension dropped, leading zeros of a numeric stem dropped.

    256, "256", "256.png" and "000256.png" give "256"; "000256.png_n" (a CLEVR-Change distractor
    pair) gives "256_n", so it never matches the semantic pair. Other ids ("Reddit_1052",
    "train_000016") are only stripped of surrounding blanks and an image extension.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"an id must be a string or an integer, got {type(value).__name__} {value!r}")
    text = str(value).strip()
    match = _ID_PATTERN.match(text)
    stem, suffix = match.group("stem"), match.group("suffix") or ""
    if not stem:  # ".png" alone is an id, not an extension
        return text
    if stem.isascii() and stem.isdigit():
        stem = str(int(stem))
    return stem + suffix


def _check_id(value: Any, *, source: str, record: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{source}: {record}: the id must be a non-empty string or an integer, got {value!r}")
    return str(value)


def _check_caption(value: Any, *, source: str, record: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{source}: {record}: the caption must be a string, got {type(value).__name__} {value!r}")
    return value


def _prediction_row(row: Any, *, source: str, record: str) -> tuple[str, str]:
    """(id, caption) of one `{"image_id"|"pair_id"|"id": ..., "caption": ...}` row."""
    if not isinstance(row, dict):
        raise DataError(f'{source}: {record}: expected an object with an id and a "caption", got {type(row).__name__}')
    id_key = next((key for key in PREDICTION_ID_KEYS if key in row), None)
    if id_key is None:
        raise DataError(
            f"{source}: {record}: has no id (expected one of {', '.join(PREDICTION_ID_KEYS)}); keys: {sorted(row)}"
        )
    pair_id = _check_id(row[id_key], source=source, record=record)
    if "caption" not in row:
        raise DataError(f'{source}: {record} (id {pair_id!r}): has no "caption"')
    return pair_id, _check_caption(row["caption"], source=source, record=f"{record} (id {pair_id!r})")


def _add_prediction(predictions: dict[str, str], pair_id: str, caption: str, *, source: str, record: str) -> None:
    if pair_id in predictions:
        raise DataError(
            f"{source}: {record}: id {pair_id!r} has more than one prediction (one caption per pair is scored)"
        )
    predictions[pair_id] = caption


def _require_file(path: Path, what: str) -> None:
    """A missing file or a folder named as the file of `what`; read_json would call it an "annotation file"."""
    if path.is_dir():
        raise DataError(f"{what} file {path} is a folder; give the file itself")
    if not path.is_file():
        raise DataError(f"{what} file is missing: {path}")


def load_predictions(path: str | Path) -> dict[str, str]:
    """{id: caption} from a COCO results list, an {id: caption} JSON object, or a JSONL file.

    A `.jsonl` file is always read line by line; any other file is read as one JSON document.
    Empty captions are kept (they score as empty sentences); a repeated id is an error.
    """
    path = Path(path)
    _require_file(path, "predictions")
    source = str(path)
    predictions: dict[str, str] = {}
    if path.suffix.lower() == ".jsonl":
        for number, row in enumerate(read_jsonl(path), start=1):
            pair_id, caption = _prediction_row(row, source=source, record=f"line {number}")
            _add_prediction(predictions, pair_id, caption, source=source, record=f"line {number}")
    else:
        data = read_json(path)
        if isinstance(data, list):
            for number, row in enumerate(data):
                pair_id, caption = _prediction_row(row, source=source, record=f"entry {number}")
                _add_prediction(predictions, pair_id, caption, source=source, record=f"entry {number}")
        elif isinstance(data, dict):
            if "annotations" in data:
                raise DataError(f"{source}: this is a COCO captions (reference) file, not predictions")
            for pair_id, caption in data.items():
                record = f"id {pair_id!r}"
                # {id: ["caption"]} is how some repositories store the "res" side.
                if isinstance(caption, list) and len(caption) == 1:
                    caption = caption[0]
                predictions[_check_id(pair_id, source=source, record=record)] = _check_caption(
                    caption, source=source, record=record
                )
        else:
            raise DataError(
                f'{source}: expected a list of {{"image_id", "caption"}} objects or an {{id: caption}} object, '
                f"got {type(data).__name__}"
            )
    if not predictions:
        raise DataError(f"{source}: holds no predictions")
    return predictions


def _add_reference(references: dict[str, list[str]], pair_id: str, caption: str) -> None:
    references.setdefault(pair_id, []).append(caption)


def load_references(path: str | Path) -> dict[str, list[str]]:
    """{id: [captions]} from a COCO captions file or an {id: [captions]} JSON object.

    COCO annotations are grouped per `image_id` as pycocotools' `imgToAnns` does (so Spot-the-Diff's
    repeated records merge). An id with no caption is an error naming the id: it cannot be scored.
    """
    path = Path(path)
    _require_file(path, "references")
    source = str(path)
    data = read_json(path)
    references: dict[str, list[str]] = {}
    if isinstance(data, dict) and "annotations" in data:
        annotations = data["annotations"]
        if not isinstance(annotations, list):
            raise DataError(f'{source}: "annotations" must be a list, got {type(annotations).__name__}')
        for number, annotation in enumerate(annotations):
            record = f"annotation {number}"
            if not isinstance(annotation, dict) or "image_id" not in annotation or "caption" not in annotation:
                raise DataError(
                    f'{source}: {record}: expected an object with "image_id" and "caption", got {annotation!r:.200}'
                )
            pair_id = _check_id(annotation["image_id"], source=source, record=record)
            _add_reference(
                references,
                pair_id,
                _check_caption(annotation["caption"], source=source, record=f"{record} (image_id {pair_id!r})"),
            )
        images = data.get("images", [])
        if not isinstance(images, list):
            raise DataError(f'{source}: "images" must be a list, got {type(images).__name__}')
        for number, image in enumerate(images):
            if not isinstance(image, dict) or "id" not in image:
                raise DataError(f'{source}: images entry {number}: expected an object with an "id", got {image!r:.200}')
            image_id = _check_id(image["id"], source=source, record=f"images entry {number}")
            if image_id not in references:
                raise DataError(
                    f"{source}: image id {image_id!r} has no annotation (an empty reference list cannot be scored)"
                )
    elif isinstance(data, dict):
        for pair_id, captions in data.items():
            record = f"id {pair_id!r}"
            if not isinstance(captions, list):
                raise DataError(
                    f"{source}: {record}: expected a list of reference captions, got {type(captions).__name__} "
                    "(an {id: caption} object is a predictions file)"
                )
            if not captions:
                raise DataError(f"{source}: {record}: has an empty reference list (it cannot be scored)")
            references[_check_id(pair_id, source=source, record=record)] = [
                _check_caption(caption, source=source, record=f"{record} reference {k}")
                for k, caption in enumerate(captions)
            ]
    else:
        raise DataError(
            f'{source}: expected a COCO captions file (with "annotations") or an {{id: [captions]}} object, '
            f"got {type(data).__name__}"
        )
    if not references:
        raise DataError(f"{source}: holds no references")
    return references


def references_from_index(index: DatasetIndex) -> tuple[dict[str, list[str]], list[str]]:
    """({pair_id: [captions]}, ids of pairs without captions) of a reader's `DatasetIndex`.

    A pair without captions cannot be scored and is left out, but returned so the caller reports it
    (e.g. the 4 Spot-the-Diff val pairs whose every raw sentence is empty, the ones FINER-MLLM's
    "filtered" val references drop).
    """
    references: dict[str, list[str]] = {}
    without: list[str] = []
    for pair in index:
        if pair.pair_id in references:
            raise DataError(f"{index.format} {index.split} at {index.root}: pair id {pair.pair_id!r} appears twice")
        if pair.captions:
            references[pair.pair_id] = list(pair.captions)
        else:
            without.append(pair.pair_id)
    if not references:
        raise no_references(index, without)
    return references, without


def no_references(index: DatasetIndex, without: list[str]) -> DataError:
    """Nothing to score: a split with no pair at all (a small folder's seeded split can be empty) is named as such,
    not sent looking for caption files."""
    where = f"{index.format} {index.split} at {index.root}"
    if not without:
        return DataError(f"{where}: the split holds no pairs, nothing to score (score another --split)")
    return DataError(f"{where}: no pair has reference captions, nothing to score (are the caption files in place?)")


def groups_from_index(index: DatasetIndex) -> dict[str, str]:
    """{pair_id: change_type} for the pairs that have one (CLEVR-style data); empty otherwise."""
    return {pair.pair_id: pair.change_type for pair in index if pair.change_type is not None}


@dataclass
class IdMismatch:
    """Ids on one side only: they are not scored, and are reported with a count and examples."""

    predictions_without_reference: list[str] = field(default_factory=list)
    references_without_prediction: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.predictions_without_reference and not self.references_without_prediction

    def lines(self) -> list[str]:
        """One line per non-empty side: count and up to MAX_EXAMPLES example ids."""
        out = []
        for ids, what in (
            (self.predictions_without_reference, "prediction id(s) have no reference and are not scored"),
            (self.references_without_prediction, "reference id(s) have no prediction and are not scored"),
        ):
            if ids:
                examples = ", ".join(repr(i) for i in ids[:MAX_EXAMPLES])
                more = ", ..." if len(ids) > MAX_EXAMPLES else ""
                out.append(f"{len(ids)} {what} (e.g. {examples}{more})")
        return out

    def to_dict(self) -> dict:
        return {
            "predictions_without_reference": {
                "count": len(self.predictions_without_reference),
                "examples": self.predictions_without_reference[:MAX_EXAMPLES],
            },
            "references_without_prediction": {
                "count": len(self.references_without_prediction),
                "examples": self.references_without_prediction[:MAX_EXAMPLES],
            },
        }


@dataclass
class AlignedCaptions:
    """Predictions and references on the ids both have, keyed by the predictions' spelling of the id."""

    predictions: dict[str, str]
    references: dict[str, list[str]]
    mismatch: IdMismatch


def _canonical_map(ids, *, what: str) -> dict[str, list[str]]:
    """canonical id -> the spellings of it, in input order."""
    spellings: dict[str, list[str]] = {}
    for pair_id in ids:
        try:
            key = canonical_id(pair_id)
        except TypeError as error:
            raise DataError(f"{what}: {error}") from error
        spellings.setdefault(key, []).append(pair_id)
    return spellings


def align_ids(
    predictions: Mapping[Any, str], references: Mapping[Any, list[str]], *, strict: bool = False
) -> AlignedCaptions:
    """Match prediction ids to reference ids through `canonical_id`.

    Only ids on both sides are kept (the official flow scores the predicted ids only). Ids on one
    side only are listed in the returned `IdMismatch`; with `strict=True` they raise a DataError.
    Two prediction ids that are one pair ("256" and "256.png") are an error; two such reference ids
    have their captions merged, as COCO merges annotations of one image.
    """
    prediction_spellings = _canonical_map(predictions, what="predictions")
    for spellings in prediction_spellings.values():
        if len(spellings) > 1:
            raise DataError(
                f"predictions: ids {', '.join(map(repr, spellings))} name the same pair; keep one prediction per pair"
            )
    reference_spellings = _canonical_map(references, what="references")

    aligned_predictions: dict[str, str] = {}
    aligned_references: dict[str, list[str]] = {}
    mismatch = IdMismatch()
    for key, (pair_id,) in prediction_spellings.items():
        caption = predictions[pair_id]
        if not isinstance(caption, str):
            raise DataError(f"predictions: id {pair_id!r}: the caption must be a string, got {type(caption).__name__}")
        if key not in reference_spellings:
            mismatch.predictions_without_reference.append(str(pair_id))
            continue
        captions: list[str] = []
        for spelling in reference_spellings[key]:
            captions.extend(references[spelling])
        if not captions:
            raise DataError(
                f"references: id {reference_spellings[key][0]!r} has an empty reference list (it cannot be scored)"
            )
        if not all(isinstance(c, str) for c in captions):
            raise DataError(f"references: id {reference_spellings[key][0]!r}: every reference must be a string")
        aligned_predictions[str(pair_id)] = caption
        aligned_references[str(pair_id)] = captions
    for key, spellings in reference_spellings.items():
        if key not in prediction_spellings:
            mismatch.references_without_prediction.append(str(spellings[0]))

    if strict and not mismatch.ok:
        raise DataError(
            "predictions and references do not cover the same pairs (strict mode): " + "; ".join(mismatch.lines())
        )
    if not aligned_predictions:
        raise DataError("no prediction id matches a reference id; " + "; ".join(mismatch.lines()))
    return AlignedCaptions(aligned_predictions, aligned_references, mismatch)


def canonical_groups(groups: Mapping[Any, str]) -> dict[str, str]:
    """{canonical id: group}; one pair listed under two groups is an error."""
    out: dict[str, str] = {}
    for pair_id, group in groups.items():
        key = canonical_id(pair_id)
        if key in out and out[key] != group:
            raise DataError(f"groups: pair {pair_id!r} is listed under both {out[key]!r} and {group!r}")
        out[key] = group
    return out


def write_predictions(path: str | Path, predictions: Mapping[str, str]) -> None:
    """Write predictions atomically in a form `load_predictions` reads back.

    `.jsonl`: one {"pair_id", "caption"} per line; anything else: the COCO results list
    [{"image_id", "caption"}] every repository's evaluation reads.
    """
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        write_text_atomic(
            path,
            "".join(
                json.dumps({"pair_id": k, "caption": v}, ensure_ascii=False) + "\n" for k, v in predictions.items()
            ),
        )
    else:
        write_json_atomic(path, [{"image_id": k, "caption": v} for k, v in predictions.items()])
