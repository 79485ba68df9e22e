"""The command line of `python -m preprocess masks` (davir.jobs.masks): its options, the segmenters' own included."""

from __future__ import annotations

import argparse

from davir.data.caches import add_moved_from_argument
from davir.jobs.component_options import add_component_arguments
from davir.preprocessing.change_regions import PHOTOMETRIC, REGISTRATIONS, RegionSettings
from davir.preprocessing.object_localisation import LOCALISATIONS
from davir.preprocessing.profiles import PROFILE_NAMES, TOOLKIT
from davir.preprocessing.segmenters import SEGMENTERS
from davir.runtime.arguments import limit_type


def build_parser() -> argparse.ArgumentParser:
    defaults = RegionSettings()
    parser = argparse.ArgumentParser(
        prog="python -m preprocess masks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("data")
    data.add_argument("--format", required=True, help="dataset format (davir.data.FORMATS)")
    data.add_argument("--root", required=True, help="dataset root folder")
    data.add_argument("--split", required=True)
    data.add_argument("--out", required=True, help="cache folder (MaskCache layout)")
    add_moved_from_argument(data)
    data.add_argument(
        "--limit",
        type=limit_type(),
        default=None,
        help="only the first N pairs of the split (after sharding; N >= 1; default: all)",
    )

    profile = parser.add_argument_group("profile (davir.preprocessing.profiles)")
    profile.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        default=TOOLKIT,
        help="paper: SAM on the after image, plain difference map (no registration, photometric "
        "matching or tolerance), every pixel clustered — DAVIR as written; toolkit (default): "
        "classical segmenter, ECC registration, photometric matching, 2-px tolerance, both "
        "images [D]. Explicit flags below override single settings (the cache then records "
        "profile 'custom').",
    )

    profile.add_argument(
        "--localisation",
        choices=LOCALISATIONS,
        default=None,
        help="pixel (both profiles): Eqs. 2-3 on the (registered) difference map; object [D]: "
        "objects segmented in each view, matched across the views by colour and position "
        "after a global fit, the unmatched or changed ones are the masks — for camera moves "
        "with parallax (davir.preprocessing.object_localisation; docs/experiments/synthetic_hard.md has "
        "its measurements). The cache records it; caption.py follows the cache.",
    )

    seg = parser.add_argument_group(
        "segmenter (davir.preprocessing.segmenters.SEGMENTERS; each one's own options below)"
    )
    seg.add_argument("--segmenter", choices=list(SEGMENTERS), default=None, help="default: the profile's")
    seg.add_argument(
        "--device",
        default=None,
        help="device of a segmenter with a model, e.g. SAM (default: cuda when available; under "
        "accelerate launch the process's own)",
    )
    both = seg.add_mutually_exclusive_group()
    both.add_argument(
        "--segment-both",
        dest="segment_both",
        action="store_true",
        default=None,
        help="segment the before and the after image (toolkit profile; finds removed objects)",
    )
    both.add_argument(
        "--after-only",
        dest="segment_both",
        action="store_false",
        help="segment only the after image, as the paper does (paper profile)",
    )

    eq = parser.add_argument_group("Eqs. 2-3 (pixel sizes at the working resolution)")
    eq.add_argument("--work-size", type=int, default=defaults.work_size, help="long side of the working resolution")
    eq.add_argument("--blur-sigma", type=float, default=defaults.blur_sigma)
    eq.add_argument("--threshold", type=float, default=defaults.threshold, help="δ on the [0, 1] difference map")
    eq.add_argument("--open-px", type=int, default=defaults.open_px)
    eq.add_argument("--eps", type=float, default=defaults.eps, help="DBSCAN eps")
    eq.add_argument("--min-samples", type=int, default=defaults.min_samples, help="DBSCAN min_samples")
    eq.add_argument("--min-area", type=float, default=defaults.min_area, help="drop clusters under this image share")
    eq.add_argument("--max-points", type=int, default=defaults.max_points)
    eq.add_argument(
        "--cluster-stride",
        type=int,
        default=None,
        help="DBSCAN on s×s blocks of changed pixels (1 = every pixel; eps/min-samples count blocks)",
    )
    eq.add_argument(
        "--tolerance-px",
        type=int,
        default=None,
        help="misalignment tolerance of the difference map (0 = plain mean-RGB |I_s − I_t|, the paper)",
    )
    eq.add_argument("--close-px", type=int, default=defaults.close_px)
    hull = eq.add_mutually_exclusive_group()
    hull.add_argument(
        "--region-hull",
        dest="region_hull",
        action="store_true",
        default=defaults.region_hull,
        help="R_c = convex hull of the cluster (default)",
    )
    hull.add_argument(
        "--region-closed",
        dest="region_hull",
        action="store_false",
        help="R_c = the cluster's pixels, closed and hole-filled",
    )
    eq.add_argument("--dilate-px", type=int, default=defaults.dilate_px, help="dilation of R_c for the IoU filter")
    eq.add_argument("--tau", type=float, default=defaults.tau, help="τ of Eq. 3")
    eq.add_argument("--register", choices=REGISTRATIONS, default=None, help="default: the profile's")
    eq.add_argument("--photometric", choices=PHOTOMETRIC, default=None, help="default: the profile's")

    run = parser.add_argument_group("run")
    run.add_argument("--workers", type=int, default=1, help="processes for the CPU stages (0 = one per core)")
    run.add_argument("--num-shards", type=int, default=1)
    run.add_argument("--shard-index", type=int, default=0)
    run.add_argument("--viz", default=None, help="folder for five-panel pictures of the first pairs")
    run.add_argument("--viz-count", type=int, default=16)
    run.add_argument(
        "--overwrite", action="store_true", help="recompute every pair, replacing a cache made with other settings"
    )
    run.add_argument("--no-progress", action="store_true")
    run.add_argument(
        "--wait-lock",
        action="store_true",
        help="when another run writes the same cache (shard), wait for it instead of stopping",
    )
    add_component_arguments(SEGMENTERS, parser)  # an option of another segmenter than the one in use is refused
    return parser
