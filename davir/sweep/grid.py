"""Train and score a grid of runs (variants × seeds) and summarise it as one table of mean ± std.

    sweep = load_sweep("configs/sweeps/ablation_demo.yaml")
    run_sweep(sweep, seeds=[0], split="val")     # what `python -m davir.sweep` runs (davir.cli.sweep)

Cells, resuming, `vars:` and the summary: docs/recipes.md, "Set-up, the demo targets and their knobs".
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from davir.compare.seed_spread import (
    inside_spread,
    inside_spread_lines,
    metric_at,
    spread_record,
    spread_text,
    value_at,
)
from davir.config import ConfigError, load_config
from davir.errors import DataError, describe_os_error
from davir.io import read_json, same_place, write_json_atomic, write_text_atomic
from davir.metrics.captions import shared_meteor
from davir.runtime.arguments import check_limit
from davir.runtime.cost import COST_FIELDS, DEVICE_PATH


@dataclass(frozen=True)
class Column:
    """One column of the summary table: where its value sits in metrics.json and how it is printed."""

    title: str
    path: tuple[str, ...]
    scale: float = 100.0
    digits: int = 1
    note: str | None = None  # what an unscaled column counts, for the "x100 except …" line


COLUMNS: tuple[Column, ...] = (
    Column("type acc.", ("synthetic", "overall", "type_accuracy")),
    Column("object acc.", ("synthetic", "overall", "object_accuracy")),
    Column("exact", ("synthetic", "overall", "exact_accuracy")),
    Column("none type acc.", ("synthetic", "per_type", "none", "type_accuracy")),
    Column("BLEU-4", ("rows", "total", "metrics", "BLEU-4")),
    Column("METEOR", ("rows", "total", "metrics", "METEOR")),
    Column("ROUGE-L", ("rows", "total", "metrics", "ROUGE_L")),
    Column("CIDEr", ("rows", "total", "metrics", "CIDEr")),
    Column(
        "attn. in mask",
        ("localisation", "attention_share_in_mask"),
        scale=1.0,
        digits=3,
        note="the attention share (share of the patch map FAC supervises inside the ground-truth change mask: "
        "InstructBLIP's last-layer CLS attention, a chat family's map of docs/families.md)",
    ),
    Column(
        "pointing",
        ("localisation", "pointing_accuracy"),
        scale=1.0,
        digits=3,
        note="pointing (share of images whose attention peak lies in the ground-truth change mask)",
    ),
    Column("distinct captions", ("distinct_captions",), scale=1.0, digits=0, note="the number of distinct captions"),
    Column("object F1", ("faithfulness", "rows", "total", "objects", "f1")),
    Column("hallucinated", ("faithfulness", "rows", "total", "hallucination_rate")),
)
# Compute cost (metrics.json "compute", davir.runtime.cost): units in the titles.
COST_COLUMNS: tuple[Column, ...] = tuple(
    Column(title, path, scale, digits) for title, path, scale, digits in COST_FIELDS
)
TYPE_ROWS = ("color", "material", "add", "drop", "move", "distractor")


@dataclass
class Variant:
    name: str
    config: str
    overrides: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "_", self.name.lower()).strip("_")


@dataclass
class Sweep:
    title: str
    out: Path
    variants: list[Variant]
    seeds: list[int]
    split: str = "test"
    seed_keys: list[str] = field(default_factory=lambda: ["run.seed"])
    overrides: list[str] = field(default_factory=list)
    # davir.evaluation.EvaluationOptions fields for every cell (evaluate.py's flags without the dashes)
    evaluate: dict[str, Any] = field(default_factory=lambda: {"spice": False})
    vars: dict[str, str] = field(default_factory=dict)
    path: Path | None = None  # the sweep file, for messages

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else f"sweep {self.title!r}"

    def fill(self, text: str) -> str:
        """`text` with each ``{name}`` replaced by the sweep's variable of that name (an unknown one is an error)."""

        def value(match: re.Match) -> str:
            name = match.group(1)
            if name not in self.vars:
                raise ConfigError(
                    f"sweep {self.title!r}: {text!r} uses {{{name}}} but the sweep has no such variable "
                    f"(vars: {sorted(self.vars)}; set one with --var {name}=VALUE)"
                )
            return self.vars[name]

        return _VARIABLE.sub(value, text)


