"""davir.sweep: reading sweep files, resuming finished cells and the mean ± std summary."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from davir.compare.seed_spread import mean_std
from davir.config import ConfigError
from davir.errors import DataError
from davir.sweep.grid import (
    CELL_RECORD,
    Sweep,
    Variant,
    cell_dir,
    cell_recipe,
    load_sweep,
    run_cell,
    run_sweep,
    set_vars,
    summarise,
)

REPO = Path(__file__).resolve().parents[1]


def _metrics(type_accuracy: float, cider: float, share: float | None = None, color_cider: float = 1.0) -> dict:
    document = {
        "rows": {"total": {"metrics": {"CIDEr": cider, "BLEU-4": 0.5}}, "color": {"metrics": {"CIDEr": color_cider}}},
        "synthetic": {"overall": {"type_accuracy": type_accuracy, "object_accuracy": 0.8, "exact_accuracy": 0.5}},
    }
    if share is not None:
        document["localisation"] = {"attention_share_in_mask": share}
    return document


def test_mean_and_sample_std_by_hand():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)  # sample std: sqrt(((1)^2 + 0 + (1)^2) / 2) = 1
    assert mean_std([0.5]) == (0.5, 0.0)


def test_summary_table_mean_and_std(tmp_path):
    sweep = Sweep(title="t", out=tmp_path, variants=[], seeds=[0, 1, 2])
    results = {
        "plain": [_metrics(0.5, 1.0, 0.10), _metrics(0.6, 2.0, 0.12), _metrics(0.7, 3.0, 0.14)],
        "FAC": [_metrics(0.9, 4.0, 0.30, color_cider=2.0)],
    }
    text, summary = summarise(sweep, results)
    # type accuracy 50/60/70 → 60.0 ± 10.0 (50–70); CIDEr 100/200/300 → 200.0 ± 100.0; share 0.120 ± 0.020
    assert (
        "| plain | 60.0 ± 10.0 (50.0–70.0) | 80.0 ± 0.0 (80.0–80.0) | 50.0 ± 0.0 (50.0–50.0) | 50.0 ± 0.0 (50.0–50.0) "
        "| 200.0 ± 100.0 (100.0–300.0) | 0.120 ± 0.020 (0.100–0.140) |"
    ) in text
    # FAC's one run (type 90, CIDEr 400) is outside plain's ranges; object acc. 80 = 80 is inside
    assert "- object acc.: plain ≈ FAC" in text and "- type acc." not in text and "- CIDEr" not in text
    assert summary["inside_spread"]["type acc."] == [] and summary["inside_spread"]["object acc."] == [("plain", "FAC")]
    assert (
        summary["variants"]["plain"]["type acc."]["min"] == 0.5
        and summary["variants"]["plain"]["type acc."]["max"] == 0.7
    )
    assert "| FAC | 90.0 | 80.0 | 50.0 | 50.0 | 400.0 | 0.300 |" in text
    assert "| FAC | 200.0 |" in text  # CIDEr of the colour changes
    assert "METEOR" not in text  # no run reports it: no empty column
    assert summary["variants"]["plain"]["CIDEr"]["values"] == [1.0, 2.0, 3.0]
    assert summary["variants"]["plain"]["CIDEr"]["std"] == pytest.approx(1.0)


def test_summary_counts_distinct_captions_and_the_none_type(tmp_path):
    sweep = Sweep(title="t", out=tmp_path, variants=[], seeds=[0, 1])
    runs = []
    for distinct, none in ((40, 0.9), (51, 0.8)):
        document = _metrics(0.5, 1.0)
        document["distinct_captions"] = distinct
        document["synthetic"]["per_type"] = {"none": {"type_accuracy": none}}
        runs.append(document)
    text, summary = summarise(sweep, {"m": runs})
    # none 90/80 → 85.0 ± 7.1; distinct 40/51 → 45.5 → "46 ± 8" (no decimals: a count, not a x100 score)
    assert (
        "| m | 50.0 ± 0.0 (50.0–50.0) | 80.0 ± 0.0 (80.0–80.0) | 50.0 ± 0.0 (50.0–50.0) | 85.0 ± 7.1 (80.0–90.0) "
        "| 50.0 ± 0.0 (50.0–50.0) | 100.0 ± 0.0 (100.0–100.0) | 46 ± 8 (40–51) |"
    ) in text
    assert "| variant | type acc. | object acc. | exact | none type acc. | BLEU-4 | CIDEr | distinct captions |" in text
    assert "except the number of distinct captions" in text
    assert summary["variants"]["m"]["distinct captions"]["values"] == [40.0, 51.0]


def test_summary_shows_faithfulness_and_compute_cost(tmp_path):
    sweep = Sweep(title="t", out=tmp_path, variants=[], seeds=[0, 1])
    runs = []
    for f1, params, wall, caption_rate in ((0.6, 1_500_000, 120.0, 40.0), (0.8, 1_500_000, 180.0, 50.0)):
        document = _metrics(0.5, 1.0)
        document["faithfulness"] = {"rows": {"total": {"objects": {"f1": f1}, "hallucination_rate": 1 - f1}}}
        document["compute"] = {
            "training": {
                "parameters": {"total": params, "trainable": params // 3},
                "pairs": 16000,
                "wall_s": wall,
                "pairs_per_s": 16000 / wall,
                "peak_memory_mb": 900.0,
                "device": "cpu (2 cores, 1 torch thread)",
            },
            "captioning": {"pairs_per_s": caption_rate},
        }
        runs.append(document)
    text, summary = summarise(sweep, {"m": runs})
    assert "| object F1 | hallucinated |" in text
    assert "| 70.0 ± 14.1 (60.0–80.0) | 30.0 ± 14.1 (20.0–40.0) |" in text  # F1 60/80; 1 − F1 40/20
    # params 1.50 M, trainable 0.50 M; 16000 pairs; 2.0/3.0 min → 2.5 ± 0.7; 133.3/88.9 pairs/s → 111.1 ± 31.4
    assert (
        "| m | 1.50 ± 0.00 (1.50–1.50) | 0.50 ± 0.00 (0.50–0.50) | 16000 ± 0 (16000–16000) | 2.5 ± 0.7 (2.0–3.0) "
        "| 111.1 ± 31.4 (88.9–133.3) | 900 ± 0 (900–900) | 45.0 ± 7.1 (40.0–50.0) | cpu (2 cores, 1 torch thread) |"
    ) in text
    assert summary["variants"]["m"]["train min"]["values"] == [120.0, 180.0]  # as metrics.json has them (s)


def test_finished_cell_is_not_trained_again(tmp_path):
    sweep = Sweep(title="t", out=tmp_path, variants=[Variant("A b", "configs/demo.yaml")], seeds=[0])
    run = cell_dir(sweep, sweep.variants[0], 0)
    assert run == tmp_path / "a_b" / "seed0"
    done = run / "eval" / "clevr_change_test" / "metrics.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps(_metrics(1.0, 1.0)))
    (run / CELL_RECORD).write_text(json.dumps(cell_recipe(sweep, sweep.variants[0], 0, [])))
    assert run_cell(sweep, sweep.variants[0], 0, []) == done  # would fail to train: no data there


def test_cell_rerun_from_another_folder_with_the_same_paths_is_kept(tmp_path, monkeypatch):
    """A sweep started in one folder with relative paths, rerun from another with the config absolute and the data
    through a symlink: the same cell (no retraining). Another folder for the data is still a change."""
    from davir.sweep.grid import _stale_reason

    (tmp_path / "demo" / "data").mkdir(parents=True)
    (tmp_path / "demo.yaml").write_text((REPO / "configs" / "demo.yaml").read_text())
    (tmp_path / "other" / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "link").symlink_to(tmp_path / "demo")

    def sweep(config: str, demo_dir: str) -> Sweep:
        return Sweep(
            title="t",
            out=tmp_path / "runs",
            variants=[Variant("A", config)],
            seeds=[0],
            overrides=["data.root={demo_dir}/data"],
            vars={"demo_dir": demo_dir},
        )

    monkeypatch.chdir(tmp_path)
    first = sweep("demo.yaml", "demo")
    run = cell_dir(first, first.variants[0], 0)
    run.mkdir(parents=True)
    (run / CELL_RECORD).write_text(json.dumps(cell_recipe(first, first.variants[0], 0, [])))
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = sweep(str(tmp_path / "demo.yaml"), "link")
    assert _stale_reason(run, cell_recipe(again, again.variants[0], 0, [])) is None
    moved = sweep(str(tmp_path / "demo.yaml"), str(tmp_path / "other"))
    reason = _stale_reason(run, cell_recipe(moved, moved.variants[0], 0, []))
    assert reason == f"made with other settings (data.root={tmp_path / 'other'}/data, data.root=demo/data)"


def test_cell_made_with_other_settings_is_trained_again_not_reported(tmp_path, monkeypatch, capsys):
    """The stale cell is retrained (here: the training function gets the config of the new recipe)."""
    from davir.training import loop

    sweep = Sweep(
        title="t",
        out=tmp_path,
        variants=[Variant("A", "configs/demo.yaml")],
        seeds=[0],
        overrides=["data.root={demo_dir}/data"],
        vars={"demo_dir": "outputs/demo"},
    )
    run = cell_dir(sweep, sweep.variants[0], 0)
    (run / "eval" / "clevr_change_test").mkdir(parents=True)
    (run / "eval" / "clevr_change_test" / "metrics.json").write_text(json.dumps(_metrics(1.0, 1.0)))
    (run / CELL_RECORD).write_text(json.dumps(cell_recipe(sweep, sweep.variants[0], 0, [])))
    assert cell_recipe(sweep, sweep.variants[0], 0, [])["overrides"] == ["data.root=outputs/demo/data", "run.seed=0"]

    calls = []

    def fails(config, **_):  # the test stops at the training
        calls.append(config)
        raise DataError("no data here")

    monkeypatch.setattr(loop, "train", fails)
    sweep.vars["demo_dir"] = "/elsewhere"
    with pytest.raises(DataError, match=f"training A seed 0 failed \\(run folder {run}\\): no data here"):
        run_cell(sweep, sweep.variants[0], 0, [])
    assert (
        "made with other settings (data.root=/elsewhere/data, data.root=outputs/demo/data)" in capsys.readouterr().out
    )
    assert len(calls) == 1 and calls[0].data.root == "/elsewhere/data"
    assert calls[0].run.output_dir == str(run) and calls[0].run.overwrite is True and calls[0].run.seed == 0
    assert not list(tmp_path.rglob("*.lock"))  # the run folder's lock is released on the failure

    calls.clear()
    (run / CELL_RECORD).unlink()  # a cell of an older sweep: nothing says what it was made with
    with pytest.raises(DataError):
        run_cell(sweep, sweep.variants[0], 0, [])
    assert len(calls) == 1 and "no sweep_cell.json" in capsys.readouterr().out

    calls.clear()  # a bad override is the config's error, named with the cell
    with pytest.raises(DataError, match=r"training A seed 0 failed .*optim\.lr"):
        run_cell(sweep, sweep.variants[0], 0, ["optim.lr=fast"])
    assert calls == []


@pytest.fixture
def no_training(monkeypatch):
    """A sweep whose cells must not train: reaching the training of one fails the test."""
    from davir.sweep import grid

    def refuse(run, recipe, *, label):
        raise AssertionError(f"{label} should not be trained")

    monkeypatch.setattr(grid, "_train_cell", refuse)


def test_run_sweep_from_python_picks_seeds_and_variants_and_writes_the_summary(tmp_path, no_training):
    """The typed entry point, no command line: finished cells are read (not trained), the choice of seeds,
    variants and split is the call's, the sweep object is left as it was."""
    sweep = Sweep(
        title="t",
        out=tmp_path / "default",
        seeds=[0, 1, 2],
        variants=[Variant("A", "configs/demo.yaml"), Variant("B b", "configs/demo.yaml", ["optim.lr=1e-4"])],
    )
    out = tmp_path / "picked"
    for seed, cider in ((0, 1.0), (1, 3.0)):
        picked = dataclasses.replace(sweep, out=out)
        run = cell_dir(picked, sweep.variants[1], seed)
        (run / "eval" / "clevr_change_val").mkdir(parents=True)
        (run / "eval" / "clevr_change_val" / "metrics.json").write_text(json.dumps(_metrics(0.5, cider)))
        (run / CELL_RECORD).write_text(json.dumps(cell_recipe(picked, sweep.variants[1], seed, ["run.eval_every=0"])))
    result = run_sweep(sweep, seeds=[0, 1], variants=["b_b"], extra=["run.eval_every=0"], split="val", out=out)
    assert (result.markdown_path, result.json_path) == (out / "summary_val.md", out / "summary_val.json")
    assert result.markdown_path.read_text() == result.text
    assert json.loads(result.json_path.read_text()) == json.loads(json.dumps(result.summary))
    assert (
        result.summary["split"] == "val"
        and result.summary["seeds"] == [0, 1]
        and list(result.summary["variants"]) == ["B b"]
    )
    assert "| B b |" in result.text and "200.0 ± 141.4 (100.0–300.0)" in result.text  # CIDEr 100/300
    assert sweep.seeds == [0, 1, 2] and len(sweep.variants) == 2 and sweep.out == tmp_path / "default"
    with pytest.raises(ConfigError, match=r"sweep 't': no variants \['c'\]"):
        run_sweep(sweep, variants=["c"])


