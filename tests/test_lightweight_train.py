"""The five lightweight methods through the one trainer, saver, loader and captioner, on real-format data.

A tiny synthetic CLEVR-Change-layout set is generated in tmp_path and its features come from
`python -m preprocess features --random-init` (one extraction shared by every test); models are tiny.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from davir.config import load_config
from davir.data.caches import EntityCache
from davir.data.formats import read_dataset
from davir.errors import DataError
from davir.io import read_json
from davir.runs.config import TrainConfig
from davir.text.entity_vocabulary import EntityVocabulary

REPO = Path(__file__).resolve().parents[1]
TINY_TEXT = "tiny-text-test"  # an open_clip model config registered from tmp (1 layer, width 16)
TINY = [
    "lightweight.hidden=16",
    "lightweight.heads=2",
    "lightweight.word_emb=8",
    "lightweight.ffn_dim=32",
    "lightweight.layers=1",
    "lightweight.encoder_layers=1",
    "lightweight.max_len=16",
    "lightweight.dropout=0.0",
    "optim.batch_size=4",
    "optim.max_steps=3",
    "optim.lr=1e-3",
    "run.eval_every=3",
    "run.val_max_pairs=4",
    "run.tensorboard=false",
    "run.log_every=1",
]
TINY_RDD = ["lightweight.rdd_objects=3", "lightweight.rdd_actions=2"]  # RDD's own keys (another method's are errors)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> dict:
    """20 synthetic scenes, random-init ResNet features of train+val, a CHEER entity cache, a tiny text tower."""
    from davir.data.synthetic import SynthConfig, generate_dataset
    from davir.jobs.features import main as features_main

    base = tmp_path_factory.mktemp("lw")
    root, features = base / "data", base / "features"
    generate_dataset(root, SynthConfig(scenes=20, width=96, height=72), workers=1)
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
                    "--batch-size",
                    "32",
                ]
            )
            == 0
        )
    # Entity cache in the layout `preprocess entities` writes: vocab.json + per-pair top-3 phrases.
    entities = base / "entities"
    phrases = ["red cube", "blue sphere", "metal cylinder", "small object"]
    EntityVocabulary(phrases=phrases, counts={p: 1 for p in phrases}, min_count=1, extractor={}).save(
        entities / "vocab.json"
    )
    cache = EntityCache(entities)
    for split in ("train", "val"):
        pairs = read_dataset("clevr_change", root, split).pairs
        cache.write_part(
            split, {p.pair_id: [(phrases[(i + j) % 4], 1.0 - j / 10) for j in range(3)] for i, p in enumerate(pairs)}
        )
    text_config = base / f"{TINY_TEXT}.json"
    text_config.write_text(
        json.dumps(
            {
                "embed_dim": 12,
                "vision_cfg": {"image_size": 32, "layers": 1, "width": 16, "patch_size": 16},
                "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
            }
        )
    )
    return {"root": root, "features": features, "entities": entities, "text_config": text_config, "base": base}


def run_config(tiny_data: dict, method: str, tmp_path: Path, *extra: str) -> TrainConfig:
    overrides = [
        f"method={method}",
        "data.format=clevr_change",
        f"data.root={tiny_data['root']}",
        f"data.features={tiny_data['features']}",
        f"run.output_dir={tmp_path / method}",
        *TINY,
    ]
    if method in ("cheer", "rdd"):
        overrides += [
            f"lightweight.text_encoder_model={TINY_TEXT}",
            f"lightweight.text_encoder_config={tiny_data['text_config']}",
        ]
    if method == "rdd":
        overrides += TINY_RDD
    if method == "cheer":
        overrides.append(f"data.entities={tiny_data['entities']}")
    return load_config(TrainConfig, None, overrides + list(extra))


@pytest.mark.parametrize("method", ["subtraction", "scorer", "dirl", "rdd", "cheer"])
def test_train_save_load_caption(method, tiny_data, tmp_path, capsys):
    from davir.data.feature_cache import FeatureCache
    from davir.inference import CachedEntities, ChangeCaptioner, load_engine
    from davir.runs.paths import RunPaths
    from davir.training.loop import train

    extra = ["lightweight.acr_prompts=learned"] if method == "rdd" else []
    run = train(run_config(tiny_data, method, tmp_path, *extra))
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(row["train/loss"])) for row in log)
    aux = {
        "scorer": "train/cv_loss",
        "dirl": "train/dirl_loss",
        "rdd": "train/n2o_loss",
        "cheer": "train/contrastive_loss",
    }
    if method in aux:
        assert aux[method] in log[0]  # the method's auxiliary loss reached the trainer's log
    # the saved folder is one resolve_model_dir recognises, with the vocabulary of the training captions
    saved = run / "last"
    info = read_json(saved / "lightweight_config.json")
    assert info["method"] == method and (saved / "model.safetensors").is_file()
    vocab = read_json(saved / "vocab.json")
    train_pairs = read_dataset("clevr_change", tiny_data["root"], "train").pairs
    words = {w for p in train_pairs for c in p.captions for w in c.split()}
    assert set(vocab) == words | {"<NULL>", "<UNK>", "<START>", "<END>"}
    assert info["config"]["vocab_size"] == len(vocab)
    if method in ("rdd", "cheer"):
        assert "random-init" in capsys.readouterr().out  # the random text tower is stated in the run log
        assert info["text_encoder"]["weights"] == "random-init(seed=0)"
    # save → load → the same greedy captions as the in-memory model gave at the final validation
    in_memory = read_json(run / "val" / "step_3.json")["predictions"]
    # (the captioning path of evaluate.py: features and CHEER's entities looked up in the split's caches)
    model = RunPaths.of(saved)
    engine = load_engine(model, "cpu", features=FeatureCache(tiny_data["features"]))
    assert engine.bundle.method == method and engine.uses_entities == (method == "cheer")
    entities = CachedEntities(EntityCache(tiny_data["entities"])) if method == "cheer" else None
    captioner = ChangeCaptioner(engine, None, entities, run=model, num_beams=1, max_new_tokens=engine.max_len)
    val_pairs = read_dataset("clevr_change", tiny_data["root"], "val").pairs[:4]
    predictions = captioner.caption_records(val_pairs, batch_size=3)
    assert [p.pair_id for p in predictions] == [p.pair_id for p in val_pairs]
    assert all(p.error is None for p in predictions)
    assert {p.pair_id: p.caption for p in predictions} == in_memory


def test_evaluating_another_dataset_root_does_not_read_the_training_feature_cache(
    tiny_data, tmp_path, monkeypatch, capsys
):
    """evaluate.py --checkpoint RUN --root OTHER: OTHER's images have the same names as the training root's
    (images/CLEVR_default_000003.png …), so the run's cache would hand back the training images' features for
    them; they are computed from OTHER's files instead (a note says so), and the run's own root still reads it."""
    from davir.data.feature_cache import FeatureCache
    from davir.evaluation import evaluate_run
    from davir.training.loop import train

    run = train(run_config(tiny_data, "subtraction", tmp_path))
    other = tmp_path / "other_copy"
    shutil.copytree(tiny_data["root"], other)
    read_from_cache: list[str] = []
    original_get = FeatureCache.get
    monkeypatch.setattr(
        FeatureCache, "get", lambda self, path: read_from_cache.append(str(path)) or original_get(self, path)
    )
    options = {"format": "clevr_change", "spice": False, "echo": True, "progress": False}

    capsys.readouterr()
    result = evaluate_run(run, "val", root=other, **options)
    assert not read_from_cache and not result.failed
    assert f"computed from the image files of {other.resolve()}" in capsys.readouterr().err
    evaluate_run(run, "val", root=tiny_data["root"], **options)
    assert read_from_cache


def test_scene_batches_pair_semantic_and_distractor(tiny_data, tmp_path):
    from accelerate import Accelerator

    from davir.training.lightweight_task import LightweightTask

    task = LightweightTask(run_config(tiny_data, "subtraction", tmp_path), Accelerator(cpu=True))
    train_index = read_dataset("clevr_change", tiny_data["root"], "train")
    assert len(task.train_dataset) == len(train_index.pairs) // 2  # one example per scene
    example = task.train_dataset[0]
    pair = task.train_dataset.pairs[0]
    distractor = train_index.by_id()[pair.pair_id + "_n"]
    assert example["feat_distractor"].shape == (1024, 14, 14)
    assert example["caption"] in pair.captions and example["no_change_caption"] in distractor.captions
    from davir.data.feature_cache import FeatureCache

    assert torch.equal(example["feat_distractor"], FeatureCache(tiny_data["features"]).get(distractor.after))


def test_preloaded_pooled_features_give_the_model_exactly_what_the_cache_gives(tiny_data, tmp_path):
    from accelerate import Accelerator

    from davir.data.feature_cache import FeatureCache
    from davir.data.feature_table import PooledFeatureTable
    from davir.training.lightweight_task import LightweightTask

    cache = FeatureCache(tiny_data["features"])
    pairs = read_dataset("clevr_change", tiny_data["root"], "val").pairs
    images = [p.after for p in pairs] + [p.before for p in pairs]
    table = PooledFeatureTable.load(cache, images, pool=2, rows_per_read=3)  # several reads per chunk
    assert len(table) == len(set(images)) and images[0] in table
    for path in images[:5]:
        full = cache.get(path)
        expected = torch.nn.functional.avg_pool2d(full.unsqueeze(0), 2, ceil_mode=True)[0]
        assert table.get(path).shape == (1024, 7, 7) and torch.equal(table.get(path), expected)
    # a second run of the same process (a sweep's next cell) reuses the table; other images or pooling re-read
    assert PooledFeatureTable.load(cache, images, pool=2).table is table.table
    assert PooledFeatureTable.load(cache, images[:3], pool=2).table is not table.table
    with pytest.raises(DataError, match="not among the"):
        table.get(read_dataset("clevr_change", tiny_data["root"], "train").pairs[0].after)

    # The task's front-end takes the pooled grid as pooled: token for token what it computes from the full grid.
    task = LightweightTask(
        run_config(tiny_data, "subtraction", tmp_path, "lightweight.feature_pool=2"), Accelerator(cpu=True)
    )
    assert isinstance(task.feature_source, PooledFeatureTable) and task.feature_source.pool == 2
    example = task.train_dataset[0]
    assert example["feat_after"].shape == (1024, 7, 7)
    frontend = task.model.frontend.eval()
    full = torch.stack([cache.get(task.train_dataset.pairs[0].after)])
    assert torch.equal(frontend(example["feat_after"].unsqueeze(0)), frontend(full))
    # 0 GB: read from the cache at every step, full grids
    task = LightweightTask(
        run_config(tiny_data, "subtraction", tmp_path, "data.preload_features_gb=0"), Accelerator(cpu=True)
    )
    assert task.feature_source is task.features and task.train_dataset[0]["feat_after"].shape == (1024, 14, 14)


def test_missing_caches_are_named(tiny_data, tmp_path):
    from accelerate import Accelerator

    from davir.training.lightweight_task import LightweightTask

    with pytest.raises(DataError, match="preprocess features"):
        LightweightTask(run_config(tiny_data, "scorer", tmp_path, "data.features=null"), Accelerator(cpu=True))
    with pytest.raises(DataError, match="preprocess entities .*--top-k 3"):
        LightweightTask(run_config(tiny_data, "cheer", tmp_path, "data.entities=null"), Accelerator(cpu=True))


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["lightweight.text_encoder={missing}"], "lightweight.text_encoder=FILE"),
        (["lightweight.text_encoder_config={missing}"], "lightweight.text_encoder_config"),
        (["lightweight.text_encoder={openai}", "lightweight.text_encoder_model=ViT-B-32"], "_model=ViT-B-32-quickgelu"),
        (
            ["lightweight.text_encoder={openai}", "lightweight.text_encoder_model=nope"],
            "lightweight.text_encoder_config",
        ),
    ],
)
def test_text_tower_errors_name_the_config_keys_train_py_takes(tiny_data, tmp_path, overrides, named):
    """RDD's text tower from train.py: a missing or mismatched file names the lightweight.* key to set, not the
    entities job's --clip-* flags, which train.py does not have."""
    from accelerate import Accelerator

    from davir.training.lightweight_task import LightweightTask

    openai = tmp_path / "open_clip_vit_b32-openai.pt"
    openai.write_bytes(b"x")
    files = {"missing": tmp_path / "missing.json", "openai": openai}
    config = run_config(tiny_data, "rdd", tmp_path, *(o.format(**files) for o in overrides))
    with pytest.raises(DataError, match=re.escape(named)) as error:
        LightweightTask(config, Accelerator(cpu=True))
    assert "--clip" not in str(error.value)


