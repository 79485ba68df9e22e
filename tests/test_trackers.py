"""run.trackers: a tiny training logs the same scalars, config and sample table to TensorBoard, wandb (offline),
trackio (local store) and MLflow (file store), each under RUN/logs; names and packages are checked at start-up.

Every record is read back with the tracker's own reader (TensorBoard's EventAccumulator, MLflow's client, trackio's
SQLite store, the protobuf records of wandb's offline .wandb file). No network: wandb offline, HF_HUB_OFFLINE.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from davir.config import ConfigError, load_config
from davir.runs.config import TrainConfig
from davir.training import trackers

REPO = Path(__file__).resolve().parents[1]
ALL = "run.trackers=[tensorboard,wandb,trackio,mlflow]"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No network, and nothing of a tracker outside tmp_path: wandb's config/cache folders, the trackers' own
    location variables unset (so the run folder's defaults are what is tested)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    for name in (
        "WANDB_DIR",
        "WANDB_DATA_DIR",
        "TRACKIO_DIR",
        "TRACKIO_SPACE_ID",
        "TRACKIO_SERVER_URL",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_EXPERIMENT_NAME",
        "MLFLOW_RUN_ID",
        "MLFLOW_ALLOW_FILE_STORE",
    ):
        monkeypatch.setenv(name, "")  # recorded, so the variable set during the test is restored (removed) after it
        monkeypatch.delenv(name)
    yield
    if "mlflow" in sys.modules:  # the tracking URI is process-wide: leave no run folder's store behind
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)


def davir_config(root: Path, out: Path, *extra: str) -> TrainConfig:
    """The demo config on tiny weights: 3 steps, validation (and the sample table) at the last one."""
    return load_config(
        TrainConfig,
        REPO / "configs" / "demo.yaml",
        [
            f"data.root={root}",
            "data.masks=null",
            "data.entities=null",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=false",
            "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
            "optim.batch_size=4",
            "optim.max_steps=3",
            "run.log_every=1",
            "run.eval_every=3",
            "run.save_every=0",
            "run.val_max_pairs=2",
            "run.val_show=2",
            "run.max_new_tokens=4",
            f"run.output_dir={out}",
            *extra,
        ],
    )


def train_losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows}


# --- each tracker's offline record, read with its own reader -------------------------------------------------------


def tensorboard_record(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "logs" / "train"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def wandb_records(run_dir: Path) -> list:
    """The protobuf Records of the run's offline .wandb file (LevelDB log format: 7-byte header ':W&B' + magic +
    version, then 32 KiB blocks of chunks: crc32c (4), length (2), type (1: full, 2: first, 3: middle, 4: last))."""
    from wandb.proto import wandb_internal_pb2

    [path] = (run_dir / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, position = [], b"", 7
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a chunk header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    """The logged rows, each {key: value}; a media value (nested keys: `val/samples`, `_type`, …) as a dict."""
    history = []
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            row: dict = {}
            for item in record.history.item:
                *parents, last = [item.key] if item.key else list(item.nested_key)
                node = row
                for parent in parents:
                    node = node.setdefault(parent, {})
                node[last] = json.loads(item.value_json)
            history.append(row)
    return history


def trackio_metrics(run_dir: Path) -> dict[int, dict]:
    """{step: logged values} of the run in trackio's local store (one SQLite file per project)."""
    with sqlite3.connect(run_dir / "logs" / "trackio" / f"{trackers.PROJECT}.db") as db:
        rows = db.execute(
            "SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY step", (run_dir.name,)
        ).fetchall()
    found: dict[int, dict] = {}
    for step, metrics in rows:
        found.setdefault(step, {}).update(json.loads(metrics))
    return found


def mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "logs" / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name(trackers.PROJECT)
    [run] = client.search_runs([experiment.experiment_id])
    return client, run


# --- the tests -------------------------------------------------------------------------------------------------------


