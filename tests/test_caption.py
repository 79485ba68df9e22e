"""caption.py as a user runs it: streaming + resume, shards, the Python API, run paths from any folder, bad input."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from davir.config import load_config
from davir.data.formats.folder import read_folder_pairs
from davir.data.synthetic import SynthConfig, generate_dataset
from davir.errors import DataError
from davir.runs.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from davir.cli import caption as caption_script  # noqa: E402
from davir.jobs import masks as masks_job  # noqa: E402
from davir.training import loop as train_script  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny DAVIR run trained from its own folder with relative paths (as `make demo` records them)."""
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("caption")
    generate_dataset(base / "data", SynthConfig(scenes=16, seed=4, width=96, height=72), workers=1)
    cwd = os.getcwd()
    os.chdir(base)
    try:
        assert (
            masks_job.main(
                [
                    "--format",
                    "clevr_change",
                    "--root",
                    "data",
                    "--split",
                    "train",
                    "--out",
                    "masks",
                    "--limit",
                    "4",
                    "--workers",
                    "1",
                ]
            )
            == 0
        )
        config = load_config(
            TrainConfig,
            REPO / "configs" / "demo.yaml",
            [
                "data.root=data",
                "data.masks=masks",
                "data.entities=null",
                "model.fac.lambda_attn=0",
                "model.epc.use_entities=false",
                f"model.pretrained={REPO / 'assets' / 'tiny_instructblip'}",
                "optim.batch_size=4",
                "optim.max_steps=1",
                "run.val_max_pairs=2",
                "run.eval_every=0",
                "run.tensorboard=false",
                "run.output_dir=runs/tiny",
            ],
        )
        train_script.train(config)
    finally:
        os.chdir(cwd)
    return base


def pair_folder(root: Path, data: Path, n: int) -> Path:
    (root / "before").mkdir(parents=True)
    (root / "after").mkdir()
    for i, path in enumerate(sorted((data / "images").iterdir())[:n]):
        shutil.copy(path, root / "before" / f"p{i:02d}.png")
        shutil.copy(data / "sc_images" / path.name.replace("default", "semantic"), root / "after" / f"p{i:02d}.png")
    return root


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(argv, capsys):
    status = caption_script.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def error_line(err: str) -> str:
    """The message a user reads (transformers may print a progress bar before it)."""
    return next(line for line in err.splitlines() if line.startswith("error:"))


def test_rerun_after_a_kill_skips_what_is_done_and_repairs_a_cut_line(trained, tmp_path, capsys):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 6)
    out = tmp_path / "out" / "captions.jsonl"
    argv = [
        "--checkpoint",
        trained / "runs" / "tiny",
        "--pairs",
        pairs,
        "--out",
        out,
        "--batch-size",
        "2",
        "--workers",
        "1",
        "--quiet",
    ]
    assert run(argv, capsys)[0] == 0
    full = out.read_text()
    rows = rows_of(out)
    assert [r["id"] for r in rows] == [f"p{i:02d}" for i in range(6)] and all(r["caption"] for r in rows)
    assert json.loads(out.with_name("captions.jsonl.manifest.json").read_text())["status"] == "complete"
    # A kill in the middle of the third line's write: two whole lines and a cut one remain.
    lines = full.splitlines(keepends=True)
    out.write_text(lines[0] + lines[1] + lines[2][:17])
    status, _, err = run(argv, capsys)
    assert status == 0 and "skipping 2 pair(s) already captioned" in err
    assert out.read_text() == full  # same captions, same order, no broken line
    status, stdout, err = run(argv, capsys)  # nothing left to do
    assert "skipping 6 pair(s)" in err and out.read_text() == full
    # Other decoding settings must not mix with these captions.
    status, _, err = run(argv + ["--max-new-tokens", "5"], capsys)
    assert status == 2 and "max_new_tokens" in err and "--overwrite" in err


