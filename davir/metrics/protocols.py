"""Which pairs and which reference sentences count when a benchmark is scored: the official protocols.

    references = references_for_evaluation(index)       # a split: its official file's rule where one is known
    references = load_reference_file("refs.json")       # a file: official ones recognised by fingerprint

The rules and why: docs/datasets.md, "Scoring"; docs/metrics.md, "Protocols"; measured in
docs/experiments/results.md, "Protocols".
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from davir.data.records import ChangePair, DatasetIndex
from davir.errors import DataError
from davir.metrics.io import MAX_EXAMPLES, canonical_id, groups_from_index, load_references, no_references

TOKENIZER = "Stanford PTBTokenizer -lowerCase, punctuation removed (pycocoevalcap 1.2, coco-caption)"
EMPTY_POLICIES = ("auto", "keep", "skip")


def lavis_pre_caption(caption: str, max_words: int = 50) -> str:
    """LAVIS' `BlipCaptionProcessor.pre_caption`: lower-case, drop . ! " ( ) * # : ; ~, squeeze blanks,
    keep the first `max_words` words. FINER-MLLM's val reference files went through it."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


def _source(pair: ChangePair) -> list[str]:
    if pair.source_captions is None:
        raise DataError(
            f"pair {pair.pair_id!r}: the reader kept no raw sentences, so the official references "
            "cannot be rebuilt (was the index read by davir.data.formats.read_dataset?)"
        )
    return list(pair.source_captions)


def verbatim(pair: ChangePair) -> list[str]:
    """Every sentence as the annotation file has it, empty ones included (CLIP4IDC `reformat_dataset.py`
    merges the records of an id; FINER `coco_gt_format_save` writes every sentence as an annotation)."""
    return _source(pair)


def finer_spot_val(pair: ChangePair) -> list[str]:
    """FINER-MLLM's "filtered" Spot-the-Diff val: empty and number-only sentences ("1", "2", ... that
    annotators used as list markers) dropped, the rest through `lavis_pre_caption(max_words=32)`; an id
    left without a sentence is not in the file. Inferred: it reproduces all 3,293 sentences of the file."""
    return [lavis_pre_caption(s, 32) for s in _source(pair) if s.strip() and not s.strip().isdigit()]


def finer_ier_val(pair: ChangePair) -> list[str]:
    """FINER-MLLM's IER val: every sentence through `lavis_pre_caption` (no sentence reaches 50 words).
    Inferred: it reproduces all 1,149 sentences of the file."""
    return [lavis_pre_caption(s) for s in _source(pair)]


@dataclass(frozen=True)
class Protocol:
    """How the official reference file of one benchmark split is made, and what it holds."""

    format: str
    split: str
    references: Callable[[ChangePair], list[str]]  # the pair's official sentences; [] = not in the file
    official_file: str  # the file(s) it reproduces, repository @ commit
    rule: str  # one line for people: which pairs, which sentences
    pairs: int  # pairs in the official file
    sentences: int  # reference sentences in the official file (empty ones included)
    empty_sentences: int  # of which empty
    fingerprint: str  # reference_fingerprint of the official file

    @property
    def name(self) -> str:
        return f"{self.format} {self.split}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "official_file": self.official_file,
            "rule": self.rule,
            "tokenizer": TOKENIZER,
            "pairs": self.pairs,
            "sentences": self.sentences,
            "empty_sentences": self.empty_sentences,
        }


