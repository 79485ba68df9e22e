"""davir-export as a careless or hostile user drives it (issue 49 items 1, 9, 11, 14, 15; issue 50 §3): `--overwrite`
never removes the run, the current folder or anything it did not write; bad devices, a full disk, a damaged
model folder and signals end in one line; the card's front matter is YAML whatever the names; what is shared
holds no absolute path of the training machine; weight files follow the user's umask."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from davir.cli import export as export_script  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY_BLIP = REPO / "assets" / "tiny_instructblip"


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """A LoRA DAVIR model (extra_trainable parts too) over a copy of the tiny pretrained InstructBLIP, saved."""
    from davir.models.vlm.build import build_davir_model
    from davir.models.vlm.config import DavirModelConfig
    from davir.models.vlm.epc import EpcConfig

    work = tmp_path_factory.mktemp("saved")
    base = work / "tiny blip"
    shutil.copytree(TINY_BLIP, base)
    config = DavirModelConfig(
        pretrained=str(base), extra_trainable=("language_projection",), epc=EpcConfig(use_entities=False)
    )
    build_davir_model(config).save_pretrained(work / "model")
    return work / "model"


@pytest.fixture
def run(saved_model, tmp_path) -> Path:
    """A run folder as training leaves it: config.yaml, run_info.json, best/, last/, checkpoints/, a log."""
    folder = tmp_path / "work" / "runs" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("run:\n  output_dir: runs/tiny\n")
    (folder / "run_info.json").write_text(
        json.dumps({"cwd": str(tmp_path / "work"), "seed": 0, "command": ["train.py", "--config", "configs/demo.yaml"]})
    )
    shutil.copytree(saved_model, folder / "best")
    shutil.copytree(saved_model, folder / "last")
    (folder / "checkpoints" / "step_2").mkdir(parents=True)
    (folder / "checkpoints" / "step_2" / "COMPLETE").write_text("{}")
    (folder / "train_log.jsonl").write_text('{"step": 1}\n')
    return folder


def export(*argv) -> int:
    return export_script.main([str(a) for a in argv])


# ------------------------------------------------------------------------------ item 1: --overwrite loses nothing
def test_overwrite_onto_the_run_itself_is_refused_and_the_run_kept(run, capsys):
    before = tree(run)
    for out in (run, run / "best", run.parent):  # is, lies inside, holds the run
        assert export("--checkpoint", run, "--out", out, "--overwrite") == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --out ") and "the exported folder" in err and err.count("\n") == 1, err
    assert tree(run) == before


def test_overwrite_onto_the_current_folder_is_refused_and_nothing_deleted(run, tmp_path, monkeypatch, capsys):
    here = tmp_path / "desk" / "mine"
    here.mkdir(parents=True)
    (here / "notes.txt").write_text("my notes")
    monkeypatch.chdir(here)
    assert export("--checkpoint", run, "--out", ".", "--overwrite") == 2
    assert "is the current folder" in capsys.readouterr().err
    assert tree(here) == {"notes.txt": b"my notes"}
    monkeypatch.chdir(here)
    assert export("--checkpoint", run, "--out", "..", "--overwrite") == 2  # holds the current folder
    assert "holds the current folder" in capsys.readouterr().err
    assert tree(here) == {"notes.txt": b"my notes"}


def test_overwrite_refuses_a_home_or_the_root(run, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    (home / ".bashrc").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    for out in (home, home.parent, Path("/")):
        assert export("--checkpoint", run, "--out", out, "--overwrite") == 2
        err = capsys.readouterr().err
        assert "your home folder" in err or "the root folder" in err, err
    assert (home / ".bashrc").read_text() == "x"


def test_overwrite_replaces_only_an_earlier_export(run, tmp_path, capsys):
    foreign = tmp_path / "exports" / "foreign"
    foreign.mkdir(parents=True)
    (foreign / "thesis.tex").write_text("years of work")
    assert export("--checkpoint", run, "--out", foreign, "--overwrite") == 2
    assert "did not write" in capsys.readouterr().err
    assert tree(foreign) == {"thesis.tex": b"years of work"}
    assert not (foreign.parent / ".foreign.partial").exists()

    out = tmp_path / "exports" / "demo"
    assert export("--checkpoint", run, "--out", out) == 0
    (out / "stale.txt").write_text("from the first export")
    assert export("--checkpoint", run, "--out", out) == 2  # no --overwrite
    assert export("--checkpoint", run, "--out", out, "--overwrite") == 0
    assert (out / "davir_export.json").is_file() and not (out / "stale.txt").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["demo", "foreign"]  # nothing set aside is left
    assert ".davir-export-partial" not in tree(out) and ".davir-export-partial" not in (out / "README.md").read_text()


def test_an_out_that_is_a_symlink_is_named_as_one_and_left_alone(run, tmp_path, capsys):
    out = tmp_path / "exports" / "demo"
    assert export("--checkpoint", run, "--out", out) == 0
    before = tree(out)
    link = tmp_path / "latest"
    link.symlink_to(out, target_is_directory=True)
    assert export("--checkpoint", run, "--out", link, "--overwrite") == 2
    assert capsys.readouterr().err == (
        f"error: --out {link} is a symlink (to {out}): give the folder it leads to, or another --out\n"
    )
    assert tree(out) == before and link.is_symlink()


def test_a_stale_partial_folder_not_ours_is_kept(run, tmp_path, capsys):
    out = tmp_path / "exports" / "demo"
    partial = tmp_path / "exports" / ".demo.partial"
    partial.mkdir(parents=True)
    (partial / "keep.txt").write_text("mine")
    assert export("--checkpoint", run, "--out", out) == 2
    assert "was not left by davir-export" in capsys.readouterr().err
    assert tree(partial) == {"keep.txt": b"mine"} and not out.exists()


def test_a_failed_overwrite_keeps_the_earlier_export(run, tmp_path, capsys):
    out = tmp_path / "exports" / "demo"
    assert export("--checkpoint", run, "--out", out) == 0
    before = tree(out)
    assert export("--checkpoint", run, "--out", out, "--overwrite", "--base-model", tmp_path / "nowhere") == 2
    assert "--base-model" in capsys.readouterr().err
    assert tree(out) == before and not (out.parent / ".demo.partial").exists()


# ------------------------------------------------------------------------------------------- item 15: SIGTERM
def test_a_stop_right_after_the_partial_folder_is_made_leaves_nothing(run, tmp_path, monkeypatch):
    """A SIGTERM (raised by stop_on_signals as an exception) between the partial folder's mkdir and its marker,
    the window the subprocess test below sometimes hit under load: the cleanup must already cover it."""
    from davir.export import target
    from davir.export.exporter import export_run

    real_touch = Path.touch

    def stopped(path, *args, **kwargs):
        if path.name == target.PARTIAL_MARKER:
            raise KeyboardInterrupt
        return real_touch(path, *args, **kwargs)

    out = tmp_path / "exports" / "merged"
    monkeypatch.setattr(Path, "touch", stopped)
    with pytest.raises(KeyboardInterrupt):
        export_run(run, out)
    assert sorted(p.name for p in out.parent.iterdir()) == []


@pytest.mark.slow
def test_sigterm_stops_with_one_line_and_leaves_no_partial_folder(run, tmp_path):
    import signal
    import subprocess
    import time

    out = tmp_path / "exports" / "merged"
    partial = out.parent / ".merged.partial"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "davir.export", "--checkpoint", str(run), "--out", str(out), "--merge"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=handle,
        )
    try:
        deadline = time.monotonic() + 120
        while not partial.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert process.poll() is None, f"the export ended before the signal: {stderr.read_text()[-2000:]}"
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = stderr.read_text()
    assert status == 143, text
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == "stopped by SIGTERM; rerun the same command to start it again"
    assert not partial.exists() and not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == []


# ----------------------------------------------------------------- item 9: --device, a full disk under --merge
@pytest.mark.parametrize(
    "device, message",
    [
        ("tpu", "--device tpu: not a device name"),
        ("cuda", "--device cuda: this machine has no CUDA GPU"),
        ("meta", "--device meta: davir-export merges on cpu, cuda or mps"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line_before_any_work(run, tmp_path, capsys, device, message):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        device, message = f"cuda:{torch.cuda.device_count()}", "CUDA GPU(s), cuda:0 to"
    out = tmp_path / "exports" / "merged"
    assert export("--checkpoint", run, "--out", out, "--merge", "--device", device) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def _limited_file_size(limit: int):
    def apply() -> None:  # in the child: files may not grow past `limit` bytes (EFBIG), as a full disk stops them
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
def test_merge_that_cannot_write_its_weights_is_one_line(run, tmp_path):
    """A write error inside safetensors (a SafetensorError, not an OSError): the model.safetensors of the merged
    tiny InstructBLIP (8 MB) may not grow past 1 MB."""
    import subprocess

    out = tmp_path / "exports" / "merged"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "davir.export", "--checkpoint", str(run), "--out", str(out), "--merge"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited_file_size(1 << 20),
    )  # pipes, not files: stderr is not limited
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and lines[-1].endswith("model.safetensors: file too large"), lines
    assert list(out.parent.iterdir()) == []  # the partial folder went with it


def test_a_full_disk_inside_safetensors_names_the_file_and_the_fix(tmp_path):
    from safetensors import SafetensorError

    from davir.errors import describe_os_error
    from davir.export.weights import safetensors_os_error

    path = tmp_path / "model.safetensors"
    error = safetensors_os_error(
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"), path
    )
    assert describe_os_error(error) == f"{path}: no space left on device (free some disk space)"
    assert safetensors_os_error(SafetensorError("Error while deserializing header: HeaderTooLarge"), path) is None


# ----------------------------------------------------------------------------- item 11: a damaged model folder
def test_a_model_folder_missing_its_extra_weights_is_not_exported(run, tmp_path, capsys):
    (run / "best" / "trainable_extra.safetensors").unlink()
    for merge in ([], ["--merge"]):
        out = tmp_path / "exports" / f"x{len(merge)}"
        assert export("--checkpoint", run, "--out", out, *merge) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"error: {run / 'best' / 'trainable_extra.safetensors'}: missing"), err
        assert "language_projection" in err and not out.exists()


def test_a_davir_config_without_its_lora_key_is_named(run, tmp_path, capsys):
    path = run / "best" / "davir_config.json"
    meta = json.loads(path.read_text())
    del meta["config"]["lora"]
    path.write_text(json.dumps(meta))
    for merge in ([], ["--merge"]):
        assert export("--checkpoint", run, "--out", tmp_path / "exports" / f"y{len(merge)}", *merge) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"error: {path}: config lacks key 'lora'") and "adapter_model" not in err, err


# ----------------------------------------------------------- item 14: the card's YAML, no paths of this machine
def front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card[4 : card.index("\n---\n", 4)])


def test_card_front_matter_is_yaml_whatever_the_licence_and_base_name(saved_model, tmp_path):
    base = tmp_path / "tiny: v1"
    shutil.copytree(saved_model.parent / "tiny blip", base)
    out = tmp_path / "exports" / "demo"
    assert (
        export(
            "--checkpoint",
            saved_model,
            "--out",
            out,
            "--base-model",
            base,
            "--license",
            "mit\nlibrary_name: evil\ninjected: true",
        )
        == 0
    )
    meta = front_matter((out / "README.md").read_text())
    assert meta["license"] == "mit\nlibrary_name: evil\ninjected: true" and "injected" not in meta
    assert meta["base_model"] == "tiny: v1" and meta["library_name"] == "peft"
    assert meta["tags"] == ["davir", "image-change-captioning", "change-captioning", "lora"]


def test_an_export_holds_no_absolute_path_of_the_training_machine(run, saved_model, tmp_path):
    work = tmp_path / "work"
    (run / "config.yaml").write_text(f"run:\n  output_dir: runs/tiny\ndata:\n  root: {tmp_path / 'data' / 'clevr'}\n")
    info = json.loads((run / "run_info.json").read_text())
    info["command"] = [sys.executable, "train.py", f"run.output_dir={work / 'runs' / 'tiny'}"]
    (run / "run_info.json").write_text(json.dumps(info))
    (run / "eval" / "test").mkdir(parents=True)
    (run / "eval" / "test" / "metrics.json").write_text(
        json.dumps(
            {
                "rows": {},
                "checkpoint": str(run / "best"),
                "decoding": {"source": {"num_beams": str(run / "config.yaml")}},
            }
        )
    )
    (run / "eval" / "test" / "metrics.md").write_text(f"scored {run / 'best'}\n")
    out = tmp_path / "exports" / "demo"
    assert export("--checkpoint", run, "--out", out) == 0
    leaks = {
        name: text
        for name, text in ((n, b.decode("utf-8", "replace")) for n, b in tree(out).items())
        if str(tmp_path) in text or str(tmp_path.resolve()) in text
    }
    assert leaks == {}, {
        name: [line for line in text.splitlines() if str(tmp_path) in line][:3] for name, text in leaks.items()
    }
    assert json.loads((out / "eval" / "test" / "metrics.json").read_text())["checkpoint"] == "runs/tiny/best"
    run_info = json.loads((out / "training_run_info.json").read_text())
    assert "cwd" not in run_info and run_info["command"][-1] == "run.output_dir=runs/tiny"
    assert "root: clevr" in (out / "training_config.yaml").read_text()
    # the base is still found from the export where it was, through the relative path recorded
    base = json.loads((out / "davir_export.json").read_text())["base_model"]
    assert not Path(base["path_at_export"]).is_absolute()
    assert (out / base["path_at_export"]).resolve() == (saved_model.parent / "tiny blip").resolve()


# ------------------------------------------------------------ issue 50 §3: weight files follow the user's umask
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_saved_and_exported_weights_follow_the_umask(saved_model, tmp_path, umask, mode):
    from davir.models.vlm.build import load_davir_model

    previous = os.umask(umask)
    try:
        model = load_davir_model(saved_model, device="cpu")
        model.save_pretrained(tmp_path / "model")  # what train.py writes as best/ and last/
        for merge in ([], ["--merge"]):
            assert export("--checkpoint", tmp_path / "model", "--out", tmp_path / f"export{len(merge)}", *merge) == 0
    finally:
        os.umask(previous)
    for folder in ("model", "export0", "export1"):
        modes = {
            str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
            for p in (tmp_path / folder).rglob("*")
            if p.is_file()
        }
        assert any(name.endswith(".safetensors") for name in modes)
        assert {name: m for name, m in modes.items() if m != oct(mode)} == {}


# ------------------------------------------------- issue 50 §3: the card's plain-transformers lines give davir's
CHAT_FAMILIES = ("qwen2_5_vl", "llava_onevision", "smolvlm", "qwen3_vl", "internvl", "gemma3")


@pytest.mark.parametrize("family", CHAT_FAMILIES)
def test_merged_export_captions_with_plain_transformers_as_davir_does(family, tmp_path, monkeypatch):
    """The tokenizer a run saves keeps training's caption cut (truncation at 47 tokens): in the export it cut the
    prompt, image placeholders included (a token-count error, or other captions). The card's snippet, run as
    written on the merged folder, must give the captions davir gives for the same pictures."""
    import re

    import torch
    from family_fixtures import write_chat_folder
    from PIL import Image

    from davir.export.loading import load_exported_model
    from davir.models.families import get_family
    from davir.models.vlm.build import build_davir_model
    from davir.models.vlm.config import DavirModelConfig
    from davir.models.vlm.epc import EpcConfig

    fam = get_family(family)
    texts = [
        "the small red cube moved",
        "there is no change",
        "the large blue sphere turned green",
        EpcConfig().prompt,
        EpcConfig().entity_prefix,
    ]
    base = write_chat_folder(family, tmp_path / "base", texts)
    model = build_davir_model(
        DavirModelConfig(
            family=family,
            pretrained=str(base),
            image_size=64,
            extra_trainable=tuple(fam.trainable_parts)[:1],
            epc=EpcConfig(use_entities=False),
        )
    ).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model._caption_ids(["the small red cube moved " * 20])  # a training batch leaves the tokenizer cutting at 47
    model.save_pretrained(tmp_path / "model")
    folder = tmp_path / "merged"
    assert export("--checkpoint", tmp_path / "model", "--out", folder, "--merge") == 0
    assert json.loads((folder / "tokenizer.json").read_text()).get("truncation") is None

    card = (folder / "README.md").read_text()
    snippet = re.search(r"With plain transformers.*?```python\n(.*?)```", card, re.S).group(1)
    snippet = snippet.replace("THIS_FOLDER", str(folder))
    loaded = load_exported_model(folder, device="cpu")
    decoding = json.loads((folder / "davir_export.json").read_text())["decoding"]
    monkeypatch.chdir(tmp_path)
    for seed in range(3):
        shapes = ((40 + 8 * seed, 56), (56, 48 + 4 * seed))  # not square, not S: the snippet resizes them
        pictures = [
            Image.fromarray(
                torch.randint(
                    0, 256, (*shape, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(10 * seed + i)
                ).numpy()
            )
            for i, shape in enumerate(shapes)
        ]
        pictures[0].save(tmp_path / "before.png")
        pictures[1].save(tmp_path / "after.png")
        pixels = loaded.image_processor([Image.open(tmp_path / "before.png"), Image.open(tmp_path / "after.png")])
        with torch.no_grad():
            want = loaded.generate(pixels[0:1], pixels[1:2], loaded.build_prompts(None, batch_size=1), **decoding)
        scope: dict = {}
        exec(compile(snippet, "README.md", "exec"), scope)  # noqa: S102 (the card's own lines)
        assert [scope["caption"]] == want, (seed, scope["caption"], want)