def test_a_resume_with_another_html_is_refused_and_the_same_one_given_another_way_resumes(
    trained, tmp_path, capsys, monkeypatch
):
    """Strips go to REPORT_files/ beside --html as pairs are captioned, and a resumed run skips the pairs already in
    the JSONL: resumed with another --html, its report showed the earlier pairs without pictures (exit 0). Refused
    now (exit 2, both reports named, nothing written); the same --html given another way resumes and its report
    shows every pair; --overwrite starts again with the new one."""
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 4)
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (tmp_path / "link").symlink_to(work)
    monkeypatch.chdir(work)
    base = ["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs, "--batch-size", "2", "--workers", "0"]
    out, first = work / "out" / "c.jsonl", work / "out" / "first.html"
    assert run(base + ["--out", out, "--html", first, "--quiet"], capsys)[0] == 0
    manifest = json.loads(out.with_name("c.jsonl.manifest.json").read_text())
    assert (manifest["html"], manifest["report_files"]) == (str(first), str(work / "out" / "first_files"))
    full = out.read_text()
    out.write_text("".join(full.splitlines(keepends=True)[:2]))  # killed after the first batch
    strips = sorted((work / "out" / "first_files" / "strips").iterdir())
    assert len(strips) == 4

    no_model = ["--checkpoint", tmp_path / "no_run", *base[2:]]  # the check comes before the model loads
    for other, argv in (("out/second.html", base), (tmp_path / "elsewhere" / "first.html", no_model)):
        status, _, err = run(argv + ["--out", "out/c.jsonl", "--html", other, "--quiet"], capsys)
        assert status == 2 and error_line(err) == (
            f"error: out/c.jsonl was captioned with --html {first} (its pairs' pictures are in "
            f"{work / 'out' / 'first_files'}); resuming with --html {other} would leave those pairs without pictures: "
            f"give --html {first} to resume, or --overwrite to start again"
        )
        assert out.read_text() == "".join(full.splitlines(keepends=True)[:2])
        assert sorted(p.name for p in (work / "out").iterdir()) == [
            "c.jsonl",
            "c.jsonl.manifest.json",
            "first.html",
            "first_files",
        ]
        assert not (tmp_path / "elsewhere").exists()

    # the same report given relative, or through a symlinked folder: resumed, every pair with its picture
    status, _, err = run(base + ["--out", out, "--html", tmp_path / "link" / "out" / "first.html", "--quiet"], capsys)
    assert status == 0 and "skipping 2 pair(s) already captioned" in err
    assert out.read_text() == full
    assert first.read_text().count('<img class="strip"') == 4
    out.write_text("".join(full.splitlines(keepends=True)[:2]))
    status, _, err = run(base + ["--out", "out/c.jsonl", "--html", "out/first.html", "--quiet"], capsys)
    assert status == 0 and "skipping 2 pair(s) already captioned" in err and out.read_text() == full

    status, _, err = run(base + ["--out", out, "--html", "out/second.html", "--overwrite", "--quiet"], capsys)
    assert status == 0 and out.read_text() == full
    assert (work / "out" / "second.html").read_text().count('<img class="strip"') == 4
    manifest = json.loads(out.with_name("c.jsonl.manifest.json").read_text())
    assert manifest["html"] == str(work / "out" / "second.html")
    # the app's browse tab, given only the captions, shows the strips of the report they were made with
    from davir.app.browse import strip_of
    from davir.viz.folder_report import strip_name

    row = rows_of(out)[0]
    assert strip_of(out, row) == (work / "out" / "second_files" / "strips" / strip_name(row["index"])).resolve()


def test_a_captions_manifest_that_is_no_json_object_is_named_and_overwrite_replaces_it(trained, tmp_path, capsys):
    """OUT.manifest.json holding a list (edited by hand, another file written over it) gave an AttributeError
    traceback on the rerun; now one line naming it (exit 2), and --overwrite starts again."""
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 2)
    out = tmp_path / "c.jsonl"
    argv = ["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs, "--out", out, "--workers", "0", "--quiet"]
    assert run(argv, capsys)[0] == 0
    manifest = out.with_name("c.jsonl.manifest.json")
    manifest.write_text("[1, 2]")
    status, _, err = run(argv, capsys)
    assert status == 2 and error_line(err) == (
        f"error: {manifest}: expected a JSON object (how c.jsonl was made), got list: pass --overwrite to start "
        "again, or another --out"
    )
    assert manifest.read_text() == "[1, 2]"
    assert run(argv + ["--overwrite"], capsys)[0] == 0 and json.loads(manifest.read_text())["status"] == "complete"


def test_a_rerun_with_the_same_folders_given_another_way_resumes(trained, tmp_path, capsys, monkeypatch):
    """The captions' manifest records the model and entity folders absolute: a rerun from another folder, through a
    symlink, resumes; a manifest of an older version (a relative entity folder) resumes from the folder it names
    from; another entity folder is refused."""
    from davir.inference.caption_store import CaptionStore

    pairs = pair_folder(tmp_path / "pairs", trained / "data", 2)
    out = tmp_path / "out" / "captions.jsonl"
    assert run(["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs, "--out", out, "--quiet"], capsys)[0] == 0
    manifest = json.loads(out.with_name("captions.jsonl.manifest.json").read_text())
    assert manifest["settings"]["model"] == str((trained / "runs" / "tiny" / "last").resolve())
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "link").symlink_to(trained)
    monkeypatch.chdir(tmp_path / "elsewhere")
    status, _, err = run(["--checkpoint", "link/runs/tiny", "--pairs", pairs, "--out", out, "--quiet"], capsys)
    assert status == 0 and "skipping 2 pair(s)" in err, err

    (tmp_path / "cache" / "entities").mkdir(parents=True)
    settings = {"model": str(tmp_path / "model"), "entities": str(tmp_path / "cache" / "entities")}
    store = CaptionStore(tmp_path / "e.jsonl", settings)
    store.manifest.write_text(json.dumps({"settings": {**settings, "entities": "cache/entities"}}))
    monkeypatch.chdir(tmp_path)
    store.prepare(overwrite=False, source="pairs")  # the older manifest's relative folder, from where it ran
    store.manifest.write_text(json.dumps({"settings": {**settings, "entities": "elsewhere"}}))
    with pytest.raises(DataError, match="entities differ"):
        store.prepare(overwrite=False, source="pairs")

    # a shard started on its own with --overwrite keeps a sibling's manifest and shard file when only the way a
    # folder was written differs (before, it removed the manifest, then refused the sibling's file as unexplained)
    sibling = CaptionStore(
        tmp_path / "s.jsonl", {**settings, "entities": "cache/entities"}, num_shards=2, shard_index=1
    )
    sibling.prepare(overwrite=False, source="pairs", whole_job=False)
    sibling.append(['{"id": "a", "index": 1, "caption": "x"}'])
    shard = CaptionStore(tmp_path / "s.jsonl", settings, num_shards=2, shard_index=0)
    shard.prepare(overwrite=True, source="pairs", whole_job=False)
    assert sibling.path.read_text() == '{"id": "a", "index": 1, "caption": "x"}\n'


def captioned_in_one_process(trained, tmp_path, n: int, capsys) -> tuple[list, Path]:
    """(the caption.py arguments but --out, the single-process JSONL) for `n` pairs: what sharded runs must equal."""
    pairs = pair_folder(tmp_path / "pairs", trained / "data", n)
    base = [
        "--checkpoint",
        trained / "runs" / "tiny",
        "--pairs",
        pairs,
        "--workers",
        "0",
        "--quiet",
        "--batch-size",
        "2",
    ]
    single = tmp_path / "single.jsonl"
    assert run(base + ["--out", single], capsys)[0] == 0
    return base, single


def test_shards_merge_into_the_single_process_output(trained, tmp_path, capsys):
    base, single = captioned_in_one_process(trained, tmp_path, 5, capsys)
    sharded = tmp_path / "sharded.jsonl"
    status, _, err = run(base + ["--out", sharded, "--num-shards", "2", "--shard-index", "1"], capsys)
    assert status == 0 and "shard 2/2" in err and not sharded.exists()
    assert run(base + ["--out", sharded, "--num-shards", "2", "--shard-index", "0"], capsys)[0] == 0
    assert [(r["id"], r["caption"]) for r in rows_of(sharded)] == [(r["id"], r["caption"]) for r in rows_of(single)]
    assert not list(tmp_path.glob("sharded.jsonl.shard-*"))
    # Restarted from scratch with --overwrite by a scheduler, the shards in any order: a shard clears only its
    # own file, never a sibling's finished (or running) share, and the merge still holds every pair.
    again = base + ["--out", sharded, "--num-shards", "2", "--overwrite"]
    assert run(again + ["--shard-index", "1"], capsys)[0] == 0
    assert not sharded.exists() and len(list(tmp_path.glob("sharded.jsonl.shard-*"))) == 2  # lines + .done
    assert run(again + ["--shard-index", "0"], capsys)[0] == 0
    assert [(r["id"], r["caption"]) for r in rows_of(sharded)] == [(r["id"], r["caption"]) for r in rows_of(single)]


@pytest.mark.slow  # accelerate launch of two fresh processes: about a minute of CPU
def test_two_cpu_processes_under_accelerate_give_the_single_process_captions(trained, tmp_path, capsys):
    """Issue 20's target: `accelerate launch` with 2 CPU processes, one merged file, the same captions in order."""
    import subprocess

    base, single = captioned_in_one_process(trained, tmp_path, 7, capsys)
    launcher = Path(sys.executable).parent / "accelerate"
    command = [
        str(launcher),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(REPO / "caption.py"),
        *map(str, base),
        "--out",
        str(tmp_path / "two.jsonl"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "shard 2/2" in result.stderr  # two processes really shared the pairs
    two = rows_of(tmp_path / "two.jsonl")
    assert [(r["id"], r["caption"], r["entities"]) for r in two] == [
        (r["id"], r["caption"], r["entities"]) for r in rows_of(single)
    ]
    assert not list(tmp_path.glob("two.jsonl.shard-*"))


def test_under_accelerate_the_other_processes_wait_for_the_merge_and_leave_the_status_to_it(
    trained, tmp_path, monkeypatch
):
    """A process of `accelerate launch` whose share had a failed pair exited 1 right after captioning; torch's
    launcher then SIGTERMs the others, the main one in its merge (exit 143, no merged JSONL, and the same again on
    every rerun). The two processes are two threads here, an accelerate state's barrier a threading.Barrier."""
    import threading
    import time
    from types import SimpleNamespace

    from davir.inference import ChangeCaptioner
    from davir.inference.folder import _caption_locked
    from davir.viz import folder_report

    pairs = pair_folder(tmp_path / "pairs", trained / "data", 4)
    (pairs / "before" / "p03.png").write_bytes(b"not a png")  # a failed pair in the second process's share
    records = read_folder_pairs(pairs).pairs
    write_report = folder_report.write_folder_report

    def slow_report(*args, **kwargs):  # the main process's merge and report take a while (a big folder)
        time.sleep(1.0)
        return write_report(*args, **kwargs)

    monkeypatch.setattr(folder_report, "write_folder_report", slow_report)
    barrier, out, html = threading.Barrier(2), tmp_path / "c.jsonl", tmp_path / "report.html"
    summaries, report_there = {}, {}

    def process(index: int) -> None:
        state = SimpleNamespace(wait_for_everyone=barrier.wait, device=torch.device("cpu"))
        captioner = ChangeCaptioner.from_pretrained(trained / "runs" / "tiny")
        summaries[index] = _caption_locked(
            captioner,
            records,
            [],
            str(pairs),
            "pairs",
            out,
            html,
            2,
            index,
            state,
            report_limit=10,
            overwrite=False,
            batch_size=2,
            workers=0,
            progress=False,
        )
        report_there[index] = html.is_file()

    other = threading.Thread(target=process, args=(1,))
    other.start()
    process(0)
    other.join()
    assert report_there[1]  # the second process returned only once the report was written
    assert summaries[1].status == 0 and summaries[1].failed == 1 and not summaries[1].merged
    assert summaries[0].status == 1 and summaries[0].failed == 1 and summaries[0].captioned == 3
    assert [row["id"] for row in rows_of(out)] == ["p00", "p01", "p02", "p03"]


def test_python_api_takes_paths_images_and_arrays_like_caption_py(trained, tmp_path, capsys):
    from davir import ChangeCaptioner

    pairs = pair_folder(tmp_path / "pairs", trained / "data", 2)
    out = tmp_path / "c.jsonl"
    assert run(["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs, "--out", out, "--quiet"], capsys)[0] == 0
    expected = [r["caption"] for r in rows_of(out)]
    captioner = ChangeCaptioner.from_pretrained(trained / "runs" / "tiny", device="cpu")
    befores = [pairs / "before" / f"p{i:02d}.png" for i in range(2)]
    afters = [pairs / "after" / f"p{i:02d}.png" for i in range(2)]
    assert captioner.caption(befores[0], afters[0]).caption == expected[0]
    images = captioner.caption([Image.open(p) for p in befores], [Image.open(p) for p in afters])
    assert [r.caption for r in images] == expected
    arrays = captioner.caption(
        np.asarray(Image.open(befores[1]).convert("RGB")), np.asarray(Image.open(afters[1]).convert("RGB"))
    )
    assert arrays.caption == expected[1] and arrays.error is None


def test_python_api_reads_arrays_of_every_common_dtype_in_their_usual_range(trained, tmp_path):
    from davir import ChangeCaptioner
    from davir.data.images import array_to_rgb

    pairs = pair_folder(tmp_path / "pairs", trained / "data", 1)
    before, after = (np.asarray(Image.open(pairs / side / "p00.png").convert("RGB")) for side in ("before", "after"))
    # the same pixels in each common dtype and layout read back as the same uint8 RGB image, exactly
    same = {
        "float32 [0, 1]": lambda a: a.astype(np.float32) / 255,
        "float64 [0, 1]": lambda a: a / 255.0,
        "float16 [0, 1]": lambda a: (a / 255.0).astype(np.float16),
        "uint16 0-65535": lambda a: a.astype(np.uint16) * 257,
        "int64 0-255": lambda a: a.astype(np.int64),
        "opaque RGBA": lambda a: np.dstack([a, np.full(a.shape[:2], 255, np.uint8)]),
    }
    for name, convert in same.items():
        assert np.array_equal(np.asarray(array_to_rgb(convert(before), name="before")), before), name
    gray = before[..., 0]
    assert np.array_equal(np.asarray(array_to_rgb(gray / 255.0, name="g")), np.dstack([gray] * 3))
    assert np.array_equal(np.asarray(array_to_rgb(gray[..., None], name="g")), np.dstack([gray] * 3))
    mask = gray > 100  # bool: False black, True white (not 0 and 1, which are both black)
    assert set(np.unique(np.asarray(array_to_rgb(mask, name="m")))) == {0, 255}

    captioner = ChangeCaptioner.from_pretrained(trained / "runs" / "tiny", device="cpu")
    expected = captioner.caption(before, after)
    assert expected.caption and expected.error is None
    assert captioner.caption(before / 255.0, after.astype(np.float32) / 255).caption == expected.caption
    assert captioner.caption(before.astype(np.uint16) * 257, after).caption == expected.caption
    refused = {
        "float64": (before.astype(np.float64), "[0, 1]", "to 255.0", "/ 255"),
        "int32": (before.astype(np.int32) + 200, "to 455", "0-255"),
        "complex128": (before.astype(np.complex128), "complex128", "uint8"),
        "float32": (np.where(before > 100, np.nan, 0.5).astype(np.float32), "NaN", "[0, 1]"),
    }
    for dtype, (array, *words) in refused.items():
        with pytest.raises(DataError) as caught:
            captioner.caption(array, after)
        message = str(caught.value)
        assert message.startswith("before: ") and dtype in message and all(word in message for word in words), message
    with pytest.raises(DataError, match=r"after: .*shape \(72, 96, 2\)"):
        captioner.caption(before, after[..., :2])


def test_evaluate_checkpoint_finds_the_runs_data_from_any_folder(trained, tmp_path, capsys, monkeypatch):
    from davir.cli import evaluate as evaluate_script

    monkeypatch.chdir(tmp_path)  # data.root=data is relative to the training folder, not to here
    args = ["--split", "train", "--limit", "2", "--no-spice", "--metrics", "CIDEr"]
    status = evaluate_script.main(
        [
            "--checkpoint",
            str(trained / "runs" / "tiny"),
            *args,
            "--out",
            str(tmp_path / "m.json"),
            "--markdown",
            str(tmp_path / "m.md"),
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "m.json").read_text())["rows"]["total"]["num_pairs"] == 2
    moved = tmp_path / "elsewhere" / "tiny"  # copied to a machine where neither folder exists
    shutil.copytree(trained / "runs" / "tiny", moved)
    info = json.loads((moved / "run_info.json").read_text())
    (moved / "run_info.json").write_text(json.dumps({**info, "cwd": "/nonexistent/other-machine/work"}))
    capsys.readouterr()
    assert evaluate_script.main(["--checkpoint", str(moved), *args, "--out", str(tmp_path / "x.json")]) == 2
    first = error_line(capsys.readouterr().err)
    assert "dataset root (data.root)" in first and "pass --root" in first


def test_a_run_works_from_any_folder_and_a_moved_one_names_the_flag(trained, tmp_path, capsys, monkeypatch):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 1)
    monkeypatch.chdir(tmp_path)  # not the folder the run was trained in
    out = tmp_path / "o" / "c.jsonl"
    assert run(["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs, "--out", out, "--quiet"], capsys)[0] == 0
    # trained with an absolute run.output_dir (`make demo DEMO_RUN=/abs/runs/demo`): the training folder comes from
    # run_info.json's cwd, so the relative caches and base model folder still resolve from here
    absolute = tmp_path / "abs" / "tiny"
    shutil.copytree(trained / "runs" / "tiny", absolute)
    config = yaml.safe_load((absolute / "config.yaml").read_text())
    config["run"]["output_dir"] = str(absolute)
    (absolute / "config.yaml").write_text(yaml.safe_dump(config))
    assert json.loads((absolute / "run_info.json").read_text())["cwd"] == str(trained)
    assert run(["--checkpoint", absolute, "--pairs", pairs, "--out", tmp_path / "a.jsonl", "--quiet"], capsys)[0] == 0
    assert rows_of(tmp_path / "a.jsonl") == rows_of(out)
    # copied to another machine: neither its training folder nor the caches exist there
    moved = tmp_path / "elsewhere" / "tiny"
    shutil.copytree(trained / "runs" / "tiny", moved)
    info = json.loads((moved / "run_info.json").read_text())
    (moved / "run_info.json").write_text(json.dumps({**info, "cwd": "/nonexistent/other-machine/work"}))
    status, _, err = run(["--checkpoint", moved, "--pairs", pairs, "--out", tmp_path / "m.jsonl"], capsys)
    assert status == 2
    first = error_line(err)
    assert "mask cache (data.masks)" in first and "masks" in first and "--masks-from" in first
    assert (
        run(
            [
                "--checkpoint",
                moved,
                "--pairs",
                pairs,
                "--out",
                tmp_path / "m.jsonl",
                "--masks-from",
                trained / "masks",
                "--quiet",
            ],
            capsys,
        )[0]
        == 0
    )
    status, _, err = run(
        [
            "--checkpoint",
            moved,
            "--pairs",
            pairs,
            "--out",
            tmp_path / "n.jsonl",
            "--masks-from",
            tmp_path / "no_such_cache",
        ],
        capsys,
    )
    assert status == 2 and str(tmp_path / "no_such_cache") in error_line(err)


def test_bad_images_get_a_per_pair_error_and_the_good_pairs_are_kept(trained, tmp_path, capsys):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 2)
    Image.new("L", (20000, 20000)).save(pairs / "before" / "bomb.png")  # ~400 KB, over PIL's pixel limit
    Image.new("L", (20000, 20000)).save(pairs / "after" / "bomb.png")
    for name, size in (("one", (1, 1)), ("two", (2, 1))):
        Image.new("RGB", size, (200, 10, 10)).save(pairs / "before" / f"{name}.png")
        Image.new("RGB", size, (10, 10, 200)).save(pairs / "after" / f"{name}.png")
    out = tmp_path / "out.jsonl"
    status, stdout, err = run(
        ["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs, "--out", out, "--quiet"], capsys
    )
    assert status == 1  # done, some pairs failed and listed (docs/errors.md)
    rows = {r["id"]: r for r in rows_of(out)}
    assert "too large to decode safely" in rows["bomb"]["error"] and "bomb.png" in rows["bomb"]["error"]
    assert all(rows[k]["caption"] and rows[k]["error"] is None for k in ("p00", "p01", "one", "two"))
    assert "note: bomb:" in err


def test_a_rerun_retries_the_pairs_that_failed_and_replaces_their_rows(trained, tmp_path, capsys):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 3)
    image = pairs / "before" / "p01.png"
    good = image.read_bytes()
    image.write_bytes(good[: len(good) // 3])  # a cut download
    out = tmp_path / "out" / "captions.jsonl"
    argv = lambda out: [
        "--checkpoint",
        trained / "runs" / "tiny",
        "--pairs",
        pairs,
        "--out",
        out,  # noqa: E731
        "--batch-size",
        "2",
        "--workers",
        "0",
        "--quiet",
    ]
    status, stdout, _ = run(argv(out), capsys)
    rows = rows_of(out)
    assert status == 1 and "captioned 2 pair(s), 1 not captioned" in stdout
    assert [r["id"] for r in rows] == ["p00", "p01", "p02"] and "p01.png" in rows[1]["error"]

    image.write_bytes(good)  # fixed: the rerun captions it instead of reporting the old error again
    # A strip a killed run was writing (SIGKILL runs no cleanup): the rerun, holding the lock, removes it.
    stale = tmp_path / "out" / "report_files" / "strips" / ".0000001.jpg.999999.deadbeef.tmp"
    stale.write_bytes(b"half a JPEG")
    status, stdout, err = run(argv(out), capsys)
    assert not stale.exists()
    assert status == 0 and "skipping 2 pair(s) already captioned" in err
    assert "retrying 1 pair(s) that failed in an earlier run" in err
    assert "captioned 3 pair(s), 0 not captioned; 1 this run (1 retried)" in stdout
    assert (tmp_path / "out" / "report_files" / "strips" / "0000001.jpg").is_file()
    # One row per pair, the failed one replaced in place: the output of one run on the fixed folder.
    fresh = tmp_path / "fresh.jsonl"
    assert run(argv(fresh), capsys)[0] == 0
    assert out.read_text() == fresh.read_text()
    assert "skipping 3 pair(s)" in run(argv(out), capsys)[2] and out.read_text() == fresh.read_text()


def test_a_folder_as_an_image_and_a_folder_without_pairs_are_named(trained, tmp_path, capsys):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 1)
    manifest = tmp_path / "pairs.csv"
    manifest.write_text(
        f"before,after,id\n{pairs / 'before' / 'p00.png'},{pairs / 'after'},folder\n"
        f"{pairs / 'before' / 'p00.png'},{pairs / 'after' / 'p00.png'},fine\n"
    )
    out = tmp_path / "c.jsonl"
    status, _, _ = run(
        ["--checkpoint", trained / "runs" / "tiny", "--pairs", manifest, "--out", out, "--quiet"], capsys
    )
    rows = {r["id"]: r for r in rows_of(out)}
    assert status == 1 and rows["fine"]["caption"]
    assert (
        rows["folder"]["error"] == f"record 'folder': the image path is a folder, not an image file: {pairs / 'after'}"
    )

    lonely = tmp_path / "lonely"  # every image lacks its partner (misnamed files): nothing to caption
    (lonely / "before").mkdir(parents=True)
    (lonely / "after").mkdir()
    for side, name in (("before", "a"), ("before", "b"), ("before", "c"), ("after", "z")):
        Image.new("RGB", (4, 4)).save(lonely / side / f"{name}.png")
    status, _, err = run(["--checkpoint", trained / "runs" / "tiny", "--pairs", lonely, "--quiet"], capsys)
    assert status == 2 and error_line(err) == (
        f"error: no pairs found in {lonely}: 4 file(s) without a partner, e.g. a.png (before image has no matching "
        "after image (expected name 'a')); b.png (before image has no matching after image (expected name 'b')); "
        "c.png (before image has no matching after image (expected name 'c'))"
    )
    assert not (lonely / "captions.jsonl").exists()


def test_outputs_are_checked_before_any_work(trained, tmp_path, capsys, make_read_only):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 1)
    base = ["--checkpoint", trained / "runs" / "tiny", "--pairs", pairs]
    (tmp_path / "existing").mkdir()
    status, _, err = run(base + ["--out", tmp_path / "existing"], capsys)
    assert status == 2 and err.splitlines() == [
        f"error: --out {tmp_path / 'existing'} is a folder; give a file path "
        f"(e.g. {tmp_path / 'existing' / 'captions.jsonl'})"
    ]
    (tmp_path / "afile").write_text("x")
    status, _, err = run(base + ["--out", tmp_path / "afile" / "c.jsonl"], capsys)
    assert status == 2 and len(err.splitlines()) == 1 and f"{tmp_path / 'afile'} is a file" in err
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".probe"))]
    (tmp_path / "ro").mkdir()
    read_only = make_read_only(tmp_path / "ro")
    status, _, err = run(base + ["--out", read_only / "c.jsonl"], capsys)
    assert status == 2 and err.splitlines() == [
        f"error: --out {read_only / 'c.jsonl'} is not writable: permission denied in {read_only}"
    ]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".probe"))]


