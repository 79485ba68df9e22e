"""`python -m preprocess entity-eval` — accuracy of retrieved entities against the reference captions.

    python -m preprocess entity-eval --format clevr_change --root DATA --split test --entities CACHE [--k 5]

For each pair, the reference entities are the noun phrases extracted (with the extractor recorded in
CACHE/vocab.json) from all its reference captions. A retrieved phrase is a hit when it *equals* one
of them; the "contained" variant also counts a retrieved phrase that occurs, as whole words, inside a
reference phrase ("car" inside "white car"). top-1 looks at the best retrieved phrase, top-k at the
first k; an evaluated pair left without entities (the entity gate withheld them) is a miss, and
counted. Distractor / no-change pairs and pairs whose references name no entity are skipped and
counted, with the distractors that were given an entity (which the gate should prevent). Writes JSON
(default CACHE/entity_eval_<split>.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from davir.data import read_dataset
from davir.data.caches import EntityCache
from davir.data.records import DISTRACTOR, ChangePair
from davir.errors import DataError, check_output_file
from davir.io import write_json_atomic
from davir.runtime.signals import START_AGAIN, stop_on_signals
from davir.text.entity_vocabulary import EntityVocabulary, lexicon_mismatch
from davir.text.extractors import PhraseExtractor, get_extractor


def contained(phrase: str, reference: str) -> bool:
    """`phrase` occurs in `reference` as a run of whole words."""
    return f" {phrase} " in f" {reference} "


def pair_hits(retrieved: Sequence[str], references: set[str], k: int) -> dict[str, bool]:
    """Exact and contained hits of the top-1 and top-k retrieved phrases."""

    def any_hit(candidates: Iterable[str], exact: bool) -> bool:
        return any(c in references if exact else any(contained(c, r) for r in references) for c in candidates)

    return {
        "top1": any_hit(retrieved[:1], True),
        "topk": any_hit(retrieved[:k], True),
        "top1_contained": any_hit(retrieved[:1], False),
        "topk_contained": any_hit(retrieved[:k], False),
    }


def evaluate_entities(
    pairs: Sequence[ChangePair], table: dict[str, list[tuple[str, float]]], extractor: PhraseExtractor, k: int = 5
) -> dict:
    """Top-1/top-k accuracy (exact and contained) over the pairs whose references name an entity."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    missing = [pair.pair_id for pair in pairs if pair.pair_id not in table]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(pairs)} pairs have no retrieved entities (first: {missing[0]!r}); "
            "run `python -m preprocess entities` on this split first"
        )
    totals: dict[str, int] = defaultdict(int)
    by_type: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    skipped = {"distractor": 0, "no_reference_entity": 0}
    distractors_with_entity = 0  # what the entity gate should keep at zero
    for pair in pairs:
        if pair.change_type == DISTRACTOR:
            skipped["distractor"] += 1
            distractors_with_entity += bool(table[pair.pair_id])
            continue
        references = {phrase for caption in pair.captions for phrase in extractor.phrases(caption)}
        if not references:
            skipped["no_reference_entity"] += 1
            continue
        hits = pair_hits([phrase for phrase, _ in table[pair.pair_id]], references, k)
        for group in (totals, by_type[pair.change_type or "all"]):
            group["pairs"] += 1
            group["without_entity"] += int(not table[pair.pair_id])
            for name, hit in hits.items():
                group[name] += int(hit)

    def rates(counts: dict[str, int]) -> dict:
        n = counts.get("pairs", 0)
        hit_rates = {
            name: (counts.get(name, 0) / n if n else None)
            for name in ("top1", "topk", "top1_contained", "topk_contained")
        }
        return {"pairs": n, "without_entity": counts.get("without_entity", 0), **hit_rates}

    return {
        "k": k,
        "total_pairs": len(pairs),
        "evaluated": totals.get("pairs", 0),
        "skipped": skipped,
        "distractors_with_entity": distractors_with_entity,
        **rates(totals),
        "by_change_type": {name: rates(c) for name, c in sorted(by_type.items())},
    }


def format_table(result: dict) -> str:
    k = result["k"]
    header = f"{'group':<12}{'pairs':>7}{'top-1':>8}{f'top-{k}':>8}{'top-1 ⊂':>9}{f'top-{k} ⊂':>9}"
    rows = [header, "-" * len(header)]

    def line(name: str, values: dict) -> str:
        cells = [
            f"{values[m]:>8.3f}" if values[m] is not None else f"{'-':>8}"
            for m in ("top1", "topk", "top1_contained", "topk_contained")
        ]
        return f"{name:<12}{values['pairs']:>7}" + cells[0] + cells[1] + " " + cells[2] + " " + cells[3]

    rows.append(line("all", result))
    if len(result["by_change_type"]) > 1:
        rows += [line(name, values) for name, values in result["by_change_type"].items()]
    rows.append(f"pairs evaluated without any entity (counted as misses): {result['without_entity']}")
    rows.append(
        f"skipped: {result['skipped']['distractor']} distractor/no-change pairs "
        f"({result['distractors_with_entity']} of them given an entity), "
        f"{result['skipped']['no_reference_entity']} pairs whose references name no entity"
    )
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m preprocess entity-eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--format", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--entities", required=True, help="entity cache folder written by `preprocess entities`")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON result file (default ENTITIES/entity_eval_<split>.json)")
    return parser


def run(args: argparse.Namespace) -> dict:
    root = Path(args.entities)
    check_output_file(Path(args.out) if args.out else root / f"entity_eval_{args.split}.json", what="--out")
    vocabulary = EntityVocabulary.load(root / "vocab.json")
    index = read_dataset(args.format, args.root, args.split)
    corpus = None
    if vocabulary.extractor.get("backend") == "rules":  # the rule lexicon is fitted on the vocabulary's captions
        source = vocabulary.source
        fit = read_dataset(source.get("format", args.format), source.get("root", args.root), source["split"])
        corpus = [caption for pair in fit for caption in pair.captions]
    extractor = get_extractor(vocabulary.extractor.get("backend", "auto"), corpus=corpus)
    result = evaluate_entities(index.pairs, EntityCache(root).table(), extractor, args.k)
    result.update(
        {"format": args.format, "split": args.split, "entities": str(root), "extractor": extractor.describe()}
    )
    # references read with other word lists than the cache's phrases: the numbers are marked, not comparable
    result["lexicon_mismatch"] = lexicon_mismatch(vocabulary.extractor, extractor.describe())
    if result["lexicon_mismatch"]:
        print(f"note: {root}'s phrases were read with {result['lexicon_mismatch']}", file=sys.stderr)
    out = Path(args.out) if args.out else root / f"entity_eval_{args.split}.json"
    write_json_atomic(out, result)
    result["out"] = str(out)
    return result


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(result))
    print(json.dumps({key: result[key] for key in ("evaluated", "top1", "topk", "out")}))
    return 0
