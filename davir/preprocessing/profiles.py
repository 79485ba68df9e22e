"""Named preprocessing profiles: which change masks and entities a DAVIR run was trained on.

    python -m preprocess masks    --profile paper …     # SAM on the after image; no registration/photometric/tolerance
    python -m preprocess entities --profile paper …     # CLIP on the masked regions (Eqs. 8-9), no entity gate

`paper` is DAVIR as written; `toolkit` (the default) is the toolkit's weight-free deviations [D]. What each sets
and how a cache's profile is derived: docs/recipes.md, "Preprocessing", and docs/preprocessing.md, "Profiles".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from davir.errors import DataError

PAPER, TOOLKIT, CUSTOM = "paper", "toolkit", "custom"
PROFILE_NAMES = (PAPER, TOOLKIT)

# Each profile as the `preprocess` options it fixes (option dest → value); the cache settings are
# compared through the keys of MASK_KEYS / ENTITY_KEYS below.
MASK_OPTIONS: dict[str, dict[str, Any]] = {
    PAPER: {
        "segmenter": "sam",
        "segment_both": False,
        "register": "none",
        "photometric": "none",
        "tolerance_px": 0,
        "cluster_stride": 1,
        "localisation": "pixel",
    },
    TOOLKIT: {
        "segmenter": "classical",
        "segment_both": True,
        "register": "ecc",
        "photometric": "affine",
        "tolerance_px": 2,
        "cluster_stride": 2,
        "localisation": "pixel",
    },
}
ENTITY_OPTIONS: dict[str, dict[str, Any]] = {
    PAPER: {
        "retriever": "clip",
        "entity_gate": "none",
        "mask_source": "union",
        "mask_weighting": "soft",
        "clip_model": "ViT-L-14-quickgelu",
    },
    TOOLKIT: {
        "retriever": "fitted",
        "entity_gate": "fitted",
        "mask_source": "per_image",
        "mask_weighting": "binary",
        "clip_model": "ViT-L-14-quickgelu",
    },
}
# Options that only matter to the profile check when they are in use (clip_model with the clip retriever).
ENTITY_PROFILE_KEYS = ("retriever", "entity_gate", "mask_source", "mask_weighting")
# CHEER's image-level retrieval (retrieval "image"): Eq. 1, argmax(S_bef − S_aft) over CLIP ViT-L/14 similarities.
IMAGE_ENTITY_OPTIONS: dict[str, dict[str, Any]] = {
    PAPER: {"retriever": "clip", "image_score": "bef_minus_aft", "clip_model": "ViT-L-14-quickgelu"}
}
IMAGE_ENTITY_PROFILE_KEYS = ("retriever", "image_score")


def mask_options(profile: str) -> dict[str, Any]:
    if profile not in MASK_OPTIONS:
        raise DataError(f"unknown preprocessing profile {profile!r}; choose one of {PROFILE_NAMES}")
    return dict(MASK_OPTIONS[profile])


def entity_options(profile: str) -> dict[str, Any]:
    if profile not in ENTITY_OPTIONS:
        raise DataError(f"unknown preprocessing profile {profile!r}; choose one of {PROFILE_NAMES}")
    return dict(ENTITY_OPTIONS[profile])


def image_entity_options(profile: str) -> dict[str, Any]:
    """The image-level (CHEER) options `profile` fixes; {} for a profile with none (toolkit)."""
    if profile not in PROFILE_NAMES:
        raise DataError(f"unknown preprocessing profile {profile!r}; choose one of {PROFILE_NAMES}")
    return dict(IMAGE_ENTITY_OPTIONS.get(profile, {}))


def _mask_view(settings: dict) -> dict[str, Any]:
    regions = settings.get("regions") or {}
    segmenter = settings.get("segmenter") or {}
    # "localisation": "pixel" (Eqs. 2-3; what a cache that records none was made with) or "object" [D]
    # (davir.preprocessing.object_localisation), which neither profile uses: such a cache is `custom`.
    return {
        "segmenter": segmenter.get("name", segmenter.get("segmenter")),
        "segment_both": settings.get("segment_both"),
        "register": regions.get("register"),
        "photometric": regions.get("photometric"),
        "tolerance_px": regions.get("tolerance_px"),
        "cluster_stride": regions.get("cluster_stride"),
        "localisation": settings.get("localisation", "pixel"),
    }


def mask_localisation(settings: dict) -> str:
    """How a mask cache's recorded settings localise changes: "pixel" (also a cache from before the option) or
    "object"."""
    return str(settings.get("localisation", "pixel"))


def mask_profile(settings: dict) -> str:
    """The profile a mask cache's recorded settings match, else ``custom``."""
    view = _mask_view(settings)
    for name, options in MASK_OPTIONS.items():
        if all(view.get(key) == value for key, value in options.items()):
            return name
    return CUSTOM


def entity_profile(settings: dict) -> str:
    """The profile an entity cache's recorded settings match, else ``custom``; an image-level (CHEER) cache is
    compared with the image-level profiles only."""
    if settings.get("retrieval", "region") == "image":
        for name, options in IMAGE_ENTITY_OPTIONS.items():
            if all(settings.get(key) == options[key] for key in IMAGE_ENTITY_PROFILE_KEYS):
                return name
        return CUSTOM
    if settings.get("retrieval", "region") != "region":
        return CUSTOM
    for name, options in ENTITY_OPTIONS.items():
        if all(settings.get(key) == options[key] for key in ENTITY_PROFILE_KEYS):
            return name
    return CUSTOM