@pytest.mark.parametrize("entities", ["null", "nowhere"])
def test_missing_cheer_entities_name_the_image_level_command(tiny_data, tmp_path, entities):
    """CHEER's entities are image-level (§4.8, no masks): the command the error gives makes exactly those."""
    from accelerate import Accelerator

    from davir.training.lightweight_task import LightweightTask

    overrides = [f"data.entities={tmp_path / entities if entities != 'null' else 'null'}"]
    with pytest.raises(DataError, match="preprocess entities .*--image-level --top-k 3") as error:
        LightweightTask(run_config(tiny_data, "cheer", tmp_path, *overrides), Accelerator(cpu=True))
    assert "--masks" not in str(error.value)


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["lightweight.feat_dim=2050", "lightweight.coord_channels=true"], "feat_dim=2050 .*feat_dim=1026"),
        (["lightweight.feat_dim=1026", "lightweight.coord_channels=false"], "feat_dim=1026 .*feat_dim=1024"),
        (["lightweight.grid_size=7"], "grid_size=7 .*grid_size=14"),
        (["lightweight.frontend_init=paper", "lightweight.feat_dim=2048"], "feat_dim=2048 .*feat_dim=1024"),
    ],
)
def test_settings_that_do_not_fit_the_feature_cache_are_named(tiny_data, tmp_path, overrides, named):
    """Features of 1024 × 14 × 14 and a model built for another size: one error naming the setting and the
    cache's shape before any training, never a shape error from inside the front-end."""
    from accelerate import Accelerator

    from davir.training.lightweight_task import LightweightTask

    with pytest.raises(DataError, match=rf"are 1024 × 14 × 14: lightweight\.{named}") as error:
        LightweightTask(run_config(tiny_data, "subtraction", tmp_path, *overrides), Accelerator(cpu=True))
    assert str(tiny_data["features"]) in str(error.value)