def test_out_or_html_on_the_manifest_being_captioned_is_refused_whatever_the_flags(tmp_path, capsys):
    """--overwrite replaces an earlier output, never the pairs.csv/.jsonl --pairs reads: checked before the model
    loads (the checkpoint here does not exist), nothing written."""
    for name, value in (("a", 10), ("b", 20)):
        Image.new("RGB", (16, 12), (value, value, value)).save(tmp_path / f"{name}.png")
    manifest = tmp_path / "pairs.jsonl"
    manifest.write_text('{"id": "x", "before": "a.png", "after": "b.png"}\n')
    for flag, pairs in (("--out", tmp_path), ("--out", manifest), ("--html", tmp_path)):
        extra = ["--out", tmp_path / "captions.jsonl"] if flag == "--html" else []
        argv = ["--checkpoint", tmp_path / "no_run", "--pairs", pairs, flag, manifest, *extra, "--overwrite"]
        status, _, err = run(argv, capsys)
        assert status == 2 and err.splitlines() == [
            f"error: {flag} {manifest} is the manifest of the pairs being captioned, which it would replace; "
            f"give another {flag}"
        ]
        assert manifest.read_text() == '{"id": "x", "before": "a.png", "after": "b.png"}\n'
        assert sorted(path.name for path in tmp_path.iterdir()) == ["a.png", "b.png", "pairs.jsonl"]