def test_every_tracker_holds_the_train_loss_and_the_sample_table(synthetic_set, tmp_path, offline):
    """The issue's check: a 3-step demo training with all four trackers leaves each one's offline record holding
    the train loss of every step (the values train_log.jsonl has), the val metrics, the config and the table of
    sample captions with their images."""
    from davir.training.loop import train

    root = synthetic_set(16, 4)
    run_dir = train(davir_config(root, tmp_path / "run", ALL))
    losses = train_losses(run_dir)
    assert sorted(losses) == [1, 2, 3]
    shown = list(json.loads((run_dir / "val" / "step_3.json").read_text())["predictions"])[:2]

    events = tensorboard_record(run_dir)
    assert {e.step: e.value for e in events.Scalars("train/loss")} == pytest.approx(losses, rel=1e-6)
    assert [e.step for e in events.Scalars("val/CIDEr")] == [3]
    assert {f"val/samples/{pair_id}" for pair_id in shown} <= set(events.Tags()["images"])
    [text] = events.Tensors("val/samples/text_summary")
    assert all(pair_id in text.tensor_proto.string_val[0].decode() for pair_id in shown)

    history = wandb_history(run_dir)
    logged = {row["_step"]: row["train/loss"] for row in history if "train/loss" in row}
    assert logged == pytest.approx(losses, rel=1e-6)
    [table] = [row["val/samples"] for row in history if "val/samples" in row]
    assert table["_type"] == "table-file" and table["nrows"] == 2
    # the table and its images: a run artifact whose files are staged inside the offline run's folder
    records = wandb_records(run_dir)
    [artifact] = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    files = {entry.path: Path(entry.local_path) for entry in artifact.manifest.contents}
    assert all((run_dir / "logs" / "wandb") in path.parents and path.is_file() for path in files.values())
    rows = json.loads(files["val/samples.table.json"].read_text())
    assert rows["columns"] == trackers.COLUMNS and [row[0] for row in rows["data"]] == shown
    assert all(row[1]["_type"] == "image-file" and row[1]["path"] in files for row in rows["data"])
    configs = [r.config for r in records if r.WhichOneof("record_type") == "config"]
    assert any(item.key == "optim.lr" for config in configs for item in config.update)

    metrics = trackio_metrics(run_dir)
    assert {step: values["train/loss"] for step, values in metrics.items() if "train/loss" in values} == pytest.approx(
        losses, rel=1e-6
    )
    assert "val/CIDEr" in metrics[3]
    samples = metrics[3]["val/samples"]
    assert samples["_type"] == "trackio.table"
    assert [row["pair"] for row in samples["_value"]] == shown
    assert all(row["before"]["_type"] == "trackio.image" for row in samples["_value"])
    assert any((run_dir / "logs" / "trackio" / "media").rglob("*.png"))

    client, run = mlflow_run(run_dir)
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert {m.step: m.value for m in history} == pytest.approx(losses, rel=1e-6)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/CIDEr")] == [3]
    assert run.data.params["optim.max_steps"] == "3" and run.info.run_name == run_dir.name
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "val_samples/step_3.json", str(tmp_path))).read_text()
    )
    assert [row[table["columns"].index("pair")] for row in table["data"]] == shown
    assert table["data"][0][table["columns"].index("before")]["type"] == "image"


def test_lightweight_method_logs_through_the_same_trackers(synthetic_set, tmp_path, offline):
    """A lightweight method trains through the same loop: its losses, val metrics and sample table reach MLflow."""
    from davir.jobs.features import main as features_main
    from davir.training.loop import train

    root = synthetic_set(16, 4)
    features = tmp_path / "features"
    weights = REPO / "davir" / "assets" / "tiny_resnet" / "backbone.pth"  # the demo's tiny ResNet: fast on a CPU
    for split in ("train", "val"):
        assert (
            features_main(
                [
                    "--format",
                    "clevr_change",
                    "--root",
                    str(root),
                    "--split",
                    split,
                    "--out",
                    str(features),
                    "--weights",
                    str(weights),
                    "--workers",
                    "0",
                    "--batch-size",
                    "32",
                    "--no-progress",
                ]
            )
            == 0
        )
    config = load_config(
        TrainConfig,
        None,
        [
            "method=subtraction",
            "data.format=clevr_change",
            f"data.root={root}",
            f"data.features={features}",
            "lightweight.hidden=16",
            "lightweight.heads=2",
            "lightweight.word_emb=8",
            "lightweight.ffn_dim=32",
            "lightweight.layers=1",
            "lightweight.encoder_layers=1",
            "lightweight.max_len=16",
            "optim.batch_size=4",
            "optim.max_steps=3",
            "optim.lr=1e-3",
            "run.eval_every=3",
            "run.val_max_pairs=4",
            "run.val_show=2",
            "run.log_every=1",
            "run.trackers=[mlflow]",
            f"run.output_dir={tmp_path / 'run'}",
        ],
    )
    run_dir = train(config)
    assert not (run_dir / "logs" / "train").exists()  # run.trackers=[mlflow]: no TensorBoard
    client, run = mlflow_run(run_dir)
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")} == pytest.approx(
        train_losses(run_dir), rel=1e-6
    )
    assert "val/loss" in run.data.metrics and run.data.params["method"] == "subtraction"
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "val_samples/step_3.json", str(tmp_path))).read_text()
    )
    assert len(table["data"]) == 2 and {"before", "after"} <= set(table["columns"])  # the pairs' images, as for DAVIR


