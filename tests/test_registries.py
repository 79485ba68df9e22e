"""The segmenter and retriever registries, end to end with components defined here and registered in one line:
`preprocess masks` → `preprocess entities` → the online path of caption.py (davir.preprocessing.online), which
must rebuild both from the caches' manifests and give a pair the masks and entities the caches hold."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import pytest

from davir.data import read_dataset
from davir.data.caches import EntityCache, MaskCache
from davir.data.images import load_pair
from davir.errors import DataError
from davir.jobs import entities, masks
from davir.preprocessing.components import Weights, option
from davir.preprocessing.online import OnlineEntities, OnlineMasks
from davir.preprocessing.retrievers import RETRIEVERS
from davir.preprocessing.segmenters import SEGMENTERS, Candidates


class ToySegmenter:
    """Each prompt's change region R_c dilated by `toy_grow` px: one candidate, score 1."""

    name = "toy"

    @dataclass(frozen=True)
    class Settings:
        toy_grow: int = field(default=1, metadata=option("--toy-grow", "px the change region grows by"))

    def __init__(self, settings: Settings, *, checkpoint=None, device=None):
        self.grow = settings.toy_grow

    def settings(self) -> dict:
        return {"segmenter": self.name, "toy_grow": self.grow}

    def segment(self, requests):
        kernel = np.ones((2 * self.grow + 1, 2 * self.grow + 1), np.uint8)
        return [
            [
                Candidates(cv2.dilate(region.astype(np.uint8), kernel).astype(bool)[None], np.ones(1, np.float32))
                for region in request.regions
            ]
            for request in requests
        ]