PROTOCOLS: dict[tuple[str, str], Protocol] = {
    (p.format, p.split): p
    for p in (
        Protocol(
            "spot_the_diff",
            "test",
            verbatim,
            "FINER-MLLM@17178f3b eval_data/spot_test_change_captions_reformat.json = CLIP4IDC@ca494613 "
            "gt/spot_total_change_captions_reformat.json = harsh19/spot-the-diff@d26bdcd4 code/predictions/ddla_rerun_gtfile.json",
            "every pair; every raw sentence, the 7 empty ones included",
            1270,
            2107,
            7,
            "9f6e4bff2b7307c3bbeee43cf1d5cd785eab41246732bad34978728cc6539b66",
        ),
        Protocol(
            "spot_the_diff",
            "val",
            finer_spot_val,
            "FINER-MLLM@17178f3b eval_data/spot_val_change_captions_reformat.json",
            "pairs with a non-empty sentence (1,489 of 1,493); empty and number-only sentences dropped, "
            "LAVIS pre_caption with 32 words",
            1489,
            3293,
            0,
            "f335cf35acff2c9d100e7b67fc5d864de6496acc2517aaaee16326058f15c32b",
        ),
        Protocol(
            "ier",
            "val",
            finer_ier_val,
            "FINER-MLLM@17178f3b eval_data/IER_val_change_captions_reformat.json",
            'every pair; every sentence through LAVIS pre_caption (lower-case, . ! " ( ) * # : ; ~ removed)',
            383,
            1149,
            0,
            "9e576b427d6718b36ef148531e4cc4e8125b70d3c9ac1d7b4492eb8eafa99210",
        ),
        Protocol(
            "ier",
            "test",
            verbatim,
            "FINER-MLLM@17178f3b eval_data/IER_test_change_captions_reformat.json",
            "every pair; every raw sentence",
            495,
            1485,
            0,
            "2741db864cb082dfa855d2f7098d05599d5078778d562be4e94aa1bfcb3f475b",
        ),
    )
}


