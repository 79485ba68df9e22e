"""Generate-then-score: caption a dataset split with a trained run and score it, the library side of
`evaluate.py --checkpoint`.

    result = evaluate_run("runs/demo", "test", limit=40, spice=False)     # EvaluationOptions fields as keywords
    result.metrics["rows"]["total"], result.predictions, result.metrics_file

Sources, processes and the files written: docs/recipes.md, "One captioning stack".
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from davir.config import replace_fields
from davir.errors import DataError
from davir.evaluation.scoring import ReferenceSource, check_outputs, score_predictions
from davir.metrics import METRICS
from davir.runtime.arguments import check_limit


@dataclass
class EvaluationOptions:
    """The settings of `evaluate_run`, named as evaluate.py's flags (without the dashes)."""

    format: str | None = None  # dataset format and root: default the run's data.format / data.root
    root: str | Path | None = None
    limit: int | None = None  # caption only the first N pairs of the split, N >= 1 (its own eval folder); None: all
    entities: str | Path | None = None  # entity cache for the split (default: the run's data.entities)
    allow_profile_mismatch: bool = False
    masks: str | Path | None = None  # mask cache for the localisation score without ground-truth masks
    pretrained: str | Path | None = None  # DAVIR's base InstructBLIP folder (default: the one it recorded)
    backbone_weights: str | Path | None = None  # a lightweight run's ResNet weights, for features made from the files
    batch_size: int = 16  # pairs per generate call
    num_beams: int | None = None  # default: the run's decoding (how its best/ was selected)
    max_new_tokens: int | None = None
    metrics: Sequence[str] = METRICS
    spice: bool | str | Path = True  # True: when CoreNLP is installed; a folder: its jars; False: none
    synthetic_scenes: str | Path | None = None
    strict: bool = False
    out: str | Path | None = None  # default: the eval folder's metrics.json / metrics.md
    markdown: str | Path | None = None
    digits: int = 1
    echo: bool = True  # print the tables, notes and cost as evaluate.py does
    progress: bool = True


@dataclass
class EvaluationResult:
    """What `evaluate_run` wrote and found. In the other processes of an `accelerate launch` (`main_process`
    False) only the paths are set: the main process scores."""

    metrics: dict  # metrics.json's document
    predictions: dict[str, str]  # {pair id: caption}
    failed: dict[str, str]  # {pair id: why it has no caption}
    out_dir: Path
    predictions_file: Path
    metrics_file: Path
    markdown_file: Path
    decoding: dict = field(default_factory=dict)
    main_process: bool = True


def eval_folder_name(format: str, root: str | Path, split: str, limit: int | None, run_data: dict) -> str:
    """`<format>_<split>` for the run's own data and the whole split; another dataset root or a --limit
    gets its own folder (`…-<root name>-<hash>`, `…-limit<N>`), so it never replaces the full result."""
    name = f"{format}_{split}"
    root = Path(root).resolve()
    own_root = run_data.get("root") and Path(run_data["root"]).resolve() == root and run_data.get("format") == format
    if not own_root:
        name += f"-{root.name}-{hashlib.sha1(str(root).encode()).hexdigest()[:8]}"
    if limit is not None:
        name += f"-limit{limit}"
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


def _options(options: EvaluationOptions | None, overrides: dict) -> EvaluationOptions:
    return replace_fields(EvaluationOptions, options, overrides, what="evaluation")


def check_cache_of_root(cache, root, run_data: dict, *, what: str, command: str) -> None:
    """A cache made from another dataset root than the one evaluated (the run's data.moved_from counts as its root):
    pair ids repeat across datasets (CLEVR_default_000003.png), so it would answer, silently, for other images. A
    DataError saying how to make one for this root."""
    from davir.data.caches import made_from_another_root

    other = made_from_another_root(cache, root, run_data.get("moved_from"))
    if other is not None:
        raise DataError(
            f"{what} {cache} was made from dataset root {other[1]} ({other[0]}), not from --root "
            f"{Path(root).resolve()}: its pair ids name other images; make one for this root (`{command}`)"
        )


