"""LEVIR-CC (Liu et al., TGRS'22) and its LEVIR-MCI extension, in the Karpathy or the LEVIR-MCI layout.

    index = read_levir_cc(Path("data/LEVIR_CC"), "test")    # pair ids "test_000016"; MCI labels as masks

The layouts: docs/datasets.md, "LEVIR-CC and LEVIR-MCI".
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from davir.data.formats._common import PairMerger, clean_captions, plain_file_name, require_id, require_keys
from davir.data.formats.registry import register_format
from davir.data.records import ChangePair, DatasetIndex, SkippedRecord
from davir.errors import DataError
from davir.io import read_json

SPLITS = ("train", "val", "test")
KARPATHY_FILES = ("LevirCCcaptions.json", "LevirCCcaptions_v1.json")
SPECIAL_TOKENS = frozenset({"<START>", "<END>", "<NULL>", "<PAD>"})


def detect_layout(root: Path) -> tuple[str, Path | None]:
    """("karpathy", the captions json) or ("mci", None)."""
    for name in KARPATHY_FILES:
        if (root / name).is_file():
            return "karpathy", root / name
    if (root / "tokens").is_dir() or any((root / f"{split}.txt").is_file() for split in SPLITS):
        return "mci", None
    raise DataError(
        f"{root}: not a LEVIR-CC folder: expected LevirCCcaptions.json (+ images/) "
        "or the LEVIR-MCI {train,val,test}.txt + tokens/ layout"
    )


def _pair(
    root: Path,
    split_folder: str,
    filename: str,
    captions: tuple[str, ...],
    split: str,
    *,
    source: str,
    record: str,
    meta: dict,
    label_dirs: dict[Path, bool],
) -> ChangePair:
    folder = root / "images" / plain_file_name(split_folder, source=source, record=record)
    filename = plain_file_name(filename, source=source, record=record)
    # LEVIR-MCI's change masks; the pair is co-registered, so one mask serves both frames.
    labels = folder / "label"
    if labels not in label_dirs:  # one stat per split folder, not per pair
        label_dirs[labels] = labels.is_dir()
    mask = labels / filename if label_dirs[labels] else None
    return ChangePair(
        pair_id=PurePosixPath(filename).stem,
        before=folder / "A" / filename,
        after=folder / "B" / filename,
        captions=captions,
        split=split,
        gt_mask_before=mask,
        gt_mask_after=mask,
        meta=meta,
    )


def _read_karpathy(root: Path, path: Path, split: str) -> DatasetIndex:
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f'{path}: expected an object with an "images" list')
    merger = PairMerger(str(path))
    skipped: list[SkippedRecord] = []
    label_dirs: dict[Path, bool] = {}
    for number, entry in enumerate(data["images"]):
        record = f"images[{number}]"
        require_keys(entry, ("filename", "split", "sentences"), source=str(path), record=record)
        if entry["split"] != split:
            continue
        filename = require_id(entry["filename"], source=str(path), record=record, field="filename")
        record = f"images[{number}] ({filename!r})"
        sentences = entry["sentences"]
        if not isinstance(sentences, list):
            raise DataError(f"{path}: {record}: 'sentences' must be a list, got {type(sentences).__name__}")
        raw = []
        for position, sentence in enumerate(sentences):
            # Each sentence is {"raw": str, "tokens": [...]}; fall back to the tokens when raw is absent.
            if isinstance(sentence, dict) and "raw" in sentence:
                raw.append(sentence["raw"])
            elif isinstance(sentence, dict) and isinstance(sentence.get("tokens"), list):
                raw.append(" ".join(str(token) for token in sentence["tokens"]))
            else:
                raise DataError(f'{path}: {record}: sentences[{position}] must be an object with "raw" or "tokens"')
        captions, empty = clean_captions(raw, source=str(path), record=record, field="sentences.raw")
        skipped.extend(empty)
        folder = entry.get("filepath") if isinstance(entry.get("filepath"), str) else split
        meta = {"changeflag": entry["changeflag"]} if "changeflag" in entry else {}
        merger.add(
            _pair(
                root,
                folder,
                filename,
                captions,
                split,
                source=str(path),
                record=record,
                meta=meta,
                label_dirs=label_dirs,
            ),
            record,
        )
    return DatasetIndex("levir_cc", root, split, merger.pairs(), skipped)


def tokens_to_sentence(tokens: list, *, source: str, record: str) -> str:
    """One Change-Agent token list -> the sentence, without <START>/<END>."""
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise DataError(f"{source}: {record}: expected a list of token strings, got {tokens!r:.80}")
    return " ".join(token for token in tokens if token not in SPECIAL_TOKENS)


def _read_mci(root: Path, split: str) -> DatasetIndex:
    list_path = root / f"{split}.txt"
    if not list_path.is_file():
        raise DataError(f"file list is missing: {list_path}")
    names = [line.strip() for line in list_path.read_text(encoding="utf-8").splitlines()]
    merger = PairMerger(str(list_path))
    skipped: list[SkippedRecord] = []
    label_dirs: dict[Path, bool] = {}
    for number, filename in enumerate(names, start=1):
        if not filename:
            continue
        record = f"line {number} ({filename!r})"
        filename = plain_file_name(filename, source=str(list_path), record=record)
        token_path = root / "tokens" / f"{PurePosixPath(filename).stem}.txt"
        captions: tuple[str, ...] = ()
        if not token_path.is_file():
            skipped.append(SkippedRecord(str(token_path), filename, "token file missing; pair kept without references"))
        else:
            token_lists = read_json(token_path)
            if not isinstance(token_lists, list):
                raise DataError(f"{token_path}: expected a JSON list of token lists, got {type(token_lists).__name__}")
            sentences = [
                tokens_to_sentence(tokens, source=str(token_path), record=f"sentence {position}")
                for position, tokens in enumerate(token_lists)
            ]
            captions, empty = clean_captions(sentences, source=str(token_path), record=filename)
            skipped.extend(empty)
        merger.add(
            _pair(
                root,
                split,
                filename,
                captions,
                split,
                source=str(list_path),
                record=record,
                meta={},
                label_dirs=label_dirs,
            ),
            record,
        )
    return DatasetIndex("levir_cc", root, split, merger.pairs(), skipped)


@register_format("levir_cc", splits=SPLITS)
def read_levir_cc(root: Path, split: str) -> DatasetIndex:
    """One LEVIR-CC split from either layout (the Karpathy json wins when both are present)."""
    root = Path(root)
    layout, captions_path = detect_layout(root)
    if layout == "karpathy":
        return _read_karpathy(root, captions_path, split)
    return _read_mci(root, split)
