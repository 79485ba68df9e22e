"""`python -m preprocess entities` — DAVIR's change entities: vocabulary + top-k retrieval (Eqs. 8-9).

    python -m preprocess entities --format clevr_change --root DATA --split test \\
        --masks MASKCACHE --out CACHE [--retriever fitted|clip] [--fit-split train] [--top-k 5]
    python -m preprocess entities … --image-level --top-k 3 [--image-score abs|bef_minus_aft]   # CHEER, no masks

1. Entity vocabulary (docs/methods/davir.md): the noun phrases of the `--fit-split` captions (davir.text),
   kept when ≥ `--vocab-min-count` captions name them (with `--image-level`, CHEER §4.8: each caption's
   subject phrase only); saved as CACHE/vocab.json and reused.
2. Retriever (davir.preprocessing.retrievers.RETRIEVERS): `fitted` (default; no weights) is fitted on the fit
   split's masked change regions, each pair labelled with the vocabulary phrases of its references, and
   stored in CACHE/retriever/; `clip` loads open_clip from `--clip-checkpoint` (a local file). Each retriever's
   own options (`--fitted-mode`, `--clip-model`, …; see --help) go to that retriever only; one of another
   retriever than the run's is refused.
3. Entity gate (`--entity-gate fitted`, the region-level default [D]; davir.preprocessing.retrievers.EntityGate):
   a logistic regression on the fit split's change regions that tells a region whose references name
   an entity from one whose references name none (CLEVR-style distractors: a camera or light change
   leaves differences along edges); stored in CACHE/gate/. Pairs it rejects get no entities, like
   pairs without a change region. `--entity-gate none` retrieves for every region, as Eq. 9 does.
   A fit split without such pairs (Spot-the-Diff, Image Editing Request) leaves it inactive.
4. For every pair of `--split`: masked regions of both images (Eq. 8), scores over the vocabulary
   (Eq. 9), the `--top-k` best phrases with scores written through `EntityCache` in chunks
   (CACHE/entities/part-<split>-<position>.json). Finished pairs are skipped, so a killed run resumes.
   CACHE/entities/manifest.json records the settings; a rerun with other settings is refused.

`accelerate launch -m preprocess entities …` runs steps 1-3 on the main process while the others wait, then
splits step 4 (pair i to process i % N, each on its own device) and the main process writes the manifest
once every share is stored: the entity table equals a one-process run's.

`--masks` is a MaskCache folder (`python -m preprocess masks … --out MASKCACHE`) or the word `gt`
for the ground-truth masks a dataset ships (the built-in synthetic set's `gt_masks/`). The fitted
retriever is fitted with the fit split's masks from the same source unless `--fit-masks` names
another (e.g. fit on ground truth, retrieve with predicted masks).

`--image-level` is CHEER's retrieval instead (docs/methods/cheer.md): no masks (`--masks` is then refused);
the before and after frames are scored whole against all M entities (S_bef, S_aft; `clip`: cosine of
the global CLIP embedding, ViT-L/14 in the paper; `fitted`: the word model on whole-frame descriptors,
fitted on the fit split's whole frames — see FittedRetriever.frame_scores), ranked by S_bef − S_aft
(`--image-score bef_minus_aft`, Eq. 1 as written) or |S_bef − S_aft| (`abs` [D]) among the entities above their
image's mean similarity (davir.preprocessing.retrievers.cheer_rank_entities); every pair, distractors included,
gets `--top-k` entries (CHEER: 3). `--profile paper --image-level` is CHEER's Eq. 1 as written (CLIP,
bef_minus_aft; the cache records profile "paper", which configs/cheer_<benchmark>.yaml expect); the default
profile's is the fitted retriever by `abs` [D] (profile "custom"). The settings record `retrieval: image`, so a
cache is never mixed with region-level entities.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from davir.data import read_dataset
from davir.data.caches import EntityCache, refuse_another_root
from davir.data.images import load_pair
from davir.errors import DataError, check_output_dir, settings_differences
from davir.io import read_json, write_json_atomic
from davir.jobs.component_options import check_component_options, component_checkpoint, component_settings
from davir.jobs.entity_fit import (  # noqa: F401 - GroundTruthMasks, SubjectExtractor: entities.X for callers
    FITTED_INPUT,
    GroundTruthMasks,
    SubjectExtractor,
    fit_shared_parts,
    load_or_build_vocabulary,
    load_pair_regions,
    mask_source_record,
    open_mask_source,
    recorded_paths_resolved,
)
from davir.jobs.entity_parser import build_parser
from davir.jobs.processes import ProcessLayout, process_layout
from davir.preprocessing.profiles import entity_options, entity_profile, image_entity_options, profile_deviations
from davir.preprocessing.retrievers import RETRIEVERS, EntityGate, retrieve_image_level, retrieve_top_k
from davir.runtime.locks import output_lock, shard_job
from davir.runtime.signals import stop_on_signals

REGION, IMAGE = (
    "region",
    "image",
)  # settings["retrieval"]: DAVIR's masked regions (Eq. 9) or CHEER's whole frames (§4.8)


def apply_profile(args: argparse.Namespace) -> dict:
    """Fill the options left unset from --profile; returns the explicit deviations from it. CHEER's image-level
    retrieval takes the profile's image-level options (paper: CLIP, Eq. 1's S_bef − S_aft), else the retriever
    and CLIP model of its region-level ones and the `abs` ranking [D]."""
    image_options = image_entity_options(args.profile) if args.image_level else {}
    options = {**entity_options(args.profile), **image_options}
    keys = ("retriever", "clip_model") if args.image_level else tuple(entity_options(args.profile))
    chosen = {key: getattr(args, key) for key in keys if getattr(args, key) is not None}
    if args.image_level and args.image_score is not None:
        chosen["image_score"] = args.image_score
    args.image_score = args.image_score or (options.get("image_score", "abs") if args.image_level else None)
    args.retriever = args.retriever or options["retriever"]
    check_component_options(RETRIEVERS, args.retriever, args)
    # A profile value of another retriever's option (clip_model with the fitted one) is not filled in.
    owners = {dest: name for name in RETRIEVERS for _, dest in RETRIEVERS[name].flags()}
    for key in keys:
        if getattr(args, key) is None and owners.get(key, args.retriever) == args.retriever:
            setattr(args, key, options[key])
    if args.image_level:
        args.mask_source = args.mask_source or "per_image"
        args.mask_weighting = args.mask_weighting or "binary"
        return {
            key: (image_options[key], value)
            for key, value in {**chosen, "retriever": args.retriever}.items()
            if key in image_options and value != image_options[key]
        }
    return profile_deviations("entities", args.profile, {**chosen, "retriever": args.retriever})


def check_mode_arguments(args: argparse.Namespace) -> None:
    """Masks are needed exactly by region-level retrieval; --image-score only means something image-level."""
    if not 0.0 <= args.gate_threshold <= 1.0:
        raise DataError(f"--gate-threshold must lie in [0, 1], got {args.gate_threshold}")
    if args.image_level:
        if args.masks is not None or args.fit_masks is not None:
            raise DataError(
                "--image-level retrieves from whole frames and uses no masks; drop --masks/--fit-masks "
                "(or drop --image-level for DAVIR's region-level retrieval)"
            )
        if args.entity_gate == "fitted":
            raise DataError(
                "--entity-gate gates change regions; --image-level has none (CHEER gives every pair its top-K entities)"
            )
    else:
        if args.masks is None:
            raise DataError(
                "--masks is required for region-level retrieval (a MaskCache folder from `python -m "
                "preprocess masks --out …`, or 'gt'); pass --image-level for CHEER's mask-free retrieval"
            )
        if args.image_score is not None:
            raise DataError("--image-score applies only with --image-level")


def entity_gate(args: argparse.Namespace) -> str:
    """The gate in use: --entity-gate, else 'fitted' at region level and 'none' image level."""
    return args.entity_gate or ("none" if args.image_level else "fitted")


def run_settings(args: argparse.Namespace) -> dict:
    """Everything that changes the stored entities; a cache refuses a rerun with other values.

    `retrieval` is "region" (masked regions, Eq. 9) or "image" (CHEER §4.8); only region-level
    settings carry the mask keys, so the two kinds never compare equal.
    """
    settings = {
        "format": args.format,
        "fit_split": args.fit_split,
        "retriever": args.retriever,
        "top_k": args.top_k,
        "vocab_min_count": args.vocab_min_count,
        "phrase_backend": args.phrase_backend,
    }
    if args.image_level:
        settings.update(retrieval=IMAGE, image_score=args.image_score)  # set by apply_profile
    else:
        settings.update(
            retrieval=REGION,
            masks=mask_source_record(args.masks),
            mask_source=args.mask_source,
            mask_weighting=args.mask_weighting,
            pad=args.pad,
            empty_masks="no_entity",
            entity_gate=entity_gate(args),
        )
        if settings["entity_gate"] == "fitted":
            settings["gate_threshold"] = args.gate_threshold
    entry = RETRIEVERS[args.retriever]
    own = entry.compared(component_settings(RETRIEVERS, args.retriever, args))  # its settings, under its own names
    if entry.weights:
        own[entry.weights.key] = component_checkpoint(RETRIEVERS, args.retriever, args)
    clashes = sorted(set(own) & set(settings))
    if clashes:
        raise ValueError(
            f"retriever {args.retriever!r}: settings {clashes} clash with the job's; prefix them with "
            "the retriever's name"
        )
    settings.update(own)
    if entry.declared.get("fit") or settings.get("entity_gate") == "fitted":  # what the fitted parts see
        settings["fit_limit"] = args.fit_limit
        if not args.image_level:
            settings["fit_masks"] = mask_source_record(args.fit_masks or args.masks)
    return settings


def run(args: argparse.Namespace, argv: list[str], layout: ProcessLayout | None = None) -> dict:
    """Entities of one split; under `accelerate launch` in order: (1) the main process builds the vocabulary and
    fits the retriever and gate on the fit split while the others wait, (2) every process retrieves for its share
    of the pairs, (3) the main process writes the manifest once every share is stored."""
    layout = layout or process_layout()
    if args.top_k < 1 or args.chunk_size < 1 or args.vocab_min_count < 1:
        raise DataError("--top-k, --chunk-size and --vocab-min-count must be at least 1")
    check_mode_arguments(args)
    deviations = apply_profile(args)
    out = check_output_dir(args.out, what="--out")  # before any work (docs/errors.md)
    refuse_another_root(out, args.root, args.moved_from)
    for flag, masks in (("--masks", args.masks), ("--fit-masks", args.fit_masks)):
        if masks not in (None, "gt"):  # a region of another dataset's mask would be retrieved from
            refuse_another_root(masks, args.root, args.moved_from, flag=flag)
    manifest_path = out / "entities" / "manifest.json"
    settings = run_settings(args)
    manifest = read_json(manifest_path) if manifest_path.is_file() else {"settings": settings, "splits": {}}
    stored = recorded_paths_resolved(manifest.get("settings", {}))
    stored.setdefault("retrieval", REGION)  # caches written before image-level retrieval existed
    if stored != settings:
        raise DataError(
            f"{out} holds entities made with other settings ({settings_differences(stored, settings)}); "
            "use another --out"
        )
    manifest["settings"] = settings
    progress = not args.no_progress
    masks = None if args.image_level else open_mask_source(args.masks)
    region_options = {"mask_source": args.mask_source, "pad": args.pad, "weighting": args.mask_weighting}

    target = read_dataset(args.format, args.root, args.split)
    fit_index = target if args.fit_split == args.split else read_dataset(args.format, args.root, args.fit_split)

    retriever_folder, gate_folder = out / "retriever", out / "gate"
    entry = RETRIEVERS[args.retriever]
    fitted_here = entry.declared.get("fit") is not None  # fitted on the fit split below, then loaded from its folder

    def build_retriever():
        return entry.build(
            component_settings(RETRIEVERS, args.retriever, args),
            checkpoint=component_checkpoint(RETRIEVERS, args.retriever, args),
            device=args.device or layout.device,
            folder=retriever_folder,
        )

    if not fitted_here:  # first, so a missing checkpoint is reported before any fitting
        retriever = build_retriever()
    layout.main_first(lambda: fit_shared_parts(args, out, fit_index, masks, settings, manifest, region_options))
    vocabulary, extractor = load_or_build_vocabulary(
        out / "vocab.json",
        fit_index,
        min_count=args.vocab_min_count,
        backend=args.phrase_backend,
        subjects=args.image_level,
    )
    gate = EntityGate.load(gate_folder) if settings.get("entity_gate") == "fitted" else None
    if gate is not None and gate.threshold != args.gate_threshold:
        raise DataError(f"{gate_folder} holds an entity gate with threshold {gate.threshold}; use another --out")
    if fitted_here:  # its builder checks the stored settings; here what it was fitted on
        retriever = build_retriever()
        fitted_on = getattr(retriever, "training", {}).get("input", FITTED_INPUT[False])
        if fitted_on != FITTED_INPUT[args.image_level]:
            raise DataError(
                f"{retriever_folder} holds a {args.retriever} retriever fitted on {fitted_on}, not on "
                f"{FITTED_INPUT[args.image_level]}; use another --out"
            )
    retriever.prepare(vocabulary.phrases)

    cache = EntityCache(out)
    whole = target.pairs[: args.limit] if args.limit is not None else target.pairs
    pairs = layout.share(whole)
    layout.announce(len(pairs), len(whole))
    position = {pair.pair_id: i for i, pair in enumerate(whole)}
    todo = [pair for pair in pairs if not cache.has(pair.pair_id)]
    started = time.time()
    withheld = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(todo),
            desc=f"entities ({args.split})" + (f" {layout.describe()}" if layout.count > 1 else ""),
            file=sys.stderr,
        )
    for start in range(0, len(todo), args.chunk_size):
        chunk = todo[start : start + args.chunk_size]
        if args.image_level:
            frames = [tuple(np.asarray(image) for image in load_pair(pair)) for pair in chunk]
            retrieved = retrieve_image_level(retriever, frames, vocabulary.phrases, args.top_k, settings["image_score"])
        else:
            regions = [load_pair_regions(pair, masks, **region_options) for pair in chunk]
            retrieved = retrieve_top_k(retriever, regions, vocabulary.phrases, args.top_k, gate=gate)
            withheld += sum(
                1
                for pair, found in zip(regions, retrieved)
                if not found and not (pair.before.empty and pair.after.empty)
            )
        # Part names come from the split position of the chunk's first pair, so a resumed run never
        # overwrites a part an earlier run finished, nor one process another's.
        cache.write_part(
            f"{args.split}-{position[chunk[0].pair_id]:07d}",
            {pair.pair_id: entities for pair, entities in zip(chunk, retrieved)},
        )
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    written, withheld = (sum(values) for values in zip(*layout.gather((len(todo), withheld))))
    summary = {
        "split": args.split,
        "pairs": len(whole),
        "written": written,
        "skipped_existing": len(whole) - written,
        "withheld_by_gate": withheld,
        "vocabulary": len(vocabulary),
        "seconds": round(time.time() - started, 1),
        "out": str(out),
    }
    if not layout.is_main:  # the main process writes the manifest of the whole split
        return summary
    pairs = whole

    done = sum(1 for pair in pairs if cache.has(pair.pair_id))
    table = cache.table()
    without_entity = sum(1 for pair in pairs if pair.pair_id in table and not table[pair.pair_id])
    manifest["splits"][args.split] = {
        "root": str(Path(target.root).resolve()),
        "pairs": len(pairs),
        "with_entities": done,
        "written_now": written,
        "without_entity": without_entity,
        "skipped_by_reader": len(target.skipped),
        "status": "complete" if done == len(pairs) else "incomplete",
    }
    manifest.update(
        {
            "command": "python -m preprocess entities " + " ".join(argv),
            "vocabulary": {"size": len(vocabulary), "extractor": vocabulary.extractor, "path": str(out / "vocab.json")},
            # the word lists the phrases were read with (davir.text.lexicon; None for the rules/spaCy back-ends)
            "lexicon": vocabulary.extractor.get("lexicon"),
            "retriever": retriever.describe(),
            "entity_gate": None if gate is None else gate.describe(),
            "mask_source": "none (image level)" if masks is None else masks.describe(),
            # derived from the settings (davir.preprocessing.profiles), recorded for the reader
            "profile": entity_profile(settings),
            "profile_requested": args.profile,
            "profile_deviations": {k: {"profile": a, "chosen": b} for k, (a, b) in deviations.items()},
        }
    )
    write_json_atomic(manifest_path, manifest)
    return summary


@stop_on_signals()
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(__doc__).parse_args(argv)
    try:
        check_output_dir(args.out, what="--out")  # before its lock file is made beside it
        layout = process_layout()
        # The whole cache (its manifest and vocabulary are shared by the splits), held by the one process or by
        # the main process of a launch, which writes them; each other process of a launch locks its share.
        job = "entities" if layout.is_main else shard_job("entities", layout.count, layout.index)
        with output_lock(args.out, what=f"entity cache {args.out}", job=job, wait=args.wait_lock):
            summary = run(args, argv, layout)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import json

    if layout.is_main:
        print(json.dumps(summary, indent=2))
    return 0