class ToyRetriever:
    """Weights = a JSON colour table; a phrase scores −sharpness × the RGB distance of its colour word to the mean
    colour of the changed region (the after one, else the before one); a phrase without a colour word −1000."""

    name = "toy"

    @dataclass(frozen=True)
    class Settings:
        toy_sharpness: float = field(default=1.0, metadata=option("--toy-sharpness", "score per RGB unit"))

    def __init__(self, settings: Settings, *, checkpoint, device=None, folder=None):
        self.sharpness, self.table = settings.toy_sharpness, json.loads(Path(checkpoint).read_text())

    def prepare(self, phrases):
        self.phrases = list(phrases)

    def _scores(self, colour: np.ndarray) -> np.ndarray:
        def one(phrase):
            named = [np.asarray(self.table[w], float) for w in phrase.split() if w in self.table]
            return -self.sharpness * min(np.linalg.norm(colour - c) for c in named) if named else -1000.0

        return np.array([one(p) for p in self.phrases])

    def score(self, pairs):
        rows = []
        for pair in pairs:
            region = pair.before if pair.after.empty else pair.after
            weight = region.mask[..., None]
            rows.append(self._scores((region.crop * weight).sum((0, 1)) / max(weight.sum(), 1e-6)))
        return np.array(rows).reshape(len(pairs), len(self.phrases))

    def frame_scores(self, images):
        return np.array([self._scores(np.asarray(image, float).mean((0, 1))) for image in images])

    def describe(self) -> dict:
        return {"retriever": self.name, "sharpness": self.sharpness}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The toys registered (once each; removed afterwards so other modules see the shipped registries), a tiny
    synthetic set, its toy masks (two worker processes) and toy entities of the test split."""
    SEGMENTERS.register("toy", ToySegmenter.Settings, ToySegmenter, in_workers=True)
    RETRIEVERS.register("toy", ToyRetriever.Settings, ToyRetriever, weights=Weights("toy_table", "--toy-table"))
    try:
        yield _make_world(tmp_path_factory.mktemp("registries"))
    finally:
        SEGMENTERS.unregister("toy")
        RETRIEVERS.unregister("toy")


def _make_world(base: Path) -> dict:
    from davir.data.synthetic import SynthConfig, generate_dataset

    generate_dataset(
        base / "data",
        SynthConfig(scenes=12, seed=3, width=96, height=72, val_fraction=0.0, test_fraction=0.5),
        workers=1,
    )
    table = base / "colours.json"
    table.write_text(
        json.dumps(
            {
                "red": [173, 35, 35],
                "blue": [42, 75, 215],
                "green": [29, 105, 20],
                "yellow": [255, 238, 51],
                "gray": [87, 87, 87],
                "cyan": [41, 208, 208],
                "purple": [129, 38, 192],
                "brown": [129, 74, 25],
            }
        )
    )
    common = ["--format", "clevr_change", "--root", str(base / "data"), "--split", "test", "--no-progress"]
    assert (
        masks.main([*common, "--out", str(base / "masks"), "--segmenter", "toy", "--toy-grow", "2", "--workers", "2"])
        == 0
    )
    assert (
        entities.main(
            [
                *common,
                "--masks",
                str(base / "masks"),
                "--out",
                str(base / "entities"),
                "--fit-split",
                "test",
                "--vocab-min-count",
                "1",
                "--retriever",
                "toy",
                "--toy-table",
                str(table),
                "--toy-sharpness",
                "0.5",
                "--entity-gate",
                "none",
            ]
        )
        == 0
    )
    pairs = read_dataset("clevr_change", base / "data", "test")
    return {"base": base, "common": common, "table": table, "pairs": pairs}


def test_the_jobs_build_and_record_the_registered_toys(world):
    base = world["base"]
    manifest = json.loads((base / "masks" / "manifest.json").read_text())
    assert manifest["settings"]["segmenter"] == {"segmenter": "toy", "toy_grow": 2}
    assert manifest["status"] == "complete" and manifest["counts"]["computed"] == len(world["pairs"].pairs) > 0
    assert manifest["profile"] == "custom"
    # The toy's masks are unions of regions dilated by a 5×5 square, so an opening by that square keeps them.
    cache, square = MaskCache(base / "masks"), np.ones((5, 5), np.uint8)
    stored = [cache.read(p.pair_id).after for p in world["pairs"].pairs]
    assert sum(mask.any() for mask in stored) >= 3
    assert all(
        np.array_equal(cv2.morphologyEx(m.astype(np.uint8), cv2.MORPH_OPEN, square).astype(bool), m) for m in stored
    )
    settings = json.loads((base / "entities" / "entities" / "manifest.json").read_text())["settings"]
    assert (settings["retriever"], settings["toy_sharpness"], settings["toy_table"]) == (
        "toy",
        0.5,
        str(world["table"]),
    )
    assert not any(key.startswith(("clip_", "fitted_")) for key in settings)  # the other retrievers' options stay out
    table = EntityCache(base / "entities").table()
    named = [found for found in table.values() if found]
    assert named and all(len(found) <= 5 and found == sorted(found, key=lambda e: -e[1]) for found in named)


def test_one_worker_gives_the_masks_of_two(world, tmp_path):
    """The toy reaches the (forked) worker processes: one in-process worker writes the same masks as two."""
    assert (
        masks.main(
            [
                *world["common"],
                "--out",
                str(tmp_path / "one"),
                "--segmenter",
                "toy",
                "--toy-grow",
                "2",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    one, two = MaskCache(tmp_path / "one"), MaskCache(world["base"] / "masks")
    for pair in world["pairs"].pairs:
        a, b = one.read(pair.pair_id), two.read(pair.pair_id)
        assert np.array_equal(a.before, b.before) and np.array_equal(a.after, b.after)


def test_online_path_rebuilds_both_toys_from_the_manifests(world):
    base = world["base"]
    online_masks = OnlineMasks.from_cache(base / "masks")
    online_entities = OnlineEntities(base / "entities")
    assert isinstance(online_masks.segmenter, ToySegmenter) and online_masks.segmenter.grow == 2
    assert isinstance(online_entities.retriever, ToyRetriever) and online_entities.retriever.sharpness == 0.5
    cached_masks, cached_entities = MaskCache(base / "masks"), EntityCache(base / "entities")
    for pair in world["pairs"].pairs:
        made, stored = online_masks(pair), cached_masks.read(pair.pair_id)
        assert np.array_equal(made.before, stored.before) and np.array_equal(made.after, stored.after)
        before, after = (np.asarray(image) for image in load_pair(pair))
        found = online_entities(pair.pair_id, before, after, made, 5)
        assert [(e, s) for e, s in found] == [(e, s) for e, s in cached_entities.get(pair.pair_id)], pair.pair_id


def test_the_online_path_names_what_is_missing(world, tmp_path, monkeypatch):
    """A weights file that moved: caption.py's --clip-checkpoint (the cache's retriever's weights) finds it."""
    base, cache = world["base"], tmp_path / "entities"
    shutil.copytree(base / "entities", cache)
    manifest = json.loads((cache / "entities" / "manifest.json").read_text())
    gone = tmp_path / "gone.json"
    manifest["settings"]["toy_table"] = str(gone)
    (cache / "entities" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        DataError,
        match=rf"entity cache {cache} was made with retriever 'toy' from {gone}, which is "
        "not found: pass --clip-checkpoint PATH",
    ):
        OnlineEntities(cache)
    assert OnlineEntities(cache, clip_checkpoint=world["table"]).retriever.table["red"] == [173, 35, 35]
    monkeypatch.delitem(SEGMENTERS, "toy")
    with pytest.raises(DataError, match=rf"mask cache {base / 'masks'}: unknown segmenter 'toy' in its manifest"):
        OnlineMasks.from_cache(base / "masks")