def _entity_source(
    engine, options: EvaluationOptions, run_data: dict, run_dir, *, format: str, root, split: str, pairs
):
    """The split's entity cache as the captioner's entity source (None for a model without entities)."""
    from davir.inference import CachedEntities, LightweightEngine

    if not engine.uses_entities:
        return None
    cache_dir = options.entities or run_data.get("entities")
    if isinstance(engine, LightweightEngine):  # CHEER: a pair without entities is that pair's error
        if cache_dir is None:
            raise DataError(
                "this CHEER model needs retrieved entities: pass --entities CACHE "
                "(python -m preprocess entities … --image-level --top-k 3)"
            )
        check_cache_of_root(
            cache_dir, root, run_data, what="the entity cache", command=_entities_command(format, root, split, True)
        )
        return CachedEntities(cache_dir)
    if cache_dir is None:
        raise DataError(
            "this model was trained with entity prompts: pass --entities CACHE "
            f"(python -m preprocess entities --format {format} --root {root} --split {split} …)"
        )
    check_cache_of_root(
        cache_dir, root, run_data, what="the entity cache", command=_entities_command(format, root, split, False)
    )
    from davir.preprocessing.profiles import check_cache_profiles

    # The entities must come from the preprocessing profile the run trained on (its data.preprocessing_profile).
    same_cache = str(cache_dir) == str(run_data.get("entities"))
    check_cache_profiles(
        run_data.get("preprocessing_profile"),
        entities=cache_dir,
        allow_mismatch=bool(options.allow_profile_mismatch or (same_cache and run_data.get("allow_profile_mismatch"))),
        where=f"the run {run_dir} (data.preprocessing_profile)",
        override="--allow-profile-mismatch",
        warn=lambda m: print(m, file=sys.stderr),
        entity_level="region",
    )
    source = CachedEntities(cache_dir)
    missing = source.missing([p.pair_id for p in pairs])
    if missing:
        raise DataError(
            f"{len(missing)} pairs of {split} have no entities in {cache_dir} (e.g. {missing[:3]}); run "
            f"`python -m preprocess entities --format {format} --root {root} --split {split} "
            f"--out {cache_dir} …`"
        )
    return source


def _entities_command(format: str, root, split: str, image_level: bool) -> str:
    level = "--image-level --top-k 3" if image_level else "--masks MASKS"
    return f"python -m preprocess entities --format {format} --root {root} --split {split} {level} --out CACHE"


def _split_captioner(
    run,
    run_dir: Path | None,
    run_data: dict,
    options: EvaluationOptions,
    decoding: dict,
    device,
    *,
    format: str,
    root,
    split: str,
    pairs,
):
    """The captioner of a split: the split's caches as sources, images read at full size, the run's decoding."""
    from davir.inference import ChangeCaptioner, load_engine

    if options.masks:  # read after captioning: checked before it
        command = f"python -m preprocess masks --format {format} --root {root} --split {split} --out MASKS"
        check_cache_of_root(options.masks, root, run_data, what="the mask cache", command=command)

    # subtraction / SCORER / DIRL / RDD / CHEER on the run's cached ResNet features (else computed from the files)
    feature_cache = None
    if run.lightweight and run_data.get("features"):
        from davir.data.caches import made_from_another_root
        from davir.data.feature_cache import FeatureCache

        other = made_from_another_root(run_data["features"], root, run_data.get("moved_from"))
        if other is None:
            feature_cache = FeatureCache(run_data["features"], dataset_root=root)
        else:  # features can be computed from the files, unlike entities
            print(
                f"note: the run's feature cache {run_data['features']} holds the images of {other[1]}; the "
                f"features of {split} are computed from the image files of {Path(root).resolve()}",
                file=sys.stderr,
            )
    # the base InstructBLIP folder as recorded when found nowhere: evaluate.py has no flag to name
    engine = load_engine(
        run,
        device,
        pretrained=options.pretrained,
        pretrained_flag=None,
        backbone_weights=options.backbone_weights,
        features=feature_cache,
        read_files=True,
    )
    entities = _entity_source(engine, options, run_data, run_dir, format=format, root=root, split=split, pairs=pairs)
    return ChangeCaptioner(
        engine,
        None,
        entities,
        run=run,
        num_beams=decoding["num_beams"],
        max_new_tokens=decoding["max_new_tokens"],
        max_side=None,
    )