def test_html_over_the_jsonl_or_its_files_is_refused_before_the_model_loads(tmp_path, capsys):
    """`--html` equal to `--out` wrote the report over the captions (exit 0), and the rerun stopped with a
    JSONDecodeError traceback; over OUT.manifest.json it replaced the record of the settings. Refused, nothing
    written (the checkpoint here does not exist: the check comes first)."""
    for name, value in (("a", 10), ("b", 20)):
        Image.new("RGB", (16, 12), (value, value, value)).save(tmp_path / f"{name}.png")
    (tmp_path / "pairs.csv").write_text("id,before,after\nx,a.png,b.png\n")
    out = tmp_path / "out" / "c.jsonl"
    for html in (out, out.with_name("c.jsonl.manifest.json"), tmp_path / "out" / ".." / "out" / "c.jsonl.lock"):
        argv = ["--checkpoint", tmp_path / "no_run", "--pairs", tmp_path / "pairs.csv", "--out", out, "--html", html]
        status, _, err = run(argv, capsys)
        assert status == 2 and err.splitlines() == [
            f"error: --html {html} is the --out file, which it would replace; give another --html"
            if html == out
            else f"error: --html {html} would be written over --out {out} or its c.jsonl.* files; give another --html"
        ]
        assert not out.parent.exists()
    # the same file through a symlinked folder: the paths are compared resolved, and the --out text is named
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    out, html = tmp_path / "real" / "c.jsonl", tmp_path / "link" / "c.jsonl"
    argv = ["--checkpoint", tmp_path / "no_run", "--pairs", tmp_path / "pairs.csv", "--out", out, "--html", html]
    status, _, err = run(argv, capsys)
    assert status == 2 and err.splitlines() == [
        f"error: --html {html} is the --out file ({out}), which it would replace; give another --html"
    ]
    assert list((tmp_path / "real").iterdir()) == []