def test_one_step_on_the_real_clevr_change_images(shared_datasets, tmp_path):
    """The shared CLEVR-Change scenes (real images) with faked captions: one training step end to end."""
    from davir.jobs.features import main as features_main
    from davir.training.loop import train

    source = shared_datasets / "clevr_change"
    root = tmp_path / "clevr"
    for folder in ("images", "sc_images", "nsc_images"):
        shutil.copytree(source / folder, root / folder)
    shutil.copy(source / "type_mapping.json", root / "type_mapping.json")
    scenes = sorted(int(p.stem.rsplit("_", 1)[1]) for p in (root / "images").glob("*.png"))
    (root / "splits.json").write_text(json.dumps({"train": scenes[:4], "val": scenes[4:5], "test": scenes[5:]}))
    names = [f"CLEVR_default_{i:06d}.png" for i in scenes]
    (root / "change_captions.json").write_text(json.dumps({n: ["the red cube has been moved"] for n in names}))
    (root / "no_change_captions.json").write_text(json.dumps({n: ["no change was made"] for n in names}))
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
                    str(tmp_path / "feats"),
                    "--random-init",
                    "--workers",
                    "0",
                ]
            )
            == 0
        )
    config = load_config(
        TrainConfig,
        None,
        [
            "method=scorer",
            f"data.root={root}",
            f"data.features={tmp_path / 'feats'}",
            f"run.output_dir={tmp_path / 'run'}",
            *TINY,
            "optim.max_steps=1",
            "run.eval_every=1",
            "run.val_max_pairs=2",
        ],
    )
    run = train(config)
    assert json.loads((run / "train_log.jsonl").read_text().splitlines()[0])["step"] == 1
    assert (run / "last" / "lightweight_config.json").is_file()
    cost = read_json(run / "run_info.json")["compute"]  # issue 33: what the training cost
    assert (cost["pairs"], cost["optimizer_steps"], cost["processes"]) == (4, 1, 1)  # 1 step × batch 4
    assert 0 < cost["parameters"]["trainable"] <= cost["parameters"]["total"] and cost["device"].startswith("cpu")
    assert cost["pairs_per_s"] == pytest.approx(4 / cost["wall_s"], rel=1e-2) and cost["peak_memory_mb"] > 0
    # every word of the faked change and no-change captions, plus the 4 special tokens
    assert len(read_json(run / "last" / "vocab.json")) == 4 + len(
        {"the", "red", "cube", "has", "been", "moved", "no", "change", "was", "made"}
    )