def reference_fingerprint(references: Mapping[str, list[str]]) -> str:
    """SHA-256 of the references' content: ids compared as `canonical_id`, sentence order ignored,
    so FINER's and CLIP4IDC's serialisations of one file (and "256" vs "256.png") give one value."""
    items = sorted((canonical_id(pair_id), sorted(captions)) for pair_id, captions in references.items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def official_protocol_of(references: Mapping[str, list[str]]) -> Protocol | None:
    """The protocol whose official file holds exactly these references, if any."""
    fingerprint = reference_fingerprint(references)
    return next((p for p in PROTOCOLS.values() if p.fingerprint == fingerprint), None)


@dataclass
class ReferenceSet:
    """References ready for scoring, with what was done to them: `source` goes into metrics.json and
    `notes` are printed (one line each)."""

    references: dict[str, list[str]]
    groups: dict[str, str] = field(default_factory=dict)
    without: list[str] = field(default_factory=list)  # pair ids left out (no reference under the rule applied)
    source: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _examples(ids: list[str]) -> dict:
    return {"count": len(ids), "examples": ids[:MAX_EXAMPLES]}


def _listed(ids: list[str]) -> str:
    more = ", ..." if len(ids) > MAX_EXAMPLES else ""
    return ", ".join(map(repr, ids[:MAX_EXAMPLES])) + more


def _is_empty(sentence: str) -> bool:
    return not sentence.strip()


def references_for_evaluation(index: DatasetIndex) -> ReferenceSet:
    """The references a split is scored against: its official protocol's where PROTOCOLS has one,
    else the reader's cleaned captions (pairs without any are listed, not scored)."""
    protocol = PROTOCOLS.get((index.format, index.split))
    references: dict[str, list[str]] = {}
    without: list[str] = []
    for pair in index:
        if pair.pair_id in references or pair.pair_id in without:
            raise DataError(f"{index.format} {index.split} at {index.root}: pair id {pair.pair_id!r} appears twice")
        captions = protocol.references(pair) if protocol else list(pair.captions)
        if captions:
            references[pair.pair_id] = captions
        else:
            without.append(pair.pair_id)
    if not references:
        raise no_references(index, without)
    where = f"{index.format} {index.split}"
    source = {
        "format": index.format,
        "root": str(index.root),
        "split": index.split,
        "pairs_without_references": _examples(without),
    }
    notes = []
    empty = [pair_id for pair_id, captions in references.items() if any(map(_is_empty, captions))]
    if protocol is not None:
        source["protocol"] = protocol.to_dict()
        source["empty_references"] = {
            "policy": "kept (official protocol)",
            "sentences": sum(map(_is_empty, (c for v in references.values() for c in v))),
            "pairs_with_only_empty": _examples([k for k in empty if not any(map(str.strip, references[k]))]),
        }
        notes.append(
            f"{where}: official protocol, {len(references)} pairs and {sum(map(len, references.values()))} "
            f"reference sentences as in {protocol.official_file.split(' = ')[0]}"
        )
        if empty:
            notes.append(
                f"{where}: {source['empty_references']['sentences']} empty reference sentence(s) kept, as the "
                f"official file has them (pairs {_listed(empty)}; a pair whose only reference is empty scores 0)"
            )
    else:
        skipped = [s for s in index.skipped if "empty" in s.reason]
        source["protocol"] = {
            "name": None,
            "rule": "the reader's captions: empty sentences skipped and counted",
            "tokenizer": TOKENIZER,
        }
        source["empty_references"] = {"policy": "skipped", "sentences": len(skipped)}
        if skipped:
            notes.append(
                f"{where}: {len(skipped)} empty reference sentence(s) skipped (no official protocol for this split)"
            )
    if without:
        why = "are not in the official references" if protocol else "have no reference caption"
        notes.append(f"{len(without)} pair(s) of {where} {why} and are not scored (e.g. {_listed(without)})")
    return ReferenceSet(references, groups_from_index(index), without, source, notes)


def load_reference_file(path: str | Path, *, empty: str = "auto") -> ReferenceSet:
    """References from a file (`load_references`) with the empty-sentence rule applied and reported.

    empty: "auto" = keep empty sentences when the file is an official reference file (PROTOCOLS),
    skip them otherwise; "keep" / "skip" force it. Skipping drops the empty sentences and the pairs
    left without any (listed, not scored), as the data layer does.
    """
    if empty not in EMPTY_POLICIES:
        raise ValueError(f"empty references policy must be one of {', '.join(EMPTY_POLICIES)}, got {empty!r}")
    references = load_references(path)
    protocol = official_protocol_of(references)
    keep = empty == "keep" or (empty == "auto" and protocol is not None)
    empty_ids = [pair_id for pair_id, captions in references.items() if any(map(_is_empty, captions))]
    count = sum(map(_is_empty, (c for v in references.values() for c in v)))
    only_empty = [pair_id for pair_id in empty_ids if not any(map(str.strip, references[pair_id]))]
    why = (
        "official reference file"
        if protocol is not None and empty == "auto"
        else f"--empty-references {empty}"
        if empty != "auto"
        else "not an official reference file"
    )
    source: dict = {
        "file": str(path),
        "official_protocol": protocol.to_dict() if protocol else None,
        "empty_references": {
            "policy": f"{'kept' if keep else 'skipped'} ({why})",
            "sentences": count,
            "pairs_with_only_empty": _examples(only_empty),
        },
    }
    notes = []
    if protocol is not None:
        notes.append(f"{path}: the official references of {protocol.name} ({protocol.rule})")
    if count:
        if keep:
            notes.append(
                f"{path}: {count} empty reference sentence(s) kept ({why}); {len(only_empty)} pair(s) have only "
                f"empty references and score 0 whatever the prediction"
                + (f" ({_listed(only_empty)})" if only_empty else "")
            )
        else:
            notes.append(
                f"{path}: {count} empty reference sentence(s) skipped ({why}); {len(only_empty)} pair(s) left "
                "without references are not scored" + (f" ({_listed(only_empty)})" if only_empty else "")
            )
            references = {k: [c for c in v if not _is_empty(c)] for k, v in references.items() if k not in only_empty}
            if not references:
                raise DataError(f"{path}: every reference sentence is empty, nothing to score")
    return ReferenceSet(references, {}, only_empty if not keep else [], source, notes)


def load_references_from_dataset(
    format: str, root: str | Path, split: str
) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """(references, groups, ids not scored) of one split through the data layer's reader, under the
    split's official protocol where it has one (`references_for_evaluation`)."""
    from davir.data.formats import read_dataset  # the readers import a lot; only load them when asked

    chosen = references_for_evaluation(read_dataset(format, root, split))
    return chosen.references, chosen.groups, chosen.without