def test_a_jsonl_that_is_not_caption_rows_is_named_not_a_traceback(tmp_path):
    """A rerun over an --out that holds something else (a report written over it by an earlier version, a file
    edited by hand) stopped with a JSONDecodeError or KeyError traceback: now the file and line are named."""
    from davir.inference.caption_store import CaptionStore

    out = tmp_path / "c.jsonl"
    row = {"id": "x", "index": 0, "caption": "c", "entities": [], "error": None}
    for bad, reason in (
        ("<!doctype html><html>", "JSONDecodeError"),
        ('{"index": 1}', "KeyError"),
        ("[1]", "TypeError"),
    ):
        out.write_text(json.dumps(row) + "\n\n" + bad + "\n")
        with pytest.raises(
            DataError, match=rf"^{out}: line 3 is not a row caption.py writes \({reason}: .*--overwrite"
        ):
            CaptionStore(out, {}).earlier_rows()
    out.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "y", "error": "bad"}) + '\n{"id": "z", "cut')
    assert CaptionStore(out, {}).earlier_rows() == ({"x"}, {"y"})  # a killed run's cut last line is still repaired
    assert out.read_text().endswith('"error": "bad"}\n')
    out.write_bytes(b'{"id": "caf\xe9", "error": null}\n')  # edited in a Latin-1 editor
    with pytest.raises(DataError, match=rf"^{out}: not UTF-8 text as caption.py writes it .*--overwrite"):
        CaptionStore(out, {}).earlier_rows()