def test_a_split_or_override_no_cell_can_use_stops_the_sweep_before_any_training(tmp_path, no_training):
    """`--split vall` trained the first cell, then its scoring stopped (format 'clevr_change' has no split
    'vall'); a bad override of the last variant let every cell before it train first. Both are checked first."""
    sweep = Sweep(
        title="t",
        out=tmp_path / "out",
        seeds=[0],
        variants=[Variant("A", "configs/demo.yaml"), Variant("B", "configs/demo.yaml", ["optim.lr=fast"])],
    )
    with pytest.raises(ConfigError, match=r"split 'vall': format 'clevr_change'.*choose from train, val, test"):
        run_sweep(sweep, split="vall", variants=["a"])
    with pytest.raises(ConfigError, match=r"sweep variant 'B': .*optim\.lr"):
        run_sweep(sweep)
    assert not (tmp_path / "out").exists()


def test_sweep_variables_fill_configs_and_overrides(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "vars: {d: outputs/demo}\noverrides: ['data.root={d}/data']\n"
        "variants: [{name: a, config: configs/demo.yaml, overrides: ['data.masks={d}/masks']}]\n"
    )
    sweep = load_sweep(path)
    set_vars(sweep, ["d=/data/x"])
    recipe = cell_recipe(sweep, sweep.variants[0], 5, [])
    assert recipe["overrides"] == ["data.masks=/data/x/masks", "data.root=/data/x/data", "run.seed=5"]
    with pytest.raises(ConfigError, match="--var e: the sweep declares no such variable"):
        set_vars(sweep, ["e=1"])
    sweep.overrides.append("data.entities={typo}/entities")
    with pytest.raises(ConfigError, match=r"uses \{typo\} but the sweep has no such variable"):
        cell_recipe(sweep, sweep.variants[0], 5, [])


