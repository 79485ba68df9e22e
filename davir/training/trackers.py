"""Experiment trackers (`run.trackers`): TensorBoard, Weights & Biases, Trackio and MLflow, through Accelerate's
own `log_with`, each writing under the run folder and offline unless the user's environment says otherwise.

    check_installed(config.run.trackers)     # before anything is built: a missing package is a ConfigError
    accelerator = Accelerator(log_with=config.run.trackers or None, ...)
    start(accelerator, config.run.trackers, run_dir, config=task.tracker_config(), resume=resume)
    log_samples(accelerator, sample_rows(val_dataset, shown, references), step=step)   # at each validation

Every tracker gets the same scalars (`accelerator.log`: train losses, lr, pairs/s, epoch; val loss and metrics),
the run's config (flat key/values) and, at each validation, a table of the `run.val_show` sample captions with
their before/after images. Where each one writes, and the variable of its own that moves it:

* **tensorboard** — RUN/logs/train/ (event files; `tensorboard --logdir RUN/logs`).
* **wandb** — RUN/logs/wandb/offline-run-*/ in offline mode (the sample tables' images staged in its data/);
  `WANDB_MODE` (e.g. `online`), `WANDB_DIR` and `WANDB_DATA_DIR`, when set, are wandb's own. An offline run is
  uploaded later with `wandb sync RUN/logs/wandb/offline-run-*`.
* **trackio** — RUN/logs/trackio/train.db (project `train`, run named after the run folder; view with
  `TRACKIO_DIR=RUN/logs/trackio trackio show --project train`); `TRACKIO_DIR`, when set, is trackio's own.
* **mlflow** — a file store RUN/logs/mlruns (experiment `train`, or `MLFLOW_EXPERIMENT_NAME`; view with
  `mlflow ui --backend-store-uri RUN/logs/mlruns`); `MLFLOW_TRACKING_URI`, when set, is MLflow's own. MLflow 3
  refuses a file store unless `MLFLOW_ALLOW_FILE_STORE=true`, which is set for this process when the store is ours.

A `--resume`d run continues its trackio run; wandb and MLflow record the resumed session as a new run of the same
project / experiment, TensorBoard as new event files in the same folder (steps continue either way).

The names and `run.tensorboard`'s alias are resolved with the config (davir.runs.config.resolve_trackers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from davir.config import ConfigError
from davir.errors import install_hint
from davir.runs.config import TRACKERS

# what to pip install for each (accelerate accepts mlflow-skinny, the light distribution, as well as mlflow)
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow-skinny"}
# Accelerate's project name: TensorBoard's RUN/logs/train, the wandb project, trackio's project, MLflow's experiment
PROJECT = "train"
SAMPLE_IMAGE_SIDE = 256  # the long side of each image in the sample tables, px
_started_mlflow_runs: set[str] = set()  # MLflow runs this process started (a failed run leaves its run active)
_our_mlflow_uri: str | None = None  # the file store last chosen here (MLflow puts it in MLFLOW_TRACKING_URI)


def available(name: str) -> bool:
    """Whether `name`'s package is installed, by the test Accelerate itself makes (which silently drops a tracker
    whose package is missing: `check_installed` turns that into an error)."""
    from accelerate.utils import is_mlflow_available, is_tensorboard_available, is_trackio_available, is_wandb_available

    checks = {
        "tensorboard": is_tensorboard_available,
        "wandb": is_wandb_available,
        "trackio": is_trackio_available,
        "mlflow": is_mlflow_available,
    }
    return checks[name]()


def check_installed(names: Sequence[str]) -> None:
    """A ConfigError naming the pip install for every tracker of `names` whose package is missing."""
    missing = [name for name in names if not available(name)]
    if missing:
        packages = " ".join(PACKAGES[name] for name in missing)
        installed = ", ".join(name for name in TRACKERS if available(name)) or "none"
        hint = install_hint(*missing)  # davir[trackers], and the packages themselves as the other way
        alternative = "" if hint == f"pip install {packages}" else f"or pip install {packages}; "
        raise ConfigError(
            f"run.trackers lists {', '.join(missing)} but the package is not installed: {hint} "
            f"({alternative}or remove {'it' if len(missing) == 1 else 'them'} from run.trackers; "
            f"installed trackers: {installed})"
        )


def wandb_kwargs(run_dir: Path) -> dict[str, Any]:
    """wandb.init's arguments: offline unless WANDB_MODE is set, its folder under RUN/logs unless WANDB_DIR is;
    a run left open in this process (a failed earlier run of a sweep) is finished first instead of reused."""
    kwargs: dict[str, Any] = {"name": run_dir.name, "reinit": "finish_previous"}
    if not os.environ.get("WANDB_MODE"):
        kwargs["mode"] = "offline"
    if not os.environ.get("WANDB_DIR"):
        kwargs["dir"] = str(run_dir / "logs")
    return kwargs


def point_trackio_at(folder: Path) -> None:
    """Make trackio store under `folder`. trackio reads TRACKIO_DIR once, when first imported, into constants of
    several of its modules: they are all rebound, so each run of one process (a sweep) writes in its own folder."""
    import trackio.utils  # noqa: F401  (loaded, so that each of its modules' constants is there to rebind)

    folder = Path(folder).resolve()
    paths = {"TRACKIO_DIR": folder, "MEDIA_DIR": folder / "media", "ARTIFACTS_DIR": folder / "artifacts"}
    for name, module in list(sys.modules.items()):
        if name == "trackio" or name.startswith("trackio."):
            for attr, path in paths.items():
                if isinstance(getattr(module, attr, None), Path):
                    setattr(module, attr, path)


def trackio_kwargs(run_dir: Path, *, resume: bool) -> dict[str, Any]:
    """trackio.init's arguments (its store pointed under RUN/logs/trackio unless TRACKIO_DIR is set); a resumed
    run continues the trackio run of its name. No CPU/GPU sampling thread: the run's own metrics only. A run left
    open in this process (a failed earlier run of a sweep) is finished first, so what it had queued is written to
    its own store."""
    import trackio

    left = trackio.context_vars.current_run.get()
    if left is not None:  # (Accelerate's end_training finishes a run without clearing it: finish only an open one)
        stopped = getattr(left, "_stop_flag", None)
        if stopped is None or not stopped.is_set():
            left.finish()
        trackio.context_vars.current_run.set(None)
    if not os.environ.get("TRACKIO_DIR"):
        point_trackio_at(run_dir / "logs" / "trackio")
    return {
        "name": run_dir.name,
        "resume": "allow" if resume else "never",
        "auto_log_cpu": False,
        "auto_log_gpu": False,
    }


def mlflow_kwargs(run_dir: Path) -> dict[str, Any]:
    """MLflowTracker's arguments; the tracking store is a file store RUN/logs/mlruns unless MLFLOW_TRACKING_URI is
    set (by the user: MLflow sets that variable itself for the URI it is given, so the one set here for an earlier
    run of this process is told apart). An MLflow run this process started and a failure left active is ended
    (FAILED) first, in its own store."""
    global _our_mlflow_uri
    import mlflow

    active = mlflow.active_run()
    if active is not None and active.info.run_id in _started_mlflow_runs:
        mlflow.end_run(status="FAILED")
    user_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not user_uri or user_uri == _our_mlflow_uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store without it
        store = (run_dir / "logs" / "mlruns").resolve()
        store.mkdir(parents=True, exist_ok=True)
        _our_mlflow_uri = store.as_uri()
        mlflow.set_tracking_uri(_our_mlflow_uri)
    return {"run_name": run_dir.name}


def init_kwargs(names: Sequence[str], run_dir: Path, *, resume: bool) -> dict[str, dict[str, Any]]:
    """Accelerate's `init_trackers(init_kwargs=...)`: {tracker: its arguments}."""
    run_dir = Path(run_dir)
    kwargs: dict[str, dict[str, Any]] = {}
    if "wandb" in names:
        kwargs["wandb"] = wandb_kwargs(run_dir)
    if "trackio" in names:
        kwargs["trackio"] = trackio_kwargs(run_dir, resume=resume)
    if "mlflow" in names:
        kwargs["mlflow"] = mlflow_kwargs(run_dir)
    return kwargs