@pytest.mark.parametrize(
    "flag, value, minimum",
    [
        ("--batch-size", "0", 1),
        ("--batch-size", "-3", 1),
        ("--workers", "-1", 0),
        ("--num-shards", "0", 1),
        ("--report-limit", "-1", 0),
        ("--shard-index", "-1", 0),
    ],
)
def test_a_count_out_of_range_is_a_usage_error_before_the_model_loads(tmp_path, capsys, flag, value, minimum):
    # --batch-size 0 and --workers -1 loaded the model, then stopped in torch's DataLoader with a ValueError
    # traceback; --num-shards 0 ran as one shard and --report-limit -1 showed no pair, silently
    with pytest.raises(SystemExit) as stopped:
        caption_script.main(["--checkpoint", str(tmp_path / "no_run"), "--pairs", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"argument {flag}: must be {minimum} or more, got {value}" in err
    assert list(tmp_path.iterdir()) == []


def test_online_masks_rebuild_the_cache_segmenter_or_say_what_is_missing(trained, tmp_path, monkeypatch):
    from davir.preprocessing.online import OnlineMasks
    from davir.preprocessing.segmenters import SAM_TYPES
    from tests.test_masks import build_tiny_sam

    torch.manual_seed(0)
    monkeypatch.setitem(SAM_TYPES, "tiny_test", build_tiny_sam)
    checkpoint = tmp_path / "tiny_sam.pth"
    torch.save(build_tiny_sam().state_dict(), checkpoint)
    cache = tmp_path / "sam_cache"
    assert (
        masks_job.main(
            [
                "--format",
                "clevr_change",
                "--root",
                str(trained / "data"),
                "--split",
                "train",
                "--out",
                str(cache),
                "--limit",
                "1",
                "--segmenter",
                "sam",
                "--sam-type",
                "tiny_test",
                "--device",
                "cpu",
                "--sam-checkpoint",
                str(checkpoint),
            ]
        )
        == 0
    )
    online = OnlineMasks.from_cache(cache)
    assert online.segmenter.name == "sam" and online.segmenter.model_type == "tiny_test"
    # The online masks are the cache's masks: same segmenter, same settings.
    from davir.data.caches import MaskCache
    from davir.data.formats import read_dataset

    pair = read_dataset("clevr_change", trained / "data", "train").pairs[0]
    cached = MaskCache(cache).read(pair.pair_id)
    assert np.array_equal(online(pair).after, cached.after)
    checkpoint.rename(tmp_path / "moved.pth")
    with pytest.raises(DataError, match=r"not found: pass --sam-checkpoint") as error:
        OnlineMasks.from_cache(cache)
    assert str(checkpoint) in str(error.value)
    assert OnlineMasks.from_cache(cache, sam_checkpoint=tmp_path / "moved.pth").segmenter.name == "sam"
    with pytest.raises(DataError, match="mask cache not found: .*--masks-from"):
        OnlineMasks.from_cache(tmp_path / "nowhere")


@pytest.mark.slow
def test_a_lightweight_run_captions_a_folder_as_evaluate_does(trained, tmp_path, capsys):
    """SCORER through caption.py: online features of the run's (seeded random-init) backbone give the captions
    evaluate.py gives from the `preprocess features` cache."""
    from davir.data.formats import read_dataset
    from davir.evaluation import evaluate_run
    from davir.jobs.features import main as features_main
    from tests.test_lightweight_train import TINY

    data = trained / "data"
    features = tmp_path / "features"
    for split in ("train", "val", "test"):
        assert (
            features_main(
                [
                    "--format",
                    "clevr_change",
                    "--root",
                    str(data),
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
    config = load_config(
        TrainConfig,
        None,
        [
            "method=scorer",
            "lightweight.method=scorer",
            "data.format=clevr_change",
            f"data.root={data}",
            f"data.features={features}",
            f"run.output_dir={tmp_path / 'scorer'}",
            *TINY,
        ],
    )
    run_dir = train_script.train(config)
    test_pairs = read_dataset("clevr_change", data, "test").pairs[:3]
    pairs = tmp_path / "pairs"
    (pairs / "before").mkdir(parents=True)
    (pairs / "after").mkdir()
    for pair in test_pairs:
        shutil.copy(pair.before, pairs / "before" / f"{pair.pair_id}.png")
        shutil.copy(pair.after, pairs / "after" / f"{pair.pair_id}.png")
    out = tmp_path / "c.jsonl"
    status, _, err = run(["--checkpoint", run_dir, "--pairs", pairs, "--out", out, "--quiet"], capsys)
    assert status == 0, err
    cached = evaluate_run(run_dir / "last", "test", limit=3, metrics=("BLEU",), spice=False, echo=False, progress=False)
    assert not cached.failed and list(cached.predictions) == [pair.pair_id for pair in test_pairs]
    assert {r["id"]: r["caption"] for r in rows_of(out)} == cached.predictions
    assert all(cached.predictions.values())