def evaluate_run(
    checkpoint: str | Path, split: str = "test", options: EvaluationOptions | None = None, **overrides
) -> EvaluationResult:
    """Caption `split` with the run (or model folder) `checkpoint`, write predictions.json, score them, write
    metrics.json (scores, localisation, cost, decoding, which checkpoint) and metrics.md.

    `overrides` are fields of `EvaluationOptions` (an unknown name is a TypeError); bad input is a DataError."""
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    from davir.data.formats import read_dataset
    from davir.evaluation.localisation import change_masks, localisation_line, localisation_summary
    from davir.io import write_json_atomic
    from davir.metrics.io import write_predictions
    from davir.runs.files import read_run_config, read_run_info, saved_model_state, unfinished_run_note
    from davir.runs.paths import RunPaths, resolve_model_dir, run_decoding, run_dir_of
    from davir.runtime.cost import CostMeter

    options = _options(options, overrides)
    check_limit(options.limit)  # 0 is no number of pairs (evaluate.py's --limit: N >= 1, or left out for all)
    say = print if options.echo else (lambda *args, **kwargs: None)
    model_dir = resolve_model_dir(checkpoint)
    run_dir = run_dir_of(model_dir)
    # Test decoding = the decoding best/ was selected with, unless options say otherwise (recorded in metrics.json).
    decoding = run_decoding(run_dir, num_beams=options.num_beams, max_new_tokens=options.max_new_tokens)
    say(
        f"decoding: num_beams={decoding['num_beams']}, max_new_tokens={decoding['max_new_tokens']} "
        f"({decoding['source']})",
        file=sys.stderr,
    )
    # no format/root given: the run's config.yaml must name them (checked: the file and key are named)
    needed = tuple(
        key for key, given in (("data.format", options.format), ("data.root", options.root)) if given is None
    )
    run_data = (
        read_run_config(run_dir, required=needed, hint="pass --format and --root").get("data") or {} if run_dir else {}
    )
    saved = saved_model_state(model_dir, run_dir)
    note = unfinished_run_note(saved, run_dir) if run_dir else None
    if note:
        say(f"note: {note}", file=sys.stderr)
    run = RunPaths.of(checkpoint)
    if run_dir is not None:  # the run's relative paths are relative to where it was trained, not to here
        run_data = recorded_paths(run, run_data, root=options.root is None, entities=options.entities is None)
    format = options.format or run_data.get("format")
    root = options.root or (Path(run_data["root"]) if run_data.get("root") else None)
    if format is None or root is None:
        raise DataError(f"{model_dir} has no run config naming its data: pass --format and --root")
    out_dir = (run_dir or model_dir) / "eval" / eval_folder_name(format, root, split, options.limit, run_data)
    check_outputs(options.out, options.markdown, out_dir)  # a read-only run folder fails now, not after the work
    out = Path(options.out or out_dir / "metrics.json")
    markdown = Path(options.markdown or out_dir / "metrics.md")
    accelerator = Accelerator()
    index = read_dataset(format, root, split)
    pairs = index.pairs[: options.limit] if options.limit is not None else index.pairs
    captioner = _split_captioner(
        run,
        run_dir,
        run_data,
        options,
        decoding,
        accelerator.device,
        format=format,
        root=root,
        split=split,
        pairs=pairs,
    )

    meter = CostMeter(accelerator.device)  # captioning only: scoring (Java, CPU) is not the model's cost
    with accelerator.split_between_processes(pairs) as shard:
        shard_results = captioner.caption_records(
            shard,
            batch_size=options.batch_size,
            attention=True,
            progress=options.progress and accelerator.is_local_main_process,
        )
    results = gather_object(shard_results)
    paths = dict(
        out_dir=out_dir, predictions_file=out_dir / "predictions.json", metrics_file=out, markdown_file=markdown
    )
    if not accelerator.is_main_process:
        return EvaluationResult({}, {}, {}, decoding=decoding, main_process=False, **paths)
    captioning_cost = meter.record(
        pairs=len(results),
        model=None if run.lightweight else captioner.engine.model,
        processes=accelerator.num_processes,
        batch_size=options.batch_size,
        num_beams=decoding["num_beams"],
    )
    failed = [r for r in results if r.error]
    for result in failed[:5]:
        say(f"note: not captioned: {result.error}", file=sys.stderr)
    predictions = {r.pair_id: r.caption for r in results if not r.error}
    write_predictions(out_dir / "predictions.json", predictions)

    masks = change_masks(pairs, options.masks)
    localisation = localisation_summary(results, masks) if masks else {"images": 0}
    scored = score_predictions(
        predictions,
        ReferenceSource.dataset(format, root, split),
        metrics=options.metrics,
        spice=options.spice,
        strict=options.strict,
        synthetic_scenes=options.synthetic_scenes,
        digits=options.digits,
        out=out,
        markdown=markdown,
        predictions_source=str(out_dir / "predictions.json"),
        echo=options.echo,
    )
    if localisation.get("images"):
        line = localisation_line(localisation, ground_truth=any(p.has_gt_mask for p in pairs))
        say(line)
        with open(markdown, "a", encoding="utf-8") as handle:
            handle.write("\n" + line + "\n")

    metrics = scored.metrics
    training_cost = (read_run_info(run_dir) or {}).get("compute") if run_dir else None
    metrics["compute"] = {"captioning": captioning_cost, "training": training_cost}
    say(
        f"captioning: {captioning_cost['pairs']} pairs in {captioning_cost['wall_s']:.1f} s "
        f"({captioning_cost['pairs_per_s']} pairs/s) on {captioning_cost['device']}, "
        f"peak memory {captioning_cost['peak_memory_mb']:.0f} MiB ({captioning_cost['peak_memory']})",
        file=sys.stderr,
    )
    # How many different sentences the model wrote: a collapsed captioner writes one for every pair.
    not_captioned = [{"pair_id": r.pair_id, "error": r.error} for r in failed]
    metrics.update(
        {
            "distinct_captions": len(set(predictions.values())),
            "localisation": localisation,
            "not_captioned": not_captioned,
            "checkpoint": str(model_dir),
            **saved,
            "limit": options.limit,
            "decoding": decoding,
        }
    )
    write_json_atomic(out, metrics)
    say(f"predictions, metrics and table in {out_dir}", file=sys.stderr)
    return EvaluationResult(metrics, predictions, {r.pair_id: r.error for r in failed}, decoding=decoding, **paths)
