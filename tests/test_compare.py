"""davir.compare: runs of one method and several seeds as one row (mean ± std (min–max)), the differences the
seed spread cannot settle, compute cost beside the scores, and the leaderboard with its protocol marks."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from davir.cli.compare import main
from davir.compare.runs import compare_runs, comparison_table, read_run, seed_group
from davir.compare.seed_spread import inside_spread, spread_text


def _run(
    folder: Path,
    method: str,
    cider: float,
    f1: float | None = None,
    *,
    wall: float = 60.0,
    data_format: str = "clevr_change",
    references: dict | None = None,
    synthetic: bool = False,
    seed: int | None = None,
) -> Path:
    (folder / "eval" / f"{data_format}_test").mkdir(parents=True)
    run_seed = "" if seed is None else f"run:\n  seed: {seed}\n"
    (folder / "config.yaml").write_text(f"method: {method}\ndata:\n  format: {data_format}\n{run_seed}")
    document = {
        "rows": {
            "total": {"metrics": {"BLEU-4": 0.5, "METEOR": 0.3, "ROUGE_L": 0.6, "CIDEr": cider}, "num_pairs": 300}
        },
        "compute": {
            "training": {
                "parameters": {"total": 2_000_000, "trainable": 500_000},
                "pairs": 16000,
                "wall_s": wall,
                "pairs_per_s": 16000 / wall,
                "peak_memory_mb": 800.0,
                "device": "cpu (2 cores, 1 torch thread)",
            },
            "captioning": {"pairs_per_s": 30.0},
        },
    }
    if f1 is not None:
        document["faithfulness"] = {"rows": {"total": {"objects": {"f1": f1}, "hallucination_rate": 1 - f1}}}
    if references is not None:
        document["references"] = references
    if synthetic:
        document["synthetic"] = {"overall": {"object_accuracy": 0.8}}
    (folder / "eval" / f"{data_format}_test" / "metrics.json").write_text(json.dumps(document))
    return folder


def test_seed_groups_from_folder_names():
    assert seed_group(Path("runs/lightweight_demo/scorer_cbr/seed2")) == "scorer_cbr"
    assert seed_group(Path("runs/scorer_seed1")) == "scorer"
    assert seed_group(Path("runs/scorer-seed10")) == "scorer"
    assert seed_group(Path("runs/scorer_demo")) == "scorer_demo"


def test_spread_cells_and_overlaps_by_hand():
    assert spread_text([1.2, 1.3, 1.4], 100.0) == "130.0 ± 10.0 (120.0–140.0)"  # sample std of 120/130/140 = 10
    assert spread_text([0.25], 100.0) == "25.0" and spread_text([]) == "—"
    ranges = {"A": [1.20, 1.40], "B": [1.35, 1.50], "C": [1.60, 1.70], "D": [1.55]}
    assert inside_spread(ranges) == [("A", "B")]  # C vs D: 1.55 < 1.60, apart
    assert inside_spread({"X": [1.0], "Y": [1.0]}) == []  # two single runs: no spread to speak of


def test_compare_groups_seeds_and_flags_differences_inside_the_spread(tmp_path):
    results = [
        read_run(_run(tmp_path / "scorer" / f"seed{s}", "scorer", c, f1, wall=w))
        for s, (c, f1, w) in enumerate([(1.20, 0.80, 60.0), (1.30, 0.86, 90.0), (1.40, 0.92, 120.0)])
    ]
    results += [
        read_run(_run(tmp_path / "cheer" / f"seed{s}", "cheer", c, f1))
        for s, (c, f1) in enumerate([(1.35, 0.95), (1.50, 0.97)])
    ]
    table = comparison_table(results, "clevr_change")
    # SCORER CIDEr 120/130/140 → 130.0 ± 10.0; object F1 80/86/92 → 86.0 ± 6.0; hallucinated 20/14/8 → 14.0 ± 6.0
    assert (
        "| ours: scorer (test, 3 seeds) | scorer | total | 50.0 ± 0.0 (50.0–50.0) | 30.0 ± 0.0 (30.0–30.0) "
        "| 60.0 ± 0.0 (60.0–60.0) | 130.0 ± 10.0 (120.0–140.0) | – | 86.0 ± 6.0 (80.0–92.0) "
        "| 14.0 ± 6.0 (8.0–20.0) | 300 |"
    ) in table
    assert "| ours: cheer (test, 2 seeds) | cheer | total |" in table
    assert "| paper: SCORER Table 1 | scorer | total | 56.3 | 41.2 | 74.5 | 126.8 | 33.3 | – | – |  |" in table
    # CIDEr ranges 120–140 and 135–150 overlap; object F1 80–92 vs 95–97 do not
    assert "- CIDEr: ours: scorer (test, 3 seeds) ≈ ours: cheer (test, 2 seeds)" in table
    assert "- object F1" not in table
    # compute: 2.00 M params, 0.50 M trainable; 1/1.5/2 min → 1.5 ± 0.5; 266.7/177.8/133.3 pairs/s → 192.6 ± 67.9
    assert (
        "| ours: scorer (test, 3 seeds) | 2.00 ± 0.00 (2.00–2.00) | 0.50 ± 0.00 (0.50–0.50) | 16000 ± 0 (16000–16000) "
        "| 1.5 ± 0.5 (1.0–2.0) | 192.6 ± 67.9 (133.3–266.7) | 800 ± 0 (800–800) | 30.0 ± 0.0 (30.0–30.0) "
        "| cpu (2 cores, 1 torch thread) |"
    ) in table


def test_leaderboard_marks_protocols_and_ranks_runs_beside_the_papers(tmp_path, capsys):
    official = {"format": "spot_the_diff", "split": "test", "protocol": {"name": "spot_the_diff test"}}
    ours = _run(tmp_path / "davir_spot", "davir", 0.605, references=official, data_format="spot_the_diff")
    synthetic = _run(tmp_path / "demo", "davir", 3.3, synthetic=True)
    assert main(["--leaderboard", "spot_the_diff", str(ours), str(synthetic)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = lambda text: next(line for line in lines if text in line)
    assert "| ssgpa | all | 13.5 | 16.0 | 42.7 | 63.4 | – | ? |" in row("| ssgpa |")
    assert row("ssgpa_reproduction").startswith("| 13 | ssgpa_reproduction | unstated | 9.6 | 11.4 | 30.1 | 30.5 |")
    assert "= pycocoevalcap on FINER-MLLM" in row("DAVIR Table 1 (quoting FINER-MLLM")
    # ours 60.5 ranks between DAVIR Table 1 (61.9) / FINER via CHEER (61.8) and FINER via DAVIR (59.9)
    assert row("ours: davir_spot").startswith(
        "| 4 | **ours: davir_spot** (davir) | total (test) | 50.0 | 30.0 | 60.0 | 60.5 |"
    )
    assert "| = davir, official protocol of spot_the_diff test |" in row("ours: davir_spot")
    assert "≠ scored on clevr_change, not spot_the_diff" in row("ours: demo")
    assert any(
        "not reproduced: the public re-implementation yili-19/SSGPA reached at best CIDEr 30.5" in line
        for line in lines
    )

    assert main(["--leaderboard", "levir_cc"]) == 0
    assert "| ccexpert | all | 65.49 | 41.82 | 76.55 | 143.32 | – | ≠ captions lower-cased" in capsys.readouterr().out


def test_compare_runs_from_python_reads_the_runs_and_names_the_paper_dataset(tmp_path):
    runs = [_run(tmp_path / "scorer" / f"seed{s}", "scorer", c) for s, c in enumerate([1.2, 1.4])]
    comparison = compare_runs(runs)
    assert [r.path for r in comparison.results] == [read_run(run).path for run in runs]
    assert comparison.dataset == "clevr_change"
    assert comparison.table == comparison_table(comparison.results, "clevr_change")
    assert "| ours: scorer (test, 2 seeds) | scorer | total |" in comparison.table
    assert compare_runs(runs, dataset="spot_the_diff").dataset == "spot_the_diff"
    board = compare_runs([], leaderboard="levir_cc")
    assert board.results == [] and board.dataset == "levir_cc" and "| ccexpert |" in board.table


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give the run folders to compare, or --leaderboard BENCHMARK"),
        (["--leaderboard", "coco"], "--leaderboard coco: no reported numbers for it; choose one of"),
        (["--leaderboard", "ier", "--plot", "x.png"], "--plot draws the runs: give run folders"),
    ],
)
def test_compare_command_errors_name_the_problem(argv, message, capsys):
    assert main(argv) == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_outputs_never_replace_a_file_of_a_run_and_plot_takes_its_format_from_the_suffix(tmp_path, capsys):
    """`--out RUN/config.yaml` (or an eval's metrics.json) wrote the table over the run's file, exit 0; `--plot
    table.md` (or the --out path) stopped in matplotlib with a traceback after --out was written, and `--plot
    bars` wrote bars.png. All are refused before any run is read (exit 2, the flag and file named); a new file of
    the user's beside the run's is fine, and --plot writes the format of its suffix."""
    run = _run(tmp_path / "run é" / "seed0", "scorer", 1.2)
    link = tmp_path / "link"
    link.symlink_to(run)
    metrics = run / "eval" / "clevr_change_test" / "metrics.json"
    kept = {path: path.read_bytes() for path in (run / "config.yaml", metrics)}
    for argv, message in [
        (
            ["--out", str(run / "config.yaml")],
            f"--out {run / 'config.yaml'} is config.yaml of the run {run}, which it would replace; give another --out",
        ),
        (
            ["--plot", str(link / "eval" / "clevr_change_test" / "metrics.json")],
            f"--plot {link / 'eval' / 'clevr_change_test' / 'metrics.json'}: matplotlib cannot write a .json; "
            "give a .png path (or ",
        ),
        (
            ["--out", str(link / "eval" / "clevr_change_test" / "metrics.json")],
            f"--out {link / 'eval' / 'clevr_change_test' / 'metrics.json'} is "
            f"{Path('eval', 'clevr_change_test', 'metrics.json')} of the run {run}, which it would replace",
        ),
        (
            ["--out", str(tmp_path / "t.md"), "--plot", str(tmp_path / "t.md")],
            f"--plot {tmp_path / 't.md'} is the --out file, which it would replace; give another --plot",
        ),
        (["--plot", str(tmp_path / "bars")], f"--plot {tmp_path / 'bars'}: matplotlib cannot write a file without"),
    ]:
        assert main([str(run), *argv]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith(f"error: {message}")
    assert {path: path.read_bytes() for path in kept} == kept
    assert not (tmp_path / "t.md").exists() and not list(tmp_path.glob("bars*"))

    for _ in range(2):  # beside the run's files, and again over them
        assert main([str(run), "--out", str(run / "table.md"), "--plot", str(run / "bars.svg")]) == 0
    assert (run / "table.md").read_text().startswith("| source |")
    assert (run / "bars.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_while_comparing_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, signum):
    """Ctrl-C during `python -m davir.compare` ended in a KeyboardInterrupt traceback (SIGTERM: killed without a
    word). It stops as every long command does now: one line, exit 130 / 143, neither --out nor --plot written."""
    from davir.cli import compare as compare_cli

    run = _run(tmp_path / "run" / "seed0", "scorer", 1.2)
    real = compare_cli.compare_runs

    def stopped_while_reading(*args, **kwargs):
        comparison = real(*args, **kwargs)
        os.kill(os.getpid(), signum)  # arrives here, as a Ctrl-C does while the runs are read
        return comparison

    monkeypatch.setattr(compare_cli, "compare_runs", stopped_while_reading)
    # an undecorated main would let SIGTERM end pytest itself: fail here instead
    assert getattr(main, "stops_on_signals", False), "main is not decorated with stop_on_signals"
    try:
        status = main([str(run), "--out", str(tmp_path / "t.md"), "--plot", str(tmp_path / "bars.png")])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended python -m davir.compare in a KeyboardInterrupt traceback")
    assert status == 128 + signum
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"stopped by {signal.Signals(signum).name}; rerun the same command to start it again\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_one_run_twice_or_two_runs_of_one_seed_are_never_pooled_as_seeds(tmp_path, capsys):
    """The same run given twice (relative and through a link) was one row of "2 seeds" with a spread of 0, and
    runs/a/demo and runs/b/demo (two runs both trained with seed 0) were pooled as two seeds of "demo": now the
    first is refused (exit 2, both names), the second gives one row per run, named by its folder."""
    run = _run(tmp_path / "x" / "seed0", "scorer", 1.2, seed=0)
    link = tmp_path / "link"
    link.symlink_to(run)
    assert main([str(run), str(link)]) == 2
    assert capsys.readouterr().err == f"error: {link} is the run {run} again ({run}); give each run once\n"

    first = _run(tmp_path / "a" / "demo", "scorer", 1.2, seed=0)
    second = _run(tmp_path / "b" / "demo", "scorer", 1.4, seed=0)
    table = compare_runs([first, second]).table
    assert "seeds" not in table.split("\n\n")[0]
    assert f"| ours: {first} (test) | scorer | total | 50.0 | 30.0 | 60.0 | 120.0 |" in table
    assert f"| ours: {second} (test) | scorer | total | 50.0 | 30.0 | 60.0 | 140.0 |" in table
    assert f"Not pooled: {first}, {second} share a name but not seeds of one variant" in table
    # seeds of one variant still pool
    seeds = [_run(tmp_path / "v" / f"seed{s}", "scorer", c, seed=s) for s, c in enumerate([1.2, 1.4])]
    assert "| ours: v (test, 2 seeds) | scorer | total |" in compare_runs(seeds).table


@pytest.mark.parametrize(
    "config, metrics, message",
    [
        (": : :\n", None, "config.yaml: not a readable run config (line 1, column 1: expected <block end>, but found"),
        ("- [1]\n", None, "config.yaml: expected an object of keys, got list"),
        (b"method: \xe9\n", None, "config.yaml: not a readable run config ('utf-8' codec can't decode byte 0xe9"),
        (None, {"rows": []}, "metrics.json: key 'rows' must be a mapping, got []"),
        (None, {"rows": {"total": {}}}, "metrics.json: missing key 'rows.total.metrics'"),
        (None, {"rows": {"total": {"metrics": [1]}}}, "metrics.json: key 'rows.total.metrics' must be a mapping"),
        (
            None,
            {"rows": {"total": {"metrics": {"CIDEr": "high"}}}},
            "metrics.json: key 'rows.total.metrics.CIDEr' must be an integer or a number or null, got 'high'",
        ),
    ],
)
def test_a_damaged_run_file_is_one_line_naming_the_file_and_key(tmp_path, capsys, config, metrics, message):
    """A config.yaml that is not YAML or not a mapping, or a metrics.json whose rows are not evaluate.py's, stopped
    with a YAMLError / AttributeError / KeyError / TypeError traceback; now exit 2, the file and key named."""
    run = _run(tmp_path / "run", "scorer", 1.2)
    if config is not None:
        (run / "config.yaml").write_bytes(config if isinstance(config, bytes) else config.encode())
    if metrics is not None:
        (run / "eval" / "clevr_change_test" / "metrics.json").write_text(json.dumps(metrics))
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run}{os.sep}") and message in err and len(err.splitlines()) == 1


def test_a_missing_run_and_a_hint_with_a_space(tmp_path, capsys):
    assert main([str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == f"error: run folder {tmp_path / 'absent'} does not exist\n"
    run = _run(tmp_path / "my run", "scorer", 1.2)
    assert main([str(run), "--split", "val"]) == 2
    assert capsys.readouterr().err == (
        f"error: {run} has no eval/*_val/metrics.json; run `python evaluate.py --checkpoint '{run}' --split val` "
        "first\n"
    )


def test_a_dataset_that_is_no_format_is_refused(tmp_path, capsys):
    """--dataset clevr-change (a typo) printed the table without a single paper row and a note about the papers
    "on clevr-change", exit 0; now exit 2 with the formats named. A format no paper reports on says so."""
    run = _run(tmp_path / "run", "scorer", 1.2)
    assert main([str(run), "--dataset", "clevr-change"]) == 2
    assert capsys.readouterr().err == (
        "error: --dataset='clevr-change' is not a registered dataset format; choose from clevr_change, clevr_dc, "
        "folder, ier, levir_cc, spot_the_diff\n"
    )
    assert main([str(run), "--dataset", "folder"]) == 0
    out = capsys.readouterr().out
    assert "| paper:" not in out and "No paper reports numbers on folder" in out


def test_compare_starts_without_torch():
    """Its cost columns came from davir.runtime.cost, which imported torch at the top: 3 s of start-up, in which
    Ctrl-C was a KeyboardInterrupt traceback from torch's import (before main could stop it with one line)."""
    import subprocess

    code = "import sys, davir.cli.compare, davir.cli.sweep; print(sorted({'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
