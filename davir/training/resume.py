"""What `train.py --resume` may change: the settings given now, compared with the run's own config.yaml.

A resumed run continues the checkpoint's weights, optimizer, scheduler, RNG and data order. Each key of
the config is in one of three groups:

* **bookkeeping** (how often to log, validate and save, how many checkpoints to keep, data loading speed,
  where a moved dataset was): takes effect from the resume on;
* **optimisation** (`optim.lr`, `weight_decay`, `max_grad_norm`, the schedule and the run's length): set on
  the restored optimizer and scheduler — the schedule's base rate, the current rate recomputed on the new
  schedule at the resume step — so training continues with the new values;
* **everything else** (the method, model, data, loss weights, batch size, seed, the val measure that
  selects `best/`): it would change what is trained or what `best/` is chosen by, so the resume stops
  (ConfigError, exit 2) naming each key with the run's value and the new one.

Changes of the first two groups are printed as a `note:` and recorded in run_info.json `resume_changes`
(`step`: the first optimizer step trained with the new value); config.yaml holds the values in force now.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from davir.config import ConfigError, from_dict, load_yaml_text
from davir.io import same_place
from davir.runs.config import TrainConfig
from davir.runs.files import read_run_config, read_run_info
from davir.training.run import read_checkpoint_state

UNRECORDED = {
    "run.output_dir",
    "run.overwrite",
}  # where the run folder is now (a moved or copied run), not how it trains
BOOKKEEPING = {
    "run.log_every",
    "run.eval_every",
    "run.save_every",
    "run.keep_checkpoints",
    "run.trackers",
    "run.tensorboard",
    "run.val_show",
    "data.num_workers",
    "data.preload_features_gb",
    "data.moved_from",
}
OPTIMISATION = {
    "optim.lr",
    "optim.weight_decay",
    "optim.max_grad_norm",
    "optim.max_steps",
    "optim.epochs",
    "optim.schedule",
    "optim.warmup_ratio",
}
SCHEDULE = {"optim.lr", "optim.max_steps", "optim.epochs", "optim.schedule", "optim.warmup_ratio"}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a nested mapping (lists stay whole)."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def run_config(run_dir: Path) -> TrainConfig | None:
    """The TrainConfig the run was trained with (None for a folder without config.yaml); checked by read_run_config."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    read_run_config(path)  # a damaged file is a DataError naming the file and the key
    return from_dict(TrainConfig, load_yaml_text(path.read_text(encoding="utf-8")) or {}, where=str(path))


def _moved_root(key: str, old: dict, new: dict) -> bool:
    """data.root may change when data.moved_from names the run's root: the same dataset, moved (docs/errors.md)."""
    return (
        key == "data.root"
        and new.get("data.moved_from") not in (None, "")
        and Path(str(new["data.moved_from"])).expanduser().resolve()
        == Path(str(old["data.root"])).expanduser().resolve()
    )


def resume_changes(
    old: TrainConfig, new: TrainConfig, *, run_dir: Path, step: int, trained_from: Path | None = None
) -> list[dict]:
    """The changed keys a resume at checkpoint `step` may apply, as run_info.json records them; a ConfigError
    naming every key that cannot change on resume. A path given another way is no change (`davir.io.same_place`;
    `trained_from`: the folder the run's relative paths are relative to, run_info.json's cwd)."""
    before, after = flatten(dataclasses.asdict(old)), flatten(dataclasses.asdict(new))
    changed = sorted(
        key
        for key in before.keys() | after.keys()
        if before.get(key) != after.get(key)
        and key not in UNRECORDED
        and not same_place(before.get(key), after.get(key), trained_from)
    )
    refused = [key for key in changed if key not in BOOKKEEPING | OPTIMISATION and not _moved_root(key, before, after)]
    if refused:
        listed = ", ".join(f"{key} ({before.get(key)!r} -> {after.get(key)!r})" for key in refused)
        raise ConfigError(
            f"--resume: {Path(run_dir) / 'config.yaml'} was trained with other values of setting(s) that "
            f"cannot change mid-run: {listed}. Resume with the run's values, or start a new run "
            "(another run.output_dir)"
        )
    return [{"step": step + 1, "key": key, "from": before.get(key), "to": after.get(key)} for key in changed]