_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load_sweep(path: str | Path) -> Sweep:
    """Read a sweep YAML (title, out, seeds, split, seed_keys, overrides, evaluate, variants)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read the sweep file ({error})") from error
    unknown = set(raw) - {"title", "out", "variants", "seeds", "split", "seed_keys", "overrides", "evaluate", "vars"}
    if unknown:
        raise ConfigError(f"{path}: unknown sweep keys {sorted(unknown)}")
    variants = raw.get("variants") or []
    if not variants:
        raise ConfigError(f"{path}: no variants")
    parsed = []
    for i, entry in enumerate(variants):
        if not isinstance(entry, dict) or "name" not in entry or "config" not in entry:
            raise ConfigError(f"{path}: variant {i} needs a name and a config")
        parsed.append(Variant(str(entry["name"]), str(entry["config"]), [str(o) for o in entry.get("overrides", [])]))
    slugs = [v.slug for v in parsed]
    if len(set(slugs)) != len(slugs):
        raise ConfigError(f"{path}: variant names must differ after slugging ({slugs})")
    sweep = Sweep(
        title=str(raw.get("title", path.stem)),
        out=Path(raw.get("out", f"runs/{path.stem}")),
        variants=parsed,
        seeds=[int(s) for s in raw.get("seeds", [0])],
        split=str(raw.get("split", "test")),
        path=path,
    )
    for key in ("seed_keys", "overrides"):
        if key in raw:
            setattr(sweep, key, [str(v) for v in raw[key]])
    if "evaluate" in raw:
        sweep.evaluate = _evaluation_settings(raw["evaluate"], path)
    variables = raw.get("vars") or {}
    if not isinstance(variables, dict):
        raise ConfigError(f"{path}: vars must be a mapping of name: value, got {type(variables).__name__}")
    sweep.vars = {str(k): str(v) for k, v in variables.items()}
    return sweep


def set_vars(sweep: Sweep, assignments: list[str]) -> None:
    """Apply ``--var KEY=VALUE`` assignments (a name the sweep file does not declare is an error: a typo)."""
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        if not sep or not name:
            raise ConfigError(f"--var {assignment!r}: expected NAME=VALUE")
        if name not in sweep.vars:
            raise ConfigError(f"--var {name}: the sweep declares no such variable (vars: {sorted(sweep.vars)})")
        sweep.vars[name] = value


def cell_dir(sweep: Sweep, variant: Variant, seed: int) -> Path:
    return sweep.out / variant.slug / f"seed{seed}"


def metrics_path(run: Path, split: str) -> Path | None:
    found = sorted((run / "eval").glob(f"*_{split}/metrics.json"))
    return found[0] if found else None


CELL_RECORD = "sweep_cell.json"


def cell_recipe(sweep: Sweep, variant: Variant, seed: int, extra: list[str]) -> dict[str, Any]:
    """What a cell is trained from: the config file (path and content hash) and every override, variables filled."""
    config = sweep.fill(variant.config)
    try:
        digest = hashlib.sha256(Path(config).read_bytes()).hexdigest()
    except OSError as error:
        raise ConfigError(
            f"sweep variant {variant.name!r}: cannot read its config {config} ({error.strerror})"
        ) from error
    overrides = [sweep.fill(o) for o in (*variant.overrides, *sweep.overrides, *extra)]
    return {
        "config": config,
        "config_sha256": digest,
        "overrides": [*overrides, *(f"{k}={seed}" for k in sweep.seed_keys)],
        "cwd": str(Path.cwd()),  # what its relative paths are relative to; not compared itself
    }


def _unchanged_paths(old: list[str], new: list[str], old_base: str | None) -> tuple[list[str], list[str]]:
    """`old` and `new` overrides without the pairs of one key whose values name the same place
    (`davir.io.same_place`): a sweep rerun from another folder, or with --var given absolutely, is the same cell."""
    old_values = dict(o.split("=", 1) for o in old if "=" in o)
    new_values = dict(o.split("=", 1) for o in new if "=" in o)
    same = {
        key
        for key in old_values.keys() & new_values.keys()
        if old_values[key] != new_values[key] and same_place(old_values[key], new_values[key], old_base)
    }
    return [o for o in old if o.split("=", 1)[0] not in same], [o for o in new if o.split("=", 1)[0] not in same]


def _stale_reason(run: Path, recipe: dict[str, Any]) -> str | None:
    """Why the cell at `run` is not this recipe's (no record, or other settings), or None when it is."""
    record_path = run / CELL_RECORD
    if not record_path.is_file():
        return f"no {CELL_RECORD} says what it was trained with"
    try:
        record = read_json(record_path)
    except DataError as error:
        return str(error)
    if not isinstance(record, dict):
        return f"{record_path} is not a JSON object"
    base = record.get("cwd") if isinstance(record.get("cwd"), str) else None
    changed = [key for key in ("config", "config_sha256") if record.get(key) != recipe[key]]
    if "config" in changed and same_place(record.get("config"), recipe["config"], base):
        changed.remove("config")  # the same file given another way; its content is compared by its sha256
    old, new = _unchanged_paths(record.get("overrides") or [], recipe["overrides"], base)
    differing = [o for o in new if o not in old] + [o for o in old if o not in new]
    if changed or differing:
        what = ", ".join([*(("the config file" if k == "config_sha256" else k) for k in changed), *differing[:4]])
        return f"made with other settings ({what})"
    return None


