"""Caption your own folder of image pairs with a trained checkpoint; JSONL out, and an HTML report to look at.

    python caption.py --checkpoint runs/demo --pairs my_pairs/ --out captions.jsonl --html report.html

`--pairs` is a folder with `before/` + `after/` (matching names), or `NAME_before.EXT`/`NAME_after.EXT`
side by side, or a `pairs.csv`/`pairs.jsonl` manifest (`before,after[,id]`), or such a manifest file.
Change masks and entities are computed on the fly with the same preprocessing (and settings) the model was
trained with. A pair that cannot be read (missing or corrupt image, before/after of different sizes unless
`--resize-mismatched`) is listed with the reason in the JSONL and the report; the others still get captions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml
from tqdm.auto import tqdm

from davir.data.caches import PairMasks
from davir.data.formats.folder import read_folder
from davir.data.images import load_pair
from davir.data.records import DataError
from davir.inference import Prediction, caption_pairs, load_davir, resolve_model_dir, run_dir_of
from davir.io import write_text_atomic
from davir.viz.report import ReportRow, write_report

ENTITIES_KEPT = 5  # entities written per pair (the prompt uses the model's top-k of them)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python caption.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="run folder (best/, else last/) or saved model")
    parser.add_argument("--pairs", required=True, type=Path, help="folder of pairs or a pairs.csv/.jsonl manifest")
    parser.add_argument("--out", type=Path, help="JSONL output (default: PAIRS/captions.jsonl)")
    parser.add_argument("--html", type=Path, help="HTML report (default: next to --out, report.html)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=30)
    parser.add_argument("--resize-mismatched", action="store_true",
                        help="resize the before image to the after image's size instead of reporting the pair")
    parser.add_argument("--masks-from", type=Path, help="mask cache whose settings to reuse (default: the run's data.masks)")
    parser.add_argument("--entities-from", type=Path,
                        help="entity cache holding the vocabulary and retriever (default: the run's data.entities)")
    return parser


def run(args: argparse.Namespace) -> int:
    from preprocess.online import OnlineEntities, OnlineMasks

    model_dir = resolve_model_dir(args.checkpoint)
    run_dir = run_dir_of(model_dir)
    run_data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"] if run_dir else {}
    index = read_folder(args.pairs)
    out = args.out or (args.pairs if args.pairs.is_dir() else args.pairs.parent) / "captions.jsonl"
    html_path = args.html or out.with_name("report.html")
    size_policy = "resize_before_to_after" if args.resize_mismatched else "error"

    model = load_davir(model_dir)
    masks_maker = OnlineMasks.from_cache(args.masks_from or run_data.get("masks"))
    entity_maker = None
    if model.config.epc.use_entities:
        entity_dir = args.entities_from or run_data.get("entities")
        if entity_dir is None:
            raise DataError(f"{model_dir} was trained with entity prompts: pass --entities-from CACHE (the folder "
                            "`python -m preprocess entities --out CACHE` wrote for its training data)")
        entity_maker = OnlineEntities(entity_dir)

    errors: dict[str, str] = {}
    masks: dict[str, PairMasks] = {}
    entities: dict[str, list[tuple[str, float]]] = {}
    images: dict[str, tuple] = {}
    for pair in tqdm(index.pairs, desc="masks + entities"):
        try:
            before, after = load_pair(pair, size_policy=size_policy)
            images[pair.pair_id] = (before, after)
            masks[pair.pair_id] = masks_maker(pair)
            if entity_maker is not None:
                entities[pair.pair_id] = entity_maker(pair.pair_id, np.asarray(before), np.asarray(after),
                                                      masks[pair.pair_id], ENTITIES_KEPT)
        except DataError as error:
            errors[pair.pair_id] = str(error)
            images.pop(pair.pair_id, None)

    ready = [pair for pair in index.pairs if pair.pair_id not in errors]
    k = model.config.epc.num_entities
    source = (lambda pair, before, after: [e for e, _ in entities[pair.pair_id][:k]]) if entity_maker else None
    predictions = {p.pair_id: p for p in caption_pairs(model, ready, batch_size=args.batch_size, num_beams=args.num_beams,
                                                       max_new_tokens=args.max_new_tokens, entity_source=source,
                                                       size_policy=size_policy)}
    for pair_id, reason in errors.items():
        predictions[pair_id] = Prediction(pair_id, error=reason)

    lines, rows = [], []
    for pair in index.pairs:
        prediction = predictions[pair.pair_id]
        retrieved = entities.get(pair.pair_id, [])
        lines.append(json.dumps({"id": pair.pair_id, "before": str(pair.before), "after": str(pair.after),
                                 "caption": prediction.caption, "entities": [[e, round(s, 4)] for e, s in retrieved],
                                 "error": prediction.error or None}))
        before, after = images.get(pair.pair_id, (None, None))
        pair_masks = masks.get(pair.pair_id)
        rows.append(ReportRow(pair.pair_id, caption=prediction.caption, before=before, after=after,
                              mask=None if pair_masks is None else pair_masks.union,
                              attention_before=prediction.attention_before, attention_after=prediction.attention_after,
                              entities=[e for e, _ in retrieved[:k]], error=prediction.error))
    for skipped in index.skipped:
        lines.append(json.dumps({"id": skipped.record, "caption": None, "error": f"skipped: {skipped.reason}"}))
        rows.append(ReportRow(skipped.record, error=f"skipped: {skipped.reason}"))
    write_text_atomic(out, "\n".join(lines) + "\n")
    write_report(html_path, rows, title=f"Change captions — {args.pairs.name}",
                 summary={"checkpoint": str(model_dir), "pairs": str(args.pairs)})
    failed = len(errors) + len(index.skipped)
    print(f"captioned {len(ready)} pair(s), {failed} not captioned; {out}; report {html_path}")
    for pair_id, reason in list(errors.items())[:5]:
        print(f"note: {pair_id}: {reason}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