def test_compare_tables_runs_beside_the_papers(tmp_path):
    from davir.compare.runs import bar_chart, comparison_table, read_run

    run = tmp_path / "scorer_run"
    (run / "eval" / "clevr_change_test").mkdir(parents=True)
    (run / "config.yaml").write_text("method: scorer\ndata:\n  format: clevr_change\n")
    rows = {
        "total": {"metrics": {"BLEU-4": 0.25, "METEOR": 0.3, "ROUGE_L": 0.5, "CIDEr": 1.234}, "num_pairs": 200},
        "semantic": {"metrics": {"BLEU-4": 0.1, "METEOR": 0.2, "ROUGE_L": 0.4, "CIDEr": 0.5}, "num_pairs": 100},
    }
    (run / "eval" / "clevr_change_test" / "metrics.json").write_text(json.dumps({"rows": rows}))
    result = read_run(run)
    assert (result.method, result.dataset, result.split) == ("scorer", "clevr_change", "test")
    table = comparison_table([result], "clevr_change")
    lines = table.splitlines()
    # one run: plain values; no faithfulness in this metrics.json: "–" under object F1 and hallucinated
    assert "| ours: scorer_run (test) | scorer | total | 25.0 | 30.0 | 50.0 | 123.4 | – | – | – | 200 |" in lines
    assert "| paper: SCORER Table 1 | scorer | total | 56.3 | 41.2 | 74.5 | 126.8 | 33.3 | – | – |  |" in lines
    assert any("subtraction" in line and "119.7" in line for line in lines)  # the baseline is always shown
    assert not any("| cheer |" in line for line in lines)  # only the methods among the runs
    bar_chart([result], "clevr_change", tmp_path / "bars.png")
    assert (tmp_path / "bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(DataError, match="evaluate.py --checkpoint"):
        read_run(run, split="val")


@pytest.mark.slow  # five methods trained and scored through the sweep: 40 s of CPU
def test_every_method_trains_and_scores_on_a_folder_of_own_pairs_through_a_sweep(tiny_data, tmp_path):
    """Issue 17: the five `configs/<method>_folder.yaml` on a user's pairs.csv (captions, splits) — features of the
    folder, then one `davir.sweep.grid.run_sweep` (typed, no command line) that trains and scores each method with
    `evaluate.py --format folder`."""
    from davir.cli.data import main as data_main
    from davir.jobs.features import main as features_main
    from davir.sweep.grid import load_sweep, run_sweep

    own = tmp_path / "own"
    assert (
        data_main(
            [
                "pairs",
                "--format",
                "clevr_change",
                "--root",
                str(tiny_data["root"]),
                "--split",
                "train",
                "--split",
                "val",
                "--split",
                "test",
                "--num",
                "0",
                "--out",
                str(own / "pairs.csv"),
            ]
        )
        == 0
    )
    features = tmp_path / "features"
    for split in ("train", "val", "test"):
        assert (
            features_main(
                [
                    "--format",
                    "folder",
                    "--root",
                    str(own),
                    "--split",
                    split,
                    "--out",
                    str(features),
                    "--random-init",
                    "--workers",
                    "0",
                    "--batch-size",
                    "32",
                    "--no-progress",
                ]
            )
            == 0
        )
    entities = tmp_path / "entities"  # CHEER's image-level entities, in the layout `preprocess entities` writes
    phrases = ["red cube", "blue sphere", "metal cylinder", "small object"]
    EntityVocabulary(phrases=phrases, counts={p: 1 for p in phrases}, min_count=1, extractor={}).save(
        entities / "vocab.json"
    )
    for split in ("train", "val", "test"):
        pairs = read_dataset("folder", own, split).pairs
        EntityCache(entities).write_part(
            split, {p.pair_id: [(phrases[(i + j) % 4], 1.0 - j / 10) for j in range(3)] for i, p in enumerate(pairs)}
        )
    methods = ["subtraction", "scorer", "dirl", "rdd", "cheer"]
    text = [
        "lightweight.text_encoder=null",
        f"lightweight.text_encoder_model={TINY_TEXT}",
        f"lightweight.text_encoder_config={tiny_data['text_config']}",
    ]
    sweep_file = tmp_path / "own.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "title": "five methods on own pairs",
                "out": str(tmp_path / "sweep"),
                "seeds": [0],
                "split": "test",
                "overrides": [f"data.root={own}", f"data.features={features}", *TINY],
                "evaluate": {"spice": False, "metrics": ["BLEU", "CIDEr"]},
                "variants": [
                    {
                        "name": m,
                        "config": str(REPO / "configs" / f"{m}_folder.yaml"),
                        "overrides": (text if m in ("rdd", "cheer") else [])
                        + (TINY_RDD if m == "rdd" else [])
                        + ([f"data.entities={entities}"] if m == "cheer" else []),
                    }
                    for m in methods
                ],
            }
        )
    )
    result = run_sweep(load_sweep(sweep_file))
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert result.json_path == tmp_path / "sweep" / "summary.json" and result.summary["variants"] == summary["variants"]
    assert sorted(summary["variants"]) == sorted(methods)
    test_ids = {p.pair_id for p in read_dataset("folder", own, "test").pairs}
    for method in methods:
        metrics = json.loads(
            next((tmp_path / "sweep" / method / "seed0" / "eval").glob("folder_test/metrics.json")).read_text()
        )
        assert metrics["references"]["format"] == "folder", method
        predictions = json.loads(Path(metrics["predictions"]).read_text())
        assert {row["image_id"] for row in predictions} == test_ids and all(row["caption"] for row in predictions)
        assert metrics["rows"]["total"]["num_pairs"] == len(test_ids), method