def check_cells(sweep: Sweep, extra: Sequence[str] = ()) -> None:
    """Before any cell trains: each variant's config loads with its overrides, and the data it is scored on has
    the sweep's split. Either found wrong only when its cell came up, after the cells before it had trained (a
    typo of --split: after training the first cell)."""
    from davir.data.formats import FORMATS
    from davir.runs.config import TrainConfig  # torch: a sweep trains anyway

    seed = sweep.seeds[0] if sweep.seeds else 0
    for variant in sweep.variants:
        recipe = cell_recipe(sweep, variant, seed, list(extra))
        try:
            config = load_config(TrainConfig, recipe["config"], recipe["overrides"])
        except ConfigError as error:
            raise ConfigError(f"sweep variant {variant.name!r}: {error}") from error
        data_format = sweep.evaluate.get("format") or config.data.format
        splits = FORMATS[data_format].splits if data_format in FORMATS else (sweep.split,)
        if sweep.split not in splits:
            raise ConfigError(
                f"split {sweep.split!r}: format {data_format!r}, which variant {variant.name!r} is scored on, has "
                f"no such split; choose from {', '.join(splits)}"
            )


def run_cell(sweep: Sweep, variant: Variant, seed: int, extra: list[str]) -> Path:
    """Train (from scratch; a finished training of the same recipe is kept) and score one cell; returns its metrics.json."""
    run = cell_dir(sweep, variant, seed)
    recipe = cell_recipe(sweep, variant, seed, extra)
    stale = _stale_reason(run, recipe) if run.exists() else None
    if stale is not None:
        print(f"[sweep] {run}: {stale}; training it again", flush=True)
    done = metrics_path(run, sweep.split)
    if done is not None and stale is None:
        return done
    if stale is not None or not (run / "last").is_dir():
        _train_cell(run, recipe, label=f"{variant.name} seed {seed}")
        write_json_atomic(run / CELL_RECORD, recipe)
    _evaluate_cell(run, sweep.split, sweep.evaluate)
    done = metrics_path(run, sweep.split)
    if done is None:
        raise DataError(f"{run}: evaluate.py wrote no metrics.json")
    return done