@dataclasses.dataclass
class ResumePlan:
    step: int = 0  # the checkpoint's step (0: a fresh start)
    changes: list[dict] = dataclasses.field(default_factory=list)  # applied by this resume
    history: list[dict] = dataclasses.field(default_factory=list)  # run_info.json's resume_changes after it

    def check_length(self, max_steps: int) -> None:
        """A run made shorter than the step its checkpoint reached cannot be resumed to that length."""
        if max_steps < self.step:
            raise ConfigError(
                f"--resume: the new length of the run, {max_steps} optimizer steps (optim.max_steps / "
                f"optim.epochs), is below step {self.step} that its checkpoint reached"
            )


def plan_resume(run_dir: Path, checkpoint: Path | None, config: TrainConfig) -> ResumePlan:
    """What a resume from `checkpoint` changes; a ConfigError for a change that cannot be applied. Called
    before the task is built: a refused resume writes nothing."""
    if checkpoint is None:
        return ResumePlan()
    step = read_checkpoint_state(checkpoint)["step"]
    old = run_config(run_dir)
    info = read_run_info(run_dir) or {}
    trained_from = Path(info["cwd"]) if isinstance(info.get("cwd"), str) else None
    changes = (
        resume_changes(old, config, run_dir=run_dir, step=step, trained_from=trained_from) if old is not None else []
    )
    earlier = info.get("resume_changes", [])
    return ResumePlan(step, changes, merged_history(earlier, changes, step=step))


def apply_to_optimizer(changes: list[dict], config: TrainConfig, optimizer, scheduler) -> tuple[float, float] | None:
    """Put the changed optimisation values into the restored optimizer and scheduler (which `load_state`
    filled with the run's old ones). Returns the learning rate before and after when the schedule changed."""
    keys = {change["key"] for change in changes}
    if "optim.weight_decay" in keys:  # (max_grad_norm is read from the config at each step)
        for group in optimizer.param_groups:
            group["weight_decay"] = config.optim.weight_decay
    if not keys & SCHEDULE:
        return None
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate's wrapper
    before = float(optimizer.param_groups[0]["lr"])
    # The schedule's shape and length come from the config the scheduler was built with; its base rate and
    # step count came from the checkpoint: set the base rate, then the rate at this step on the new schedule.
    inner.base_lrs = [config.optim.lr for _ in inner.base_lrs]
    rates = [base * factor(inner.last_epoch) for factor, base in zip(inner.lr_lambdas, inner.base_lrs)]
    for group, rate in zip(optimizer.param_groups, rates):
        group["initial_lr"], group["lr"] = config.optim.lr, rate
    inner._last_lr = list(rates)
    return before, float(rates[0])


def describe_changes(changes: list[dict], rates: tuple[float, float] | None) -> str:
    listed = ", ".join(f"{c['key']} {c['from']!r} -> {c['to']!r}" for c in changes)
    text = f"resumed with changed settings from step {changes[0]['step']} (recorded in run_info.json resume_changes): {listed}"
    if rates is not None:
        text += f"; learning rate now {rates[1]:.3g} (was {rates[0]:.3g})"
    return text


def merged_history(earlier: list[dict], changes: list[dict], *, step: int) -> list[dict]:
    """run_info.json's resume_changes after a resume at `step`: an earlier change recorded after this step
    (its checkpoint was lost or damaged) now takes effect from here, as config.yaml already holds it; one
    found again (a kill before config.yaml was rewritten) is recorded once."""

    def same(change: dict) -> tuple:
        return change["key"], repr(change.get("from")), repr(change.get("to"))

    again = {same(change) for change in changes}
    kept = [
        {**change, "step": min(change["step"], step + 1)}
        for change in earlier
        if not (change["step"] >= step + 1 and same(change) in again)
    ]
    return kept + changes