def start(accelerator, names: Sequence[str], run_dir: Path, *, config: dict, resume: bool = False) -> None:
    """Start the trackers `accelerator` was made with (`log_with=names`) and record the run's config in each."""
    if not names:
        return
    # only the main process starts trackers (Accelerate's init_trackers is on_main_process): the others set nothing
    kwargs = init_kwargs(names, run_dir, resume=resume) if accelerator.is_main_process else {}
    accelerator.init_trackers(PROJECT, config=config, init_kwargs=kwargs)
    if accelerator.is_main_process and "mlflow" in names:
        tracker = accelerator.get_tracker("mlflow", unwrap=True)
        if tracker is not None and hasattr(tracker, "info"):
            _started_mlflow_runs.add(tracker.info.run_id)


# --- the sample table of each validation --------------------------------------------------------------------------


@dataclasses.dataclass
class SampleRow:
    pair_id: str
    caption: str  # the model's
    references: list[str]
    before: Any = None  # PIL images, at most SAMPLE_IMAGE_SIDE px; None where the pair's images could not be read
    after: Any = None

    @property
    def reference(self) -> str:
        return " / ".join(self.references)


def sample_rows(
    dataset,
    shown: Sequence[tuple[str, str]],
    references: dict[str, list[str]],
    *,
    size_policy: str = "resize_before_to_after",
    side: int = SAMPLE_IMAGE_SIDE,
) -> list[SampleRow]:
    """The rows of the sample table: (pair id, caption) of `shown`, the references, and the pair's images from
    `dataset.pairs` (a ChangeCaptionDataset), reduced to `side` px. A pair whose images cannot be read (moved
    since the features were cached) keeps its text; the table is a view, it never stops training."""
    from davir.data.images import load_pair
    from davir.errors import DataError

    pairs = {pair.pair_id: pair for pair in getattr(dataset, "pairs", ())}
    rows = []
    for pair_id, caption in shown:
        row = SampleRow(pair_id, caption, list(references.get(pair_id, [])))
        pair = pairs.get(pair_id)
        if pair is not None:
            try:
                before, after = load_pair(pair, size_policy=size_policy, max_side=side)
            except (DataError, OSError):
                pass
            else:
                before.thumbnail((side, side))
                after.thumbnail((side, side))
                row.before, row.after = before, after
        rows.append(row)
    return rows