@pytest.mark.parametrize(
    "job, argv, message",
    [
        (
            "masks",
            ["--segmenter", "toy", "--classical-method", "grabcut"],
            "--classical-method is an option of segmenter 'classical', but this run uses segmenter 'toy'",
        ),
        (
            "masks",
            ["--toy-grow", "3"],
            "--toy-grow is an option of segmenter 'toy', but this run uses segmenter 'classical'",
        ),
        (
            "masks",
            ["--profile", "paper", "--contrast-threshold", "0.2"],
            "--contrast-threshold is an option of segmenter 'classical', but this run uses segmenter 'sam'",
        ),
        (
            "entities",
            ["--retriever", "toy", "--fitted-mode", "max"],
            "--fitted-mode is an option of retriever 'fitted', but this run uses retriever 'toy'",
        ),
        (
            "entities",
            ["--clip-model", "RN50"],
            "--clip-model is an option of retriever 'clip', but this run uses retriever 'fitted'",
        ),
    ],
)
def test_an_option_of_another_component_is_refused(world, tmp_path, capsys, job, argv, message):
    if job == "masks":
        status = masks.main([*world["common"], "--out", str(tmp_path / "c"), *argv])
    else:
        status = entities.main(
            [*world["common"], "--masks", str(world["base"] / "masks"), "--out", str(tmp_path / "c"), *argv]
        )
    assert status == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.json"))


# ---------------------------------------------------------------------------------------------- a toy method
# A lightweight method is one captioner + its settings, registered once (davir.models.lightweight.registry);
# training, evaluation in a sweep, and captioning then take it by the name a config gives, once.
def toy_method():
    import torch
    from torch import nn

    from davir.models.lightweight.base import Encoded, LightweightCaptioner
    from davir.models.lightweight.config import LightweightConfig

    @dataclass
    class ToySettings(LightweightConfig):
        toy_gain: float = 2.0  # the toy's own setting: a key no other method takes

    class ToyCaptioner(LightweightCaptioner):
        """toy_gain · (after − before) → Linear → the standard decoder."""

        def __init__(self, config: ToySettings):
            super().__init__(config)
            self.mix = nn.Linear(config.hidden, config.hidden)

        def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True) -> Encoded:
            return Encoded(torch.relu(self.mix(self.config.toy_gain * (tokens_after - tokens_before))))

    return ToySettings, ToyCaptioner


@pytest.fixture
def toy_registered():
    from davir.models.lightweight.registry import METHODS, register_method

    settings, captioner = toy_method()
    register_method("toy", settings)(captioner)
    yield settings
    METHODS.unregister("toy")


TOY_CONFIG = {
    "method": "toy",
    "data": {"format": "clevr_change"},
    "lightweight": {
        "hidden": 16,
        "heads": 2,
        "word_emb": 8,
        "ffn_dim": 32,
        "layers": 1,
        "encoder_layers": 1,
        "max_len": 16,
        "dropout": 0.0,
        "toy_gain": 3.0,
    },
    "optim": {"batch_size": 4, "max_steps": 3, "lr": 1e-3},
    "run": {"eval_every": 3, "val_max_pairs": 4, "tensorboard": False, "log_every": 1},
}


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_toy_method_registered_once_trains_scores_in_a_sweep_and_captions(
    toy_registered, synthetic_set, tmp_path, capsys
):
    import yaml

    from davir.config import ConfigError, load_config
    from davir.inference import ChangeCaptioner
    from davir.jobs.features import main as features_main
    from davir.runs.config import TrainConfig
    from davir.sweep.grid import load_sweep, run_sweep

    root, features = synthetic_set(16, 5), tmp_path / "features"
    for split in ("train", "val", "test"):
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
                    "--random-init",
                    "--workers",
                    "0",
                ]
            )
            == 0
        )
    config_file = tmp_path / "toy.yaml"
    config_file.write_text(yaml.safe_dump(TOY_CONFIG))
    # The method is named once; its own key is accepted, another method's is refused naming both.
    assert load_config(TrainConfig, config_file, [f"data.root={root}"]).lightweight.toy_gain == 3.0
    with pytest.raises(ConfigError, match=r"cv_weight is a setting of scorer, not of toy"):
        load_config(TrainConfig, config_file, ["lightweight.cv_weight=0.5"])

    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "title": "toy",
                "out": str(tmp_path / "sweep"),
                "seeds": [0],
                "split": "test",
                "overrides": [f"data.root={root}", f"data.features={features}"],
                "evaluate": {"metrics": ["BLEU", "CIDEr"]},  # no METEOR: a Java start the toy does not need
                "variants": [{"name": "toy", "config": str(config_file)}],
            }
        )
    )
    run_sweep(load_sweep(sweep_file))
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert "toy" in json.dumps(summary)
    run = next((tmp_path / "sweep").rglob("run_info.json")).parent
    metrics = json.loads(next(run.rglob("metrics.json")).read_text())
    assert metrics["rows"]["total"]["metrics"]["CIDEr"] >= 0 and metrics["distinct_captions"] >= 1
    assert json.loads((run / "best" / "lightweight_config.json").read_text())["method"] == "toy"

    pair = read_dataset("clevr_change", root, "test").pairs[0]
    result = ChangeCaptioner.from_pretrained(run).caption(pair.before, pair.after)
    assert result.error is None and isinstance(result.caption, str) and result.caption.strip()


