"""Scoring and generate-then-score, the library side of `evaluate.py` / `davir-evaluate`.

    report_scores(predictions, options, predictions_source="preds.json")   # score, print tables, write outputs
    generate_and_score(options)                                            # caption a split with a model, then score

`options` holds the options of davir.cli.evaluate (an argparse namespace, or any object with the same
attributes): the reference source (`references`, or `format`/`root`/`split`), the metrics, the outputs
and, for generation, the checkpoint and decoding settings.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from davir.data.records import DataError
from davir.errors import check_output_dir, check_output_file
from davir.io import write_text_atomic
from davir.metrics import (
    TOTAL, format_group_table, format_table, score_by_group,
    score_captions, write_results_json,
)


def load_reference_source(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, str], dict, list[str]]:
    """(references, groups, description for the JSON, notes) from --references or the data layer.

    Which pairs and sentences count (official protocols, empty references): davir.metrics.protocols.
    """
    from davir.data.formats import read_dataset
    from davir.metrics.protocols import load_reference_file, references_for_evaluation

    if args.references is not None:
        chosen = load_reference_file(args.references, empty=args.empty_references)
    else:
        chosen = references_for_evaluation(read_dataset(args.format, args.root, args.split))
    return chosen.references, chosen.groups, chosen.source, chosen.notes


def report_scores(predictions: dict[str, str], args: argparse.Namespace, *, predictions_source: str) -> int:
    """Score `predictions` against the references the arguments name, print the table(s), write the outputs.

    Shared by every way of obtaining predictions (a file today; generation from a checkpoint later).
    """
    references, groups, reference_source, notes = load_reference_source(args)
    metrics = [name.strip() for name in args.metrics.split(",") if name.strip()]
    spice = False if args.no_spice else (args.spice_corenlp if args.spice_corenlp is not None else True)
    if groups:
        rows = score_by_group(predictions, references, groups, metrics=metrics, spice=spice, strict=args.strict)
    else:
        rows = {TOTAL: score_captions(predictions, references, metrics=metrics, spice=spice, strict=args.strict)}
    total = rows[TOTAL]

    text = format_table({TOTAL: total}, digits=args.digits)
    if len(rows) > 1:
        text += "\n" + format_group_table(rows, digits=args.digits)
    print(text, end="")
    for line in notes + total.mismatch.lines():
        print(f"note: {line}", file=sys.stderr)

    synthetic = synthetic_accuracy(predictions, args)
    if synthetic is not None:
        from davir.metrics.synthetic import format_synthetic_table

        synthetic_text = "\nBuilt-in synthetic set: does each caption name the right change and object?\n\n"
        synthetic_text += format_synthetic_table(synthetic)
        print(synthetic_text, end="")
        text += synthetic_text
    from davir.metrics.faithfulness import format_faithfulness_table, score_faithfulness

    faithfulness = score_faithfulness(predictions, references, groups)
    faithfulness_text = ("\nStated-difference faithfulness: are the objects and changes each caption states the ones "
                         "its references state?\n\n" + format_faithfulness_table(faithfulness))
    print(faithfulness_text, end="")
    text += faithfulness_text
    if args.markdown is not None:
        write_text_atomic(args.markdown, text)
    if args.out is not None:
        extra = {"predictions": predictions_source, "references": reference_source, "faithfulness": faithfulness}
        if synthetic is not None:
            extra["synthetic"] = synthetic.to_dict()
        write_results_json(args.out, rows, per_image=[TOTAL], extra=extra)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def synthetic_accuracy(predictions: dict[str, str], args: argparse.Namespace):
    """Type/object/exact accuracy (davir.metrics.synthetic) when the references are a davir synthetic set
    (clevr_change layout with the generator's scenes.json); None for every other data set."""
    scenes_root = getattr(args, "synthetic_scenes", None)  # a copy of the set in another format (folder) keeps its ids
    if scenes_root is None:
        if args.format != "clevr_change" or args.root is None or not (Path(args.root) / "scenes.json").is_file():
            return None
        scenes_root = args.root
    from davir.data.synthetic import load_scenes
    from davir.metrics.synthetic import pair_truths, score_synthetic

    truths = pair_truths(load_scenes(scenes_root), split=args.split)
    return score_synthetic({k: v for k, v in predictions.items() if k in truths}, truths)


def check_outputs(args: argparse.Namespace, out_dir: Path | None = None) -> None:
    """Stop before scoring or captioning when an output cannot be written (docs/errors.md)."""
    if out_dir is not None:
        check_output_dir(out_dir, what="evaluation folder")
    if args.out is not None:
        check_output_file(args.out, what="--out")
    if args.markdown is not None:
        check_output_file(args.markdown, what="--markdown")


def eval_folder_name(args: argparse.Namespace, run_data: dict) -> str:
    """`<format>_<split>` for the run's own data and the whole split; another dataset root or a --limit
    gets its own folder (`…-<root name>-<hash>`, `…-limit<N>`), so it never replaces the full result."""
    name = f"{args.format}_{args.split}"
    root = Path(args.root).resolve()
    own_root = run_data.get("root") and Path(run_data["root"]).resolve() == root and run_data.get("format") == args.format
    if not own_root:
        name += f"-{root.name}-{hashlib.sha1(str(root).encode()).hexdigest()[:8]}"
    if args.limit:
        name += f"-limit{args.limit}"
    return name


def recorded_paths(run, run_data: dict, *, root: bool, entities: bool) -> dict:
    """The run's `data.root` (and its caches) resolved from the folder it was trained in, so that
    `evaluate.py --checkpoint` works from any folder; a root found nowhere names --root."""
    resolved = dict(run_data)
    if root and run_data.get("root"):
        resolved["root"] = str(run.resolve(run_data["root"], what="dataset root (data.root)", flag="--root"))
    for key in ("features",) + (("entities",) if entities else ()):
        if run_data.get(key):  # not found anywhere: as recorded, its reader names what is missing
            resolved[key] = str(run.find(run_data[key]) or run_data[key])
    return resolved


def generate_and_score(args: argparse.Namespace) -> int:
    """--checkpoint: caption the split with the model (sharded over processes), write and score the predictions."""
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    from davir.data.caches import EntityCache, MaskCache
    from davir.data.formats import read_dataset
    from davir.data.images import load_mask
    from davir.inference.davir_generation import caption_pairs, load_davir, localisation_summary, resolve_model_dir, run_dir_of
    from davir.metrics.io import write_predictions
    from davir.runs.files import read_run_config, saved_model_state, unfinished_run_note
    from davir.runs.paths import RunPaths
    from davir.training.run import run_decoding

    model_dir = resolve_model_dir(args.checkpoint)
    run_dir = run_dir_of(model_dir)
    # Test decoding = the decoding best/ was selected with, unless flags say otherwise (recorded in metrics.json).
    decoding = run_decoding(run_dir, num_beams=getattr(args, "num_beams", None),
                            max_new_tokens=getattr(args, "max_new_tokens", None))
    args.num_beams, args.max_new_tokens = decoding["num_beams"], decoding["max_new_tokens"]
    print(f"decoding: num_beams={args.num_beams}, max_new_tokens={args.max_new_tokens} ({decoding['source']})", file=sys.stderr)
    # --format/--root not given: the run's config.yaml must name them (checked: the file and key are named)
    needed = tuple(key for key, given in (("data.format", args.format), ("data.root", args.root)) if given is None)
    run_data = (read_run_config(run_dir, required=needed, hint="pass --format and --root").get("data") or {}
                if run_dir else {})
    saved = saved_model_state(model_dir, run_dir)
    note = unfinished_run_note(saved, run_dir) if run_dir else None
    if note:
        print(f"note: {note}", file=sys.stderr)
    if run_dir is not None:  # the run's relative paths are relative to where it was trained, not to here
        run_data = recorded_paths(RunPaths.of(args.checkpoint), run_data,
                                  root=args.root is None, entities=args.entities is None)
    args.format = args.format or run_data.get("format")
    args.root = args.root or (Path(run_data["root"]) if run_data.get("root") else None)
    if args.format is None or args.root is None:
        raise DataError(f"{model_dir} has no run config naming its data: pass --format and --root")
    out_dir = (run_dir or model_dir) / "eval" / eval_folder_name(args, run_data)
    check_outputs(args, out_dir)  # before any captioning: a read-only run folder fails now, not after the work
    accelerator = Accelerator()
    index = read_dataset(args.format, args.root, args.split)
    pairs = index.pairs[: args.limit] if args.limit else index.pairs
    lightweight = (model_dir / "lightweight_config.json").is_file()
    if lightweight:  # subtraction / SCORER / DIRL / RDD / CHEER on cached (or online) ResNet features
        from davir.inference.lightweight import run_captioner

        caption_lightweight = run_captioner(model_dir, run_data, root=args.root, entities=args.entities,
                                            device=accelerator.device, batch_size=args.batch_size,
                                            num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
    else:
        model = load_davir(model_dir, device=accelerator.device)
    entity_source = None
    if not lightweight and model.config.epc.use_entities:
        cache_dir = args.entities or run_data.get("entities")
        if cache_dir is None:
            raise DataError("this model was trained with entity prompts: pass --entities CACHE "
                            f"(python -m preprocess entities --format {args.format} --root {args.root} --split {args.split} …)")
        from davir.preprocessing.profiles import check_cache_profiles

        # The entities must come from the preprocessing profile the run trained on (its data.preprocessing_profile).
        same_cache = str(cache_dir) == str(run_data.get("entities"))
        check_cache_profiles(run_data.get("preprocessing_profile"), entities=cache_dir,
                             allow_mismatch=bool(getattr(args, "allow_profile_mismatch", False)
                                                 or (same_cache and run_data.get("allow_profile_mismatch"))),
                             where=f"the run {run_dir} (data.preprocessing_profile)",
                             override="--allow-profile-mismatch", warn=lambda m: print(m, file=sys.stderr))
        cache = EntityCache(cache_dir)
        k = model.config.epc.num_entities
        missing = [p.pair_id for p in pairs if not cache.has(p.pair_id)]
        if missing:
            raise DataError(f"{len(missing)} pairs of {args.split} have no entities in {cache_dir} (e.g. {missing[:3]}); run "
                            f"`python -m preprocess entities --format {args.format} --root {args.root} --split {args.split} --out {cache_dir} …`")
        entity_source = lambda pair, before, after: [e for e, _ in cache.get(pair.pair_id)[:k]]
    from davir.runtime.cost import CostMeter

    meter = CostMeter(accelerator.device)  # captioning only: scoring (Java, CPU) is not the model's cost
    with accelerator.split_between_processes(pairs) as shard:
        shard_predictions = caption_lightweight(shard, progress=accelerator.is_local_main_process) if lightweight else caption_pairs(model, shard, batch_size=args.batch_size, num_beams=args.num_beams,
                                          max_new_tokens=args.max_new_tokens, entity_source=entity_source,
                                          progress=accelerator.is_local_main_process)
    all_predictions = gather_object(shard_predictions)
    if not accelerator.is_main_process:
        return 0
    captioning_cost = meter.record(pairs=len(all_predictions), model=None if lightweight else model,
                                   processes=accelerator.num_processes, batch_size=args.batch_size,
                                   num_beams=args.num_beams)
    failed = [p for p in all_predictions if p.error]
    for prediction in failed[:5]:
        print(f"note: not captioned: {prediction.error}", file=sys.stderr)
    predictions = {p.pair_id: p.caption for p in all_predictions if not p.error}
    write_predictions(out_dir / "predictions.json", predictions)
    args.out = args.out or out_dir / "metrics.json"
    args.markdown = args.markdown or out_dir / "metrics.md"

    masks: dict = {}
    mask_cache = MaskCache(args.masks) if args.masks else None
    for pair in pairs:
        if pair.has_gt_mask:
            masks[pair.pair_id] = (load_mask(pair.gt_mask_before, record=pair.pair_id),
                                   load_mask(pair.gt_mask_after, record=pair.pair_id))
        elif mask_cache is not None and mask_cache.has(pair.pair_id):
            entry = mask_cache.read(pair.pair_id)
            union = entry.union
            masks[pair.pair_id] = (entry.before if entry.before is not None else union,
                                   entry.after if entry.after is not None else union)
    localisation = localisation_summary(all_predictions, masks) if masks else {"images": 0}
    status = report_scores(predictions, args, predictions_source=str(out_dir / "predictions.json"))
    if localisation.get("images"):
        line = (f"localisation ({'ground-truth' if any(p.has_gt_mask for p in pairs) else 'preprocessed'} masks, "
                f"{localisation['images']} images): attention share in mask {localisation['attention_share_in_mask']:.3f} "
                f"(uniform {localisation['uniform_share']:.3f}, x{localisation['share_over_uniform']:.2f}), "
                f"pointing accuracy {localisation['pointing_accuracy']:.3f}")
        print(line)
        with open(args.markdown, "a", encoding="utf-8") as handle:
            handle.write("\n" + line + "\n")
    from davir.io import read_json, write_json_atomic
    from davir.runs.files import read_run_info

    metrics = read_json(args.out)
    training_cost = (read_run_info(run_dir) or {}).get("compute") if run_dir else None
    metrics["compute"] = {"captioning": captioning_cost, "training": training_cost}
    print(f"captioning: {captioning_cost['pairs']} pairs in {captioning_cost['wall_s']:.1f} s "
          f"({captioning_cost['pairs_per_s']} pairs/s) on {captioning_cost['device']}, "
          f"peak memory {captioning_cost['peak_memory_mb']:.0f} MiB ({captioning_cost['peak_memory']})", file=sys.stderr)
    # How many different sentences the model wrote: a collapsed captioner writes one for every pair.
    metrics.update({"distinct_captions": len(set(predictions.values())), "localisation": localisation, "not_captioned": [{"pair_id": p.pair_id, "error": p.error} for p in failed],
                    "checkpoint": str(model_dir), **saved, "limit": args.limit, "decoding": decoding})
    write_json_atomic(args.out, metrics)
    print(f"predictions, metrics and table in {out_dir}", file=sys.stderr)
    return status
