"""The command line of `python -m preprocess entities` (davir.jobs.entities): its options, the retrievers' own
included."""

from __future__ import annotations

import argparse

from davir.data.caches import add_moved_from_argument
from davir.jobs.component_options import add_component_arguments
from davir.preprocessing.profiles import PROFILE_NAMES, TOOLKIT
from davir.preprocessing.retrievers import IMAGE_SCORES, MASK_SOURCES, MASK_WEIGHTINGS, RETRIEVERS
from davir.runtime.arguments import limit_type
from davir.text.extractors import BACKENDS

ENTITY_GATES = ("fitted", "none")


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """`description`: the --help text above the options (davir.jobs.entities' docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m preprocess entities",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--format", required=True, help="dataset format (davir.data.FORMATS)")
    parser.add_argument("--root", required=True, help="dataset root folder")
    parser.add_argument("--split", required=True, help="split whose pairs get entities")
    parser.add_argument(
        "--masks",
        default=None,
        help="MaskCache folder, or 'gt' for the dataset's ground-truth masks (required unless --image-level)",
    )
    parser.add_argument("--out", required=True, help="entity cache folder (vocab.json, retriever/, entities/)")
    add_moved_from_argument(parser)
    parser.add_argument(
        "--fit-masks",
        default=None,
        help="masks for fitting the fitted retriever on --fit-split (default: --masks), e.g. 'gt'",
    )
    parser.add_argument(
        "--fit-limit",
        type=limit_type("--fit-limit", "every pair of --fit-split"),
        default=None,
        help="fit the fitted retriever on the first N pairs of --fit-split only (N >= 1; default: all; the "
        "vocabulary still uses all its captions)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        default=TOOLKIT,
        help="paper: CLIP scores the crops of both images by the one after-image mask M^ (soft, "
        "Eq. 8), no entity gate — DAVIR as written; toolkit (default): the fitted retriever, "
        "each image's own binary mask, the entity gate [D]. Explicit flags override single "
        "settings (the cache then records profile 'custom').",
    )
    parser.add_argument(
        "--retriever",
        choices=list(RETRIEVERS),
        default=None,
        help="default: the profile's (davir.preprocessing.retrievers.RETRIEVERS; each one's own options below)",
    )
    parser.add_argument(
        "--fit-split", default="train", help="split whose captions (and regions) fit the vocabulary/retriever"
    )
    parser.add_argument(
        "--top-k", type=int, default=5, help="entities stored per pair (DAVIR uses the first k=1; CHEER K=3: --top-k 3)"
    )
    parser.add_argument(
        "--image-level",
        action="store_true",
        help="CHEER §4.8: rank entities by whole-frame similarities of the before and after image, no masks",
    )
    parser.add_argument(
        "--image-score",
        choices=IMAGE_SCORES,
        default=None,
        help="with --image-level: bef_minus_aft = S_bef − S_aft (CHEER Eq. 1 as written; the default "
        "with --profile paper); abs = |S_bef − S_aft| ([D], the default otherwise)",
    )
    parser.add_argument("--vocab-min-count", type=int, default=2)
    parser.add_argument(
        "--phrase-backend",
        choices=BACKENDS,
        default="auto",
        help="how captions are chunked into phrases: auto = wordnet (the WordNet lists shipped with "
        "davir, the same on every machine), rules (fitted on the captions), spacy (when installed)",
    )
    parser.add_argument(
        "--mask-source",
        choices=MASK_SOURCES,
        default=None,
        help="per_image: each image's own mask (union where missing/empty); union: one mask for both",
    )
    parser.add_argument(
        "--mask-weighting",
        choices=MASK_WEIGHTINGS,
        default=None,
        help="binary: I ⊙ M at full resolution; soft: I ⊙ upsampled M^ of Eq. 6",
    )
    parser.add_argument("--pad", type=float, default=0.1, help="crop box padding, share of the mask box")
    parser.add_argument(
        "--entity-gate",
        choices=ENTITY_GATES,
        default=None,
        help="region level: 'fitted' (default [D]) withholds the entities of a pair whose change "
        "region names nothing, by a gate fitted on --fit-split (davir.preprocessing.retrievers."
        "EntityGate); 'none' retrieves for every pair with a region, as Eq. 9 does",
    )
    parser.add_argument(
        "--gate-threshold",
        type=float,
        default=0.5,
        help="keep a pair's entities when the gate's P(it names an entity) is at least this",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="device of a retriever with a model, e.g. CLIP (default: cuda when available; under "
        "accelerate launch the process's own)",
    )
    parser.add_argument("--chunk-size", type=int, default=256, help="pairs per entity part file")
    parser.add_argument(
        "--limit", type=limit_type(), default=None, help="only the first N pairs of --split (N >= 1; default: all)"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--wait-lock",
        action="store_true",
        help="when another run writes the same cache (shard), wait for it instead of stopping",
    )
    add_component_arguments(RETRIEVERS, parser)  # an option of another retriever than the one in use is refused
    return parser