def test_repository_sweeps_load_and_every_cell_config_resolves(monkeypatch):
    from davir.config import load_config
    from davir.runs.config import TrainConfig

    monkeypatch.chdir(REPO)  # the sweeps name configs/… from the repository, as make runs them
    sweeps = sorted((REPO / "configs" / "sweeps").glob("*.yaml"))
    assert {"ablation_demo.yaml", "ablation_hard.yaml", "lightweight_demo.yaml"} <= {p.name for p in sweeps}
    for path in sweeps:
        sweep = load_sweep(path)
        assert sweep.seeds == [0, 1, 2], path.name
        for variant in sweep.variants:
            recipe = cell_recipe(sweep, variant, 0, [])
            config = load_config(TrainConfig, recipe["config"], recipe["overrides"])  # a bad key fails here
            assert config.run.seed == 0, (path.name, variant.name)


def test_makefile_splits_each_sweep_into_variants_it_has_and_covers_them_all():
    """`make ablation-hard` and `make demo-lightweight` run their sweeps as two processes of named variants."""
    makefile = (REPO / "Makefile").read_text()
    for target, name in (("ablation-hard", "ablation_hard.yaml"), ("demo-lightweight", "lightweight_demo.yaml")):
        recipe = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        named = [Variant(n, "").slug for group in re.findall(r"--variants ([^)&;]+)", recipe) for n in group.split()]
        sweep = load_sweep(REPO / "configs" / "sweeps" / name)
        assert sorted(named) == sorted(v.slug for v in sweep.variants), target
    ablation = load_sweep(REPO / "configs" / "sweeps" / "ablation_demo.yaml")
    assert [v.slug for v in ablation.variants] == ["lora_no_fac_no_epc", "fac", "epc", "fac_epc_davir"]
    assert "model.seed" in ablation.seed_keys


@pytest.mark.parametrize(
    "text, message",
    [
        ("variants: []", "no variants"),
        ("variants: [{name: a}]", "needs a name and a config"),
        ("variants: [{name: a, config: x}, {name: A, config: y}]", "must differ"),
        ("colour: red\nvariants: [{name: a, config: x}]", "unknown sweep keys"),
        # --limit's meaning: 0 was "every pair" to evaluate_run, found only after the first cell had trained
        (
            "evaluate: {limit: 0}\nvariants: [{name: a, config: x}]",
            r"s\.yaml: evaluate: limit must be a whole number of 1 or more \(None for every pair\), got 0$",
        ),
    ],
)
def test_bad_sweep_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_sweep(path)


def test_variant_filter_rejects_unknown_names(tmp_path, capsys):
    from davir.cli.sweep import main

    assert main([str(REPO / "configs" / "sweeps" / "ablation_demo.yaml"), "--variants", "no such"]) == 2
    assert "no variants ['no_such']" in capsys.readouterr().err