def test_each_run_of_one_process_writes_in_its_own_folder(tmp_path, offline):
    """A sweep trains its runs in one process, and a failed run never reaches end_training: the next run still
    logs into its own folder's trackio store and MLflow file store (trackio reads its folder once, at import;
    MLflow keeps the URI it was given in MLFLOW_TRACKING_URI), and the failed run's record stays in its own."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    names = ["trackio", "mlflow"]
    for index, run_dir in enumerate([tmp_path / "failed", tmp_path / "next"]):
        accelerator = Accelerator(
            cpu=True,
            log_with=names,
            project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        )
        trackers.start(accelerator, names, run_dir, config={"index": index})
        accelerator.log({"train/loss": 10.0 * index + 1}, step=1)
    accelerator.end_training()  # the first run was left open, as an exception leaves it
    for index, run_dir in enumerate([tmp_path / "failed", tmp_path / "next"]):
        assert trackio_metrics(run_dir) == {1: {"train/loss": 10.0 * index + 1}}
        client, run = mlflow_run(run_dir)
        assert run.data.metrics == {"train/loss": 10.0 * index + 1}
        assert run.info.status == ("FAILED" if index == 0 else "FINISHED")


def test_unknown_tracker_is_a_config_error_listing_the_valid_ones():
    with pytest.raises(
        ConfigError,
        match=r"run\.trackers: unknown tracker 'tensorbord'.*valid: tensorboard, wandb, "
        r"trackio, mlflow",
    ):
        load_config(TrainConfig, None, ["run.trackers=[tensorbord]"])


def test_run_tensorboard_is_a_deprecated_alias():
    """run.tensorboard=false (the configs and sweeps that set it) is no TensorBoard whatever run.trackers lists;
    true adds it; unset leaves run.trackers alone. config.yaml's values load back to the same trackers."""

    def trackers_of(*overrides):
        return load_config(TrainConfig, None, list(overrides)).run.trackers

    assert trackers_of() == ["tensorboard"]
    assert trackers_of("run.tensorboard=false") == []
    assert trackers_of("run.trackers=[tensorboard,wandb]", "run.tensorboard=false") == ["wandb"]
    assert trackers_of("run.trackers=[mlflow]", "run.tensorboard=true") == ["tensorboard", "mlflow"]
    assert trackers_of("run.trackers=[wandb,wandb]") == ["wandb"] and trackers_of("run.trackers=[]") == []
    assert load_config(TrainConfig, REPO / "configs" / "scorer_demo.yaml").run.trackers == []  # tensorboard: false
    config = load_config(TrainConfig, None, ["run.trackers=[tensorboard,trackio]", "run.tensorboard=true"])
    assert trackers_of(
        *(
            f"run.{key}={json.dumps(value)}"
            for key, value in vars(config.run).items()
            if key in ("trackers", "tensorboard")
        )
    ) == ["tensorboard", "trackio"]


def test_trackers_may_change_on_resume():
    from davir.training.resume import resume_changes

    old = load_config(TrainConfig, None, ["run.tensorboard=false"])
    new = load_config(TrainConfig, None, ["run.trackers=[tensorboard,mlflow]"])
    changes = resume_changes(old, new, run_dir=Path("run"), step=4)
    assert {"step": 5, "key": "run.trackers", "from": [], "to": ["tensorboard", "mlflow"]} in changes


def test_a_missing_tracker_package_is_an_error_naming_the_pip_install(synthetic_set, tmp_path, monkeypatch):
    """Accelerate drops a tracker whose package is missing without a word: the run stops at once instead, naming
    what to install, before the model is built or the run folder made."""
    from davir.training.loop import train

    monkeypatch.setattr(trackers, "available", lambda name: name not in ("wandb", "mlflow"))
    with pytest.raises(
        ConfigError,
        match=r"lists wandb, mlflow but the package is not installed: "
        r"pip install 'davir\[trackers\]' \(or pip install wandb mlflow-skinny; ",
    ):
        train(davir_config(synthetic_set(16, 4), tmp_path / "run", ALL))
    assert not (tmp_path / "run").exists()