# ------------------------------------------------------------------------------ a toy method with its own input
@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_toy_method_with_its_own_batch_input_trains_through_the_unchanged_task(synthetic_set, tmp_path, capsys):
    """tests/toy_input_method.py is the whole method (settings, captioner, the input hook) and `register_toy()` its
    one registration: LightweightTask prepares the input per dataset, puts it in the batches of both pairs of a
    scene, and the loop trains the method."""
    import torch
    from accelerate import Accelerator
    from safetensors.torch import load_file
    from toy_input_method import NAME, register_toy, unregister_toy

    from davir.config import load_config
    from davir.data.dataset import collate_examples
    from davir.jobs.features import main as features_main
    from davir.runs.config import TrainConfig
    from davir.training.lightweight_task import LightweightTask
    from davir.training.loop import train

    root, features = synthetic_set(16, 5), tmp_path / "features"
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
                    "--random-init",
                    "--workers",
                    "0",
                ]
            )
            == 0
        )
    train_pairs, val_pairs = (read_dataset("clevr_change", root, split).pairs for split in ("train", "val"))
    slots = len(train_pairs) + len(val_pairs[:4])  # the table the hook reads: train + the validated pairs
    register_toy()
    try:
        overrides = [
            f"method={NAME}",
            f"data.root={root}",
            f"data.features={features}",
            f"run.output_dir={tmp_path / 'run'}",
            *(f"{k}={v}" for k, v in TOY_FLAT.items()),
        ]
        config = load_config(TrainConfig, None, overrides)
        task = LightweightTask(config, Accelerator(cpu=True))
        assert task.lightweight.slot_count == slots and task.model.slots.num_embeddings == slots
        batch = collate_examples([task.train_dataset[i] for i in range(4)])  # 4 scenes: semantic + distractor pairs
        task.training_losses(batch)["loss"].backward()
        table = task.inputs.table
        used = {table[p.pair_id] for p in task.train_dataset.pairs[:4]}
        used |= {table[p.pair_id + "_n"] for p in task.train_dataset.pairs[:4]}  # the scenes' distractor pairs
        assert len(used) == 8
        touched = set(torch.nonzero(task.model.slots.weight.grad.abs().sum(1)).flatten().tolist())
        assert touched == used  # the input of each pair reached the model, and nothing else did

        run = train(config)  # the loop, unchanged: 3 steps, validation generates with the input too
        log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
        assert [row["step"] for row in log] == [1, 2, 3] and all(math.isfinite(row["train/loss"]) for row in log)
        assert load_file(str(run / "last" / "model.safetensors"))["slots.weight"].shape == (slots, 16)
        assert f"toy slot table: {slots} pairs" in capsys.readouterr().out
        assert len(json.loads((run / "val" / "step_3.json").read_text())["predictions"]) == 4
    finally:
        unregister_toy()


TOY_FLAT = {
    "data.format": "clevr_change",
    "lightweight.hidden": 16,
    "lightweight.heads": 2,
    "lightweight.word_emb": 8,
    "lightweight.ffn_dim": 32,
    "lightweight.layers": 1,
    "lightweight.max_len": 16,
    "lightweight.dropout": 0.0,
    "optim.batch_size": 4,
    "optim.max_steps": 3,
    "optim.lr": 1e-3,
    "run.eval_every": 3,
    "run.val_max_pairs": 4,
    "run.tensorboard": False,
    "run.log_every": 1,
}
