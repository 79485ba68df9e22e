"""Captioning a user's folder of pairs with a trained model: the library side of `caption.py` / `davir-caption`.

    caption_folder(options)   # options of davir.cli.caption (an argparse namespace or the same attributes)

Change masks and entities are computed on the fly (davir.preprocessing.online) with the settings of the
caches the model was trained with.
"""

from __future__ import annotations

import argparse
import json
import sys

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


def caption_folder(args: argparse.Namespace) -> int:
    """Caption every pair of `args.pairs` with `args.checkpoint`: JSONL + HTML report; 0 when done."""
    from davir.preprocessing.online import OnlineEntities, OnlineMasks  # SAM/CLIP imports only when captioning

    index = read_folder(args.pairs)  # first: a bad list of pairs is reported before a model is loaded
    model_dir = resolve_model_dir(args.checkpoint)
    run_dir = run_dir_of(model_dir)
    run_data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"] if run_dir else {}
    out = args.out or (args.pairs if args.pairs.is_dir() else args.pairs.parent) / "captions.jsonl"
    html_path = args.html or out.with_name("report.html")
    size_policy = "resize_before_to_after" if args.resize_mismatched else "error"

    from davir.preprocessing.profiles import check_cache_profiles
    from davir.training.run import run_decoding

    # Decode as the run selected best/ (flags override); preprocess as it trained (profile checked).
    decoding = run_decoding(run_dir, num_beams=getattr(args, "num_beams", None),
                            max_new_tokens=getattr(args, "max_new_tokens", None))
    args.num_beams, args.max_new_tokens = decoding["num_beams"], decoding["max_new_tokens"]
    check_cache_profiles(run_data.get("preprocessing_profile"), masks=args.masks_from or run_data.get("masks"),
                         entities=args.entities_from or run_data.get("entities"),
                         allow_mismatch=bool(getattr(args, "allow_profile_mismatch", False)),
                         where=f"the run {run_dir} (data.preprocessing_profile)", override="--allow-profile-mismatch",
                         warn=lambda m: print(m, file=sys.stderr))
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