def _train_cell(run: Path, recipe: dict[str, Any], *, label: str) -> None:
    """Train a cell from scratch into `run` as ``train.py --config CONFIG OVERRIDES`` does (the run folder's
    lock included); any failure is one DataError naming the cell."""
    from davir.runs.config import TrainConfig  # torch: only when a cell is trained
    from davir.training.loop import NonFiniteLoss, train_in_folder

    overrides = [*recipe["overrides"], f"run.output_dir={run}", "run.overwrite=true"]
    try:
        config = load_config(TrainConfig, recipe["config"], overrides)
        run_dir = train_in_folder(config)
    except (ConfigError, DataError, NonFiniteLoss, OSError) as error:
        problem = describe_os_error(error) if isinstance(error, OSError) else str(error)
        raise DataError(f"training {label} failed (run folder {run}): {problem}") from error
    print(f"run folder: {run_dir}", flush=True)


def _evaluation_settings(raw: Any, path: Path) -> dict[str, Any]:
    """The sweep file's `evaluate:` mapping, each key a field of davir.evaluation.EvaluationOptions."""
    from dataclasses import fields

    from davir.evaluation import EvaluationOptions

    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: evaluate must be a mapping of evaluation options (e.g. spice: false), got {type(raw).__name__}"
        )
    known = {f.name for f in fields(EvaluationOptions)} - {"out", "markdown", "echo", "progress"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown evaluate option(s) {unknown}; known: {', '.join(sorted(known))}")
    try:  # before any cell trains: evaluate_run would refuse it only after the first cell's training
        check_limit(raw.get("limit"))
    except DataError as error:
        raise ConfigError(f"{path}: evaluate: {error}") from None
    return {"spice": False, **raw}


def _evaluate_cell(run_dir: Path, split: str, settings: dict[str, Any]) -> None:
    """Score a trained cell on `split` as ``evaluate.py --checkpoint RUN --split SPLIT`` does."""
    from davir.evaluation import evaluate_run

    try:
        evaluate_run(run_dir, split, **settings)
    except (DataError, OSError) as error:
        problem = describe_os_error(error) if isinstance(error, OSError) else str(error)
        raise DataError(f"evaluating {run_dir} failed: {problem}") from error


def _column_values(runs: list[dict[str, Any]], path: tuple[str, ...]) -> list[float]:
    return [v for v in (metric_at(m, path) for m in runs) if v is not None]


def summarise(sweep: Sweep, results: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """Markdown tables (scores; CIDEr per change type; compute cost) and their JSON, from each variant's
    metrics.json files: every cell mean ± std (min–max) over seeds, then the score differences between
    variants that the seed spread cannot settle (davir.compare.seed_spread)."""

    def present(column: Column) -> bool:
        return any(metric_at(m, column.path) is not None for runs in results.values() for m in runs)

    columns = [c for c in COLUMNS if present(c)]
    cost_columns = [c for c in COST_COLUMNS if present(c)]
    seeds = ", ".join(map(str, sweep.seeds))
    unscaled = [c.note or c.title for c in columns if c.scale == 1.0]
    listed = ", ".join(unscaled[:-1]) + " and " + unscaled[-1] if len(unscaled) > 1 else "".join(unscaled)
    scale_note = "x100" + (" except " + listed if unscaled else "")
    lines = [
        f"## {sweep.title}",
        "",
        f"{sweep.split} split; mean ± std (min–max) over seeds {seeds}; {scale_note}.",
        "",
        "| variant | " + " | ".join(c.title for c in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    summary: dict[str, Any] = {"title": sweep.title, "split": sweep.split, "seeds": sweep.seeds, "variants": {}}
    spread_columns: dict[str, dict[str, list[float]]] = {}
    for name, runs in results.items():
        cells, record = [], {}
        for column in columns:
            values = _column_values(runs, column.path)
            cells.append(spread_text(values, column.scale, column.digits))
            record[column.title] = spread_record(values)
            spread_columns.setdefault(column.title, {})[name] = values
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        summary["variants"][name] = record
    types = [t for t in TYPE_ROWS if any(t in m.get("rows", {}) for runs in results.values() for m in runs)]
    if types:
        lines += [
            "",
            "CIDEr per change type (x100, mean ± std (min–max)):",
            "",
            "| variant | " + " | ".join(types) + " |",
            "|---" * (len(types) + 1) + "|",
        ]
        for name, runs in results.items():
            cells = []
            for change_type in types:
                values = _column_values(runs, ("rows", change_type, "metrics", "CIDEr"))
                cells.append(spread_text(values, 100.0))
                summary["variants"][name][f"CIDEr {change_type}"] = values
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if cost_columns:
        lines += [
            "",
            "Compute cost per run (mean ± std (min–max); training wall time includes validation and "
            "checkpoints; peak memory: CUDA allocator on a GPU, process RSS on a CPU):",
            "",
            "| variant | " + " | ".join(c.title for c in cost_columns) + " | device |",
            "|---" * (len(cost_columns) + 2) + "|",
        ]
        for name, runs in results.items():
            cells = []
            for column in cost_columns:
                values = _column_values(runs, column.path)
                cells.append(spread_text(values, column.scale, column.digits))
                summary["variants"][name][column.title] = spread_record(values)
            devices = sorted({str(value_at(m, DEVICE_PATH) or "?") for m in runs})
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {', '.join(devices)} |")
    flags = inside_spread_lines(spread_columns)
    summary["inside_spread"] = {title: inside_spread(values) for title, values in spread_columns.items()}
    if flags and len(results) > 1:
        lines += [
            "",
            "Inside the seed spread (min–max ranges overlap; these seeds do not settle the order):",
            "",
            *flags,
        ]
    return "\n".join(lines) + "\n", summary


@dataclass(frozen=True)
class SweepResult:
    """What `run_sweep` wrote: the Markdown tables, their JSON, and where both are."""

    text: str
    summary: dict[str, Any]
    markdown_path: Path
    json_path: Path


def select_variants(sweep: Sweep, names: Sequence[str]) -> list[Variant]:
    """The sweep's variants named in `names` (names or folder slugs), in the sweep's order; an unknown one is an error."""
    wanted = {Variant(name, "").slug for name in names}
    unknown = wanted - {v.slug for v in sweep.variants}
    if unknown:
        raise ConfigError(f"{sweep.where}: no variants {sorted(unknown)}; it has {[v.slug for v in sweep.variants]}")
    return [v for v in sweep.variants if v.slug in wanted]


def run_sweep(
    sweep: Sweep,
    *,
    seeds: Sequence[int] | None = None,
    variants: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    split: str | None = None,
    out: str | Path | None = None,
) -> SweepResult:
    """Every cell, then the summary (OUT/summary.md and OUT/summary.json; ``summary_SPLIT.*`` off the test split).

    `seeds`, `split` and `out` replace the sweep's own, `variants` (names or slugs) picks some of its variants,
    and `extra` are key=value overrides applied to every cell. `sweep` itself is not changed."""
    sweep = dataclasses.replace(
        sweep,
        seeds=list(seeds or sweep.seeds),
        split=split or sweep.split,
        out=Path(out) if out else sweep.out,
        variants=select_variants(sweep, variants) if variants else sweep.variants,
    )
    check_cells(sweep, extra)
    results: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    with shared_meteor():  # one METEOR java process for all the cells' evaluations
        for variant in sweep.variants:
            results[variant.name] = []
            for seed in sweep.seeds:
                print(f"[sweep] {variant.name} · seed {seed} ({(time.time() - started) / 60:.1f} min)", flush=True)
                results[variant.name].append(read_json(run_cell(sweep, variant, seed, list(extra))))
        text, summary = summarise(sweep, results)
        summary["minutes"] = round((time.time() - started) / 60, 2)
        suffix = "" if sweep.split == "test" else f"_{sweep.split}"  # a val scoring keeps the test summary
        markdown_path, json_path = sweep.out / f"summary{suffix}.md", sweep.out / f"summary{suffix}.json"
        write_text_atomic(markdown_path, text)
        write_json_atomic(json_path, summary)
    return SweepResult(text, summary, markdown_path, json_path)
