"""`export_run`: a run's model as one self-contained folder to hand to someone (`davir-export`).

    export_run("runs/demo", "exports/demo")                  # LoRA adapter + davir's config + card
    export_run("runs/demo", "exports/demo-merged", merge=True)   # full weights of the family's model

What comes along, what stays, and `--overwrite`: docs/sharing.md.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from davir.errors import DataError
from davir.export import layout, preprocessing, shareable, target, weights
from davir.export.card import model_card
from davir.io import follow_umask, read_json, write_json_atomic, write_text_atomic
from davir.runs.files import LIGHTWEIGHT_CONFIG, read_lightweight_info
from davir.runs.paths import RunPaths, run_decoding


@dataclass
class ExportOptions:
    """What `export_run` may be told beyond the run: paths of a moved run, names for the card."""

    merge: bool = False  # the LoRA merged into full weights instead of the adapter
    base_model: str | Path | None = None  # the base model folder, when the run's recorded one moved
    base_model_name: str | None = None  # how the folder names its base (default: the base folder's name)
    masks_from: str | Path | None = None  # the run's mask cache, when it moved
    entities_from: str | Path | None = None  # the run's entity cache, when it moved
    license: str = "other"  # the card's licence field (Hub identifiers: apache-2.0, mit, other …)
    overwrite: bool = False  # replace an existing `out`
    device: str = "cpu"  # where --merge loads the model


def _davir_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("davir")
    except PackageNotFoundError:
        return "unknown"


def _evaluations(run: RunPaths, partial: Path, bases) -> dict[str, dict]:
    """The run's eval/*/metrics.json, copied (with metrics.md) into the export without the training machine's
    absolute paths; {folder name: metrics}."""
    found: dict[str, dict] = {}
    if run.run_dir is None:
        return found
    for path in sorted((run.run_dir / "eval").glob("*/metrics.json")):
        try:
            metrics = shareable.scrub(read_json(path), bases)
        except DataError as error:
            print(f"note: {path} not exported: {error}", file=sys.stderr)
            continue
        target = partial / layout.METRICS_DIR / path.parent.name
        target.mkdir(parents=True, exist_ok=True)
        write_json_atomic(target / "metrics.json", metrics)
        if (path.parent / "metrics.md").is_file():
            write_text_atomic(
                target / "metrics.md",
                shareable.scrub_text((path.parent / "metrics.md").read_text(encoding="utf-8"), bases),
            )
        found[path.parent.name] = metrics
    return found


def _davir_weights(run: RunPaths, partial: Path, out: Path, options: ExportOptions) -> tuple[dict, dict | None, bool]:
    """The DAVIR model's files; returns (the card's model description, base model record, uses entities)."""
    from davir.models.families import get_family
    from davir.models.vlm.checkpoint import read_davir_config

    config = read_davir_config(run.model_dir)
    _check_model_files(run.model_dir, config)
    base_path = None
    if config.pretrained is not None:
        base_path = (
            Path(options.base_model)
            if options.base_model is not None
            else run.resolve(config.pretrained, what="base model folder (model.pretrained)", flag="--base-model")
        )
        if not base_path.is_dir():
            raise DataError(f"--base-model {base_path}: no such folder")
    base = weights.describe_base(base_path, options.base_model_name, out) if base_path is not None else None
    has_adapter = (
        config.train_mode == "lora"
        and base is not None
        and (run.model_dir / "adapter" / layout.ADAPTER_WEIGHTS).is_file()
        and not (run.model_dir / "model.safetensors").is_file()
    )
    if not options.merge and not has_adapter:
        why = "a random-weight preset has no base model to name" if base is None else "it has no LoRA adapter"
        print(f"note: {run.model_dir} is written with its full weights ({why})", file=sys.stderr)
    merged = options.merge or not has_adapter
    weights.copy_processor(run.model_dir, partial)
    image_size = None
    if merged:
        image_size = weights.write_merged(run.model_dir, partial, base_path, device=options.device)
    else:
        weights.write_adapter(run.model_dir, partial, base["name"])
    saved = weights.write_davir_config(run.model_dir, partial, base["name"] if base else None)
    family = get_family(config.family)
    model = {
        "family": config.family,
        "model_class": family.model_class.__name__,
        "config": saved,
        "weights": "merged" if merged else "adapter",
        "image_size": image_size,
        "end_of_turn": getattr(family, "end_of_turn", None),
    }
    return model, base, bool(config.epc.use_entities)


def _check_model_files(model_dir: Path, config) -> None:
    """What captioning the export will need of a LoRA model folder is there, checked before anything is written
    (the loaders would find it missing only when the export is used)."""
    if config.train_mode != "lora" or (model_dir / layout.HF_WEIGHTS).is_file():
        return  # full weights hold every trained part
    path = model_dir / "davir_config.json"
    if "lora" not in read_json(path)["config"]:  # the default ranks would not fit the adapter: say which file
        raise DataError(
            f"{path}: config lacks key 'lora' (the LoRA ranks and modules of the adapter); the model "
            "folder is damaged — save or copy it again"
        )
    extra = model_dir / layout.EXTRA_WEIGHTS
    trained = [*config.extra_trainable, *(["segment_embeddings"] if config.segment_embeddings else [])]
    if trained and not extra.is_file():
        raise DataError(
            f"{extra}: missing — {model_dir} trains {trained} in full besides LoRA and keeps them "
            f"there; copy the whole model folder again"
        )


def _lightweight_weights(run: RunPaths, partial: Path) -> tuple[dict, bool]:
    info = read_lightweight_info(run.model_dir)
    names = [LIGHTWEIGHT_CONFIG, info.get("weights", "model.safetensors"), info.get("vocabulary", "vocab.json")]
    if info.get("entity_phrases"):
        names.append(info["entity_phrases"])
    for name in names[1:]:
        shutil.copy2(run.model_dir / name, partial / name)
    saved = read_json(run.model_dir / LIGHTWEIGHT_CONFIG)
    if isinstance(saved.get("features"), dict):  # the cache's path on the training machine: not the model's
        saved["features"] = {**saved["features"], "cache": None}
    write_json_atomic(partial / LIGHTWEIGHT_CONFIG, saved)
    backbone = (info.get("features") or {}).get("weights")
    return {"method": info["method"], "backbone": backbone, "weights": "lightweight"}, bool(info.get("entity_phrases"))


def export_run(checkpoint: str | Path, out: str | Path, options: ExportOptions | None = None, **overrides) -> Path:
    """Export the model of a run (its best/, else last/) or model folder to `out`; returns `out`.
    `overrides`: fields of `ExportOptions`."""
    from dataclasses import replace

    options = replace(options or ExportOptions(), **overrides)
    out = Path(out)
    run = RunPaths.of(checkpoint)
    if layout.is_export(run.model_dir):
        raise DataError(f"{checkpoint} is an exported folder already: copy it as it is")
    target.check_out(out, [Path(checkpoint), run.model_dir, *([run.run_dir] if run.run_dir else [])], options.overwrite)
    weights.check_device(options.device)
    partial = target.clear_partial(out)  # nothing is at this path now: what the cleanup below removes is ours
    try:
        target.make_partial(partial)
        decoding = run_decoding(run.run_dir or run.model_dir)
        base = None
        if run.lightweight:
            if options.merge:
                print("note: a lightweight model has no adapter; --merge changes nothing", file=sys.stderr)
            model, uses_entities = _lightweight_weights(run, partial)
        else:
            model, base, uses_entities = _davir_weights(run, partial, out, options)
        mask_settings = entity_settings = None
        masks_dir = entities_dir = None
        if not run.lightweight:  # DAVIR's entities rank masked regions (and caption.py's report shows the masks)
            source = options.masks_from or run.resolve(
                run.data.get("masks"), what="mask cache (data.masks)", flag="--masks-from"
            )
            if source is not None:
                mask_settings = preprocessing.export_mask_settings(
                    Path(source), partial / layout.MASKS_DIR, shareable.training_bases(run.info, run.run_dir)
                )
                masks_dir = layout.MASKS_DIR
        if uses_entities:
            source = options.entities_from or run.resolve(
                run.data.get("entities"), what="entity cache (data.entities)", flag="--entities-from"
            )
            if source is None:
                raise DataError(f"{run.model_dir} was trained with entities: pass --entities-from CACHE")
            entity_settings = preprocessing.export_entity_source(
                Path(source), partial / layout.ENTITIES_DIR, shareable.training_bases(run.info, run.run_dir)
            )
            entities_dir = layout.ENTITIES_DIR
        data = run.data
        method = run.config.get("method") or (model["method"] if run.lightweight else "davir")
        captioning = {
            "method": method,
            "data": {
                "format": data.get("format"),
                "masks": masks_dir,
                "entities": entities_dir,
                "preprocessing_profile": data.get("preprocessing_profile"),
            },
            "run": {"num_beams": decoding["num_beams"], "max_new_tokens": decoding["max_new_tokens"]},
        }
        captioning["data"] = {
            key: value for key, value in captioning["data"].items() if value is not None or key in ("masks", "entities")
        }
        write_text_atomic(
            partial / layout.RUN_CONFIG,
            "# What captioning reads (davir.runs.paths); the run's whole config: training_config.yaml\n"
            + yaml.safe_dump(captioning, sort_keys=False),
        )
        bases = shareable.training_bases(run.info, run.run_dir)
        run_info = shareable.scrub(run.info, bases)
        if run.run_dir is not None:
            write_text_atomic(
                partial / "training_config.yaml",
                "# The run's config as it trained; absolute paths made relative to its training folder\n"
                + yaml.safe_dump(shareable.scrub(run.config, bases), sort_keys=False),
            )
            if run.info:
                write_json_atomic(partial / "training_run_info.json", run_info)
        evaluations = _evaluations(run, partial, bases)
        selection = read_json(run.model_dir / "selection.json") if (run.model_dir / "selection.json").is_file() else {}
        info = {
            "format": layout.FORMAT,
            "format_version": layout.FORMAT_VERSION,
            "weights": model["weights"],
            "base_model": base,
            "license": options.license,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "davir_version": _davir_version(),
            "source": {
                "run_name": run.run_dir.name if run.run_dir else run.model_dir.name,
                "model_folder": run.model_dir.name,
                "step": selection.get("step"),
            },
            "model": model,
            "decoding": {"num_beams": decoding["num_beams"], "max_new_tokens": decoding["max_new_tokens"]},
            "preprocessing": {
                "profile": data.get("preprocessing_profile"),
                **preprocessing.describe(mask_settings, entity_settings),
            },
        }
        write_json_atomic(partial / layout.EXPORT_FILE, info)
        files = [
            str(p.relative_to(partial)) for p in partial.rglob("*") if p.is_file() and p.name != target.PARTIAL_MARKER
        ] + [layout.CARD_FILE]
        card = model_card(
            name=out.name,
            info=info,
            run_config=read_training_config(partial),
            run_info=run_info,
            evaluations=evaluations,
            files=sorted(set(files)),
        )
        write_text_atomic(partial / layout.CARD_FILE, card)
        follow_umask(partial)  # merged weights (safetensors: 0600) and files copied from older runs
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    target.move_into_place(partial, out)
    return out


def read_training_config(folder: Path) -> dict:
    path = folder / "training_config.yaml"
    if not path.is_file():
        return {}
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def summary(out: Path) -> str:
    """One paragraph for the command line: what was written and how to caption with it."""
    info = layout.read_export_info(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    flag = " --base-model BASE" if info["weights"] == "adapter" else ""
    return (
        f"exported {info['weights']} model to {out} ({size / 1e6:.1f} MB; model card {out / layout.CARD_FILE})\n"
        f"caption with: davir-caption --checkpoint {shlex.quote(str(out))}{flag} --pairs PAIRS\n"
        f"publish with: huggingface_hub.upload_folder(repo_id=..., folder_path={json.dumps(str(out))})"
    )