def _side_by_side(row: SampleRow):
    """before | after as one HWC uint8 array (for TensorBoard)."""
    import numpy as np
    from PIL import Image

    width, height = row.before.width + 4 + row.after.width, max(row.before.height, row.after.height)
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(row.before, (0, 0))
    canvas.paste(row.after, (row.before.width + 4, 0))
    return np.asarray(canvas)


def _markdown(rows: Sequence[SampleRow]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| pair | caption | reference(s) |", "| --- | --- | --- |"]
    lines += [f"| {cell(r.pair_id)} | {cell(r.caption)} | {cell(r.reference)} |" for r in rows]
    return "\n".join(lines)


def tensorboard_samples(tracker, rows: Sequence[SampleRow], step: int) -> None:
    """TensorBoard: the table as markdown text `val/samples`, each pair's before|after as image `val/samples/ID`."""
    writer = tracker.writer
    writer.add_text("val/samples", _markdown(rows), global_step=step)
    for row in rows:
        if row.before is not None:
            writer.add_image(f"val/samples/{row.pair_id}", _side_by_side(row), global_step=step, dataformats="HWC")
    writer.flush()


COLUMNS = ["pair", "before", "after", "caption", "reference"]


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """os.environ with `values` set for the block, as it was after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def wandb_samples(tracker, rows: Sequence[SampleRow], step: int) -> None:
    """wandb: a wandb.Table `val/samples` with the images as wandb.Image. wandb keeps a table's media in a run
    artifact staged under WANDB_DATA_DIR (the user's data folder) until it is synced: unless WANDB_DATA_DIR is set,
    the staging is the offline run's own folder, so RUN/logs/wandb holds the whole record."""
    import wandb

    def image(value):
        return wandb.Image(value) if value is not None else None

    table = wandb.Table(
        columns=COLUMNS, data=[[r.pair_id, image(r.before), image(r.after), r.caption, r.reference] for r in rows]
    )
    staging = {} if os.environ.get("WANDB_DATA_DIR") else {"WANDB_DATA_DIR": str(Path(tracker.run.dir).parent / "data")}
    with _environ(staging):
        tracker.run.log({"val/samples": table}, step=step)


def trackio_samples(tracker, rows: Sequence[SampleRow], step: int) -> None:
    """trackio: a trackio.Table `val/samples` with the images as trackio.Image."""
    import trackio

    def image(value):
        return trackio.Image(value) if value is not None else None

    table = trackio.Table(
        columns=COLUMNS, data=[[r.pair_id, image(r.before), image(r.after), r.caption, r.reference] for r in rows]
    )
    tracker.run.log({"val/samples": table}, step=step)


def mlflow_samples(tracker, rows: Sequence[SampleRow], step: int) -> None:
    """MLflow: a table artifact val_samples/step_N.json (`log_table`; the images as its image columns, stored
    beside it under table_images/), shown in the run's Artifacts and the Evaluation view."""
    import mlflow

    data: dict[str, list] = {
        "pair": [r.pair_id for r in rows],
        "caption": [r.caption for r in rows],
        "reference": [r.reference for r in rows],
        "step": [step] * len(rows),
    }
    if rows and all(r.before is not None for r in rows):  # a column may not mix images and empty cells
        data["before"] = [r.before for r in rows]
        data["after"] = [r.after for r in rows]
    with warnings.catch_warnings():  # MLflow's own use of pandas' select_dtypes, deprecated in pandas 3
        warnings.filterwarnings("ignore", message=".*select_dtypes.*")
        mlflow.MlflowClient().log_table(
            tracker.active_run.info.run_id, data=data, artifact_file=f"val_samples/step_{step}.json"
        )


SAMPLE_LOGGERS = {
    "tensorboard": tensorboard_samples,
    "wandb": wandb_samples,
    "trackio": trackio_samples,
    "mlflow": mlflow_samples,
}


def wants_samples(accelerator) -> bool:
    """Whether a started tracker takes the sample table (so validation reads the images only then)."""
    return any(getattr(tracker, "name", None) in SAMPLE_LOGGERS for tracker in accelerator.trackers)


def log_samples(accelerator, rows: Sequence[SampleRow], *, step: int) -> None:
    """Send the sample table to every started tracker (main process; the caller is there)."""
    if not rows:
        return
    for tracker in accelerator.trackers:
        logger = SAMPLE_LOGGERS.get(getattr(tracker, "name", None))
        if logger is not None:
            logger(tracker, rows, step)