def profile_deviations(kind: str, profile: str, chosen: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{option: (profile's value, chosen value)} where explicit flags moved away from ``profile``."""
    options = mask_options(profile) if kind == "masks" else entity_options(profile)
    keys = (
        options
        if kind == "masks"
        else [*ENTITY_PROFILE_KEYS, *(("clip_model",) if chosen.get("retriever") == "clip" else ())]
    )
    return {key: (options[key], chosen.get(key)) for key in keys if key in chosen and chosen[key] != options[key]}


def _read_json(path: Path) -> dict | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def mask_cache_profile(folder: str | Path) -> tuple[str | None, Path]:
    """(profile, manifest file) of a MaskCache folder; None when it has no readable manifest."""
    folder = Path(folder)
    for path in [folder / "manifest.json", *sorted(folder.glob("manifest-shard-*.json"))]:
        manifest = _read_json(path) if path.is_file() else None
        if isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict):
            return mask_profile(manifest["settings"]), path
    return None, folder / "manifest.json"


def entity_cache_profile(folder: str | Path) -> tuple[str | None, Path]:
    """(profile, manifest file) of an EntityCache folder; None when it has no readable manifest."""
    path = Path(folder) / "entities" / "manifest.json"
    manifest = _read_json(path) if path.is_file() else None
    if isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict):
        return entity_profile(manifest["settings"]), path
    return None, path


def entity_cache_level(folder: str | Path) -> str | None:
    """ "region" (DAVIR's Eqs. 8-9, from masked regions) or "image" (CHEER's whole frames) as an EntityCache's
    manifest records it; None when it has no readable manifest."""
    manifest = (
        _read_json(Path(folder) / "entities" / "manifest.json")
        if (Path(folder) / "entities" / "manifest.json").is_file()
        else None
    )
    if isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict):
        return manifest["settings"].get("retrieval", "region")
    return None


def entity_cache_extractor(folder: str | Path) -> dict | None:
    """The phrase extractor (back-end, lexicon) an EntityCache's vocabulary was read with, as its manifest records
    it; None when it has no readable manifest."""
    path = Path(folder) / "entities" / "manifest.json"
    manifest = _read_json(path) if path.is_file() else None
    if isinstance(manifest, dict) and isinstance(manifest.get("vocabulary"), dict):
        extractor = manifest["vocabulary"].get("extractor")
        return extractor if isinstance(extractor, dict) else None
    return None


def check_cache_profiles(
    expected: str | None,
    *,
    masks: str | Path | None = None,
    entities: str | Path | None = None,
    allow_mismatch: bool = False,
    where: str = "the config",
    override: str = "data.allow_profile_mismatch=true",
    warn=None,
    entity_level: str | None = None,
) -> dict[str, str | None]:
    """Refuse caches made with another preprocessing profile than ``expected`` (None: no check).

    `entity_level` ("region" for DAVIR, "image" for CHEER): the entity cache must hold entities of that level too
    — both levels have a `paper` profile, so the profile alone does not tell a CHEER cache from a DAVIR one.
    An entity cache whose phrases were read with other word lists than this davir's lexicon (davir.text.lexicon,
    by sha256) is a mismatch too. Returns {"masks": profile, "entities": profile} of the caches given. A mismatch
    is a DataError naming the
    cache, its profile and the expected one, and how to fix it; with ``allow_mismatch`` it is reported
    through ``warn`` instead."""
    found: dict[str, str | None] = {}
    problems = []
    if entity_level is not None and entities is not None and Path(entities).is_dir():
        level = entity_cache_level(entities)
        if level not in (None, entity_level):
            problems.append(
                f"the entities cache {entities} holds {level}-level entities, but {where} needs "
                f"{entity_level}-level ones: `python -m preprocess entities` "
                f"{'without' if entity_level == 'region' else 'with'} --image-level"
            )
    if entities is not None and Path(entities).is_dir():
        # Entities read with other word lists than this davir's (davir.text.lexicon) make other prompts.
        from davir.text.entity_vocabulary import lexicon_mismatch
        from davir.text.lexicon import lexicon_record

        extractor = entity_cache_extractor(entities)
        mismatch = (
            None
            if extractor is None
            else lexicon_mismatch(
                extractor,
                {"backend": "wordnet", "lexicon": lexicon_record()}
                if extractor.get("backend") == "wordnet"
                else extractor,
            )
        )
        if mismatch:
            problems.append(
                f"the entities cache {entities} was made with {mismatch}: recompute it with "
                "`python -m preprocess entities … --out NEW`"
            )
    for kind, folder, reader in (("masks", masks, mask_cache_profile), ("entities", entities, entity_cache_profile)):
        if folder is None or not Path(folder).is_dir():
            continue  # no cache at all: the caller's "run preprocess … first" error says more
        profile, manifest = reader(folder)
        found[kind] = profile
        if expected is None or profile is None or profile == expected:
            continue  # a manifest without settings is not a cache a job wrote: the cache readers name that
        problems.append(
            f"the {kind} cache {folder} was made with preprocessing profile {profile!r} ({manifest}), "
            f"but {where} expects "
            f"profile {expected!r}: recompute it with `python -m preprocess {kind} --profile {expected} …`"
        )
    if problems:
        message = "; ".join(problems) + f" — or accept the mismatch explicitly with {override}"
        if not allow_mismatch:
            raise DataError(message)
        if warn is not None:
            warn(f"warning: {message} (accepted)")
    return found
